// Recipe values: YAML scalar resolution (the core schema, plus YAML 1.1 booleans as PyYAML reads them), type,
// null, range and choice checks against a schema row, defaults and equality for default-only keys.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/recipe/recipe_internal.h"

typedef enum { SV_NULL, SV_BOOL, SV_INT, SV_FLOAT, SV_STR } sv_kind;

typedef struct {
  sv_kind kind;
  bool b;
  int64_t i;
  double f;
  const char *text;
  bool quoted;
} scalar;

static const char *const SV_NAMES[] = {"null", "a boolean", "an integer", "a number", "a string"};

void df_rvalue_clear(df_rvalue *v) {
  free(v->s);
  free(v->il);
  for (int j = 0; v->sl && j < v->n; j++) free(v->sl[j]);
  free(v->sl);
  memset(v, 0, sizeof *v);
}

const char *df_recipe_key_path(const df_recipe_key *k, char *buf, size_t n) {
  snprintf(buf, n, "%s%s%s", k->section, k->section[0] ? "." : "", k->key);
  return buf;
}

const char *df_recipe_type_name(df_recipe_type t) {
  static const char *const names[] = {
      "string",          "path",    "integer",         "number", "boolean", "choice", "list of integers",
      "list of strings", "mapping", "list of mappings"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

const char *df_recipe_key_default_text(const df_recipe_key *k) { return k->def ? k->def : "null"; }

static bool in_list(const char *s, const char *const *words) {
  for (int i = 0; words[i]; i++)
    if (!strcmp(s, words[i])) return true;
  return false;
}

static bool parse_int(const char *s, int64_t *out) {
  const char *p = s + (*s == '+' || *s == '-');
  if (!*p) return false;
  for (const char *q = p; *q; q++)
    if (*q < '0' || *q > '9') return false;
  errno = 0;
  long long x = strtoll(s, NULL, 10);
  if (errno == ERANGE) return false;
  *out = (int64_t)x;
  return true;
}

static bool parse_float(const char *s, double *out) {
  static const char *const inf[] = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", NULL};
  static const char *const ninf[] = {"-.inf", "-.Inf", "-.INF", NULL};
  static const char *const nan_[] = {".nan", ".NaN", ".NAN", NULL};
  if (in_list(s, inf)) return *out = INFINITY, true;
  if (in_list(s, ninf)) return *out = -INFINITY, true;
  if (in_list(s, nan_)) return *out = NAN, true;
  bool digit = false;
  for (const char *q = s; *q; q++) {
    if (*q >= '0' && *q <= '9')
      digit = true;
    else if (!strchr("+-.eE", *q))
      return false;
  }
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (!digit || *end || errno == ERANGE) return false;
  *out = x;
  return true;
}

// A plain scalar takes the type its text spells; a quoted one is always a string.
static scalar resolve_scalar(const yaml_node_t *n) {
  static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
  static const char *const trues[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
  static const char *const falses[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};
  scalar s = {.kind = SV_STR, .text = (const char *)n->data.scalar.value};
  s.quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
  if (s.quoted) return s;
  if (in_list(s.text, nulls))
    s.kind = SV_NULL;
  else if (in_list(s.text, trues))
    s.kind = SV_BOOL, s.b = true;
  else if (in_list(s.text, falses))
    s.kind = SV_BOOL, s.b = false;
  else if (parse_int(s.text, &s.i))
    s.kind = SV_INT, s.f = (double)s.i;
  else if (parse_float(s.text, &s.f))
    s.kind = SV_FLOAT;
  return s;
}

// ---- messages ----------------------------------------------------------------------------------------------

static df_status fail_at(df_error *err, df_status st, const df_recipe_key *k, df_rpos pos, const char *hint,
                         const char *what) {
  char kp[160];
  df_recipe_key_path(k, kp, sizeof kp);
  return DF_FAIL(err, st, kp, hint, "%s:%d:%d: %s: %s", pos.file, pos.line, pos.col, kp, what);
}

static df_status fail_type(df_error *err, const df_recipe_key *k, df_rpos pos, const scalar *s, const char *want) {
  char what[320], hint[200];
  snprintf(what, sizeof what, "expected %s, got %s '%.120s'", want, SV_NAMES[s->kind], s->text);
  if (s->quoted && k->type != DF_RT_STRING && k->type != DF_RT_PATH && k->type != DF_RT_ENUM)
    snprintf(hint, sizeof hint, "write %s without quotes, e.g. %s: %s", want, k->key, df_recipe_key_default_text(k));
  else if (k->type == DF_RT_STRING || k->type == DF_RT_PATH)
    snprintf(hint, sizeof hint, "quote the value: %s: \"%.80s\"", k->key, s->text);
  else
    snprintf(hint, sizeof hint, "e.g. %s: %s", k->key, df_recipe_key_default_text(k));
  return fail_at(err, DF_ERR_INVALID, k, pos, hint, what);
}

static df_status check_range(const df_recipe_key *k, df_rpos pos, double x, const char *text, df_error *err) {
  bool lo_ok = !k->has_lo || (k->lo_open ? x > k->lo : x >= k->lo);
  bool hi_ok = !k->has_hi || (k->hi_open ? x < k->hi : x <= k->hi);
  if (lo_ok && hi_ok && !isnan(x)) return DF_OK;
  char what[320], range[96] = "";
  if (k->has_lo) snprintf(range, sizeof range, "%s %g", k->lo_open ? ">" : ">=", k->lo);
  if (k->has_hi)
    snprintf(range + strlen(range), sizeof range - strlen(range), "%s%s %g", k->has_lo ? " and " : "",
             k->hi_open ? "<" : "<=", k->hi);
  snprintf(what, sizeof what, "%.120s is out of range (must be %s)", text, range);
  return fail_at(err, DF_ERR_INVALID, k, pos, "use a value inside the range", what);
}

// ---- conversion ----------------------------------------------------------------------------------------------

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static df_status choice_of(const df_recipe_key *k, df_rpos pos, const scalar *s, df_rvalue *v, df_error *err) {
  for (int c = 0; k->choices[c]; c++)
    if (!strcmp(k->choices[c], s->text)) {
      v->choice = c;
      v->s = strdup(s->text);
      return v->s ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, k->key, NULL, "out of memory");
    }
  char what[320], hint[256] = "one of:";
  for (int c = 0; k->choices[c]; c++)
    snprintf(hint + strlen(hint), sizeof hint - strlen(hint), " %s%s", k->choices[c], k->choices[c + 1] ? "," : "");
  snprintf(what, sizeof what, "'%.120s' is not a valid choice", s->text);
  return fail_at(err, DF_ERR_INVALID, k, pos, hint, what);
}

// One scalar of element type t (INT_LIST items are INT, STRING_LIST items STRING).
static df_status scalar_value(const df_recipe_key *k, df_recipe_type t, df_rpos pos, const scalar *s, df_rvalue *v,
                              df_error *err) {
  switch (t) {
  case DF_RT_STRING:
  case DF_RT_PATH:
    if (s->kind != SV_STR) return fail_type(err, k, pos, s, "a string");
    v->s = strdup(s->text);
    return v->s ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, k->key, NULL, "out of memory");
  case DF_RT_ENUM:
    if (s->kind != SV_STR) return fail_type(err, k, pos, s, "a string");
    return choice_of(k, pos, s, v, err);
  case DF_RT_BOOL:
    if (s->kind != SV_BOOL) return fail_type(err, k, pos, s, "true or false");
    v->b = s->b;
    return DF_OK;
  case DF_RT_INT:
    if (s->kind == SV_FLOAT && s->f == floor(s->f) && fabs(s->f) < 9.0e15)
      v->i = (int64_t)s->f;
    else if (s->kind == SV_INT)
      v->i = s->i;
    else
      return fail_type(err, k, pos, s, "an integer");
    return check_range(k, pos, (double)v->i, s->text, err);
  case DF_RT_FLOAT:
    if (s->kind != SV_INT && s->kind != SV_FLOAT) return fail_type(err, k, pos, s, "a number");
    if (!isfinite(s->f)) return fail_at(err, DF_ERR_INVALID, k, pos, "use a finite number", "the value is not finite");
    v->f = s->f;
    return check_range(k, pos, v->f, s->text, err);
  default: return fail_at(err, DF_ERR_INVALID, k, pos, NULL, "internal: not a scalar type");
  }
}

static df_status list_value(const df_recipe_key *k, yaml_document_t *doc, yaml_node_t *node, df_rpos pos, df_rvalue *v,
                            df_error *err) {
  bool ints = k->type == DF_RT_INT_LIST;
  int n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
  v->n = n;
  if (ints)
    v->il = calloc((size_t)n + 1, sizeof *v->il);
  else
    v->sl = calloc((size_t)n + 1, sizeof *v->sl);
  if (ints ? !v->il : !v->sl) return DF_FAIL(err, DF_ERR_NOMEM, k->key, NULL, "out of memory");
  for (int j = 0; j < n; j++) {
    yaml_node_t *it = yaml_document_get_node(doc, node->data.sequence.items.start[j]);
    df_rpos ip = {pos.file, (int)it->start_mark.line + 1, (int)it->start_mark.column + 1};
    if (it->type != YAML_SCALAR_NODE)
      return fail_at(err, DF_ERR_INVALID, k, ip, NULL, ints ? "list items must be integers" : "items must be strings");
    scalar s = resolve_scalar(it);
    df_rvalue item = {0};
    df_status st = scalar_value(k, ints ? DF_RT_INT : DF_RT_STRING, ip, &s, &item, err);
    if (st != DF_OK) return st;
    if (ints)
      v->il[j] = item.i;
    else
      v->sl[j] = item.s;
  }
  return DF_OK;
}

df_status df_rvalue_from_node(const df_recipe_key *k, yaml_document_t *doc, yaml_node_t *node, df_rpos pos,
                              df_rvalue *v, df_error *err) {
  bool list = k->type == DF_RT_INT_LIST || k->type == DF_RT_STRING_LIST;
  v->present = true, v->line = pos.line, v->col = pos.col;
  if (node->type == YAML_SCALAR_NODE) {
    scalar s = resolve_scalar(node);
    if (s.kind == SV_NULL) {
      if (!k->nullable) return fail_type(err, k, pos, &s, list ? "a list" : df_recipe_type_name(k->type));
      v->is_null = true;
      return DF_OK;
    }
    if (list) return fail_type(err, k, pos, &s, "a list");
    return scalar_value(k, k->type, pos, &s, v, err);
  }
  if (node->type == YAML_SEQUENCE_NODE && list) return list_value(k, doc, node, pos, v, err);
  if (node->type == YAML_SEQUENCE_NODE && k->type == DF_RT_MAPPING_LIST) { // rows of refused sections only
    v->n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
    return DF_OK;
  }
  char what[160];
  snprintf(what, sizeof what, "expected %s, got a %s", df_recipe_type_name(k->type),
           node->type == YAML_SEQUENCE_NODE ? "list" : "mapping");
  return fail_at(err, DF_ERR_INVALID, k, pos, NULL, what);
}

df_status df_rvalue_default(const df_recipe_key *k, df_rvalue *v, df_error *err) {
  memset(v, 0, sizeof *v);
  if (!k->def) {
    v->is_null = true;
    return DF_OK;
  }
  if (k->type == DF_RT_STRING || k->type == DF_RT_PATH) {
    v->s = dup_or_null(k->def);
    return v->s ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, k->key, NULL, "out of memory");
  }
  yaml_node_t fake = {.type = YAML_SCALAR_NODE};
  fake.data.scalar.value = (yaml_char_t *)k->def;
  fake.data.scalar.length = strlen(k->def);
  fake.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
  df_rpos pos = {"<schema default>", 0, 0};
  df_status st = df_rvalue_from_node(k, NULL, &fake, pos, v, err);
  v->present = false, v->line = v->col = 0;
  return st;
}

