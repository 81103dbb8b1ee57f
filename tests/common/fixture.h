// Test helpers: golden fixtures (safetensors files written by tools/golden/*.py with PyTorch),
// closeness assertions with stated tolerances, and a finite-difference gradient probe.
#ifndef DF_TESTS_FIXTURE_H
#define DF_TESTS_FIXTURE_H

#include <stdint.h>

#include "kernels/ops.h"

typedef struct {
  char name[160];
  df_dtype dtype;
  int ndim;
  int64_t shape[DF_MAX_DIMS];
  void *data; // owned, aligned copy
} fx_tensor;

typedef struct {
  char path[512];
  fx_tensor *t;
  int n;
  void *meta; // json_t * of __metadata__ (string values)
} fx_file;

// Loads DF_FIXTURE_DIR/relpath (the environment's DF_FIXTURE_DIR first, else the build's); a missing or malformed
// file fails the current test.
fx_file *fx_load(const char *relpath);
void fx_free(fx_file *f);
// The named tensor (fails the test when absent).
const fx_tensor *fx_get(const fx_file *f, const char *name);
bool fx_has(const fx_file *f, const char *name);
// A CPU df_tensor view of the named tensor's data (its dtype and shape).
df_tensor fx_view(const fx_file *f, const char *name);
int64_t fx_numel(const fx_tensor *t);
// A metadata value (stored as a string by the generator), parsed as a number; fails when absent.
double fx_meta(const fx_file *f, const char *key);

// Fails the test unless max_i |got_i − want_i| <= atol + rtol · max_i |want_i|; prints the worst index.
void df_expect_close(const char *what, const float *got, const float *want, int64_t n, double rtol, double atol);
// Same, element by element: |got_i − want_i| <= atol + rtol · |want_i|.
void df_expect_close_elementwise(const char *what, const float *got, const float *want, int64_t n, double rtol,
                                 double atol);

// Finite differences: f(ctx) evaluates a scalar probe loss (for example Σ r·y with fixed random r) in
// double from the current contents of x. For up to max_checks indices of x (spread evenly), the central
// difference (f(x+h) − f(x−h)) / 2h is compared with grad[i]:
//   |fd − grad| <= atol + rtol · max_j |grad_j|.
typedef double (*df_fd_loss_fn)(void *ctx);
void df_fd_check(const char *what, float *x, const float *grad, int64_t n, df_fd_loss_fn f, void *ctx, double h,
                 double rtol, double atol, int max_checks);

// Deterministic test data: uniform in [lo, hi) from a seeded xorshift stream.
void df_test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi);

// A CPU context with the given thread count (0 = default); fails the test on error.
df_ctx *df_test_cpu_ctx(int num_threads);
// A context on the strict fake device (kernels/fake/strict.c): the CPU kernels behind a table whose buffers fault
// on any host dereference, so code that runs on it touches device data only through df_copy.
df_ctx *df_test_strict_fake_ctx(int num_threads);

// Fails the test with the error's message when st != DF_OK.
#define DF_ASSERT_OK(st, err) cr_assert_eq((st), DF_OK, "unexpected error: %s [%s]", (err)->msg, (err)->where)

#endif
