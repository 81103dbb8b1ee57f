// The MoE kind's export (moe/export.c): the folded draft config, config.json's serving keys and class, and router
// centering folded into gate.bias. train/ reaches these through modeling/ffn.h's export hooks only.
#ifndef DF_MOE_EXPORT_H
#define DF_MOE_EXPORT_H

#include <jansson.h>

#include "base/error.h"
#include "modeling/param_table.h"
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// The draft config the export's tensors describe: with router centering, moe_router_bias true and
// dflash_config.moe_router_center(_momentum) removed (the fold replaced them). *out is a new reference.
df_status df_export_moe_draft_json(const json_t *src, const df_moe_config *m, json_t **out, df_error *err);
// On a normalised config.json: the serving fields, moe_router_bias (true when centering was folded), the folded
// centering keys removed, and architectures [serving_class] (the strategy's MoE class: DFlashMoEDraftModel,
// Qwen3MoeDSparkModel).
df_status df_export_moe_config_updates(json_t *cfg, const df_moe_config *m, const char *serving_class, df_error *err);
// Fills dflat (table dp: the export draft) from sflat (table sp: the trained draft with config src) by name;
// with centering, each layer's gate.bias = b − W·μ (b = the trained bias or 0; fp32 inputs, double sums).
df_status df_export_fold_centering(const df_moe_config *src, const df_params *sp, const float *sflat,
                                   const df_params *dp, float *dflat, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
