// One micro-step from a recipe through the draft's strategy (docs/dflash-step.md): resources are loaded in the order
// the contract reads them (recipe, configs, target pieces, model, batch), the step runs, and the dump is written.
#include "train/step/step.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "modeling/strict_load.h"
#include "train/data/batch_source.h"
#include "train/data/hs.h"
#include "train/recipe/device.h"
#include "train/recipe/recipe.h"
#include "train/step/resources.h"

// ---- the micro-step ------------------------------------------------------------------------------------------

df_step_settings df_step_settings_of(const df_recipe *rc, int64_t mask_token_id, const df_strategy_values *values) {
  return (df_step_settings){.num_anchors = rc->training.num_anchors,
                            .loss_decay_gamma = rc->training.loss_decay_gamma,
                            .mask_token_id = mask_token_id,
                            .chunk_blocks = rc->training.objective_chunk_blocks,
                            .values = values};
}

df_status df_step_open(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                       const df_step_settings *set, bool eval, df_strategy_run **out, df_error *err) {
  const df_strategy *s = df_strategy_of(cfg);
  if (!s)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, cfg->source, NULL, "no strategy trains this draft (%s)",
                   df_draft_kind_name(cfg->kind));
  const df_strategy_env env = {.ctx = ctx,
                               .model = m,
                               .cfg = cfg,
                               .frozen = *frozen,
                               .mask_token_id = set->mask_token_id,
                               .num_anchors = set->num_anchors,
                               .loss_decay_gamma = set->loss_decay_gamma,
                               .chunk_blocks = set->chunk_blocks,
                               .values = set->values,
                               .eval = eval};
  return df_strategy_open(s, &env, out, err);
}

void df_step_result_free(df_step_result *r) {
  if (!r) return;
  df_strategy_metrics_free(&r->metrics);
  json_decref(r->report);
  r->report = NULL;
}

// The sums read back, the shared metrics and the strategy's report.
static df_status read_back(df_strategy_run *run, df_ctx *ctx, const df_tensor *stats, const df_micro_info *info,
                           df_step_result *out, df_error *err) {
  const df_strategy *t = run->table;
  const int64_t ns = df_numel(stats);
  double *host = malloc(sizeof(double) * (size_t)ns);
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  df_status rc = df_copy(ctx, host, DF_DEV_CPU, stats->data, df_ctx_device(ctx), sizeof(double) * (size_t)ns, err);
  if (rc == DF_OK) rc = t->metrics(run, host, info->loss_den, &out->metrics, err);
  if (rc == DF_OK && !(out->report = json_object())) rc = DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  if (rc == DF_OK) t->report(run, host, info->loss_den, DF_REPORT_STEP, out->report);
  free(host);
  return rc;
}

// The micro-step at a schedule position (optimizer steps taken, horizon; a step-dependent objective reads them).
static df_status micro_at(df_strategy_run *run, const df_batch *batch, df_dflash_sampler *sampler, double grad_scale,
                          bool accumulate, int64_t step, int64_t horizon, df_step_result *out, df_error *err) {
  memset(out, 0, sizeof *out);
  df_ctx *ctx = run->ctx;
  const int64_t ns = run->table->stats_len(run);
  void *buf = NULL;
  DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_STATS, sizeof(double) * (size_t)ns, &buf, err));
  df_tensor stats = df_f64_on(df_ctx_device(ctx), buf, ns);
  const df_micro_args a = {.batch = batch,
                           .anchor_rng = &sampler->rng,
                           .world = 1,
                           .grad_scale = grad_scale,
                           .accumulate = accumulate,
                           .stats = &stats,
                           .step = step,
                           .horizon = horizon};
  df_micro_info info;
  df_status st = df_fill(ctx, &stats, 0.0, err);
  if (st == DF_OK) st = run->table->micro(run, &a, &info, err);
  if (st == DF_OK) st = read_back(run, ctx, &stats, &info, out, err);
  df_buffer_free(ctx, buf);
  if (st != DF_OK) {
    df_step_result_free(out);
    return st;
  }
  const df_strategy_metrics *m = &out->metrics;
  out->aux_loss = info.ffn_loss;
  out->loss_den = info.loss_den;
  out->loss_num = m->loss_num + info.ffn_loss * info.loss_den;
  out->loss = out->loss_den > 0 ? out->loss_num / out->loss_den : 0.0;
  out->acc_num = m->acc_num, out->acc_den = m->acc_den;
  out->num_blocks = info.num_blocks;
  out->B = batch->B, out->S = batch->S, out->N = info.N, out->bs = m->positions;
  out->mean_accept_len = info.num_blocks > 0 ? m->accept_sum / (double)info.num_blocks : 0.0;
  return DF_OK;
}

