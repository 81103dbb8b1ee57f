// `draftforge inspect EXPORT` (train/export/inspect_export.h): the config keys SGLang 0.5.23 reads from a draft
// directory, resolved the way its loaders and transformers' Qwen3Config resolve them, set against what
// draftforge built the draft with (df_draft_config of the same file). The tensor check is in
// inspect_export_tensors.c. Sources: sglang/srt/models/{dflash,dspark}.py, speculative/dflash_utils.py,
// speculative/dspark_components/dspark_config.py, configs/model_config.py, arg_groups/speculative_hook.py.
#include "train/export/inspect_export.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "modeling/draft_config.h"

void df_serve_line(df_serve_log *log, const char *level, const char *fmt, ...) {
  if (!strcmp(level, "PROBLEM")) log->problems++;
  if (!strcmp(level, "NOTE")) log->notes++;
  fprintf(log->out, "  %-8s ", level);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(log->out, fmt, ap);
  va_end(ap);
  fputc('\n', log->out);
}

static const struct {
  const char *name;
  df_serve_class cls;
  const char *where;
} CLASSES[] = {
    {"DFlashDraftModel", DF_SERVE_DENSE_DFLASH, "stock SGLang (models/dflash.py)"},
    {"Qwen3DSparkModel", DF_SERVE_DENSE_DSPARK, "stock SGLang (models/dspark.py)"},
    {"DSparkDraftModel", DF_SERVE_DENSE_DSPARK, "stock SGLang (models/dspark.py; SpecForge's training name)"},
    {"LingDSparkModel", DF_SERVE_DENSE_DSPARK, "stock SGLang (models/dspark.py)"},
    {"DFlashMoEDraftModel", DF_SERVE_MOE_DFLASH, "NOT in stock SGLang 0.5.23: needs SGLANG_EXTERNAL_MODEL_PACKAGE"},
    {"Qwen3MoeDSparkModel", DF_SERVE_MOE_DSPARK, "NOT in stock SGLang 0.5.23: needs SGLANG_EXTERNAL_MODEL_PACKAGE"},
    {"Qwen3MoEDSparkModel", DF_SERVE_MOE_DSPARK, "NOT in stock SGLang 0.5.23: needs SGLANG_EXTERNAL_MODEL_PACKAGE"},
};
enum { NCLASSES = sizeof CLASSES / sizeof CLASSES[0] };

static int class_index(const json_t *root) {
  const char *a = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
  for (int i = 0; a && i < NCLASSES; i++)
    if (!strcmp(a, CLASSES[i].name)) return i;
  return -1;
}

static bool is_eagle3(const json_t *root) {
  const char *a = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
  return a && (!strcmp(a, "LlamaForCausalLMEagle3") || !strcmp(a, "Eagle3LlamaForCausalLM") ||
               !strcmp(a, "PEagleDraftModel")); // SpecForge's P-EAGLE checkpoints (their layout is vLLM's)
}

bool df_inspect_is_draft_dir(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_t *root = json_load_file(path, 0, NULL);
  bool yes = root && (class_index(root) >= 0 || is_eagle3(root));
  json_decref(root);
  return yes;
}

// ---- key reads -------------------------------------------------------------------------------------------

typedef struct {
  json_t *root, *dc;
  const df_draft_config *cfg; // draftforge's reading of the same file (NULL when it does not parse)
  df_serve_log *log;
} reader;

// dflash_config first, then the top level (parse_dflash_draft_config's rule); *src names where it was found.
static json_t *nested_then_top(const reader *r, const char *key, const char **src) {
  json_t *v = r->dc ? json_object_get(r->dc, key) : NULL;
  *src = "dflash_config";
  if (v && !json_is_null(v)) return v;
  *src = "top level";
  v = json_object_get(r->root, key);
  return v && !json_is_null(v) ? v : NULL;
}

