// The DSpark strategy's table (strategies/strategy.h): DFlash's anchors and blocks with DSpark's rows (next-token,
// prefix-valid labels, previous tokens, teacher rows), the CE + L1 + confidence objective through the heads,
// SpecForge's DSpark metrics, and proposals of every slot with the Markov head's correction for speculative decoding.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/dflash/family.h"
#include "strategies/dspark/dspark.h"

typedef struct {
  df_block_run blk;
  df_dspark_loss_options loss;
  df_dspark_terms terms;
  df_dspark_heads *heads;
  df_dspark_labels built;
  int64_t S; // the built batch's context length (teacher row indices)
  df_dspark_rows rows;
  df_dspark_work work;
  // speculative decoding
  float *logits, *base, *bias, *dlogits, *dbias;
  int32_t *prev, *dprev;
} dspark_run;

static const char *const KEYS[] = {"dspark_ce_loss_alpha", "dspark_l1_loss_alpha", "dspark_confidence_head_alpha",
                                   NULL};

static bool trains(const df_draft_config *cfg) { return cfg->kind == DF_DRAFT_DSPARK; }

// ---- rows ----------------------------------------------------------------------------------------------------------

static df_status rows_build(void *self, const df_batch *bt, const df_dflash_anchors *a, int64_t bs, int64_t vocab,
                            double *loss_den, df_error *err) {
  dspark_run *r = self;
  DF_TRY(
      df_dspark_build_labels(bt->input_ids, bt->loss_mask, bt->S, a, bs, r->blk.env.loss_decay_gamma, &r->built, err));
  r->S = bt->S;
  *loss_den = df_dspark_loss_den(&r->built);
  const int64_t per = a->N * bs, R = a->B * per;
  DF_TRY(df_stage_check_ids("labels", r->built.labels, R, per, vocab, err));
  return df_stage_check_ids("previous tokens", r->built.prev, R, per, vocab, err);
}

static void rows_layout(void *self, df_stage_pass pass, df_carver *up, df_carver *scratch, const df_stage_dims *d,
                        df_device dev, const df_tensor *keep) {
  dspark_run *r = self;
  const int64_t R = d->R, H = r->blk.env.frozen.hidden, rank = r->terms.rank > 0 ? r->terms.rank : 1;
  int32_t *labels = df_carve(up, R * 4), *prev = df_carve(up, R * 4), *tidx = df_carve(up, R * 4);
  uint8_t *valid = df_carve(up, R);
  float *weights = df_carve(up, R * 4);
  if (pass == DF_STAGE_FILL) {
    memcpy(labels, r->built.labels, sizeof(int32_t) * (size_t)R);
    memcpy(prev, r->built.prev, sizeof(int32_t) * (size_t)R);
    memcpy(valid, r->built.valid, (size_t)R);
    memcpy(weights, r->built.weights, sizeof(float) * (size_t)R);
    df_dspark_teacher_index(&r->built, r->S, tidx);
    return;
  }
  float *f[6];
  for (int i = 0; i < 6; i++) f[i] = df_carve(scratch, R * 4);
  uint8_t *correct = df_carve(scratch, R), *agree = df_carve(scratch, R);
  const df_dtype dt = df_draft_model_storage(r->blk.env.model);
  const int64_t es = (int64_t)df_dtype_size(dt);
  float *du = df_carve(scratch, R * rank * es);
  const int64_t trows = r->terms.teacher ? R : 1;
  float *teacher = df_carve(scratch, trows * H * es);
  float *teacher32 = dt != DF_F32 ? df_carve(scratch, trows * H * 4) : NULL;
  if (pass != DF_STAGE_BIND) return;
  r->rows = (df_dspark_rows){.B = d->B,
                             .N = d->N,
                             .bs = d->bs,
                             .labels = df_i32_on(dev, labels, R),
                             .valid = df_u8_on(dev, valid, R),
                             .prev = df_i32_on(dev, prev, R),
                             .weights = df_f32_on(dev, weights, R),
                             .teacher_idx = df_i32_on(dev, tidx, R),
                             .keep = *keep};
  r->work = (df_dspark_work){.ce = df_f32_on(dev, f[0], R),
                             .top1 = df_f32_on(dev, f[1], R),
                             .l1 = df_f32_on(dev, f[2], R),
                             .ttop1 = df_f32_on(dev, f[3], R),
                             .bce = df_f32_on(dev, f[4], R),
                             .dconf = df_f32_on(dev, f[5], R),
                             .correct = df_u8_on(dev, correct, R),
                             .agree = df_u8_on(dev, agree, R),
                             .du = df_view_on(dt, dev, du, R, rank),
                             .teacher = df_view_on(dt, dev, teacher, trows, H),
                             .teacher32 = df_f32_on(dev, teacher32, trows, H)};
}

