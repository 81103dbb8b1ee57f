// The MoE router pieces on plain arrays: score functions (values, stability, gradients), selection
// properties (distinct indices, counts, weights summing to the scale, ties, selection bias, group limit),
// the combine-weight backward, centering, the switch aux loss against transformers' load_balancing_loss_func
// (tests/fixtures/moe/aux_*.safetensors), load statistics and spec errors.
//
// Tolerances: score values against double formulas 2 ulp-ish (2e-7 relative); gradients against central
// differences in double of the same double formulas (h = 1e-4, 1e-6 relative to max|g| + 1e-7 — the C side
// rounds to fp32 once); the aux loss against the fixture 1e-6 relative (fp32 scores summed in double).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/aux_loss.h"
#include "moe/router.h"
#include "tests/common/fixture.h"

// The ops on host arrays (CPU context).
static void scores_fwd(df_ctx *ctx, df_moe_score_func f, int64_t T, int64_t E, const float *l, float *s) {
  df_tensor lt = df_f32(l, T, E), st = df_f32(s, T, E);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_scores_forward(ctx, f, &lt, &st, &err), &err);
}

static void scores_bwd(df_ctx *ctx, df_moe_score_func f, int64_t T, int64_t E, const float *l, const float *s,
                       const float *ds, float *dl) {
  df_tensor lt = df_f32(l, T, E), st = df_f32(s, T, E), dst = df_f32(ds, T, E), dlt = df_f32(dl, T, E);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_scores_backward(ctx, f, &lt, &st, &dst, &dlt, &err), &err);
}

// df_moe_route_stats of one routing: stats[DF_MOE_STATS(E)].
static void route_stats(df_ctx *ctx, double coeff, int64_t T, int64_t E, int64_t k, const float *scores,
                        const int32_t *counts, double *stats) {
  df_moe_stats_desc d = {.aux = DF_MOE_AUX_SWITCH, .coeff = coeff, .k = k, .den = 1.0};
  df_tensor sc = df_f32(scores, T, E), cn = df_i32(counts, E), st = df_f64_on(DF_DEV_CPU, stats, DF_MOE_STATS(E));
  df_error err = {0};
  DF_ASSERT_OK(df_moe_route_stats(ctx, &d, &sc, &cn, NULL, &st, false, NULL, &err), &err);
}

static df_moe_router_spec spec(int64_t E, int64_t k) {
  return (df_moe_router_spec){.H = 8,
                              .E = E,
                              .k = k,
                              .score_func = DF_MOE_SCORE_SOFTMAX,
                              .norm_topk_prob = true,
                              .routed_scaling_factor = 1.0f,
                              .n_group = 1,
                              .topk_group = 1};
}

// Routing buffers for T rows.
typedef struct {
  df_moe_routing r;
} routing_buf;

static routing_buf rb_new(const df_moe_router_spec *s, int64_t T) {
  routing_buf b = {.r = {.T = T,
                         .logits = calloc((size_t)(T * s->E), 4),
                         .scores = calloc((size_t)(T * s->E), 4),
                         .indices = calloc((size_t)(T * s->k), 4),
                         .weights = calloc((size_t)(T * s->k), 4),
                         .counts = calloc((size_t)s->E, 4)}};
  return b;
}

static void rb_free(routing_buf *b) {
  free(b->r.logits), free(b->r.scores), free(b->r.indices), free(b->r.weights), free(b->r.counts);
}

// Scores from random logits, then the selection.
static void route_random(df_ctx *ctx, const df_moe_router_spec *s, routing_buf *b, uint64_t seed, float spread,
                         const float *shift) {
  df_test_fill_uniform(b->r.logits, b->r.T * s->E, seed, -spread, spread);
  scores_fwd(ctx, s->score_func, b->r.T, s->E, b->r.logits, b->r.scores);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_router_select(ctx, s, shift, &b->r, &err), &err);
}

