// Routed experts ("grouped") and the shared expert on plain arrays: the stable dispatch sort, the forward
// against a per-assignment double reference (with and without the SwiGLU clamp, with empty experts), the
// backward by finite differences (x, the three stacked weights, the combine weights), frozen experts,
// determinism across thread counts; the shared expert's gate (a zero gate weight halves the output) and its
// backward.
//
// Tolerances: forward against the double reference 2e-6 · max|ref| (fp32 GEMMs of length H or I <= 24);
// finite differences h = 1e-2 in fp32, 1e-3 · max|g| + 1e-4 (fp32 noise / h ≈ 1e-5, curvature ≈ h²).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/experts.h"
#include "moe/shared_expert.h"
#include "tests/common/fixture.h"

enum { H = 12, I = 10, E = 6, K = 2, T = 9, TK = T * K };

typedef struct {
  df_moe_experts_spec s;
  float w1[E * I * H], w3[E * I * H], w2[E * H * I];
  float g1[E * I * H], g3[E * I * H], g2[E * H * I];
  df_moe_experts_params p;
  int32_t idx[TK], counts[E];
  float w[TK];
  float x[T * H], y[T * H];
  float saved_gate[TK * I], saved_up[TK * I];
  int32_t slot[TK], token[TK], offsets[E + 1];
  df_moe_slots d;
  float *scratch;
  df_ctx *ctx;
} experts_case;

static void case_init(experts_case *c, float limit, int threads, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->s = (df_moe_experts_spec){.H = H, .I = I, .E = E, .k = K, .swiglu_limit = limit};
  df_test_fill_uniform(c->w1, E * I * H, seed, -0.5f, 0.5f);
  df_test_fill_uniform(c->w3, E * I * H, seed + 1, -0.5f, 0.5f);
  df_test_fill_uniform(c->w2, E * H * I, seed + 2, -0.5f, 0.5f);
  df_test_fill_uniform(c->x, T * H, seed + 3, -1.0f, 1.0f);
  df_test_fill_uniform(c->w, TK, seed + 4, 0.1f, 1.0f);
  // Routing: expert 4 never used, expert 1 used a lot; distinct per row.
  for (int t = 0; t < T; t++) {
    c->idx[t * K] = t % 3 == 0 ? 1 : (t % 5 == 0 ? 5 : (t * 7) % 4);
    c->idx[t * K + 1] = c->idx[t * K] == 1 ? ((t % 2) ? 0 : 3) : 1;
  }
  for (int i = 0; i < TK; i++) c->counts[c->idx[i]]++;
  c->p = (df_moe_experts_params){.w1 = df_view(c->w1, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, I, H)),
                                 .w3 = df_view(c->w3, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, I, H)),
                                 .w2 = df_view(c->w2, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, H, I)),
                                 .g1 = df_view(c->g1, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, I, H)),
                                 .g3 = df_view(c->g3, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, I, H)),
                                 .g2 = df_view(c->g2, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, H, I))};
  c->d = (df_moe_slots){
      .slot = c->slot, .token = c->token, .offsets = c->offsets, .gate = c->saved_gate, .up = c->saved_up};
  const int64_t n = df_moe_experts_backward_scratch_elems(&c->s, T);
  cr_assert_geq(n, df_moe_experts_forward_scratch_elems(&c->s, T));
  c->scratch = calloc((size_t)n, sizeof(float));
  c->ctx = df_test_cpu_ctx(threads);
}

static void case_free(experts_case *c) {
  free(c->scratch);
  df_ctx_destroy(c->ctx);
}

static void forward(experts_case *c) {
  df_error err = {0};
  df_tensor xt = df_f32(c->x, T, H), yt = df_f32(c->y, T, H);
  DF_ASSERT_OK(df_moe_experts_forward(c->ctx, &c->s, &c->p, &xt, c->idx, c->w, c->counts, &c->d, c->scratch, &yt, &err),
               &err);
}

static double silu_d(double a) { return a / (1.0 + exp(-a)); }