static void rows_release(void *self) { df_dspark_labels_free(&((dspark_run *)self)->built); }

// DSpark's objective takes grad_scale itself and adds the heads' gradients.
static df_status objective(void *self, df_block_run *b, const df_staged *st, const df_tensor *hidden, double grad_scale,
                           df_tensor *dhidden, df_tensor *stats, df_error *err) {
  dspark_run *r = self;
  r->rows.loss_den = st->loss_den;
  r->loss.grad_scale = grad_scale;
  const df_tensor head = df_block_head(b);
  return df_dspark_objective_rows(b->env.ctx, &r->loss, r->heads, hidden, &head,
                                  st->last_hidden.data ? &st->last_hidden : NULL, &r->rows, &r->work, dhidden, stats,
                                  err);
}

// ---- metrics and reports
// ---------------------------------------------------------------------------------------------

static df_status dspark_metrics(const dspark_run *r, const double *st, double loss_den, df_dspark_metrics *m,
                                df_error *err) {
  return df_dspark_metrics_from_stats(st, r->blk.env.cfg->block_size, loss_den, &r->loss, r->terms, m, err);
}

static df_status metrics(const df_strategy_run *base, const double *st, double loss_den, df_strategy_metrics *out,
                         df_error *err) {
  const dspark_run *r = (const dspark_run *)base;
  df_dspark_metrics m;
  DF_TRY(dspark_metrics(r, st, loss_den, &m, err));
  *out = (df_strategy_metrics){.loss_num = m.loss_num,
                               .acc_num = m.acc_num,
                               .acc_den = m.eval_den,
                               .accept_sum = m.greedy_accept_sum,
                               .num_blocks = m.num_blocks,
                               .positions = m.bs,
                               .pos_num = m.pos_acc_num,
                               .pos_den = m.pos_den};
  m.pos_acc_num = m.pos_den = NULL; // moved
  df_dspark_metrics_free(&m);
  return DF_OK;
}

static json_t *ratio(bool ran, double num, double den) {
  return ran && den > 0 && isfinite(num / den) ? json_real(num / den) : json_null();
}

