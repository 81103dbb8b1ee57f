// The target's architecture from config.json: the sizes df_target_config validates, plus the keys the forward
// needs (family, biases, RoPE scaling) and a refusal, naming the key, for anything it does not implement.
#include <string.h>

#include "base/config_json.h"
#include "modeling/draft_config_internal.h"
#include "modeling/target/target_model.h"
#include "modeling/target_config.h"

const char *df_target_family_name(df_target_family f) {
  switch (f) {
  case DF_TARGET_QWEN3: return "qwen3";
  case DF_TARGET_LLAMA: return "llama";
  case DF_TARGET_QWEN2: return "qwen2";
  }
  return "?";
}

static df_status family_of(const df_cj *c, const char *model_type, df_target_family *f) {
  static const struct {
    const char *name;
    df_target_family family;
  } known[] = {
      {"qwen3", DF_TARGET_QWEN3}, {"llama", DF_TARGET_LLAMA}, {"mistral", DF_TARGET_LLAMA}, {"qwen2", DF_TARGET_QWEN2}};
  for (size_t i = 0; i < sizeof known / sizeof *known; i++)
    if (!strcmp(model_type, known[i].name)) {
      *f = known[i].family;
      return DF_OK;
    }
  return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "model_type",
                    "the target forward implements dense qwen3, qwen2, llama and mistral decoders; capture other "
                    "targets elsewhere and import the shards",
                    "model_type \"%.64s\" has no forward in draftforge", model_type[0] ? model_type : "(absent)");
}

// Keys whose non-default values would change the computation in ways this forward does not implement.
static df_status refuse_unsupported(const df_cj *c, const json_t *m, const char *px) {
  char path[DF_CJ_PATH];
  bool b = false;
  DF_TRY(df_cj_opt_bool(c, m, px, "use_sliding_window", false, &b));
  if (b)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_path(path, px, "use_sliding_window"),
                      "every target layer runs full causal attention here; set it to false if the window is never hit",
                      "sliding-window targets are not supported");
  DF_TRY(df_cj_opt_bool(c, m, px, "mlp_bias", false, &b));
  if (b)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_path(path, px, "mlp_bias"), "only bias-free MLPs are implemented",
                      "MLP biases are not supported");
  const char *act = "silu";
  DF_TRY(df_cj_opt_string(c, m, px, "hidden_act", "silu", &act));
  if (strcmp(act, "silu"))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_path(path, px, "hidden_act"), "the MLP is SwiGLU (silu)",
                      "activation \"%.32s\" is not supported", act);
  static const char *const moe_keys[] = {"num_experts", "n_routed_experts", "num_local_experts"};
  for (size_t i = 0; i < sizeof moe_keys / sizeof *moe_keys; i++)
    if (df_cj_get(m, moe_keys[i]))
      return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_path(path, px, moe_keys[i]),
                        "the target forward is dense; capture MoE targets with SGLang and import the shards",
                        "MoE targets are not supported");
  const json_t *lt = df_cj_get(m, "layer_types");
  if (lt) {
    size_t i;
    json_t *v;
    json_array_foreach(lt, i, v) {
      if (!json_is_string(v) || strcmp(json_string_value(v), "full_attention"))
        return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_index(path, df_cj_path(path, px, "layer_types"), i),
                          "every target layer must be \"full_attention\"", "layer type is not supported");
    }
  }
  return DF_OK;
}

static df_status spec_from_config(const df_target_config *tc, df_target_spec *s, df_error *err) {
  df_cj c = {.source = tc->source, .err = err};
  const json_t *root = tc->json, *m = tc->text_config ? df_cj_get(root, "text_config") : root;
  const char *px = tc->text_config ? "text_config" : "";
  const char *mt = "";
  DF_TRY(df_cj_opt_string(&c, m, px, "model_type", tc->model_type, &mt));
  DF_TRY(family_of(&c, mt, &s->family));
  DF_TRY(refuse_unsupported(&c, m, px));
  s->num_layers = tc->num_hidden_layers, s->hidden = tc->hidden_size, s->vocab = tc->vocab_size;
  s->heads = tc->num_attention_heads, s->kv_heads = tc->num_key_value_heads, s->head_dim = tc->head_dim;
  s->intermediate = tc->intermediate_size, s->rms_norm_eps = tc->rms_norm_eps, s->tied = tc->tie_word_embeddings;
  s->max_position = tc->max_position_embeddings;
  if (s->intermediate < 1)
    return DF_CJ_FAIL(&c, DF_ERR_INVALID, "intermediate_size", "the MLP width is required", "missing or 0");
  if (s->head_dim % 2)
    return DF_CJ_FAIL(&c, DF_ERR_INVALID, "head_dim", "RoPE rotates two halves of each head", "%lld is odd",
                      (long long)s->head_dim);
  bool attn_bias = false;
  DF_TRY(df_cj_opt_bool(&c, m, px, "attention_bias", false, &attn_bias));
  s->qk_norm = s->family == DF_TARGET_QWEN3;
  s->qkv_bias = s->family == DF_TARGET_QWEN2 || attn_bias; // Qwen2 always biases q/k/v, never o
  s->o_bias = s->family != DF_TARGET_QWEN2 && attn_bias;
  if (tc->has_logits_mup)
    return DF_CJ_FAIL(&c, DF_ERR_UNSUPPORTED, "logits_mup_width_multiplier", "remove it or fold it into lm_head",
                      "scaled LM heads are not supported by the target forward");
  // RoPE: the draft-config parser reads the same keys with the same HF semantics.
  df_draft_config tmp = {.head_dim = s->head_dim, .max_position_embeddings = s->max_position};
  DF_TRY(df_draft_parse_rope(&c, m, &tmp));
  s->rope = tmp.rope;
  return DF_OK;
}

df_status df_target_spec_from_dir(const char *dir, df_target_spec *spec, df_error *err) {
  memset(spec, 0, sizeof *spec);
  const df_target_config *tc = NULL;
  DF_TRY(df_target_config_from_dir(dir, &tc, err));
  df_status st = spec_from_config(tc, spec, err);
  spec->model_type = df_target_family_name(spec->family);
  df_target_config_free(tc);
  return st;
}
