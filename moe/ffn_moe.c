// df_ffn vtable for the MoE layer: parameter table entries, binding by native name, and model-level hooks.
#include "moe/ffn_moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/export.h"
#include "moe/layout.h"
#include "moe/params.h"

typedef struct {
  df_ffn base;
  df_moe_layer L;
} ffn_moe;

static const df_ffn_vtable MOE_VT;

df_moe_layer *df_ffn_moe_layer(df_ffn *f) { return f && f->vt == &MOE_VT ? &((ffn_moe *)f)->L : NULL; }
bool df_ffn_is_moe(const df_ffn *f) { return f && f->vt == &MOE_VT; }

// Mixed precision: the MoE layer is an fp32 island. Its router math is fp32 by contract (kernels/ops_moe.h) and its
// grouped expert GEMMs are CUDA-core kernels that accumulate in fp32 whatever they load, so it reads the fp32
// masters and casts at its boundary: x and dy up to fp32, y and dx down to the storage dtype. Its saved and scratch
// memory holds fp32 (and i32) values; sized in elements of f->dt, it asks for as many bytes.
static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }
static int64_t in_dt(const df_ffn *f, int64_t floats) {
  return floats * (int64_t)sizeof(float) / (int64_t)df_dtype_size(f->dt);
}
static bool island(const df_ffn *f) { return f->dt != DF_F32; }
// The island's fp32 staging rows ahead of the layer's own scratch: x, y (forward); x, dy, dx (backward).
static int64_t staging(const df_ffn *f, int64_t rows) {
  return island(f) ? 3 * round16(rows * ((const ffn_moe *)f)->L.H) : 0;
}

static int64_t moe_saved_elems(const df_ffn *f, int64_t rows) {
  return in_dt(f, df_moe_layer_saved_elems(&((const ffn_moe *)f)->L, rows));
}
static int64_t moe_scratch_elems(const df_ffn *f, int64_t rows) {
  return in_dt(f, staging(f, rows) + df_moe_layer_scratch_elems(&((const ffn_moe *)f)->L, rows));
}

// The weight (and gradient) view of one MoE tensor by its native name.
static df_status view_of(const df_params *p, int64_t layer, df_moe_tensor t, float *flat, df_device dev, df_tensor *out,
                         df_error *err) {
  char name[DF_MOE_NAME_MAX];
  DF_TRY(df_params_view_named(p, df_moe_param_name(layer, t, name, sizeof name), flat, out, err));
  out->device = dev;
  return DF_OK;
}

// The fp32 masters' view (the MoE layer is an fp32 island in a bf16 draft) and the gradient's.
static df_status bind_pair(const df_params *p, int64_t layer, df_moe_tensor t, float *weights, float *grads,
                           df_device dev, df_tensor *w, df_tensor *g, df_error *err) {
  char name[DF_MOE_NAME_MAX];
  return df_params_bind_masters(p, df_moe_param_name(layer, t, name, sizeof name), weights, grads, dev, w, g, err);
}

// A buffer's storage in the flat weights (0-dim entries included).
static df_status buffer_of(const df_params *p, int64_t layer, df_moe_tensor t, float *weights, float **out,
                           df_error *err) {
  char name[DF_MOE_NAME_MAX];
  df_moe_param_name(layer, t, name, sizeof name);
  const df_param *e = df_params_find(p, name);
  if (!e)
    return DF_FAIL(err, DF_ERR_INVALID, name, "build the table with df_moe_params_add for this config",
                   "the MoE buffer '%s' is not in the parameter table", name);
  *out = weights + e->offset;
  return DF_OK;
}

