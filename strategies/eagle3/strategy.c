// The EAGLE-3 strategy's table (strategies/strategy.h; docs/eagle3-step.md): SpecForge's default strategy. The draft is
// modeling/eagle3_model.h; a micro-step (micro.c) is the training-time test of training.ttt_length steps, each step's
// loss the forward KL against the target restricted to the draft vocabulary (or an LK loss), summed with weights
// 0.8^i; a fresh run's vocabulary mapping comes from the data (prepare.c); speculative decoding drafts a chain with the
// draft's own KV cache (spec.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/eagle3/eagle3.h"

// The resume contract's keys (SpecForge's eagle3_* provider fields).
static const char *const KEYS[] = {
    "ttt_length", "lk_loss_type", "kl_scale", "kl_decay", "compact_teacher", "compact_teacher_chunk_size", NULL};

static bool trains(const df_draft_config *cfg) { return cfg->kind == DF_DRAFT_EAGLE3; }

// ---- the mapping on the device -----------------------------------------------------------------------------------

df_status df_eagle3_run_vocab_read(eagle3_run *r, int64_t *d2t, uint8_t *t2d, df_error *err) {
  df_draft_model *m = r->env.model;
  return df_eagle_vocab_read(r->env.ctx, df_draft_model_params(m), df_draft_model_weights(m), d2t, t2d, err);
}

df_status df_eagle3_run_vocab_write(eagle3_run *r, const int64_t *d2t, const uint8_t *t2d, df_error *err) {
  df_draft_model *m = r->env.model;
  return df_eagle_vocab_write(r->env.ctx, df_draft_model_params(m), df_draft_model_weights(m), d2t, t2d, err);
}

df_status df_eagle3_sync_vocab(eagle3_run *r, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  int64_t *d2t = malloc(sizeof *d2t * (size_t)r->D);
  uint8_t *t2d = malloc((size_t)r->V);
  int32_t *i32 = malloc(sizeof *i32 * (size_t)r->D), *used = malloc(sizeof *used * (size_t)r->D);
  df_status st = d2t && t2d && i32 && used ? df_eagle3_run_vocab_read(r, d2t, t2d, err)
                                           : DF_FAIL(err, DF_ERR_NOMEM, "t2d", NULL, "out of memory");
  // A measuring context reads back zeros (no mapping to check): the buffers and the gather are what it accounts.
  const bool measuring = df_ctx_measuring(ctx);
  for (int64_t d = 0; st == DF_OK && d < r->D; d++) {
    i32[d] = (int32_t)d2t[d], used[d] = (int32_t)(d + d2t[d]);
    if (measuring) continue;
    if (used[d] < 0 || used[d] >= r->V || !t2d[used[d]] || (d > 0 && used[d] <= used[d - 1]))
      st = DF_FAIL(err, DF_ERR_INVALID, "d2t", "the draft's d2t / t2d must come from one vocabulary mapping",
                   "draft id %lld maps to target id %d, which t2d does not select in ascending order", (long long)d,
                   used[d]);
  }
  // Frozen, as the target's embed_tokens and lm_head are: the mapping and the head's rows of the draft vocabulary.
  if (st == DF_OK && !r->dt2d) st = df_buffer_alloc_as(ctx, DF_MEM_FROZEN, (size_t)r->V, (void **)&r->dt2d, err);
  if (st == DF_OK && !r->dd2t)
    st = df_buffer_alloc_as(ctx, DF_MEM_FROZEN, sizeof(int32_t) * (size_t)r->D, (void **)&r->dd2t, err);
  if (st == DF_OK && !r->head_d)
    st = df_buffer_alloc_as(ctx, DF_MEM_FROZEN, df_dtype_size(r->env.frozen.dtype) * (size_t)(r->D * r->H),
                            (void **)&r->head_d, err); // in the frozen pieces' dtype (bf16 in mixed precision)
  if (st == DF_OK) st = df_copy(ctx, r->dt2d, dev, t2d, DF_DEV_CPU, (size_t)r->V, err);
  if (st == DF_OK) st = df_copy(ctx, r->dd2t, dev, i32, DF_DEV_CPU, sizeof(int32_t) * (size_t)r->D, err);
  if (st == DF_OK) { // the target head's rows of the draft vocabulary: the compact teacher's GEMM
    df_tensor idx = df_view(r->dd2t, DF_I32, dev, 1, (const int64_t[]){r->D});
    st = df_copy(ctx, r->dd2t, dev, used, DF_DEV_CPU, sizeof(int32_t) * (size_t)r->D, err);
    const df_dtype fdt = r->env.frozen.dtype;
    df_tensor head = df_view((void *)r->env.frozen.lm_head, fdt, dev, 2, (const int64_t[]){r->V, r->H});
    df_tensor out = df_view(r->head_d, fdt, dev, 2, (const int64_t[]){r->D, r->H});
    if (st == DF_OK) st = df_gather_rows(ctx, &head, &idx, &out, err);
    if (st == DF_OK) st = df_copy(ctx, r->dd2t, dev, i32, DF_DEV_CPU, sizeof(int32_t) * (size_t)r->D, err);
  }
  r->have_vocab = st == DF_OK;
  free(d2t), free(t2d), free(i32), free(used);
  return st;
}

