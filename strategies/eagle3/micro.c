// One EAGLE-3 micro-step (docs/eagle3-step.md §4): the host builds the shifted tokens, positions, normalised loss mask
// and shifted teacher states and uploads them once; the teacher (draft-vocabulary softmax, full-vocabulary lse and
// argmax, position mask) is computed once; the draft runs the T steps of the training-time test, each step's loss terms
// from lm_head in row chunks; then, training, the backward in reverse step order with the logits recomputed per chunk.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/model_util.h"
#include "strategies/eagle3/eagle3.h"

typedef struct {
  int32_t *ids, *pos, *lengths;
  float *lm, *aux, *last;
} staged;

typedef struct {
  df_eagle3_teacher_buf t;
  float *terms[6]; // (T, R) each: kl, alpha, log_alpha, pm, correct, mask
  double *local;   // (T, DF_EAGLE3_STEP_LOCAL)
  float *z, *dz;   // (chunk, D) fp32: the loss kernels' logits and their gradient
  float *dout;     // (R, H) storage dtype
  // bf16 storage only (else NULL): the captured layers rounded for the draft's GEMMs, and a chunk's logits and their
  // gradient as the GEMMs read and write them
  void *aux16, *z16, *dz16;
} scratch;

typedef df_carver carver;

static void *carve(carver *c, size_t bytes) { return df_carve(c, bytes); }

static void layout_upload(carver *c, const eagle3_run *r, int64_t B, int64_t S, staged *s) {
  const int64_t R = B * S, T = r->T;
  s->ids = carve(c, sizeof(int32_t) * (size_t)(T * R));
  s->pos = carve(c, sizeof(int32_t) * (size_t)(T * R));
  s->lengths = carve(c, sizeof(int32_t) * (size_t)B);
  s->lm = carve(c, sizeof(float) * (size_t)R);
  s->aux = carve(c, sizeof(float) * (size_t)(R * r->W));
  s->last = carve(c, sizeof(float) * (size_t)(R * r->H));
}

// The draft's storage dtype (activations, the frozen pieces and the GEMMs' operands).
static df_dtype storage_of(const eagle3_run *r) { return df_draft_model_storage(r->env.model); }

static void layout_scratch(carver *c, const eagle3_run *r, int64_t R, scratch *s) {
  const int64_t T = r->T, D = r->D, ch = r->chunk_rows < R ? r->chunk_rows : R;
  const df_dtype dt = storage_of(r);
  const size_t es = df_dtype_size(dt), mixed = dt != DF_F32;
  s->t.tp = carve(c, sizeof(float) * (size_t)(R * D));
  s->t.lse_v = carve(c, sizeof(float) * (size_t)R), s->t.ratio = carve(c, sizeof(float) * (size_t)R);
  s->t.pm = carve(c, sizeof(float) * (size_t)R), s->t.arg = carve(c, sizeof(int32_t) * (size_t)R);
  for (int k = 0; k < 6; k++) s->terms[k] = carve(c, sizeof(float) * (size_t)(T * R));
  s->local = carve(c, sizeof(double) * (size_t)(T * DF_EAGLE3_STEP_LOCAL));
  s->z = carve(c, sizeof(float) * (size_t)(ch * D)), s->dz = carve(c, sizeof(float) * (size_t)(ch * D));
  s->dout = carve(c, es * (size_t)(R * r->H));
  s->aux16 = carve(c, mixed * es * (size_t)(R * r->W)), s->t.last16 = carve(c, mixed * es * (size_t)(R * r->H));
  s->t.tp16 = carve(c, mixed * es * (size_t)(R * D));
  s->z16 = carve(c, mixed * es * (size_t)(ch * D)), s->dz16 = carve(c, mixed * es * (size_t)(ch * D));
  if (!mixed) s->aux16 = s->t.last16 = s->t.tp16 = s->z16 = s->dz16 = NULL;
}