// SpecForge's DSpark metrics (null when the term did not run or has no denominator); eval reports and step dumps add
// the numerators behind them, the step dump the per-position CE and accuracy too.
static void report(const df_strategy_run *base, const double *st, double loss_den, df_report_kind kind, json_t *o) {
  const dspark_run *r = (const dspark_run *)base;
  if (kind == DF_REPORT_TRAIN) return;
  df_error ignored = {0};
  df_dspark_metrics m;
  if (dspark_metrics(r, st, loss_den, &m, &ignored) != DF_OK) return;
  const bool t = m.has_teacher, c = m.has_confidence;
  if (kind == DF_REPORT_EVAL_LINE) {
    json_object_set_new(o, "eval/ce_loss", ratio(true, m.ce_num, m.loss_den));
    json_object_set_new(o, "eval/l1_loss", ratio(t, m.l1_num, m.loss_den));
    json_object_set_new(o, "eval/confidence_loss", ratio(c, m.conf_num, m.loss_den));
    json_object_set_new(o, "eval/tau_probabilistic", ratio(t, m.tau_num, m.tau_den));
    df_dspark_metrics_free(&m);
    return;
  }
  json_object_set_new(o, "strategy", json_string("dspark"));
  json_object_set_new(o, "ce_loss", ratio(true, m.ce_num, m.loss_den));
  json_object_set_new(o, "l1_loss", ratio(kind == DF_REPORT_STEP || t, m.l1_num, m.loss_den));
  json_object_set_new(o, "confidence_loss", ratio(kind == DF_REPORT_STEP || c, m.conf_num, m.loss_den));
  json_object_set_new(o, "confidence_abs_error", ratio(c, m.conf_err_num, m.loss_den));
  json_object_set_new(o, "teacher_agreement", ratio(t, m.teacher_agree_num, m.eval_den));
  json_object_set_new(o, "tau_probabilistic", ratio(t, m.tau_num, m.tau_den));
  if (kind == DF_REPORT_STEP) {
    json_object_set_new(o, "acc", ratio(true, m.acc_num, m.eval_den));
    json_object_set_new(o, "teacher_top1_prob", ratio(t, m.teacher_top1_num, m.eval_den));
    json_object_set_new(o, "draft_top1_prob", ratio(t, m.draft_top1_num, m.eval_den));
  }
  const char *nums[] = {"ce_num",  "l1_num",  "confidence_num", "confidence_abs_error_num", "teacher_agreement_num",
                        "tau_num", "tau_den", "eval_den",       "teacher_top1_num",         "draft_top1_num"};
  const double vals[] = {m.ce_num,  m.l1_num,  m.conf_num, m.conf_err_num,     m.teacher_agree_num,
                         m.tau_num, m.tau_den, m.eval_den, m.teacher_top1_num, m.draft_top1_num};
  const int n = kind == DF_REPORT_STEP ? 10 : 7;
  for (int i = 0; i < n; i++)
    json_object_set_new(o, nums[i], kind == DF_REPORT_STEP || isfinite(vals[i]) ? json_real(vals[i]) : json_null());
  if (kind == DF_REPORT_STEP) {
    json_t *ce = json_array(), *acc = json_array();
    for (int64_t k = 0; k < m.bs; k++) {
      json_array_append_new(ce, ratio(true, m.pos_ce_num[k], m.pos_den[k]));
      json_array_append_new(acc, ratio(true, m.pos_acc_num[k], m.pos_den[k]));
    }
    json_object_set_new(o, "ce_position", ce);
    json_object_set_new(o, "accuracy_position", acc);
    const char *sums[] = {"ce_position_num", "accuracy_position_num", "position_den"};
    const double *v[] = {m.pos_ce_num, m.pos_acc_num, m.pos_den};
    for (int j = 0; j < 3; j++) {
      json_t *a = json_array();
      for (int64_t k = 0; k < m.bs; k++) json_array_append_new(a, json_real(v[j][k]));
      json_object_set_new(o, sums[j], a);
    }
  }
  df_dspark_metrics_free(&m);
}

static double ratio_or_nan(bool ran, double num, double den) { return ran && den > 0 ? num / den : NAN; }

static void print(const df_strategy_run *base, const double *st, double loss_den, FILE *fp) {
  const dspark_run *r = (const dspark_run *)base;
  df_error ignored = {0};
  df_dspark_metrics m;
  if (dspark_metrics(r, st, loss_den, &m, &ignored) != DF_OK) return;
  fprintf(fp, "ce_loss %.6f   l1_loss %.6f   confidence_loss %.6f   tau_probabilistic %.4f",
          ratio_or_nan(true, m.ce_num, m.loss_den), ratio_or_nan(m.has_teacher, m.l1_num, m.loss_den),
          ratio_or_nan(m.has_confidence, m.conf_num, m.loss_den), ratio_or_nan(m.has_teacher, m.tau_num, m.tau_den));
  df_dspark_metrics_free(&m);
}