static df_status moe_bind(df_ffn *f, const df_params *p, float *weights, float *grads, df_device dev, df_error *err) {
  df_moe_layer *L = &((ffn_moe *)f)->L;
  const int64_t i = f->layer;
  DF_TRY(bind_pair(p, i, DF_MOE_T_ROUTER_WEIGHT, weights, grads, dev, &L->w_router, &L->g_router, err));
  if (L->cfg.moe_router_bias) DF_TRY(view_of(p, i, DF_MOE_T_ROUTER_BIAS, weights, dev, &L->logit_bias, err));
  if (L->cfg.balance == DF_MOE_BALANCE_NOAUX_TC)
    DF_TRY(buffer_of(p, i, DF_MOE_T_SELECTION_BIAS, weights, &L->balance.bias, err));
  if (L->cfg.router_center != DF_MOE_CENTER_NONE) {
    DF_TRY(buffer_of(p, i, DF_MOE_T_INPUT_MEAN, weights, &L->input_mean, err));
    DF_TRY(buffer_of(p, i, DF_MOE_T_INPUT_MEAN_STEPS, weights, &L->input_mean_steps, err));
  }
  df_moe_experts_params *ep = &L->ep;
  DF_TRY(bind_pair(p, i, DF_MOE_T_EXPERTS_W1, weights, grads, dev, &ep->w1, &ep->g1, err));
  DF_TRY(bind_pair(p, i, DF_MOE_T_EXPERTS_W3, weights, grads, dev, &ep->w3, &ep->g3, err));
  DF_TRY(bind_pair(p, i, DF_MOE_T_EXPERTS_W2, weights, grads, dev, &ep->w2, &ep->g2, err));
  ep->frozen = L->cfg.freeze_experts;
  if (!L->has_shared) return DF_OK;
  df_moe_shared_params *sp = &L->sp;
  DF_TRY(bind_pair(p, i, DF_MOE_T_SHARED_W1, weights, grads, dev, &sp->w1, &sp->g1, err));
  DF_TRY(bind_pair(p, i, DF_MOE_T_SHARED_W3, weights, grads, dev, &sp->w3, &sp->g3, err));
  DF_TRY(bind_pair(p, i, DF_MOE_T_SHARED_W2, weights, grads, dev, &sp->w2, &sp->g2, err));
  if (L->shared.gated) DF_TRY(bind_pair(p, i, DF_MOE_T_SHARED_GATE, weights, grads, dev, &sp->gate, &sp->ggate, err));
  return DF_OK;
}

// An fp32 tensor of t's shape at p.
static df_tensor f32_like(const df_tensor *t, float *p) { return df_view(p, DF_F32, t->device, t->ndim, t->shape); }

static df_status moe_forward(df_ffn *f, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved, float *scratch,
                             df_error *err) {
  df_moe_layer *L = &((ffn_moe *)f)->L;
  if (!island(f)) return df_moe_layer_forward(L, ctx, x, y, saved, scratch, err);
  const int64_t n = round16(df_numel(x));
  df_tensor x32 = f32_like(x, scratch), y32 = f32_like(y, scratch + n);
  DF_TRY(df_cast(ctx, x, &x32, err));
  DF_TRY(df_moe_layer_forward(L, ctx, &x32, &y32, saved, scratch + staging(f, df_numel(x) / L->H), err));
  return df_cast(ctx, &y32, y, err);
}

static df_status moe_backward(df_ffn *f, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                              bool accumulate_dx, const float *saved, float *scratch, df_error *err) {
  df_moe_layer *L = &((ffn_moe *)f)->L;
  if (!island(f)) return df_moe_layer_backward(L, ctx, x, dy, dx, accumulate_dx, saved, scratch, err);
  const int64_t n = round16(df_numel(x));
  df_tensor x32 = f32_like(x, scratch), dy32 = f32_like(dy, scratch + n), dx32 = f32_like(dx, scratch + 2 * n);
  DF_TRY(df_cast(ctx, x, &x32, err));
  DF_TRY(df_cast(ctx, dy, &dy32, err));
  if (accumulate_dx) DF_TRY(df_cast(ctx, dx, &dx32, err)); // the sum rounds to the storage dtype once
  DF_TRY(df_moe_layer_backward(L, ctx, &x32, &dy32, &dx32, accumulate_dx, saved,
                               scratch + staging(f, df_numel(x) / L->H), err));
  return df_cast(ctx, &dx32, dx, err);
}

static int64_t moe_state_elems(const df_ffn *f) { return df_moe_layer_state_elems(&((const ffn_moe *)f)->L); }
static void moe_bind_state(df_ffn *f, float *state) { df_moe_layer_bind_state(&((ffn_moe *)f)->L, state); }

static void moe_destroy(df_ffn *f) {
  df_moe_layer_free(&((ffn_moe *)f)->L);
  free(f);
}

static const df_ffn_vtable MOE_VT = {.kind = "moe",
                                     .saved_elems = moe_saved_elems,
                                     .scratch_elems = moe_scratch_elems,
                                     .bind = moe_bind,
                                     .state_elems = moe_state_elems,
                                     .bind_state = moe_bind_state,
                                     .forward = moe_forward,
                                     .backward = moe_backward,
                                     .destroy = moe_destroy};

