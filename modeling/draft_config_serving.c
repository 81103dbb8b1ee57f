// The draft config as servers read it (modeling/draft_config.h, df_draft_config_resolved_json): every value
// SGLang 0.5.23 and transformers look up is written out as draftforge resolved it, in every place they look,
// so no server falls back to a default of its own (docs/export-and-eval.md "What config.json carries").
#include <math.h>
#include <string.h>

#include "modeling/draft_config_internal.h"

// obj[key] = v (a new reference, stolen). False when out of memory.
static bool put(json_t *obj, const char *key, json_t *v) { return v && json_object_set_new(obj, key, v) == 0; }

// A nested object of root (created when absent); NULL when root[key] is something else.
static json_t *object_at(json_t *root, const char *key) {
  json_t *o = json_object_get(root, key);
  if (json_is_object(o)) return o;
  if (o && !json_is_null(o)) return NULL;
  o = json_object();
  if (json_object_set_new(root, key, o) != 0) return NULL;
  return o;
}

static df_status oom(const df_draft_config *cfg, df_error *err) {
  return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory writing the resolved config");
}

// A key SGLang reads from dflash_config first and the top level second (block_size, num_target_layers): the
// top level gets the value; a dflash_config copy that disagrees is refused, because draftforge trained with the
// top-level value while SGLang would serve the nested one.
static df_status put_top_checked(const df_draft_config *cfg, json_t *root, json_t *dc, const char *key, int64_t v,
                                 df_error *err) {
  json_t *nested = json_object_get(dc, key);
  if (nested && !json_is_null(nested) && !(json_is_integer(nested) && json_integer_value(nested) == v))
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config", "remove dflash_config's copy or make it equal",
                   "%s: dflash_config.%s disagrees with the top-level %s = %lld (draftforge trains with the top "
                   "level; SGLang reads dflash_config first)",
                   cfg->source, key, key, (long long)v);
  if (!put(root, key, json_integer(v))) return oom(cfg, err);
  if (nested && !json_is_null(nested) && !put(dc, key, json_integer(v))) return oom(cfg, err);
  return DF_OK;
}

// A key draftforge resolves into dflash_config; copies at the top level or in dspark_config (which SGLang's
// DSpark parser merges over dflash_config) are overwritten with the same value.
static bool put_method_key(json_t *root, json_t *dc, const char *key, json_t *v) {
  if (!v) return false;
  bool ok = json_object_set(dc, key, v) == 0;
  json_t *ds = json_object_get(root, "dspark_config");
  if (ok && json_object_get(root, key)) ok = json_object_set(root, key, v) == 0;
  if (ok && json_is_object(ds) && json_object_get(ds, key)) ok = json_object_set(ds, key, v) == 0;
  json_decref(v);
  return ok;
}

// A key both the top level and dflash_config carry (v is consumed).
static bool put_both(json_t *root, json_t *dc, const char *key, json_t *v) {
  bool ok = v && json_object_set(root, key, v) == 0;
  return put_method_key(root, dc, key, v) && ok;
}

static json_t *int_list(const int *v, int n) {
  json_t *a = json_array();
  for (int i = 0; a && i < n; i++)
    if (json_array_append_new(a, json_integer(v[i])) != 0) return json_decref(a), NULL;
  return a;
}

// The backbone sizes Qwen3Config would otherwise default (head_dim 128, intermediate_size 22016, ...).
static bool put_backbone(const df_draft_config *cfg, json_t *root) {
  static const char *const names[] = {"full_attention", "sliding_attention"};
  json_t *types = json_array();
  for (int64_t i = 0; types && i < cfg->num_hidden_layers; i++)
    if (json_array_append_new(types, json_string(names[cfg->layer_types[i]])) != 0) types = (json_decref(types), NULL);
  return put(root, "model_type", json_string(cfg->model_type)) &&
         put(root, "num_hidden_layers", json_integer(cfg->num_hidden_layers)) &&
         put(root, "hidden_size", json_integer(cfg->hidden_size)) &&
         put(root, "intermediate_size", json_integer(cfg->intermediate_size)) &&
         put(root, "num_attention_heads", json_integer(cfg->num_attention_heads)) &&
         put(root, "num_key_value_heads", json_integer(cfg->num_key_value_heads)) &&
         put(root, "head_dim", json_integer(cfg->head_dim)) && put(root, "vocab_size", json_integer(cfg->vocab_size)) &&
         put(root, "max_position_embeddings", json_integer(cfg->max_position_embeddings)) &&
         put(root, "rms_norm_eps", json_real(cfg->rms_norm_eps)) &&
         put(root, "attention_bias", json_boolean(cfg->attention_bias)) &&
         put(root, "hidden_act", json_string(cfg->hidden_act)) && put(root, "layer_types", types);
}

