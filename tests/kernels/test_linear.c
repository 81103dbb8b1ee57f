// matmul / linear / axpy: PyTorch golden data, finite differences, argument errors.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

static void check_linear_case(const char *file, bool bias) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor x = fx_view(f, "x"), w = fx_view(f, "w"), dy = fx_view(f, "dy");
  df_tensor b = bias ? fx_view(f, "b") : (df_tensor){0};
  int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  float *y = calloc((size_t)(m * n), 4), *dx = calloc((size_t)(m * k), 4), *dw = calloc((size_t)(n * k), 4),
        *db = calloc((size_t)n, 4);
  df_tensor ty = df_f32(y, m, n), tdx = df_f32(dx, m, k), tdw = df_f32(dw, n, k), tdb = df_f32(db, n);
  DF_ASSERT_OK(df_linear_forward(ctx, &x, &w, bias ? &b : NULL, &ty, &err), &err);
  df_expect_close("y", y, fx_get(f, "y")->data, m * n, 1e-6, 1e-6);
  DF_ASSERT_OK(df_linear_backward(ctx, &dy, &x, &w, &tdx, false, &tdw, bias ? &tdb : NULL, &err), &err);
  df_expect_close("dx", dx, fx_get(f, "dx")->data, m * k, 1e-6, 1e-6);
  df_expect_close("dw", dw, fx_get(f, "dw")->data, n * k, 1e-6, 1e-6);
  if (bias) df_expect_close("db", db, fx_get(f, "db")->data, n, 1e-6, 1e-6);
  // dw accumulates and dx accumulates on request: a second call doubles both.
  DF_ASSERT_OK(df_linear_backward(ctx, &dy, &x, &w, &tdx, true, &tdw, NULL, &err), &err);
  for (int64_t i = 0; i < n * k; i++) dw[i] *= 0.5f;
  for (int64_t i = 0; i < m * k; i++) dx[i] *= 0.5f;
  df_expect_close("dw accumulated", dw, fx_get(f, "dw")->data, n * k, 1e-6, 1e-6);
  df_expect_close("dx accumulated", dx, fx_get(f, "dx")->data, m * k, 1e-6, 1e-6);
  free(y), free(dx), free(dw), free(db);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(linear, golden_with_bias) { check_linear_case("kernels/linear_bias.safetensors", true); }
Test(linear, golden_without_bias) { check_linear_case("kernels/linear_nobias.safetensors", false); }

// Probe loss Σ r·y for the finite-difference check.
typedef struct {
  df_ctx *ctx;
  df_tensor x, w, y;
  const float *r;
  int64_t ny;
} linear_probe;

static double linear_probe_loss(void *p) {
  linear_probe *lp = p;
  df_error err = {0};
  df_linear_forward(lp->ctx, &lp->x, &lp->w, NULL, &lp->y, &err);
  const float *y = lp->y.data;
  double s = 0;
  for (int64_t i = 0; i < lp->ny; i++) s += (double)lp->r[i] * y[i];
  return s;
}

Test(linear, finite_differences) {
  enum { M = 5, K = 7, N = 4 };
  float x[M * K], w[N * K], y[M * N], r[M * N], dx[M * K], dw[N * K] = {0};
  df_test_fill_uniform(x, M * K, 1, -1, 1);
  df_test_fill_uniform(w, N * K, 2, -1, 1);
  df_test_fill_uniform(r, M * N, 3, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  linear_probe lp = {ctx, df_f32(x, M, K), df_f32(w, N, K), df_f32(y, M, N), r, M * N};
  df_tensor tr = df_f32(r, M, N), tdx = df_f32(dx, M, K), tdw = df_f32(dw, N, K);
  DF_ASSERT_OK(df_linear_backward(ctx, &tr, &lp.x, &lp.w, &tdx, false, &tdw, NULL, &err), &err);
  df_fd_check("dx", x, dx, M * K, linear_probe_loss, &lp, 1e-2, 1e-3, 1e-5, 64);
  df_fd_check("dw", w, dw, N * K, linear_probe_loss, &lp, 1e-2, 1e-3, 1e-5, 64);
  df_ctx_destroy(ctx);
}

Test(linear, matmul_transposes) {
  // c = aᵀ · bᵀ with a [3,2], b [4,3]: c [2,4]; checked against a plain triple loop.
  float a[6], b[12], c[8], want[8] = {0};
  df_test_fill_uniform(a, 6, 4, -1, 1);
  df_test_fill_uniform(b, 12, 5, -1, 1);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int p = 0; p < 3; p++) want[i * 4 + j] += a[p * 2 + i] * b[j * 3 + p];
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor ta = df_f32(a, 3, 2), tb = df_f32(b, 4, 3), tc = df_f32(c, 2, 4);
  DF_ASSERT_OK(df_matmul(ctx, &ta, true, &tb, true, 1.0f, 0.0f, &tc, &err), &err);
  df_expect_close_elementwise("c", c, want, 8, 1e-6, 1e-6);
  df_ctx_destroy(ctx);
}

Test(linear, rejects_bad_arguments) {
  float x[12] = {0}, w[12] = {0}, y[16] = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, 3, 4), tw = df_f32(w, 4, 3), ty = df_f32(y, 3, 4);
  cr_expect_eq(df_linear_forward(ctx, &tx, &tw, NULL, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x", "the error names the mismatched input");
  df_tensor ti = df_i32(x, 3, 4), tw2 = df_f32(w, 3, 4), ty2 = df_f32(y, 3, 3);
  cr_expect_eq(df_linear_forward(ctx, &ti, &tw2, NULL, &ty2, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  df_ctx_destroy(ctx);
}

Test(linear, axpy) {
  float x[5] = {1, 2, 3, 4, 5}, y[5] = {1, 1, 1, 1, 1}, want[5] = {3, 5, 7, 9, 11};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, 5), ty = df_f32(y, 5);
  DF_ASSERT_OK(df_axpy(ctx, 2.0f, &tx, &ty, &err), &err);
  df_expect_close_elementwise("y", y, want, 5, 0, 0);
  df_ctx_destroy(ctx);
}