df_status df_ffn_moe_create_from(const df_moe_config *m, int64_t hidden_size, int64_t layer, df_params *p, df_ffn **out,
                                 df_error *err) {
  *out = NULL;
  ffn_moe *f = calloc(1, sizeof *f);
  if (!f) return DF_FAIL(err, DF_ERR_NOMEM, "mlp", NULL, "cannot allocate the MoE FFN of layer %lld", (long long)layer);
  f->base = (df_ffn){.vt = &MOE_VT, .layer = layer};
  df_status st = df_moe_layer_init(&f->L, m, hidden_size, layer, err);
  if (st == DF_OK) st = df_moe_params_add(m, hidden_size, layer, p, err);
  if (st != DF_OK) {
    moe_destroy(&f->base);
    return st;
  }
  *out = &f->base;
  return DF_OK;
}

df_status df_ffn_moe_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err) {
  *out = NULL;
  if (!cfg->moe)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_preset", "name a moe_preset in the draft config for an MoE FFN",
                   "layer %lld: the draft config has no MoE section", (long long)layer);
  return df_ffn_moe_create_from(cfg->moe, cfg->hidden_size, layer, p, out, err);
}

// ---- model-level hooks ---------------------------------------------------------------------------------

void df_moe_set_training(df_ffn *const *ffns, int n, bool training) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) df_moe_layer_set_training(df_ffn_moe_layer(ffns[i]), training);
}

void df_moe_set_rows_per_sample(df_ffn *const *ffns, int n, int64_t rows_per_sample) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) df_moe_layer_set_rows_per_sample(df_ffn_moe_layer(ffns[i]), rows_per_sample);
}

void df_moe_set_collective(df_ffn *const *ffns, int n, const df_collective *c) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) df_moe_layer_set_collective(df_ffn_moe_layer(ffns[i]), c);
}

void df_moe_set_aux_grad_scale(df_ffn *const *ffns, int n, float scale) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) df_moe_layer_set_aux_grad_scale(df_ffn_moe_layer(ffns[i]), scale);
}

df_status df_moe_apply_pending(df_ffn *const *ffns, int n, df_error *err) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) DF_TRY(df_moe_layer_apply_pending(df_ffn_moe_layer(ffns[i]), err));
  return DF_OK;
}

double df_moe_aux_loss_sum(df_ffn *const *ffns, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) s += df_moe_layer_aux_loss(df_ffn_moe_layer(ffns[i]));
  return s;
}

// The metric list of per-layer statistics blocks: sums over `count` forwards each (count 1: a record), averaged
// over the layers and the forwards.
static int metrics_of_blocks(df_ffn *const *ffns, int n, const double *const *blocks, int layers, double count,
                             df_moe_metric out[DF_MOE_MAX_METRICS]) {
  df_moe_metrics sum = {0};
  bool noaux = false;
  for (int i = 0, j = 0; i < n && j < layers; i++) {
    df_moe_layer *L = df_ffn_moe_layer(ffns[i]);
    if (!L || !blocks[j]) continue;
    const df_moe_metrics m = df_moe_metrics_of(blocks[j++]);
    sum.load_max_ratio += m.load_max_ratio;
    sum.load_min_ratio += m.load_min_ratio;
    sum.experts_unused_frac += m.experts_unused_frac;
    sum.aux_loss += m.aux_loss;
    sum.bias_abs_max += m.bias_abs_max;
    noaux |= L->cfg.balance == DF_MOE_BALANCE_NOAUX_TC;
  }
  if (!layers) return 0;
  const double c = (double)layers * count;
  int k = 0;
  out[k++] = (df_moe_metric){"moe/load_max_ratio", sum.load_max_ratio / c};
  out[k++] = (df_moe_metric){"moe/load_min_ratio", sum.load_min_ratio / c};
  out[k++] = (df_moe_metric){"moe/experts_unused_frac", sum.experts_unused_frac / c};
  out[k++] = (df_moe_metric){"moe/aux_loss", sum.aux_loss / c};
  if (noaux) out[k++] = (df_moe_metric){"moe/bias_abs_max", sum.bias_abs_max / c};
  return k;
}

