// DSpark loss extras: softmax L1 distance and BCE with logits against PyTorch golden data, finite
// differences, a naive double reference on a wide vocabulary, argument errors.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

// Golden L1 (R = 7, V = 37): random rows, identical p and q (l1 = 0, zero grad), logits reaching ±30, a tied
// maximum in p, a nearly flat teacher, dl1 = 0 on one row. P and Q carry ~1 ulp (exp) + 1 ulp (scaling)
// of relative error, so Σ_v |P − Q| ≤ 2 is off by ≲ 4·2⁻²⁴·2 ≈ 5e−7: l1 atol 1e−6. dp_j = dl1·P_j·(s_j − a)
// has the same relative error per term: 1e−6 of max|dp| + 1e−7.
Test(softmax_l1, golden) {
  fx_file *f = fx_load("kernels/dspark_l1.safetensors");
  df_tensor p = fx_view(f, "p"), q = fx_view(f, "q"), dl1 = fx_view(f, "dl1");
  int64_t R = p.shape[0], V = p.shape[1];
  float *l1 = malloc(4 * (size_t)R), *dp = malloc(4 * (size_t)(R * V));
  df_tensor tl1 = df_f32(l1, R), tdp = df_f32(dp, R, V);
  for (int t = 1; t <= 2; t++) {
    df_ctx *ctx = df_test_cpu_ctx(t);
    df_error err = {0};
    for (int64_t i = 0; i < R * V; i++) dp[i] = NAN;
    DF_ASSERT_OK(df_softmax_l1_forward(ctx, &p, &q, &tl1, &err), &err);
    df_expect_close("l1", l1, fx_get(f, "l1")->data, R, 0, 1e-6);
    DF_ASSERT_OK(df_softmax_l1_backward(ctx, &p, &q, &dl1, &tdp, &err), &err);
    df_expect_close("dp", dp, fx_get(f, "dp")->data, R * V, 1e-6, 1e-7);
    // Identical rows: exactly zero distance and gradient (torch.sign(0) = 0); dl1 = 0: zero gradient.
    cr_expect_eq(l1[1], 0.0f, "l1 of identical rows");
    for (int64_t v = 0; v < V; v++) {
      cr_expect_eq(dp[1 * V + v], 0.0f, "dp of identical rows [%lld]", (long long)v);
      cr_expect_eq(dp[5 * V + v], 0.0f, "dp where dl1 = 0 [%lld]", (long long)v);
    }
    df_ctx_destroy(ctx);
  }
  free(l1), free(dp);
  fx_free(f);
}

// Naive double reference for one row set: l1 and dp.
static void naive_l1(const float *p, const float *q, const float *dl1, int64_t R, int64_t V, double *l1, double *dp) {
  double *P = malloc(8 * (size_t)V), *Q = malloc(8 * (size_t)V);
  for (int64_t r = 0; r < R; r++) {
    const float *pr = p + r * V, *qr = q + r * V;
    double mp = -INFINITY, mq = -INFINITY, sp = 0, sq = 0, a = 0;
    for (int64_t v = 0; v < V; v++) mp = fmax(mp, pr[v]), mq = fmax(mq, qr[v]);
    for (int64_t v = 0; v < V; v++) sp += exp(pr[v] - mp), sq += exp(qr[v] - mq);
    l1[r] = 0;
    for (int64_t v = 0; v < V; v++) {
      P[v] = exp(pr[v] - mp) / sp, Q[v] = exp(qr[v] - mq) / sq;
      l1[r] += fabs(P[v] - Q[v]);
      a += (P[v] > Q[v] ? 1 : P[v] < Q[v] ? -1 : 0) * P[v];
    }
    for (int64_t v = 0; v < V; v++) dp[r * V + v] = dl1[r] * P[v] * ((P[v] > Q[v] ? 1 : P[v] < Q[v] ? -1 : 0) - a);
  }
  free(P), free(Q);
}

// A wide vocabulary (many vector iterations, a remainder) and more rows than threads.
Test(softmax_l1, wide_vocab_matches_naive_reference) {
  enum { R = 9, V = 5003 };
  float *p = malloc(4 * R * V), *q = malloc(4 * R * V), *dp = malloc(4 * R * V), *dpw = malloc(4 * R * V);
  float dl1[R], l1[R], l1w[R];
  double *rdp = malloc(8 * R * V), rl1[R];
  df_test_fill_uniform(p, R * V, 31, -12, 12);
  df_test_fill_uniform(q, R * V, 32, -12, 12);
  df_test_fill_uniform(dl1, R, 33, -2, 2);
  naive_l1(p, q, dl1, R, V, rl1, rdp);
  for (int i = 0; i < R; i++) l1w[i] = (float)rl1[i];
  for (int i = 0; i < R * V; i++) dpw[i] = (float)rdp[i];
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor tp = df_f32(p, R, V), tq = df_f32(q, R, V), tdl1 = df_f32(dl1, R), tl1 = df_f32(l1, R),
            tdp = df_f32(dp, R, V);
  DF_ASSERT_OK(df_softmax_l1_forward(ctx, &tp, &tq, &tl1, &err), &err);
  DF_ASSERT_OK(df_softmax_l1_backward(ctx, &tp, &tq, &tdl1, &tdp, &err), &err);
  df_expect_close("l1", l1, l1w, R, 0, 1e-6);
  // Same error model as the golden test; the row sums over V = 5003 terms are in double.
  df_expect_close("dp", dp, dpw, R * V, 1e-6, 1e-9);
  df_ctx_destroy(ctx);
  free(p), free(q), free(dp), free(dpw), free(rdp);
}