// y_t = Σ_j w_tj · w2_e · (silu(min(g, L)) · clamp(u, ±L)), in double.
static void reference(const experts_case *c, double *y) {
  const double L = c->s.swiglu_limit;
  memset(y, 0, sizeof(double) * T * H);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < K; j++) {
      const int e = c->idx[t * K + j];
      double a[I];
      for (int i = 0; i < I; i++) {
        double g = 0, u = 0;
        for (int h = 0; h < H; h++) {
          g += (double)c->w1[(e * I + i) * H + h] * c->x[t * H + h];
          u += (double)c->w3[(e * I + i) * H + h] * c->x[t * H + h];
        }
        if (L > 0) g = fmin(g, L), u = fmax(-L, fmin(u, L));
        a[i] = c->w[t * K + j] * silu_d(g) * u;
      }
      for (int h = 0; h < H; h++) {
        double o = 0;
        for (int i = 0; i < I; i++) o += (double)c->w2[(e * H + h) * I + i] * a[i];
        y[t * H + h] += o;
      }
    }
}

static void check_forward(float limit) {
  experts_case c;
  case_init(&c, limit, 2, 100);
  forward(&c);
  double want[T * H], mx = 0;
  reference(&c, want);
  for (int i = 0; i < T * H; i++) mx = fmax(mx, fabs(want[i]));
  for (int i = 0; i < T * H; i++)
    cr_expect_leq(fabs(c.y[i] - want[i]), 2e-6 * mx, "y[%d] = %.8g vs %.8g", i, c.y[i], want[i]);
  case_free(&c);
}

Test(experts, forward_matches_reference) { check_forward(0.0f); }
Test(experts, forward_matches_reference_with_clamp) { check_forward(0.4f); }

// Segments are the exclusive cumsum of the counts; inside a segment slots keep increasing order.
Test(experts, dispatch_is_a_stable_sort_by_expert) {
  experts_case c;
  case_init(&c, 0.0f, 1, 200);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_slots_plan(c.ctx, &c.s, T, c.idx, c.counts, &c.d, &err), &err);
  cr_expect_eq(c.offsets[0], 0);
  for (int e = 0; e < E; e++) {
    cr_expect_eq(c.offsets[e + 1] - c.offsets[e], c.counts[e], "segment %d", e);
    for (int q = c.offsets[e]; q < c.offsets[e + 1]; q++) {
      cr_expect_eq(c.idx[c.slot[q]], e, "position %d holds expert %d", q, e);
      cr_expect_eq(c.token[q], c.slot[q] / K);
      if (q > c.offsets[e]) cr_expect_lt(c.slot[q - 1], c.slot[q], "stable");
    }
  }
  cr_expect_eq(c.counts[4], 0, "the case keeps one expert empty");
  case_free(&c);
}

// ---- backward --------------------------------------------------------------------------------------------

typedef struct {
  experts_case *c;
  const float *probe;
} fd_ctx;

static double fd_loss(void *v) {
  fd_ctx *f = v;
  forward(f->c);
  double J = 0;
  for (int i = 0; i < T * H; i++) J += (double)f->probe[i] * f->c->y[i];
  return J;
}

static void backward(experts_case *c, const float *dy, float *dw, float *dx) {
  df_error err = {0};
  df_tensor xt = df_f32(c->x, T, H), dyt = df_f32((void *)dy, T, H), dxt = df_f32(dx, T, H);
  memset(dx, 0, sizeof(float) * T * H);
  DF_ASSERT_OK(df_moe_experts_backward(c->ctx, &c->s, &c->p, &xt, &dyt, c->w, &c->d, c->scratch, dw, &dxt, &err), &err);
}