int df_moe_collect_metrics(df_ffn *const *ffns, int n, df_moe_metric out[DF_MOE_MAX_METRICS]) {
  const double *blocks[64] = {0};
  int layers = 0;
  for (int i = 0; i < n && layers < 64; i++) {
    df_moe_layer *L = df_ffn_moe_layer(ffns[i]);
    df_moe_metrics m;
    if (!L || !df_moe_layer_metrics(L, &m)) continue;
    blocks[layers++] = L->host_record; // read by df_moe_layer_metrics
  }
  return metrics_of_blocks(ffns, n, blocks, layers, 1.0, out);
}

int df_moe_num_layers(df_ffn *const *ffns, int n) {
  int c = 0;
  for (int i = 0; i < n; i++) c += df_ffn_is_moe(ffns[i]);
  return c;
}

int64_t df_moe_stats_elems(df_ffn *const *ffns, int n) {
  const int64_t E = df_moe_num_experts(ffns, n);
  return E > 0 ? (int64_t)df_moe_num_layers(ffns, n) * DF_MOE_STATS(E) : 0;
}

void df_moe_set_stats(df_ffn *const *ffns, int n, double *sums, double den) {
  const int64_t E = df_moe_num_experts(ffns, n);
  for (int i = 0, j = 0; i < n; i++) {
    df_moe_layer *L = df_ffn_moe_layer(ffns[i]);
    if (!L) continue;
    df_moe_layer_set_stats(L, sums ? sums + (int64_t)j * DF_MOE_STATS(E) : NULL, den);
    j++;
  }
}

double df_moe_stats_aux_num(df_ffn *const *ffns, int n, const double *sums) {
  const int64_t E = df_moe_num_experts(ffns, n);
  double a = 0.0;
  for (int j = 0; j < df_moe_num_layers(ffns, n); j++) a += sums[(int64_t)j * DF_MOE_STATS(E) + DF_MOE_STAT_AUX_NUM];
  return a;
}

int df_moe_stats_metrics(df_ffn *const *ffns, int n, const double *sums, int micro,
                         df_moe_metric out[DF_MOE_MAX_METRICS]) {
  const int64_t E = df_moe_num_experts(ffns, n);
  const double *blocks[64] = {0};
  const int layers = df_moe_num_layers(ffns, n) < 64 ? df_moe_num_layers(ffns, n) : 64;
  for (int j = 0; j < layers; j++) blocks[j] = sums + (int64_t)j * DF_MOE_STATS(E);
  return micro > 0 ? metrics_of_blocks(ffns, n, blocks, layers, (double)micro, out) : 0;
}

int64_t df_moe_num_experts(df_ffn *const *ffns, int n) {
  for (int i = 0; i < n; i++)
    if (df_ffn_is_moe(ffns[i])) return df_ffn_moe_layer(ffns[i])->router.E;
  return 0;
}

int df_moe_collect_load(df_ffn *const *ffns, int n, int max_layers, int64_t *layer_ids, double *load) {
  const int64_t E = df_moe_num_experts(ffns, n);
  int j = 0;
  for (int i = 0; i < n && j < max_layers; i++) {
    df_moe_layer *L = df_ffn_moe_layer(ffns[i]);
    const double *l = L && L->router.E == E ? df_moe_layer_load(L) : NULL;
    if (!l) continue;
    layer_ids[j] = L->layer;
    memcpy(load + (size_t)j * (size_t)E, l, (size_t)E * sizeof(double));
    j++;
  }
  return j;
}

// ---- the "moe" FFN kind (modeling/ffn.h) -----------------------------------------------------------------------