// rope_theta + rope_scaling (transformers 4, and SGLang without rope_parameters) and rope_parameters
// (transformers 5, which SGLang reads first) describing the one rotation draftforge built its tables from.
static bool put_rope(const df_draft_config *cfg, json_t *root) {
  json_t *src = json_object_get(root, "rope_parameters");
  if (!json_is_object(src)) src = json_object_get(root, "rope_scaling");
  json_t *scaling = json_is_object(src) ? json_deep_copy(src) : json_object();
  if (!scaling) return false;
  json_object_del(scaling, "rope_theta");
  json_object_del(scaling, "type"); // the legacy spelling; rope_type below says the same
  bool ok = put(scaling, "rope_type", json_string(df_rope_type_name(cfg->rope.type)));
  json_t *params = ok ? json_deep_copy(scaling) : NULL;
  ok = ok && put(params, "rope_theta", json_real(cfg->rope.theta)) && put(root, "rope_parameters", params);
  ok = ok && put(root, "rope_theta", json_real(cfg->rope.theta));
  if (ok && cfg->rope.type == DF_ROPE_DEFAULT) {
    json_decref(scaling);
    return put(root, "rope_scaling", json_null());
  }
  return ok ? put(root, "rope_scaling", scaling) : (json_decref(scaling), false);
}

// SGLang's Qwen3DSparkModel builds its heads from top-level markov_rank / markov_head_type /
// confidence_head_with_markov (the last defaulting to markov_rank > 0, unlike SpecForge's false); its config
// parser reads dflash_config first. Both get the resolved values.
static bool put_dspark(const df_draft_config *cfg, json_t *root, json_t *dc) {
  static const char *const types[] = {"vanilla", "gated", "rnn"};
  const df_dflash_config *d = &cfg->dflash;
  return put_both(root, dc, "markov_rank", json_integer(d->markov_rank)) &&
         put_both(root, dc, "markov_head_type", json_string(types[d->markov_head_type])) &&
         put_both(root, dc, "enable_confidence_head", json_boolean(d->enable_confidence_head)) &&
         put_both(root, dc, "confidence_head_with_markov", json_boolean(d->confidence_head_with_markov)) &&
         put(dc, "projector_type", json_string("dspark"));
}

// Domino: the head's four keys in dflash_config (where DominoDraftModel and SGLang's Domino rollout read them) and
// projector_type "domino", which keeps a DFlashDraftModel-named export a Domino draft.
static bool put_domino(const df_draft_config *cfg, json_t *root, json_t *dc) {
  const df_dflash_config *d = &cfg->dflash;
  return put_method_key(root, dc, "emb_dim", json_integer(d->emb_dim)) &&
         put_method_key(root, dc, "gru_hidden_dim", json_integer(d->gru_hidden_dim)) &&
         put_method_key(root, dc, "pure_draft_prefix_len", json_integer(d->pure_draft_prefix_len)) &&
         put_method_key(root, dc, "shift_label", json_boolean(d->shift_label)) &&
         put(dc, "projector_type", json_string("domino"));
}

// Keys SGLang 0.5.23 reads that select a computation draftforge neither trains nor exports (models/dflash.py,
// dspark.py, speculative/dflash_utils.py): kept verbatim, each would make SGLang serve another model from the same
// tensors. `ok` is the set of values that leave SGLang computing what draftforge trained.
typedef enum { OK_FALSEY, OK_ABSENT_OR_TRUE, OK_ZEROISH, OK_NULL_OR_ONE, OK_ABSENT_OR_NULL } variant_ok;

