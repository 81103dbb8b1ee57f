// DSpark labels (next token, prefix-valid) and the objective through the heads and the fused LM-head op
// (docs/dflash-step.md §6; SpecForge's OnlineDSparkModel in specforge/algorithms/common/dflash_family_model.py).
#include "strategies/dspark/dspark.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- labels --------------------------------------------------------------------------------------------------

void df_dspark_labels_free(df_dspark_labels *l) {
  if (!l) return;
  free(l->labels), free(l->valid), free(l->prev), free(l->weights), free(l->teacher_pos);
  memset(l, 0, sizeof *l);
}

static df_status alloc_labels(df_dspark_labels *o, int64_t rows, df_error *err) {
  o->labels = malloc((size_t)rows * sizeof(int32_t));
  o->valid = malloc((size_t)rows);
  o->prev = malloc((size_t)rows * sizeof(int32_t));
  o->weights = malloc((size_t)rows * sizeof(float));
  o->teacher_pos = malloc((size_t)rows * sizeof(int32_t));
  if (o->labels && o->valid && o->prev && o->weights && o->teacher_pos) return DF_OK;
  df_dspark_labels_free(o);
  return DF_FAIL(err, DF_ERR_NOMEM, "dspark labels", NULL, "out of memory for %lld block rows", (long long)rows);
}

// One block: slot k predicts ids[anchor + k + 1]; validity is a prefix product along k.
static void fill_block(const int32_t *ids, const uint8_t *mask, int64_t S, int32_t anchor, bool keep, int64_t bs,
                       const float *decay, df_dspark_labels *o, int64_t row0) {
  bool ok = keep;
  for (int64_t k = 0; k < bs; k++) {
    int64_t lab = (int64_t)anchor + k + 1, r = row0 + k, at = (int64_t)anchor + k;
    ok = ok && lab < S && mask[lab];
    o->valid[r] = ok;
    o->labels[r] = ok ? ids[lab] : -1;
    o->weights[r] = ok ? decay[k] : 0.0f;
    o->teacher_pos[r] = ok ? (int32_t)at : -1;
    o->prev[r] = ids[keep ? (at < S ? at : S - 1) : 0];
  }
}

df_status df_dspark_build_labels(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, double gamma, df_dspark_labels *out,
                                 df_error *err) {
  memset(out, 0, sizeof *out);
  if (bs < 1) return DF_FAIL(err, DF_ERR_INVALID, "block_size", "block_size must be >= 1", "bs = %lld", (long long)bs);
  if (S < 1 || !input_ids || !loss_mask || !a)
    return DF_FAIL(err, DF_ERR_INVALID, "batch", NULL, "bad DSpark label input (S = %lld)", (long long)S);
  if (!(gamma >= 0) || !isfinite(gamma))
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_decay_gamma", "use 0 (off) or a positive value",
                   "loss_decay_gamma = %g", gamma);
  int64_t B = a->B, N = a->N;
  DF_TRY(alloc_labels(out, B * N * bs, err));
  out->B = B, out->N = N, out->bs = bs;
  float *decay = malloc((size_t)bs * sizeof *decay);
  if (!decay) {
    df_dspark_labels_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "dspark labels", NULL, "out of memory");
  }
  // SpecForge's _dspark_loss_weight_mask: exp(−k/γ) from k = 0 (DFlash's starts at k − 1).
  for (int64_t k = 0; k < bs; k++) decay[k] = gamma > 0 ? (float)exp(-(double)k / gamma) : 1.0f;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      fill_block(input_ids + b * S, loss_mask + b * S, S, a->anchors[b * N + n], a->keep[b * N + n], bs, decay, out,
                 (b * N + n) * bs);
  free(decay);
  return DF_OK;
}

// ---- objective -----------------------------------------------------------------------------------------------

void df_dspark_metrics_free(df_dspark_metrics *m) {
  if (!m) return;
  free(m->pos_ce_num), free(m->pos_acc_num), free(m->pos_den);
  m->pos_ce_num = m->pos_acc_num = m->pos_den = NULL;
}

