// One P-EAGLE micro-step (docs/peagle.md §4): the host samples each sample's COD rows and builds the dense
// [depth, sample, position] tokens and positions, the loss mask, the shifted teacher states and the row maps, and
// uploads them once; the teacher (EAGLE-3's compact teacher) is computed once over the positions; the draft runs every
// depth in one pass per layer; the objective reads only the sampled rows: they are gathered chunk by chunk for lm_head,
// each row's teacher named by a map, and each sample's loss is SpecForge's Σ pm·CE / max(Σ pm, 1e-6). Training then
// differentiates the mean of the samples' losses, the sampled rows' gradients gathered back into the dense layout.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/model_util.h"
#include "strategies/peagle/peagle.h"

typedef struct {
  int32_t *ids, *pos, *lengths; // (T·R), (T·R), (B)
  int32_t *rows, *trows;        // (Ns) each sampled row's dense row and teacher row
  int32_t *inv;                 // (T·R) the sampled row of each dense row (−1: none)
  float *lm, *aux, *last;       // (R), (R·W), (R·H)
} staged;

typedef struct {
  df_eagle3_teacher_buf t;
  float *terms[6];          // (Ns_max) each: kl, alpha, log_alpha, pm, correct, mask of the sampled rows
  float *dense;             // (T·R) correct in the dense layout (the acceptance run)
  double *local;            // (B, DF_EAGLE3_STEP_LOCAL): each sample's sums (its loss denominator)
  double *dlocal;           // (DF_EAGLE3_STEP_LOCAL) the per-depth sums' scratch
  float *z, *dz;            // (chunk, D) fp32
  void *xc;                 // (chunk, H) storage: the chunk's rows of the draft's output
  void *dxc;                // (Ns_max, H) storage: the sampled rows' output gradients
  void *dout;               // (T·R, H) storage
  void *aux16, *z16, *dz16; // bf16 storage only
} scratch;

typedef df_carver carver;

static void *carve(carver *c, size_t bytes) { return df_carve(c, bytes); }

static df_dtype storage_of(const peagle_run *r) { return df_draft_model_storage(r->e.env.model); }

static void layout_upload(carver *c, const peagle_run *r, int64_t B, int64_t S, staged *s) {
  const int64_t R = B * S, Rt = r->T * R;
  s->ids = carve(c, sizeof(int32_t) * (size_t)Rt), s->pos = carve(c, sizeof(int32_t) * (size_t)Rt);
  s->lengths = carve(c, sizeof(int32_t) * (size_t)B);
  s->rows = carve(c, sizeof(int32_t) * (size_t)Rt), s->trows = carve(c, sizeof(int32_t) * (size_t)Rt);
  s->inv = carve(c, sizeof(int32_t) * (size_t)Rt);
  s->lm = carve(c, sizeof(float) * (size_t)R), s->aux = carve(c, sizeof(float) * (size_t)(R * r->e.W));
  s->last = carve(c, sizeof(float) * (size_t)(R * r->e.H));
}

static void layout_scratch(carver *c, const peagle_run *r, int64_t B, int64_t R, scratch *s) {
  const int64_t Rt = r->T * R, D = r->e.D, H = r->e.H, ch = r->e.chunk_rows;
  const df_dtype dt = storage_of(r);
  const size_t es = df_dtype_size(dt), mixed = dt != DF_F32;
  s->t.tp = carve(c, sizeof(float) * (size_t)(R * D));
  s->t.lse_v = carve(c, sizeof(float) * (size_t)R), s->t.ratio = carve(c, sizeof(float) * (size_t)R);
  s->t.pm = carve(c, sizeof(float) * (size_t)R), s->t.arg = carve(c, sizeof(int32_t) * (size_t)R);
  s->t.last16 = carve(c, mixed * es * (size_t)(R * H)), s->t.tp16 = carve(c, mixed * es * (size_t)(R * D));
  for (int k = 0; k < 6; k++) s->terms[k] = carve(c, sizeof(float) * (size_t)Rt);
  s->dense = carve(c, sizeof(float) * (size_t)Rt);
  s->local = carve(c, sizeof(double) * (size_t)(B * DF_EAGLE3_STEP_LOCAL));
  s->dlocal = carve(c, sizeof(double) * DF_EAGLE3_STEP_LOCAL);
  s->z = carve(c, sizeof(float) * (size_t)(ch * D)), s->dz = carve(c, sizeof(float) * (size_t)(ch * D));
  s->xc = carve(c, es * (size_t)(ch * H)), s->dxc = carve(c, es * (size_t)(Rt * H)),
  s->dout = carve(c, es * (size_t)(Rt * H));
  s->aux16 = carve(c, mixed * es * (size_t)(R * r->e.W));
  s->z16 = carve(c, mixed * es * (size_t)(ch * D)), s->dz16 = carve(c, mixed * es * (size_t)(ch * D));
  if (!mixed) s->t.last16 = s->t.tp16 = s->aux16 = s->z16 = s->dz16 = NULL;
}

