// The JSON writer of base/json_write.h: a walk over jansson values that copies jansson's layout and hands strings
// to jansson itself (so escaping is exactly jansson's), with its own shortest round-trip real formatting.
#include "base/json_write.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- reals -----------------------------------------------------------------------------------------------------

// The p significant digits of |x| (correctly rounded, as printf does) as an integer, and the decimal exponent of
// the first digit.
static void digits_of(double x, int p, uint64_t *mant, int *exp10) {
  char buf[48];
  snprintf(buf, sizeof buf, "%.*e", p - 1, fabs(x));
  uint64_t m = 0;
  const char *c = buf;
  for (; *c && *c != 'e'; c++)
    if (*c >= '0' && *c <= '9') m = m * 10 + (uint64_t)(*c - '0');
  *mant = m;
  *exp10 = *c == 'e' ? atoi(c + 1) : 0;
}

// Whether mant (p digits, first at 10^exp10) with x's sign reads back as x.
static bool reads_back(double x, uint64_t mant, int p, int exp10) {
  char buf[48];
  snprintf(buf, sizeof buf, "%s%llue%d", signbit(x) ? "-" : "", (unsigned long long)mant, exp10 - (p - 1));
  return strtod(buf, NULL) == x;
}

// Shortest digits: for p = 1, 2, ... the correctly rounded p-digit value, or one of its neighbours (at a power of
// two the rounding interval is lopsided, so the nearest p-digit decimal can miss it while the next one hits).
static int shortest_digits(double x, char digits[24], int *exp10) {
  for (int p = 1; p <= 17; p++) {
    uint64_t m;
    int e;
    digits_of(x, p, &m, &e);
    uint64_t lo = 1, hi;
    for (int i = 1; i < p; i++) lo *= 10;
    hi = lo * 10; // p-digit mantissas are [lo, hi)
    uint64_t cand[3] = {m, m + 1, m - 1};
    for (int c = 0; c < 3; c++) {
      if (cand[c] < lo || cand[c] >= hi) continue;
      if (!reads_back(x, cand[c], p, e)) continue;
      int n = snprintf(digits, 24, "%llu", (unsigned long long)cand[c]);
      while (n > 1 && digits[n - 1] == '0') digits[--n] = 0; // trailing zeros are not significant
      *exp10 = e;
      return n;
    }
  }
  // unreachable for finite doubles (17 digits always round-trip); fall back to printf's 17 digits
  uint64_t m;
  digits_of(x, 17, &m, exp10);
  return snprintf(digits, 24, "%llu", (unsigned long long)m);
}

int df_json_format_real(double x, char buf[DF_JSON_REAL_MAX]) {
  if (isnan(x)) return snprintf(buf, DF_JSON_REAL_MAX, "NaN");
  if (isinf(x)) return snprintf(buf, DF_JSON_REAL_MAX, "%sInfinity", x < 0 ? "-" : "");
  if (x == 0) return snprintf(buf, DF_JSON_REAL_MAX, "%s0.0", signbit(x) ? "-" : "");
  char d[24];
  int e, n = shortest_digits(x, d, &e);
  int len = 0;
  if (signbit(x)) buf[len++] = '-';
  if (e < -4 || e >= 16) { // d.ddde±XX
    buf[len++] = d[0];
    if (n > 1) {
      buf[len++] = '.';
      memcpy(buf + len, d + 1, (size_t)(n - 1));
      len += n - 1;
    }
    len += snprintf(buf + len, (size_t)(DF_JSON_REAL_MAX - len), "e%c%02d", e < 0 ? '-' : '+', abs(e));
    return len;
  }
  if (e < 0) { // 0.000ddd
    buf[len++] = '0', buf[len++] = '.';
    for (int i = 0; i < -e - 1; i++) buf[len++] = '0';
    memcpy(buf + len, d, (size_t)n + 1);
    return len + n;
  }
  if (e + 1 >= n) { // ddd000.0
    memcpy(buf + len, d, (size_t)n);
    len += n;
    for (int i = n; i <= e; i++) buf[len++] = '0';
    buf[len++] = '.', buf[len++] = '0', buf[len] = 0;
    return len;
  }
  memcpy(buf + len, d, (size_t)(e + 1)); // dd.ddd
  len += e + 1;
  buf[len++] = '.';
  memcpy(buf + len, d + e + 1, (size_t)(n - e - 1));
  len += n - e - 1;
  buf[len] = 0;
  return len;
}

// ---- the walk --------------------------------------------------------------------------------------------------

