// Draft config: the document's top level (architecture, sizes, attention layout), lifecycle and accessors.
// Defaults follow HF Qwen3Config, which is the config class SpecForge builds every DFlash-family draft with.
#include "modeling/draft_config.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config_internal.h"
#include "modeling/ffn.h"
#include "modeling/target_config.h"

// Qwen3Config defaults (transformers), used when a key is absent or null.
#define QWEN3_HEAD_DIM       128
#define QWEN3_MAX_POSITIONS  32768
#define QWEN3_MAX_WINDOW     28
#define QWEN3_SLIDING_WINDOW 4096
#define QWEN3_RMS_NORM_EPS   1e-6
#define QWEN3_INITIALIZER    0.02
#define DF_DRAFT_MAX_WIDTH   (1 << 20) // hidden / intermediate / head sizes: far above any real model
#define DF_DRAFT_MAX_HEADS   4096
#define DF_DRAFT_MAX_BLOCK   4096

const char *df_draft_kind_name(df_draft_kind kind) {
  return kind == DF_DRAFT_DSPARK   ? "dspark"
         : kind == DF_DRAFT_DOMINO ? "domino"
         : kind == DF_DRAFT_EAGLE3 ? "eagle3"
         : kind == DF_DRAFT_PEAGLE ? "peagle"
                                   : "dflash";
}

// architectures: exactly one name (SpecForge's rule), mapped to the kind.
static df_status parse_architecture(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  static const char hint[] =
      "use [\"DFlashDraftModel\"], [\"DSparkDraftModel\"], [\"DominoDraftModel\"], [\"LlamaForCausalLMEagle3\"] or "
      "[\"PEagleDraftModel\"]";
  const json_t *a = df_cj_get(root, "architectures");
  if (!a) return DF_CJ_FAIL(c, DF_ERR_INVALID, "architectures", hint, "required key is missing (or null)");
  if (!json_is_array(a) || json_array_size(a) != 1)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "architectures", hint, "expected an array with exactly one name, got %s",
                      json_is_array(a) ? "a different number of entries" : df_cj_type_name(a));
  const char *name = NULL;
  DF_TRY(df_cj_string(c, json_array_get(a, 0), "architectures[0]", &name));
  cfg->architecture = name;
  // DFlashDraftModel with dflash_config.projector_type "domino" (SpecForge's Domino export) becomes a Domino draft
  // when dflash_config is read (draft_config_dflash.c).
  if (!strcmp(name, "DFlashDraftModel")) {
    cfg->kind = DF_DRAFT_DFLASH;
    return DF_OK;
  }
  if (!strcmp(name, "DominoDraftModel")) {
    cfg->kind = DF_DRAFT_DOMINO;
    return DF_OK;
  }
  // SpecForge's and SGLang's EAGLE-3 class; vLLM's name for the same checkpoint layout.
  // With parallel_drafting true the same class is a P-EAGLE draft (vLLM serves it so; draftforge's P-EAGLE export).
  if (!strcmp(name, "LlamaForCausalLMEagle3") || !strcmp(name, "Eagle3LlamaForCausalLM")) {
    bool parallel = false;
    DF_TRY(df_cj_opt_bool(c, root, "", "parallel_drafting", false, &parallel));
    cfg->kind = parallel ? DF_DRAFT_PEAGLE : DF_DRAFT_EAGLE3;
    return DF_OK;
  }
  if (!strcmp(name, "PEagleDraftModel")) { // SpecForge's P-EAGLE class (algorithms/peagle)
    cfg->kind = DF_DRAFT_PEAGLE;
    return DF_OK;
  }
  // DSparkDraftModel is SpecForge's training class; Qwen3DSparkModel is the name its exporter writes for SGLang.
  if (!strcmp(name, "DSparkDraftModel") || !strcmp(name, "Qwen3DSparkModel")) {
    cfg->kind = DF_DRAFT_DSPARK;
    return DF_OK;
  }
  // An MoE draft trains as its dense class plus moe_preset; the *Moe* names are the serving classes an MoE
  // export names (train/export/export.c), read back as their training class when the config names a moe_preset.
  const bool has_preset = df_cj_get(root, "moe_preset") != NULL;
  if (has_preset && !strcmp(name, "DFlashMoEDraftModel")) {
    cfg->kind = DF_DRAFT_DFLASH; // a Domino MoE export reads back through projector_type "domino"
    return DF_OK;
  }
  if (has_preset && (!strcmp(name, "Qwen3MoeDSparkModel") || !strcmp(name, "Qwen3MoEDSparkModel"))) {
    cfg->kind = DF_DRAFT_DSPARK;
    return DF_OK;
  }
  if (strstr(name, "Moe") || strstr(name, "MoE"))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "architectures[0]",
                      "train an MoE draft as [\"DFlashDraftModel\"], [\"DSparkDraftModel\"] or [\"DominoDraftModel\"] "
                      "with \"moe_preset\"",
                      "%.64s is a serving class, not a training architecture", name);
  return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "architectures[0]", hint, "unknown draft architecture \"%.64s\"", name);
}

