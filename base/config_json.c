#include "base/config_json.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *df_cj_path(char buf[DF_CJ_PATH], const char *prefix, const char *key) {
  if (prefix && prefix[0])
    snprintf(buf, DF_CJ_PATH, "%s.%s", prefix, key);
  else
    snprintf(buf, DF_CJ_PATH, "%s", key);
  return buf;
}

const char *df_cj_index(char buf[DF_CJ_PATH], const char *prefix, size_t i) {
  snprintf(buf, DF_CJ_PATH, "%s[%zu]", prefix, i);
  return buf;
}

df_status df_cj_fail_at(const df_cj *c, df_status st, const char *src_file, int src_line, const char *path,
                        const char *hint, const char *fmt, ...) {
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return df_fail(c->err, st, src_file, src_line, path, hint, "%s: %s: %s", c->source, path, what);
}

df_status df_cj_load_buffer(const char *text, size_t len, const char *name, json_t **out, df_error *err) {
  *out = NULL;
  json_error_t jerr;
  // Duplicate keys would let the second silently win in Python; here they are an error.
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    char where[64];
    snprintf(where, sizeof where, "line %d, column %d", jerr.line, jerr.column);
    return DF_FAIL(err, DF_ERR_FORMAT, where, "fix the JSON syntax at that position (a validator such as `jq .` helps)",
                   "%s:%d:%d: JSON syntax error: %s", name, jerr.line, jerr.column, jerr.text);
  }
  if (!json_is_object(root)) {
    df_status st = DF_FAIL(err, DF_ERR_FORMAT, name, "a config file is one JSON object: { \"key\": value, ... }",
                           "%s: the document is %s, not a JSON object", name, df_cj_type_name(root));
    json_decref(root);
    return st;
  }
  *out = root;
  return DF_OK;
}

df_status df_cj_load_file(const char *path, json_t **out, df_error *err) {
  *out = NULL;
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return DF_FAIL(err, DF_ERR_IO, path, "check the path (a draft config is a .json file; a target is a directory)",
                   "%s: cannot open: %s", path, strerror(errno));
  // Sized from the file so a stray weights file is refused before it is read.
  long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
  if (size < 0 || fseek(fp, 0, SEEK_SET) != 0) {
    fclose(fp);
    return DF_FAIL(err, DF_ERR_IO, path, "pass a regular file", "%s: cannot determine the file size", path);
  }
  if (size > DF_CJ_MAX_FILE) {
    fclose(fp);
    return DF_FAIL(err, DF_ERR_FORMAT, path, "point at the config.json, not a weights file",
                   "%s: %ld bytes is larger than %d; not a config file", path, size, DF_CJ_MAX_FILE);
  }
  char *buf = malloc((size_t)size + 1);
  if (!buf) {
    fclose(fp);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "%s: out of memory reading the file", path);
  }
  size_t n = fread(buf, 1, (size_t)size, fp);
  bool read_err = ferror(fp) || n != (size_t)size;
  fclose(fp);
  df_status st = read_err ? DF_FAIL(err, DF_ERR_IO, path, "check that the file is readable", "%s: read error", path)
                          : df_cj_load_buffer(buf, n, path, out, err);
  free(buf);
  return st;
}

df_status df_cj_finish(const df_cj_kind *k, json_t *root, df_status st, const char *source, void **out, df_error *err) {
  *out = NULL;
  if (st != DF_OK) return st;
  char *owner = calloc(1, k->size), *src = strdup(source);
  if (!owner || !src) {
    free(owner), free(src), json_decref(root);
    return DF_FAIL(err, DF_ERR_NOMEM, source, NULL, "%s: out of memory", source);
  }
  df_cj_doc *doc = (df_cj_doc *)(owner + k->doc_offset);
  doc->root = root, doc->source = src;
  df_cj c = {.source = src, .err = err};
  st = k->build(&c, root, owner);
  if (st != DF_OK) {
    k->free(owner);
    return st;
  }
  *out = owner;
  return DF_OK;
}

json_t *df_cj_get(const json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_null(v) ? NULL : v;
}

const char *df_cj_type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "an object";
  case JSON_ARRAY: return "an array";
  case JSON_STRING: return "a string";
  case JSON_INTEGER: return "an integer";
  case JSON_REAL: return "a real number";
  case JSON_TRUE:
  case JSON_FALSE: return "a boolean";
  case JSON_NULL: return "null";
  }
  return "a value";
}