static void check_routing_properties(const df_moe_router_spec *s, const routing_buf *b) {
  const int64_t T = b->r.T, E = s->E, k = s->k;
  int64_t total = 0;
  for (int64_t e = 0; e < E; e++) total += b->r.counts[e];
  cr_expect_eq(total, T * k, "counts sum to T·k");
  for (int64_t t = 0; t < T; t++) {
    const int32_t *idx = b->r.indices + t * k;
    double ssum = 0.0, wsum = 0.0;
    for (int64_t j = 0; j < k; j++) ssum += b->r.scores[t * E + idx[j]];
    const double c = s->norm_topk_prob ? s->routed_scaling_factor / (ssum + 1e-20) : s->routed_scaling_factor;
    for (int64_t j = 0; j < k; j++) {
      cr_assert(idx[j] >= 0 && idx[j] < E, "index in range");
      for (int64_t i = 0; i < j; i++) cr_assert_neq(idx[i], idx[j], "row %lld: distinct experts", (long long)t);
      const double want = b->r.scores[t * E + idx[j]] * c;
      cr_expect_leq(fabs(b->r.weights[t * k + j] - want), 1e-6 * fabs(want), "weights come from the unbiased scores");
      wsum += b->r.weights[t * k + j];
    }
    if (s->norm_topk_prob)
      cr_expect_float_eq(wsum, s->routed_scaling_factor, 1e-6 * s->routed_scaling_factor, "row %lld: Σw = scale",
                         (long long)t);
  }
}

Test(router, softmax_scores_sum_to_one_and_routing_properties) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_moe_router_spec s = spec(16, 4);
  routing_buf b = rb_new(&s, 200);
  route_random(ctx, &s, &b, 1, 4.0f, NULL);
  for (int64_t t = 0; t < 200; t++) {
    double sum = 0.0;
    for (int64_t e = 0; e < 16; e++) sum += b.r.scores[t * 16 + e];
    cr_expect_float_eq(sum, 1.0, 1e-6, "row %lld", (long long)t);
    // Best first: the selected scores are sorted and no unselected expert beats the k-th.
    const int32_t *idx = b.r.indices + t * 4;
    for (int j = 1; j < 4; j++) cr_expect_geq(b.r.scores[t * 16 + idx[j - 1]], b.r.scores[t * 16 + idx[j]]);
  }
  check_routing_properties(&s, &b);
  s.routed_scaling_factor = 1.5f;
  route_random(ctx, &s, &b, 2, 4.0f, NULL);
  check_routing_properties(&s, &b);
  s.norm_topk_prob = false;
  s.routed_scaling_factor = 2.5f;
  route_random(ctx, &s, &b, 3, 4.0f, NULL);
  check_routing_properties(&s, &b);
  double st[DF_MOE_STATS(16)];
  route_stats(ctx, 0.0, 200, 16, 4, b.r.scores, b.r.counts, st);
  cr_expect_leq(st[DF_MOE_STAT_LOAD_MAX], 16.0 / 4.0, "load_max_ratio <= E/k");
  cr_expect_leq(st[DF_MOE_STAT_LOAD_MIN], 1.0);
  cr_expect_eq(st[DF_MOE_STAT_AUX], 0.0, "no aux loss with coeff 0");
  rb_free(&b);
  df_ctx_destroy(ctx);
}

// Equal scores: the lower expert ids win, in order.
Test(router, ties_go_to_lower_ids) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_moe_router_spec s = spec(8, 3);
  routing_buf b = rb_new(&s, 2);
  for (int i = 0; i < 16; i++) b.r.scores[i] = 0.125f;
  b.r.scores[8 + 6] = 0.5f; // row 1: expert 6 first, then 0 and 1
  df_error err = {0};
  DF_ASSERT_OK(df_moe_router_select(ctx, &s, NULL, &b.r, &err), &err);
  const int32_t want[6] = {0, 1, 2, 6, 0, 1};
  for (int i = 0; i < 6; i++) cr_expect_eq(b.r.indices[i], want[i], "indices[%d] = %d", i, b.r.indices[i]);
  rb_free(&b);
  df_ctx_destroy(ctx);
}

// A selection bias of −100 on every expert but 3 forces expert 3 into every row; the weights still come from
// the unbiased scores and still renormalise to the scale.
Test(router, selection_bias_changes_selection_not_weights) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_moe_router_spec s = spec(8, 2);
  s.routed_scaling_factor = 1.5f;
  float shift[8];
  for (int e = 0; e < 8; e++) shift[e] = e == 3 ? 0.0f : -100.0f;
  routing_buf b = rb_new(&s, 64);
  route_random(ctx, &s, &b, 4, 3.0f, shift);
  cr_expect_eq(b.r.counts[3], 64, "expert 3 in every row");
  check_routing_properties(&s, &b);
  for (int64_t t = 0; t < 64; t++) cr_expect_eq(b.r.indices[t * 2], 3, "expert 3 first");
  rb_free(&b);
  df_ctx_destroy(ctx);
}

