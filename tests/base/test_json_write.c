// base/json_write.h: reals in the shortest text that reads back (checked against Python's repr, written out by
// hand from CPython 3.11), the round trip and minimality on random bit patterns, and jansson's layout kept for
// documents without reals.
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_write.h"

// repr(x) in CPython for each value.
static const struct {
  double x;
  const char *repr;
} PY[] = {
    {1e-06, "1e-06"},
    {0.1, "0.1"},
    {123456.0, "123456.0"},
    {1e+16, "1e+16"},
    {1000000000000000.0, "1000000000000000.0"},
    {-0.0, "-0.0"},
    {0.0, "0.0"},
    {5e-324, "5e-324"},
    {1.7976931348623157e+308, "1.7976931348623157e+308"},
    {1.5e-323, "1.5e-323"},
    {0.0001, "0.0001"},
    {1e-05, "1e-05"},
    {0.3333333333333333, "0.3333333333333333"},
    {1.152921504606847e+18, "1.152921504606847e+18"},
    {9007199254740992.0, "9007199254740992.0"},
    {0.003, "0.003"},
    {2.5e-05, "2.5e-05"},
    {0.999, "0.999"},
    {1e-08, "1e-08"},
    {-2.5, "-2.5"},
    {100.0, "100.0"},
    {1e+22, "1e+22"},
    {1.5, "1.5"},
    {2.2250738585072014e-308, "2.2250738585072014e-308"},
    {0.30000000000000004, "0.30000000000000004"},
    {6.02214076e+23, "6.02214076e+23"},
    {8.592004989861268, "8.592004989861268"},
    // powers of two where the correctly rounded shortest-length decimal misses the (lopsided) rounding interval
    {7.120236347223045e-307, "7.120236347223045e-307"}, // 2^-1017
    {7.678447687145631e-239, "7.678447687145631e-239"}, // 2^-791
};

Test(json_write, reals_match_python_repr) {
  for (size_t i = 0; i < sizeof PY / sizeof PY[0]; i++) {
    char buf[DF_JSON_REAL_MAX];
    int n = df_json_format_real(PY[i].x, buf);
    cr_expect_str_eq(buf, PY[i].repr, "value %zu (%.17g)", i, PY[i].x);
    cr_expect_eq(n, (int)strlen(buf));
  }
}

static int significant_digits(const char *s) {
  int n = 0, lead = 1, trail = 0;
  for (const char *c = s; *c && *c != 'e'; c++) {
    if (*c < '0' || *c > '9') continue;
    if (lead && *c == '0') continue;
    lead = 0;
    n++;
    trail = *c == '0' ? trail + 1 : 0;
  }
  return n - trail;
}

// Random finite doubles: the text reads back exactly, and no decimal with one digit fewer does (printf's
// correctly rounded one and its two neighbours are the only candidates).
Test(json_write, random_doubles_round_trip_with_the_fewest_digits) {
  uint64_t s = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 200000; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    double x;
    memcpy(&x, &s, sizeof x);
    if (!isfinite(x)) continue;
    char buf[DF_JSON_REAL_MAX];
    df_json_format_real(x, buf);
    cr_assert(strtod(buf, NULL) == x || (x == 0 && strtod(buf, NULL) == 0), "%s does not read back as %.17g", buf, x);
    int p = significant_digits(buf);
    if (p <= 1) continue;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.*e", p - 2, fabs(x));
    // the (p-1)-digit decimals nearest x: printf's rounding and the decimals one unit in the last place around it
    char *e = strchr(tmp, 'e');
    int ex = atoi(e + 1);
    *e = 0;
    long long mant = 0;
    for (char *c = tmp; *c; c++)
      if (*c >= '0' && *c <= '9') mant = mant * 10 + (*c - '0');
    for (int d = -1; d <= 1; d++) {
      char t[64];
      snprintf(t, sizeof t,
               "%lld"
               "e%d",
               mant + d, ex - (p - 2));
      cr_assert(strtod(t, NULL) != fabs(x), "%s has %d digits, but %s (%d) reads back too", buf, p, t, p - 1);
    }
  }
}

Test(json_write, layout_is_janssons_for_documents_without_reals) {
  json_t *o = json_pack("{s:i, s:[i, {}, [], s], s:{s:s, s:b}, s:n, s:s}", "z", 1, "a", 2, "x", "d", "k",
                        "v\"/\xc3\xa9\n", "t", 1, "n", "s", "plain");
  const size_t modes[] = {0,
                          JSON_COMPACT,
                          JSON_INDENT(2),
                          JSON_INDENT(4) | JSON_SORT_KEYS,
                          JSON_SORT_KEYS | JSON_COMPACT,
                          JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_ESCAPE_SLASH};
  for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
    char *want = json_dumps(o, modes[i]), *got = df_json_dumps(o, modes[i]);
    cr_expect_str_eq(got, want, "flags %#zx", modes[i]);
    free(want), free(got);
  }
  json_decref(o);
  cr_expect_null(df_json_dumps(NULL, 0));
  json_t *r = json_real(1e-6);
  cr_expect_null(df_json_dumps(r, 0), "a bare value needs JSON_ENCODE_ANY, as in jansson");
  char *t = df_json_dumps(r, JSON_ENCODE_ANY);
  cr_expect_str_eq(t, "1e-06");
  free(t);
  json_decref(r);
}

Test(json_write, reals_inside_documents) {
  json_t *o = json_pack("{s:f, s:[f, f], s:f}", "rms_norm_eps", 1e-6, "lr", 3e-3, 0.1, "tau", 2.2754);
  char *t = df_json_dumps(o, JSON_COMPACT);
  cr_expect_str_eq(t, "{\"rms_norm_eps\":1e-06,\"lr\":[0.003,0.1],\"tau\":2.2754}");
  free(t);
  json_decref(o);
}
