// What a recipe needs loaded before any step runs: the target and draft configs (checked against each other
// and against training.strategy), the frozen target pieces (the LM head scaled by logits_mup_width_multiplier
// when the target has one) and the resolved mask token. Shared by the trainer; `draftforge step` and
// `draftforge eval` load the same things the same way.
#ifndef DF_TRAIN_STEP_RESOURCES_H
#define DF_TRAIN_STEP_RESOURCES_H

#include "base/error.h"
#include "modeling/draft_config.h"
#include "modeling/target_config.h"
#include "modeling/target_pieces.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const df_target_config *target;
  const df_draft_config *draft;
  df_target_pieces pieces;
  float *scaled_head;    // lm_head / logits_mup_width_multiplier (NULL when the target has none)
  df_frozen frozen;      // embed and the (scaled) head, as the step reads them (on the device once placed)
  int64_t mask_token_id; // model.mask_token_id, else the draft config's dflash_config.mask_token_id
  // The draft config with the resolved mask id, target layers, block size, heads and RoPE written out
  // (df_draft_config_resolved_json): what every checkpoint writes as config.json.
  json_t *resolved_config;
  df_ctx *placed; // the context df_run_resources_place uploaded the pieces to (NULL: host copies only)
  float *dev_embed, *dev_head;
} df_run_resources;

// Loads everything above for rc; on failure what was loaded is freed and err names the key or file.
df_status df_run_resources_load(const df_recipe *rc, df_run_resources *out, df_error *err);
// The same with the draft config read from draft_config_path (a config.json; NULL: model.draft_model_config),
// as `draftforge eval` does with a checkpoint's or export's own config.json. training.strategy must still agree.
df_status df_run_resources_load_ex(const df_recipe *rc, const char *draft_config_path, df_run_resources *out,
                                   df_error *err);
// A memory plan's resources (train/trainer/mem_plan.h): the configs and every check above, with the frozen pieces
// sized from the target's config.json and no weight read (frozen.embed / lm_head stay NULL until placed on a
// measuring context, kernels/ops.h df_ctx_options.measure).
df_status df_run_resources_load_shapes(const df_recipe *rc, df_run_resources *out, df_error *err);
// Puts the frozen pieces where ctx's ops read them: on a host-addressable device they stay where they are; else they
// are uploaded once and frozen points at the device copies. The context must outlive df_run_resources_free.
df_status df_run_resources_place(df_run_resources *r, df_ctx *ctx, df_error *err);
// model.torch_dtype as a run on ctx can honour it: bf16 storage on CUDA (every draft kind: the MoE FFN, Domino's GRU
// head and EAGLE-3's TTT attention run as fp32 islands), else fp32; *why says which and why (a static string, for the
// start-up line).
df_dtype df_run_storage(const df_recipe *rc, const df_ctx *ctx, const char **why);
// The same in the draft's storage dtype: bf16 rounds both pieces once on the device (frozen.dtype says which); f32 is
// df_run_resources_place.
df_status df_run_resources_place_as(df_run_resources *r, df_ctx *ctx, df_dtype dt, df_error *err);
void df_run_resources_free(df_run_resources *r);

#ifdef __cplusplus
}
#endif

#endif
