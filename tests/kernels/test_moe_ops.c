// The MoE ops of kernels/ops_moe.h beyond what tests/moe exercises through the layer: the grouped expert GEMMs
// equal one linear op per segment bit for bit (empty segments, dx aliasing x), the dispatch plan is a stable sort,
// the deferred updates (noaux_tc sign step, EMA centering mean), the routing statistics record, the shared gate's
// backward against its formula, argument errors naming the tensor, and the strict fake device giving the CPU's bits.
// Exact comparisons where the same kernels run on the same data; the gate formula to 1e-6 relative.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"

enum { E = 4, IN = 6, OUT = 5 };
static const int32_t OFF[E + 1] = {0, 3, 3, 7, 9}; // expert 1 is empty

// Segment e of the rows against expert e's slice, with the plain linear ops.
static void per_segment(df_ctx *ctx, const float *x, const float *w, float *y, const float *dy, float *dx, float *dw) {
  df_error err = {0};
  for (int e = 0; e < E; e++) {
    const int o = OFF[e], n = OFF[e + 1] - o;
    if (n == 0) continue;
    df_tensor xe = df_f32(x + o * IN, n, IN), we = df_f32(w + e * OUT * IN, OUT, IN);
    if (y) {
      df_tensor ye = df_f32(y + o * OUT, n, OUT);
      DF_ASSERT_OK(df_linear_forward(ctx, &xe, &we, NULL, &ye, &err), &err);
    } else {
      df_tensor dye = df_f32(dy + o * OUT, n, OUT), dxe = df_f32(dx + o * IN, n, IN);
      df_tensor dwe = df_f32(dw + e * OUT * IN, OUT, IN);
      DF_ASSERT_OK(df_linear_backward(ctx, &dye, &xe, &we, &dxe, false, &dwe, NULL, &err), &err);
    }
  }
}

Test(moe_ops, grouped_gemms_equal_per_segment_linear_ops) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  const int R = OFF[E];
  float x[9 * IN], w[E * OUT * IN], y[9 * OUT], y_ref[9 * OUT], dy[9 * OUT];
  float dx[9 * IN], dx_ref[9 * IN], dw[E * OUT * IN] = {0}, dw_ref[E * OUT * IN] = {0};
  df_test_fill_uniform(x, R * IN, 1, -1, 1);
  df_test_fill_uniform(w, E * OUT * IN, 2, -1, 1);
  df_test_fill_uniform(dy, R * OUT, 3, -1, 1);
  df_error err = {0};
  df_tensor xt = df_f32(x, R, IN), wt = df_view(w, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, OUT, IN));
  df_tensor off = df_i32(OFF, E + 1), yt = df_f32(y, R, OUT), dyt = df_f32(dy, R, OUT);
  DF_ASSERT_OK(df_moe_grouped_forward(ctx, &xt, &wt, &off, &yt, &err), &err);
  per_segment(ctx, x, w, y_ref, NULL, NULL, NULL);
  cr_expect_arr_eq(y, y_ref, sizeof y);
  per_segment(ctx, x, w, NULL, dy, dx_ref, dw_ref);
  // dx aliasing x: each segment's weight gradient comes first.
  float xa[9 * IN];
  memcpy(xa, x, sizeof xa);
  df_tensor xat = df_f32(xa, R, IN), dwt = df_view(dw, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, OUT, IN));
  DF_ASSERT_OK(df_moe_grouped_backward(ctx, &dyt, &xat, &wt, &off, &xat, false, &dwt, &err), &err);
  cr_expect_arr_eq(xa, dx_ref, sizeof xa);
  cr_expect_arr_eq(dw, dw_ref, sizeof dw);
  for (int i = OUT * IN; i < 2 * OUT * IN; i++) cr_expect_eq(dw[i], 0.0f, "the empty expert gets no gradient");
  (void)dx;
  // A weight of the wrong width is refused, naming it.
  df_tensor bad = df_view(w, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(E, IN, OUT));
  cr_expect_eq(df_moe_grouped_forward(ctx, &xt, &bad, &off, &yt, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  df_ctx_destroy(ctx);
}

Test(moe_ops, plan_is_a_stable_sort_and_checks_its_sizes) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  const int32_t idx[8] = {2, 0, 1, 2, 2, 0, 3, 1}; // T = 4, k = 2
  const int32_t cnt[4] = {2, 2, 3, 1};
  int32_t off[5], slot[8], tok[8];
  df_tensor it = df_i32(idx, 8), ct = df_i32(cnt, 4), ot = df_i32(off, 5), st = df_i32(slot, 8), tt = df_i32(tok, 8);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_plan(ctx, 2, &it, &ct, &ot, &st, &tt, &err), &err);
  const int32_t want_off[5] = {0, 2, 4, 7, 8}, want_slot[8] = {1, 5, 2, 7, 0, 3, 4, 6};
  cr_expect_arr_eq(off, want_off, sizeof off);
  cr_expect_arr_eq(slot, want_slot, sizeof slot);
  for (int p = 0; p < 8; p++) cr_expect_eq(tok[p], slot[p] / 2);
  df_tensor short_off = df_i32(off, 4);
  cr_expect_eq(df_moe_plan(ctx, 2, &it, &ct, &short_off, &st, &tt, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "offsets");
  df_ctx_destroy(ctx);
}

