// RMSNorm: PyTorch golden data ([R, H] and per-head [T, nh, hd]), finite differences, determinism of dw
// across thread counts, argument errors.
//
// Tolerances (u = 2^-24 ≈ 6e-8 is fp32's unit roundoff; references are float64; measured worst in []):
// - rstd: elementwise 1.2e-7 (2u): one rounding of a double. [≤ u]
// - y: elementwise 2.5e-7: y = fl(fl(x·rstd)·w) with rstd rounded is 3 roundings, ≤ 3u = 1.8e-7. [1.8e-7]
// - dx: per row, 5e-7 · max|dx_row|. dx = r·w·dy − c·x may cancel, so the error scales with the row's
//   terms (rows span decades of magnitude, hence per row rather than over the whole tensor). [1.1e-7]
// - dw: 5e-7 · max|dw|: double accumulation; rstd's fp32 rounding and the final rounding remain. [8.7e-8]
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

static float *zeros(int64_t n) { return calloc((size_t)n, sizeof(float)); }

static void expect_rows_close(const char *what, const float *got, const float *want, int64_t rows, int64_t dim,
                              double rtol) {
  char label[64];
  for (int64_t r = 0; r < rows; r++) {
    snprintf(label, sizeof label, "%s row %lld", what, (long long)r);
    df_expect_close(label, got + r * dim, want + r * dim, dim, rtol, 0.0);
  }
}

static void check_golden(const char *file) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor x = fx_view(f, "x"), w = fx_view(f, "w"), dy = fx_view(f, "dy");
  const float eps = (float)fx_meta(f, "eps");
  const int64_t n = df_numel(&x), dim = w.shape[0], rows = n / dim;
  float *y = zeros(n), *rstd = zeros(rows), *dx = zeros(n), *dw = zeros(dim);
  df_tensor ty = df_view(y, DF_F32, DF_DEV_CPU, x.ndim, x.shape);
  // rstd may take any shape with R elements: [T, nh] for the per-head case.
  df_tensor trstd = df_view(rstd, DF_F32, DF_DEV_CPU, x.ndim - 1, x.shape);
  df_tensor tdx = df_view(dx, DF_F32, DF_DEV_CPU, x.ndim, x.shape), tdw = df_f32(dw, dim);

  DF_ASSERT_OK(df_rmsnorm_forward(ctx, &x, &w, eps, &ty, &trstd, &err), &err);
  df_expect_close_elementwise("y", y, fx_get(f, "y")->data, n, 2.5e-7, 0.0);
  df_expect_close_elementwise("rstd", rstd, fx_get(f, "rstd")->data, rows, 1.2e-7, 0.0);

  DF_ASSERT_OK(df_rmsnorm_backward(ctx, &dy, &x, &w, &trstd, &tdx, false, &tdw, &err), &err);
  const float *want_dx = fx_get(f, "dx")->data, *want_dw = fx_get(f, "dw")->data;
  expect_rows_close("dx", dx, want_dx, rows, dim, 5e-7);
  df_expect_close("dw", dw, want_dw, dim, 5e-7, 0.0);

  // dw always accumulates; dx accumulates on request: a second call doubles both.
  DF_ASSERT_OK(df_rmsnorm_backward(ctx, &dy, &x, &w, &trstd, &tdx, true, &tdw, &err), &err);
  for (int64_t i = 0; i < n; i++) dx[i] *= 0.5f;
  for (int64_t i = 0; i < dim; i++) dw[i] *= 0.5f;
  expect_rows_close("dx accumulated", dx, want_dx, rows, dim, 5e-7);
  df_expect_close("dw accumulated", dw, want_dw, dim, 5e-7, 0.0);

  // dw = NULL skips the weight gradient and still writes dx.
  memset(dx, 0, sizeof(float) * (size_t)n);
  DF_ASSERT_OK(df_rmsnorm_backward(ctx, &dy, &x, &w, &trstd, &tdx, false, NULL, &err), &err);
  expect_rows_close("dx without dw", dx, want_dx, rows, dim, 5e-7);

  // dx may alias dy (each element of dy is read before its dx is written): same bits as out of place.
  float *inplace = malloc(sizeof(float) * (size_t)n);
  memcpy(inplace, dy.data, sizeof(float) * (size_t)n);
  df_tensor tin = df_view(inplace, DF_F32, DF_DEV_CPU, x.ndim, x.shape);
  DF_ASSERT_OK(df_rmsnorm_backward(ctx, &tin, &x, &w, &trstd, &tin, false, NULL, &err), &err);
  cr_expect_eq(memcmp(inplace, dx, sizeof(float) * (size_t)n), 0, "dx written over dy differs from out of place");
  free(inplace);

  free(y), free(rstd), free(dx), free(dw);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(rmsnorm, golden_rows) { check_golden("kernels/rmsnorm_rows.safetensors"); }
Test(rmsnorm, golden_per_head) { check_golden("kernels/rmsnorm_heads.safetensors"); }

// Probe loss Σ r·y for the finite-difference check.
typedef struct {
  df_ctx *ctx;
  df_tensor x, w, y, rstd;
  const float *r;
  int64_t n;
  float eps;
} rms_probe;

static double rms_probe_loss(void *p) {
  rms_probe *rp = p;
  df_error err = {0};
  df_rmsnorm_forward(rp->ctx, &rp->x, &rp->w, rp->eps, &rp->y, &rp->rstd, &err);
  const float *y = rp->y.data;
  double s = 0;
  for (int64_t i = 0; i < rp->n; i++) s += (double)rp->r[i] * y[i];
  return s;
}

