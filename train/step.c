// One DFlash or DSpark micro-step from a recipe (docs/dflash-step.md): resources are loaded in the order the contract
// reads them (recipe, configs, target pieces, model, batch), the step runs, and the dump is written.
#include "train/step.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/strict_load.h"
#include "moe/ffn_moe.h"
#include "moe/layout.h"
#include "train/device.h"
#include "train/fsutil.h"
#include "train/recipe.h"
#include "train/stage.h"
#include "train/trainer_resources.h"

// ---- the micro-step ------------------------------------------------------------------------------------------

// The stage of a run with these options (train/stage.h).
df_stage_spec df_step_stage_spec(const df_draft_config *cfg, const df_step_frozen *fz, const df_step_options *opt,
                                 df_dspark_heads *heads) {
  df_dspark_loss_options lo = df_step_dspark_loss(opt);
  df_dspark_terms t = df_dspark_objective_terms(&lo, heads);
  return (df_stage_spec){.kind = cfg->kind,
                         .block_size = cfg->block_size,
                         .vocab = fz->vocab,
                         .hidden = fz->hidden,
                         .mask_token_id = opt->mask_token_id,
                         .loss_decay_gamma = opt->loss_decay_gamma,
                         .loss_type = opt->loss.type,
                         .teacher = cfg->kind == DF_DRAFT_DSPARK && t.teacher,
                         .markov_rank = t.rank};
}

// ---- the MoE aux loss (docs/training.md "MoE drafts") -------------------------------------------------------------

// After the objective of a training forward, before the backward. The routers' aux loss A = Σ_layers aux
// (coefficient-scaled; 0 for dense drafts, with the coefficient 0, and in eval) joins the ratio objective as
//   loss_num += A·loss_den,  so loss = loss_num / loss_den = CE ratio + A,
// and the layers' backward adds A's gradient times ∂(what this backward differentiates)/∂A:
// - the step command (grad_scale 0) differentiates loss_num / loss_den: the scale is 1;
// - the trainer (grad_scale g > 0) differentiates g·loss_num and divides the window's sum by Σ_i loss_den_i at
//   the optimizer boundary: the scale is g·loss_den, so the window's gradient is that of
//   Σ_i (num_i + A_i·den_i) / Σ_i den_i — each micro-batch's aux loss weighted like its objective.
// A micro-batch with no loss weight (loss_den = 0) adds nothing and back-propagates no aux gradient.
// Data parallel: the aux loss is the global batch's (moe/layer.c reduces the routing), and its weight is the
// micro-batch's global loss_den — each rank adds aux·(its own loss_den) to the MoE sums, so the ranks' sums add
// to aux·Σden, and the aux gradient's scale is grad_scale·Σden.
// With opt->moe_stats (the trainer) the aux loss reaches loss_num on the device (the layers add aux·loss_den into
// the MoE sums, df_moe_set_stats) and nothing is read here; otherwise the layers' records are read back.
static df_status moe_aux_begin(df_dflash_model *m, const df_step_options *opt, double loss_den, double *aux,
                               df_error *err) {
  int n = 0;
  df_ffn *const *ffns = df_dflash_model_ffns(m, &n);
  *aux = 0.0;
  if (!df_dflash_model_is_moe(m)) return DF_OK;
  double den = loss_den;
  if (opt->global && opt->dp_sum) {
    float d = (float)loss_den;
    DF_TRY(df_moe_allreduce(opt->dp_sum, &d, 1, false, err));
    den = d;
  }
  *aux = den > 0 && !opt->moe_stats ? df_moe_aux_loss_sum(ffns, n) : 0.0;
  const double scale = den > 0 ? (opt->grad_scale > 0 ? opt->grad_scale * den : 1.0) : 0.0;
  df_moe_set_aux_grad_scale(ffns, n, (float)scale);
  return DF_OK;
}