Test(moe_ops, deferred_updates) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  // noaux_tc: mean load 3; below it +rate, above it −rate, at it unchanged.
  float load[4] = {1, 3, 5, 3}, bias[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  df_tensor lt = df_f32(load, 4), bt = df_f32(bias, 4);
  DF_ASSERT_OK(df_moe_noaux_update(ctx, 0.25f, &lt, &bt, &err), &err);
  cr_expect(bias[0] == 0.75f && bias[1] == 0.5f && bias[2] == 0.25f && bias[3] == 0.5f);
  // EMA: the first update copies, the next blends with ρ.
  float stash[2] = {2, 4}, mu[2] = {9, 9}, steps[1] = {0};
  df_tensor s = df_f32(stash, 2), m = df_f32(mu, 2), n = df_f32(steps, 1);
  DF_ASSERT_OK(df_moe_center_ema(ctx, 0.75, &s, &m, &n, &err), &err);
  cr_expect(mu[0] == 2 && mu[1] == 4 && steps[0] == 1);
  stash[0] = 6;
  DF_ASSERT_OK(df_moe_center_ema(ctx, 0.75, &s, &m, &n, &err), &err);
  cr_expect(mu[0] == 3 && mu[1] == 4 && steps[0] == 2);
  cr_expect_eq(df_moe_center_ema(ctx, 1.0, &s, &m, &n, &err), DF_ERR_INVALID);
  df_ctx_destroy(ctx);
}

// The record: weighted aux, aux, load ratios, bias max, shares; accumulate adds; the count stash.
Test(moe_ops, route_stats_record_and_accumulation) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  enum { T = 4, K = 2 };
  float scores[T * E];
  for (int i = 0; i < T * E; i++) scores[i] = 0.25f;
  const int32_t cnt[E] = {4, 2, 2, 0};
  const float bias[E] = {0.1f, -0.3f, 0.2f, 0};
  double st[DF_MOE_STATS(E)];
  float stash[E];
  df_moe_stats_desc d = {.aux = DF_MOE_AUX_SWITCH, .coeff = 0.5, .k = K, .den = 3.0};
  df_tensor sc = df_f32(scores, T, E), ct = df_i32(cnt, E), bt = df_f32(bias, E);
  df_tensor stt = df_f64_on(DF_DEV_CPU, st, DF_MOE_STATS(E)), sst = df_f32(stash, E);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_route_stats(ctx, &d, &sc, &ct, &bt, &stt, false, &sst, &err), &err);
  // switch: 0.5·E·Σ_e (c_e/T)(Σ_t s/T) = 0.5·4·(8/4)·0.25 = 1.
  cr_expect_float_eq(st[DF_MOE_STAT_AUX], 1.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_AUX_NUM], 3.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD_MAX], 2.0, 1e-12); // 4 / (T·k/E = 2)
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD_MIN], 0.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_UNUSED], 0.25, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_BIAS_ABS_MAX], 0.3f, 1e-9);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD + 0], 0.5, 1e-12);
  cr_expect(stash[0] == 4 && stash[3] == 0);
  DF_ASSERT_OK(df_moe_route_stats(ctx, &d, &sc, &ct, NULL, &stt, true, NULL, &err), &err);
  cr_expect_float_eq(st[DF_MOE_STAT_AUX_NUM], 6.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_LOAD + 0], 1.0, 1e-12);
  cr_expect_float_eq(st[DF_MOE_STAT_BIAS_ABS_MAX], 0.3f, 1e-9, "no bias adds 0");
  df_tensor short_stats = df_f64_on(DF_DEV_CPU, st, E);
  cr_expect_eq(df_moe_route_stats(ctx, &d, &sc, &ct, NULL, &short_stats, false, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "stats");
  df_ctx_destroy(ctx);
}

