// The P-EAGLE strategy's table (strategies/strategy.h; docs/peagle.md): SpecForge's `training.strategy: peagle`,
// parallel drafting. The draft is modeling/peagle_model.h; a micro-step (micro.c) samples each sample's rows with COD
// (cod.c), runs every depth in one pass per layer and takes SpecForge's loss over the sampled rows; the vocabulary
// mapping and the teacher are EAGLE-3's (strategies/eagle3/); speculative decoding drafts a whole block in one
// forward (spec.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/peagle/peagle.h"

// The resume contract's keys (SpecForge's peagle_resume_contract).
static const char *const KEYS[] = {"num_depths", "down_sample_ratio", "down_sample_ratio_min", "norm_before_residual",
                                   NULL};

static bool trains(const df_draft_config *cfg) { return cfg->kind == DF_DRAFT_PEAGLE; }

static void run_close(df_strategy_run *base) {
  peagle_run *r = (peagle_run *)base;
  if (!r) return;
  df_eagle3_run_release(&r->e);
  df_peagle_spec_free(r);
  free(r->last_rows);
  free(r);
}

static bool needs_last_hidden(const df_strategy_run *r) { return true; }
static int64_t stats_len(const df_strategy_run *r) { return DF_PEAGLE_STATS(((const peagle_run *)r)->T); }

static const double *block(const double *st, int64_t i) { return st + E3_STEPS + i * DF_EAGLE3_STEP_STATS; }

static df_status metrics(const df_strategy_run *base, const double *st, double loss_den, df_strategy_metrics *out,
                         df_error *err) {
  (void)loss_den;
  return df_eagle3_metrics_of(st, ((const peagle_run *)base)->T, out, err);
}

// A per-depth array of the depth blocks' slot k.
static json_t *per_depth(const double *st, int64_t T, int k, double div) {
  json_t *a = json_array();
  for (int64_t i = 0; i < T; i++) {
    const double v = block(st, i)[k] / (div > 0 ? div : 1.0);
    json_array_append_new(a, isfinite(v) ? json_real(v) : json_null());
  }
  return a;
}

// SpecForge's P-EAGLE metrics (position_{d}_acc sums), the per-depth losses, and the step dump's sums.
static void report(const df_strategy_run *base, const double *st, double loss_den, df_report_kind kind, json_t *o) {
  const peagle_run *r = (const peagle_run *)base;
  const int64_t T = r->T;
  const char *p = kind == DF_REPORT_EVAL_LINE ? "eval/" : "";
  char key[64];
  snprintf(key, sizeof key, "%sdepth_loss", p);
  json_object_set_new(o, key, per_depth(st, T, DF_EAGLE3_S_KL_LOSS, loss_den));
  if (kind == DF_REPORT_TRAIN || kind == DF_REPORT_EVAL_LINE) return; // per-depth accuracy: per_position_acc
  json_object_set_new(o, "strategy", json_string("peagle"));
  json_object_set_new(o, "num_depths", json_integer(T));
  json_object_set_new(o, "depth_correct", per_depth(st, T, DF_EAGLE3_SUM_CORRECT, 0));
  json_object_set_new(o, "depth_denom", per_depth(st, T, DF_EAGLE3_SUM_MASK, 0));
  const double *all = block(st, T);
  json_object_set_new(o, "position_mask_sum", json_real(all[DF_EAGLE3_SUM_PM]));
  json_object_set_new(o, "kl_sum", json_real(all[DF_EAGLE3_SUM_KL]));
  json_object_set_new(o, "acc_correct", json_real(all[DF_EAGLE3_SUM_CORRECT]));
  json_object_set_new(o, "acc_denom", json_real(all[DF_EAGLE3_SUM_MASK]));
  if (kind != DF_REPORT_STEP) return;
  json_t *rows = json_array(); // the last micro-step's sampled rows per depth
  for (int64_t i = 0; i < T; i++) json_array_append_new(rows, json_integer(r->last_rows[i]));
  json_object_set_new(o, "depth_rows", rows);
}

static void print(const df_strategy_run *base, const double *st, double loss_den, FILE *fp) {
  const peagle_run *r = (const peagle_run *)base;
  if (!(loss_den > 0)) return;
  fprintf(fp, "depth acc");
  for (int64_t i = 0; i < r->T; i++) {
    const double *b = block(st, i);
    fprintf(fp, " %.3f", b[DF_EAGLE3_SUM_MASK] > 0 ? b[DF_EAGLE3_SUM_CORRECT] / b[DF_EAGLE3_SUM_MASK] : 0.0);
  }
}

static int64_t first_position(const df_strategy_run *r) { return 0; } // depth 0 predicts the token after next

// Tokens per round: SGLang's speculative_num_draft_tokens of a parallel drafter; the training depth by default.
static int64_t proposals(const df_strategy_run *r) {
  const int64_t n = (int64_t)df_strategy_number(((const peagle_run *)r)->e.env.values, "num_steps", 0);
  return n > 0 ? n : ((const peagle_run *)r)->T;
}

