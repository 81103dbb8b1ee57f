// The Domino strategy's table (strategies/strategy.h; docs/domino-step.md): DFlash's anchors and blocks with Domino's
// rows (labels, head tokens, corrected slots, decay weights), the two-CE objective through the GRU head, SpecForge's
// Domino metrics (final / base loss, accuracy, accept_len, lambda_base), and proposals filled slot by slot with the
// GRU correction applied causally (DominoDraftModel._sample_draft_tokens) for speculative decoding.
//
// Accumulation: SpecForge's Domino loss is a ratio per micro-step, (1 − λ)·F/(Σw + ε) + λ·B/(Σw + ε), and its trainer
// averages the micro-steps' gradients (loss / accumulation_steps, then DDP's mean over ranks), unlike DFlash's global
// token normalisation. The faithful mapping onto draftforge's window (the gradient of Σ_i g·loss_num_i divided by
// Σ_i loss_den_i) is loss_num = that ratio and loss_den = 1 per micro-step: the window's gradient is then the mean of
// the micro-steps' gradients over every micro-step of every rank, exactly SpecForge's.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/dflash/family.h"
#include "strategies/domino/domino.h"

typedef struct {
  df_block_run blk;
  df_domino_head *head;
  double lambda_start, decay_ratio;
  int64_t ss;
  df_domino_labels built;
  df_domino_rows rows;
  df_domino_work work;
  double weight_sum;     // Σ weights of the staged micro-batch (host-known)
  double lambda;         // λ of the last micro-step (host), for the reports
  int64_t step, horizon; // and where the schedule stood
  // speculative decoding
  float *base, *bias, *corrv, *dbias; // host [bs, V], [V], [V]; device [bs, V]
  int32_t *ids, *dids;
  uint8_t *dcorr_mask;
} domino_run;

static const char *const KEYS[] = {"lambda_base_start", "lambda_base_decay_ratio", NULL};

static bool trains(const df_draft_config *cfg) { return cfg->kind == DF_DRAFT_DOMINO; }

// ---- rows ----------------------------------------------------------------------------------------------------------

static df_status rows_build(void *self, const df_batch *bt, const df_dflash_anchors *a, int64_t bs, int64_t vocab,
                            double *loss_den, df_error *err) {
  domino_run *r = self;
  const df_draft_config *cfg = r->blk.env.cfg;
  DF_TRY(df_domino_build_labels(bt->input_ids, bt->loss_mask, bt->S, a, bs, cfg->dflash.shift_label, r->ss,
                                r->blk.env.loss_decay_gamma, &r->built, err));
  r->weight_sum = r->built.weight_sum;
  *loss_den = 1.0; // one per micro-step: the loss is already a ratio (see the top of this file)
  const int64_t per = a->N * bs, R = a->B * per;
  DF_TRY(df_stage_check_ids("labels", r->built.labels, R, per, vocab, err));
  return df_stage_check_ids("head tokens", r->built.head_ids, R, per, vocab, err);
}