// Shared gate: out_t = z(1 − z)·(dh_t·a_t), then dh_t *= z_t; the routed form scatters the dot by idx.
Test(moe_ops, gate_backward_formulas) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  enum { N = 3, I = 5 };
  float dh[N * I], dh0[N * I], a[N * I], z[N] = {0.2f, 0.5f, 0.9f}, out[N];
  df_test_fill_uniform(dh, N * I, 7, -1, 1);
  df_test_fill_uniform(a, N * I, 8, -1, 1);
  memcpy(dh0, dh, sizeof dh);
  df_tensor dht = df_f32(dh, N, I), at = df_f32(a, N, I), zt = df_f32(z, N), ot = df_f32(out, N);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_gate_backward(ctx, true, &dht, &at, &zt, NULL, &ot, &err), &err);
  for (int t = 0; t < N; t++) {
    double dot = 0;
    for (int i = 0; i < I; i++) dot += (double)dh0[t * I + i] * a[t * I + i];
    cr_expect_leq(fabs(out[t] - z[t] * (1.0 - z[t]) * dot), 1e-6 * fabs(dot) + 1e-9);
    for (int i = 0; i < I; i++) cr_expect_eq(dh[t * I + i], dh0[t * I + i] * z[t]);
  }
  const int32_t idx[N] = {2, 0, 1};
  memcpy(dh, dh0, sizeof dh);
  df_tensor it = df_i32(idx, N);
  DF_ASSERT_OK(df_moe_gate_backward(ctx, false, &dht, &at, &zt, &it, &ot, &err), &err);
  for (int p = 0; p < N; p++) {
    double dot = 0;
    for (int i = 0; i < I; i++) dot += (double)dh0[p * I + i] * a[p * I + i];
    cr_expect_eq(out[idx[p]], (float)dot);
    for (int i = 0; i < I; i++) cr_expect_eq(dh[p * I + i], dh0[p * I + i] * z[idx[p]]);
  }
  cr_expect_eq(df_moe_gate_backward(ctx, true, &dht, &at, &zt, &it, &ot, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "idx");
  df_ctx_destroy(ctx);
}

// A table without the selection op answers an error naming op and backend.
Test(moe_ops, missing_slot_names_the_op) {
  df_backend lacking = *df_cpu_backend();
  lacking.name = "lacking";
  lacking.moe_select = NULL;
  df_ctx *ctx = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_ctx_create_with(&lacking, NULL, &ctx, &err), &err);
  float sc[8] = {0};
  int32_t ix[2], cn[4];
  float w[2];
  df_moe_route_desc d = {.E = 4, .k = 1, .n_group = 1, .topk_group = 1, .routed_scaling_factor = 1};
  df_tensor st = df_f32(sc, 2, 4), it = df_i32(ix, 2, 1), wt = df_f32(w, 2, 1), ct = df_i32(cn, 4);
  cr_expect_eq(df_moe_select(ctx, &d, &st, NULL, &it, &wt, &ct, &err), DF_ERR_NOT_IMPLEMENTED);
  cr_expect(strstr(err.msg, "moe_select") && strstr(err.msg, "lacking"), "%s", err.msg);
  df_ctx_destroy(ctx);
}