// torch.sign(0) = 0: an element with P_j = Q_j exactly passes no gradient and stays out of Σ s·P. With
// p = [0, 0, a, b], q = [0, 0, b, a] both rows have the same float exps, summed exactly in double, so
// P_0 = Q_0 and P_1 = Q_1 bit for bit; then a = |P_2 − P_3| and dp_0 = dp_1 = −dl1·P_0·a (sign(0) = ±1 would
// give dl1·P_0·(±1 − ...), far off).
Test(softmax_l1, exact_ties_pass_no_gradient) {
  float p[4] = {0, 0, -0.5f, -2.0f}, q[4] = {0, 0, -2.0f, -0.5f}, dl1 = 1.5f, l1, dp[4];
  double e2 = exp(-0.5), e3 = exp(-2.0), sum = 2 + e2 + e3, P[4] = {1 / sum, 1 / sum, e2 / sum, e3 / sum};
  double a = fabs(P[2] - P[3]);
  float want[4] = {(float)(-dl1 * P[0] * a), (float)(-dl1 * P[1] * a), (float)(dl1 * P[2] * (1 - a)),
                   (float)(dl1 * P[3] * (-1 - a))};
  float want_l1 = (float)(2 * a);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tp = df_f32(p, 1, 4), tq = df_f32(q, 1, 4), tdl1 = df_f32(&dl1, 1), tl1 = df_f32(&l1, 1),
            tdp = df_f32(dp, 1, 4);
  DF_ASSERT_OK(df_softmax_l1_forward(ctx, &tp, &tq, &tl1, &err), &err);
  DF_ASSERT_OK(df_softmax_l1_backward(ctx, &tp, &tq, &tdl1, &tdp, &err), &err);
  df_expect_close("l1", &l1, &want_l1, 1, 1e-6, 0);
  df_expect_close("dp", dp, want, 4, 1e-6, 0);
  df_ctx_destroy(ctx);
}

typedef struct {
  df_ctx *ctx;
  df_tensor p, q, l1;
  const float *r;
  int64_t R;
} l1_probe;

static double l1_probe_loss(void *ctx) {
  l1_probe *lp = ctx;
  df_error err = {0};
  df_softmax_l1_forward(lp->ctx, &lp->p, &lp->q, &lp->l1, &err);
  const float *l1 = lp->l1.data;
  double s = 0;
  for (int64_t i = 0; i < lp->R; i++) s += (double)lp->r[i] * l1[i];
  return s;
}