static void check_backward(float limit) {
  experts_case c;
  case_init(&c, limit, 1, 300);
  float probe[T * H], dx[T * H], dw[TK];
  df_test_fill_uniform(probe, T * H, 301, -1.0f, 1.0f);
  forward(&c);
  backward(&c, probe, dw, dx);
  fd_ctx f = {.c = &c, .probe = probe};
  const double h = 1e-2, rtol = 1e-3, atol = 1e-4;
  df_fd_check("x", c.x, dx, T * H, fd_loss, &f, h, rtol, atol, 60);
  df_fd_check("combine weights", c.w, dw, TK, fd_loss, &f, h, rtol, atol, TK);
  df_fd_check("w1", c.w1, c.g1, E * I * H, fd_loss, &f, h, rtol, atol, 60);
  df_fd_check("w3", c.w3, c.g3, E * I * H, fd_loss, &f, h, rtol, atol, 60);
  df_fd_check("w2", c.w2, c.g2, E * H * I, fd_loss, &f, h, rtol, atol, 60);
  for (int i = 4 * I * H; i < 5 * I * H; i++) cr_assert_eq(c.g1[i], 0.0f, "an empty expert gets an explicit zero");
  case_free(&c);
}

Test(experts, backward_finite_differences) { check_backward(0.0f); }
// A clamp above most pre-activations, so the finite differences rarely straddle a kink.
Test(experts, backward_finite_differences_with_clamp) { check_backward(1.5f); }

// Frozen: the gradient views are not touched; dx and the combine-weight gradient are unchanged.
Test(experts, frozen_experts_leave_gradients_alone) {
  experts_case a, b;
  case_init(&a, 0.0f, 1, 400);
  case_init(&b, 0.0f, 1, 400);
  b.p.frozen = true;
  for (int i = 0; i < E * I * H; i++) b.g1[i] = b.g3[i] = b.g2[i] = 7.0f;
  float probe[T * H], dxa[T * H], dxb[T * H], dwa[TK], dwb[TK];
  df_test_fill_uniform(probe, T * H, 401, -1.0f, 1.0f);
  forward(&a);
  forward(&b);
  backward(&a, probe, dwa, dxa);
  backward(&b, probe, dwb, dxb);
  cr_expect(!memcmp(dxa, dxb, sizeof dxa) && !memcmp(dwa, dwb, sizeof dwa));
  for (int i = 0; i < E * I * H; i++) cr_assert(b.g1[i] == 7.0f && b.g3[i] == 7.0f && b.g2[i] == 7.0f);
  case_free(&a);
  case_free(&b);
}

Test(experts, deterministic_across_thread_counts) {
  float y[3][T * H], dx[3][T * H], g2[3][E * H * I];
  for (int r = 0; r < 3; r++) {
    experts_case c;
    case_init(&c, 0.0f, r + 1, 500);
    float probe[T * H], dw[TK];
    df_test_fill_uniform(probe, T * H, 501, -1.0f, 1.0f);
    forward(&c);
    memcpy(y[r], c.y, sizeof y[r]);
    backward(&c, probe, dw, dx[r]);
    memcpy(g2[r], c.g2, sizeof g2[r]);
    case_free(&c);
  }
  for (int r = 1; r < 3; r++)
    cr_expect(!memcmp(y[0], y[r], sizeof y[0]) && !memcmp(dx[0], dx[r], sizeof dx[0]) &&
              !memcmp(g2[0], g2[r], sizeof g2[0]));
}

// ---- shared expert -------------------------------------------------------------------------------------

enum { S = 7 };

typedef struct {
  df_moe_shared_spec s;
  float w1[S * H], w3[S * H], w2[H * S], gate[H];
  float g1[S * H], g3[S * H], g2[H * S], ggate[H];
  df_moe_shared_params p;
  float saved[2 * T * S + T];
  df_moe_shared_saved sv;
  float *scratch;
  float x[T * H], y[T * H];
  df_ctx *ctx;
} shared_case;