static df_status kind_resolve(const json_t *root, const char *source, void **out, df_error *err) {
  *out = NULL;
  df_moe_config *m = calloc(1, sizeof *m);
  if (!m) return DF_FAIL(err, DF_ERR_NOMEM, source, NULL, "cannot allocate the MoE config");
  bool is_moe = false;
  df_status st = df_moe_config_resolve(root, source, &is_moe, m, err);
  if (st != DF_OK || !is_moe) {
    free(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

static void kind_free(void *cfg) { free(cfg); }
static void kind_print(const void *cfg, FILE *fp) { df_moe_config_print(cfg, fp); }

static void kind_param_counts(const void *cfg, int64_t H, int64_t *total, int64_t *active) {
  *total = df_moe_layer_params_total(cfg, H);
  *active = df_moe_layer_params_active(cfg, H);
}

static df_status kind_load(const void *cfg, const df_params *p, float *flat, const df_st_model *f,
                           const df_load_options *opt, bool optional_buffers, df_error *err) {
  const df_moe_load_options o = {.base = *opt, .centering_optional = optional_buffers};
  return df_moe_layout_load(cfg, p, flat, f, &o, NULL, err);
}

static df_status kind_save(const void *cfg, const df_params *p, const float *flat, const char *path,
                           const df_save_options *so, df_error *err) {
  return df_moe_layout_save(cfg, p, flat, path, so, err);
}

// {"<decoder layer>": [share of expert 0, ...], ...}: the mean expert load per MoE layer over `micro` forwards.
static json_t *expert_load_json(df_ffn *const *ffns, int n, const double *sums, int micro) {
  const int64_t E = df_moe_num_experts(ffns, n);
  json_t *o = json_object();
  for (int i = 0, j = 0; i < n; i++) {
    df_moe_layer *L = df_ffn_moe_layer(ffns[i]);
    if (!L) continue;
    const double *load = sums + (int64_t)j++ * DF_MOE_STATS(E) + DF_MOE_STAT_LOAD;
    json_t *a = json_array();
    for (int64_t e = 0; e < E; e++) json_array_append_new(a, json_real(load[e] / (double)micro));
    char key[32];
    snprintf(key, sizeof key, "%lld", (long long)L->layer);
    json_object_set_new(o, key, a);
  }
  return o;
}

// moe/load_max_ratio, moe/load_min_ratio, moe/experts_unused_frac, moe/aux_loss (+ moe/bias_abs_max for noaux_tc):
// layer averages, averaged over the window's training forwards; and moe/expert_load per layer.
static void kind_stats_json(df_ffn *const *ffns, int n, const double *sums, int micro, json_t *o) {
  if (micro <= 0 || df_moe_num_layers(ffns, n) == 0) return;
  df_moe_metric m[DF_MOE_MAX_METRICS];
  const int k = df_moe_stats_metrics(ffns, n, sums, micro, m);
  for (int i = 0; i < k; i++)
    json_object_set_new(o, m[i].name, isfinite(m[i].value) ? json_real(m[i].value) : json_null());
  json_object_set_new(o, "moe/expert_load", expert_load_json(ffns, n, sums, micro));
}

static df_status kind_export_check(const void *cfg, df_error *err) { return df_moe_serving_check(cfg, err); }

static df_status kind_export_draft_json(const void *cfg, const json_t *src, json_t **out, df_error *err) {
  return df_export_moe_draft_json(src, cfg, out, err);
}

static df_status kind_export_weights(const void *cfg, const df_params *sp, const float *sflat, const df_params *dp,
                                     float *dflat, df_error *err) {
  return df_export_fold_centering(cfg, sp, sflat, dp, dflat, err);
}

static df_status kind_export_config(const void *cfg, json_t *norm, const char *serving_class, df_error *err) {
  return df_export_moe_config_updates(norm, cfg, serving_class, err);
}

static const char *const KEEP_F32[] = {".mlp.gate.", NULL}; // the router: gate.weight, gate.bias

const df_ffn_kind df_ffn_moe_kind = {.name = "moe",
                                     .config_resolve = kind_resolve,
                                     .config_free = kind_free,
                                     .config_print = kind_print,
                                     .is_top_level_key = df_moe_is_top_level_key,
                                     .param_counts = kind_param_counts,
                                     .create = df_ffn_moe_create,
                                     .load = kind_load,
                                     .set_training = df_moe_set_training,
                                     .set_rows_per_sample = df_moe_set_rows_per_sample,
                                     .save = kind_save,
                                     .set_collective = df_moe_set_collective,
                                     .stats_elems = df_moe_stats_elems,
                                     .set_stats = df_moe_set_stats,
                                     .loss_term = df_moe_aux_loss_sum,
                                     .set_loss_term_grad = df_moe_set_aux_grad_scale,
                                     .apply_pending = df_moe_apply_pending,
                                     .stats_loss_num = df_moe_stats_aux_num,
                                     .stats_json = kind_stats_json,
                                     .export_check = kind_export_check,
                                     .export_draft_json = kind_export_draft_json,
                                     .export_weights = kind_export_weights,
                                     .export_config = kind_export_config,
                                     .keep_f32 = KEEP_F32};