// Buffers for a (B, S) micro-batch: grown, never shrunk (the family run's upload and scratch).
static df_status ensure(peagle_run *r, int64_t B, int64_t S, staged *up, staged *dev, scratch *sc, df_error *err) {
  carver m = {0}, ms = {0};
  layout_upload(&m, r, B, S, up);
  layout_scratch(&ms, r, B, B * S, sc);
  DF_TRY(df_eagle3_grow(&r->e, m.off, ms.off, err));
  carver h = {.base = r->e.host}, d = {.base = r->e.dev}, s = {.base = r->e.scratch};
  layout_upload(&h, r, B, S, up);
  layout_upload(&d, r, B, S, dev);
  layout_scratch(&s, r, B, B * S, sc);
  return DF_OK;
}

// ---- the host build ----------------------------------------------------------------------------------------------

// Each sample's sampled rows, sample-major: its supervised depth-0 rows, then depth 1's, 2's, ...
typedef struct {
  int64_t *first, *n; // (B) the sample's first sampled row and count
  int64_t total;
} row_plan;

// The shifted tokens and final states (TargetHead's), the normalised loss mask (SpecForge's loss_mask[L − 1] = 0),
// the dense tokens (the mask token on depth > 0) and positions p + d, and the COD rows. Ids are checked here: the
// kernels need no error path.
static df_status build(peagle_run *r, const df_micro_args *a, staged *s, row_plan *plan, int64_t *supervised,
                       df_error *err) {
  const df_batch *bt = a->batch;
  const int64_t B = bt->B, S = bt->S, R = B * S, T = r->T, H = r->e.H, V = r->e.V;
  uint8_t *lm = malloc((size_t)S);
  int32_t *anchors = malloc(sizeof(int32_t) * (size_t)((T > 1 ? T - 1 : 1) * S)),
          *work = malloc(sizeof(int32_t) * 3 * (size_t)S);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)T);
  df_status st =
      lm && anchors && work && counts ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "micro-step", NULL, "out of memory");
  // one draw of the run's stream per optimizer step (its first micro-step; every rank draws the same); each sample's
  // rows from its own stream (that draw plus its dataset index), so the micro-batch it lands in, the padding, the
  // accumulation and the data-parallel split change nothing
  if (!r->e.env.eval && a->step != r->base_step) {
    r->base = a->anchor_rng ? df_rng_next_u64(a->anchor_rng) : 0;
    r->base_step = a->step;
  }
  const uint64_t base = r->e.env.eval ? a->eval_seed : r->base;
  *supervised = 0, plan->total = 0;
  memset(r->last_rows, 0, sizeof(int64_t) * (size_t)T);
  for (int64_t i = 0; i < T * R; i++) s->inv[i] = -1;
  for (int64_t b = 0; st == DF_OK && b < B; b++) {
    const int64_t L = bt->length[b];
    if (L < 1 || L > S) {
      st = DF_FAIL(err, DF_ERR_INVALID, "batch", NULL, "sample %lld has %lld rows (S = %lld)", (long long)bt->index[b],
                   (long long)L, (long long)S);
      break;
    }
    s->lengths[b] = (int32_t)L;
    for (int64_t p = 0; p < S; p++) {
      const int64_t row = b * S + p;
      const int32_t id = bt->input_ids[row];
      if (p < L && (id < 0 || id >= V)) {
        st = DF_FAIL(err, DF_ERR_INVALID, "input_ids", "the data's tokens must be ids of the target's vocabulary",
                     "sample %lld: token %d at position %lld is outside the vocabulary of %lld",
                     (long long)bt->index[b], id, (long long)p, (long long)V);
        break;
      }
      lm[p] = p < L - 1 && bt->loss_mask[row];
      s->lm[row] = lm[p] ? 1.0f : 0.0f;
      for (int64_t d = 0; d < T; d++) {
        s->ids[d * R + row] = d > 0 ? r->mask_id : (p + 1 < S ? bt->input_ids[row + 1] : 0);
        s->pos[d * R + row] = (int32_t)(p + d);
      }
      float *dst = s->last + row * H;
      if (p + 1 < S)
        memcpy(dst, bt->last_hidden + (row + 1) * H, sizeof(float) * (size_t)H);
      else
        memset(dst, 0, sizeof(float) * (size_t)H);
    }
    if (st != DF_OK) break;
    df_rng rng;
    df_rng_init(&rng, base + (uint64_t)bt->index[b], DF_RNG_STREAM_ANCHORS);
    df_peagle_cod(lm, S, L, T, r->ratio, r->ratio_min, r->e.env.eval, &rng, anchors, counts, work);
    plan->first[b] = plan->total;
    for (int64_t p = 0; p < S; p++) // depth 0: every position is a row; the unsupervised ones add nothing
      if (lm[p]) {
        s->rows[plan->total] = (int32_t)(b * S + p), s->trows[plan->total] = (int32_t)(b * S + p);
        s->inv[b * S + p] = (int32_t)plan->total++;
      }
    r->last_rows[0] += L, *supervised += plan->total - plan->first[b];
    for (int64_t d = 1, k = 0; d < T; d++) {
      for (int64_t j = 0; j < counts[d]; j++, k++) {
        const int64_t p = anchors[k], dense = d * R + b * S + p;
        s->rows[plan->total] = (int32_t)dense, s->trows[plan->total] = (int32_t)(b * S + p + d);
        s->inv[dense] = (int32_t)plan->total++;
      }
      r->last_rows[d] += counts[d];
    }
    plan->n[b] = plan->total - plan->first[b];
  }
  if (st == DF_OK) memcpy(s->aux, bt->hidden, sizeof(float) * (size_t)(R * r->e.W));
  free(lm), free(anchors), free(work), free(counts);
  return st;
}