// A top-level integer as Qwen3Config gives it: the file's value or the class default.
static int64_t qwen3_int(const reader *r, const char *key, int64_t def, bool *present) {
  json_t *v = json_object_get(r->root, key);
  *present = json_is_integer(v);
  return *present ? json_integer_value(v) : def;
}

static void int_key(const reader *r, const char *key, int64_t def, int64_t want) {
  bool present;
  int64_t v = qwen3_int(r, key, def, &present);
  if (v == want)
    df_serve_line(r->log, "ok", "%-30s %-12lld %s", key, (long long)v, present ? "top level" : "Qwen3Config default");
  else
    df_serve_line(r->log, "PROBLEM", "%-30s %-12lld %s; draftforge built the draft with %lld", key, (long long)v,
                  present ? "top level" : "absent: Qwen3Config's default", (long long)want);
}

static void backbone_keys(const reader *r, df_serve_shape *s) {
  const df_draft_config *c = r->cfg;
  bool p;
  s->H = qwen3_int(r, "hidden_size", 4096, &p), s->n = qwen3_int(r, "num_hidden_layers", 32, &p);
  s->nh = qwen3_int(r, "num_attention_heads", 32, &p), s->nkv = qwen3_int(r, "num_key_value_heads", s->nh, &p);
  s->hd = qwen3_int(r, "head_dim", 128, &p), s->I = qwen3_int(r, "intermediate_size", 22016, &p);
  s->V = qwen3_int(r, "vocab_size", 151936, &p);
  s->attention_bias = json_is_true(json_object_get(r->root, "attention_bias"));
  if (!c) return;
  int_key(r, "hidden_size", 4096, c->hidden_size);
  int_key(r, "intermediate_size", 22016, c->intermediate_size);
  int_key(r, "num_hidden_layers", 32, c->num_hidden_layers);
  int_key(r, "num_attention_heads", 32, c->num_attention_heads);
  int_key(r, "num_key_value_heads", s->nh, c->num_key_value_heads);
  int_key(r, "head_dim", 128, c->head_dim);
  int_key(r, "vocab_size", 151936, c->vocab_size);
  int_key(r, "max_position_embeddings", 32768, c->max_position_embeddings);
  json_t *eps = json_object_get(r->root, "rms_norm_eps");
  double e = json_is_number(eps) ? json_number_value(eps) : 1e-6;
  df_serve_line(r->log, e == c->rms_norm_eps ? "ok" : "PROBLEM", "%-30s %-12g %s", "rms_norm_eps", e,
                eps ? "top level" : "Qwen3Config default");
  const char *act = json_string_value(json_object_get(r->root, "hidden_act"));
  df_serve_line(r->log, !act || !strcmp(act, "silu") ? "ok" : "PROBLEM", "%-30s %-12s %s", "hidden_act",
                act ? act : "silu", act ? "top level" : "Qwen3Config default");
}

// layer_types as transformers builds them; a sliding layer without use_sliding_window loses its window
// (Qwen3Config sets sliding_window to None) and SGLang's DFlash then refuses the config.
static void layer_keys(const reader *r) {
  json_t *lt = json_object_get(r->root, "layer_types");
  bool use = json_is_true(json_object_get(r->root, "use_sliding_window"));
  json_t *w = json_object_get(r->root, "sliding_window");
  int64_t window = use ? (json_is_integer(w) ? json_integer_value(w) : json_is_null(w) ? 0 : 4096) : 0;
  int64_t mwl = json_is_integer(json_object_get(r->root, "max_window_layers"))
                    ? json_integer_value(json_object_get(r->root, "max_window_layers"))
                    : 28;
  int sliding = 0, mismatch = 0;
  for (int64_t i = 0; r->cfg && i < r->cfg->num_hidden_layers; i++) {
    const char *t = json_is_array(lt) ? json_string_value(json_array_get(lt, (size_t)i)) : NULL;
    bool s = t ? !strcmp(t, "sliding_attention") : (window > 0 && i >= mwl);
    sliding += s;
    mismatch += s != df_draft_config_layer_is_sliding(r->cfg, i);
  }
  if (mismatch)
    df_serve_line(r->log, "PROBLEM", "%-30s %d layer(s) slide differently than draftforge trained them", "layer_types",
                  mismatch);
  else
    df_serve_line(r->log, "ok", "%-30s %d sliding layer(s)%s", "layer_types", sliding,
                  json_is_array(lt) ? "" : " (Qwen3Config's rule: no layer_types in the file)");
  if (sliding && window <= 0)
    df_serve_line(r->log, "PROBLEM",
                  "%-30s null: SGLang raises \"sliding_attention layers require "
                  "config.sliding_window\" (set use_sliding_window and sliding_window)",
                  "sliding_window");
  else if (sliding)
    df_serve_line(r->log, r->cfg && window == r->cfg->sliding_window ? "ok" : "PROBLEM", "%-30s %-12lld",
                  "sliding_window", (long long)window);
}

