// Export of a trained draft as the HF directory SGLang serves (docs/export-and-eval.md): config.json normalised
// as SpecForge's scripts/gates/normalize_dflash_export.py does, and model.safetensors with the draft's tensors.
#ifndef DF_TRAIN_EXPORT_EXPORT_H
#define DF_TRAIN_EXPORT_EXPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "modeling/param_table.h"
#include "modeling/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

// SpecForge's export normaliser on a draft config document (src is not modified; *out is a new reference):
// block_size (top level, or dflash_config.block_size; the two must agree) must be an integer >= 2 and, when
// expect_block_size > 0, equal it; dflash_config.projector_type must be dflash/domino/dspark and attention_mode
// gqa/mha; the projector's strategy names the serving class (strategies/strategy.h export_normalize): DFlash and
// Domino ["DFlashDraftModel"] (Domino keeps projector_type "domino" and its head keys in dflash_config); DSpark goes
// through df_dspark_normalize_export_config (modeling/dspark_heads.h: model_type "qwen3", a positive markov_rank and
// markov_head_type in {vanilla, gated, rnn}, its head keys copied to the top level — a conflicting top-level value
// fails with err->where naming the key — and ["Qwen3DSparkModel"]); auto_map is removed; torch_dtype (and dtype, when
// present) is set to torch_dtype. Every other key is kept as it is. where names the document in errors.
df_status df_export_normalize_config(const json_t *src, const char *torch_dtype, int64_t expect_block_size,
                                     const char *where, json_t **out, df_error *err);

typedef struct {
  df_st_dtype dtype;         // DF_ST_BF16 (round to nearest even) or DF_ST_F32; anything else is refused. The
                             // DSpark confidence head is written F32 either way (SGLang keeps it in fp32).
  int64_t expect_block_size; // > 0: the normaliser's --block-size check
  int threads;               // CPU threads for loading (0: OpenMP default)
  bool has_mask_token_id;    // --mask-token-id: for a checkpoint whose config.json has none (written before
  int64_t mask_token_id;     // checkpoints carried the resolved id); it must agree with one that has one
} df_export_options;

typedef struct {
  char checkpoint[4096]; // the resolved checkpoint directory
  int num_tensors;
  int64_t num_params;
  char architecture[64]; // what config.json names: the class SGLang builds
  int64_t mask_token_id; // written into dflash_config
  bool confidence_head;  // DSpark: the export carries confidence_head.* (F32)
  bool needs_external;   // the class is not in stock SGLang 0.5.23 (MoE drafts: SGLANG_EXTERNAL_MODEL_PACKAGE)
} df_export_info;

// Strictly loads the checkpoint's weights into the draft's parameter table (a missing, extra or misshapen
// tensor fails, named), resolves its config (df_draft_config_resolved_json: mask id, target layers, block size,
// DSpark head keys, mirrored RoPE — a checkpoint without a mask id needs opt->mask_token_id), normalises it,
// and writes out_dir/{config.json, model.safetensors} into
// a temporary sibling directory renamed into place. An existing out_dir is replaced only when it looks like an
// export (regular files, config.json among them) or is empty. info may be NULL.
// MoE drafts (moe.md §4.5, §6.11, §9): recipes the serving classes cannot run are refused first
// (df_moe_serving_check, moe/config.h); router centering is folded into an fp32 gate.bias = b − W·μ (fp32 even in a
// bf16 export; gate.input_mean(_steps) are dropped), config.json gets moe_router_bias, the serving fields
// (df_moe_serving_fields) and architectures DFlashMoEDraftModel (DFlash) or Qwen3MoeDSparkModel (DSpark), and
// model.safetensors is written through the config's checkpoint layout (per-expert names for qwen / deepseek).
df_status df_export(const char *checkpoint, const char *out_dir, const df_export_options *opt, df_export_info *info,
                    df_error *err);

#ifdef __cplusplus
}
#endif

#endif