// ---- the device work ---------------------------------------------------------------------------------------------

static df_tensor vec(df_device dev, const void *p, df_dtype dt, int64_t n) {
  return df_view((void *)p, dt, dev, 1, (const int64_t[]){n});
}
static df_tensor mat(df_device dev, df_dtype dt, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, dt, dev, 2, (const int64_t[]){rows, cols});
}
static void *rows_at(const void *p, int64_t row, int64_t width, df_dtype dt) {
  return (char *)p + (size_t)(row * width) * df_dtype_size(dt);
}

typedef struct {
  df_tensor tp, ratio, pm, tok, d2t;
  df_eagle3_teacher_rows rows;
} teacher_views;

// The teacher rows the loss reads: the position mask doubles as the loss mask, so accuracy counts the rows whose
// teacher top-1 is in the draft vocabulary (SpecForge's P-EAGLE metrics).
static void teacher_of(const peagle_run *r, const scratch *sc, int64_t R, teacher_views *t) {
  const df_device dev = df_ctx_device(r->e.env.ctx);
  t->tp = mat(dev, DF_F32, sc->t.tp, R, r->e.D), t->ratio = vec(dev, sc->t.ratio, DF_F32, R);
  t->pm = vec(dev, sc->t.pm, DF_F32, R), t->tok = vec(dev, sc->t.arg, DF_I32, R);
  t->d2t = vec(dev, r->e.dd2t, DF_I32, r->e.D);
  t->rows = (df_eagle3_teacher_rows){
      .target_p = &t->tp, .ratio = &t->ratio, .pm = &t->pm, .loss_mask = &t->pm, .tokens = &t->tok, .d2t = &t->d2t};
}