static const struct {
  bool nested; // "dflash_config.<key>" (else a top-level key)
  bool dspark_only;
  const char *path;
  variant_ok ok;
  const char *what;
} VARIANTS[] = {
    {false, false, "use_gemma_norm", OK_FALSEY, "Gemma RMSNorm (x * (1 + w)) in every norm"},
    {false, false, "rope_is_neox_style", OK_ABSENT_OR_TRUE, "interleaved (GPT-J) rotary pairs"},
    {false, false, "is_neox_style", OK_ABSENT_OR_TRUE, "interleaved (GPT-J) rotary pairs"},
    {false, false, "quantization_config", OK_ABSENT_OR_NULL, "quantized weights"},
    {false, true, "sample_from_anchor", OK_ABSENT_OR_TRUE, "no draft token from the anchor row (gamma + 1 query rows)"},
    {true, false, "dflash_config.conv_kernel_size", OK_ZEROISH, "grouped convolutions in every layer"},
    {true, false, "dflash_config.conv_group_size", OK_ZEROISH, "grouped convolutions in every layer"},
    {true, false, "dflash_config.attention_value_scale", OK_NULL_OR_ONE, "V scaled in every attention"},
    {true, false, "dflash_config.attention_sink_bias", OK_FALSEY, "per-head attention sinks"},
};

static bool variant_is_ok(const json_t *v, variant_ok ok) {
  if (!v) return true;
  switch (ok) {
  case OK_FALSEY: return json_is_null(v) || json_is_false(v);
  case OK_ABSENT_OR_TRUE: return json_is_true(v); // SGLang takes bool(null) = False
  case OK_ZEROISH: return json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 0);
  case OK_NULL_OR_ONE: return json_is_null(v) || (json_is_number(v) && json_number_value(v) == 1.0);
  case OK_ABSENT_OR_NULL: return json_is_null(v);
  }
  return false;
}

int df_draft_config_serving_variants(const json_t *root, bool dspark, const char **keys, const char **whats, int max) {
  const json_t *dc = json_object_get(root, "dflash_config");
  int n = 0;
  for (size_t i = 0; i < sizeof VARIANTS / sizeof *VARIANTS; i++) {
    if (VARIANTS[i].dspark_only && !dspark) continue;
    const char *path = VARIANTS[i].path;
    const json_t *v = VARIANTS[i].nested ? json_object_get(dc, strchr(path, '.') + 1) : json_object_get(root, path);
    if (variant_is_ok(v, VARIANTS[i].ok)) continue;
    if (n < max) keys[n] = path, whats[n] = VARIANTS[i].what;
    n++;
  }
  return n;
}

// EAGLE-3: what SGLang's LlamaForCausalLMEagle3 and vLLM's Eagle3LlamaForCausalLM read, written out: the Llama sizes,
// draft_vocab_size (absent, both would read the target's head), the capture layers in eagle_config (SGLang adds one
// to each: its "before layer k+1" is the output of layer k) and, one higher, at the top level (vLLM reads them there as
// they stand), and every bias / tying switch off (SGLang ties lm_head to
// the embedding when tie_word_embeddings is set; vLLM gives q/k/v a bias when attention_bias is set; SpecForge trains
// neither).
df_status df_eagle3_resolved_json(const df_draft_config *cfg, int64_t mask_token_id, json_t **out, df_error *err) {
  *out = NULL;
  json_t *root = json_deep_copy(cfg->json);
  json_t *ec = root ? object_at(root, "eagle_config") : NULL;
  bool ok = ec != NULL;
  const bool peagle = cfg->kind == DF_DRAFT_PEAGLE;
  ok = ok && put(root, "architectures", json_pack("[s]", peagle ? "PEagleDraftModel" : "LlamaForCausalLMEagle3")) &&
       put(root, "model_type", json_string(cfg->model_type)) &&
       put(root, "num_hidden_layers", json_integer(cfg->num_hidden_layers)) &&
       put(root, "hidden_size", json_integer(cfg->hidden_size)) &&
       put(root, "intermediate_size", json_integer(cfg->intermediate_size)) &&
       put(root, "num_attention_heads", json_integer(cfg->num_attention_heads)) &&
       put(root, "num_key_value_heads", json_integer(cfg->num_key_value_heads)) &&
       put(root, "head_dim", json_integer(cfg->head_dim)) && put(root, "vocab_size", json_integer(cfg->vocab_size)) &&
       put(root, "draft_vocab_size", json_integer(cfg->eagle3.draft_vocab_size)) &&
       put(root, "target_hidden_size", json_integer(cfg->eagle3.target_hidden_size)) &&
       put(root, "max_position_embeddings", json_integer(cfg->max_position_embeddings)) &&
       put(root, "rms_norm_eps", json_real(cfg->rms_norm_eps)) &&
       put(root, "hidden_act", json_string(cfg->hidden_act)) && put(root, "attention_bias", json_false()) &&
       put(root, "mlp_bias", json_false()) && put(root, "tie_word_embeddings", json_false()) && put_rope(cfg, root) &&
       put(ec, "use_aux_hidden_state", json_true());
  if (ok && peagle) { // SpecForge's PEagleDraftModel keys; the run's mask token (else the config's, when it names one)
    const int64_t mask = mask_token_id >= 0 ? mask_token_id : cfg->dflash.mask_token_id;
    ok = put(root, "norm_before_residual", json_boolean(cfg->eagle3.norm_before_residual)) &&
         (mask < 0 || put(root, "mask_token_id", json_integer(mask)));
    json_object_del(root, "fc_norm"), json_object_del(root, "norm_output");
  } else if (ok) {
    ok = put(root, "fc_norm", json_boolean(cfg->eagle3.fc_norm)) &&
         put(root, "norm_output", json_boolean(cfg->eagle3.norm_output));
  }
  if (ok && cfg->dflash.num_target_layer_ids == 3) { // SGLang: output-of-layer ids; vLLM: before-layer ids (+ 1)
    const int *a = cfg->dflash.target_layer_ids, before[3] = {a[0] + 1, a[1] + 1, a[2] + 1};
    ok = put(ec, "eagle_aux_hidden_state_layer_ids", int_list(a, 3)) &&
         put(root, "eagle_aux_hidden_state_layer_ids", int_list(before, 3));
  }
  if (!ok) {
    json_decref(root);
    return oom(cfg, err);
  }
  json_object_del(root, "dflash_config");
  *out = root;
  return DF_OK;
}