// Group-limited routing keeps only experts of the topk_group groups with the best top-2 sums.
Test(router, group_limit_keeps_only_the_best_groups) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_moe_router_spec s = spec(16, 4);
  s.score_func = DF_MOE_SCORE_SIGMOID;
  s.n_group = 4;
  s.topk_group = 2;
  float shift[16];
  df_test_fill_uniform(shift, 16, 9, -0.2f, 0.2f);
  routing_buf b = rb_new(&s, 300);
  route_random(ctx, &s, &b, 5, 3.0f, shift);
  check_routing_properties(&s, &b);
  for (int64_t t = 0; t < 300; t++) {
    // Brute force: group scores from the biased scores, the two best groups.
    double gs[4];
    for (int g = 0; g < 4; g++) {
      double v[4], top1 = -INFINITY, top2 = -INFINITY;
      for (int i = 0; i < 4; i++) {
        v[i] = (double)(b.r.scores[t * 16 + g * 4 + i] + shift[g * 4 + i]);
        if (v[i] > top1)
          top2 = top1, top1 = v[i];
        else if (v[i] > top2)
          top2 = v[i];
      }
      gs[g] = top1 + top2;
    }
    int g1 = 0;
    for (int g = 1; g < 4; g++) g1 = gs[g] > gs[g1] ? g : g1;
    int g2 = g1 == 0 ? 1 : 0;
    for (int g = 0; g < 4; g++) g2 = g != g1 && gs[g] > gs[g2] ? g : g2;
    for (int j = 0; j < 4; j++) {
      const int grp = b.r.indices[t * 4 + j] / 4;
      cr_expect(grp == g1 || grp == g2, "row %lld: expert %d outside the kept groups %d, %d", (long long)t,
                b.r.indices[t * 4 + j], g1, g2);
    }
  }
  rb_free(&b);
  df_ctx_destroy(ctx);
}

// ---- score functions -----------------------------------------------------------------------------------

static double softplus_d(double z) { return fmax(z, 0.0) + log1p(exp(-fabs(z))); }

static double score_d(df_moe_score_func f, const float *l, int64_t E, int64_t e) {
  switch (f) {
  case DF_MOE_SCORE_SOFTMAX: {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < E; i++) mx = fmax(mx, l[i]);
    for (int64_t i = 0; i < E; i++) sum += exp(l[i] - mx);
    return exp(l[e] - mx) / sum;
  }
  case DF_MOE_SCORE_SIGMOID: return 1.0 / (1.0 + exp(-(double)l[e]));
  case DF_MOE_SCORE_SQRTSOFTPLUS: return sqrt(softplus_d(l[e]));
  }
  return NAN;
}

Test(router, score_values_and_stability) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  enum { E = 9 };
  const float l[E] = {-120.0f, -30.0f, -3.0f, -0.5f, 0.0f, 0.7f, 4.0f, 40.0f, 95.0f};
  float s[E];
  for (int f = 0; f < 3; f++) {
    scores_fwd(ctx, (df_moe_score_func)f, 1, E, l, s);
    for (int e = 0; e < E; e++) {
      const double want = score_d((df_moe_score_func)f, l, E, e);
      cr_expect(isfinite(s[e]), "score %d of func %d is finite", e, f);
      cr_expect_leq(fabs(s[e] - want), 2e-7 * fabs(want) + 1e-38, "func %d, logit %g: %.9g vs %.9g", f, l[e], s[e],
                    want);
    }
  }
  // sqrtsoftplus: large positive logits give sqrt(ℓ); a very negative one underflows to 0, not NaN.
  scores_fwd(ctx, DF_MOE_SCORE_SQRTSOFTPLUS, 1, E, l, s);
  cr_expect_float_eq(s[8], sqrtf(95.0f), 1e-6f);
  cr_expect_geq(s[0], 0.0f);
  df_ctx_destroy(ctx);
}

// ∂/∂ℓ of Σ_e ds_e·s_e against central differences of the double formula.
Test(router, score_gradients) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  enum { T = 5, E = 7 };
  float l[T * E], s[T * E], ds[T * E], dl[T * E];
  df_test_fill_uniform(l, T * E, 11, -4.0f, 4.0f);
  df_test_fill_uniform(ds, T * E, 12, -1.0f, 1.0f);
  for (int f = 0; f < 3; f++) {
    scores_fwd(ctx, (df_moe_score_func)f, T, E, l, s);
    scores_bwd(ctx, (df_moe_score_func)f, T, E, l, s, ds, dl);
    double gmax = 0.0;
    for (int i = 0; i < T * E; i++) gmax = fmax(gmax, fabs(dl[i]));
    for (int t = 0; t < T; t++)
      for (int e = 0; e < E; e++) {
        float row[E];
        memcpy(row, l + t * E, sizeof row);
        const double h = 1e-3;
        double fp = 0, fm = 0;
        const float l0 = row[e];
        row[e] = (float)(l0 + h);
        const double hp = (double)row[e] - l0;
        for (int i = 0; i < E; i++) fp += ds[t * E + i] * score_d((df_moe_score_func)f, row, E, i);
        row[e] = (float)(l0 - h);
        const double hm = l0 - (double)row[e];
        for (int i = 0; i < E; i++) fm += ds[t * E + i] * score_d((df_moe_score_func)f, row, E, i);
        const double fd = (fp - fm) / (hp + hm);
        cr_expect_leq(fabs(fd - dl[t * E + e]), 1e-5 * gmax + 1e-7, "func %d [%d,%d]: fd %.8g vs %.8g", f, t, e, fd,
                      dl[t * E + e]);
      }
  }
  df_ctx_destroy(ctx);
}

