// DSpark labels (next token, prefix-valid) and the objective through the heads and the fused LM-head op
// (docs/dflash-step.md §6; SpecForge's OnlineDSparkModel in specforge/algorithms/common/dflash_family_model.py).
#include "strategies/dspark.h"

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

// Per-row outputs of the fused op and the buffers around it.
typedef struct {
  float *ce, *top1, *l1, *ttop1, *bce, *du, *dconf, *teacher;
  uint8_t *correct, *agree;
} rows_scratch;

static void rows_free(rows_scratch *s) {
  free(s->ce), free(s->top1), free(s->l1), free(s->ttop1), free(s->bce), free(s->du), free(s->dconf);
  free(s->teacher), free(s->correct), free(s->agree);
}

static df_status rows_alloc(rows_scratch *s, int64_t R, int64_t H, int64_t rank, bool teacher, df_error *err) {
  memset(s, 0, sizeof *s);
  size_t f = sizeof(float), n = (size_t)R;
  s->ce = malloc(n * f), s->top1 = malloc(n * f), s->l1 = calloc(n, f), s->ttop1 = calloc(n, f);
  s->bce = calloc(n, f), s->dconf = calloc(n, f), s->correct = malloc(n), s->agree = calloc(n, 1);
  s->du = rank > 0 ? malloc(n * (size_t)rank * f) : NULL;
  s->teacher = teacher ? malloc(n * (size_t)H * f) : NULL;
  if (s->ce && s->top1 && s->l1 && s->ttop1 && s->bce && s->dconf && s->correct && s->agree && (rank <= 0 || s->du) &&
      (!teacher || s->teacher))
    return DF_OK;
  rows_free(s);
  return DF_FAIL(err, DF_ERR_NOMEM, "dspark objective", "lower training.num_anchors or training.batch_size",
                 "out of memory for %lld rows", (long long)R);
}

static df_status check_objective(const df_dspark_loss_options *opt, const df_tensor *hidden, const df_tensor *head,
                                 const df_dspark_labels *lab, const df_dflash_anchors *a, df_error *err) {
  if (!opt || !hidden || !head || !lab || !a)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dspark_objective");
  const double al[3] = {opt->ce_alpha, opt->l1_alpha, opt->conf_alpha};
  const char *keys[3] = {"training.dspark_ce_loss_alpha", "training.dspark_l1_loss_alpha",
                         "training.dspark_confidence_head_alpha"};
  for (int i = 0; i < 3; i++)
    if (!(al[i] >= 0) || !isfinite(al[i]))
      return DF_FAIL(err, DF_ERR_INVALID, keys[i], "use a value >= 0", "%s = %g", keys[i], al[i]);
  if (opt->chunk_blocks < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "training.objective_chunk_blocks", "use 0 (one pass) or a positive count",
                   "objective_chunk_blocks = %lld", (long long)opt->chunk_blocks);
  if (lab->B != a->B || lab->N != a->N)
    return DF_FAIL(err, DF_ERR_INVALID, "labels", "build the labels from these anchors",
                   "labels are (%lld, %lld) but anchors (%lld, %lld)", (long long)lab->B, (long long)lab->N,
                   (long long)a->B, (long long)a->N);
  int64_t rows = lab->B * lab->N * lab->bs;
  if (rows <= 0 || hidden->ndim < 2 || df_numel(hidden) != rows * head->shape[1])
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "pass the draft output (B·N·bs, H)",
                   "hidden does not hold B·N·bs = %lld rows of %lld", (long long)rows, (long long)head->shape[1]);
  return DF_OK;
}

// The teacher's rows: target_last_hidden_states at teacher_pos (zero rows where the slot is not valid).
static void gather_teacher(const df_dspark_labels *lab, const float *last_hidden, int64_t S, int64_t H, float *out) {
  int64_t per_sample = lab->N * lab->bs;
  for (int64_t r = 0; r < lab->B * per_sample; r++) {
    int32_t p = lab->teacher_pos[r];
    if (p < 0)
      memset(out + r * H, 0, sizeof(float) * (size_t)H);
    else
      memcpy(out + r * H, last_hidden + ((r / per_sample) * S + p) * H, sizeof(float) * (size_t)H);
  }
}

