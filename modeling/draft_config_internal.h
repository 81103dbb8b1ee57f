// The pieces of the draft-config parser shared between its files (draft_config.c, draft_config_dflash.c,
// draft_config_rope.c); not part of the public API.
#ifndef DF_MODELING_DRAFT_CONFIG_INTERNAL_H
#define DF_MODELING_DRAFT_CONFIG_INTERNAL_H

#include <stdio.h>

#include "base/config_json.h"
#include "modeling/draft_config.h"

// The allocation behind a df_draft_config: the public struct first, so the two pointers coincide.
typedef struct {
  df_draft_config pub;
  df_cj_doc doc; // the parsed document and the source name (pub.source)
  df_layer_type *layer_types;
  int *target_layer_ids;
  void *ffn_cfg; // the FFN kind's config (pub.ffn_kind->config_free), NULL for a dense draft
} df_draft_config_owned;

// The FFN kind (modeling/ffn.h): the first listed kind whose config_resolve claims the document (pub.ffn_kind,
// pub.moe); none: a dense draft. Needs the draft kind resolved.
df_status df_draft_parse_ffn_kind(const df_cj *c, const json_t *root, df_draft_config_owned *o);

// dflash_config (plus the top-level DSpark copies an exported Qwen3DSparkModel config carries). Needs the
// kind, vocab_size, head counts, num_target_layers and num_hidden_layers already resolved.
df_status df_draft_parse_dflash(const df_cj *c, const json_t *root, df_draft_config_owned *o);

// rope_theta, rope_scaling and rope_parameters into cfg->rope. Needs head_dim and max_position_embeddings.
df_status df_draft_parse_rope(const df_cj *c, const json_t *root, df_draft_config *cfg);

// An EAGLE-3 document (LlamaForCausalLMEagle3), after the architecture: everything else it needs.
df_status df_draft_parse_eagle3(const df_cj *c, const json_t *root, df_draft_config_owned *o);
// Its resolved serving form, printout and parameter count (draft_config_serving.c, _print.c and _ffn.c delegate).
df_status df_eagle3_resolved_json(const df_draft_config *cfg, int64_t mask_token_id, json_t **out, df_error *err);
void df_eagle3_config_print(const df_draft_config *cfg, FILE *fp);
int64_t df_eagle3_param_count(const df_draft_config *cfg);

#endif