static int64_t first_position(const df_strategy_run *r) { return 0; } // slot 0 predicts the token after the anchor

// ---- speculative decoding ------------------------------------------------------------------------------------------

static int64_t proposals(const df_strategy_run *r) { return ((const dspark_run *)r)->blk.env.cfg->block_size; }

static df_status propose_buffers(dspark_run *r, int64_t bs, int64_t V, df_error *err) {
  if (r->logits) return DF_OK;
  df_ctx *ctx = r->blk.env.ctx;
  r->logits = malloc(sizeof(float) * (size_t)V), r->base = malloc(sizeof(float) * (size_t)(bs * V));
  r->bias = malloc(sizeof(float) * (size_t)V), r->prev = malloc(sizeof(int32_t) * (size_t)bs);
  if (!r->logits || !r->base || !r->bias || !r->prev)
    return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
  DF_TRY(df_buffer_alloc(ctx, sizeof(float) * (size_t)(bs * V), (void **)&r->dlogits, err));
  DF_TRY(df_buffer_alloc(ctx, sizeof(float) * (size_t)V, (void **)&r->dbias, err));
  return df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)bs, (void **)&r->dprev, err);
}

// Slot k's token = argmax(lm_head h_k + W2 u_k(prev_k)), prev_0 = the anchor token, prev_k = slot k−1's.
static df_status propose(df_strategy_run *base, const df_propose_in *in, int32_t *props, df_error *err) {
  dspark_run *r = (dspark_run *)base;
  df_ctx *ctx = r->blk.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t bs = r->blk.env.cfg->block_size, V = in->lm_head.shape[0], H = in->lm_head.shape[1];
  const size_t row = sizeof(float) * (size_t)V;
  DF_TRY(propose_buffers(r, bs, V, err));
  df_tensor x = df_view((void *)in->hidden, DF_F32, dev, 2, (const int64_t[]){bs, H});
  df_tensor y = df_view(r->dlogits, DF_F32, dev, 2, (const int64_t[]){bs, V});
  DF_TRY(df_linear_forward(ctx, &x, &in->lm_head, NULL, &y, err));
  DF_TRY(df_copy(ctx, r->base, DF_DEV_CPU, r->dlogits, dev, row * (size_t)bs, err));
  const int64_t rank = df_dspark_heads_markov_rank(r->heads);
  for (int64_t k = 0; k < bs; k++) r->prev[k] = in->anchor_token;
  for (int64_t k = 0; k < bs; k++) {
    float *z = r->logits;
    memcpy(z, r->base + k * V, row);
    if (rank > 0) {
      const float *u = NULL, *conf = NULL;
      DF_TRY(df_copy(ctx, r->dprev, dev, r->prev, DF_DEV_CPU, sizeof(int32_t) * (size_t)bs, err));
      DF_TRY(df_dspark_heads_forward(r->heads, 1, bs, in->hidden, r->dprev, &u, &conf, err));
      df_tensor uv = df_view((void *)(u + k * rank), DF_F32, dev, 2, (const int64_t[]){1, rank});
      df_tensor bias = df_view(r->dbias, DF_F32, dev, 2, (const int64_t[]){1, V});
      DF_TRY(df_linear_forward(ctx, &uv, df_dspark_heads_w2(r->heads), NULL, &bias, err));
      DF_TRY(df_copy(ctx, r->bias, DF_DEV_CPU, r->dbias, dev, row, err));
      for (int64_t v = 0; v < V; v++) z[v] += r->bias[v];
    }
    props[k] = df_block_argmax(z, V);
    for (int64_t j = k + 1; j < bs; j++) r->prev[j] = props[k];
  }
  return DF_OK;
}