df_dspark_loss_options df_step_dspark_loss(const df_step_options *opt) {
  df_dspark_loss_options o = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0}; // SpecForge's defaults
  if (opt->dspark.set)
    o.ce_alpha = opt->dspark.ce_alpha, o.l1_alpha = opt->dspark.l1_alpha, o.conf_alpha = opt->dspark.conf_alpha;
  o.chunk_blocks = opt->loss.chunk_blocks;
  o.grad_scale = opt->grad_scale;
  return o;
}

static df_status check_options(const df_draft_config *cfg, const df_step_options *opt, df_error *err) {
  if (cfg->kind == DF_DRAFT_DSPARK && opt->loss.type != DF_LOSS_DFLASH)
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_type", "drop loss_type (DSpark has its own objective)",
                   "loss_type %s does not apply to a DSpark draft (%s)", df_dflash_loss_type_name(opt->loss.type),
                   cfg->source);
  return DF_OK;
}

// The objective of the staged micro-batch into stats, with d(loss)/d(hidden) in st->dhidden: DFlash's (then
// rescaled for the trainer: d(grad_scale·num) = grad_scale·den · d(num/den)), or DSpark's (which takes grad_scale
// itself and adds the heads' gradients).
static df_status objective(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                           const df_step_options *opt, df_staged *st, const df_tensor *hidden, df_tensor *stats,
                           df_error *err) {
  df_tensor head = df_f32_on(df_ctx_device(ctx), fz->lm_head, fz->vocab, fz->hidden);
  if (cfg->kind == DF_DRAFT_DSPARK) {
    df_dspark_loss_options lo = df_step_dspark_loss(opt);
    return df_dspark_objective_rows(ctx, &lo, df_dflash_model_dspark_heads(m), hidden, &head,
                                    st->last_hidden.data ? &st->last_hidden : NULL, &st->dspark, &st->dspark_w,
                                    &st->dhidden, stats, err);
  }
  DF_TRY(
      df_dflash_objective_rows(ctx, &opt->loss, hidden, &head, &st->dflash, &st->dflash_w, &st->dhidden, stats, err));
  if (!(opt->grad_scale > 0)) return DF_OK;
  return df_scale(ctx, &st->dhidden, (float)(opt->grad_scale * st->loss_den), err);
}

// The sums read back from a step's own stats (the step command, tests, benches): the kind's metrics.
static df_status read_metrics(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_options *opt,
                              const df_staged *st, df_dflash_metrics *out, df_error *err) {
  const int64_t ns = df_numel(&st->stats), bs = cfg->block_size;
  double *host = malloc(sizeof(double) * (size_t)ns);
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  df_status rc = df_copy(ctx, host, DF_DEV_CPU, st->stats.data, df_ctx_device(ctx), sizeof(double) * (size_t)ns, err);
  if (rc == DF_OK && cfg->kind != DF_DRAFT_DSPARK) rc = df_dflash_metrics_from_stats(host, bs, st->loss_den, out, err);
  if (rc == DF_OK && cfg->kind == DF_DRAFT_DSPARK) {
    df_dspark_loss_options lo = df_step_dspark_loss(opt);
    df_dspark_metrics dm;
    rc = df_dspark_metrics_from_stats(host, bs, st->loss_den, &lo,
                                      df_dspark_objective_terms(&lo, df_dflash_model_dspark_heads(m)), &dm, err);
    if (rc == DF_OK) rc = df_step_dspark_shared(&dm, out, err);
    if (rc == DF_OK && opt->dspark_metrics)
      *opt->dspark_metrics = dm; // moved
    else
      df_dspark_metrics_free(&dm);
  }
  free(host);
  return rc;
}