static df_status check_options(const df_dspark_loss_options *opt, df_error *err) {
  const double al[3] = {opt->ce_alpha, opt->l1_alpha, opt->conf_alpha};
  const char *keys[3] = {"training.dspark_ce_loss_alpha", "training.dspark_l1_loss_alpha",
                         "training.dspark_confidence_head_alpha"};
  for (int i = 0; i < 3; i++)
    if (!(al[i] >= 0) || !isfinite(al[i]))
      return DF_FAIL(err, DF_ERR_INVALID, keys[i], "use a value >= 0", "%s = %g", keys[i], al[i]);
  if (opt->chunk_blocks < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "training.objective_chunk_blocks", "use 0 (one pass) or a positive count",
                   "objective_chunk_blocks = %lld", (long long)opt->chunk_blocks);
  return DF_OK;
}

df_dspark_terms df_dspark_objective_terms(const df_dspark_loss_options *opt, const df_dspark_heads *heads) {
  df_dspark_terms t = {.rank = df_dspark_heads_markov_rank(heads)};
  t.conf = df_dspark_heads_has_confidence(heads) && opt->conf_alpha > 0;
  t.teacher = opt->l1_alpha > 0 || t.conf; // SpecForge: the teacher only when a term needs it
  return t;
}

// The fused CE + L1 + BCE pass (df_lmhead_dspark) over the work buffers.
static df_status run_fused(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                           const df_dspark_terms *t, const df_tensor *hidden, const df_tensor *head,
                           const df_dspark_rows *rows, const float *latent, const float *conf_logits, float gs,
                           df_dspark_work *w, df_tensor *dhidden, df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  const int64_t R = rows->B * rows->N * rows->bs, rk = t->rank;
  df_tensor u = df_view_on(hidden->dtype, dev, latent, R, rk > 0 ? rk : 1), conf = df_f32_on(dev, conf_logits, R);
  df_lmhead_dspark_desc d = {.chunk_rows = opt->chunk_blocks * rows->bs,
                             .grad_scale = gs,
                             .alpha_ce = (float)opt->ce_alpha,
                             .alpha_l1 = (float)opt->l1_alpha,
                             .alpha_conf = t->conf ? (float)opt->conf_alpha : 0.0f};
  df_lmhead_dspark_in in = {.hidden = hidden,
                            .head = head,
                            .markov_u = rk > 0 ? &u : NULL,
                            .markov_w2 = rk > 0 ? df_dspark_heads_w2(heads) : NULL,
                            .teacher = t->teacher ? &w->teacher : NULL,
                            .labels = &rows->labels,
                            .weights = &rows->weights,
                            .conf = t->conf ? &conf : NULL};
  const bool grad = dhidden != NULL;
  df_tensor du = w->du, dconf = w->dconf;
  df_lmhead_dspark_out out = {.ce = &w->ce,
                              .correct = &w->correct,
                              .draft_top1 = &w->top1,
                              .l1 = t->teacher ? &w->l1 : NULL,
                              .agree = t->teacher ? &w->agree : NULL,
                              .teacher_top1 = t->teacher ? &w->ttop1 : NULL,
                              .bce = t->conf ? &w->bce : NULL,
                              .dhidden = grad ? dhidden : NULL,
                              .du = grad && rk > 0 ? &du : NULL,
                              .dw2 = grad && rk > 0 ? df_dspark_heads_w2_grad(heads) : NULL,
                              .dconf = grad && t->conf ? &dconf : NULL};
  return df_lmhead_dspark(ctx, &d, &in, &out, err);
}