static void rows_layout(void *self, df_stage_pass pass, df_carver *up, df_carver *scratch, const df_stage_dims *d,
                        df_device dev, const df_tensor *keep) {
  domino_run *r = self;
  const int64_t R = d->R, E = r->blk.env.cfg->dflash.emb_dim;
  int32_t *labels = df_carve(up, R * 4), *head_ids = df_carve(up, R * 4);
  float *weights = df_carve(up, R * 4);
  uint8_t *valid = df_carve(up, R), *corrected = df_carve(up, R);
  if (pass == DF_STAGE_FILL) {
    memcpy(labels, r->built.labels, sizeof(int32_t) * (size_t)R);
    memcpy(head_ids, r->built.head_ids, sizeof(int32_t) * (size_t)R);
    memcpy(weights, r->built.weights, sizeof(float) * (size_t)R);
    memcpy(valid, r->built.valid, (size_t)R);
    memcpy(corrected, r->built.corrected, (size_t)R);
    return;
  }
  float *ce_f = df_carve(scratch, R * 4), *ce_b = df_carve(scratch, R * 4), *dcorr = df_carve(scratch, R * E * 4);
  const df_dtype dt = df_draft_model_storage(r->blk.env.model); // dcorr: the draft's storage dtype (fits 4 B each)
  uint8_t *ok_f = df_carve(scratch, R), *ok_b = df_carve(scratch, R);
  if (pass != DF_STAGE_BIND) return;
  r->rows = (df_domino_rows){.B = d->B,
                             .N = d->N,
                             .bs = d->bs,
                             .labels = df_i32_on(dev, labels, R),
                             .head_ids = df_i32_on(dev, head_ids, R),
                             .valid = df_u8_on(dev, valid, R),
                             .corrected = df_u8_on(dev, corrected, R),
                             .weights = df_f32_on(dev, weights, R),
                             .keep = *keep};
  r->work = (df_domino_work){.ce_final = df_f32_on(dev, ce_f, R),
                             .ce_base = df_f32_on(dev, ce_b, R),
                             .correct_final = df_u8_on(dev, ok_f, R),
                             .correct_base = df_u8_on(dev, ok_b, R),
                             .dcorr = df_view_on(dt, dev, dcorr, R, E)};
}

static void rows_release(void *self) { df_domino_labels_free(&((domino_run *)self)->built); }

// The objective of the staged rows with this micro-step's λ; d(loss) or d(grad_scale · loss) (loss_den is 1).
static df_status objective(void *self, df_block_run *b, const df_staged *st, const df_tensor *hidden, double grad_scale,
                           df_tensor *dhidden, df_tensor *stats, df_error *err) {
  domino_run *r = self;
  const df_tensor head = df_block_head(b);
  const df_frozen *fz = &b->env.frozen;
  const df_tensor embed = df_view_on(fz->dtype, df_ctx_device(b->env.ctx), fz->embed, fz->vocab, fz->hidden);
  const df_domino_loss opt = {.lambda = r->lambda,
                              .weight_sum = r->weight_sum,
                              .grad_scale = grad_scale,
                              .chunk_rows = b->env.chunk_blocks * r->rows.bs};
  (void)st;
  return df_domino_objective_rows(b->env.ctx, &opt, r->head, hidden, &head, &embed, &r->rows, &r->work, dhidden, stats,
                                  err);
}

// ---- the table -----------------------------------------------------------------------------------------------------

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err);

static void run_close(df_strategy_run *base) {
  domino_run *r = (domino_run *)base;
  if (!r) return;
  df_block_close(&r->blk);
  df_ctx *ctx = r->blk.env.ctx;
  if (r->dbias) df_buffer_free(ctx, r->dbias);
  if (r->dids) df_buffer_free(ctx, r->dids);
  if (r->dcorr_mask) df_buffer_free(ctx, r->dcorr_mask);
  free(r->base), free(r->bias), free(r->corrv), free(r->ids);
  df_domino_labels_free(&r->built);
  free(r);
}

static bool needs_last_hidden(const df_strategy_run *r) { return false; }
static int64_t stats_len(const df_strategy_run *r) {
  return DF_DOMINO_STATS(((const domino_run *)r)->blk.env.cfg->block_size);
}

// λ from the run's schedule (args->step optimizer steps taken, of args->horizon), then the family's micro-step.
static df_status micro(df_strategy_run *base, const df_micro_args *a, df_micro_info *info, df_error *err) {
  domino_run *r = (domino_run *)base;
  r->step = a->step, r->horizon = a->horizon;
  r->lambda = df_domino_lambda(a->step, a->horizon, r->lambda_start, r->decay_ratio);
  return df_block_micro(&r->blk, a, info, err);
}

