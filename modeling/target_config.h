// The target model's config.json (Qwen3 family; multimodal Qwen3.5/3.6 nest it under text_config), resolved
// into an immutable struct: the sizes the draft must match and the facts the frozen embedding/lm_head need.
#ifndef DF_MODELING_TARGET_CONFIG_H
#define DF_MODELING_TARGET_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_target_config {
  const char *source;     // the config.json path, or the name given with the JSON string
  const char *model_type; // top-level model_type ("qwen3", "qwen3_5", ...); "" when absent
  bool text_config;       // the text model's keys were read from text_config
  int64_t hidden_size;
  int64_t num_hidden_layers;
  int64_t vocab_size; // padded_vocab_size when present, else vocab_size (SpecForge target_vocab_size)
  int64_t num_attention_heads, num_key_value_heads, head_dim;
  int64_t intermediate_size; // 0 when absent
  double rms_norm_eps;
  double rope_theta;
  int64_t max_position_embeddings;
  bool tie_word_embeddings; // lm_head = embed_tokens; Qwen3Config's default is false
  bool has_logits_mup;      // the lm_head is divided by logits_mup_width_multiplier
  double logits_mup_width_multiplier;
  const json_t *json; // the whole document as read; read-only
} df_target_config;

// dir/config.json of a target model directory.
df_status df_target_config_from_dir(const char *dir, const df_target_config **out, df_error *err);
df_status df_target_config_from_file(const char *path, const df_target_config **out, df_error *err);
df_status df_target_config_from_json(const char *text, size_t len, const char *name, const df_target_config **out,
                                     df_error *err);
void df_target_config_free(const df_target_config *cfg);

void df_target_config_print(const df_target_config *cfg, FILE *fp);

#ifdef __cplusplus
}
#endif

#endif