// What serves a P-EAGLE draft is vLLM's Eagle3LlamaForCausalLM with speculative_config.parallel_drafting: the same
// tensor names (layers.N, mask_hidden, embed_tokens), the mask token from mask_token_id. The export names that class
// and says parallel_drafting (vLLM ignores the key; draftforge reads the export back as a P-EAGLE draft by it).
// SGLang's LlamaForCausalLMEagle3 has no parallel drafting, and that class name would have it load the export wrongly.
static df_status export_normalize(json_t *cfg, const char *where, df_error *err) {
  json_object_set_new(cfg, "architectures", json_pack("[s]", "Eagle3LlamaForCausalLM"));
  json_object_set_new(cfg, "parallel_drafting", json_true());
  json_object_del(cfg, "dflash_config");
  json_object_del(cfg, "block_size");
  return DF_OK;
}

static bool no_confidence_head(const df_draft_config *cfg) { return false; }

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err);

const df_strategy df_strategy_peagle = {.name = "peagle",
                                        .projector = "peagle",
                                        .summary = "P-EAGLE: parallel drafting; every depth of a COD-sampled block in "
                                                   "one pass, KL to the target on a draft vocabulary",
                                        .keys = KEYS,
                                        .trains = trains,
                                        .reads_last_hidden = true,
                                        .open = run_open,
                                        .close = run_close,
                                        .needs_last_hidden = needs_last_hidden,
                                        .stats_len = stats_len,
                                        .micro = df_peagle_micro,
                                        .metrics = metrics,
                                        .report = report,
                                        .print = print,
                                        .first_position = first_position,
                                        .proposals = proposals,
                                        .draft = df_peagle_draft,
                                        .draft_reset = df_peagle_draft_reset,
                                        .prepare = df_eagle3_prepare,
                                        .export_normalize = export_normalize,
                                        .serving_class_ffn = "PEagleDraftModel",
                                        .has_confidence_head = no_confidence_head};

static df_status run_open(const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  peagle_run *r = calloc(1, sizeof *r);
  if (!r) return DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  eagle3_run *e = &r->e;
  e->base.table = &df_strategy_peagle, e->base.ctx = env->ctx;
  e->env = *env;
  r->m = df_draft_model_peagle(env->model);
  const df_draft_config *cfg = env->cfg;
  r->T = (int64_t)df_strategy_number(env->values, "num_depths", 8);
  r->ratio = df_strategy_number(env->values, "down_sample_ratio", 0.8);
  r->ratio_min = df_strategy_number(env->values, "down_sample_ratio_min", 0.2);
  e->T = r->T, e->chunk_rows = 256;
  e->V = cfg->vocab_size, e->D = cfg->eagle3.draft_vocab_size, e->H = cfg->hidden_size;
  e->W = 3 * cfg->eagle3.target_hidden_size;
  r->mask_id = (int32_t)env->mask_token_id, r->base_step = -1;
  r->last_rows = calloc((size_t)(r->T > 0 ? r->T : 1), sizeof *r->last_rows);
  df_status st = r->last_rows ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "strategy", NULL, "out of memory");
  if (st == DF_OK && !r->m)
    st = DF_FAIL(err, DF_ERR_INVALID, "draft", NULL, "the model of a P-EAGLE run is not a P-EAGLE draft");
  if (st == DF_OK && (r->T < 1 || r->T > 1024))
    st = DF_FAIL(err, DF_ERR_INVALID, "training.num_depths", "1 .. 1024 (SpecForge's default is 8)", "num_depths %lld",
                 (long long)r->T);
  if (st == DF_OK && !(r->ratio > 0 && r->ratio <= 1 && r->ratio_min > 0 && r->ratio_min <= r->ratio))
    st = DF_FAIL(err, DF_ERR_INVALID, "training.down_sample_ratio_min",
                 "0 < down_sample_ratio_min <= down_sample_ratio <= 1 (SpecForge's rule)",
                 "down_sample_ratio %g, down_sample_ratio_min %g", r->ratio, r->ratio_min);
  if (st == DF_OK && (env->mask_token_id < 0 || env->mask_token_id >= cfg->vocab_size))
    st = DF_FAIL(err, DF_ERR_INVALID, "model.mask_token_id",
                 "set model.mask_token_id in the recipe (or mask_token_id in the draft config)",
                 "P-EAGLE's depth > 0 rows read a mask token; %lld is not a token of the %lld-token vocabulary",
                 (long long)env->mask_token_id, (long long)cfg->vocab_size);
  if (st == DF_OK && (env->frozen.vocab != e->V || env->frozen.hidden != e->H))
    st = DF_FAIL(err, DF_ERR_INVALID, "vocab_size", "the draft learns from the target's head",
                 "the target pieces are [%lld, %lld], the draft needs [%lld, %lld]", (long long)env->frozen.vocab,
                 (long long)env->frozen.hidden, (long long)e->V, (long long)e->H);
  if (st != DF_OK) {
    run_close(&e->base);
    return st;
  }
  *out = &e->base;
  return DF_OK;
}
