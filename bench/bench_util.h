// Helpers shared by the bench/ programs: a monotonic clock, timing a call as the median of reps after a
// warm-up, and seeded fill. Header-only: CMake builds each bench/*.c as its own program.
#ifndef DF_BENCH_UTIL_H
#define DF_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// How a call is timed: `warmup` untimed calls, then at least min_reps and at most max_reps timed ones;
// after min_reps, timing stops once budget_s seconds were spent (so slow ops do not dominate the run).
typedef struct {
  int warmup, min_reps, max_reps;
  double budget_s;
} bench_plan;

// The function under test; returns the op's status (a failure is reported, not fatal).
typedef df_status (*bench_fn)(void *state, df_error *err);

typedef struct {
  df_status st;
  double median_s, best_s;
  int reps;
} bench_timing;

static inline bench_timing bench_time(bench_fn fn, void *state, const bench_plan *plan, df_error *err) {
  bench_timing t = {.st = DF_OK};
  double samples[256];
  int cap = plan->max_reps < 256 ? plan->max_reps : 256;
  for (int i = 0; i < plan->warmup && t.st == DF_OK; i++) t.st = fn(state, err);
  double spent = 0;
  while (t.st == DF_OK && t.reps < cap && (t.reps < plan->min_reps || spent < plan->budget_s)) {
    double t0 = bench_now();
    t.st = fn(state, err);
    samples[t.reps] = bench_now() - t0;
    spent += samples[t.reps++];
  }
  if (t.st != DF_OK || t.reps == 0) return t;
  qsort(samples, (size_t)t.reps, sizeof samples[0], bench_cmp_double);
  t.best_s = samples[0];
  t.median_s = t.reps % 2 ? samples[t.reps / 2] : 0.5 * (samples[t.reps / 2 - 1] + samples[t.reps / 2]);
  return t;
}

// Uniform in [lo, hi) from a seeded xorshift stream (the same stream as the tests' fill).
static inline void bench_fill(float *x, int64_t n, uint64_t seed, float lo, float hi) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
  }
}

// A zeroed, 64-byte aligned allocation of n floats (aborts on failure: a bench has nothing to recover).
static inline float *bench_alloc(int64_t n) {
  size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes);
  if (!p) abort();
  memset(p, 0, bytes);
  return p;
}

#endif