// h = 1e-2 with central differences: truncation O(h²·f''') ≈ 1e-4 here and fp32 noise in the probe
// ≈ 1e-6 / 2h ≈ 1e-4; a wrong term in the gradient is off by O(max|g|) ≈ 1, far above 1e-3.
Test(rmsnorm, finite_differences) {
  enum { R = 3, D = 6 };
  float x[R * D], w[D], y[R * D], rstd[R], r[R * D], dx[R * D], dw[D] = {0};
  df_test_fill_uniform(x, R * D, 11, -1, 1);
  df_test_fill_uniform(w, D, 12, 0.5f, 1.5f);
  df_test_fill_uniform(r, R * D, 13, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  rms_probe rp = {ctx, df_f32(x, R, D), df_f32(w, D), df_f32(y, R, D), df_f32(rstd, R), r, R * D, 1e-6f};
  df_tensor tr = df_f32(r, R, D), tdx = df_f32(dx, R, D), tdw = df_f32(dw, D);
  DF_ASSERT_OK(df_rmsnorm_forward(ctx, &rp.x, &rp.w, rp.eps, &rp.y, &rp.rstd, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_backward(ctx, &tr, &rp.x, &rp.w, &rp.rstd, &tdx, false, &tdw, &err), &err);
  df_fd_check("dx", x, dx, R * D, rms_probe_loss, &rp, 1e-2, 1e-3, 1e-4, 64);
  df_fd_check("dw", w, dw, D, rms_probe_loss, &rp, 1e-2, 1e-3, 1e-4, 64);
  df_ctx_destroy(ctx);
}

// dw is summed per fixed block of rows: the same bits for 1, 2 or 3 threads at a size that runs parallel.
Test(rmsnorm, backward_is_deterministic_across_threads) {
  enum { R = 700, D = 96 };
  float *x = zeros(R * D), *w = zeros(D), *dy = zeros(R * D), *rstd = zeros(R), *y = zeros(R * D);
  df_test_fill_uniform(x, R * D, 21, -2, 2);
  df_test_fill_uniform(w, D, 22, 0.5f, 1.5f);
  df_test_fill_uniform(dy, R * D, 23, -1, 1);
  df_tensor tx = df_f32(x, R, D), tw = df_f32(w, D), tdy = df_f32(dy, R, D), tr = df_f32(rstd, R), ty = df_f32(y, R, D);
  float *dx[3], *dw[3];
  for (int k = 0; k < 3; k++) {
    df_ctx *ctx = df_test_cpu_ctx(k + 1);
    df_error err = {0};
    dx[k] = zeros(R * D), dw[k] = zeros(D);
    df_tensor tdx = df_f32(dx[k], R, D), tdw = df_f32(dw[k], D);
    DF_ASSERT_OK(df_rmsnorm_forward(ctx, &tx, &tw, 1e-6f, &ty, &tr, &err), &err);
    DF_ASSERT_OK(df_rmsnorm_backward(ctx, &tdy, &tx, &tw, &tr, &tdx, false, &tdw, &err), &err);
    df_ctx_destroy(ctx);
  }
  for (int k = 1; k < 3; k++) {
    cr_expect_eq(memcmp(dw[0], dw[k], sizeof(float) * D), 0, "dw with %d threads differs from 1 thread", k + 1);
    cr_expect_eq(memcmp(dx[0], dx[k], sizeof(float) * R * D), 0, "dx with %d threads differs from 1 thread", k + 1);
  }
  for (int k = 0; k < 3; k++) free(dx[k]), free(dw[k]);
  free(x), free(w), free(dy), free(rstd), free(y);
}

Test(rmsnorm, rejects_bad_arguments) {
  float x[24] = {0}, w[8] = {0}, y[24], rstd[6] = {0}, dx[24] = {0}, dw[8] = {0};
  for (int i = 0; i < 24; i++) y[i] = 7.0f;
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, 6, 4), tw = df_f32(w, 4), ty = df_f32(y, 6, 4), tr = df_f32(rstd, 6);
  df_tensor tdx = df_f32(dx, 6, 4), tdw = df_f32(dw, 4);

  df_tensor w5 = df_f32(w, 5); // 24 is not a multiple of 5
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &w5, 1e-6f, &ty, &tr, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  df_tensor w2d = df_f32(w, 2, 2);
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &w2d, 1e-6f, &ty, &tr, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "w");
  df_tensor y_short = df_f32(y, 5, 4);
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &tw, 1e-6f, &y_short, &tr, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "y");
  df_tensor r5 = df_f32(rstd, 5);
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &tw, 1e-6f, &ty, &r5, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "rstd");
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &tw, -1e-6f, &ty, &tr, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "eps");
  cr_expect_eq(df_rmsnorm_forward(ctx, &tx, &tw, NAN, &ty, &tr, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "eps");
  for (int i = 0; i < 24; i++) cr_expect_eq(y[i], 7.0f, "y was written by a failed call");

  df_tensor dy_i32 = df_i32(x, 6, 4);
  cr_expect_eq(df_rmsnorm_backward(ctx, &dy_i32, &tx, &tw, &tr, &tdx, false, &tdw, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dy");
  df_tensor dx_short = df_f32(dx, 4, 4);
  cr_expect_eq(df_rmsnorm_backward(ctx, &ty, &tx, &tw, &tr, &dx_short, false, &tdw, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dx");
  cr_expect_eq(df_rmsnorm_backward(ctx, &ty, &tx, &tw, &tr, NULL, false, &tdw, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dx");
  df_tensor dw5 = df_f32(dw, 5);
  cr_expect_eq(df_rmsnorm_backward(ctx, &ty, &tx, &tw, &tr, &tdx, false, &dw5, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dw");
  cr_expect_eq(df_rmsnorm_backward(ctx, &ty, &tx, &tw, &r5, &tdx, false, &tdw, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "rstd");
  df_ctx_destroy(ctx);
}