df_status df_step_dspark_shared(const df_dspark_metrics *d, df_dflash_metrics *out, df_error *err) {
  out->loss_num = d->loss_num, out->loss_den = d->loss_den;
  out->acc_num = d->acc_num, out->acc_den = d->eval_den;
  out->num_blocks = d->num_blocks, out->bs = d->bs, out->accept_len_sum = d->greedy_accept_sum;
  out->pos_acc_num = malloc((size_t)d->bs * sizeof(double));
  out->pos_acc_den = malloc((size_t)d->bs * sizeof(double));
  if (!out->pos_acc_num || !out->pos_acc_den) {
    df_dflash_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  memcpy(out->pos_acc_num, d->pos_acc_num, (size_t)d->bs * sizeof(double));
  memcpy(out->pos_acc_den, d->pos_den, (size_t)d->bs * sizeof(double));
  return DF_OK;
}

// Anchors (host RNG), the stage (host build, one upload), forward, objective, MoE aux, backward.
static df_status micro(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                       const df_batch *bt, df_dflash_sampler *s, const df_step_options *opt, df_stage *stage,
                       df_dflash_anchors *a, df_staged *st, double *aux, df_error *err) {
  DF_TRY(check_options(cfg, opt, err));
  if (opt->global)
    DF_TRY(df_dflash_sample_anchors_global(s, bt->loss_mask, bt->B, bt->S, opt->num_anchors, opt->global, a, err));
  else
    DF_TRY(df_dflash_sample_anchors(s, bt->loss_mask, bt->B, bt->S, opt->num_anchors, a, err));
  DF_TRY(df_stage_prepare(stage, bt, a, st, err));
  df_tensor stats = opt->stats ? *opt->stats : st->stats;
  if (!opt->stats) DF_TRY(df_fill(ctx, &stats, 0.0, err));
  df_tensor hidden;
  int nf = 0;
  df_ffn *const *ffns = df_dflash_model_ffns(m, &nf);
  if (opt->moe_stats) df_moe_set_stats(ffns, nf, opt->moe_stats, st->loss_den);
  df_status fw = df_stage_forward(ctx, m, fz->embed, fz->vocab, st, &hidden, err);
  if (opt->moe_stats) df_moe_set_stats(ffns, nf, NULL, 0.0);
  DF_TRY(fw);
  if (!opt->accumulate) df_dflash_model_zero_grads(m); // DSpark's heads add their gradients in the objective
  DF_TRY(objective(ctx, m, cfg, fz, opt, st, &hidden, &stats, err));
  DF_TRY(moe_aux_begin(m, opt, st->loss_den, aux, err));
  return df_dflash_model_backward(m, st->dhidden.data, err);
}

df_status df_step_micro(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                        const df_batch *batch, df_dflash_sampler *s, const df_step_options *opt, int64_t *out_n,
                        df_dflash_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  df_stage *stage = opt->stage;
  if (!stage) {
    df_stage_spec spec = df_step_stage_spec(cfg, frozen, opt, df_dflash_model_dspark_heads(m));
    DF_TRY(df_stage_create(ctx, &spec, &stage, err));
  }
  df_dflash_anchors a = {0};
  df_staged st;
  double aux = 0.0;
  df_status rc = micro(ctx, m, cfg, frozen, batch, s, opt, stage, &a, &st, &aux, err);
  if (rc == DF_OK && !opt->stats) rc = read_metrics(ctx, m, cfg, opt, &st, out, err);
  if (rc == DF_OK) {
    out->bs = cfg->block_size, out->loss_den = st.loss_den, out->num_blocks = st.num_blocks;
    out->aux_loss = aux;
    out->loss_num += aux * st.loss_den; // with opt->stats, loss_num holds just this host part
  }
  if (out_n) *out_n = a.N;
  if (rc != DF_OK) df_dflash_metrics_free(out);
  df_dflash_anchors_free(&a);
  if (!opt->stage) df_stage_free(stage);
  return rc;
}

// ---- loading ---------------------------------------------------------------------------------------------------

// Everything df_step_run owns, released in reverse order by run_free.
typedef struct {
  const df_recipe *recipe;
  df_run_resources res; // configs, frozen pieces (scaled head), mask token (train/trainer_resources.h)
  df_ctx *ctx;
  df_dflash_model *model;
  df_batch batch;
} step_run;

static void run_free(step_run *r) {
  df_batch_free(&r->batch);
  df_dflash_model_free(r->model);
  df_run_resources_free(&r->res); // before the context: the frozen pieces may live on its device
  df_ctx_destroy(r->ctx);
  df_recipe_free(r->recipe);
}

static df_status load_model(step_run *r, int threads, const df_device_choice *device, df_error *err) {
  DF_TRY(df_device_open(device ? *device : r->recipe->training.device, df_device_cpu_only_reason(r->res.draft), threads,
                        stderr, &r->ctx, err));
  DF_TRY(df_run_resources_place(&r->res, r->ctx, err));
  DF_TRY(df_dflash_model_create(r->res.draft, r->ctx, &r->model, err));
  const df_recipe *rc = r->recipe;
  if (!rc->model.draft_checkpoint_path) return df_dflash_model_init(r->model, rc->training.seed, err);
  // A warm start: MoE centering buffers may be absent (they keep the init values: mean 0, steps 0).
  if (df_dflash_model_is_moe(r->model)) DF_TRY(df_dflash_model_init(r->model, rc->training.seed, err));
  return df_dflash_model_load_ex(r->model, rc->model.draft_checkpoint_path, true, err);
}

// Recipe; configs, strategy check, frozen pieces and mask token (df_run_resources_load, as the trainer); model;
// the first batch.
static df_status load_all(step_run *r, const char *recipe, int threads, const df_device_choice *device, df_error *err) {
  df_recipe_options ro = {.log = stderr};
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

static json_t *per_position_json(const df_dflash_metrics *m) {
  json_t *arr = json_array();
  for (int64_t k = 0; k < m->bs; k++)
    json_array_append_new(arr, m->pos_acc_den[k] > 0 ? json_real(m->pos_acc_num[k] / m->pos_acc_den[k]) : json_null());
  return arr;
}

static json_t *ratio(double num, double den) { return den > 0 ? json_real(num / den) : json_null(); }

// DSpark: the additive sums and SpecForge's ratio metrics (null when a term did not run or has no denominator).
static void dspark_json(json_t *o, const df_dspark_metrics *m) {
  json_object_set_new(o, "strategy", json_string("dspark"));
  const char *nums[] = {"ce_num",           "l1_num",
                        "confidence_num",   "confidence_abs_error_num",
                        "eval_den",         "teacher_agreement_num",
                        "teacher_top1_num", "draft_top1_num",
                        "tau_num",          "tau_den"};
  const double vals[] = {
      m->ce_num,           m->l1_num,         m->conf_num, m->conf_err_num, m->eval_den, m->teacher_agree_num,
      m->teacher_top1_num, m->draft_top1_num, m->tau_num,  m->tau_den};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) json_object_set_new(o, nums[i], json_real(vals[i]));
  bool t = m->has_teacher, c = m->has_confidence;
  json_object_set_new(o, "ce_loss", ratio(m->ce_num, m->loss_den));
  json_object_set_new(o, "l1_loss", ratio(m->l1_num, m->loss_den));
  json_object_set_new(o, "confidence_loss", ratio(m->conf_num, m->loss_den));
  json_object_set_new(o, "confidence_abs_error", c ? ratio(m->conf_err_num, m->loss_den) : json_null());
  json_object_set_new(o, "acc", ratio(m->acc_num, m->eval_den));
  json_object_set_new(o, "teacher_agreement", t ? ratio(m->teacher_agree_num, m->eval_den) : json_null());
  json_object_set_new(o, "teacher_top1_prob", t ? ratio(m->teacher_top1_num, m->eval_den) : json_null());
  json_object_set_new(o, "draft_top1_prob", t ? ratio(m->draft_top1_num, m->eval_den) : json_null());
  json_object_set_new(o, "tau_probabilistic", t ? ratio(m->tau_num, m->tau_den) : json_null());
  json_t *ce = json_array(), *acc = json_array();
  for (int64_t k = 0; k < m->bs; k++) {
    json_array_append_new(ce, ratio(m->pos_ce_num[k], m->pos_den[k]));
    json_array_append_new(acc, ratio(m->pos_acc_num[k], m->pos_den[k]));
  }
  json_object_set_new(o, "ce_position", ce);
  json_object_set_new(o, "accuracy_position", acc);
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
  if (r->dspark) dspark_json(o, &r->dspark_metrics);
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
  // Every trainable parameter (no buffers), MoE tensors named by the config's checkpoint layout. Gradients on a
  // device are read through a host copy: the file writer reads host memory only.
  const float *grads = df_dflash_model_grads(run->model);
  float *host = NULL;
  if (!df_ctx_host_addressable(run->ctx)) {
    const size_t bytes = sizeof(float) * (size_t)df_params_numel(df_dflash_model_params(run->model));
    host = malloc(bytes ? bytes : 1);
    if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "grads", NULL, "cannot stage %zu bytes of gradients", bytes);
    df_status st = df_copy(run->ctx, host, DF_DEV_CPU, grads, df_ctx_device(run->ctx), bytes, err);
    if (st != DF_OK) return free(host), st;
    grads = host;
  }
  df_save_options so = {.dtype = DF_ST_F32, .trainable_only = true};
  df_status st = df_moe_layout_save(run->res.draft->moe, df_dflash_model_params(run->model), grads, path, &so, err);
  free(host);
  DF_TRY(st);
  return df_step_write_json(r, dir, err);
}

