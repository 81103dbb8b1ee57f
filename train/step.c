// One DFlash or DSpark micro-step from a recipe (docs/dflash-step.md): resources are loaded in the order the contract
// reads them (recipe, configs, target pieces, model, batch), the step runs, and the dump is written.
#include "train/step.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/strict_load.h"
#include "moe/ffn_moe.h"
#include "moe/layout.h"
#include "train/fsutil.h"
#include "train/recipe.h"
#include "train/trainer_resources.h"

// ---- the micro-step ------------------------------------------------------------------------------------------

typedef struct {
  df_dflash_anchors a;
  df_dflash_blocks blk;
  float *block_embed; // (B, N·bs, H)
  float *dhidden;     // (B, N·bs, H)
} micro_bufs;

static void micro_free(micro_bufs *b) {
  df_dflash_anchors_free(&b->a);
  df_dflash_blocks_free(&b->blk);
  free(b->block_embed), free(b->dhidden);
}

// Anchors, block rows and their frozen embeddings.
static df_status micro_inputs(df_ctx *ctx, const df_draft_config *cfg, const df_step_frozen *fz, const df_batch *bt,
                              df_dflash_sampler *s, const df_step_options *opt, micro_bufs *b, df_error *err) {
  DF_TRY(df_dflash_sample_anchors(s, bt->loss_mask, bt->B, bt->S, opt->num_anchors, &b->a, err));
  DF_TRY(df_dflash_build_blocks(bt->input_ids, bt->loss_mask, bt->S, &b->a, cfg->block_size, opt->mask_token_id,
                                opt->loss_decay_gamma, &b->blk, err));
  int64_t R = bt->B * b->a.N * cfg->block_size, H = fz->hidden;
  b->block_embed = malloc((size_t)(R * H) * sizeof(float));
  b->dhidden = malloc((size_t)(R * H) * sizeof(float));
  if (!b->block_embed || !b->dhidden)
    return DF_FAIL(err, DF_ERR_NOMEM, "block rows", "lower training.num_anchors or training.batch_size",
                   "out of memory for %lld block rows of width %lld", (long long)R, (long long)H);
  df_tensor table = df_f32((float *)fz->embed, fz->vocab, H), ids = df_i32(b->blk.input_ids, R);
  df_tensor out = df_f32(b->block_embed, R, H);
  return df_embedding_forward(ctx, &table, &ids, &out, err);
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
static double moe_aux_begin(df_dflash_model *m, const df_step_options *opt, double loss_den) {
  int n = 0;
  df_ffn *const *ffns = df_dflash_model_ffns(m, &n);
  if (!df_dflash_model_is_moe(m)) return 0.0;
  const double aux = loss_den > 0 ? df_moe_aux_loss_sum(ffns, n) : 0.0;
  const double scale = loss_den > 0 ? (opt->grad_scale > 0 ? opt->grad_scale * loss_den : 1.0) : 0.0;
  df_moe_set_aux_grad_scale(ffns, n, (float)scale);
  return aux;
}

static void moe_aux_finish(double aux, df_dflash_metrics *out) {
  out->aux_loss = aux;
  out->loss_num += aux * out->loss_den;
}

// ---- the DSpark micro-step (docs/dflash-step.md §6) -------------------------------------------------------------

static df_dspark_loss_options dspark_loss_options(const df_step_options *opt) {
  df_dspark_loss_options o = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0}; // SpecForge's defaults
  if (opt->dspark.set)
    o.ce_alpha = opt->dspark.ce_alpha, o.l1_alpha = opt->dspark.l1_alpha, o.conf_alpha = opt->dspark.conf_alpha;
  o.chunk_blocks = opt->loss.chunk_blocks;
  o.grad_scale = opt->grad_scale;
  return o;
}