bool df_rvalue_equal(const df_recipe_key *k, const df_rvalue *a, const df_rvalue *b) {
  if (a->is_null || b->is_null) return a->is_null == b->is_null;
  switch (k->type) {
  case DF_RT_STRING:
  case DF_RT_PATH:
  case DF_RT_ENUM: return !strcmp(a->s, b->s);
  case DF_RT_BOOL: return a->b == b->b;
  case DF_RT_INT: return a->i == b->i;
  case DF_RT_FLOAT: return a->f == b->f;
  case DF_RT_INT_LIST: return a->n == b->n && (a->n == 0 || !memcmp(a->il, b->il, (size_t)a->n * sizeof *a->il));
  case DF_RT_STRING_LIST:
    if (a->n != b->n) return false;
    for (int j = 0; j < a->n; j++)
      if (strcmp(a->sl[j], b->sl[j])) return false;
    return true;
  default: return false;
  }
}

const char *df_rvalue_text(const df_recipe_key *k, const df_rvalue *v, char *buf, size_t n) {
  if (v->is_null)
    snprintf(buf, n, "null");
  else if (k->type == DF_RT_BOOL)
    snprintf(buf, n, "%s", v->b ? "true" : "false");
  else if (k->type == DF_RT_INT)
    snprintf(buf, n, "%lld", (long long)v->i);
  else if (k->type == DF_RT_FLOAT)
    snprintf(buf, n, "%g", v->f);
  else if (k->type == DF_RT_INT_LIST || k->type == DF_RT_STRING_LIST || k->type == DF_RT_MAPPING_LIST)
    snprintf(buf, n, "a list of %d", v->n);
  else if (k->type == DF_RT_SECTION)
    snprintf(buf, n, "a mapping");
  else
    snprintf(buf, n, "'%.100s'", v->s ? v->s : "");
  return buf;
}