// Keys that would change the computation if draftforge silently ignored them.
static df_status parse_fixed_choices(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  DF_TRY(df_cj_opt_string(c, root, "", "model_type", "qwen3", &cfg->model_type));
  if (strcmp(cfg->model_type, "qwen3"))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "model_type", "DFlash-family drafts are Qwen3 decoder stacks: \"qwen3\"",
                      "\"%.64s\" is not supported", cfg->model_type);
  DF_TRY(df_cj_opt_string(c, root, "", "hidden_act", "silu", &cfg->hidden_act));
  if (strcmp(cfg->hidden_act, "silu"))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "hidden_act", "the draft MLP is SwiGLU: set \"silu\"",
                      "\"%.64s\" is not supported", cfg->hidden_act);
  double dropout = 0;
  DF_TRY(df_cj_opt_real(c, root, "", "attention_dropout", 0.0, 0.0, false, 1.0, &dropout));
  if (dropout != 0.0)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "attention_dropout", "set 0.0 (every SpecForge draft config does)",
                      "attention dropout %g is not implemented", dropout);
  const char *dtype = NULL, *torch_dtype = NULL;
  DF_TRY(df_cj_opt_string(c, root, "", "dtype", NULL, &dtype));
  DF_TRY(df_cj_opt_string(c, root, "", "torch_dtype", NULL, &torch_dtype));
  if (dtype && torch_dtype && strcmp(dtype, torch_dtype))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "torch_dtype", "keep one of dtype / torch_dtype",
                      "\"%.32s\" disagrees with dtype \"%.32s\"", torch_dtype, dtype);
  cfg->torch_dtype = dtype ? dtype : torch_dtype;
  return DF_OK;
}

