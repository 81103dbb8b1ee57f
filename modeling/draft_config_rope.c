// RoPE keys of a draft config: rope_theta, rope_scaling (transformers 4) and rope_parameters (transformers 5,
// which carries rope_theta inside). SpecForge's exporter keeps both spellings in sync, so both may appear.
#include <math.h>
#include <string.h>

#include "modeling/draft_config_internal.h"

static const char *const ROPE_TYPE_NAMES[] = {"default", "linear", "yarn", "llama3"};
enum { ROPE_NUM_TYPES = 4 };
static const double ROPE_DEFAULT_THETA = 10000.0; // Qwen3Config's default rope_theta

const char *df_rope_type_name(df_rope_type type) {
  return (unsigned)type < ROPE_NUM_TYPES ? ROPE_TYPE_NAMES[type] : "?";
}

// Keys a rope dict of this type may carry; anything else (mrope_section, short_factor, ...) would change the
// rotation in a way draftforge does not implement, so it is refused rather than ignored.
static bool rope_key_allowed(df_rope_type t, const char *key) {
  static const char *const common[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  static const char *const yarn[] = {"factor", "attention_factor", "beta_fast", "beta_slow",
                                     "mscale", "mscale_all_dim",   "truncate",  "original_max_position_embeddings"};
  static const char *const llama3[] = {"factor", "original_max_position_embeddings", "low_freq_factor",
                                       "high_freq_factor"};
  for (size_t i = 0; i < sizeof common / sizeof *common; i++)
    if (!strcmp(key, common[i])) return true;
  switch (t) {
  case DF_ROPE_DEFAULT: return false;
  case DF_ROPE_LINEAR: return !strcmp(key, "factor");
  case DF_ROPE_YARN:
    for (size_t i = 0; i < sizeof yarn / sizeof *yarn; i++)
      if (!strcmp(key, yarn[i])) return true;
    return false;
  case DF_ROPE_LLAMA3:
    for (size_t i = 0; i < sizeof llama3 / sizeof *llama3; i++)
      if (!strcmp(key, llama3[i])) return true;
    return false;
  }
  return false;
}

// rope_type, or its legacy spelling "type"; both present must agree. Absent means "default" only when the
// dict carries no scaling keys.
static df_status rope_dict_type(const df_cj *c, const json_t *d, const char *prefix, df_rope_type *out) {
  char path[DF_CJ_PATH];
  json_t *rt = df_cj_get(d, "rope_type"), *ty = df_cj_get(d, "type");
  if (rt && ty && !json_equal(rt, ty))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, "type"), "keep only \"rope_type\"",
                      "disagrees with %s.rope_type", prefix);
  json_t *v = rt ? rt : ty;
  if (!v) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)d, key, val) {
      if (!json_is_null(val) && strcmp(key, "rope_theta") && strcmp(key, "partial_rotary_factor"))
        return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, "rope_type"),
                          "add \"rope_type\": \"default\" | \"linear\" | \"yarn\" | \"llama3\"",
                          "missing, but the dict sets \"%s\"", key);
    }
    *out = DF_ROPE_DEFAULT;
    return DF_OK;
  }
  df_cj_path(path, prefix, rt ? "rope_type" : "type");
  const char *name = NULL;
  DF_TRY(df_cj_string(c, v, path, &name));
  for (int i = 0; i < ROPE_NUM_TYPES; i++)
    if (!strcmp(name, ROPE_TYPE_NAMES[i])) {
      *out = (df_rope_type)i;
      return DF_OK;
    }
  return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, path,
                    "draftforge builds default, linear, yarn and llama3 RoPE; dynamic/ntk/longrope/mrope are not "
                    "implemented",
                    "rope type \"%.64s\" is not supported by draftforge", name);
}

