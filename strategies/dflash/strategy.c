// The DFlash strategy's table (strategies/strategy.h): DFlash's block rows (labels of the slots after the anchor,
// decay weights), its objective (CE, or D-PACE's acceptance-aware weights, training.loss_type), its metrics, and
// greedy proposals of slots 1 .. bs−1 for speculative decoding.
#include <stdlib.h>
#include <string.h>

#include "strategies/dflash/family.h"

typedef struct {
  df_block_run blk;
  df_dflash_loss_options loss;
  df_dflash_blocks built;
  df_dflash_rows rows; // device views of the staged rows
  df_dflash_work work;
  float *logits, *dlogits; // speculative decoding: (bs − 1, V) host and device
} dflash_run;

static const char *const KEYS[] = {"loss_type", "dpace_alpha", NULL};

static bool trains(const df_draft_config *cfg) { return cfg->kind == DF_DRAFT_DFLASH; }

// ---- rows ----------------------------------------------------------------------------------------------------------

static df_status rows_build(void *self, const df_batch *bt, const df_dflash_anchors *a, int64_t bs, int64_t vocab,
                            double *loss_den, df_error *err) {
  dflash_run *r = self;
  const df_strategy_env *e = &r->blk.env;
  DF_TRY(df_dflash_build_blocks(bt->input_ids, bt->loss_mask, bt->S, a, bs, e->mask_token_id, e->loss_decay_gamma,
                                &r->built, err));
  const int64_t per = a->N * bs;
  *loss_den = df_dflash_loss_den(&r->loss, &r->built);
  return df_stage_check_ids("labels", r->built.labels, a->B * per, per, vocab, err);
}

static void rows_layout(void *self, df_stage_pass pass, df_carver *up, df_carver *scratch, const df_stage_dims *d,
                        df_device dev, const df_tensor *keep) {
  dflash_run *r = self;
  const int64_t R = d->R;
  int32_t *labels = df_carve(up, R * 4);
  float *weights = df_carve(up, R * 4), *binary_f = df_carve(up, R * 4);
  uint8_t *binary = df_carve(up, R);
  if (pass == DF_STAGE_FILL) {
    memcpy(labels, r->built.labels, sizeof(int32_t) * (size_t)R);
    memcpy(weights, r->built.weights, sizeof(float) * (size_t)R);
    memcpy(binary, r->built.binary, (size_t)R);
    for (int64_t i = 0; i < R; i++) binary_f[i] = r->built.binary[i];
    return;
  }
  float *ce = df_carve(scratch, R * 4), *dpace = df_carve(scratch, R * 4), *row_w = df_carve(scratch, R * 4);
  uint8_t *correct = df_carve(scratch, R);
  if (pass != DF_STAGE_BIND) return;
  r->rows = (df_dflash_rows){.B = d->B,
                             .N = d->N,
                             .bs = d->bs,
                             .labels = df_i32_on(dev, labels, R),
                             .weights = df_f32_on(dev, weights, R),
                             .binary = df_u8_on(dev, binary, R),
                             .binary_f = df_f32_on(dev, binary_f, R),
                             .keep = *keep};
  r->work = (df_dflash_work){.ce = df_f32_on(dev, ce, R),
                             .correct = df_u8_on(dev, correct, R),
                             .dpace = df_f32_on(dev, dpace, R),
                             .row_w = df_f32_on(dev, row_w, R)};
}

static void rows_release(void *self) { df_dflash_blocks_free(&((dflash_run *)self)->built); }

// d(loss_num / loss_den), rescaled for the trainer: d(grad_scale·num) = grad_scale·den · d(num/den).
static df_status objective(void *self, df_block_run *b, const df_staged *st, const df_tensor *hidden, double grad_scale,
                           df_tensor *dhidden, df_tensor *stats, df_error *err) {
  dflash_run *r = self;
  r->rows.loss_den = st->loss_den;
  const df_tensor head = df_block_head(b);
  DF_TRY(df_dflash_objective_rows(b->env.ctx, &r->loss, hidden, &head, &r->rows, &r->work, dhidden, stats, err));
  if (!dhidden || !(grad_scale > 0)) return DF_OK;
  return df_scale(b->env.ctx, dhidden, (float)(grad_scale * st->loss_den), err);
}

// ---- the table -----------------------------------------------------------------------------------------------------

// training.loss_type and dpace_alpha; an eval run scores the plain CE whatever the training loss.
static df_status loss_options(const df_strategy_env *e, df_dflash_loss_options *o, df_error *err) {
  const char *t = df_strategy_text(e->values, "loss_type", "dflash");
  if (!df_dflash_loss_type_parse(t, &o->type))
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_type",
                   "use dflash, dpace, dpace-cumulative-confidence-only "
                   "or dpace-continuation-value-only",
                   "unknown loss_type '%s'", t);
  o->dpace_alpha = df_strategy_number(e->values, "dpace_alpha", 0.5);
  o->chunk_blocks = e->chunk_blocks;
  if (e->eval) o->type = DF_LOSS_DFLASH;
  return DF_OK;
}

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err);