static df_status metrics(const df_strategy_run *base, const double *st, double loss_den, df_strategy_metrics *out,
                         df_error *err) {
  const int64_t bs = ((const domino_run *)base)->blk.env.cfg->block_size;
  df_domino_metrics m;
  df_domino_metrics_of(st, bs, &m);
  *out = (df_strategy_metrics){.loss_num = m.loss_num,
                               .acc_num = m.acc_num,
                               .acc_den = m.acc_den,
                               .accept_sum = m.accept_num,
                               .num_blocks = (int64_t)m.accept_den, // SpecForge's accept_len counts these blocks
                               .positions = bs,
                               .pos_num = malloc(sizeof(double) * (size_t)bs),
                               .pos_den = malloc(sizeof(double) * (size_t)bs)};
  if (!out->pos_num || !out->pos_den) {
    df_strategy_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  memcpy(out->pos_num, m.pos_num, sizeof(double) * (size_t)bs);
  memcpy(out->pos_den, m.pos_den, sizeof(double) * (size_t)bs);
  (void)loss_den;
  return DF_OK;
}

// SpecForge's ratios: every denominator carries + 1e-6 (OnlineDominoModel).
static double sf_ratio(double num, double den) { return num / (den + DF_DOMINO_EPS); }
static json_t *real_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

// SpecForge's Domino metrics (final_loss / base_loss averaged over the micro-steps like the loss; accuracy and
// accept_len over the window's counts), prefixed "eval/" on an eval line; the step dump adds the sums behind them.
static void report(const df_strategy_run *base, const double *st, double loss_den, df_report_kind kind, json_t *o) {
  const domino_run *r = (const domino_run *)base;
  df_domino_metrics m;
  df_domino_metrics_of(st, r->blk.env.cfg->block_size, &m);
  const bool line = kind == DF_REPORT_EVAL_LINE;
  const char *names[] = {"final_loss", "base_loss", "base_accuracy", "accept_len", "base_accept_len", "lambda_base"};
  const double vals[] = {loss_den > 0 ? m.final_sum / loss_den : NAN, loss_den > 0 ? m.base_sum / loss_den : NAN,
                         sf_ratio(m.base_acc_num, m.acc_den),         sf_ratio(m.accept_num, m.accept_den),
                         sf_ratio(m.base_accept_num, m.accept_den),   r->lambda};
  for (int i = 0; i < 6; i++) {
    char key[40];
    snprintf(key, sizeof key, "%s%s", line ? "eval/" : "", names[i]);
    json_object_set_new(o, key, real_or_null(vals[i]));
  }
  if (line || kind == DF_REPORT_TRAIN) return;
  json_object_set_new(o, "strategy", json_string("domino"));
  json_object_set_new(o, "accuracy", real_or_null(sf_ratio(m.acc_num, m.acc_den)));
  const char *sums[] = {"final_num", "base_num",   "weight_sum",      "acc_num",   "base_acc_num",
                        "acc_den",   "accept_num", "base_accept_num", "accept_den"};
  const double sv[] = {m.final_num, m.base_num,   m.weight,          m.acc_num,   m.base_acc_num,
                       m.acc_den,   m.accept_num, m.base_accept_num, m.accept_den};
  for (int i = 0; i < 9; i++) json_object_set_new(o, sums[i], json_real(sv[i]));
  json_object_set_new(o, "global_step", json_integer(r->step));
  json_object_set_new(o, "total_steps", json_integer(r->horizon));
}

static void print(const df_strategy_run *base, const double *st, double loss_den, FILE *fp) {
  const domino_run *r = (const domino_run *)base;
  df_domino_metrics m;
  df_domino_metrics_of(st, r->blk.env.cfg->block_size, &m);
  fprintf(fp, "final_loss %.6f   base_loss %.6f   base_accept_len %.4f   lambda_base %.4f",
          loss_den > 0 ? m.final_sum / loss_den : NAN, loss_den > 0 ? m.base_sum / loss_den : NAN,
          sf_ratio(m.base_accept_num, m.accept_den), r->lambda);
}

// With shift_label slot 0 predicts the token after the anchor; without, slot 0 is the anchor itself (DFlash's).
static int64_t first_position(const df_strategy_run *r) {
  return ((const domino_run *)r)->blk.env.cfg->dflash.shift_label ? 0 : 1;
}

// ---- speculative decoding ------------------------------------------------------------------------------------------

// bs − 1 either way: slots 0 .. bs−2 with shift_label (slot bs−1's prediction is never used), 1 .. bs−1 without.
static int64_t proposals(const df_strategy_run *r) { return ((const domino_run *)r)->blk.env.cfg->block_size - 1; }

static int32_t argmax_row(const float *z, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  return (int32_t)best;
}

static df_status propose_buffers(domino_run *r, int64_t bs, int64_t V, df_error *err) {
  if (r->base) return DF_OK;
  df_ctx *ctx = r->blk.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  r->base = malloc(sizeof(float) * (size_t)(bs * V)), r->bias = malloc(sizeof(float) * (size_t)V);
  r->corrv = malloc(sizeof(float) * (size_t)V), r->ids = malloc(sizeof(int32_t) * (size_t)bs);
  uint8_t *mask = malloc((size_t)bs);
  if (!r->base || !r->bias || !r->corrv || !r->ids || !mask) {
    free(mask);
    return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
  }
  for (int64_t k = 0; k < bs; k++) mask[k] = k >= r->ss;
  df_status st = df_buffer_alloc(ctx, sizeof(float) * (size_t)(bs * V), (void **)&r->dbias, err);
  if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)bs, (void **)&r->dids, err);
  if (st == DF_OK) st = df_buffer_alloc(ctx, (size_t)bs, (void **)&r->dcorr_mask, err);
  if (st == DF_OK) st = df_copy(ctx, r->dcorr_mask, dev, mask, DF_DEV_CPU, (size_t)bs, err);
  free(mask);
  return st;
}