static df_status rope_dict_keys(const df_cj *c, const json_t *d, const char *prefix, df_rope_type t) {
  char path[DF_CJ_PATH];
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)d, key, val) {
    if (json_is_null(val) || rope_key_allowed(t, key)) continue;
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, key),
                      "remove the key, or pick the rope_type that takes it",
                      "not a parameter of rope type \"%s\"; draftforge would not apply it", df_rope_type_name(t));
  }
  double prf = 0;
  DF_TRY(df_cj_opt_real(c, d, prefix, "partial_rotary_factor", 1.0, 0.0, true, 1.0, &prf));
  if (prf != 1.0)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, df_cj_path(path, prefix, "partial_rotary_factor"),
                      "draftforge rotates the whole head_dim; remove the key or set it to 1.0",
                      "partial rotary embeddings (%g) are not supported", prf);
  return DF_OK;
}

static df_status rope_dict_yarn(const df_cj *c, const json_t *d, const char *prefix, df_rope_config *r) {
  char path[DF_CJ_PATH];
  r->has_attention_factor = df_cj_get(d, "attention_factor") != NULL;
  DF_TRY(df_cj_opt_real(c, d, prefix, "attention_factor", 0.0, 0.0, true, INFINITY, &r->attention_factor));
  DF_TRY(df_cj_opt_real(c, d, prefix, "beta_fast", 32.0, 0.0, true, INFINITY, &r->beta_fast));
  DF_TRY(df_cj_opt_real(c, d, prefix, "beta_slow", 1.0, 0.0, true, INFINITY, &r->beta_slow));
  if (r->beta_fast < r->beta_slow)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, "beta_fast"),
                      "beta_fast bounds the high-frequency end and must be >= beta_slow (defaults 32 and 1)",
                      "%g is below beta_slow %g", r->beta_fast, r->beta_slow);
  DF_TRY(df_cj_opt_real(c, d, prefix, "mscale", 0.0, 0.0, false, INFINITY, &r->mscale));
  DF_TRY(df_cj_opt_real(c, d, prefix, "mscale_all_dim", 0.0, 0.0, false, INFINITY, &r->mscale_all_dim));
  DF_TRY(df_cj_opt_bool(c, d, prefix, "truncate", true, &r->truncate));
  return df_cj_opt_int(c, d, prefix, "original_max_position_embeddings", 0, 1, INT32_MAX,
                       &r->original_max_position_embeddings);
}

static df_status rope_dict_llama3(const df_cj *c, const json_t *d, const char *prefix, df_rope_config *r) {
  char path[DF_CJ_PATH];
  DF_TRY(df_cj_req_int(c, d, prefix, "original_max_position_embeddings", 1, INT32_MAX,
                       &r->original_max_position_embeddings));
  if (r->original_max_position_embeddings >= r->max_position_embeddings)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, "original_max_position_embeddings"),
                      "the pre-extension length must be below max_position_embeddings",
                      "%lld is not below max_position_embeddings %lld", (long long)r->original_max_position_embeddings,
                      (long long)r->max_position_embeddings);
  const json_t *lo = df_cj_get(d, "low_freq_factor"), *hi = df_cj_get(d, "high_freq_factor");
  if (!lo || !hi)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, prefix, lo ? "high_freq_factor" : "low_freq_factor"),
                      "llama3 RoPE needs factor, original_max_position_embeddings, low_freq_factor and "
                      "high_freq_factor",
                      "required key is missing");
  DF_TRY(df_cj_real(c, lo, df_cj_path(path, prefix, "low_freq_factor"), 0.0, true, INFINITY, &r->low_freq_factor));
  DF_TRY(df_cj_real(c, hi, df_cj_path(path, prefix, "high_freq_factor"), 0.0, true, INFINITY, &r->high_freq_factor));
  if (r->high_freq_factor <= r->low_freq_factor)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "high_freq_factor must exceed low_freq_factor (Llama 3.1 uses 4 and 1)",
                      "%g is not above low_freq_factor %g", r->high_freq_factor, r->low_freq_factor);
  return DF_OK;
}