// The shared view of the DSpark sums for callers that read df_dflash_metrics (the trainer's window).
static df_status dspark_shared_metrics(const df_dspark_metrics *d, df_dflash_metrics *out, df_error *err) {
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

static df_status dspark_check(const df_draft_config *cfg, const df_step_frozen *fz, const df_batch *bt,
                              const df_step_options *opt, df_error *err) {
  if (opt->loss.type != DF_LOSS_DFLASH)
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_type", "drop loss_type (DSpark has its own objective)",
                   "loss_type %s does not apply to a DSpark draft (%s)", df_dflash_loss_type_name(opt->loss.type),
                   cfg->source);
  if (bt->last_hidden && bt->hidden_size != fz->hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states", "capture the data with this target",
                   "the batch's last hidden states are %lld wide, the LM head reads %lld", (long long)bt->hidden_size,
                   (long long)fz->hidden);
  return DF_OK;
}

// Anchors and block inputs as DFlash; DSpark labels; forward; the objective (the heads add their parameter
// gradients during it, so the grads are zeroed first); the backbone's backward.
static df_status dspark_passes(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                               const df_batch *bt, df_dflash_sampler *s, const df_step_options *opt, micro_bufs *b,
                               df_dspark_labels *lab, df_dspark_metrics *dm, double *aux, df_error *err) {
  DF_TRY(dspark_check(cfg, fz, bt, opt, err));
  DF_TRY(micro_inputs(ctx, cfg, fz, bt, s, opt, b, err));
  DF_TRY(df_dspark_build_labels(bt->input_ids, bt->loss_mask, bt->S, &b->a, cfg->block_size, opt->loss_decay_gamma, lab,
                                err));
  const float *hidden = NULL;
  df_dflash_batch mb = {bt->B, bt->S, b->a.N, bt->hidden, b->block_embed, b->a.anchors, b->a.keep};
  DF_TRY(df_dflash_model_forward(m, &mb, &hidden, err));
  if (!opt->accumulate) df_dflash_model_zero_grads(m);
  int64_t R = bt->B * b->a.N * cfg->block_size;
  df_tensor h = df_f32((float *)hidden, R, fz->hidden), head = df_f32((float *)fz->lm_head, fz->vocab, fz->hidden);
  df_dspark_loss_options lo = dspark_loss_options(opt);
  DF_TRY(df_dspark_objective(ctx, &lo, df_dflash_model_dspark_heads(m), &h, &head, bt->last_hidden, bt->S, lab, &b->a,
                             b->dhidden, dm, err));
  *aux = moe_aux_begin(m, opt, dm->loss_den);
  return df_dflash_model_backward(m, b->dhidden, err);
}

static df_status step_micro_dspark(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg,
                                   const df_step_frozen *fz, const df_batch *bt, df_dflash_sampler *s,
                                   const df_step_options *opt, int64_t *out_n, df_dflash_metrics *out, df_error *err) {
  micro_bufs b = {0};
  df_dspark_labels lab = {0};
  df_dspark_metrics dm = {0};
  double aux = 0.0;
  df_status st = dspark_passes(ctx, m, cfg, fz, bt, s, opt, &b, &lab, &dm, &aux, err);
  if (st == DF_OK) st = dspark_shared_metrics(&dm, out, err);
  if (st == DF_OK) moe_aux_finish(aux, out);
  if (out_n) *out_n = b.a.N;
  if (st == DF_OK && opt->dspark_metrics)
    *opt->dspark_metrics = dm; // moved
  else
    df_dspark_metrics_free(&dm);
  df_dspark_labels_free(&lab);
  micro_free(&b);
  return st;
}