df_status df_draft_config_resolved_json(const df_draft_config *cfg, int64_t mask_token_id, json_t **out,
                                        df_error *err) {
  *out = NULL;
  if (df_draft_is_eagle(cfg)) return df_eagle3_resolved_json(cfg, mask_token_id, out, err);
  const char *key = NULL, *what = NULL;
  if (df_draft_config_serving_variants(cfg->json, cfg->kind == DF_DRAFT_DSPARK, &key, &what, 1) > 0)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, key,
                   "remove the key: draftforge trains the plain Qwen3 DFlash / DSpark draft, which SGLang serves "
                   "without it",
                   "%s: %s makes SGLang 0.5.23 serve %s, which draftforge does not train", cfg->source, key, what);
  if (mask_token_id >= cfg->vocab_size)
    return DF_FAIL(err, DF_ERR_INVALID, "mask_token_id", "the mask token must be a row of the target embedding",
                   "%s: mask_token_id %lld is not below vocab_size %lld", cfg->source, (long long)mask_token_id,
                   (long long)cfg->vocab_size);
  json_t *root = json_deep_copy(cfg->json);
  json_t *dc = root ? object_at(root, "dflash_config") : NULL;
  if (!dc) {
    json_decref(root);
    return root ? DF_FAIL(err, DF_ERR_INVALID, "dflash_config", NULL, "%s: dflash_config is not an object", cfg->source)
                : oom(cfg, err);
  }
  df_status st = put_top_checked(cfg, root, dc, "block_size", cfg->block_size, err);
  if (st == DF_OK) st = put_top_checked(cfg, root, dc, "num_target_layers", cfg->num_target_layers, err);
  bool ok = st == DF_OK;
  ok = ok && put_method_key(root, dc, "target_layer_ids",
                            int_list(cfg->dflash.target_layer_ids, cfg->dflash.num_target_layer_ids));
  if (ok && mask_token_id >= 0) ok = put_method_key(root, dc, "mask_token_id", json_integer(mask_token_id));
  ok = ok && put_backbone(cfg, root) && put_rope(cfg, root);
  if (ok && cfg->kind == DF_DRAFT_DSPARK) ok = put_dspark(cfg, root, dc);
  if (ok && cfg->kind == DF_DRAFT_DOMINO) ok = put_domino(cfg, root, dc);
  // Stock SGLang registers DFlashDraftModel and DSparkDraftModel as dense classes, which would skip every expert
  // tensor and serve uninitialised MLPs: an MoE draft names the MoE serving class even in its checkpoints.
  if (ok && cfg->moe)
    ok = put(root, "architectures",
             json_pack("[s]", cfg->kind == DF_DRAFT_DSPARK ? "Qwen3MoeDSparkModel" : "DFlashMoEDraftModel"));
  if (st == DF_OK && !ok) st = oom(cfg, err);
  if (st != DF_OK) {
    json_decref(root);
    return st;
  }
  *out = root;
  return DF_OK;
}
