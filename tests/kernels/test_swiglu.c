// SwiGLU: PyTorch golden data with and without the clamp (values exactly at ±L and far beyond), the exp
// polynomial over a wide range, NaN propagation, finite differences, argument errors.
//
// Tolerances (u = 2^-24 ≈ 6e-8; references are float64; measured worst in []):
// - h, du: elementwise 4e-7 (≈ 7u): exp is a ~1 ulp polynomial, then 1/(1 + e) and two products. [1.8e-7]
// - dg: 4e-7 · max|dg|. silu'(a) = s·(1 + a·(1 − s)) cancels near its zero (a ≈ −1.28), so the error is
//   bounded by the size of the terms, not by each element. [6.9e-8]
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

static void check_golden(const char *file) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor g = fx_view(f, "g"), u = fx_view(f, "u"), dh = fx_view(f, "dh");
  const float limit = (float)fx_meta(f, "limit");
  const int64_t n = df_numel(&g);
  float *h = calloc((size_t)n, 4), *dg = calloc((size_t)n, 4), *du = calloc((size_t)n, 4);
  df_tensor th = df_view(h, DF_F32, DF_DEV_CPU, g.ndim, g.shape);
  df_tensor tdg = df_view(dg, DF_F32, DF_DEV_CPU, g.ndim, g.shape),
            tdu = df_view(du, DF_F32, DF_DEV_CPU, g.ndim, g.shape);
  DF_ASSERT_OK(df_swiglu_forward(ctx, &g, &u, limit, &th, &err), &err);
  df_expect_close_elementwise("h", h, fx_get(f, "h")->data, n, 4e-7, 0.0);
  DF_ASSERT_OK(df_swiglu_backward(ctx, &dh, &g, &u, limit, &tdg, &tdu, &err), &err);
  df_expect_close("dg", dg, fx_get(f, "dg")->data, n, 4e-7, 0.0);
  df_expect_close_elementwise("du", du, fx_get(f, "du")->data, n, 4e-7, 0.0);
  free(h), free(dg), free(du);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(swiglu, golden_no_limit) { check_golden("kernels/swiglu_nolimit.safetensors"); }
Test(swiglu, golden_limit) { check_golden("kernels/swiglu_limit.safetensors"); }

// The planted first row of the clamped case: g = [L, −L, L, 40, −40, 0], u = [L, −L, −L, 40, −40, L].
// torch.clamp passes gradient at the bounds (inclusive) and none beyond them.
Test(swiglu, clamp_gradient_is_inclusive) {
  fx_file *f = fx_load("kernels/swiglu_limit.safetensors");
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor g = fx_view(f, "g"), u = fx_view(f, "u"), dh = fx_view(f, "dh");
  const float limit = (float)fx_meta(f, "limit");
  const float *gd = g.data, *ud = u.data;
  cr_assert(gd[0] == limit && gd[3] > limit && ud[2] == -limit && ud[3] > limit, "fixture lost its planted values");
  const int64_t n = df_numel(&g);
  float *dg = calloc((size_t)n, 4), *du = calloc((size_t)n, 4), *h = calloc((size_t)n, 4);
  df_tensor tdg = df_view(dg, DF_F32, DF_DEV_CPU, 2, g.shape), tdu = df_view(du, DF_F32, DF_DEV_CPU, 2, g.shape);
  df_tensor th = df_view(h, DF_F32, DF_DEV_CPU, 2, g.shape);
  DF_ASSERT_OK(df_swiglu_forward(ctx, &g, &u, limit, &th, &err), &err);
  DF_ASSERT_OK(df_swiglu_backward(ctx, &dh, &g, &u, limit, &tdg, &tdu, &err), &err);
  cr_expect_neq(dg[0], 0.0f, "g = L passes gradient");
  cr_expect_neq(dg[1], 0.0f, "g = -L passes gradient (one-sided clamp)");
  cr_expect_eq(dg[3], 0.0f, "g > L passes none");
  cr_expect_neq(dg[4], 0.0f, "g = -40 is not clamped (one-sided)");
  cr_expect_neq(du[0], 0.0f, "u = L passes gradient");
  cr_expect_neq(du[1], 0.0f, "u = -L passes gradient");
  cr_expect_eq(du[3], 0.0f, "u > L passes none");
  cr_expect_eq(du[4], 0.0f, "u < -L passes none");
  // Beyond the clamp the forward uses the bound: h(g = 40, u = 40) = silu(L)·L.
  const double sl = limit / (1.0 + exp(-(double)limit)) * limit;
  cr_expect_float_eq(h[3], (float)sl, 1e-6f * (float)sl, "h at g = u = 40 is silu(L)·L");
  free(dg), free(du), free(h);
  df_ctx_destroy(ctx);
  fx_free(f);
}

