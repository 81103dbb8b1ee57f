// EAGLE-3 draft configs: SpecForge's LlamaForCausalLMEagle3 (an HF LlamaConfig plus draft_vocab_size, fc_norm,
// norm_output and eagle_config), resolved with SpecForge's defaults (docs/eagle3-step.md §3), and the capture layers
// resolved against the target (§1: model.aux_hidden_state_layer_ids, eagle_config, else [1, L/2 − 1, L − 4]).
// P-EAGLE's PEagleDraftModel (docs/peagle.md) is the same LlamaConfig over num_hidden_layers layers, with
// norm_before_residual and an optional top-level mask_token_id, and neither fc_norm nor an un-normed output.
#include <stdlib.h>
#include <string.h>

#include "base/json_write.h"
#include "modeling/draft_config_internal.h"

#define LLAMA_MAX_POSITIONS 2048 // LlamaConfig's default
#define LLAMA_RMS_NORM_EPS  1e-6
#define LLAMA_INITIALIZER   0.02
#define EAGLE3_MAX_WIDTH    (1 << 20)
#define EAGLE3_MAX_HEADS    4096
#define AUX_KEY             "eagle_config.eagle_aux_hidden_state_layer_ids"

// Keys that would change what SpecForge's LlamaForCausalLMEagle3 computes if ignored: refused, never dropped.
static df_status parse_fixed(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  DF_TRY(df_cj_opt_string(c, root, "", "model_type", "llama", &cfg->model_type));
  DF_TRY(df_cj_opt_string(c, root, "", "hidden_act", "silu", &cfg->hidden_act));
  if (strcmp(cfg->hidden_act, "silu"))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "hidden_act", "the EAGLE-3 MLP is SwiGLU: set \"silu\"",
                      "\"%.64s\" is not supported", cfg->hidden_act);
  int64_t tp = 1;
  DF_TRY(df_cj_opt_int(c, root, "", "pretraining_tp", 1, 1, 1 << 20, &tp));
  if (tp != 1)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "pretraining_tp", "set 1 (or drop the key)",
                      "pretraining_tp %lld slices the projections; SpecForge's EAGLE-3 layer does not", (long long)tp);
  bool mlp_bias = false;
  DF_TRY(df_cj_opt_bool(c, root, "", "mlp_bias", false, &mlp_bias));
  if (mlp_bias)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "mlp_bias", "set false: SpecForge's EAGLE-3 MLP has no biases",
                      "MLP biases are not part of an EAGLE-3 draft");
  double dropout = 0;
  DF_TRY(df_cj_opt_real(c, root, "", "attention_dropout", 0.0, 0.0, false, 1.0, &dropout));
  if (dropout != 0.0)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "attention_dropout", "set 0.0", "attention dropout %g is not implemented",
                      dropout);
  const char *dtype = NULL, *torch_dtype = NULL;
  DF_TRY(df_cj_opt_string(c, root, "", "dtype", NULL, &dtype));
  DF_TRY(df_cj_opt_string(c, root, "", "torch_dtype", NULL, &torch_dtype));
  if (dtype && torch_dtype && strcmp(dtype, torch_dtype))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "torch_dtype", "keep one of dtype / torch_dtype",
                      "\"%.32s\" disagrees with dtype \"%.32s\"", torch_dtype, dtype);
  cfg->torch_dtype = dtype ? dtype : torch_dtype;
  return DF_OK;
}

bool df_draft_is_eagle(const df_draft_config *cfg) {
  return cfg->kind == DF_DRAFT_EAGLE3 || cfg->kind == DF_DRAFT_PEAGLE;
}

// P-EAGLE's own keys: its layers, norm_before_residual, the mask token; EAGLE-3-only keys at their defaults.
static df_status parse_peagle(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  DF_TRY(df_cj_opt_bool(c, root, "", "norm_before_residual", false, &cfg->eagle3.norm_before_residual));
  // the mask token: the top level, else dflash_config.mask_token_id (where SpecForge's resolver looks)
  DF_TRY(df_cj_opt_int(c, root, "", "mask_token_id", -1, -1, cfg->vocab_size - 1, &cfg->dflash.mask_token_id));
  const json_t *dc = df_cj_get(root, "dflash_config");
  if (cfg->dflash.mask_token_id < 0 && json_is_object(dc))
    DF_TRY(df_cj_opt_int(c, dc, "dflash_config", "mask_token_id", -1, -1, cfg->vocab_size - 1,
                         &cfg->dflash.mask_token_id));
  DF_TRY(df_cj_opt_int(c, root, "", "pad_token_id", -1, -1, cfg->vocab_size - 1, &cfg->eagle3.pad_token_id));
  const json_t *rs = df_cj_get(root, "rope_scaling");
  if (rs && !json_is_null(rs))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "rope_scaling", "set null: PEagleDraftModel rotates with rope_theta only",
                      "SpecForge's P-EAGLE draft ignores rope_scaling; training it here would serve another model");
  if (cfg->eagle3.fc_norm)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "fc_norm", "drop the key: PEagleDraftModel has no fc_norm",
                      "fc_norm is an EAGLE 3.1 key; SpecForge's P-EAGLE draft would ignore it");
  if (!cfg->eagle3.norm_output)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "norm_output", "drop the key: P-EAGLE's logits read norm(h)",
                      "norm_output false is an EAGLE-3 key; SpecForge's P-EAGLE draft would ignore it");
  return DF_OK;
}