// Which terms run (SpecForge: the teacher only when the L1 term or an active confidence head needs it).
typedef struct {
  int64_t rank;
  bool conf, teacher;
  const float *latent, *conf_logits;
} terms;

static df_status run_fused(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads, const terms *t,
                           const df_tensor *hidden, const df_tensor *head, const df_dspark_labels *lab, float gs,
                           rows_scratch *s, float *dhidden, df_error *err) {
  int64_t R = lab->B * lab->N * lab->bs, H = head->shape[1], rk = t->rank;
  df_tensor labels = df_i32(lab->labels, R), weights = df_f32(lab->weights, R);
  df_tensor u = df_f32((float *)t->latent, R, rk > 0 ? rk : 1), teacher = df_f32(s->teacher, R, H);
  df_tensor conf = df_f32((float *)t->conf_logits, R);
  df_tensor ce = df_f32(s->ce, R), cor = df_u8(s->correct, R), top1 = df_f32(s->top1, R), l1 = df_f32(s->l1, R);
  df_tensor agree = df_u8(s->agree, R), ttop1 = df_f32(s->ttop1, R), bce = df_f32(s->bce, R);
  df_tensor dh = df_f32(dhidden, R, H), du = df_f32(s->du, R, rk > 0 ? rk : 1), dconf = df_f32(s->dconf, R);
  df_lmhead_dspark_desc d = {.chunk_rows = opt->chunk_blocks * lab->bs,
                             .grad_scale = gs,
                             .alpha_ce = (float)opt->ce_alpha,
                             .alpha_l1 = (float)opt->l1_alpha,
                             .alpha_conf = t->conf ? (float)opt->conf_alpha : 0.0f};
  df_lmhead_dspark_in in = {.hidden = hidden,
                            .head = head,
                            .markov_u = rk > 0 ? &u : NULL,
                            .markov_w2 = rk > 0 ? df_dspark_heads_w2(heads) : NULL,
                            .teacher = t->teacher ? &teacher : NULL,
                            .labels = &labels,
                            .weights = &weights,
                            .conf = t->conf ? &conf : NULL};
  bool grad = dhidden != NULL;
  df_lmhead_dspark_out out = {.ce = &ce,
                              .correct = &cor,
                              .draft_top1 = &top1,
                              .l1 = t->teacher ? &l1 : NULL,
                              .agree = t->teacher ? &agree : NULL,
                              .teacher_top1 = t->teacher ? &ttop1 : NULL,
                              .bce = t->conf ? &bce : NULL,
                              .dhidden = grad ? &dh : NULL,
                              .du = grad && rk > 0 ? &du : NULL,
                              .dw2 = grad && rk > 0 ? df_dspark_heads_w2_grad(heads) : NULL,
                              .dconf = grad && t->conf ? &dconf : NULL};
  return df_lmhead_dspark(ctx, &d, &in, &out, err);
}