static df_status parse_sizes(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  DF_TRY(df_cj_req_int(c, root, "", "block_size", 2, DF_DRAFT_MAX_BLOCK, &cfg->block_size));
  DF_TRY(df_cj_req_int(c, root, "", "num_target_layers", 1, DF_DRAFT_MAX_TARGET_LAYERS, &cfg->num_target_layers));
  DF_TRY(df_cj_req_int(c, root, "", "num_hidden_layers", 1, DF_DRAFT_MAX_LAYERS, &cfg->num_hidden_layers));
  DF_TRY(df_cj_req_int(c, root, "", "hidden_size", 1, DF_DRAFT_MAX_WIDTH, &cfg->hidden_size));
  DF_TRY(df_cj_req_int(c, root, "", "intermediate_size", 1, DF_DRAFT_MAX_WIDTH, &cfg->intermediate_size));
  DF_TRY(df_cj_req_int(c, root, "", "num_attention_heads", 1, DF_DRAFT_MAX_HEADS, &cfg->num_attention_heads));
  DF_TRY(df_cj_opt_int(c, root, "", "num_key_value_heads", cfg->num_attention_heads, 1, DF_DRAFT_MAX_HEADS,
                       &cfg->num_key_value_heads));
  DF_TRY(df_cj_opt_int(c, root, "", "head_dim", QWEN3_HEAD_DIM, 2, DF_DRAFT_MAX_WIDTH, &cfg->head_dim));
  DF_TRY(df_cj_req_int(c, root, "", "vocab_size", 1, INT32_MAX, &cfg->vocab_size));
  DF_TRY(df_cj_opt_int(c, root, "", "max_position_embeddings", QWEN3_MAX_POSITIONS, 1, INT32_MAX,
                       &cfg->max_position_embeddings));
  DF_TRY(df_cj_opt_real(c, root, "", "rms_norm_eps", QWEN3_RMS_NORM_EPS, 0.0, true, 1.0, &cfg->rms_norm_eps));
  DF_TRY(df_cj_opt_real(c, root, "", "initializer_range", QWEN3_INITIALIZER, 0.0, true, 1e3, &cfg->initializer_range));
  DF_TRY(df_cj_opt_bool(c, root, "", "attention_bias", false, &cfg->attention_bias));
  DF_TRY(df_cj_opt_bool(c, root, "", "tie_word_embeddings", false, &cfg->tie_word_embeddings));
  // The fc input is K * hidden_size: a different target width is a different model (EAGLE-style key).
  int64_t target_hidden = 0;
  DF_TRY(df_cj_opt_int(c, root, "", "target_hidden_size", cfg->hidden_size, 1, DF_DRAFT_MAX_WIDTH, &target_hidden));
  if (target_hidden != cfg->hidden_size)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "target_hidden_size", "DFlash-family drafts share the target's width",
                      "%lld differs from hidden_size %lld", (long long)target_hidden, (long long)cfg->hidden_size);
  return DF_OK;
}

static df_status check_heads(const df_cj *c, const df_draft_config *cfg) {
  if (cfg->num_attention_heads % cfg->num_key_value_heads)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "num_key_value_heads",
                      "GQA shares each KV head by a whole number of query heads",
                      "%lld does not divide num_attention_heads %lld", (long long)cfg->num_key_value_heads,
                      (long long)cfg->num_attention_heads);
  if (cfg->head_dim % 2)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "head_dim", "rotary embeddings rotate pairs: use an even head_dim",
                      "%lld is odd", (long long)cfg->head_dim);
  return DF_OK;
}

// HF Qwen3Config: without layer_types, layer i slides iff a window is in force and i >= max_window_layers.
static void default_layer_types(const df_draft_config *cfg, int64_t window, df_layer_type *out) {
  for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
    out[i] = window > 0 && i >= cfg->max_window_layers ? DF_LAYER_SLIDING_ATTENTION : DF_LAYER_FULL_ATTENTION;
}

static df_status parse_layer_type_list(const df_cj *c, const json_t *lt, df_draft_config_owned *o) {
  static const char *const names[] = {"full_attention", "sliding_attention"};
  const df_draft_config *cfg = &o->pub;
  if (!json_is_array(lt))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "layer_types", "write a list of \"full_attention\" / \"sliding_attention\"",
                      "expected an array, got %s", df_cj_type_name(lt));
  if ((int64_t)json_array_size(lt) != cfg->num_hidden_layers)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "layer_types", "give one entry per draft layer",
                      "has %zu entries, but num_hidden_layers is %lld", json_array_size(lt),
                      (long long)cfg->num_hidden_layers);
  for (int64_t i = 0; i < cfg->num_hidden_layers; i++) {
    char path[DF_CJ_PATH];
    int t = 0;
    const json_t *v = json_array_get(lt, (size_t)i);
    df_cj_index(path, "layer_types", (size_t)i);
    if (json_is_string(v)) {
      t = !strcmp(json_string_value(v), names[0]) ? 0 : !strcmp(json_string_value(v), names[1]) ? 1 : -1;
      if (t < 0)
        return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use \"full_attention\" or \"sliding_attention\"",
                          "unknown layer type \"%.64s\"", json_string_value(v));
    } else {
      DF_TRY(df_cj_enum(c, v, path, names, 2, &t)); // reports the wrong JSON type
    }
    o->layer_types[i] = (df_layer_type)t;
  }
  return DF_OK;
}