df_status df_cj_int(const df_cj *c, const json_t *v, const char *path, int64_t lo, int64_t hi, int64_t *out) {
  if (!json_is_integer(v))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "write a JSON integer without a decimal point, e.g. 16",
                      "expected an integer, got %s", df_cj_type_name(v));
  int64_t x = (int64_t)json_integer_value(v);
  if (x < lo || x > hi) {
    if (hi == INT64_MAX)
      return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use a value in the allowed range",
                        "must be >= %" PRId64 ", got %" PRId64, lo, x);
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use a value in the allowed range",
                      "must be in [%" PRId64 ", %" PRId64 "], got %" PRId64, lo, hi, x);
  }
  *out = x;
  return DF_OK;
}

df_status df_cj_real(const df_cj *c, const json_t *v, const char *path, double lo, bool lo_open, double hi,
                     double *out) {
  if (!json_is_number(v))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "write a JSON number, e.g. 1e-06", "expected a number, got %s",
                      df_cj_type_name(v));
  double x = json_number_value(v);
  bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (!isfinite(x) || below || x > hi) {
    if (isinf(hi))
      return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use a value in the allowed range", "must be %s %g, got %g",
                        lo_open ? ">" : ">=", lo, x);
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use a value in the allowed range", "must be in %c%g, %g], got %g",
                      lo_open ? '(' : '[', lo, hi, x);
  }
  *out = x;
  return DF_OK;
}

df_status df_cj_bool(const df_cj *c, const json_t *v, const char *path, bool *out) {
  if (!json_is_boolean(v))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "write true or false (not 0/1 or a string)",
                      "expected true or false, got %s", df_cj_type_name(v));
  *out = json_is_true(v);
  return DF_OK;
}

df_status df_cj_string(const df_cj *c, const json_t *v, const char *path, const char **out) {
  if (!json_is_string(v))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "write a JSON string in double quotes", "expected a string, got %s",
                      df_cj_type_name(v));
  *out = json_string_value(v);
  return DF_OK;
}

df_status df_cj_enum(const df_cj *c, const json_t *v, const char *path, const char *const *names, int n, int *out) {
  const char *s = NULL;
  DF_TRY(df_cj_string(c, v, path, &s));
  for (int i = 0; i < n; i++)
    if (!strcasecmp(s, names[i])) {
      *out = i;
      return DF_OK;
    }
  char allowed[160] = "";
  for (int i = 0; i < n; i++) {
    size_t used = strlen(allowed);
    snprintf(allowed + used, sizeof allowed - used, "%s\"%s\"", i ? ", " : "", names[i]);
  }
  char hint[200];
  snprintf(hint, sizeof hint, "use one of %s", allowed);
  return DF_CJ_FAIL(c, DF_ERR_INVALID, path, hint, "unknown value \"%.64s\"", s);
}

df_status df_cj_req_int(const df_cj *c, const json_t *obj, const char *prefix, const char *key, int64_t lo, int64_t hi,
                        int64_t *out) {
  char path[DF_CJ_PATH];
  df_cj_path(path, prefix, key);
  const json_t *v = df_cj_get(obj, key);
  if (!v)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "add the key; draftforge does not guess model sizes",
                      "required key is missing (or null)");
  return df_cj_int(c, v, path, lo, hi, out);
}

df_status df_cj_opt_int(const df_cj *c, const json_t *obj, const char *prefix, const char *key, int64_t def, int64_t lo,
                        int64_t hi, int64_t *out) {
  char path[DF_CJ_PATH];
  const json_t *v = df_cj_get(obj, key);
  if (!v) {
    *out = def;
    return DF_OK;
  }
  return df_cj_int(c, v, df_cj_path(path, prefix, key), lo, hi, out);
}

df_status df_cj_opt_real(const df_cj *c, const json_t *obj, const char *prefix, const char *key, double def, double lo,
                         bool lo_open, double hi, double *out) {
  char path[DF_CJ_PATH];
  const json_t *v = df_cj_get(obj, key);
  if (!v) {
    *out = def;
    return DF_OK;
  }
  return df_cj_real(c, v, df_cj_path(path, prefix, key), lo, lo_open, hi, out);
}

df_status df_cj_opt_bool(const df_cj *c, const json_t *obj, const char *prefix, const char *key, bool def, bool *out) {
  char path[DF_CJ_PATH];
  const json_t *v = df_cj_get(obj, key);
  if (!v) {
    *out = def;
    return DF_OK;
  }
  return df_cj_bool(c, v, df_cj_path(path, prefix, key), out);
}

df_status df_cj_opt_string(const df_cj *c, const json_t *obj, const char *prefix, const char *key, const char *def,
                           const char **out) {
  char path[DF_CJ_PATH];
  const json_t *v = df_cj_get(obj, key);
  if (!v) {
    *out = def;
    return DF_OK;
  }
  return df_cj_string(c, v, df_cj_path(path, prefix, key), out);
}