// The combine-weight backward against central differences of the weight formula (selection held fixed).
Test(router, combine_weight_gradient) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  for (int norm = 0; norm < 2; norm++) {
    df_moe_router_spec s = spec(6, 3);
    s.norm_topk_prob = norm;
    s.routed_scaling_factor = 1.7f;
    enum { T = 4 };
    routing_buf b = rb_new(&s, T);
    route_random(ctx, &s, &b, 20 + norm, 2.0f, NULL);
    float dw[T * 3], aux[6], ds[T * 6];
    df_test_fill_uniform(dw, T * 3, 22, -1.0f, 1.0f);
    df_test_fill_uniform(aux, 6, 23, -0.1f, 0.1f);
    df_error err = {0};
    DF_ASSERT_OK(df_moe_router_weights_backward(ctx, &s, &b.r, dw, aux, ds, &err), &err);
    for (int t = 0; t < T; t++)
      for (int e = 0; e < 6; e++) {
        // J(s) = Σ_j dw_j·w_j(s) + Σ_e aux_e·s_e, w from s at the fixed indices.
        double J[2];
        for (int side = 0; side < 2; side++) {
          double sc[6];
          for (int i = 0; i < 6; i++) sc[i] = b.r.scores[t * 6 + i];
          sc[e] += side ? -1e-4 : 1e-4;
          double sum = 0.0, j = 0.0;
          for (int q = 0; q < 3; q++) sum += sc[b.r.indices[t * 3 + q]];
          for (int q = 0; q < 3; q++) {
            const double w = sc[b.r.indices[t * 3 + q]] * (norm ? 1.7 / (sum + 1e-20) : 1.7);
            j += dw[t * 3 + q] * w;
          }
          for (int i = 0; i < 6; i++) j += aux[i] * sc[i];
          J[side] = j;
        }
        const double fd = (J[0] - J[1]) / 2e-4;
        cr_expect_leq(fabs(fd - ds[t * 6 + e]), 1e-5 * fabs(fd) + 1e-6, "norm %d [%d,%d]: fd %.8g vs %.8g", norm, t, e,
                      fd, ds[t * 6 + e]);
      }
    rb_free(&b);
  }
  df_ctx_destroy(ctx);
}

// ---- centering -----------------------------------------------------------------------------------------

Test(router, sample_centering_forward_backward) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  enum { T = 12, H = 40, N = 4 };
  float x[T * H], u[T * H], mean[H], du[T * H], dx[T * H];
  df_test_fill_uniform(x, T * H, 31, -1.0f, 3.0f);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_center_sample_forward(ctx, x, T, H, N, u, mean, &err), &err);
  for (int b = 0; b < T / N; b++)
    for (int c = 0; c < H; c++) {
      double s = 0.0;
      for (int r = 0; r < N; r++) s += u[(b * N + r) * H + c];
      cr_expect_leq(fabs(s), 1e-5, "sample %d column %d: centered rows sum to 0", b, c);
    }
  for (int c = 0; c < H; c++) {
    double s = 0.0;
    for (int t = 0; t < T; t++) s += x[t * H + c];
    cr_expect_float_eq(mean[c], (float)(s / T), 1e-6f, "batch mean");
  }
  // The backward is the same projection (the mean is in the graph): dx = du − per-sample mean(du).
  df_test_fill_uniform(du, T * H, 32, -1.0f, 1.0f);
  DF_ASSERT_OK(df_moe_center_sample_backward(ctx, du, T, H, N, dx, false, &err), &err);
  float want[T * H];
  DF_ASSERT_OK(df_moe_center_sample_forward(ctx, du, T, H, N, want, NULL, &err), &err);
  for (int i = 0; i < T * H; i++) cr_expect_eq(dx[i], want[i]);
  cr_expect_eq(df_moe_center_sample_forward(ctx, x, T, H, 5, u, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "rows_per_sample");
  df_ctx_destroy(ctx);
}