static df_status parse_sizes(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  DF_TRY(df_cj_opt_int(c, root, "", "num_hidden_layers", 1, 1, DF_DRAFT_MAX_LAYERS, &cfg->num_hidden_layers));
  if (cfg->kind == DF_DRAFT_EAGLE3 && cfg->num_hidden_layers != 1)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "num_hidden_layers", "set 1: SpecForge's EAGLE-3 draft is one midlayer",
                      "%lld layers; EAGLE-3 trains exactly one decoder layer", (long long)cfg->num_hidden_layers);
  DF_TRY(df_cj_req_int(c, root, "", "hidden_size", 1, EAGLE3_MAX_WIDTH, &cfg->hidden_size));
  DF_TRY(df_cj_req_int(c, root, "", "intermediate_size", 1, EAGLE3_MAX_WIDTH, &cfg->intermediate_size));
  DF_TRY(df_cj_req_int(c, root, "", "num_attention_heads", 1, EAGLE3_MAX_HEADS, &cfg->num_attention_heads));
  DF_TRY(df_cj_opt_int(c, root, "", "num_key_value_heads", cfg->num_attention_heads, 1, EAGLE3_MAX_HEADS,
                       &cfg->num_key_value_heads));
  DF_TRY(df_cj_opt_int(c, root, "", "head_dim", cfg->hidden_size / cfg->num_attention_heads, 1, EAGLE3_MAX_WIDTH,
                       &cfg->head_dim));
  DF_TRY(df_cj_req_int(c, root, "", "vocab_size", 1, INT32_MAX, &cfg->vocab_size));
  if (cfg->kind == DF_DRAFT_PEAGLE) // PEagleDraftModel defaults it to vocab_size; LlamaForCausalLMEagle3 requires it
    DF_TRY(df_cj_opt_int(c, root, "", "draft_vocab_size", cfg->vocab_size, 1, cfg->vocab_size,
                         &cfg->eagle3.draft_vocab_size));
  else
    DF_TRY(df_cj_req_int(c, root, "", "draft_vocab_size", 1, cfg->vocab_size, &cfg->eagle3.draft_vocab_size));
  DF_TRY(df_cj_opt_int(c, root, "", "max_position_embeddings", LLAMA_MAX_POSITIONS, 1, INT32_MAX,
                       &cfg->max_position_embeddings));
  DF_TRY(df_cj_opt_real(c, root, "", "rms_norm_eps", LLAMA_RMS_NORM_EPS, 0.0, true, 1.0, &cfg->rms_norm_eps));
  DF_TRY(df_cj_opt_real(c, root, "", "initializer_range", LLAMA_INITIALIZER, 0.0, true, 1e3, &cfg->initializer_range));
  DF_TRY(df_cj_opt_bool(c, root, "", "attention_bias", false, &cfg->attention_bias)); // SpecForge ignores it
  DF_TRY(df_cj_opt_bool(c, root, "", "tie_word_embeddings", false, &cfg->tie_word_embeddings));
  DF_TRY(df_cj_opt_int(c, root, "", "target_hidden_size", cfg->hidden_size, 1, EAGLE3_MAX_WIDTH,
                       &cfg->eagle3.target_hidden_size));
  if (cfg->eagle3.target_hidden_size != cfg->hidden_size)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "target_hidden_size",
                      "train with hidden_size equal to the target's: the draft embeds with the target's frozen table",
                      "%lld differs from hidden_size %lld", (long long)cfg->eagle3.target_hidden_size,
                      (long long)cfg->hidden_size);
  DF_TRY(df_cj_opt_bool(c, root, "", "fc_norm", false, &cfg->eagle3.fc_norm));
  DF_TRY(df_cj_opt_bool(c, root, "", "norm_output", true, &cfg->eagle3.norm_output));
  if (cfg->num_attention_heads % cfg->num_key_value_heads)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "num_key_value_heads",
                      "GQA shares each KV head by a whole number of query heads",
                      "%lld does not divide num_attention_heads %lld", (long long)cfg->num_key_value_heads,
                      (long long)cfg->num_attention_heads);
  if (cfg->head_dim < 2 || cfg->head_dim % 2)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "head_dim", "rotary embeddings rotate pairs: use an even head_dim",
                      "%lld is not an even number >= 2", (long long)cfg->head_dim);
  return DF_OK;
}