df_status df_eagle3_grow(eagle3_run *r, size_t upload, size_t work, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  if (upload > r->cap) {
    if (r->dev != r->host) df_buffer_free(ctx, r->dev);
    df_host_free(ctx, r->host);
    r->host = r->dev = NULL, r->cap = 0;
    DF_TRY(df_host_alloc(ctx, upload, &r->host, err));
    if (df_ctx_host_addressable(ctx))
      r->dev = r->host;
    else
      DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_STAGE, upload, &r->dev, err));
    r->cap = upload;
  }
  if (work > r->scratch_cap) {
    df_buffer_free(ctx, r->scratch);
    r->scratch = NULL, r->scratch_cap = 0;
    DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_STAGE, work, &r->scratch, err));
    r->scratch_cap = work;
  }
  return DF_OK;
}

// Buffers for a (B, S) micro-batch: grown, never shrunk.
static df_status ensure(eagle3_run *r, int64_t B, int64_t S, staged *up, staged *dev, scratch *sc, df_error *err) {
  carver m = {0}, ms = {0};
  layout_upload(&m, r, B, S, up);
  layout_scratch(&ms, r, B * S, sc);
  DF_TRY(df_eagle3_grow(r, m.off, ms.off, err));
  carver h = {.base = r->host}, d = {.base = r->dev}, s = {.base = r->scratch};
  layout_upload(&h, r, B, S, up);
  layout_upload(&d, r, B, S, dev);
  layout_scratch(&s, r, B * S, sc);
  return DF_OK;
}

// ---- the host build ----------------------------------------------------------------------------------------------

// SpecForge's offline normaliser (loss_mask[L − 1] = 0), TargetHead's shift of the ids and the final states, the
// step-shifted tokens and positions. Every id is checked against the vocabulary here: the kernels need no error path.
static df_status build(const eagle3_run *r, const df_batch *bt, staged *s, int64_t *mask_sum, df_error *err) {
  const int64_t B = bt->B, S = bt->S, R = B * S, H = r->H, T = r->T;
  *mask_sum = 0;
  for (int64_t b = 0; b < B; b++) {
    const int64_t L = bt->length[b];
    if (L < 1 || L > S)
      return DF_FAIL(err, DF_ERR_INVALID, "batch", NULL, "sample %lld has %lld rows (S = %lld)",
                     (long long)bt->index[b], (long long)L, (long long)S);
    s->lengths[b] = (int32_t)L;
    for (int64_t p = 0; p < S; p++) {
      const int64_t row = b * S + p;
      const int32_t id = bt->input_ids[row];
      if (p < L && (id < 0 || id >= r->V))
        return DF_FAIL(err, DF_ERR_INVALID, "input_ids", "the data's tokens must be ids of the target's vocabulary",
                       "sample %lld: token %d at position %lld is outside the vocabulary of %lld",
                       (long long)bt->index[b], id, (long long)p, (long long)r->V);
      s->lm[row] = p < L - 1 && bt->loss_mask[row] ? 1.0f : 0.0f;
      *mask_sum += p < L - 1 && bt->loss_mask[row];
      for (int64_t i = 0; i < T; i++) {
        const int64_t q = p + 1 + i;
        s->ids[i * R + row] = q < S ? bt->input_ids[b * S + q] : 0;
        s->pos[i * R + row] = (int32_t)(p + i);
      }
      float *dst = s->last + row * H;
      if (p + 1 < S)
        memcpy(dst, bt->last_hidden + (row + 1) * H, sizeof(float) * (size_t)H);
      else
        memset(dst, 0, sizeof(float) * (size_t)H);
    }
  }
  memcpy(s->aux, bt->hidden, sizeof(float) * (size_t)(R * r->W));
  return DF_OK;
}

// ---- the device work ---------------------------------------------------------------------------------------------

static df_tensor mat(df_device dev, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, dev, 2, (const int64_t[]){rows, cols});
}
static df_tensor smat(df_device dev, df_dtype dt, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, dt, dev, 2, (const int64_t[]){rows, cols});
}
// dst (dt) = src (fp32) rounded, or the reverse: n elements.
static df_status cast_n(df_ctx *ctx, df_dtype from, const void *src, df_dtype to, void *dst, int64_t n, df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  df_tensor a = df_view((void *)src, from, dev, 1, (const int64_t[]){n}),
            b = df_view(dst, to, dev, 1, (const int64_t[]){n});
  return df_cast(ctx, &a, &b, err);
}
static df_tensor vec(df_device dev, const void *p, df_dtype dt, int64_t n) {
  return df_view((void *)p, dt, dev, 1, (const int64_t[]){n});
}