// One RoPE dict as a stack reads it: type, base, factor, pre-extension length (0: absent).
typedef struct {
  char type[16];
  double theta, factor;
  int64_t orig;
} rope_view;

static rope_view rope_of(const json_t *d, double theta_fallback) {
  rope_view v = {"default", theta_fallback, 1.0, 0};
  const char *t = json_string_value(json_object_get(d, "rope_type"));
  if (!t) t = json_string_value(json_object_get(d, "type"));
  if (t) snprintf(v.type, sizeof v.type, "%s", t);
  json_t *th = json_object_get(d, "rope_theta"), *f = json_object_get(d, "factor");
  json_t *o = json_object_get(d, "original_max_position_embeddings");
  if (json_is_number(th)) v.theta = json_number_value(th);
  if (json_is_number(f) && strcmp(v.type, "default")) v.factor = json_number_value(f);
  if (json_is_integer(o)) v.orig = json_integer_value(o);
  return v;
}

static bool same_rope(const rope_view *a, const rope_view *b) {
  return !strcmp(a->type, b->type) && a->theta == b->theta && a->factor == b->factor && a->orig == b->orig;
}

// SGLang on transformers 5: rope_scaling wins over rope_parameters (convert_rope_params_to_dict), rope_theta
// fills in; transformers 4: rope_theta + rope_scaling only. Both must describe draftforge's rotation.
static void rope_keys(const reader *r) {
  json_t *top_theta = json_object_get(r->root, "rope_theta");
  double theta = json_is_number(top_theta) ? json_number_value(top_theta) : 10000.0;
  json_t *scaling = json_object_get(r->root, "rope_scaling"), *params = json_object_get(r->root, "rope_parameters");
  bool use_scaling = json_is_object(scaling) && json_object_size(scaling) > 0;
  rope_view v5 = rope_of(use_scaling ? scaling : params, theta),
            v4 = rope_of(json_is_object(scaling) ? scaling : NULL, theta);
  if (!r->cfg) return;
  rope_view want = {"", r->cfg->rope.theta, r->cfg->rope.factor, r->cfg->rope.original_max_position_embeddings};
  snprintf(want.type, sizeof want.type, "%s", df_rope_type_name(r->cfg->rope.type));
  bool ok5 = same_rope(&v5, &want), ok4 = same_rope(&v4, &want);
  df_serve_line(r->log, ok5 ? "ok" : "PROBLEM", "%-30s %s theta %g factor %g (SGLang, transformers 5)", "rope", v5.type,
                v5.theta, v5.factor);
  df_serve_line(r->log, ok4 ? "ok" : "PROBLEM",
                "%-30s %s theta %g factor %g (transformers 4: rope_theta + rope_scaling)%s", "rope", v4.type, v4.theta,
                v4.factor, ok4 ? "" : "; mirror rope_parameters into rope_scaling");
  const json_t *d = use_scaling ? scaling : params;
  if (!strcmp(v5.type, "yarn") && json_object_get(d, "attention_factor"))
    df_serve_line(r->log, "NOTE", "%-30s SGLang's YaRN ignores attention_factor (it reads attn_factor / mscale)",
                  "rope.attention_factor");
}