// SpecForge's _sample_draft_tokens at temperature 0: the block's base logits once, then for t = 1 .. bs−1 the GRU
// reads the target embeddings of the block as filled so far ([anchor, proposals so far, MASK ...]; causality keeps the
// unfilled slots out of the slot used) and slot t takes the argmax of the final logits of slot t − 1 (shift_label) or
// t. Slots before suffix_start keep their base logits.
static df_status propose(df_strategy_run *base, const df_propose_in *in, int32_t *props, df_error *err) {
  domino_run *r = (domino_run *)base;
  df_ctx *ctx = r->blk.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const df_draft_config *cfg = r->blk.env.cfg;
  const int64_t bs = cfg->block_size, V = in->lm_head.shape[0], H = in->lm_head.shape[1], E = cfg->dflash.emb_dim;
  const size_t row = sizeof(float) * (size_t)V;
  DF_TRY(propose_buffers(r, bs, V, err));
  df_tensor x = df_view((void *)in->hidden, DF_F32, dev, 2, (const int64_t[]){bs, H});
  df_tensor y = df_view(r->dbias, DF_F32, dev, 2, (const int64_t[]){bs, V});
  DF_TRY(df_linear_forward(ctx, &x, &in->lm_head, NULL, &y, err));
  DF_TRY(df_copy(ctx, r->base, DF_DEV_CPU, r->dbias, dev, row * (size_t)bs, err));
  const df_frozen *fz = &r->blk.env.frozen;
  const df_tensor embed = df_f32_on(dev, fz->embed, fz->vocab, fz->hidden);
  r->ids[0] = in->anchor_token;
  for (int64_t k = 1; k < bs; k++) r->ids[k] = (int32_t)r->blk.env.mask_token_id;
  const bool shift = cfg->dflash.shift_label;
  for (int64_t t = 1; t < bs; t++) {
    const int64_t slot = shift ? t - 1 : t;
    float *z = r->bias;
    memcpy(z, r->base + slot * V, row);
    if (slot >= r->ss) {
      const void *corr = NULL; // fp32: a decoding draft stores fp32
      DF_TRY(df_copy(ctx, r->dids, dev, r->ids, DF_DEV_CPU, sizeof(int32_t) * (size_t)bs, err));
      const df_domino_head_in hin = {.nblocks = 1,
                                     .bs = bs,
                                     .hidden = in->hidden,
                                     .head_ids = r->dids,
                                     .corrected = r->dcorr_mask,
                                     .embed = &embed};
      DF_TRY(df_domino_head_forward(r->head, &hin, &corr, err));
      df_tensor c = df_view((void *)((const float *)corr + slot * E), DF_F32, dev, 2, (const int64_t[]){1, E});
      df_tensor b = df_view(r->dbias, DF_F32, dev, 2, (const int64_t[]){1, V});
      DF_TRY(df_linear_forward(ctx, &c, df_domino_head_w2(r->head), NULL, &b, err));
      DF_TRY(df_copy(ctx, r->corrv, DF_DEV_CPU, r->dbias, dev, row, err));
      for (int64_t v = 0; v < V; v++) z[v] += r->corrv[v];
    }
    r->ids[t] = argmax_row(z, V);
    props[t - 1] = r->ids[t];
  }
  return DF_OK;
}