df_status df_step_micro_scaled(df_strategy_run *run, const df_batch *batch, df_dflash_sampler *sampler,
                               double grad_scale, bool accumulate, df_step_result *out, df_error *err) {
  return micro_at(run, batch, sampler, grad_scale, accumulate, 0, 0, out, err);
}

df_status df_step_micro(df_strategy_run *run, const df_batch *batch, df_dflash_sampler *sampler, df_step_result *out,
                        df_error *err) {
  return df_step_micro_scaled(run, batch, sampler, 0.0, false, out, err);
}

// ---- loading ---------------------------------------------------------------------------------------------------

// Everything df_step_run owns, released in reverse order by run_free.
typedef struct {
  const df_recipe *recipe;
  df_run_resources res; // configs, frozen pieces (scaled head), mask token (train/step/resources.h)
  df_ctx *ctx;
  df_draft_model *model;
  df_batch batch;
} step_run;

static void run_free(step_run *r) {
  df_batch_free(&r->batch);
  df_draft_model_free(r->model);
  df_run_resources_free(&r->res); // before the context: the frozen pieces may live on its device
  df_ctx_destroy(r->ctx);
  df_recipe_free(r->recipe);
}

static df_status load_model(step_run *r, int threads, const df_device_choice *device, df_error *err) {
  DF_TRY(df_device_open(device ? *device : r->recipe->training.device, df_device_cpu_only_reason(r->res.draft), threads,
                        stderr, &r->ctx, err));
  const char *why = NULL;
  const df_dtype storage = df_run_storage(r->recipe, r->ctx, &why);
  if (storage != DF_F32) fprintf(stderr, "precision bf16 (%s)\n", why);
  DF_TRY(df_run_resources_place_as(&r->res, r->ctx, storage, err));
  DF_TRY(df_draft_model_create_as(r->res.draft, r->ctx, storage, &r->model, err));
  const df_recipe *rc = r->recipe;
  if (!rc->model.draft_checkpoint_path) {
    DF_TRY(df_draft_model_init(r->model, rc->training.seed, err));
    if (!rc->model.load_target_embedding) return DF_OK;
    const df_target_pieces *tp = &r->res.pieces;
    return df_draft_model_init_from_target(r->model, tp->embed, tp->vocab, tp->hidden, err);
  }
  // A warm start: the FFN kind's buffers (MoE centering) may be absent; they keep the init values.
  const df_ffn_set fs = df_draft_model_ffn_set(r->model);
  if (df_ffn_set_active(&fs)) DF_TRY(df_draft_model_init(r->model, rc->training.seed, err));
  return df_draft_model_load_ex(r->model, rc->model.draft_checkpoint_path, true, err);
}

// The strategy's reading of the data before the step, as a fresh training run does it (EAGLE-3's mapping).
static df_status prepare_strategy(const step_run *r, df_strategy_run *run, df_error *err) {
  if (!run->table->prepare) return DF_OK;
  df_batch_source *src = NULL;
  DF_TRY(df_hs_source_open(r->recipe->data.hidden_states_path, NULL, false, &src, err));
  df_status st = df_batch_source_prepare_strategy(src, r->recipe->data.max_length, run,
                                                  r->recipe->model.vocab_mapping_path, false, NULL, err);
  df_batch_source_close(src);
  return st;
}