// The teacher rows: target_p over the draft vocabulary, ratio, position mask, the full-vocabulary argmax.
// In bf16 storage the target's final hidden rows are rounded to bf16 and meet the bf16 head (its draft-vocabulary rows
// and, for the lse and argmax, all of it) in GEMMs with fp32 accumulation; the draft-vocabulary logits are rounded to
// bf16 as the GEMM writes them, as the bf16 target's are, then softmaxed in fp32.
df_status df_eagle3_teacher_pass(eagle3_run *r, const float *last_f32, const float *lm_f32, int64_t R,
                                 const df_eagle3_teacher_buf *sc, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const df_frozen *fz = &r->env.frozen;
  const df_dtype dt = storage_of(r);
  const bool mixed = dt != DF_F32;
  if (mixed) DF_TRY(cast_n(ctx, DF_F32, last_f32, dt, sc->last16, R * r->H, err));
  df_tensor last = smat(dev, dt, mixed ? sc->last16 : last_f32, R, r->H), hd = smat(dev, dt, r->head_d, r->D, r->H);
  df_tensor tp = mat(dev, sc->tp, R, r->D), tp16 = smat(dev, dt, sc->tp16, R, r->D);
  df_tensor head = smat(dev, fz->dtype, fz->lm_head, fz->vocab, fz->hidden), lse = vec(dev, sc->lse_v, DF_F32, R);
  df_tensor arg = vec(dev, sc->arg, DF_I32, R), t2d = vec(dev, r->dt2d, DF_U8, r->V), lm = vec(dev, lm_f32, DF_F32, R);
  df_tensor ratio = vec(dev, sc->ratio, DF_F32, R), pm = vec(dev, sc->pm, DF_F32, R);
  DF_TRY(df_linear_forward(ctx, &last, &hd, NULL, mixed ? &tp16 : &tp, err));
  if (mixed) DF_TRY(df_cast(ctx, &tp16, &tp, err));
  DF_TRY(df_lmhead_lse_argmax(ctx, 0, &last, &head, &lse, &arg, err));
  return df_eagle3_teacher(ctx, &tp, &lse, &arg, &t2d, &lm, &ratio, &pm, err);
}

typedef struct {
  df_tensor tp, ratio, pm, lm, tok, d2t;
  df_eagle3_teacher_rows rows;
} teacher_views;

static void teacher_of(const eagle3_run *r, const staged *d, const scratch *sc, int64_t R, teacher_views *t) {
  const df_device dev = df_ctx_device(r->env.ctx);
  t->tp = mat(dev, sc->t.tp, R, r->D), t->ratio = vec(dev, sc->t.ratio, DF_F32, R);
  t->pm = vec(dev, sc->t.pm, DF_F32, R), t->lm = vec(dev, d->lm, DF_F32, R), t->tok = vec(dev, sc->t.arg, DF_I32, R);
  t->d2t = vec(dev, r->dd2t, DF_I32, r->D);
  t->rows = (df_eagle3_teacher_rows){
      .target_p = &t->tp, .ratio = &t->ratio, .pm = &t->pm, .loss_mask = &t->lm, .tokens = &t->tok, .d2t = &t->d2t};
}

static df_eagle3_loss_desc loss_desc(const eagle3_run *r, int64_t i, int64_t S, int64_t R, int64_t row0, double w) {
  return (df_eagle3_loss_desc){.step = i,
                               .S = S,
                               .row0 = row0,
                               .positions = R,
                               .lk = r->lk,
                               .kl_scale = r->kl_scale,
                               .kl_decay = r->kl_decay,
                               .weight = w};
}