// ---- export
// ----------------------------------------------------------------------------------------------------------

// SpecForge's export normaliser (scripts/gates/normalize_dflash_export.py): every non-DSpark DFlash-family export is
// named DFlashDraftModel, keeps dflash_config.projector_type ("domino", which makes it a Domino draft again for
// draftforge and selects SGLang's Domino rollout) and loses auto_map.
static df_status export_normalize(json_t *cfg, const char *where, df_error *err) {
  json_t *dc = json_object_get(cfg, "dflash_config");
  if (!json_is_object(dc))
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config", NULL, "%s: a Domino export needs dflash_config", where);
  json_object_set_new(dc, "projector_type", json_string("domino"));
  json_object_set_new(cfg, "architectures", json_pack("[s]", "DFlashDraftModel"));
  json_object_del(cfg, "auto_map");
  return DF_OK;
}

static bool no_confidence_head(const df_draft_config *cfg) { return false; }

const df_strategy df_strategy_domino = {.name = "domino",
                                        .projector = "domino",
                                        .summary = "Domino: DFlash blocks with a GRU logit correction, "
                                                   "(1 - lambda) CE(final) + lambda CE(base)",
                                        .keys = KEYS,
                                        .trains = trains,
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
                                        .serving_class_ffn = "DFlashMoEDraftModel",
                                        .has_confidence_head = no_confidence_head};

// training.lambda_base_start (1.0) and lambda_base_decay_ratio (0.5); training.loss_type must stay dflash (SpecForge
// builds Domino with the DFlash CE whatever the recipe says: a recipe asking for D-PACE is refused, not ignored).
static df_status check_options(const df_strategy_env *env, domino_run *r, df_error *err) {
  const char *lt = df_strategy_text(env->values, "loss_type", "dflash");
  if (strcmp(lt, "dflash"))
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "training.loss_type",
                   "remove training.loss_type (Domino always trains the DFlash CE with its lambda_base mix)",
                   "loss_type '%s' with strategy domino: SpecForge's Domino ignores it, draftforge refuses it", lt);
  r->lambda_start = df_strategy_number(env->values, "lambda_base_start", 1.0);
  r->decay_ratio = df_strategy_number(env->values, "lambda_base_decay_ratio", 0.5);
  if (!isfinite(r->lambda_start) || !isfinite(r->decay_ratio) || r->decay_ratio < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "training.lambda_base_decay_ratio", "use finite values, the ratio >= 0",
                   "lambda_base_start %g, lambda_base_decay_ratio %g", r->lambda_start, r->decay_ratio);
  r->ss = df_domino_suffix_start(env->cfg);
  r->head = df_draft_model_domino_head(env->model);
  if (!r->head) return DF_FAIL(err, DF_ERR_INVALID, env->cfg->source, NULL, "the model has no Domino head");
  return DF_OK;
}

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  domino_run *r = calloc(1, sizeof *r);
  if (!r) return DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  r->blk.env = *env; // run_close reads the context on failure
  df_status st = check_options(env, r, err);
  const df_block_hooks h = {.rows = {.self = r, .build = rows_build, .layout = rows_layout, .release = rows_release},
                            .objective = objective,
                            .self = r};
  if (st == DF_OK)
    st = df_block_open(&r->blk, &df_strategy_domino, env, &h, false, DF_DOMINO_STATS(env->cfg->block_size), err);
  if (st != DF_OK) {
    run_close(&r->blk.base);
    return st;
  }
  *out = &r->blk.base;
  return DF_OK;
}
