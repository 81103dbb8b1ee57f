// The pieces of the draft-config parser shared between its files (draft_config.c, draft_config_dflash.c,
// draft_config_rope.c); not part of the public API.
#ifndef DF_MODELING_DRAFT_CONFIG_INTERNAL_H
#define DF_MODELING_DRAFT_CONFIG_INTERNAL_H

#include "modeling/config_json.h"
#include "modeling/draft_config.h"
#include "moe/config.h"

// The allocation behind a df_draft_config: the public struct first, so the two pointers coincide.
typedef struct {
  df_draft_config pub;
  df_cj_doc doc; // the parsed document and the source name (pub.source)
  df_layer_type *layer_types;
  int *target_layer_ids;
  df_moe_config moe; // pub.moe points here for an MoE draft
} df_draft_config_owned;

// The MoE FFN (moe/config.h): resolved into o->moe when the draft names moe_preset (pub.moe then points at
// it); otherwise every MoE key is an error. Needs the kind resolved.
df_status df_draft_parse_moe(const df_cj *c, const json_t *root, df_draft_config_owned *o);

// dflash_config (plus the top-level DSpark copies an exported Qwen3DSparkModel config carries). Needs the
// kind, vocab_size, head counts, num_target_layers and num_hidden_layers already resolved.
df_status df_draft_parse_dflash(const df_cj *c, const json_t *root, df_draft_config_owned *o);

// rope_theta, rope_scaling and rope_parameters into cfg->rope. Needs head_dim and max_position_embeddings.
df_status df_draft_parse_rope(const df_cj *c, const json_t *root, df_draft_config *cfg);

#endif