df_status df_step_micro(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                        const df_batch *batch, df_dflash_sampler *s, const df_step_options *opt, int64_t *out_n,
                        df_dflash_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  if (cfg->kind == DF_DRAFT_DSPARK) return step_micro_dspark(ctx, m, cfg, frozen, batch, s, opt, out_n, out, err);
  micro_bufs b = {0};
  df_status st = micro_inputs(ctx, cfg, frozen, batch, s, opt, &b, err);
  const float *hidden = NULL;
  if (st == DF_OK) {
    df_dflash_batch mb = {batch->B, batch->S, b.a.N, batch->hidden, b.block_embed, b.a.anchors, b.a.keep};
    st = df_dflash_model_forward(m, &mb, &hidden, err);
  }
  if (st == DF_OK) {
    int64_t R = batch->B * b.a.N * cfg->block_size;
    df_tensor h = df_f32((float *)hidden, R, frozen->hidden);
    df_tensor head = df_f32((float *)frozen->lm_head, frozen->vocab, frozen->hidden);
    st = df_dflash_objective(ctx, &opt->loss, &h, &head, &b.blk, &b.a, b.dhidden, out, err);
  }
  if (st == DF_OK && opt->grad_scale > 0) {
    // The objective wrote d(num/den); d(grad_scale·num) = grad_scale·den · that (den is Σw or B, > 0 here).
    float k = (float)(opt->grad_scale * out->loss_den);
    int64_t n = batch->B * b.a.N * cfg->block_size * frozen->hidden;
    for (int64_t i = 0; i < n; i++) b.dhidden[i] *= k;
  }
  double aux = 0.0;
  if (st == DF_OK) {
    aux = moe_aux_begin(m, opt, out->loss_den);
    if (!opt->accumulate) df_dflash_model_zero_grads(m);
    st = df_dflash_model_backward(m, b.dhidden, err);
  }
  if (st == DF_OK) moe_aux_finish(aux, out);
  if (out_n) *out_n = b.a.N;
  if (st != DF_OK) df_dflash_metrics_free(out);
  micro_free(&b);
  return st;
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
  df_ctx_destroy(r->ctx);
  df_run_resources_free(&r->res);
  df_recipe_free(r->recipe);
}

static df_status load_model(step_run *r, int threads, df_error *err) {
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = threads};
  DF_TRY(df_ctx_create(&co, &r->ctx, err));
  DF_TRY(df_dflash_model_create(r->res.draft, r->ctx, &r->model, err));
  const df_recipe *rc = r->recipe;
  if (!rc->model.draft_checkpoint_path) return df_dflash_model_init(r->model, rc->training.seed, err);
  // A warm start: MoE centering buffers may be absent (they keep the init values: mean 0, steps 0).
  if (df_dflash_model_is_moe(r->model)) DF_TRY(df_dflash_model_init(r->model, rc->training.seed, err));
  return df_dflash_model_load_ex(r->model, rc->model.draft_checkpoint_path, true, err);
}

// Recipe; configs, strategy check, frozen pieces and mask token (df_run_resources_load, as the trainer); model;
// the first batch.
static df_status load_all(step_run *r, const char *recipe, int threads, df_error *err) {
  df_recipe_options ro = {.log = stderr};
  DF_TRY(df_recipe_load(recipe, &ro, &r->recipe, err));
  const df_recipe *rc = r->recipe;
  if (!rc->data.hidden_states_path)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "data.train_data_path",
                   "capture the data (draftforge capture) and set data.hidden_states_path for the step dump",
                   "draftforge step reads one batch of captured hidden states; this recipe trains online");
  DF_TRY(df_run_resources_load(rc, &r->res, err));
  DF_TRY(load_model(r, threads, err));
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
  df_status st =
      df_write_json_atomic(path, o, JSON_INDENT(2) | JSON_REAL_PRECISION(17), "check the --dump directory", err);
  json_decref(o);
  return st;
}

static df_status write_dump(const step_run *run, const df_step_result *r, const char *dir, df_error *err) {
  DF_TRY(df_mkdirs(dir, "check the --dump directory", err));
  char path[4096];
  snprintf(path, sizeof path, "%s/grads.safetensors", dir);
  // Every trainable parameter (no buffers), MoE tensors named by the config's checkpoint layout.
  df_save_options so = {.dtype = DF_ST_F32, .trainable_only = true};
  DF_TRY(df_moe_layout_save(run->res.draft->moe, df_dflash_model_params(run->model), df_dflash_model_grads(run->model),
                            path, &so, err));
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

df_status df_step_run(const char *recipe, const char *dump_dir, int threads, df_step_result *out, df_error *err) {
  memset(out, 0, sizeof *out);
  step_run r = {0};
  df_status st = load_all(&r, recipe, threads, err);
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