// ---- the table -------------------------------------------------------------------------------------------------

static df_status parse_lk(const df_strategy_env *e, df_lk_loss *out, df_error *err) {
  const char *t = df_strategy_text(e->values, "lk_loss_type", NULL);
  *out = DF_LK_NONE;
  if (!t || !t[0]) return DF_OK;
  if (!strcmp(t, "alpha"))
    *out = DF_LK_ALPHA;
  else if (!strcmp(t, "lambda"))
    *out = DF_LK_LAMBDA;
  else
    return DF_FAIL(err, DF_ERR_INVALID, "training.lk_loss_type", "use alpha, lambda or null",
                   "unknown lk_loss_type '%s'", t);
  return DF_OK;
}

void df_eagle3_run_release(eagle3_run *r) {
  df_ctx *ctx = r->env.ctx;
  if (r->dev && r->dev != r->host) df_buffer_free(ctx, r->dev);
  if (r->host) df_host_free(ctx, r->host);
  if (r->scratch) df_buffer_free(ctx, r->scratch);
  if (r->dt2d) df_buffer_free(ctx, r->dt2d);
  if (r->dd2t) df_buffer_free(ctx, r->dd2t);
  if (r->head_d) df_buffer_free(ctx, r->head_d);
  df_eagle3_spec_free(r);
}

static void run_close(df_strategy_run *base) {
  eagle3_run *r = (eagle3_run *)base;
  if (!r) return;
  df_eagle3_run_release(r);
  free(r);
}

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err);

static bool needs_last_hidden(const df_strategy_run *r) { return true; }
static int64_t stats_len(const df_strategy_run *r) { return DF_EAGLE3_STATS(((const eagle3_run *)r)->T); }

static const double *step_block(const double *st, int64_t i) { return st + E3_STEPS + i * DF_EAGLE3_STEP_STATS; }