Test(softmax_l1, finite_differences) {
  enum { R = 3, V = 6 };
  float p[R * V], q[R * V], r[R], l1[R], dp[R * V];
  df_test_fill_uniform(p, R * V, 41, -2, 2);
  df_test_fill_uniform(q, R * V, 42, -2, 2);
  df_test_fill_uniform(r, R, 43, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  l1_probe lp = {ctx, df_f32(p, R, V), df_f32(q, R, V), df_f32(l1, R), r, R};
  df_tensor tr = df_f32(r, R), tdp = df_f32(dp, R, V);
  DF_ASSERT_OK(df_softmax_l1_backward(ctx, &lp.p, &lp.q, &tr, &tdp, &err), &err);
  // |P − Q| is smooth while no element crosses P = Q: h = 1e−3 keeps every element on its side here
  // (min |P − Q| ≫ h·|∂P/∂p|), truncation ~h² and fp32 noise up to ~1e−7/h = 1e−4 (observed ≤ 3e−5).
  df_fd_check("dp", p, dp, R * V, l1_probe_loss, &lp, 1e-3, 5e-4, 5e-5, 64);
  df_ctx_destroy(ctx);
}

// Golden BCE (40 elements): x = ±30, 0, ±1e−3, 17.5, ±88 and random, t ∈ {0, ½, 1, random}, dloss = 0 once.
// Computed in double, so the op is within 1 fp32 ulp of the exact value: rtol 2e−7 elementwise. torch's
// float64 form log(exp(−m) + exp(−x−m)) loses ~1e−16 absolute where the loss is ~1e−13 (x = ±30): atol 1e−15.
Test(bce_logits, golden) {
  fx_file *f = fx_load("kernels/dspark_bce.safetensors");
  df_tensor x = fx_view(f, "x"), t = fx_view(f, "t"), dloss = fx_view(f, "dloss");
  int64_t n = df_numel(&x);
  float *loss = malloc(4 * (size_t)n), *dx = malloc(4 * (size_t)n);
  df_tensor tl = df_f32(loss, n), tdx = df_f32(dx, n);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  DF_ASSERT_OK(df_bce_logits_forward(ctx, &x, &t, &tl, &err), &err);
  df_expect_close_elementwise("loss", loss, fx_get(f, "loss")->data, n, 2e-7, 1e-15);
  DF_ASSERT_OK(df_bce_logits_backward(ctx, &x, &t, &dloss, &tdx, &err), &err);
  df_expect_close_elementwise("dx", dx, fx_get(f, "dx")->data, n, 2e-7, 1e-15);
  for (int64_t i = 0; i < n; i++) cr_expect(isfinite(loss[i]) && isfinite(dx[i]), "finite at %lld", (long long)i);
  df_ctx_destroy(ctx);
  free(loss), free(dx);
  fx_free(f);
}

typedef struct {
  df_ctx *ctx;
  df_tensor x, t, loss;
  const float *r;
  int64_t n;
} bce_probe;

static double bce_probe_loss(void *ctx) {
  bce_probe *bp = ctx;
  df_error err = {0};
  df_bce_logits_forward(bp->ctx, &bp->x, &bp->t, &bp->loss, &err);
  const float *l = bp->loss.data;
  double s = 0;
  for (int64_t i = 0; i < bp->n; i++) s += (double)bp->r[i] * l[i];
  return s;
}

Test(bce_logits, finite_differences) {
  enum { N = 9 };
  float x[N] = {-6, -2.5f, -0.7f, -0.1f, 0.05f, 0.4f, 1.3f, 3, 7}, t[N] = {0, 1, 0.3f, 0.5f, 1, 0, 0.9f, 1, 0};
  float r[N], loss[N], dx[N];
  df_test_fill_uniform(r, N, 51, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  bce_probe bp = {ctx, df_f32(x, N), df_f32(t, N), df_f32(loss, N), r, N};
  df_tensor tr = df_f32(r, N), tdx = df_f32(dx, N);
  DF_ASSERT_OK(df_bce_logits_backward(ctx, &bp.x, &bp.t, &tr, &tdx, &err), &err);
  // |loss''| ≤ ¼, |loss'''| < 0.1: h = 1e−2 gives truncation < 1e−6; fp32 rounding of the probe ~1e−7/h = 1e−5
  // (observed ≤ 1.6e−5).
  df_fd_check("dx", x, dx, N, bce_probe_loss, &bp, 1e-2, 1e-4, 3e-5, 64);
  df_ctx_destroy(ctx);
}

Test(softmax_l1, rejects_bad_arguments) {
  float p[12] = {0}, q[12] = {0}, l1[4] = {0}, dp[12] = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tp = df_f32(p, 3, 4), tq = df_f32(q, 3, 4), tl1 = df_f32(l1, 3), tdp = df_f32(dp, 3, 4);
  df_tensor q_wide = df_f32(q, 2, 6), q_short = df_f32(q, 2, 4), l1_bad = df_f32(l1, 4), dp_bad = df_f32(dp, 2, 4);
  df_tensor p_i32 = df_i32(p, 3, 4);
  l1[0] = 42.0f;
  cr_expect_eq(df_softmax_l1_forward(ctx, &tp, &q_wide, &tl1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "q");
  cr_expect_eq(df_softmax_l1_forward(ctx, &tp, &q_short, &tl1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "q");
  cr_expect_eq(df_softmax_l1_forward(ctx, &p_i32, &tq, &tl1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "p");
  cr_expect_eq(df_softmax_l1_forward(ctx, &tp, &tq, &l1_bad, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "l1");
  cr_expect_eq(l1[0], 42.0f, "nothing written");
  cr_expect_eq(df_softmax_l1_backward(ctx, &tp, &tq, &l1_bad, &tdp, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dl1");
  cr_expect_eq(df_softmax_l1_backward(ctx, &tp, &tq, &tl1, &dp_bad, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dp");
  cr_expect_eq(df_softmax_l1_backward(ctx, &tp, &tq, &tl1, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dp");
  df_ctx_destroy(ctx);
}

Test(bce_logits, rejects_bad_arguments) {
  float x[4] = {0}, t[4] = {0}, loss[4] = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tx = df_f32(x, 4), tt = df_f32(t, 4), tl = df_f32(loss, 4);
  df_tensor t3 = df_f32(t, 3), l3 = df_f32(loss, 3), x_i32 = df_i32(x, 4), t_u8 = df_u8(t, 4);
  cr_expect_eq(df_bce_logits_forward(ctx, &tx, &t3, &tl, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "t");
  cr_expect_eq(df_bce_logits_forward(ctx, &tx, &t_u8, &tl, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "t");
  cr_expect_eq(df_bce_logits_forward(ctx, &x_i32, &tt, &tl, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  cr_expect_eq(df_bce_logits_forward(ctx, &tx, &tt, &l3, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "loss");
  cr_expect_eq(df_bce_logits_backward(ctx, &tx, &tt, &l3, &tl, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dloss");
  cr_expect_eq(df_bce_logits_backward(ctx, &tx, &tt, &tl, &l3, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dx");
  df_ctx_destroy(ctx);
}