df_status df_dspark_objective_rows(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                                   const df_tensor *hidden, const df_tensor *head, const df_tensor *last_hidden,
                                   const df_dspark_rows *rows, df_dspark_work *w, df_tensor *dhidden, df_tensor *stats,
                                   df_error *err) {
  if (!opt || !hidden || !head || !rows || !w || !stats)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dspark_objective_rows");
  DF_TRY(check_options(opt, err));
  const int64_t R = rows->B * rows->N * rows->bs;
  if (R <= 0 || hidden->ndim < 2 || df_numel(hidden) != R * head->shape[1])
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "pass the draft output (B·N·bs, H)",
                   "hidden does not hold B·N·bs = %lld rows of %lld", (long long)R, (long long)head->shape[1]);
  const df_dspark_terms t = df_dspark_objective_terms(opt, heads);
  if (t.teacher && !last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture the data with target_last_hidden_states (DSpark), or set dspark_l1_loss_alpha and "
                   "dspark_confidence_head_alpha to 0",
                   "the DSpark L1/confidence loss needs the target's final hidden states, and the batch has none");
  if (t.teacher && w->teacher.dtype != last_hidden->dtype) { // bf16 storage: gather the fp32 rows, round them once
    DF_TRY(df_gather_rows(ctx, last_hidden, &rows->teacher_idx, &w->teacher32, err));
    DF_TRY(df_cast(ctx, &w->teacher32, &w->teacher, err));
  } else if (t.teacher) {
    DF_TRY(df_gather_rows(ctx, last_hidden, &rows->teacher_idx, &w->teacher, err));
  }
  const float gs = opt->grad_scale > 0  ? (float)opt->grad_scale
                   : rows->loss_den > 0 ? (float)(1.0 / rows->loss_den)
                                        : 0.0f;
  const bool heads_run = t.rank > 0 || df_dspark_heads_has_confidence(heads);
  const float *latent = NULL, *conf = NULL;
  if (heads_run)
    DF_TRY(df_dspark_heads_forward(heads, rows->B * rows->N, rows->bs, hidden->data, rows->prev.data, &latent, &conf,
                                   err));
  DF_TRY(run_fused(ctx, opt, heads, &t, hidden, head, rows, latent, conf, gs, w, dhidden, err));
  df_tensor conf_t = df_f32_on(df_ctx_device(ctx), conf, R);
  df_dspark_metrics_in mi = {.ce = &w->ce,
                             .correct = &w->correct,
                             .draft_top1 = &w->top1,
                             .l1 = t.teacher ? &w->l1 : NULL,
                             .agree = t.teacher ? &w->agree : NULL,
                             .teacher_top1 = t.teacher ? &w->ttop1 : NULL,
                             .bce = t.conf ? &w->bce : NULL,
                             .conf = t.conf ? &conf_t : NULL,
                             .valid = &rows->valid,
                             .weights = &rows->weights,
                             .keep = &rows->keep};
  DF_TRY(df_dspark_block_metrics(ctx, rows->bs, &mi, stats, err));
  if (!dhidden || !heads_run) return DF_OK;
  return df_dspark_heads_backward(heads, t.rank > 0 ? w->du.data : NULL, t.conf ? w->dconf.data : NULL, dhidden->data,
                                  err);
}