typedef struct {
  char *buf;
  size_t len, cap;
  bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *g = realloc(b->buf, cap);
    if (!g) {
      b->oom = true;
      return;
    }
    b->buf = g, b->cap = cap;
  }
  memcpy(b->buf + b->len, s, n);
  b->len += n;
  b->buf[b->len] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

// jansson's dump_indent: a newline and depth·indent spaces, else one space (`space`) unless compact.
static void indent(sbuf *b, size_t flags, int depth, bool space) {
  int w = (int)(flags & JSON_MAX_INDENT); // JSON_INDENT(n)
  if (w > 0) {
    put(b, "\n", 1);
    for (int i = 0; i < depth * w; i++) put(b, " ", 1);
  } else if (space && !(flags & JSON_COMPACT)) {
    put(b, " ", 1);
  }
}

static void put_string(sbuf *b, const char *s, size_t n, size_t flags) {
  json_t *js = json_stringn_nocheck(s, n);
  char *t = js ? json_dumps(js, JSON_ENCODE_ANY | (flags & (JSON_ENSURE_ASCII | JSON_ESCAPE_SLASH))) : NULL;
  json_decref(js);
  if (!t) {
    b->oom = true;
    return;
  }
  puts_(b, t);
  free(t);
}

static int cmp_keys(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void dump(sbuf *b, const json_t *j, size_t flags, int depth);

static void dump_object(sbuf *b, const json_t *j, size_t flags, int depth) {
  size_t n = json_object_size(j);
  put(b, "{", 1);
  if (!n) {
    put(b, "}", 1);
    return;
  }
  const char **keys = malloc(n * sizeof *keys);
  if (!keys) {
    b->oom = true;
    return;
  }
  size_t k = 0;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)j, key, v) keys[k++] = key;
  if (flags & JSON_SORT_KEYS) qsort(keys, n, sizeof *keys, cmp_keys);
  indent(b, flags, depth + 1, false);
  for (size_t i = 0; i < n; i++) {
    put_string(b, keys[i], strlen(keys[i]), flags);
    puts_(b, flags & JSON_COMPACT ? ":" : ": ");
    dump(b, json_object_get(j, keys[i]), flags, depth + 1);
    if (i + 1 < n) {
      put(b, ",", 1);
      indent(b, flags, depth + 1, true);
    }
  }
  free(keys);
  indent(b, flags, depth, false);
  put(b, "}", 1);
}

static void dump_array(sbuf *b, const json_t *j, size_t flags, int depth) {
  size_t n = json_array_size(j);
  put(b, "[", 1);
  if (!n) {
    put(b, "]", 1);
    return;
  }
  indent(b, flags, depth + 1, false);
  for (size_t i = 0; i < n; i++) {
    dump(b, json_array_get(j, i), flags, depth + 1);
    if (i + 1 < n) {
      put(b, ",", 1);
      indent(b, flags, depth + 1, true);
    }
  }
  indent(b, flags, depth, false);
  put(b, "]", 1);
}

static void dump(sbuf *b, const json_t *j, size_t flags, int depth) {
  char num[DF_JSON_REAL_MAX];
  switch (json_typeof(j)) {
  case JSON_OBJECT: dump_object(b, j, flags, depth); break;
  case JSON_ARRAY: dump_array(b, j, flags, depth); break;
  case JSON_STRING: put_string(b, json_string_value(j), json_string_length(j), flags); break;
  case JSON_INTEGER:
    snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
    puts_(b, num);
    break;
  case JSON_REAL:
    df_json_format_real(json_real_value(j), num);
    puts_(b, num);
    break;
  case JSON_TRUE: puts_(b, "true"); break;
  case JSON_FALSE: puts_(b, "false"); break;
  case JSON_NULL: puts_(b, "null"); break;
  }
}

char *df_json_dumps(const json_t *j, size_t flags) {
  if (!j || (!(flags & JSON_ENCODE_ANY) && !json_is_object(j) && !json_is_array(j))) return NULL;
  sbuf b = {0};
  dump(&b, j, flags, 0);
  if (b.oom) {
    free(b.buf);
    return NULL;
  }
  return b.buf;
}

int df_json_dumpf(const json_t *j, FILE *fp, size_t flags) {
  char *t = df_json_dumps(j, flags);
  if (!t) return -1;
  size_t n = strlen(t);
  int rc = fwrite(t, 1, n, fp) == n ? 0 : -1;
  free(t);
  return rc;
}