// use_sliding_window / sliding_window / max_window_layers / layer_types, resolved as Qwen3Config does, then
// SpecForge's rule: a sliding layer needs use_sliding_window = true and a positive window.
static df_status parse_layers(const df_cj *c, const json_t *root, df_draft_config_owned *o) {
  df_draft_config *cfg = &o->pub;
  DF_TRY(df_cj_opt_bool(c, root, "", "use_sliding_window", false, &cfg->use_sliding_window));
  DF_TRY(df_cj_opt_int(c, root, "", "max_window_layers", QWEN3_MAX_WINDOW, 0, INT32_MAX, &cfg->max_window_layers));
  int64_t window = 0;
  const json_t *w = json_object_get(root, "sliding_window");
  if (!w) window = QWEN3_SLIDING_WINDOW; // absent takes the class default; explicit null means none
  if (w && !json_is_null(w)) DF_TRY(df_cj_int(c, w, "sliding_window", 1, INT32_MAX, &window));
  if (!cfg->use_sliding_window) window = 0; // Qwen3Config drops the window unless use_sliding_window
  o->layer_types = malloc((size_t)cfg->num_hidden_layers * sizeof *o->layer_types);
  if (!o->layer_types) return DF_CJ_FAIL(c, DF_ERR_NOMEM, "layer_types", NULL, "out of memory");
  cfg->layer_types = o->layer_types;
  const json_t *lt = df_cj_get(root, "layer_types");
  if (lt) DF_TRY(parse_layer_type_list(c, lt, o));
  if (!lt) default_layer_types(cfg, window, o->layer_types);
  bool any_sliding = false;
  for (int64_t i = 0; i < cfg->num_hidden_layers; i++) any_sliding |= o->layer_types[i] == DF_LAYER_SLIDING_ATTENTION;
  cfg->sliding_window = any_sliding ? window : 0;
  if (!any_sliding) return DF_OK;
  if (!cfg->use_sliding_window)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "use_sliding_window", "set \"use_sliding_window\": true and a sliding_window",
                      "layer_types has sliding_attention layers, but use_sliding_window is false");
  if (window <= 0)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "sliding_window", "set \"sliding_window\" to the window length, e.g. 2048",
                      "layer_types has sliding_attention layers, but the window is null");
  return DF_OK;
}

static df_status build(const df_cj *c, json_t *root, df_draft_config_owned *o) {
  df_draft_config *cfg = &o->pub;
  cfg->json = root;
  DF_TRY(parse_architecture(c, root, cfg));
  if (df_draft_is_eagle(cfg)) return df_draft_parse_eagle3(c, root, o);
  DF_TRY(parse_fixed_choices(c, root, cfg));
  DF_TRY(parse_sizes(c, root, cfg));
  DF_TRY(check_heads(c, cfg));
  DF_TRY(parse_layers(c, root, o));
  DF_TRY(df_draft_parse_rope(c, root, cfg));
  DF_TRY(df_draft_parse_dflash(c, root, o));
  return df_draft_parse_ffn_kind(c, root, o);
}

static df_status build_owner(const df_cj *c, json_t *root, void *owner) {
  df_draft_config_owned *o = owner;
  o->pub.source = o->doc.source;
  return build(c, root, o);
}

static void free_owner(void *owner) { df_draft_config_free(owner); }

static const df_cj_kind DRAFT = {.size = sizeof(df_draft_config_owned),
                                 .doc_offset = offsetof(df_draft_config_owned, doc),
                                 .build = build_owner,
                                 .free = free_owner};