// The exp polynomial over the range where it is not clamped, against double silu: elementwise 4e-7.
Test(swiglu, silu_over_wide_range) {
  enum { N = 4001 };
  float *g = malloc(N * 4), *u = malloc(N * 4), *h = malloc(N * 4), *want = malloc(N * 4);
  for (int i = 0; i < N; i++) {
    g[i] = -80.0f + 160.0f * (float)i / (N - 1);
    u[i] = 1.0f;
    want[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])));
  }
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tg = df_f32(g, N), tu = df_f32(u, N), th = df_f32(h, N);
  DF_ASSERT_OK(df_swiglu_forward(ctx, &tg, &tu, 0.0f, &th, &err), &err);
  df_expect_close_elementwise("silu(g)", h, want, N, 4e-7, 0.0);
  // Far below the polynomial's range silu is ~0 (|x·e^x| < 1e-30) and must stay finite.
  g[0] = -200.0f, g[1] = 200.0f, g[2] = NAN;
  DF_ASSERT_OK(df_swiglu_forward(ctx, &tg, &tu, 0.0f, &th, &err), &err);
  cr_expect(isfinite(h[0]) && fabsf(h[0]) < 1e-30f, "silu(-200) = %g", (double)h[0]);
  cr_expect_float_eq(h[1], 200.0f, 1e-5f, "silu(200)");
  cr_expect(isnan(h[2]), "NaN input gives NaN, got %g", (double)h[2]);
  free(g), free(u), free(h), free(want);
  df_ctx_destroy(ctx);
}

typedef struct {
  df_ctx *ctx;
  df_tensor g, u, h;
  float limit;
  const float *r;
  int64_t n;
} swiglu_probe;

static double swiglu_probe_loss(void *p) {
  swiglu_probe *sp = p;
  df_error err = {0};
  df_swiglu_forward(sp->ctx, &sp->g, &sp->u, sp->limit, &sp->h, &err);
  const float *h = sp->h.data;
  double s = 0;
  for (int64_t i = 0; i < sp->n; i++) s += (double)sp->r[i] * h[i];
  return s;
}

// Inputs kept 0.05 away from ±L so the h = 1e-2 stencil never straddles the clamp's kink.
static void nudge_off_kinks(float *x, int64_t n, float limit) {
  for (int64_t i = 0; i < n; i++) {
    if (fabsf(x[i] - limit) < 0.05f) x[i] = limit + (x[i] < limit ? -0.05f : 0.05f);
    if (fabsf(x[i] + limit) < 0.05f) x[i] = -limit + (x[i] < -limit ? -0.05f : 0.05f);
  }
}

// h = 1e-2: truncation O(h²·f''') ≈ 1e-5 and fp32 noise ≈ 1e-7 / 2h; a wrong gradient is off by O(1).
static void fd_case(float limit) {
  enum { N = 24 };
  float g[N], u[N], h[N], r[N], dg[N], du[N];
  df_test_fill_uniform(g, N, 51, -3, 3);
  df_test_fill_uniform(u, N, 52, -3, 3);
  df_test_fill_uniform(r, N, 53, -1, 1);
  if (limit > 0) nudge_off_kinks(g, N, limit), nudge_off_kinks(u, N, limit);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  swiglu_probe sp = {ctx, df_f32(g, 4, 6), df_f32(u, 4, 6), df_f32(h, 4, 6), limit, r, N};
  df_tensor tr = df_f32(r, 4, 6), tdg = df_f32(dg, 4, 6), tdu = df_f32(du, 4, 6);
  DF_ASSERT_OK(df_swiglu_backward(ctx, &tr, &sp.g, &sp.u, limit, &tdg, &tdu, &err), &err);
  df_fd_check("dg", g, dg, N, swiglu_probe_loss, &sp, 1e-2, 1e-3, 1e-4, 64);
  df_fd_check("du", u, du, N, swiglu_probe_loss, &sp, 1e-2, 1e-3, 1e-4, 64);
  df_ctx_destroy(ctx);
}

Test(swiglu, finite_differences_no_limit) { fd_case(0.0f); }
Test(swiglu, finite_differences_limit) { fd_case(1.0f); }

Test(swiglu, rejects_bad_arguments) {
  float g[12] = {0}, u[12] = {0}, h[12], dg[12] = {0}, du[12] = {0};
  for (int i = 0; i < 12; i++) h[i] = 7.0f;
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tg = df_f32(g, 3, 4), tu = df_f32(u, 3, 4), th = df_f32(h, 3, 4), tdg = df_f32(dg, 3, 4),
            tdu = df_f32(du, 3, 4);
  df_tensor u_short = df_f32(u, 2, 4);
  cr_expect_eq(df_swiglu_forward(ctx, &tg, &u_short, 0.0f, &th, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "u");
  df_tensor h_short = df_f32(h, 11);
  cr_expect_eq(df_swiglu_forward(ctx, &tg, &tu, 0.0f, &h_short, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "h");
  cr_expect_eq(df_swiglu_forward(ctx, &tg, &tu, -1.0f, &th, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "limit");
  cr_expect_eq(df_swiglu_forward(ctx, &tg, &tu, NAN, &th, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "limit");
  df_tensor g_i32 = df_i32(g, 3, 4);
  cr_expect_eq(df_swiglu_forward(ctx, &g_i32, &tu, 0.0f, &th, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "g");
  for (int i = 0; i < 12; i++) cr_expect_eq(h[i], 7.0f, "h was written by a failed call");

  df_tensor dg_short = df_f32(dg, 2, 4);
  cr_expect_eq(df_swiglu_backward(ctx, &th, &tg, &tu, 0.0f, &dg_short, &tdu, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dg");
  df_tensor du_i32 = df_i32(du, 3, 4);
  cr_expect_eq(df_swiglu_backward(ctx, &th, &tg, &tu, 0.0f, &tdg, &du_i32, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "du");
  df_tensor dh_short = df_f32(h, 4);
  cr_expect_eq(df_swiglu_backward(ctx, &dh_short, &tg, &tu, 0.0f, &tdg, &tdu, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dh");
  df_ctx_destroy(ctx);
}