static void shared_init(shared_case *c, bool gated, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->s = (df_moe_shared_spec){.H = H, .S = S, .gated = gated};
  df_test_fill_uniform(c->w1, S * H, seed, -0.5f, 0.5f);
  df_test_fill_uniform(c->w3, S * H, seed + 1, -0.5f, 0.5f);
  df_test_fill_uniform(c->w2, H * S, seed + 2, -0.5f, 0.5f);
  df_test_fill_uniform(c->gate, H, seed + 3, -0.5f, 0.5f);
  df_test_fill_uniform(c->x, T * H, seed + 4, -1.0f, 1.0f);
  c->p = (df_moe_shared_params){.w1 = df_f32(c->w1, S, H),
                                .w3 = df_f32(c->w3, S, H),
                                .w2 = df_f32(c->w2, H, S),
                                .gate = df_f32(c->gate, 1, H),
                                .g1 = df_f32(c->g1, S, H),
                                .g3 = df_f32(c->g3, S, H),
                                .g2 = df_f32(c->g2, H, S),
                                .ggate = df_f32(c->ggate, 1, H)};
  cr_assert_leq(df_moe_shared_saved_elems(&c->s, T), 2 * T * S + T);
  c->sv = df_moe_shared_saved_at(&c->s, T, c->saved);
  c->scratch = calloc((size_t)df_moe_shared_scratch_elems(&c->s, T), sizeof(float));
  c->ctx = df_test_cpu_ctx(1);
}

static void shared_free(shared_case *c) {
  free(c->scratch);
  df_ctx_destroy(c->ctx);
}

static void shared_forward(shared_case *c) {
  df_error err = {0};
  memset(c->y, 0, sizeof c->y);
  df_tensor xt = df_f32(c->x, T, H), yt = df_f32(c->y, T, H);
  DF_ASSERT_OK(df_moe_shared_forward(c->ctx, &c->s, &c->p, &xt, &c->sv, c->scratch, &yt, &err), &err);
}

// sigmoid(0) = 0.5 exactly, and scaling by 0.5 is exact in binary floating point.
Test(shared_expert, zero_gate_weight_halves_the_output) {
  shared_case a, b;
  shared_init(&a, false, 600);
  shared_init(&b, true, 600);
  memset(b.gate, 0, sizeof b.gate);
  shared_forward(&a);
  shared_forward(&b);
  for (int i = 0; i < T * H; i++) cr_assert_eq(b.y[i], 0.5f * a.y[i], "y[%d]: %.9g vs half of %.9g", i, b.y[i], a.y[i]);
  shared_free(&a);
  shared_free(&b);
}

typedef struct {
  shared_case *c;
  const float *probe;
} shared_fd;

static double shared_loss(void *v) {
  shared_fd *f = v;
  shared_forward(f->c);
  double J = 0;
  for (int i = 0; i < T * H; i++) J += (double)f->probe[i] * f->c->y[i];
  return J;
}

static void check_shared_backward(bool gated) {
  shared_case c;
  shared_init(&c, gated, 700);
  float probe[T * H], dx[T * H];
  df_test_fill_uniform(probe, T * H, 701, -1.0f, 1.0f);
  memset(dx, 0, sizeof dx);
  shared_forward(&c);
  df_error err = {0};
  df_tensor xt = df_f32(c.x, T, H), dyt = df_f32(probe, T, H), dxt = df_f32(dx, T, H);
  DF_ASSERT_OK(df_moe_shared_backward(c.ctx, &c.s, &c.p, &xt, &dyt, &c.sv, c.scratch, &dxt, &err), &err);
  shared_fd f = {.c = &c, .probe = probe};
  df_fd_check("x", c.x, dx, T * H, shared_loss, &f, 1e-2, 1e-3, 1e-4, 60);
  df_fd_check("w1", c.w1, c.g1, S * H, shared_loss, &f, 1e-2, 1e-3, 1e-4, 40);
  df_fd_check("w3", c.w3, c.g3, S * H, shared_loss, &f, 1e-2, 1e-3, 1e-4, 40);
  df_fd_check("w2", c.w2, c.g2, H * S, shared_loss, &f, 1e-2, 1e-3, 1e-4, 40);
  if (gated) df_fd_check("gate", c.gate, c.ggate, H, shared_loss, &f, 1e-2, 1e-3, 1e-4, H);
  shared_free(&c);
}

Test(shared_expert, backward_finite_differences_gated) { check_shared_backward(true); }
Test(shared_expert, backward_finite_differences_ungated) { check_shared_backward(false); }