// ---- entry point -----------------------------------------------------------------------------------------------

void df_step_result_free(df_step_result *r) {
  if (!r) return;
  df_dflash_metrics_free(&r->metrics);
  df_dspark_metrics_free(&r->dspark_metrics);
}

static df_step_options step_options(const df_recipe *rc, int64_t mask_id) {
  return (df_step_options){.num_anchors = rc->training.num_anchors,
                           .loss_decay_gamma = rc->training.loss_decay_gamma,
                           .mask_token_id = mask_id,
                           .loss = {.type = rc->training.loss_type,
                                    .dpace_alpha = rc->training.dpace_alpha,
                                    .chunk_blocks = rc->training.objective_chunk_blocks},
                           .dspark = {.set = true,
                                      .ce_alpha = rc->training.dspark_ce_loss_alpha,
                                      .l1_alpha = rc->training.dspark_l1_loss_alpha,
                                      .conf_alpha = rc->training.dspark_confidence_head_alpha}};
}

static void fill_result(const df_batch *bt, int64_t N, df_step_result *r) {
  const df_dflash_metrics *m = &r->metrics;
  r->loss_num = m->loss_num, r->loss_den = m->loss_den;
  r->loss = m->loss_den > 0 ? m->loss_num / m->loss_den : 0.0;
  r->aux_loss = m->aux_loss;
  r->acc_num = m->acc_num, r->acc_den = m->acc_den;
  r->num_blocks = m->num_blocks;
  r->B = bt->B, r->S = bt->S, r->N = N, r->bs = m->bs;
  r->mean_accept_len = m->num_blocks > 0 ? m->accept_len_sum / (double)m->num_blocks : 0.0;
}

df_status df_step_run(const char *recipe, const char *dump_dir, int threads, const df_device_choice *device,
                      df_step_result *out, df_error *err) {
  memset(out, 0, sizeof *out);
  step_run r = {0};
  df_status st = load_all(&r, recipe, threads, device, err);
  int64_t N = 0;
  if (st == DF_OK) {
    df_dflash_sampler s;
    df_dflash_sampler_init(&s, r.recipe->training.seed);
    df_step_options opt = step_options(r.recipe, r.res.mask_token_id);
    out->dspark = r.res.draft->kind == DF_DRAFT_DSPARK;
    if (out->dspark) opt.dspark_metrics = &out->dspark_metrics;
    st = df_step_micro(r.ctx, r.model, r.res.draft, &r.res.frozen, &r.batch, &s, &opt, &N, &out->metrics, err);
  }
  if (st == DF_OK) fill_result(&r.batch, N, out);
  if (st == DF_OK && dump_dir) st = write_dump(&r, out, dump_dir, err);
  if (st != DF_OK) df_step_result_free(out);
  run_free(&r);
  return st;
}