// Step i's terms, chunk by chunk of lm_head rows, and its sums.
// A chunk of the draft's logits into sc->z (fp32): in bf16 storage the GEMM writes bf16 logits (as PyTorch's bf16
// lm_head does), cast up for the loss kernels.
df_status df_eagle3_chunk_logits(eagle3_run *r, const float *out, int64_t r0, int64_t c, float *zbuf, void *z16buf,
                                 const df_tensor *w, df_tensor *x, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const df_dtype dt = storage_of(r);
  *x = smat(dev, dt, (const char *)out + (size_t)(r0 * r->H) * df_dtype_size(dt), c, r->H);
  df_tensor z = mat(dev, zbuf, c, r->D), z16 = smat(dev, dt, z16buf, c, r->D);
  if (dt == DF_F32) return df_linear_forward(ctx, x, w, NULL, &z, err);
  DF_TRY(df_linear_forward(ctx, x, w, NULL, &z16, err));
  return df_cast(ctx, &z16, &z, err);
}

static df_status step_objective(eagle3_run *r, int64_t i, int64_t S, int64_t R, const float *out, const scratch *sc,
                                const teacher_views *t, df_tensor *stats, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  df_tensor w;
  df_eagle3_lm_head(r->m, &w, NULL);
  for (int64_t r0 = 0; r0 < R; r0 += r->chunk_rows) {
    const int64_t c = R - r0 < r->chunk_rows ? R - r0 : r->chunk_rows;
    df_tensor x, z = mat(dev, sc->z, c, r->D);
    DF_TRY(df_eagle3_chunk_logits(r, out, r0, c, sc->z, sc->z16, &w, &x, err));
    df_tensor tv[6];
    for (int k = 0; k < 6; k++) tv[k] = vec(dev, sc->terms[k] + i * R + r0, DF_F32, c);
    const df_eagle3_row_terms o = {&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
    const df_eagle3_loss_desc desc = loss_desc(r, i, S, R, r0, 0.0);
    DF_TRY(df_eagle3_loss_forward(ctx, &desc, &z, &t->rows, &o, err));
  }
  df_tensor tv[6];
  for (int k = 0; k < 6; k++) tv[k] = vec(dev, sc->terms[k] + i * R, DF_F32, R);
  const df_eagle3_row_terms rows = {&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
  const df_eagle3_sums_desc sd = {.step = i,
                                  .positions = R,
                                  .lk = r->lk,
                                  .kl_scale = r->kl_scale,
                                  .kl_decay = r->kl_decay,
                                  .step_weight = pow(DF_EAGLE3_PLOSS_DECAY, (double)i),
                                  .loss_num = E3_LOSS_NUM,
                                  .acc_num = E3_ACC_NUM,
                                  .acc_den = E3_ACC_DEN,
                                  .step_block = E3_STEPS + i * DF_EAGLE3_STEP_STATS};
  df_tensor local = vec(dev, sc->local + i * DF_EAGLE3_STEP_LOCAL, DF_F64, DF_EAGLE3_STEP_LOCAL);
  return df_eagle3_step_sums(ctx, &sd, &rows, &local, stats, err);
}

// Step i's backward: d(out_i) chunk by chunk (the logits recomputed), then the draft's.
static df_status step_backward(eagle3_run *r, int64_t i, int64_t S, int64_t R, const float *out, const scratch *sc,
                               const teacher_views *t, double scale, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  df_tensor w, g;
  df_eagle3_lm_head(r->m, &w, &g);
  const double weight = pow(DF_EAGLE3_PLOSS_DECAY, (double)i) * scale;
  df_tensor local = vec(dev, sc->local + i * DF_EAGLE3_STEP_LOCAL, DF_F64, DF_EAGLE3_STEP_LOCAL);
  const df_dtype dt = storage_of(r);
  for (int64_t r0 = 0; r0 < R; r0 += r->chunk_rows) {
    const int64_t c = R - r0 < r->chunk_rows ? R - r0 : r->chunk_rows;
    df_tensor x, z = mat(dev, sc->z, c, r->D), dz = mat(dev, sc->dz, c, r->D), dz16 = smat(dev, dt, sc->dz16, c, r->D);
    df_tensor dx = smat(dev, dt, (char *)sc->dout + (size_t)(r0 * r->H) * df_dtype_size(dt), c, r->H);
    DF_TRY(df_eagle3_chunk_logits(r, out, r0, c, sc->z, sc->z16, &w, &x, err));
    const df_eagle3_loss_desc desc = loss_desc(r, i, S, R, r0, weight);
    DF_TRY(df_eagle3_loss_backward(ctx, &desc, &z, &t->rows, &local, &dz, err));
    if (dt != DF_F32) DF_TRY(df_cast(ctx, &dz, &dz16, err)); // the GEMMs' operand; lm_head's gradient stays fp32
    DF_TRY(df_linear_backward(ctx, dt != DF_F32 ? &dz16 : &dz, &x, &w, &dx, false, &g, NULL, err));
  }
  return df_eagle3_step_backward(r->m, i, sc->dout, err);
}

df_status df_eagle3_micro(df_strategy_run *base, const df_micro_args *a, df_micro_info *info, df_error *err) {
  eagle3_run *r = (eagle3_run *)base;
  memset(info, 0, sizeof *info);
  const df_batch *bt = a->batch;
  if (!bt || !a->stats) return DF_FAIL(err, DF_ERR_INVALID, "micro-step", NULL, "a micro-step needs a batch and stats");
  if (!bt->last_hidden || bt->hidden_size != r->H || bt->width != r->W)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture with --last-hidden yes (EAGLE-3's teacher reads the target's final hidden state)",
                   "the EAGLE-3 batch needs the three captured layers (%lld wide) and the final hidden states",
                   (long long)r->W);
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t B = bt->B, S = bt->S, R = B * S, T = r->T;
  staged up, d;
  scratch sc;
  DF_TRY(ensure(r, B, S, &up, &d, &sc, err));
  int64_t mask_sum = 0;
  DF_TRY(build(r, bt, &up, &mask_sum, err));
  if (r->dev != r->host) DF_TRY(df_copy(ctx, r->dev, dev, r->host, DF_DEV_CPU, r->cap, err));
  info->loss_den = 1.0, info->num_blocks = mask_sum, info->upload_bytes = (int64_t)r->cap, info->N = T;
  if (!r->have_vocab) DF_TRY(df_eagle3_sync_vocab(r, err));
  DF_TRY(df_eagle3_teacher_pass(r, d.last, d.lm, R, &sc.t, err));
  teacher_views tv;
  teacher_of(r, &d, &sc, R, &tv);

  if (sc.aux16) DF_TRY(cast_n(ctx, DF_F32, d.aux, storage_of(r), sc.aux16, R * r->W, err)); // bf16: rounded once
  const df_eagle3_batch eb = {.B = B,
                              .S = S,
                              .T = T,
                              .aux = sc.aux16 ? sc.aux16 : d.aux,
                              .ids = d.ids,
                              .pos = d.pos,
                              .lengths = d.lengths,
                              .embed = r->env.frozen.embed,
                              .vocab = r->env.frozen.vocab};
  DF_TRY(df_eagle3_begin(r->m, &eb, err));
  const float **outs = malloc(sizeof *outs * (size_t)T);
  if (!outs) return DF_FAIL(err, DF_ERR_NOMEM, "micro-step", NULL, "out of memory");
  df_status st = DF_OK;
  for (int64_t i = 0; i < T && st == DF_OK; i++) {
    st = df_eagle3_step_forward(r->m, i, &outs[i], err);
    if (st == DF_OK) st = step_objective(r, i, S, R, outs[i], &sc, &tv, a->stats, err);
  }
  if (st == DF_OK) {
    df_tensor correct = mat(dev, sc.terms[4], T, R), mask0 = vec(dev, sc.terms[5], DF_F32, R);
    st = df_eagle3_accept(ctx, &correct, &mask0, E3_ACCEPT_SUM, E3_BLOCKS, a->stats, err);
  }
  if (st == DF_OK && !r->env.eval) {
    if (!a->accumulate) df_draft_model_zero_grads(r->env.model);
    // grad_scale 0: d(loss_num / loss_den) with loss_den 1; > 0: d(grad_scale · loss_num).
    const double scale = a->grad_scale > 0 ? a->grad_scale : 1.0;
    for (int64_t i = T - 1; i >= 0 && st == DF_OK; i--) st = step_backward(r, i, S, R, outs[i], &sc, &tv, scale, err);
  }
  free(outs);
  return st;
}
