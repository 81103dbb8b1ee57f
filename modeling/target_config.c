// Target config.json: only the keys draftforge reads are validated; MoE and vision keys of the target are
// fine (the target runs elsewhere or through its own forward). Absent keys take HF Qwen3Config's defaults.
#include "modeling/target_config.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/config_json.h"

#define TARGET_MAX_WIDTH  (1 << 20)
#define TARGET_MAX_LAYERS 8192
#define TARGET_MAX_HEADS  4096

typedef struct {
  df_target_config pub; // first, so the public pointer is the owner's
  df_cj_doc doc;        // the parsed document and the source name (pub.source)
} target_owned;

// The text model's keys: text_config when the target is multimodal (Qwen3.5/3.6), else the top level.
static df_status text_object(const df_cj *c, const json_t *root, const json_t **m, const char **prefix) {
  const json_t *tc = df_cj_get(root, "text_config");
  if (tc && !json_is_object(tc))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "text_config", "a multimodal config nests the text model as an object",
                      "expected an object, got %s", df_cj_type_name(tc));
  *m = tc ? tc : root;
  *prefix = tc ? "text_config" : "";
  return DF_OK;
}

static df_status parse_heads(const df_cj *c, const json_t *m, const char *px, df_target_config *t) {
  char path[DF_CJ_PATH];
  DF_TRY(df_cj_req_int(c, m, px, "num_attention_heads", 1, TARGET_MAX_HEADS, &t->num_attention_heads));
  DF_TRY(df_cj_opt_int(c, m, px, "num_key_value_heads", t->num_attention_heads, 1, TARGET_MAX_HEADS,
                       &t->num_key_value_heads));
  if (t->num_attention_heads % t->num_key_value_heads)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, px, "num_key_value_heads"),
                      "GQA shares each KV head by a whole number of query heads",
                      "%lld does not divide num_attention_heads %lld", (long long)t->num_key_value_heads,
                      (long long)t->num_attention_heads);
  // Qwen3Config (and Qwen3-MoE) default head_dim to 128; other HF models fall back to H / nH.
  const char *mt = "";
  DF_TRY(df_cj_opt_string(c, m, px, "model_type", t->model_type, &mt));
  int64_t def = !strcmp(mt, "qwen3") || !strcmp(mt, "qwen3_moe") ? 128 : t->hidden_size / t->num_attention_heads;
  if (def < 1) def = 1;
  return df_cj_opt_int(c, m, px, "head_dim", def, 1, TARGET_MAX_WIDTH, &t->head_dim);
}

// rope_theta at the text level, or inside rope_parameters (transformers 5); copies must agree.
static df_status parse_rope_theta(const df_cj *c, const json_t *m, const char *px, df_target_config *t) {
  char path[DF_CJ_PATH], ppath[DF_CJ_PATH];
  double top = NAN, inner = NAN;
  if (df_cj_get(m, "rope_theta")) DF_TRY(df_cj_opt_real(c, m, px, "rope_theta", 0, 0.0, true, INFINITY, &top));
  const json_t *rp = df_cj_get(m, "rope_parameters");
  df_cj_path(ppath, px, "rope_parameters");
  if (rp && !json_is_object(rp))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, ppath, "write an object such as {\"rope_type\": \"default\", ...}",
                      "expected an object or null, got %s", df_cj_type_name(rp));
  if (rp && df_cj_get(rp, "rope_theta"))
    DF_TRY(df_cj_opt_real(c, rp, ppath, "rope_theta", 0, 0.0, true, INFINITY, &inner));
  if (!isnan(top) && !isnan(inner) && top != inner)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, ppath, "rope_theta"), "keep one rope_theta",
                      "%g disagrees with rope_theta %g", inner, top);
  t->rope_theta = !isnan(top) ? top : !isnan(inner) ? inner : 10000.0;
  return DF_OK;
}

// tie_word_embeddings: the top level first (SpecForge reads it from the outer config), then text_config.
// Absent means false: Qwen3Config sets tie_word_embeddings=False (PretrainedConfig's own default is True).
static df_status parse_lm_head(const df_cj *c, const json_t *root, const json_t *m, const char *px,
                               df_target_config *t) {
  bool in_top = df_cj_get(root, "tie_word_embeddings") != NULL;
  DF_TRY(df_cj_opt_bool(c, in_top ? root : m, in_top ? "" : px, "tie_word_embeddings", false, &t->tie_word_embeddings));
  bool in_text = df_cj_get(m, "logits_mup_width_multiplier") != NULL;
  const json_t *src = in_text ? m : root;
  const char *spx = in_text ? px : "";
  char path[DF_CJ_PATH];
  df_cj_path(path, spx, "logits_mup_width_multiplier");
  t->has_logits_mup = df_cj_get(src, "logits_mup_width_multiplier") != NULL;
  DF_TRY(df_cj_opt_real(c, src, spx, "logits_mup_width_multiplier", 1.0, 0.0, true, INFINITY,
                        &t->logits_mup_width_multiplier));
  if (t->has_logits_mup && t->tie_word_embeddings)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, path,
                      "dividing lm_head would also scale the tied embedding; untie the target or drop the key",
                      "cannot fold logits_mup_width_multiplier into a tied embedding/LM head");
  return DF_OK;
}