// Takes ownership of root (NULL when loading failed with st).
static df_status finish(json_t *root, df_status st, const char *source, const df_draft_config **out, df_error *err) {
  void *o;
  DF_TRY(df_cj_finish(&DRAFT, root, st, source, &o, err));
  *out = &((df_draft_config_owned *)o)->pub;
  return DF_OK;
}

df_status df_draft_config_from_file(const char *path, const df_draft_config **out, df_error *err) {
  json_t *root = NULL;
  df_status st = df_cj_load_file(path, &root, err);
  return finish(root, st, path, out, err);
}

df_status df_draft_config_from_json(const char *text, size_t len, const char *name, const df_draft_config **out,
                                    df_error *err) {
  json_t *root = NULL;
  if (!name) name = "<json>";
  if (!text) text = "", len = 0;
  df_status st = df_cj_load_buffer(text, len, name, &root, err);
  return finish(root, st, name, out, err);
}

void df_draft_config_free(const df_draft_config *cfg) {
  if (!cfg) return;
  df_draft_config_owned *o = (df_draft_config_owned *)cfg; // the public struct is the owner's first member
  if (o->ffn_cfg) o->pub.ffn_kind->config_free(o->ffn_cfg);
  json_decref(o->doc.root);
  free(o->doc.source);
  free(o->layer_types);
  free(o->target_layer_ids);
  free(o);
}

const json_t *df_draft_config_get(const df_draft_config *cfg, const char *key) {
  return json_object_get(cfg->json, key);
}

bool df_draft_config_layer_is_sliding(const df_draft_config *cfg, int64_t layer) {
  return layer >= 0 && layer < cfg->num_hidden_layers && cfg->layer_types[layer] == DF_LAYER_SLIDING_ATTENTION;
}

df_status df_draft_config_check_target(const df_draft_config *cfg, const df_target_config *t, df_error *err) {
  df_cj c = {.source = cfg->source, .err = err};
  if (df_draft_is_eagle(cfg) && cfg->dflash.num_target_layer_ids != 3)
    return DF_CJ_FAIL(&c, DF_ERR_INVALID, "eagle_config.eagle_aux_hidden_state_layer_ids",
                      "resolve the capture layers against the target first (df_draft_config_resolve_capture)",
                      "the EAGLE-3 capture layers are not resolved");
  if (cfg->hidden_size != t->hidden_size)
    return DF_CJ_FAIL(&c, DF_ERR_INVALID, "hidden_size", "the draft's hidden_size must equal the target's",
                      "%lld, but the target %s has hidden_size %lld", (long long)cfg->hidden_size, t->source,
                      (long long)t->hidden_size);
  if (cfg->vocab_size != t->vocab_size)
    return DF_CJ_FAIL(
        &c, DF_ERR_INVALID, "vocab_size", "the draft uses the target's embedding and lm_head: copy its vocab_size",
        "%lld, but the target %s has vocab_size %lld", (long long)cfg->vocab_size, t->source, (long long)t->vocab_size);
  if (!df_draft_is_eagle(cfg) && cfg->num_target_layers != t->num_hidden_layers)
    return DF_CJ_FAIL(&c, DF_ERR_INVALID, "num_target_layers", "set it to the target's num_hidden_layers",
                      "%lld, but the target %s has %lld decoder layers", (long long)cfg->num_target_layers, t->source,
                      (long long)t->num_hidden_layers);
  for (int i = 0; i < cfg->dflash.num_target_layer_ids; i++) {
    char path[DF_CJ_PATH];
    if (cfg->dflash.target_layer_ids[i] >= t->num_hidden_layers)
      return DF_CJ_FAIL(&c, DF_ERR_INVALID, df_cj_index(path, "dflash_config.target_layer_ids", (size_t)i),
                        "pick layers of the target (0-based)", "layer %d, but the target %s has %lld layers",
                        cfg->dflash.target_layer_ids[i], t->source, (long long)t->num_hidden_layers);
  }
  return DF_OK;
}