// Scores and selection on the strict fake device (memory the host cannot touch) give the CPU's bits.
Test(moe_ops, strict_device_routes_like_the_cpu) {
  enum { T = 16, EE = 8, K = 2 };
  float logits[T * EE], sc_cpu[T * EE], w_cpu[T * K], sc_dev[T * EE], w_dev[T * K];
  int32_t ix_cpu[T * K], cn_cpu[EE], ix_dev[T * K], cn_dev[EE];
  df_test_fill_uniform(logits, T * EE, 11, -3, 3);
  df_moe_route_desc d = {
      .E = EE, .k = K, .n_group = 4, .topk_group = 2, .norm_topk_prob = true, .routed_scaling_factor = 1.5f};
  df_error err = {0};
  df_ctx *cpu = df_test_cpu_ctx(1), *dev = NULL;
  df_ctx_options o = {.num_threads = 1};
  DF_ASSERT_OK(df_ctx_create_with(df_fake_strict_backend(), &o, &dev, &err), &err);
  {
    df_tensor lt = df_f32(logits, T, EE), st = df_f32(sc_cpu, T, EE), it = df_i32(ix_cpu, T, K);
    df_tensor wt = df_f32(w_cpu, T, K), ct = df_i32(cn_cpu, EE);
    DF_ASSERT_OK(df_moe_scores_forward(cpu, DF_MOE_SCORE_SQRTSOFTPLUS, &lt, &st, &err), &err);
    DF_ASSERT_OK(df_moe_select(cpu, &d, &st, NULL, &it, &wt, &ct, &err), &err);
  }
  void *bl, *bs, *bi, *bw, *bc;
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof logits, &bl, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof sc_dev, &bs, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof ix_dev, &bi, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof w_dev, &bw, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof cn_dev, &bc, &err), &err);
  DF_ASSERT_OK(df_copy(dev, bl, DF_DEV_FAKE, logits, DF_DEV_CPU, sizeof logits, &err), &err);
  df_tensor lt = df_f32_on(DF_DEV_FAKE, bl, T, EE), st = df_f32_on(DF_DEV_FAKE, bs, T, EE);
  df_tensor it = df_i32_on(DF_DEV_FAKE, bi, T, K), wt = df_f32_on(DF_DEV_FAKE, bw, T, K);
  df_tensor ct = df_i32_on(DF_DEV_FAKE, bc, EE);
  DF_ASSERT_OK(df_moe_scores_forward(dev, DF_MOE_SCORE_SQRTSOFTPLUS, &lt, &st, &err), &err);
  DF_ASSERT_OK(df_moe_select(dev, &d, &st, NULL, &it, &wt, &ct, &err), &err);
  DF_ASSERT_OK(df_copy(dev, sc_dev, DF_DEV_CPU, bs, DF_DEV_FAKE, sizeof sc_dev, &err), &err);
  DF_ASSERT_OK(df_copy(dev, ix_dev, DF_DEV_CPU, bi, DF_DEV_FAKE, sizeof ix_dev, &err), &err);
  DF_ASSERT_OK(df_copy(dev, w_dev, DF_DEV_CPU, bw, DF_DEV_FAKE, sizeof w_dev, &err), &err);
  DF_ASSERT_OK(df_copy(dev, cn_dev, DF_DEV_CPU, bc, DF_DEV_FAKE, sizeof cn_dev, &err), &err);
  cr_expect_arr_eq(sc_dev, sc_cpu, sizeof sc_dev);
  cr_expect_arr_eq(ix_dev, ix_cpu, sizeof ix_dev);
  cr_expect_arr_eq(w_dev, w_cpu, sizeof w_dev);
  cr_expect_arr_eq(cn_dev, cn_cpu, sizeof cn_dev);
  // A host view on the device context is refused, naming the tensor.
  df_tensor host = df_f32(logits, T, EE);
  cr_expect_eq(df_moe_scores_forward(dev, DF_MOE_SCORE_SOFTMAX, &host, &st, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "logits");
  df_buffer_free(dev, bl), df_buffer_free(dev, bs), df_buffer_free(dev, bi), df_buffer_free(dev, bw);
  df_buffer_free(dev, bc);
  df_ctx_destroy(dev), df_ctx_destroy(cpu);
}