// Recipe; configs, strategy check, frozen pieces and mask token (df_run_resources_load, as the trainer); model;
// the first batch.
static df_status load_all(step_run *r, const char *recipe, const char *const *sets, int n_sets, int threads,
                          const df_device_choice *device, df_error *err) {
  df_recipe_options ro = {.log = stderr, .overrides = sets, .n_overrides = n_sets};
  DF_TRY(df_recipe_load(recipe, &ro, &r->recipe, err));
  const df_recipe *rc = r->recipe;
  if (!rc->data.hidden_states_path)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "data.train_data_path",
                   "capture the data (draftforge capture) and set data.hidden_states_path for the step dump",
                   "draftforge step reads one batch of captured hidden states; this recipe trains online");
  DF_TRY(df_run_resources_load(rc, &r->res, err));
  DF_TRY(load_model(r, threads, device, err));
  return df_batch_first(rc->data.hidden_states_path, rc->training.seed, rc->training.batch_size, rc->data.max_length,
                        r->res.draft, &r->batch, err);
}

// ---- outputs ---------------------------------------------------------------------------------------------------

static json_t *per_position_json(const df_strategy_metrics *m) {
  json_t *arr = json_array();
  for (int64_t k = 0; k < m->positions; k++)
    json_array_append_new(arr, m->pos_den[k] > 0 ? json_real(m->pos_num[k] / m->pos_den[k]) : json_null());
  return arr;
}

static json_t *result_json(const df_step_result *r) {
  json_t *o = json_object();
  json_object_set_new(o, "loss_num", json_real(r->loss_num));
  json_object_set_new(o, "loss_den", json_real(r->loss_den));
  json_object_set_new(o, "loss", json_real(r->loss));
  json_object_set_new(o, "acc_num", json_real(r->acc_num));
  json_object_set_new(o, "acc_den", json_real(r->acc_den));
  json_object_set_new(o, "num_blocks", json_integer(r->num_blocks));
  json_object_set_new(o, "B", json_integer(r->B));
  json_object_set_new(o, "S", json_integer(r->S));
  json_object_set_new(o, "N", json_integer(r->N));
  json_object_set_new(o, "block_size", json_integer(r->bs));
  json_object_set_new(o, "mean_accept_len", json_real(r->mean_accept_len));
  // MoE drafts: the summed, coefficient-scaled router aux loss; loss = loss_num / loss_den = CE ratio + aux_loss
  // (loss_num includes aux_loss·loss_den). 0 for dense drafts.
  json_object_set_new(o, "aux_loss", json_real(r->aux_loss));
  json_object_set_new(o, "per_position_acc", per_position_json(&r->metrics));
  if (r->report) json_object_update(o, r->report);
  return o;
}

df_status df_step_write_json(const df_step_result *r, const char *dir, df_error *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/step.json", dir);
  json_t *o = result_json(r);
  df_status st = df_write_json_atomic(path, o, JSON_INDENT(2), "check the --dump directory", err);
  json_decref(o);
  return st;
}

static df_status write_dump(const step_run *run, const df_step_result *r, const char *dir, df_error *err) {
  DF_TRY(df_mkdirs(dir, "check the --dump directory", err));
  char path[4096];
  snprintf(path, sizeof path, "%s/grads.safetensors", dir);
  // Every trainable parameter (no buffers), FFN-kind tensors named by the config's checkpoint layout. Gradients on a
  // device are read through a host copy: the file writer reads host memory only.
  const float *grads = df_draft_model_grads(run->model);
  float *host = NULL;
  if (!df_ctx_host_addressable(run->ctx)) {
    const size_t bytes = sizeof(float) * (size_t)df_params_numel(df_draft_model_params(run->model));
    host = malloc(bytes ? bytes : 1);
    if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "grads", NULL, "cannot stage %zu bytes of gradients", bytes);
    df_status st = df_copy(run->ctx, host, DF_DEV_CPU, grads, df_ctx_device(run->ctx), bytes, err);
    if (st != DF_OK) return free(host), st;
    grads = host;
  }
  df_save_options so = {.dtype = DF_ST_F32, .trainable_only = true};
  const df_ffn_set fs = df_draft_model_ffn_set(run->model);
  const df_params *p = df_draft_model_params(run->model);
  df_status st = df_ffn_set_save(&fs, p, grads, path, &so, err);
  free(host);
  DF_TRY(st);
  bool ints = false; // integer buffers (EAGLE-3's d2t / t2d): the mapping the step used, as vocab.safetensors
  for (int i = 0; i < df_params_count(p); i++)
    ints = ints || (df_params_at(p, i)->role == DF_ROLE_BUFFER && df_params_at(p, i)->dtype != DF_F32);
  if (ints) {
    snprintf(path, sizeof path, "%s/vocab.safetensors", dir);
    const int64_t n = df_params_numel(p);
    float *w = malloc(sizeof(float) * (size_t)n);
    if (!w) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
    const df_save_options vo = {.dtype = DF_ST_F32, .integer_only = true};
    st = df_copy(run->ctx, w, DF_DEV_CPU, df_draft_model_weights(run->model), df_ctx_device(run->ctx),
                 sizeof(float) * (size_t)n, err);
    if (st == DF_OK) st = df_params_save(p, w, path, &vo, err);
    free(w);
    DF_TRY(st);
  }
  return df_step_write_json(r, dir, err);
}