static inline double sigmoid(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// Sums over one block (bs rows from row0).
static void block_metrics(const df_dspark_labels *lab, const rows_scratch *s, const terms *t, int64_t row0, bool keep,
                          df_dspark_metrics *m) {
  int64_t bs = lab->bs, greedy = 0;
  bool any = false, run = true;
  double prod = 1.0, expect = 0.0;
  for (int64_t k = 0; k < bs; k++) {
    int64_t r = row0 + k;
    bool v = lab->valid[r];
    double w = lab->weights[r];
    m->ce_num += (double)s->ce[r] * w;
    if (v) any = true, m->pos_den[k] += 1, m->pos_ce_num[k] += s->ce[r], m->pos_acc_num[k] += s->correct[r];
    run = run && v && s->correct[r];
    greedy += run;
    if (!t->teacher) continue;
    double y = fmin(fmax(1.0 - 0.5 * (double)s->l1[r], 0.0), 1.0); // acceptance probability, detached
    m->l1_num += (double)s->l1[r] * w;
    prod *= v ? y : 0.0;
    expect += prod;
    if (v) m->teacher_agree_num += s->agree[r], m->teacher_top1_num += s->ttop1[r], m->draft_top1_num += s->top1[r];
    if (!t->conf) continue;
    m->conf_num += (double)s->bce[r] * w;
    m->conf_err_num += fabs(sigmoid(t->conf_logits[r]) - y) * w;
  }
  if (keep) m->num_blocks++, m->greedy_accept_sum += (double)(1 + greedy);
  if (t->teacher && any) m->tau_num += 1.0 + expect, m->tau_den += 1.0;
}

static df_status collect_metrics(const df_dspark_loss_options *opt, const df_dspark_labels *lab,
                                 const df_dflash_anchors *a, const rows_scratch *s, const terms *t,
                                 df_dspark_metrics *m, df_error *err) {
  int64_t bs = lab->bs;
  m->bs = bs, m->has_teacher = t->teacher, m->has_confidence = t->conf;
  m->pos_ce_num = calloc((size_t)bs, sizeof(double));
  m->pos_acc_num = calloc((size_t)bs, sizeof(double));
  m->pos_den = calloc((size_t)bs, sizeof(double));
  if (!m->pos_ce_num || !m->pos_acc_num || !m->pos_den) {
    df_dspark_metrics_free(m);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  for (int64_t i = 0; i < lab->B * lab->N; i++) block_metrics(lab, s, t, i * bs, a->keep[i], m);
  if (!(opt->l1_alpha > 0)) m->l1_num = 0.0; // SpecForge logs the L1 term only when it is in the loss
  for (int64_t k = 0; k < bs; k++) m->acc_num += m->pos_acc_num[k], m->eval_den += m->pos_den[k];
  m->loss_num = opt->ce_alpha * m->ce_num + opt->l1_alpha * m->l1_num + (t->conf ? opt->conf_alpha * m->conf_num : 0);
  return DF_OK;
}

static double weight_sum(const float *w, int64_t R) {
  double s = 0;
  for (int64_t r = 0; r < R; r++) s += w[r];
  return s;
}

// Heads forward, the fused pass, and (with dhidden) the heads' backward.
static df_status objective_passes(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads, terms *t,
                                  const df_tensor *hidden, const df_tensor *head, const df_dspark_labels *lab, float gs,
                                  rows_scratch *s, float *dhidden, df_error *err) {
  if (t->rank > 0 || df_dspark_heads_has_confidence(heads))
    DF_TRY(df_dspark_heads_forward(heads, lab->B * lab->N, lab->bs, hidden->data, lab->prev, &t->latent,
                                   &t->conf_logits, err));
  DF_TRY(run_fused(ctx, opt, heads, t, hidden, head, lab, gs, s, dhidden, err));
  if (!dhidden || (t->rank == 0 && !df_dspark_heads_has_confidence(heads))) return DF_OK;
  return df_dspark_heads_backward(heads, t->rank > 0 ? s->du : NULL, t->conf ? s->dconf : NULL, dhidden, err);
}

df_status df_dspark_objective(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                              const df_tensor *hidden, const df_tensor *head, const float *last_hidden, int64_t S,
                              const df_dspark_labels *lab, const df_dflash_anchors *a, float *dhidden,
                              df_dspark_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_objective(opt, hidden, head, lab, a, err));
  terms t = {.rank = df_dspark_heads_markov_rank(heads)};
  t.conf = df_dspark_heads_has_confidence(heads) && opt->conf_alpha > 0;
  t.teacher = opt->l1_alpha > 0 || t.conf;
  if (t.teacher && !last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture the data with target_last_hidden_states (DSpark), or set dspark_l1_loss_alpha and "
                   "dspark_confidence_head_alpha to 0",
                   "the DSpark L1/confidence loss needs the target's final hidden states, and the batch has none");
  int64_t R = lab->B * lab->N * lab->bs, H = head->shape[1];
  out->loss_den = weight_sum(lab->weights, R);
  float gs = opt->grad_scale > 0 ? (float)opt->grad_scale : out->loss_den > 0 ? (float)(1.0 / out->loss_den) : 0.0f;
  rows_scratch s;
  DF_TRY(rows_alloc(&s, R, H, t.rank, t.teacher, err));
  if (t.teacher) gather_teacher(lab, last_hidden, S, H, s.teacher);
  df_status st = objective_passes(ctx, opt, heads, &t, hidden, head, lab, gs, &s, dhidden, err);
  if (st == DF_OK) st = collect_metrics(opt, lab, a, &s, &t, out, err);
  rows_free(&s);
  if (st != DF_OK) df_dspark_metrics_free(out);
  return st;
}
