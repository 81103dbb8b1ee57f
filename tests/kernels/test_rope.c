// Rotary embedding: PyTorch golden data (HF Qwen3 cos/sin tables, rotate_half), the default inv_freq table
// against HF's, in-place use, finite differences, argument errors.
//
// Tolerances (u = 2^-24 ≈ 6e-8): y and dx within 3e-7 · max|ref| (≈ 5u). Our cos/sin (glibc, < 1 ulp) may
// differ from torch's fp32 tables by 1–2 ulp; y = x1·c − x2·s then adds ~2 roundings of terms of size
// |x|, and may cancel, hence relative to the largest value. Measured worst: 6.2e-8.
// The default inv_freq must match HF's float32 table within 1 ulp (torch's float pow is itself 1 ulp).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

static float *copy_of(const float *src, int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)n);
  memcpy(p, src, sizeof(float) * (size_t)n);
  return p;
}

static void check_golden(const char *file) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor x = fx_view(f, "x"), pos = fx_view(f, "pos"), inv = fx_view(f, "inv_freq"), dy = fx_view(f, "dy");
  const float mscale = (float)fx_meta(f, "mscale");
  const int64_t n = df_numel(&x);
  float *y = calloc((size_t)n, 4), *dx = calloc((size_t)n, 4);
  df_tensor ty = df_view(y, DF_F32, DF_DEV_CPU, 3, x.shape), tdx = df_view(dx, DF_F32, DF_DEV_CPU, 3, x.shape);

  DF_ASSERT_OK(df_rope_forward(ctx, &x, &pos, &inv, mscale, &ty, &err), &err);
  df_expect_close("y", y, fx_get(f, "y")->data, n, 3e-7, 0.0);
  DF_ASSERT_OK(df_rope_backward(ctx, &dy, &pos, &inv, mscale, &tdx, &err), &err);
  df_expect_close("dx", dx, fx_get(f, "dx")->data, n, 3e-7, 0.0);

  // In place (y = x, dx = dy) gives the same bits as out of place.
  float *inplace = copy_of(x.data, n);
  df_tensor tin = df_view(inplace, DF_F32, DF_DEV_CPU, 3, x.shape);
  DF_ASSERT_OK(df_rope_forward(ctx, &tin, &pos, &inv, mscale, &tin, &err), &err);
  cr_expect_eq(memcmp(inplace, y, sizeof(float) * (size_t)n), 0, "in-place forward differs from out of place");
  memcpy(inplace, dy.data, sizeof(float) * (size_t)n);
  DF_ASSERT_OK(df_rope_backward(ctx, &tin, &pos, &inv, mscale, &tin, &err), &err);
  cr_expect_eq(memcmp(inplace, dx, sizeof(float) * (size_t)n), 0, "in-place backward differs from out of place");

  free(inplace), free(y), free(dx);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(rope, golden_theta1e6_hd16) { check_golden("kernels/rope_theta1e6_hd16.safetensors"); }
Test(rope, golden_theta1e4_hd8_mscale) { check_golden("kernels/rope_theta1e4_hd8_mscale.safetensors"); }

static int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return llabs((int64_t)ia - (int64_t)ib); // both positive here, so the bit patterns are ordered
}

static void expect_table_matches(const char *what, double theta, int hd, const float *want) {
  float got[512];
  cr_assert_leq(hd / 2, 512);
  df_rope_default_inv_freq(theta, hd, got);
  for (int i = 0; i < hd / 2; i++)
    cr_expect_leq(ulp_distance(got[i], want[i]), 1, "%s (theta %g, hd %d): inv_freq[%d] = %.9g, HF %.9g", what, theta,
                  hd, i, (double)got[i], (double)want[i]);
}

Test(rope, default_inv_freq_matches_hf) {
  fx_file *f = fx_load("kernels/rope_inv_freq.safetensors");
  int count = (int)fx_meta(f, "count");
  cr_assert_gt(count, 0);
  char key[32];
  for (int i = 0; i < count; i++) {
    snprintf(key, sizeof key, "theta_%d", i);
    double theta = fx_meta(f, key);
    snprintf(key, sizeof key, "hd_%d", i);
    int hd = (int)fx_meta(f, key);
    snprintf(key, sizeof key, "inv_freq_%d", i);
    const fx_tensor *t = fx_get(f, key);
    cr_assert_eq(fx_numel(t), hd / 2);
    expect_table_matches("table", theta, hd, t->data);
  }
  fx_free(f);
  // The tables the golden cases were made with, too.
  const char *cases[] = {"kernels/rope_theta1e6_hd16.safetensors", "kernels/rope_theta1e4_hd8_mscale.safetensors"};
  for (int c = 0; c < 2; c++) {
    fx_file *g = fx_load(cases[c]);
    const fx_tensor *inv = fx_get(g, "inv_freq");
    expect_table_matches(cases[c], fx_meta(g, "theta"), (int)(2 * fx_numel(inv)), inv->data);
    fx_free(g);
  }
}