df_status df_eagle3_metrics_of(const double *st, int64_t T, df_strategy_metrics *out, df_error *err) {
  *out = (df_strategy_metrics){.loss_num = st[E3_LOSS_NUM],
                               .acc_num = st[E3_ACC_NUM],
                               .acc_den = st[E3_ACC_DEN],
                               .accept_sum = st[E3_ACCEPT_SUM],
                               .num_blocks = (int64_t)st[E3_BLOCKS],
                               .positions = T,
                               .pos_num = malloc(sizeof(double) * (size_t)T),
                               .pos_den = malloc(sizeof(double) * (size_t)T)};
  if (!out->pos_num || !out->pos_den) {
    df_strategy_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  for (int64_t i = 0; i < T; i++) {
    out->pos_num[i] = step_block(st, i)[DF_EAGLE3_SUM_CORRECT];
    out->pos_den[i] = step_block(st, i)[DF_EAGLE3_SUM_MASK];
  }
  return DF_OK;
}

static df_status metrics(const df_strategy_run *base, const double *st, double loss_den, df_strategy_metrics *out,
                         df_error *err) {
  (void)loss_den;
  return df_eagle3_metrics_of(st, ((const eagle3_run *)base)->T, out, err);
}

// A per-step array of the step blocks' slot k, divided by div (the micro-batches' count) or by a denominator slot.
static json_t *per_step(const double *st, int64_t T, int k, double div, int den_slot, double den_floor) {
  json_t *a = json_array();
  for (int64_t i = 0; i < T; i++) {
    const double *b = step_block(st, i);
    double d = den_slot >= 0 ? fmax(b[den_slot], den_floor) : div;
    json_array_append_new(a, d > 0 && isfinite(b[k] / d) ? json_real(b[k] / d) : json_null());
  }
  return a;
}

// SpecForge's per-step metrics (plosses, acces, acceptance_rates; the step dump adds the sums behind them).
static void report(const df_strategy_run *base, const double *st, double loss_den, df_report_kind kind, json_t *o) {
  const eagle3_run *r = (const eagle3_run *)base;
  const int64_t T = r->T;
  const bool line = kind == DF_REPORT_EVAL_LINE;
  const char *p = line ? "eval/" : "";
  char key[64];
#define KEY(name) (snprintf(key, sizeof key, "%s%s", p, name), key)
  json_object_set_new(o, KEY("step_loss"), per_step(st, T, DF_EAGLE3_S_LOSS, loss_den, -1, 0));
  json_object_set_new(o, KEY("acceptance_rate"), per_step(st, T, DF_EAGLE3_S_ACCEPT_RATE, loss_den, -1, 0));
#undef KEY
  if (kind == DF_REPORT_TRAIN || line) return; // per-step accuracy: the shared per_position_acc
  if (kind == DF_REPORT_STEP)                  // SpecForge's acces (the shared "acc" is the pooled one elsewhere)
    json_object_set_new(o, "acc", per_step(st, T, DF_EAGLE3_SUM_CORRECT, 0, DF_EAGLE3_SUM_MASK, 1e-6));
  json_object_set_new(o, "strategy", json_string("eagle3"));
  json_object_set_new(o, "ttt_length", json_integer(T));
  json_object_set_new(o, "kl_loss", per_step(st, T, DF_EAGLE3_S_KL_LOSS, loss_den, -1, 0));
  json_object_set_new(o, "log_acceptance_rate", per_step(st, T, DF_EAGLE3_S_LOG_ACCEPT, loss_den, -1, 0));
  json_t *correct = json_array(), *denom = json_array(), *pm = json_array();
  for (int64_t i = 0; i < T; i++) {
    const double *b = step_block(st, i);
    json_array_append_new(correct, json_real(b[DF_EAGLE3_SUM_CORRECT]));
    json_array_append_new(denom, json_real(fmax(b[DF_EAGLE3_SUM_MASK], 1e-6)));
    json_array_append_new(pm, json_real(b[DF_EAGLE3_SUM_PM]));
  }
  json_object_set_new(o, "acc_correct", correct);
  json_object_set_new(o, "acc_denom", denom);
  json_object_set_new(o, "position_mask_sum", pm);
}

static void print(const df_strategy_run *base, const double *st, double loss_den, FILE *fp) {
  const eagle3_run *r = (const eagle3_run *)base;
  if (!(loss_den > 0)) return;
  fprintf(fp, "ttt acceptance");
  for (int64_t i = 0; i < r->T; i++) fprintf(fp, " %.3f", step_block(st, i)[DF_EAGLE3_S_ACCEPT_RATE] / loss_den);
  fprintf(fp, "   kl step0 %.4f", step_block(st, 0)[DF_EAGLE3_S_KL_LOSS] / loss_den);
}

static int64_t first_position(const df_strategy_run *r) { return 0; } // step 0 predicts the token after next

static int64_t proposals(const df_strategy_run *r) {
  const int64_t n = (int64_t)df_strategy_number(((const eagle3_run *)r)->env.values, "num_steps", 0);
  return n > 0 ? n : ((const eagle3_run *)r)->T; // SGLang's speculative_num_steps; the training depth by default
}

// SGLang serves LlamaForCausalLMEagle3 (vLLM maps the name to Eagle3LlamaForCausalLM): the resolved config is the
// serving config already (modeling/draft_config_serving.c); nothing of the block drafts' dflash_config stays.
static df_status export_normalize(json_t *cfg, const char *where, df_error *err) {
  json_object_set_new(cfg, "architectures", json_pack("[s]", "LlamaForCausalLMEagle3"));
  json_object_del(cfg, "dflash_config");
  json_object_del(cfg, "block_size");
  return DF_OK;
}

static bool no_confidence_head(const df_draft_config *cfg) { return false; }

const df_strategy df_strategy_eagle3 = {.name = "eagle3",
                                        .projector = "eagle3",
                                        .summary = "EAGLE-3: a training-time test of ttt_length steps over the draft's "
                                                   "own outputs, KL to the target on a draft vocabulary (or LK losses)",
                                        .keys = KEYS,
                                        .trains = trains,
                                        .reads_last_hidden = true,
                                        .open = run_open,
                                        .close = run_close,
                                        .needs_last_hidden = needs_last_hidden,
                                        .stats_len = stats_len,
                                        .micro = df_eagle3_micro,
                                        .metrics = metrics,
                                        .report = report,
                                        .print = print,
                                        .first_position = first_position,
                                        .proposals = proposals,
                                        .draft = df_eagle3_draft,
                                        .draft_reset = df_eagle3_draft_reset,
                                        .prepare = df_eagle3_prepare,
                                        .export_normalize = export_normalize,
                                        .serving_class_ffn = "LlamaForCausalLMEagle3",
                                        .has_confidence_head = no_confidence_head};

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  eagle3_run *r = calloc(1, sizeof *r);
  if (!r) return DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  r->base.table = &df_strategy_eagle3, r->base.ctx = env->ctx;
  r->env = *env;
  r->m = df_draft_model_eagle3(env->model);
  const df_draft_config *cfg = env->cfg;
  r->T = (int64_t)df_strategy_number(env->values, "ttt_length", 7);
  r->kl_scale = df_strategy_number(env->values, "kl_scale", 1.0);
  r->kl_decay = df_strategy_number(env->values, "kl_decay", 1.0);
  r->chunk_rows = 256;
  r->V = cfg->vocab_size, r->D = cfg->eagle3.draft_vocab_size, r->H = cfg->hidden_size;
  r->W = 3 * cfg->eagle3.target_hidden_size;
  df_status st = parse_lk(env, &r->lk, err);
  if (st == DF_OK && !r->m)
    st = DF_FAIL(err, DF_ERR_INVALID, "draft", NULL, "the model of an EAGLE-3 run is not an EAGLE-3 draft");
  if (st == DF_OK && (r->T < 1 || r->T > 1024))
    st = DF_FAIL(err, DF_ERR_INVALID, "training.ttt_length", "1 .. 1024 (SpecForge's default is 7)", "ttt_length %lld",
                 (long long)r->T);
  if (st == DF_OK && (env->frozen.vocab != r->V || env->frozen.hidden != r->H))
    st = DF_FAIL(err, DF_ERR_INVALID, "vocab_size", "the draft embeds with the target's table and learns from its head",
                 "the target pieces are [%lld, %lld], the draft needs [%lld, %lld]", (long long)env->frozen.vocab,
                 (long long)env->frozen.hidden, (long long)r->V, (long long)r->H);
  if (st != DF_OK) {
    run_close(&r->base);
    return st;
  }
  *out = &r->base;
  return DF_OK;
}
