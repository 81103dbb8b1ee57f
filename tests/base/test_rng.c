// The C streams must equal the Python twin's (tools/reference/df_rng.py), value for value: the values
// below were printed by that script (`Rng(42, 3)`, `Rng(7, 1)`).
#include <criterion/criterion.h>

#include "base/rng.h"

Test(rng, matches_python_twin) {
  df_rng r;
  df_rng_init(&r, 42, DF_RNG_STREAM_ANCHORS);
  // Criterion's macros may evaluate their arguments more than once: draw first, then compare.
  uint64_t a = df_rng_next_u64(&r), b = df_rng_next_u64(&r), c = df_rng_next_u64(&r);
  cr_expect_eq(a, 4393367743702550806ull);
  cr_expect_eq(b, 2083193025902234773ull);
  cr_expect_eq(c, 1613447729919889217ull);
  df_rng_init(&r, 7, DF_RNG_STREAM_INIT);
  double u = df_rng_uniform(&r), z = df_rng_normal(&r);
  uint64_t k = df_rng_below(&r, 1000);
  cr_expect_eq(u, 0.2556666267178229);
  cr_expect_float_eq(z, 0.4153746359162442, 1e-15);
  cr_expect_eq(k, 854u);
}

Test(rng, streams_differ_and_state_restores) {
  df_rng a, b;
  df_rng_init(&a, 1, DF_RNG_STREAM_INIT);
  df_rng_init(&b, 1, DF_RNG_STREAM_DATA);
  uint64_t da = df_rng_next_u64(&a), db = df_rng_next_u64(&b);
  cr_expect_neq(da, db);
  df_rng saved = a; // the whole state is the struct: a checkpoint is a copy
  uint64_t x = df_rng_next_u64(&a), y = df_rng_next_u64(&saved);
  cr_expect_eq(y, x);
}

Test(rng, uniform_moments) {
  df_rng r;
  df_rng_init(&r, 123, DF_RNG_STREAM_INIT);
  double s = 0, s2 = 0;
  enum { N = 200000 };
  for (int i = 0; i < N; i++) {
    double z = df_rng_normal(&r);
    s += z, s2 += z * z;
  }
  // mean ~ N(0, 1/N): 5 sigma = 0.011; variance within 2%.
  cr_expect_lt(s / N < 0 ? -s / N : s / N, 0.011);
  cr_expect_lt(s2 / N - 1 < 0 ? 1 - s2 / N : s2 / N - 1, 0.02);
}