// ---- DFlash-family keys ----------------------------------------------------------------------------------

// Keys that make SGLang build another computation than draftforge trained (df_draft_config_serving_variants).
static void variant_keys(const reader *r, bool dspark) {
  const char *keys[16], *whats[16];
  int n = df_draft_config_serving_variants(r->root, dspark, keys, whats, 16);
  for (int i = 0; i < n && i < 16; i++)
    df_serve_line(r->log, "PROBLEM", "%-30s set: SGLang would serve %s, which draftforge does not train", keys[i],
                  whats[i]);
}

static void block_and_layers(const reader *r, df_serve_shape *s, bool dspark, int64_t *bs_out) {
  const char *src;
  json_t *bs = nested_then_top(r, "block_size", &src);
  *bs_out = json_is_integer(bs) ? json_integer_value(bs) : 0;
  if (!bs)
    df_serve_line(r->log, "PROBLEM", "%-30s absent: %s", "block_size",
                  dspark ? "SGLang's DSpark cannot resolve gamma" : "SGLang's DFlash defaults to 16");
  else
    df_serve_line(r->log, r->cfg && *bs_out != r->cfg->block_size ? "PROBLEM" : "ok", "%-30s %-12lld %s%s",
                  "block_size", (long long)*bs_out, src, dspark ? " (gamma; verify window gamma + 1)" : "");
  json_t *ids = nested_then_top(r, "target_layer_ids", &src);
  s->K = json_is_array(ids) ? (int64_t)json_array_size(ids) : s->n;
  if (!ids) {
    df_serve_line(r->log, "PROBLEM",
                  "%-30s absent: SGLang picks capture layers from the runtime target's layer "
                  "count instead of the layers the draft was trained on",
                  "target_layer_ids");
    return;
  }
  bool same = r->cfg && (int64_t)json_array_size(ids) == r->cfg->dflash.num_target_layer_ids;
  for (size_t i = 0; same && i < json_array_size(ids); i++)
    same = json_integer_value(json_array_get(ids, i)) == r->cfg->dflash.target_layer_ids[i];
  char *text = json_dumps(ids, JSON_COMPACT);
  df_serve_line(r->log, same || !r->cfg ? "ok" : "PROBLEM", "%-30s %-12s %s", "target_layer_ids", text ? text : "?",
                src);
  free(text);
}

static void mask_key(const reader *r, bool dspark) {
  const char *src = "dspark_config";
  json_t *ds = json_object_get(r->root, "dspark_config");
  json_t *v = json_is_object(ds) ? json_object_get(ds, "mask_token_id") : NULL;
  if (!v) v = nested_then_top(r, "mask_token_id", &src);
  if (!json_is_integer(v)) {
    df_serve_line(r->log, "PROBLEM", "%-30s absent: %s", "mask_token_id",
                  dspark ? "SGLang's DSpark refuses to load (\"requires mask_token_id\")"
                         : "SGLang's DFlash uses the target tokenizer's <|MASK|> id, not the trained one");
    return;
  }
  df_serve_line(r->log, "ok", "%-30s %-12lld %s", "mask_token_id", (long long)json_integer_value(v), src);
  const char *tok = json_string_value(json_object_get(r->dc, "mask_token"));
  if (!dspark)
    df_serve_line(r->log, "NOTE",
                  "%-30s %s: SGLang's DFlash refuses the id if the target tokenizer has this token "
                  "under another id",
                  "mask_token", tok ? tok : "<|MASK|> (default)");
}