static df_status parse(const df_cj *c, json_t *root, df_target_config *t) {
  const json_t *m = NULL;
  const char *px = "";
  t->json = root;
  DF_TRY(df_cj_opt_string(c, root, "", "model_type", "", &t->model_type));
  DF_TRY(text_object(c, root, &m, &px));
  t->text_config = m != root;
  DF_TRY(df_cj_req_int(c, m, px, "hidden_size", 1, TARGET_MAX_WIDTH, &t->hidden_size));
  DF_TRY(df_cj_req_int(c, m, px, "num_hidden_layers", 1, TARGET_MAX_LAYERS, &t->num_hidden_layers));
  if (df_cj_get(m, "padded_vocab_size"))
    DF_TRY(df_cj_req_int(c, m, px, "padded_vocab_size", 1, INT32_MAX, &t->vocab_size));
  else
    DF_TRY(df_cj_req_int(c, m, px, "vocab_size", 1, INT32_MAX, &t->vocab_size));
  DF_TRY(parse_heads(c, m, px, t));
  DF_TRY(df_cj_opt_int(c, m, px, "intermediate_size", 0, 0, TARGET_MAX_WIDTH, &t->intermediate_size));
  DF_TRY(df_cj_opt_real(c, m, px, "rms_norm_eps", 1e-6, 0.0, true, 1.0, &t->rms_norm_eps));
  DF_TRY(df_cj_opt_int(c, m, px, "max_position_embeddings", 32768, 1, INT32_MAX, &t->max_position_embeddings));
  DF_TRY(parse_rope_theta(c, m, px, t));
  return parse_lm_head(c, root, m, px, t);
}

static df_status build_owner(const df_cj *c, json_t *root, void *owner) {
  target_owned *o = owner;
  o->pub.source = o->doc.source;
  return parse(c, root, &o->pub);
}

static void free_owner(void *owner) { df_target_config_free(owner); }

static const df_cj_kind TARGET = {
    .size = sizeof(target_owned), .doc_offset = offsetof(target_owned, doc), .build = build_owner, .free = free_owner};

static df_status finish(json_t *root, df_status st, const char *source, const df_target_config **out, df_error *err) {
  void *o;
  DF_TRY(df_cj_finish(&TARGET, root, st, source, &o, err));
  *out = &((target_owned *)o)->pub;
  return DF_OK;
}

df_status df_target_config_from_file(const char *path, const df_target_config **out, df_error *err) {
  json_t *root = NULL;
  df_status st = df_cj_load_file(path, &root, err);
  return finish(root, st, path, out, err);
}

df_status df_target_config_from_dir(const char *dir, const df_target_config **out, df_error *err) {
  size_t n = strlen(dir);
  char *path = malloc(n + sizeof "/config.json");
  if (!path) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "%s: out of memory", dir);
  snprintf(path, n + sizeof "/config.json", "%s%sconfig.json", dir, n && dir[n - 1] == '/' ? "" : "/");
  df_status st = df_target_config_from_file(path, out, err);
  free(path);
  return st;
}

df_status df_target_config_from_json(const char *text, size_t len, const char *name, const df_target_config **out,
                                     df_error *err) {
  json_t *root = NULL;
  if (!name) name = "<json>";
  if (!text) text = "", len = 0;
  df_status st = df_cj_load_buffer(text, len, name, &root, err);
  return finish(root, st, name, out, err);
}

void df_target_config_free(const df_target_config *cfg) {
  if (!cfg) return;
  target_owned *o = (target_owned *)cfg;
  json_decref(o->doc.root);
  free(o->doc.source);
  free(o);
}

void df_target_config_print(const df_target_config *t, FILE *fp) {
  fprintf(fp, "target config %s%s\n", t->source, t->text_config ? " (text_config)" : "");
  fprintf(fp, "  model_type                  %s\n", t->model_type[0] ? t->model_type : "(absent)");
  fprintf(fp, "  hidden_size                 %lld\n", (long long)t->hidden_size);
  fprintf(fp, "  num_hidden_layers           %lld\n", (long long)t->num_hidden_layers);
  fprintf(fp, "  vocab_size                  %lld\n", (long long)t->vocab_size);
  fprintf(fp, "  num_attention_heads         %lld\n", (long long)t->num_attention_heads);
  fprintf(fp, "  num_key_value_heads         %lld\n", (long long)t->num_key_value_heads);
  fprintf(fp, "  head_dim                    %lld\n", (long long)t->head_dim);
  fprintf(fp, "  intermediate_size           %lld\n", (long long)t->intermediate_size);
  fprintf(fp, "  rms_norm_eps                %g\n", t->rms_norm_eps);
  fprintf(fp, "  rope_theta                  %g\n", t->rope_theta);
  fprintf(fp, "  max_position_embeddings     %lld\n", (long long)t->max_position_embeddings);
  fprintf(fp, "  tie_word_embeddings         %s\n", t->tie_word_embeddings ? "true" : "false");
  if (t->has_logits_mup) fprintf(fp, "  logits_mup_width_multiplier %g\n", t->logits_mup_width_multiplier);
}