// eagle_config: the capture layers (exactly three, SpecForge's rule) and use_aux_hidden_state (true only).
static df_status parse_eagle_config(const df_cj *c, const json_t *root, df_draft_config_owned *o) {
  const json_t *ec = df_cj_get(root, "eagle_config");
  if (!ec) return DF_OK;
  if (!json_is_object(ec))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "eagle_config", "write an object (or drop the key)",
                      "expected an object, got %s", df_cj_type_name(ec));
  bool use_aux = true;
  DF_TRY(df_cj_opt_bool(c, ec, "eagle_config", "use_aux_hidden_state", true, &use_aux));
  if (!use_aux)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "eagle_config.use_aux_hidden_state",
                      "set true: an EAGLE-3 draft reads three captured target layers",
                      "false asks for an EAGLE-1/2 style draft, which is not EAGLE-3");
  const json_t *v = df_cj_get(ec, "eagle_aux_hidden_state_layer_ids");
  if (!v) return DF_OK;
  if (!json_is_array(v) || json_array_size(v) != 3)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, AUX_KEY, "list three target layers, e.g. [1, 17, 32]",
                      "expected an array of three layer ids, got %s",
                      json_is_array(v) ? "another number of entries" : df_cj_type_name(v));
  if (!(o->target_layer_ids = malloc(3 * sizeof(int))))
    return DF_CJ_FAIL(c, DF_ERR_NOMEM, AUX_KEY, NULL, "out of memory");
  for (size_t i = 0; i < 3; i++) {
    char path[DF_CJ_PATH];
    int64_t id = 0;
    DF_TRY(df_cj_int(c, json_array_get(v, i), df_cj_index(path, AUX_KEY, i), 0, DF_DRAFT_MAX_TARGET_LAYERS - 1, &id));
    o->target_layer_ids[i] = (int)id;
  }
  o->pub.dflash.target_layer_ids = o->target_layer_ids;
  o->pub.dflash.num_target_layer_ids = 3;
  return DF_OK;
}

df_status df_draft_parse_eagle3(const df_cj *c, const json_t *root, df_draft_config_owned *o) {
  df_draft_config *cfg = &o->pub;
  cfg->dflash.mask_token_id = -1, cfg->eagle3.pad_token_id = -1;
  DF_TRY(parse_fixed(c, root, cfg));
  DF_TRY(parse_sizes(c, root, cfg));
  if (cfg->kind == DF_DRAFT_PEAGLE) DF_TRY(parse_peagle(c, root, cfg));
  if (!(o->layer_types = calloc((size_t)cfg->num_hidden_layers, sizeof *o->layer_types)))
    return DF_CJ_FAIL(c, DF_ERR_NOMEM, "layer_types", NULL, "out of memory");
  cfg->layer_types = o->layer_types; // full attention everywhere
  DF_TRY(df_draft_parse_rope(c, root, cfg));
  if (cfg->rope.type != DF_ROPE_DEFAULT && cfg->rope.type != DF_ROPE_LINEAR)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "rope_scaling",
                      "train EAGLE-3 drafts with default or linear RoPE (SpecForge's own rotary classes for the other "
                      "types are not reproduced here)",
                      "rope_type %s is not supported for EAGLE-3 drafts", df_rope_type_name(cfg->rope.type));
  return parse_eagle_config(c, root, o);
}

// ---- capture layers ------------------------------------------------------------------------------------------

void df_eagle3_default_aux_layers(int64_t L, int out[3]) {
  out[0] = 1, out[1] = (int)(L / 2 - 1), out[2] = (int)(L - 4);
}