// The backward is the transposed rotation: with mscale = 1 it undoes the forward.
Test(rope, backward_inverts_forward) {
  enum { T = 5, NH = 3, HD = 32 };
  float x[T * NH * HD], y[T * NH * HD], inv[HD / 2];
  int32_t pos[T] = {40959, 0, 17, 17, 3001};
  df_test_fill_uniform(x, T * NH * HD, 31, -2, 2);
  df_rope_default_inv_freq(1e6, HD, inv);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, T, NH, HD), ty = df_f32(y, T, NH, HD), tp = df_i32(pos, T), ti = df_f32(inv, HD / 2);
  DF_ASSERT_OK(df_rope_forward(ctx, &tx, &tp, &ti, 1.0f, &ty, &err), &err);
  DF_ASSERT_OK(df_rope_backward(ctx, &ty, &tp, &ti, 1.0f, &ty, &err), &err);
  // cos² + sin² = 1 within ~2u in fp32, plus ~4 roundings per element. Measured worst: 1.2e-7.
  df_expect_close("x round trip", y, x, T * NH * HD, 4e-7, 0.0);
  df_ctx_destroy(ctx);
}

typedef struct {
  df_ctx *ctx;
  df_tensor x, pos, inv, y;
  float mscale;
  const float *r;
  int64_t n;
} rope_probe;

static double rope_probe_loss(void *p) {
  rope_probe *rp = p;
  df_error err = {0};
  df_rope_forward(rp->ctx, &rp->x, &rp->pos, &rp->inv, rp->mscale, &rp->y, &err);
  const float *y = rp->y.data;
  double s = 0;
  for (int64_t i = 0; i < rp->n; i++) s += (double)rp->r[i] * y[i];
  return s;
}

// y is linear in x, so central differences are exact up to fp32 rounding of the probe (≈ 1e-6 / 2h).
Test(rope, finite_differences) {
  enum { T = 3, NH = 2, HD = 8 };
  float x[T * NH * HD], y[T * NH * HD], r[T * NH * HD], dx[T * NH * HD], inv[HD / 2];
  int32_t pos[T] = {3000, 2, 2};
  df_test_fill_uniform(x, T * NH * HD, 41, -1, 1);
  df_test_fill_uniform(r, T * NH * HD, 42, -1, 1);
  df_rope_default_inv_freq(1e4, HD, inv);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  rope_probe rp = {ctx, df_f32(x, T, NH, HD), df_i32(pos, T), df_f32(inv, HD / 2), df_f32(y, T, NH, HD), 1.25f,
                   r,   T * NH * HD};
  df_tensor tr = df_f32(r, T, NH, HD), tdx = df_f32(dx, T, NH, HD);
  DF_ASSERT_OK(df_rope_backward(ctx, &tr, &rp.pos, &rp.inv, rp.mscale, &tdx, &err), &err);
  df_fd_check("dx", x, dx, T * NH * HD, rope_probe_loss, &rp, 1e-2, 1e-3, 1e-5, 64);
  df_ctx_destroy(ctx);
}

Test(rope, rejects_bad_arguments) {
  float x[56], y[48], inv[4] = {1, 1, 1, 1}; // x has room for the shifted overlapping view below
  for (int i = 0; i < 56; i++) x[i] = 0.5f;
  for (int i = 0; i < 48; i++) y[i] = 7.0f;
  int32_t pos[3] = {0, 1, 2};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, 3, 2, 8), ty = df_f32(y, 3, 2, 8), tp = df_i32(pos, 3), ti = df_f32(inv, 4);

  df_tensor x2d = df_f32(x, 6, 8);
  cr_expect_eq(df_rope_forward(ctx, &x2d, &tp, &ti, 1.0f, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  df_tensor x_odd = df_f32(x, 3, 2, 7), y_odd = df_f32(y, 3, 2, 7);
  cr_expect_eq(df_rope_forward(ctx, &x_odd, &tp, &ti, 1.0f, &y_odd, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  df_tensor p2 = df_i32(pos, 2);
  cr_expect_eq(df_rope_forward(ctx, &tx, &p2, &ti, 1.0f, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "pos");
  df_tensor p_f32 = df_f32(inv, 3);
  cr_expect_eq(df_rope_forward(ctx, &tx, &p_f32, &ti, 1.0f, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "pos");
  df_tensor i3 = df_f32(inv, 3);
  cr_expect_eq(df_rope_forward(ctx, &tx, &tp, &i3, 1.0f, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "inv_freq");
  df_tensor y_short = df_f32(y, 3, 2, 4);
  cr_expect_eq(df_rope_forward(ctx, &tx, &tp, &ti, 1.0f, &y_short, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "y");
  df_tensor y_shifted = df_f32(x + 8, 3, 2, 8); // overlaps x but is not x
  cr_expect_eq(df_rope_forward(ctx, &tx, &tp, &ti, 1.0f, &y_shifted, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "y");
  cr_expect_eq(df_rope_forward(ctx, &tx, &tp, &ti, INFINITY, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "mscale");
  for (int i = 0; i < 48; i++) cr_expect_eq(y[i], 7.0f, "y was written by a failed call");
  for (int i = 0; i < 56; i++) cr_expect_eq(x[i], 0.5f, "x was written by a failed call");

  df_tensor dx_short = df_f32(y, 3, 2, 4);
  cr_expect_eq(df_rope_backward(ctx, &tx, &tp, &ti, 1.0f, &dx_short, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dx");
  cr_expect_eq(df_rope_backward(ctx, &x2d, &tp, &ti, 1.0f, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dy");
  df_ctx_destroy(ctx);
}