// parse_dspark_draft_config reads dflash_config first; build_markov_head and build_confidence_head read the
// top level (markov_head_type defaulting to vanilla, confidence_head_with_markov to markov_rank > 0).
static void dspark_keys(const reader *r, df_serve_shape *s) {
  static const char *const types[] = {"vanilla", "gated", "rnn"};
  const char *src;
  json_t *nested = nested_then_top(r, "markov_rank", &src), *top = json_object_get(r->root, "markov_rank");
  s->markov_rank = json_is_integer(top) ? json_integer_value(top) : 0;
  if (s->markov_rank <= 0)
    df_serve_line(r->log, "PROBLEM",
                  "%-30s %s: SGLang builds the Markov head from the top-level value and needs it > 0", "markov_rank",
                  top ? "not a positive integer" : "absent at the top level");
  else if (!json_equal(nested, top))
    df_serve_line(r->log, "PROBLEM", "%-30s top level %lld disagrees with dflash_config", "markov_rank",
                  (long long)s->markov_rank);
  else
    df_serve_line(r->log, "ok", "%-30s %-12lld top level and dflash_config", "markov_rank", (long long)s->markov_rank);
  const char *tt = json_string_value(json_object_get(r->root, "markov_head_type"));
  const char *nt = json_string_value(nested_then_top(r, "markov_head_type", &src));
  s->markov_type = 0;
  for (int i = 0; tt && i < 3; i++)
    if (!strcasecmp(tt, types[i])) s->markov_type = i;
  if (!nt || (tt ? strcasecmp(tt, nt) : strcasecmp(nt, "vanilla")))
    df_serve_line(r->log, "PROBLEM", "%-30s head built as %s (top level%s), the config parser reads %s",
                  "markov_head_type", tt ? tt : "vanilla", tt ? "" : " absent: default", nt ? nt : "nothing");
  else
    df_serve_line(r->log, "ok", "%-30s %-12s top level and dflash_config", "markov_head_type", tt ? tt : nt);
  json_t *cwm = json_object_get(r->root, "confidence_head_with_markov");
  s->conf_with_markov = cwm ? json_is_true(cwm) : s->markov_rank > 0;
  bool want = r->cfg ? r->cfg->dflash.confidence_head_with_markov : s->conf_with_markov;
  df_serve_line(r->log, s->conf_with_markov == want ? "ok" : "PROBLEM", "%-30s %-12s %s", "confidence_head_with_markov",
                s->conf_with_markov ? "true" : "false",
                cwm ? "top level" : "absent: SGLang's default markov_rank > 0 (SpecForge's is false)");
  json_t *ech = json_object_get(r->root, "enable_confidence_head");
  df_serve_line(r->log, "ok",
                "%-30s %-12s not read by SGLang: the ragged-verify mode decides (static: no head; "
                "cap-accept / compact: the head, whose tensors must be there)",
                "enable_confidence_head", ech ? (json_is_true(ech) ? "true" : "false") : "absent");
  static const char *const prefixed[] = {"dspark_block_size",     "dspark_markov_rank",      "dspark_markov_head_type",
                                         "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_config"};
  for (size_t i = 0; i < sizeof prefixed / sizeof *prefixed; i++)
    if (json_object_get(r->root, prefixed[i]))
      df_serve_line(r->log, "NOTE", "%-30s present: SGLang's DSpark parser prefers it over dflash_config", prefixed[i]);
}