// One rope dict; *theta is its rope_theta (NAN when it has none).
static df_status rope_dict(const df_cj *c, const json_t *d, const char *prefix, df_rope_config *r, double *theta) {
  char path[DF_CJ_PATH];
  if (!json_is_object(d))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, prefix, "write null or an object such as {\"rope_type\": \"yarn\", ...}",
                      "expected an object or null, got %s", df_cj_type_name(d));
  DF_TRY(rope_dict_type(c, d, prefix, &r->type));
  DF_TRY(rope_dict_keys(c, d, prefix, r->type));
  *theta = NAN;
  if (df_cj_get(d, "rope_theta")) DF_TRY(df_cj_opt_real(c, d, prefix, "rope_theta", 0, 1.0, true, INFINITY, theta));
  r->factor = 1.0;
  if (r->type == DF_ROPE_DEFAULT) return DF_OK;
  const json_t *f = df_cj_get(d, "factor");
  df_cj_path(path, prefix, "factor");
  if (!f)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "scaled RoPE needs its factor, e.g. \"factor\": 4.0",
                      "required for rope type \"%s\"", df_rope_type_name(r->type));
  DF_TRY(df_cj_real(c, f, path, 1.0, false, INFINITY, &r->factor));
  if (r->type == DF_ROPE_YARN) return rope_dict_yarn(c, d, prefix, r);
  if (r->type == DF_ROPE_LLAMA3) return rope_dict_llama3(c, d, prefix, r);
  return DF_OK;
}

static bool rope_same_scaling(const df_rope_config *a, const df_rope_config *b) {
  return a->type == b->type && a->factor == b->factor && a->has_attention_factor == b->has_attention_factor &&
         a->attention_factor == b->attention_factor && a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
         a->mscale == b->mscale && a->mscale_all_dim == b->mscale_all_dim && a->truncate == b->truncate &&
         a->original_max_position_embeddings == b->original_max_position_embeddings &&
         a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor;
}

// rope_theta may be given at the top level and inside either dict; every copy must agree.
static df_status rope_theta(const df_cj *c, const json_t *root, double t_scaling, double t_params, double *out) {
  double top = NAN;
  if (df_cj_get(root, "rope_theta")) DF_TRY(df_cj_opt_real(c, root, "", "rope_theta", 0, 1.0, true, INFINITY, &top));
  const double copies[3] = {top, t_params, t_scaling};
  const char *names[3] = {"rope_theta", "rope_parameters.rope_theta", "rope_scaling.rope_theta"};
  int first = -1;
  for (int i = 0; i < 3; i++) {
    if (isnan(copies[i])) continue;
    if (first < 0)
      first = i;
    else if (copies[i] != copies[first])
      return DF_CJ_FAIL(c, DF_ERR_INVALID, names[i], "keep one rope_theta, or make the copies equal",
                        "%g disagrees with %s = %g", copies[i], names[first], copies[first]);
  }
  *out = first < 0 ? ROPE_DEFAULT_THETA : copies[first];
  return DF_OK;
}

df_status df_draft_parse_rope(const df_cj *c, const json_t *root, df_draft_config *cfg) {
  const df_rope_config base = {.type = DF_ROPE_DEFAULT,
                               .head_dim = cfg->head_dim,
                               .max_position_embeddings = cfg->max_position_embeddings,
                               .factor = 1.0,
                               .beta_fast = 32.0,
                               .beta_slow = 1.0,
                               .truncate = true};
  df_rope_config rs = base, rp = base;
  double t_scaling = NAN, t_params = NAN;
  const json_t *scaling = df_cj_get(root, "rope_scaling"), *params = df_cj_get(root, "rope_parameters");
  if (scaling) DF_TRY(rope_dict(c, scaling, "rope_scaling", &rs, &t_scaling));
  if (params) DF_TRY(rope_dict(c, params, "rope_parameters", &rp, &t_params));
  if (scaling && params && !rope_same_scaling(&rs, &rp))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "rope_parameters",
                      "keep one of rope_scaling / rope_parameters, or make them equal",
                      "describes a different rotation (%s) than rope_scaling (%s)", df_rope_type_name(rp.type),
                      df_rope_type_name(rs.type));
  double prf = 0;
  DF_TRY(df_cj_opt_real(c, root, "", "partial_rotary_factor", 1.0, 0.0, true, 1.0, &prf));
  if (prf != 1.0)
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "partial_rotary_factor",
                      "draftforge rotates the whole head_dim; remove the key or set it to 1.0",
                      "partial rotary embeddings (%g) are not supported", prf);
  cfg->rope = params ? rp : rs;
  return rope_theta(c, root, t_scaling, t_params, &cfg->rope.theta);
}