static void run_close(df_strategy_run *base) {
  dflash_run *r = (dflash_run *)base;
  if (!r) return;
  df_block_close(&r->blk);
  if (r->dlogits) df_buffer_free(r->blk.env.ctx, r->dlogits);
  free(r->logits);
  free(r);
}

static bool needs_last_hidden(const df_strategy_run *r) { return false; }
static int64_t stats_len(const df_strategy_run *r) {
  return DF_BLOCK_STATS(((const dflash_run *)r)->blk.env.cfg->block_size);
}

static df_status micro(df_strategy_run *r, const df_micro_args *a, df_micro_info *info, df_error *err) {
  return df_block_micro(&((dflash_run *)r)->blk, a, info, err);
}

static df_status metrics(const df_strategy_run *base, const double *st, double loss_den, df_strategy_metrics *out,
                         df_error *err) {
  const int64_t bs = ((const dflash_run *)base)->blk.env.cfg->block_size;
  *out = (df_strategy_metrics){.loss_num = st[DF_BSTAT_LOSS_NUM],
                               .acc_num = st[DF_BSTAT_ACC_NUM],
                               .acc_den = st[DF_BSTAT_ACC_DEN],
                               .accept_sum = st[DF_BSTAT_ACCEPT_SUM],
                               .num_blocks = (int64_t)st[DF_BSTAT_BLOCKS],
                               .positions = bs,
                               .pos_num = malloc(sizeof(double) * (size_t)bs),
                               .pos_den = malloc(sizeof(double) * (size_t)bs)};
  if (!out->pos_num || !out->pos_den) {
    df_strategy_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  memcpy(out->pos_num, st + DF_BSTAT_POS, sizeof(double) * (size_t)bs);
  memcpy(out->pos_den, st + DF_BSTAT_POS + bs, sizeof(double) * (size_t)bs);
  (void)loss_den;
  return DF_OK;
}

static void report(const df_strategy_run *r, const double *st, double loss_den, df_report_kind kind, json_t *o) {}
static void print(const df_strategy_run *r, const double *st, double loss_den, FILE *fp) {}
static int64_t first_position(const df_strategy_run *r) { return 1; } // slot 0 is the anchor token

// ---- speculative decoding ------------------------------------------------------------------------------------------

static int64_t proposals(const df_strategy_run *r) { return ((const dflash_run *)r)->blk.env.cfg->block_size - 1; }

// Slots 1 .. bs−1: the argmax of the LM head on each (slot 0 holds the anchor token).
static df_status propose(df_strategy_run *base, const df_propose_in *in, int32_t *props, df_error *err) {
  dflash_run *r = (dflash_run *)base;
  df_ctx *ctx = r->blk.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t n = r->blk.env.cfg->block_size - 1, V = in->lm_head.shape[0], H = in->lm_head.shape[1];
  if (!r->logits) {
    if (!(r->logits = malloc(sizeof(float) * (size_t)(n * V))))
      return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
    DF_TRY(df_buffer_alloc(ctx, sizeof(float) * (size_t)(n * V), (void **)&r->dlogits, err));
  }
  df_tensor x = df_view((void *)(in->hidden + H), DF_F32, dev, 2, (const int64_t[]){n, H});
  df_tensor y = df_view(r->dlogits, DF_F32, dev, 2, (const int64_t[]){n, V});
  DF_TRY(df_linear_forward(ctx, &x, &in->lm_head, NULL, &y, err));
  DF_TRY(df_copy(ctx, r->logits, DF_DEV_CPU, r->dlogits, dev, sizeof(float) * (size_t)(n * V), err));
  for (int64_t k = 0; k < n; k++) props[k] = df_block_argmax(r->logits + k * V, V);
  return DF_OK;
}

// ---- export
// ----------------------------------------------------------------------------------------------------------

static df_status export_normalize(json_t *cfg, const char *where, df_error *err) {
  json_object_set_new(cfg, "architectures", json_pack("[s]", "DFlashDraftModel"));
  return DF_OK;
}

static bool no_confidence_head(const df_draft_config *cfg) { return false; }

const df_strategy df_strategy_dflash = {.name = "dflash",
                                        .projector = "dflash",
                                        .summary = "DFlash: blocks of MASK slots after sampled anchors, CE or D-PACE",
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

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  dflash_run *r = calloc(1, sizeof *r);
  if (!r) return DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  df_status st = loss_options(env, &r->loss, err);
  const df_block_hooks h = {.rows = {.self = r, .build = rows_build, .layout = rows_layout, .release = rows_release},
                            .objective = objective,
                            .self = r};
  if (st == DF_OK)
    st = df_block_open(&r->blk, &df_strategy_dflash, env, &h, false, DF_BLOCK_STATS(env->cfg->block_size), err);
  if (st != DF_OK) {
    run_close(&r->blk.base);
    return st;
  }
  *out = &r->blk.base;
  return DF_OK;
}