// Domino (dflash_config.projector_type "domino", SpecForge's export of a DominoDraftModel): the GRU head's keys as
// draftforge built the draft, and who can serve it. SGLang 0.5.23's DFlashDraftModel has no Domino head: it skips
// prefix_gru.* / embed_proj.* and proposes the base argmax (a plain DFlash draft from the same backbone). SGLang's
// DFlash V2 worker runs Domino's causal rollout since sgl-project/sglang#36899 (merged 2026-08-28; CUDA, TP 1,
// greedy, validated on the public block-16, shift_label, pure_draft_prefix_len 1 checkpoint).
static void domino_keys(const reader *r, df_serve_shape *s) {
  static const char *const keys[] = {"emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label"};
  const df_dflash_config *d = r->cfg ? &r->cfg->dflash : NULL;
  const int64_t want[] = {d ? d->emb_dim : -1, d ? d->gru_hidden_dim : -1, d ? d->pure_draft_prefix_len : -1,
                          d ? d->shift_label : -1};
  for (int i = 0; i < 4; i++) {
    json_t *v = r->dc ? json_object_get(r->dc, keys[i]) : NULL;
    const bool ok = v && (json_is_integer(v) || json_is_boolean(v));
    const int64_t got = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
    if (i == 0) s->domino_E = got;
    if (i == 1) s->domino_G = got;
    if (!ok)
      df_serve_line(r->log, "PROBLEM", "%-30s absent from dflash_config: a Domino loader has no default for it",
                    keys[i]);
    else if (json_is_boolean(v))
      df_serve_line(r->log, !d || got == want[i] ? "ok" : "PROBLEM", "%-30s %-12s dflash_config", keys[i],
                    got ? "true" : "false");
    else
      df_serve_line(r->log, !d || got == want[i] ? "ok" : "PROBLEM", "%-30s %-12lld dflash_config", keys[i],
                    (long long)got);
  }
  df_serve_line(r->log, "NOTE",
                "%-30s domino: SGLang 0.5.23 skips prefix_gru.* / embed_proj.* and serves the base DFlash argmax; "
                "the GRU rollout needs SGLang with sgl-project/sglang#36899 (DFlash V2, CUDA, TP 1, greedy)",
                "projector_type");
  if (d && (!d->shift_label || d->pure_draft_prefix_len != 1))
    df_serve_line(r->log, "NOTE",
                  "%-30s shift_label %s, pure_draft_prefix_len %lld: SGLang's Domino rollout was validated with true "
                  "and 1 (SpecForge's configs); other settings are unverified there",
                  "shift_label", d->shift_label ? "true" : "false", (long long)d->pure_draft_prefix_len);
  s->domino = true;
}

static void moe_keys(const reader *r, df_serve_shape *s) {
  json_t *e = json_object_get(r->root, "num_experts");
  if (!e) e = json_object_get(r->root, "n_routed_experts");
  bool p;
  s->E = json_is_integer(e) ? json_integer_value(e) : 0;
  s->k = qwen3_int(r, "num_experts_per_tok", 0, &p);
  s->moe_I = qwen3_int(r, "moe_intermediate_size", 0, &p);
  s->shared = qwen3_int(r, "n_shared_experts", 0, &p);
  s->shared_I = qwen3_int(r, "shared_expert_intermediate_size", 0, &p);
  s->router_bias = json_is_true(json_object_get(r->root, "moe_router_bias"));
  if (r->dc && json_object_get(r->dc, "moe_router_center"))
    df_serve_line(r->log, "PROBLEM",
                  "%-30s present: an export carries the centering folded into gate.bias; naming it "
                  "too asks for the shift twice",
                  "moe_router_center");
  df_serve_line(r->log, s->E > 0 && s->k >= 1 && s->k <= s->E && s->moe_I > 0 ? "ok" : "PROBLEM",
                "%-30s %lld experts, top-%lld, width %lld, %lld shared (width %lld), router bias %s", "moe",
                (long long)s->E, (long long)s->k, (long long)s->moe_I, (long long)s->shared, (long long)s->shared_I,
                s->router_bias ? "yes" : "no");
}

// ---- the report ------------------------------------------------------------------------------------------