static df_eagle3_loss_desc loss_desc(int64_t R, const df_tensor *trows, double w) {
  return (df_eagle3_loss_desc){.S = R, .positions = R, .lk = DF_LK_NONE, .weight = w, .rows = trows, .pm_mean = true};
}

// The logits of sampled rows j0 .. j0 + c − 1: their output rows gathered into sc->xc, then lm_head.
static df_status chunk(peagle_run *r, const float *out, int64_t Rt, const staged *d, int64_t j0, int64_t c,
                       const scratch *sc, const df_tensor *w, df_tensor *x, df_error *err) {
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const df_dtype dt = storage_of(r);
  df_tensor src = mat(dev, dt, out, Rt, r->e.H), idx = vec(dev, d->rows + j0, DF_I32, c);
  df_tensor xc = mat(dev, dt, sc->xc, c, r->e.H);
  DF_TRY(df_gather_rows(ctx, &src, &idx, &xc, err));
  return df_eagle3_chunk_logits(&r->e, sc->xc, 0, c, sc->z, sc->z16, w, x, err);
}

static df_eagle3_row_terms terms_at(const scratch *sc, int64_t j0, int64_t n, df_device dev, df_tensor tv[6]) {
  for (int k = 0; k < 6; k++) tv[k] = vec(dev, sc->terms[k] + j0, DF_F32, n);
  return (df_eagle3_row_terms){&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
}

static df_eagle3_sums_desc sums_desc(int64_t R, int64_t block, double weight, int64_t loss, int64_t an, int64_t ad) {
  return (df_eagle3_sums_desc){.positions = R,
                               .lk = DF_LK_NONE,
                               .step_weight = weight,
                               .loss_num = loss,
                               .acc_num = an,
                               .acc_den = ad,
                               .step_block = E3_STEPS + block * DF_EAGLE3_STEP_STATS,
                               .pm_mean = true};
}

// Sample b's row terms chunk by chunk, its sums per depth (the depth blocks: metrics only) and over all its rows (the
// whole block, its loss into loss_num, and local: the backward's denominator).
static df_status sample_objective(peagle_run *r, int64_t b, const row_plan *plan, const int64_t *depth_n,
                                  const float *out, int64_t R, const staged *d, const scratch *sc,
                                  const teacher_views *t, df_tensor *stats, df_error *err) {
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  df_tensor w, tv[6];
  df_peagle_lm_head(r->m, &w, NULL);
  const int64_t j_first = plan->first[b], n = plan->n[b], ch = r->e.chunk_rows;
  for (int64_t j0 = j_first; j0 < j_first + n; j0 += ch) {
    const int64_t c = j_first + n - j0 < ch ? j_first + n - j0 : ch;
    df_tensor x, z = mat(dev, DF_F32, sc->z, c, r->e.D), tr = vec(dev, d->trows + j0, DF_I32, c);
    DF_TRY(chunk(r, out, r->T * R, d, j0, c, sc, &w, &x, err));
    const df_eagle3_row_terms o = terms_at(sc, j0, c, dev, tv);
    const df_eagle3_loss_desc desc = loss_desc(R, &tr, 0.0);
    DF_TRY(df_eagle3_loss_forward(ctx, &desc, &z, &t->rows, &o, err));
  }
  df_tensor dl = vec(dev, sc->dlocal, DF_F64, DF_EAGLE3_STEP_LOCAL);
  for (int64_t dd = 0, j = j_first; dd < r->T; j += depth_n[dd], dd++) {
    if (depth_n[dd] == 0) continue;
    const df_eagle3_row_terms rows = terms_at(sc, j, depth_n[dd], dev, tv);
    const int64_t sink = DF_PEAGLE_SINK(r->T);
    const df_eagle3_sums_desc sd = sums_desc(R, dd, 0.0, sink, sink, sink);
    DF_TRY(df_eagle3_step_sums(ctx, &sd, &rows, &dl, stats, err));
  }
  df_tensor local = vec(dev, sc->local + b * DF_EAGLE3_STEP_LOCAL, DF_F64, DF_EAGLE3_STEP_LOCAL);
  const df_eagle3_row_terms rows = terms_at(sc, j_first, n, dev, tv);
  const df_eagle3_sums_desc sd = sums_desc(R, r->T, 1.0, E3_LOSS_NUM, E3_ACC_NUM, E3_ACC_DEN);
  return df_eagle3_step_sums(ctx, &sd, &rows, &local, stats, err);
}

// Sample b's output gradients: each chunk's logits again, the loss gradient, lm_head's backward into dxc.
static df_status sample_backward(peagle_run *r, int64_t b, const row_plan *plan, const float *out, int64_t R,
                                 const staged *d, const scratch *sc, const teacher_views *t, double scale,
                                 df_error *err) {
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const df_dtype dt = storage_of(r);
  df_tensor w, g;
  df_peagle_lm_head(r->m, &w, &g);
  df_tensor local = vec(dev, sc->local + b * DF_EAGLE3_STEP_LOCAL, DF_F64, DF_EAGLE3_STEP_LOCAL);
  const int64_t j_first = plan->first[b], n = plan->n[b], ch = r->e.chunk_rows;
  for (int64_t j0 = j_first; j0 < j_first + n; j0 += ch) {
    const int64_t c = j_first + n - j0 < ch ? j_first + n - j0 : ch;
    df_tensor x, z = mat(dev, DF_F32, sc->z, c, r->e.D), dz = mat(dev, DF_F32, sc->dz, c, r->e.D);
    df_tensor dz16 = mat(dev, dt, sc->dz16, c, r->e.D), tr = vec(dev, d->trows + j0, DF_I32, c);
    df_tensor dx = mat(dev, dt, rows_at(sc->dxc, j0, r->e.H, dt), c, r->e.H);
    DF_TRY(chunk(r, out, r->T * R, d, j0, c, sc, &w, &x, err));
    const df_eagle3_loss_desc desc = loss_desc(R, &tr, scale);
    DF_TRY(df_eagle3_loss_backward(ctx, &desc, &z, &t->rows, &local, &dz, err));
    if (dt != DF_F32) DF_TRY(df_cast(ctx, &dz, &dz16, err));
    DF_TRY(df_linear_backward(ctx, dt != DF_F32 ? &dz16 : &dz, &x, &w, &dx, false, &g, NULL, err));
  }
  return DF_OK;
}

// The greedy run over the depths of each supervised anchor, from the sampled rows scattered into the dense layout
// (a depth COD did not sample ends the run): SpecForge reports none; eval samples every row, where it is the chain's
// acceptance length the training-time test would measure.
static df_status accept(peagle_run *r, int64_t R, const staged *d, const scratch *sc, df_tensor *stats, df_error *err) {
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t Rt = r->T * R, Ns = Rt; // the terms arrays hold up to T·R rows
  df_tensor idx = vec(dev, d->inv, DF_I32, Rt);
  df_tensor src = mat(dev, DF_F32, sc->terms[4], Ns, 1), dst = mat(dev, DF_F32, sc->dense, Rt, 1);
  DF_TRY(df_gather_rows(ctx, &src, &idx, &dst, err));
  // every supervised position is an anchor (as EAGLE-3's), so the blocks are the host's count
  df_tensor correct = mat(dev, DF_F32, sc->dense, r->T, R), mask0 = vec(dev, d->lm, DF_F32, R);
  return df_eagle3_accept(ctx, &correct, &mask0, E3_ACCEPT_SUM, E3_BLOCKS, stats, err);
}

df_status df_peagle_micro(df_strategy_run *base, const df_micro_args *a, df_micro_info *info, df_error *err) {
  peagle_run *r = (peagle_run *)base;
  memset(info, 0, sizeof *info);
  const df_batch *bt = a->batch;
  if (!bt || !a->stats) return DF_FAIL(err, DF_ERR_INVALID, "micro-step", NULL, "a micro-step needs a batch and stats");
  if (!bt->last_hidden || bt->hidden_size != r->e.H || bt->width != r->e.W)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture with --last-hidden yes (P-EAGLE's teacher reads the target's final hidden state)",
                   "the P-EAGLE batch needs the three captured layers (%lld wide) and the final hidden states",
                   (long long)r->e.W);
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t B = bt->B, S = bt->S, R = B * S, T = r->T;
  staged up, d;
  scratch sc;
  DF_TRY(ensure(r, B, S, &up, &d, &sc, err));
  row_plan plan = {.first = malloc(sizeof(int64_t) * (size_t)B), .n = malloc(sizeof(int64_t) * (size_t)B)};
  int64_t *depth_n = malloc(sizeof(int64_t) * (size_t)(B * T));
  int64_t supervised = 0;
  df_status st = plan.first && plan.n && depth_n ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "micro-step", NULL, "oom");
  if (st == DF_OK) st = build(r, a, &up, &plan, &supervised, err);
  // rows per depth of each sample, from the plan (depth 0: its supervised positions)
  for (int64_t b = 0; st == DF_OK && b < B; b++) {
    int64_t *n = depth_n + b * T;
    for (int64_t dd = 0; dd < T; dd++) n[dd] = 0;
    for (int64_t j = plan.first[b]; j < plan.first[b] + plan.n[b]; j++) n[up.rows[j] / R]++;
  }
  if (st == DF_OK && r->e.dev != r->e.host) st = df_copy(ctx, r->e.dev, dev, r->e.host, DF_DEV_CPU, r->e.cap, err);
  info->loss_den = (double)B, info->num_blocks = supervised, info->upload_bytes = (int64_t)r->e.cap, info->N = T;
  if (st == DF_OK && !r->e.have_vocab) st = df_eagle3_sync_vocab(&r->e, err);
  if (st == DF_OK) st = df_eagle3_teacher_pass(&r->e, d.last, d.lm, R, &sc.t, err);
  teacher_views tv;
  teacher_of(r, &sc, R, &tv);
  const df_dtype dt = storage_of(r);
  if (st == DF_OK && sc.aux16) {
    df_tensor f = vec(dev, d.aux, DF_F32, R * r->e.W), h = vec(dev, sc.aux16, dt, R * r->e.W);
    st = df_cast(ctx, &f, &h, err); // bf16: rounded once
  }
  const df_peagle_batch pb = {
      .B = B, .S = S, .T = T, .aux = sc.aux16 ? sc.aux16 : d.aux, .ids = d.ids, .pos = d.pos, .lengths = d.lengths};
  const float *out = NULL;
  if (st == DF_OK) st = df_peagle_forward(r->m, &pb, &out, err);
  for (int64_t b = 0; st == DF_OK && b < B; b++)
    if (plan.n[b] > 0) st = sample_objective(r, b, &plan, depth_n + b * T, out, R, &d, &sc, &tv, a->stats, err);
  if (st == DF_OK) st = accept(r, R, &d, &sc, a->stats, err);
  if (st == DF_OK && !r->e.env.eval) {
    if (!a->accumulate) df_draft_model_zero_grads(r->e.env.model);
    // grad_scale 0: d(loss_num / loss_den), the mean of the samples' losses; > 0: d(grad_scale · loss_num)
    const double scale = a->grad_scale > 0 ? a->grad_scale : 1.0 / (double)B;
    for (int64_t b = 0; st == DF_OK && b < B; b++)
      if (plan.n[b] > 0) st = sample_backward(r, b, &plan, out, R, &d, &sc, &tv, scale, err);
    if (st == DF_OK) { // the sampled rows' gradients into the dense layout (zero elsewhere), then the draft's
      df_tensor src = mat(dev, dt, sc.dxc, T * R, r->e.H), idx = vec(dev, d.inv, DF_I32, T * R);
      df_tensor dst = mat(dev, dt, sc.dout, T * R, r->e.H);
      st = df_gather_rows(ctx, &src, &idx, &dst, err);
    }
    if (st == DF_OK) st = df_peagle_backward(r->m, sc.dout, err);
  }
  free(plan.first), free(plan.n), free(depth_n);
  return st;
}