// ---- the schedule ---------------------------------------------------------------------------------------------

// The run's step horizon as the trainer resolves it for one process (train/trainer/lr_schedule.h): total_steps, else
// max_steps, else (samples / batch_size) · num_epochs / accumulation_steps of the recipe's data; 0 when the data gives
// no optimizer step (no horizon: Domino's lambda_base is then 0, SpecForge's rule).
static df_status schedule_horizon(const df_recipe *rc, int64_t *out, df_error *err) {
  const int64_t tot = rc->training.total_steps, max = rc->training.max_steps;
  *out = tot > 0 ? tot : max;
  if (*out > 0) return DF_OK;
  df_hs_dataset *ds = NULL;
  DF_TRY(df_hs_open(rc->data.hidden_states_path, &ds, err));
  const int64_t n = df_hs_get_info(ds)->num_samples;
  df_hs_close(ds);
  const int64_t bs = rc->training.batch_size, acc = rc->training.accumulation_steps;
  *out = bs > 0 && acc > 0 ? n / bs * rc->training.num_epochs / acc : 0;
  return DF_OK;
}

// ---- entry point -----------------------------------------------------------------------------------------------

df_status df_step_run(const char *recipe, const char *dump_dir, int threads, const df_device_choice *device,
                      df_step_result *out, df_error *err) {
  return df_step_run_ex(recipe, NULL, 0, dump_dir, threads, device, out, err);
}

df_status df_step_run_ex(const char *recipe, const char *const *sets, int n_sets, const char *dump_dir, int threads,
                         const df_device_choice *device, df_step_result *out, df_error *err) {
  memset(out, 0, sizeof *out);
  step_run r = {0};
  df_status st = load_all(&r, recipe, sets, n_sets, threads, device, err);
  df_strategy_run *run = NULL;
  const df_strategy_values values = r.recipe ? df_recipe_strategy_values(r.recipe) : (df_strategy_values){0};
  if (st == DF_OK) {
    const df_step_settings set = df_step_settings_of(r.recipe, r.res.mask_token_id, &values);
    st = df_step_open(r.ctx, r.model, r.res.draft, &r.res.frozen, &set, false, &run, err);
  }
  if (st == DF_OK) st = prepare_strategy(&r, run, err);
  int64_t horizon = 0;
  if (st == DF_OK) st = schedule_horizon(r.recipe, &horizon, err);
  if (st == DF_OK) {
    df_dflash_sampler s;
    df_dflash_sampler_init(&s, r.recipe->training.seed);
    // training.global_step: the optimizer steps a run would have taken before this micro-step (draftforge's key)
    const int64_t step = (int64_t)df_strategy_number(&values, "global_step", 0.0);
    st = micro_at(run, &r.batch, &s, 0.0, false, step, horizon, out, err);
  }
  df_strategy_close(run);
  if (st == DF_OK && dump_dir) st = write_dump(&r, out, dump_dir, err);
  if (st != DF_OK) df_step_result_free(out);
  run_free(&r);
  return st;
}