// ---- switch aux loss -----------------------------------------------------------------------------------

static void check_aux_fixture(const char *file) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(1);
  const int64_t E = (int64_t)fx_meta(f, "E"), k = (int64_t)fx_meta(f, "k"), T = (int64_t)fx_meta(f, "T");
  df_moe_router_spec s = spec(E, k);
  routing_buf b = rb_new(&s, T);
  memcpy(b.r.logits, fx_get(f, "logits")->data, sizeof(float) * (size_t)(T * E));
  scores_fwd(ctx, DF_MOE_SCORE_SOFTMAX, T, E, b.r.logits, b.r.scores);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_router_select(ctx, &s, NULL, &b.r, &err), &err);
  const char *name = NULL;
  DF_ASSERT_OK(df_moe_aux_loss_name(DF_MOE_AUX_SWITCH, &name, &err), &err);
  cr_expect_str_eq(name, "switch");
  const double want = fx_meta(f, "hf_loss");
  double *st = calloc((size_t)DF_MOE_STATS(E), sizeof(double));
  route_stats(ctx, 1.0, T, E, k, b.r.scores, b.r.counts, st);
  const double got = st[DF_MOE_STAT_AUX];
  cr_expect_leq(fabs(got - want), 1e-6 * want, "%s: %.9g vs load_balancing_loss_func %.9g", file, got, want);
  cr_expect_eq(st[DF_MOE_STAT_AUX_NUM], got, "den 1 weights the loss by 1");
  route_stats(ctx, 0.001, T, E, k, b.r.scores, b.r.counts, st);
  cr_expect_float_eq(st[DF_MOE_STAT_AUX], 0.001 * got, 1e-12, "coefficient scaling");
  free(st);
  rb_free(&b);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(aux_loss, switch_matches_transformers_E8_k3_T40) { check_aux_fixture("moe/aux_E8_k3_T40.safetensors"); }
Test(aux_loss, switch_matches_transformers_E16_k2_T7) { check_aux_fixture("moe/aux_E16_k2_T7.safetensors"); }
Test(aux_loss, switch_matches_transformers_E64_k10_T128) { check_aux_fixture("moe/aux_E64_k10_T128.safetensors"); }

// Uniform routing (counts T·k/E, scores 1/E) gives coeff·k; the score gradient row is coeff·E·counts/T².
Test(aux_loss, uniform_routing_and_gradient) {
  enum { T = 8, E = 4, K = 2 };
  float scores[T * E], row[E];
  int32_t counts[E];
  for (int i = 0; i < T * E; i++) scores[i] = 0.25f;
  for (int e = 0; e < E; e++) counts[e] = T * K / E;
  df_ctx *ctx = df_test_cpu_ctx(1);
  double st[DF_MOE_STATS(E)];
  route_stats(ctx, 0.01, T, E, K, scores, counts, st);
  cr_expect_float_eq(st[DF_MOE_STAT_AUX], 0.01 * K, 1e-12);
  counts[0] = 7, counts[1] = 5, counts[2] = 4, counts[3] = 0;
  df_moe_stats_desc d = {.aux = DF_MOE_AUX_SWITCH, .coeff = 0.5, .k = K};
  df_tensor cn = df_i32(counts, E), rt = df_f32(row, E);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_aux_backward(ctx, &d, T, &cn, 2.0, &rt, &err), &err);
  for (int e = 0; e < E; e++) cr_expect_float_eq(row[e], (float)(2.0 * 0.5 * E * counts[e] / (T * T)), 1e-7f);
  route_stats(ctx, 0.0, T, E, K, scores, counts, st);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD_MAX], 7.0 / 4.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD_MIN], 0.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_UNUSED], 0.25, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD + 0], 7.0 / 16.0, 1e-12, "expert 0's share of the T·k slots");
  const char *name = NULL;
  cr_expect_eq(df_moe_aux_loss_name((df_moe_aux_type)7, &name, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "moe_aux_loss_type");
  df_ctx_destroy(ctx);
}

Test(router, spec_errors) {
  df_error err = {0};
  df_moe_router_spec s = spec(8, 9);
  cr_expect_eq(df_moe_router_spec_check(&s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "num_experts_per_tok");
  s = spec(8, 2);
  s.n_group = 3;
  cr_expect_eq(df_moe_router_spec_check(&s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "n_group");
  s = spec(8, 3);
  s.n_group = 4;
  s.topk_group = 1;
  cr_expect_eq(df_moe_router_spec_check(&s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "topk_group");
  s.topk_group = 2;
  DF_ASSERT_OK(df_moe_router_spec_check(&s, &err), &err);
}
