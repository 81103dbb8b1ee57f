// The MoE kind's part of the HF export (moe.md §4.5, §6.11, §9; reached through modeling/ffn.h's export hooks): the
// folded draft config, the serving fields and class of config.json, and the fold of router centering into an fp32
// logit bias gate.bias = b − W·μ.
#include "moe/export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/params.h"

// Router centering is folded into the logit bias, so the export routes with a bias and without centering.
static bool folds(const df_moe_config *m) { return m->router_center != DF_MOE_CENTER_NONE; }

// A folded draft config: a logit bias, no centering keys.
static void drop_centering(json_t *cfg) {
  json_object_set_new(cfg, "moe_router_bias", json_true());
  json_t *dc = json_object_get(cfg, "dflash_config");
  if (json_is_object(dc)) {
    json_object_del(dc, "moe_router_center");
    json_object_del(dc, "moe_router_center_momentum");
  }
}

df_status df_export_moe_draft_json(const json_t *src, const df_moe_config *m, json_t **out, df_error *err) {
  *out = NULL;
  json_t *cfg = json_deep_copy(src);
  if (!cfg) return DF_FAIL(err, DF_ERR_NOMEM, "config.json", NULL, "out of memory copying the config");
  if (m && folds(m)) drop_centering(cfg);
  *out = cfg;
  return DF_OK;
}

df_status df_export_moe_config_updates(json_t *cfg, const df_moe_config *m, const char *serving_class, df_error *err) {
  if (!m) return DF_OK;
  json_t *fields = NULL;
  DF_TRY(df_moe_serving_fields(m, &fields, err)); // the qwen layout refuses what its block cannot run, too
  json_object_update(cfg, fields);
  json_decref(fields);
  if (folds(m))
    drop_centering(cfg);
  else
    json_object_set_new(cfg, "moe_router_bias", json_boolean(m->moe_router_bias));
  json_object_set_new(cfg, "architectures", json_pack("[s]", serving_class));
  return DF_OK;
}

// ---- the fold --------------------------------------------------------------------------------------------

static df_status fold_bias(const df_moe_config *src, const df_params *sp, const float *sflat, int64_t layer,
                           float *bias, int64_t E, df_error *err) {
  char name[DF_MOE_NAME_MAX];
  const df_param *w = df_params_find(sp, df_moe_param_name(layer, DF_MOE_T_ROUTER_WEIGHT, name, sizeof name));
  const df_param *b = df_params_find(sp, df_moe_param_name(layer, DF_MOE_T_ROUTER_BIAS, name, sizeof name));
  const df_param *mu = df_params_find(sp, df_moe_param_name(layer, DF_MOE_T_INPUT_MEAN, name, sizeof name));
  if (!w || w->ndim != 2 || w->shape[0] != E || (src->router_center != DF_MOE_CENTER_NONE && !mu))
    return DF_FAIL(err, DF_ERR_INVALID, name, "export a checkpoint of this draft config",
                   "layer %lld: the router tensors to fold are missing", (long long)layer);
  const int64_t H = w->shape[1];
  for (int64_t e = 0; e < E; e++) {
    // b − W·μ in fp32 inputs, accumulated in double, stored fp32 (moe.md §6.11)
    double acc = b ? (double)sflat[b->offset + e] : 0.0;
    for (int64_t c = 0; mu && c < H; c++) acc -= (double)sflat[w->offset + e * H + c] * (double)sflat[mu->offset + c];
    bias[e] = (float)acc;
  }
  return DF_OK;
}

df_status df_export_fold_centering(const df_moe_config *src, const df_params *sp, const float *sflat,
                                   const df_params *dp, float *dflat, df_error *err) {
  for (int i = 0; i < df_params_count(dp); i++) {
    const df_param *d = df_params_at(dp, i);
    int64_t layer = 0;
    df_moe_tensor t = DF_MOE_T_COUNT;
    const bool moe = src && df_moe_param_parse(d->name, &layer, &t);
    if (moe && t == DF_MOE_T_ROUTER_BIAS && folds(src)) {
      DF_TRY(fold_bias(src, sp, sflat, layer, dflat + d->offset, d->numel, err));
      continue;
    }
    const df_param *s = df_params_find(sp, d->name);
    if (!s || s->numel != d->numel)
      return DF_FAIL(err, DF_ERR_INVALID, d->name, "export a checkpoint of this draft config",
                     "the export tensor '%s' has no source of the same shape", d->name);
    memcpy(dflat + d->offset, sflat + s->offset, sizeof(float) * (size_t)d->numel);
  }
  return DF_OK;
}