df_status df_draft_config_resolve_capture(const df_draft_config *cfg, int64_t num_target_layers, const int *ids, int n,
                                          const df_draft_config **out, df_error *err) {
  *out = NULL;
  df_cj c = {.source = cfg->source, .err = err};
  if (!df_draft_is_eagle(cfg)) {
    if (n > 0)
      return DF_CJ_FAIL(&c, DF_ERR_INVALID, "model.aux_hidden_state_layer_ids",
                        "drop the recipe key and set dflash_config.target_layer_ids in the draft config",
                        "the recipe's capture layers apply to EAGLE-3 and P-EAGLE drafts only");
    return DF_OK;
  }
  int aux[3];
  const char *from = "model.aux_hidden_state_layer_ids";
  if (n > 0) {
    if (n != 3)
      return DF_CJ_FAIL(&c, DF_ERR_INVALID, from, "list three target layers (or drop the key for the default)",
                        "%d ids; EAGLE-3 reads exactly three target layers", n);
    memcpy(aux, ids, sizeof aux);
  } else if (cfg->dflash.num_target_layer_ids == 3) {
    memcpy(aux, cfg->dflash.target_layer_ids, sizeof aux), from = AUX_KEY;
  } else {
    df_eagle3_default_aux_layers(num_target_layers, aux), from = "the default [1, L/2 - 1, L - 4]";
  }
  for (int i = 0; i < 3; i++)
    if (aux[i] < 0 || aux[i] >= num_target_layers)
      return DF_CJ_FAIL(&c, DF_ERR_INVALID, n > 0 ? from : AUX_KEY,
                        "capture layers are 0-based target decoder layers (id k = hidden_states[k + 1])",
                        "layer %d (from %s) is outside the target's %lld layers", aux[i], from,
                        (long long)num_target_layers);
  json_t *root = json_deep_copy(cfg->json);
  json_t *ec = root ? json_object_get(root, "eagle_config") : NULL;
  if (root && !json_is_object(ec)) json_object_set_new(root, "eagle_config", ec = json_object());
  if (!root || !ec) return json_decref(root), DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  json_object_set_new(ec, "eagle_aux_hidden_state_layer_ids", json_pack("[iii]", aux[0], aux[1], aux[2]));
  char *text = df_json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  df_status st = df_draft_config_from_json(text, strlen(text), cfg->source, out, err);
  free(text);
  return st;
}

df_status df_draft_config_set_bool(const df_draft_config *cfg, const char *key, bool value, const df_draft_config **out,
                                   df_error *err) {
  *out = NULL;
  json_t *root = json_deep_copy(cfg->json);
  if (!root || json_object_set_new(root, key, json_boolean(value)))
    return json_decref(root), DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  char *text = df_json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  df_status st = df_draft_config_from_json(text, strlen(text), cfg->source, out, err);
  free(text);
  return st;
}

// ---- print and parameter count ------------------------------------------------------------------------------

#define ROW "  %-36s "

void df_eagle3_config_print(const df_draft_config *cfg, FILE *fp) {
  fprintf(fp, ROW "%lld\n", "draft_vocab_size", (long long)cfg->eagle3.draft_vocab_size);
  fprintf(fp, ROW "%lld\n", "target_hidden_size", (long long)cfg->eagle3.target_hidden_size);
  if (cfg->kind == DF_DRAFT_PEAGLE) {
    fprintf(fp, ROW "%s\n", "norm_before_residual", cfg->eagle3.norm_before_residual ? "true" : "false");
    if (cfg->dflash.mask_token_id >= 0)
      fprintf(fp, ROW "%lld\n", "mask_token_id", (long long)cfg->dflash.mask_token_id);
    else
      fprintf(fp, ROW "%s\n", "mask_token_id", "from the recipe (model.mask_token_id)");
  } else {
    fprintf(fp, ROW "%s\n", "fc_norm (EAGLE 3.1)", cfg->eagle3.fc_norm ? "true" : "false");
    fprintf(fp, ROW "%s\n", "norm_output", cfg->eagle3.norm_output ? "true" : "false");
  }
  const int *a = cfg->dflash.target_layer_ids;
  if (cfg->dflash.num_target_layer_ids == 3)
    fprintf(fp, ROW "[%d, %d, %d]\n", "capture layers (eagle_config)", a[0], a[1], a[2]);
  else
    fprintf(fp, ROW "%s\n", "capture layers", "from the target: [1, L/2 - 1, L - 4] unless the recipe names them");
}

// fc (3·Ht → H), the midlayer (q/k/v read 2H, o, the MLP, three norms), fc_norm, norm, lm_head (H → D). P-EAGLE adds
// its trained embedding (V·H), mask_hidden (3·Ht) and layers 1 .. L − 1 (q/k/v read H, two norms each).
int64_t df_eagle3_param_count(const df_draft_config *cfg) {
  const int64_t H = cfg->hidden_size, Ht = cfg->eagle3.target_hidden_size, d = cfg->head_dim;
  const int64_t q = cfg->num_attention_heads * d, kv = cfg->num_key_value_heads * d, I = cfg->intermediate_size;
  int64_t n = 3 * Ht * H + 2 * H * (q + 2 * kv) + q * H + 3 * H * I + 3 * H + H + H * cfg->eagle3.draft_vocab_size;
  if (cfg->eagle3.fc_norm) n += 3 * Ht;
  if (cfg->kind == DF_DRAFT_PEAGLE)
    n += cfg->vocab_size * H + 3 * Ht + (cfg->num_hidden_layers - 1) * (H * (q + 2 * kv) + q * H + 3 * H * I + 2 * H);
  return n;
}