df_status df_dspark_metrics_from_stats(const double *st, int64_t bs, double loss_den, const df_dspark_loss_options *opt,
                                       df_dspark_terms t, df_dspark_metrics *m, df_error *err) {
  memset(m, 0, sizeof *m);
  m->bs = bs, m->has_teacher = t.teacher, m->has_confidence = t.conf;
  m->pos_ce_num = malloc((size_t)bs * sizeof(double));
  m->pos_acc_num = malloc((size_t)bs * sizeof(double));
  m->pos_den = malloc((size_t)bs * sizeof(double));
  if (!m->pos_ce_num || !m->pos_acc_num || !m->pos_den) {
    df_dspark_metrics_free(m);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  memcpy(m->pos_ce_num, st + DF_DSTAT_POS, (size_t)bs * sizeof(double));
  memcpy(m->pos_acc_num, st + DF_DSTAT_POS + bs, (size_t)bs * sizeof(double));
  memcpy(m->pos_den, st + DF_DSTAT_POS + 2 * bs, (size_t)bs * sizeof(double));
  m->loss_den = loss_den;
  m->ce_num = st[DF_DSTAT_CE], m->l1_num = st[DF_DSTAT_L1];
  m->conf_num = st[DF_DSTAT_CONF], m->conf_err_num = st[DF_DSTAT_CONF_ERR];
  m->acc_num = st[DF_DSTAT_ACC_NUM], m->eval_den = st[DF_DSTAT_EVAL_DEN];
  m->teacher_agree_num = st[DF_DSTAT_AGREE], m->teacher_top1_num = st[DF_DSTAT_TTOP1];
  m->draft_top1_num = st[DF_DSTAT_DTOP1];
  m->tau_num = st[DF_DSTAT_TAU_NUM], m->tau_den = st[DF_DSTAT_TAU_DEN];
  m->greedy_accept_sum = st[DF_DSTAT_GREEDY], m->num_blocks = (int64_t)st[DF_DSTAT_BLOCKS];
  if (!(opt->l1_alpha > 0)) m->l1_num = 0.0; // SpecForge logs the L1 term only when it is in the loss
  m->loss_num = opt->ce_alpha * m->ce_num + opt->l1_alpha * m->l1_num + (t.conf ? opt->conf_alpha * m->conf_num : 0);
  return DF_OK;
}

// ---- the objective on host arrays ----------------------------------------------------------------------------

double df_dspark_loss_den(const df_dspark_labels *lab) {
  double s = 0;
  for (int64_t r = 0; r < lab->B * lab->N * lab->bs; r++) s += lab->weights[r];
  return s;
}

void df_dspark_teacher_index(const df_dspark_labels *lab, int64_t S, int32_t *idx) {
  const int64_t per_sample = lab->N * lab->bs;
  for (int64_t r = 0; r < lab->B * per_sample; r++)
    idx[r] = lab->teacher_pos[r] < 0 ? -1 : (int32_t)((r / per_sample) * S + lab->teacher_pos[r]);
}

// Device buffers of the host-array entry point, carved from one allocation.
typedef struct {
  void *buf;
  df_dspark_rows rows;
  df_dspark_work work;
  df_tensor stats, last;
} host_objective;

typedef struct {
  char *p;
  df_device dev;
} carver;

static void *carve(carver *c, size_t bytes) {
  void *p = c->p;
  c->p += (bytes + 63) & ~(size_t)63;
  return p;
}

static void host_layout(carver *c, int64_t R, int64_t nb, int64_t H, int64_t rank, int64_t BS_rows, int64_t bs,
                        host_objective *h) {
  const df_device d = c->dev;
  const int64_t ns = DF_DSPARK_STATS(bs);
  h->stats = df_f64_on(d, carve(c, (size_t)ns * 8), ns);
  h->rows.labels = df_i32_on(d, carve(c, (size_t)R * 4), R);
  h->rows.prev = df_i32_on(d, carve(c, (size_t)R * 4), R);
  h->rows.teacher_idx = df_i32_on(d, carve(c, (size_t)R * 4), R);
  h->rows.weights = df_f32_on(d, carve(c, (size_t)R * 4), R);
  h->rows.valid = df_u8_on(d, carve(c, (size_t)R), R);
  h->rows.keep = df_u8_on(d, carve(c, (size_t)nb), nb);
  df_tensor *f32s[] = {&h->work.ce, &h->work.top1, &h->work.l1, &h->work.ttop1, &h->work.bce, &h->work.dconf};
  for (size_t i = 0; i < sizeof f32s / sizeof *f32s; i++) *f32s[i] = df_f32_on(d, carve(c, (size_t)R * 4), R);
  h->work.correct = df_u8_on(d, carve(c, (size_t)R), R);
  h->work.agree = df_u8_on(d, carve(c, (size_t)R), R);
  h->work.du = df_f32_on(d, carve(c, (size_t)(R * (rank > 0 ? rank : 1)) * 4), R, rank > 0 ? rank : 1);
  h->work.teacher = df_f32_on(d, carve(c, (size_t)(R * H) * 4), R, H);
  h->last = df_f32_on(d, carve(c, (size_t)(BS_rows * H) * 4), BS_rows, H);
}

static df_status upload(df_ctx *ctx, const df_tensor *dst, const void *src, df_error *err) {
  return df_copy(ctx, dst->data, dst->device, src, DF_DEV_CPU, (size_t)df_numel(dst) * df_dtype_size(dst->dtype), err);
}

static df_status host_stage(df_ctx *ctx, const df_dspark_labels *lab, const df_dflash_anchors *a,
                            const float *last_hidden, int64_t S, int64_t H, int64_t rank, host_objective *h,
                            df_error *err) {
  const int64_t R = lab->B * lab->N * lab->bs, nb = lab->B * lab->N, BSr = last_hidden ? lab->B * S : 0;
  carver measure = {.p = NULL, .dev = df_ctx_device(ctx)};
  host_layout(&measure, R, nb, H, rank, BSr, lab->bs, h);
  DF_TRY(df_buffer_alloc(ctx, (size_t)(uintptr_t)measure.p, &h->buf, err));
  carver c = {.p = h->buf, .dev = df_ctx_device(ctx)};
  host_layout(&c, R, nb, H, rank, BSr, lab->bs, h);
  h->rows.B = lab->B, h->rows.N = lab->N, h->rows.bs = lab->bs, h->rows.loss_den = df_dspark_loss_den(lab);
  int32_t *idx = malloc((size_t)R * sizeof(int32_t));
  if (!idx) return DF_FAIL(err, DF_ERR_NOMEM, "dspark objective", NULL, "out of memory for %lld rows", (long long)R);
  df_dspark_teacher_index(lab, S, idx);
  df_status st = upload(ctx, &h->rows.labels, lab->labels, err);
  if (st == DF_OK) st = upload(ctx, &h->rows.prev, lab->prev, err);
  if (st == DF_OK) st = upload(ctx, &h->rows.teacher_idx, idx, err);
  if (st == DF_OK) st = upload(ctx, &h->rows.weights, lab->weights, err);
  if (st == DF_OK) st = upload(ctx, &h->rows.valid, lab->valid, err);
  if (st == DF_OK) st = upload(ctx, &h->rows.keep, a->keep, err);
  if (st == DF_OK && last_hidden) st = upload(ctx, &h->last, last_hidden, err);
  free(idx);
  if (st == DF_OK) st = df_fill(ctx, &h->stats, 0.0, err);
  return st;
}

static df_status check_objective(const df_dspark_loss_options *opt, const df_tensor *hidden, const df_tensor *head,
                                 const df_dspark_labels *lab, const df_dflash_anchors *a, df_error *err) {
  if (!opt || !hidden || !head || !lab || !a)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dspark_objective");
  DF_TRY(check_options(opt, err));
  if (lab->B != a->B || lab->N != a->N)
    return DF_FAIL(err, DF_ERR_INVALID, "labels", "build the labels from these anchors",
                   "labels are (%lld, %lld) but anchors (%lld, %lld)", (long long)lab->B, (long long)lab->N,
                   (long long)a->B, (long long)a->N);
  return DF_OK;
}

df_status df_dspark_objective(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                              const df_tensor *hidden, const df_tensor *head, const float *last_hidden, int64_t S,
                              const df_dspark_labels *lab, const df_dflash_anchors *a, float *dhidden,
                              df_dspark_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_objective(opt, hidden, head, lab, a, err));
  const df_dspark_terms t = df_dspark_objective_terms(opt, heads);
  if (t.teacher && !last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture the data with target_last_hidden_states (DSpark), or set dspark_l1_loss_alpha and "
                   "dspark_confidence_head_alpha to 0",
                   "the DSpark L1/confidence loss needs the target's final hidden states, and the batch has none");
  const int64_t R = lab->B * lab->N * lab->bs, H = head->shape[1], ns = DF_DSPARK_STATS(lab->bs);
  host_objective h = {0};
  double *st_host = malloc((size_t)ns * sizeof(double));
  df_status st = st_host ? host_stage(ctx, lab, a, t.teacher ? last_hidden : NULL, S, H, t.rank, &h, err)
                         : DF_FAIL(err, DF_ERR_NOMEM, "dspark objective", NULL, "out of memory");
  df_tensor dh = df_f32_on(df_ctx_device(ctx), dhidden, R, H);
  if (st == DF_OK)
    st = df_dspark_objective_rows(ctx, opt, heads, hidden, head, t.teacher ? &h.last : NULL, &h.rows, &h.work,
                                  dhidden ? &dh : NULL, &h.stats, err);
  if (st == DF_OK) st = df_copy(ctx, st_host, DF_DEV_CPU, h.stats.data, df_ctx_device(ctx), (size_t)ns * 8, err);
  if (st == DF_OK) st = df_dspark_metrics_from_stats(st_host, lab->bs, h.rows.loss_den, opt, t, out, err);
  free(st_host);
  df_buffer_free(ctx, h.buf);
  return st;
}