// ---- the table -----------------------------------------------------------------------------------------------------

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err);

static void run_close(df_strategy_run *base) {
  dspark_run *r = (dspark_run *)base;
  if (!r) return;
  df_block_close(&r->blk);
  df_ctx *ctx = r->blk.env.ctx;
  if (r->dlogits) df_buffer_free(ctx, r->dlogits);
  if (r->dbias) df_buffer_free(ctx, r->dbias);
  if (r->dprev) df_buffer_free(ctx, r->dprev);
  free(r->logits), free(r->base), free(r->bias), free(r->prev);
  free(r);
}

static bool needs_last_hidden(const df_strategy_run *r) { return ((const dspark_run *)r)->terms.teacher; }
static int64_t stats_len(const df_strategy_run *r) {
  return DF_DSPARK_STATS(((const dspark_run *)r)->blk.env.cfg->block_size);
}

static df_status micro(df_strategy_run *r, const df_micro_args *a, df_micro_info *info, df_error *err) {
  return df_block_micro(&((dspark_run *)r)->blk, a, info, err);
}

// SpecForge's export normaliser: Qwen3DSparkModel reads the head settings at the top level (modeling/dspark_heads.h).
static df_status export_normalize(json_t *cfg, const char *where, df_error *err) {
  return df_dspark_normalize_export_config(cfg, where, err);
}

static const char *const KEEP_F32[] = {DF_DSPARK_CONFIDENCE_PREFIX, NULL}; // SGLang keeps the confidence head fp32

static bool has_confidence_head(const df_draft_config *cfg) { return cfg->dflash.enable_confidence_head; }

const df_strategy df_strategy_dspark = {.name = "dspark",
                                        .projector = "dspark",
                                        .summary = "DSpark: DFlash blocks with a Markov head and a confidence head, "
                                                   "CE + L1 + BCE",
                                        .keys = KEYS,
                                        .trains = trains,
                                        .reads_last_hidden = true,
                                        .open = run_open,
                                        .close = run_close,
                                        .needs_last_hidden = needs_last_hidden,
                                        .stats_len = stats_len,
                                        .micro = micro,
                                        .metrics = metrics,
                                        .report = report,
                                        .print = print,
                                        .first_position = first_position,
                                        .proposals = proposals,
                                        .propose = propose,
                                        .draft = df_block_draft,
                                        .blocks = true,
                                        .export_normalize = export_normalize,
                                        .serving_class_ffn = "Qwen3MoeDSparkModel",
                                        .keep_f32 = KEEP_F32,
                                        .has_confidence_head = has_confidence_head};

// training.dspark_{ce_loss,l1_loss,confidence_head}_alpha (SpecForge's defaults 0.1 / 0.9 / 1.0).
static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  dspark_run *r = calloc(1, sizeof *r);
  if (!r) return DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  r->loss = (df_dspark_loss_options){.ce_alpha = df_strategy_number(env->values, "dspark_ce_loss_alpha", 0.1),
                                     .l1_alpha = df_strategy_number(env->values, "dspark_l1_loss_alpha", 0.9),
                                     .conf_alpha = df_strategy_number(env->values, "dspark_confidence_head_alpha", 1.0),
                                     .chunk_blocks = env->chunk_blocks};
  r->heads = df_draft_model_dspark_heads(env->model);
  r->terms = df_dspark_objective_terms(&r->loss, r->heads);
  const df_block_hooks h = {.rows = {.self = r, .build = rows_build, .layout = rows_layout, .release = rows_release},
                            .objective = objective,
                            .self = r};
  df_status st = df_block_open(&r->blk, &df_strategy_dspark, env, &h, r->terms.teacher,
                               DF_DSPARK_STATS(env->cfg->block_size), err);
  if (st != DF_OK) {
    run_close(&r->blk.base);
    return st;
  }
  *out = &r->blk.base;
  return DF_OK;
}