static void launch_lines(const reader *r, const char *dir, df_serve_class cls, int64_t bs) {
  bool dspark = cls == DF_SERVE_DENSE_DSPARK || cls == DF_SERVE_MOE_DSPARK;
  bool moe = cls == DF_SERVE_MOE_DFLASH || cls == DF_SERVE_MOE_DSPARK;
  const char *dt = json_string_value(json_object_get(r->root, "dtype"));
  if (!dt) dt = json_string_value(json_object_get(r->root, "torch_dtype"));
  if (dt && !strcmp(dt, "float32"))
    df_serve_line(r->log, "NOTE",
                  "%-30s float32: SGLang's --dtype auto serves a float32 config as float16; launch "
                  "with --dtype bfloat16 (or export bfloat16)",
                  "torch_dtype");
  fprintf(r->log->out,
          "launch:\n  %spython -m sglang.launch_server --model-path TARGET --speculative-algorithm %s "
          "--speculative-draft-model-path %s --speculative-num-draft-tokens %lld%s\n",
          moe ? "SGLANG_EXTERNAL_MODEL_PACKAGE=YOUR_PACKAGE " : "", dspark ? "DSPARK" : "DFLASH", dir,
          (long long)(dspark ? bs + 1 : bs), dt && !strcmp(dt, "float32") ? " --dtype bfloat16" : "");
}

static df_status report(reader *r, const char *dir, int ci, df_error *err) {
  df_serve_shape s = {.cls = CLASSES[ci].cls};
  bool dspark = s.cls == DF_SERVE_DENSE_DSPARK || s.cls == DF_SERVE_MOE_DSPARK;
  fprintf(r->log->out, "serving (SGLang 0.5.23): %s\n  class    %s: %s, --speculative-algorithm %s\n", dir,
          CLASSES[ci].name, CLASSES[ci].where, dspark ? "DSPARK" : "DFLASH");
  if (s.cls == DF_SERVE_MOE_DFLASH || s.cls == DF_SERVE_MOE_DSPARK)
    df_serve_line(r->log, "NOTE", "%-30s an external model package must provide %s (docs/export-and-eval.md)",
                  "architectures", CLASSES[ci].name);
  backbone_keys(r, &s);
  layer_keys(r);
  rope_keys(r);
  variant_keys(r, dspark);
  int64_t bs = 0;
  block_and_layers(r, &s, dspark, &bs);
  mask_key(r, dspark);
  if (dspark) dspark_keys(r, &s);
  const char *src;
  const char *projector = json_string_value(nested_then_top(r, "projector_type", &src));
  if (!dspark && projector && !strcmp(projector, "domino")) domino_keys(r, &s);
  if (s.cls == DF_SERVE_MOE_DFLASH || s.cls == DF_SERVE_MOE_DSPARK) moe_keys(r, &s);
  DF_TRY(df_inspect_export_tensors(dir, &s, r->log, err));
  launch_lines(r, dir, s.cls, bs);
  fprintf(r->log->out, "serving: %d problem(s), %d note(s)\n", r->log->problems, r->log->notes);
  return DF_OK;
}

df_status df_inspect_export(const char *dir, FILE *out, int *problems, df_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  if (!root) return DF_FAIL(err, DF_ERR_FORMAT, path, "fix the JSON", "%s:%d: %s", path, jerr.line, jerr.text);
  if (is_eagle3(root)) {
    df_status st = df_inspect_eagle3_export(dir, root, out, problems, err);
    json_decref(root);
    return st;
  }
  int ci = class_index(root);
  df_serve_log log = {.out = out};
  reader r = {root, json_object_get(root, "dflash_config"), NULL, &log};
  if (!json_is_object(r.dc)) r.dc = NULL;
  df_error perr = {0};
  df_status st = DF_OK;
  if (ci < 0)
    st = DF_FAIL(err, DF_ERR_INVALID, path, "export the checkpoint with draftforge export",
                 "architectures[0] is not a DFlash-family serving class");
  else if (df_draft_config_from_file(path, &r.cfg, &perr) != DF_OK)
    fprintf(out, "serving: draftforge cannot read %s (%s); its keys are shown as SGLang reads them only\n", path,
            perr.msg);
  if (st == DF_OK) st = report(&r, dir, ci, err);
  *problems = log.problems;
  df_draft_config_free(r.cfg);
  json_decref(root);
  return st;
}
