// Domino's ops on the CPU (kernels/ops_domino.h): the GRU against torch.nn.GRU's equations evaluated here in double,
// its backward against central differences of a probe loss through the whole recurrence (W_hh included), rows past
// the last step zeroed; the masked SiLU and its derivative; the fused two-logit-set LM head against a dense double
// reference (both CEs, argmaxes, dhidden, dcorr, dw2), the same bits for any chunking and thread count, exact zeros
// for the correction at final_scale 0; the block metrics on a hand-checked case; and the argument checks.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

// ---- GRU -------------------------------------------------------------------------------------------------------

enum { GNB = 3, GS = 5, GT = 4, GG = 6, GR = GNB * GS };

typedef struct {
  df_ctx *ctx;
  float gi[GR * 3 * GG], whh[3 * GG * GG], s[GR * GG], gates[GR * 4 * GG];
  float probe[GR * GG]; // the probe loss Σ probe · s
} gru_rig;

static void gru_setup(gru_rig *g) {
  memset(g, 0, sizeof *g);
  g->ctx = df_test_cpu_ctx(2);
  df_test_fill_uniform(g->gi, GR * 3 * GG, 11, -1.5f, 1.5f);
  df_test_fill_uniform(g->whh, 3 * GG * GG, 12, -0.6f, 0.6f);
  df_test_fill_uniform(g->probe, GR * GG, 13, -1.0f, 1.0f);
}

// torch.nn.GRU's equations in double: states [GR, GG] (0 past the last step).
static void gru_reference(const float *gi, const float *whh, double *out) {
  memset(out, 0, sizeof(double) * GR * GG);
  for (int b = 0; b < GNB; b++) {
    double h[GG] = {0};
    for (int t = 0; t < GT; t++) {
      const float *x = gi + (b * GS + t) * 3 * GG;
      double gh[3 * GG], nh[GG];
      for (int i = 0; i < 3 * GG; i++) {
        gh[i] = 0;
        for (int j = 0; j < GG; j++) gh[i] += (double)whh[i * GG + j] * h[j];
      }
      for (int j = 0; j < GG; j++) {
        double r = sig(x[j] + gh[j]), z = sig(x[GG + j] + gh[GG + j]), n = tanh(x[2 * GG + j] + r * gh[2 * GG + j]);
        nh[j] = (1 - z) * n + z * h[j];
      }
      memcpy(h, nh, sizeof h);
      for (int j = 0; j < GG; j++) out[(b * GS + t) * GG + j] = h[j];
    }
  }
}

static double gru_probe(void *ctx) {
  gru_rig *g = ctx;
  double s[GR * GG], l = 0;
  gru_reference(g->gi, g->whh, s);
  for (int i = 0; i < GR * GG; i++) l += g->probe[i] * s[i];
  return l;
}

static df_status gru_run(gru_rig *g, df_error *err) {
  const df_gru_desc d = {.steps = GT, .stride = GS};
  df_tensor gi = df_f32(g->gi, GR, 3 * GG), w = df_f32(g->whh, 3 * GG, GG), s = df_f32(g->s, GR, GG),
            gates = df_f32(g->gates, GR, 4 * GG);
  return df_gru_forward(g->ctx, &d, &gi, &w, &s, &gates, err);
}

Test(gru, forward_matches_the_equations_and_zeroes_rows_past_the_steps) {
  gru_rig g;
  gru_setup(&g);
  df_error err = {0};
  for (int i = 0; i < GR * GG; i++) g.s[i] = NAN; // every row is written
  DF_ASSERT_OK(gru_run(&g, &err), &err);
  double want[GR * GG];
  gru_reference(g.gi, g.whh, want);
  for (int i = 0; i < GR * GG; i++)
    cr_expect(fabs(g.s[i] - want[i]) <= 2e-6, "s[%d] = %g, want %g", i, g.s[i], want[i]);
  for (int b = 0; b < GNB; b++)
    for (int j = 0; j < GG; j++) cr_expect_eq(g.s[(b * GS + GT) * GG + j], 0.0f, "row past the last step");
  // inference: no gates, the same states
  float s2[GR * GG];
  const df_gru_desc d = {.steps = GT, .stride = GS};
  df_tensor gi = df_f32(g.gi, GR, 3 * GG), w = df_f32(g.whh, 3 * GG, GG), s = df_f32(s2, GR, GG);
  DF_ASSERT_OK(df_gru_forward(g.ctx, &d, &gi, &w, &s, NULL, &err), &err);
  cr_expect_eq(memcmp(s2, g.s, sizeof s2), 0, "gates do not change the states");
  df_ctx_destroy(g.ctx);
}

Test(gru, backward_matches_central_differences) {
  gru_rig g;
  gru_setup(&g);
  df_error err = {0};
  DF_ASSERT_OK(gru_run(&g, &err), &err);
  static float dgi[GR * 3 * GG], dwhh[3 * GG * GG];
  for (int i = 0; i < GR * 3 * GG; i++) dgi[i] = NAN;
  memset(dwhh, 0, sizeof dwhh);
  const df_gru_desc d = {.steps = GT, .stride = GS};
  df_tensor w = df_f32(g.whh, 3 * GG, GG), s = df_f32(g.s, GR, GG), gates = df_f32(g.gates, GR, 4 * GG),
            ds = df_f32(g.probe, GR, GG), tdgi = df_f32(dgi, GR, 3 * GG), tdw = df_f32(dwhh, 3 * GG, GG);
  DF_ASSERT_OK(df_gru_backward(g.ctx, &d, &w, &s, &gates, &ds, &tdgi, &tdw, &err), &err);
  for (int b = 0; b < GNB; b++)
    for (int j = 0; j < 3 * GG; j++) cr_expect_eq(dgi[(b * GS + GT) * 3 * GG + j], 0.0f, "dgi past the last step");
  df_fd_check("gru dgi", g.gi, dgi, GR * 3 * GG, gru_probe, &g, 1e-3, 2e-3, 1e-5, 400);
  df_fd_check("gru dW_hh", g.whh, dwhh, 3 * GG * GG, gru_probe, &g, 1e-3, 2e-3, 1e-5, 108);
  // dW_hh is added to
  static float again[3 * GG * GG];
  memcpy(again, dwhh, sizeof again);
  DF_ASSERT_OK(df_gru_backward(g.ctx, &d, &w, &s, &gates, &ds, &tdgi, &tdw, &err), &err);
  for (int i = 0; i < 3 * GG * GG; i++) cr_expect(fabsf(dwhh[i] - 2 * again[i]) <= 1e-6f * (1 + fabsf(again[i])));
  df_ctx_destroy(g.ctx);
}

Test(gru, refuses_bad_arguments) {
  gru_rig g;
  gru_setup(&g);
  df_error err = {0};
  df_tensor gi = df_f32(g.gi, GR, 3 * GG), w = df_f32(g.whh, 3 * GG, GG), s = df_f32(g.s, GR, GG);
  const df_gru_desc long_steps = {.steps = GS + 1, .stride = GS};
  cr_expect_eq(df_gru_forward(g.ctx, &long_steps, &gi, &w, &s, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc");
  const df_gru_desc d = {.steps = GT, .stride = GS};
  df_tensor w_bad = df_f32(g.whh, 2 * GG, GG);
  cr_expect_eq(df_gru_forward(g.ctx, &d, &gi, &w_bad, &s, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "w_hh");
  df_tensor gi_bad = df_f32(g.gi, GR - 1, 3 * GG);
  cr_expect_eq(df_gru_forward(g.ctx, &d, &gi_bad, &w, &s, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "gi");
  df_tensor s_bad = df_f32(g.s, GR, GG - 1);
  cr_expect_eq(df_gru_forward(g.ctx, &d, &gi, &w, &s_bad, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "s");
  float dgi[4], dw[4];
  df_tensor tdgi = df_f32(dgi, 4), tdw = df_f32(dw, 4);
  cr_expect_eq(df_gru_backward(g.ctx, &d, &w, &s, NULL, &s, &tdgi, &tdw, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "gates");
  df_ctx_destroy(g.ctx);
}

// ---- masked SiLU -----------------------------------------------------------------------------------------------

Test(masked_silu, values_and_derivative_on_masked_rows) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  enum { R = 4, E = 5 };
  float x[R * E], y[R * E], dy[R * E], dx[R * E];
  uint8_t m[R] = {1, 0, 1, 0};
  df_test_fill_uniform(x, R * E, 3, -4, 4);
  df_test_fill_uniform(dy, R * E, 4, -1, 1);
  df_tensor tx = df_f32(x, R, E), ty = df_f32(y, R, E), tdy = df_f32(dy, R, E), tdx = df_f32(dx, R, E);
  df_tensor tm = df_u8(m, R);
  DF_ASSERT_OK(df_masked_silu_forward(ctx, &tx, &tm, &ty, &err), &err);
  DF_ASSERT_OK(df_masked_silu_backward(ctx, &tx, &tm, &tdy, &tdx, &err), &err);
  for (int r = 0; r < R; r++)
    for (int j = 0; j < E; j++) {
      const int i = r * E + j;
      const double s = sig(x[i]), want = m[r] ? x[i] * s : 0, dwant = m[r] ? dy[i] * s * (1 + x[i] * (1 - s)) : 0;
      cr_expect(fabs(y[i] - want) <= 1e-6, "y[%d] = %g, want %g", i, y[i], want);
      cr_expect(fabs(dx[i] - dwant) <= 1e-6, "dx[%d] = %g, want %g", i, dx[i], dwant);
    }
  df_tensor bad = df_u8(m, R - 1);
  cr_expect_eq(df_masked_silu_forward(ctx, &tx, &bad, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "mask");
  df_ctx_destroy(ctx);
}

// ---- the fused LM head ---------------------------------------------------------------------------------------------

enum { LR = 101, LH = 12, LV = 37, LE = 5 };

typedef struct {
  float hidden[LR * LH], head[LV * LH], corr[LR * LE], w2[LV * LE], weights[LR];
  int32_t labels[LR];
  float ce_f[LR], ce_b[LR], dh[LR * LH], dc[LR * LE], dw2[LV * LE];
  uint8_t ok_f[LR], ok_b[LR];
} lm_rig;

static void lm_setup(lm_rig *l) {
  memset(l, 0, sizeof *l);
  df_test_fill_uniform(l->hidden, LR * LH, 21, -1, 1);
  df_test_fill_uniform(l->head, LV * LH, 22, -1, 1);
  df_test_fill_uniform(l->corr, LR * LE, 23, -1, 1);
  df_test_fill_uniform(l->w2, LV * LE, 24, -2, 2);
  df_test_fill_uniform(l->weights, LR, 25, 0.2f, 1);
  for (int r = 0; r < LR; r++) l->labels[r] = r % 7 == 3 ? -1 : (r * 13) % LV;
  for (int r = 0; r < LR; r += 9) memset(l->corr + r * LE, 0, sizeof(float) * LE); // uncorrected rows
}

static df_status lm_run(df_ctx *ctx, lm_rig *l, int64_t chunk, float fs, float bs, bool grad, df_error *err) {
  df_tensor h = df_f32(l->hidden, LR, LH), hd = df_f32(l->head, LV, LH), c = df_f32(l->corr, LR, LE),
            w2 = df_f32(l->w2, LV, LE), lab = df_i32(l->labels, LR), w = df_f32(l->weights, LR),
            cf = df_f32(l->ce_f, LR), cb = df_f32(l->ce_b, LR), of = df_u8(l->ok_f, LR), ob = df_u8(l->ok_b, LR),
            dh = df_f32(l->dh, LR, LH), dc = df_f32(l->dc, LR, LE), dw2 = df_f32(l->dw2, LV, LE);
  const df_lmhead_domino_desc d = {.chunk_rows = chunk, .final_scale = fs, .base_scale = bs};
  const df_lmhead_domino_in in = {.hidden = &h, .head = &hd, .corr = &c, .w2 = &w2, .labels = &lab, .weights = &w};
  const df_lmhead_domino_out out = {.ce_final = &cf,
                                    .ce_base = &cb,
                                    .correct_final = &of,
                                    .correct_base = &ob,
                                    .dhidden = grad ? &dh : NULL,
                                    .dcorr = grad ? &dc : NULL,
                                    .dw2 = grad ? &dw2 : NULL};
  return df_lmhead_domino(ctx, &d, &in, &out, err);
}

// The loss Σ_r w (fs·CE_final + bs·CE_base) of the rig's current values, in double.
static double lm_loss(const lm_rig *l, double fs, double bs, double *cef, double *ceb, int *af, int *ab) {
  double L = 0;
  for (int r = 0; r < LR; r++) {
    if (l->labels[r] < 0) continue;
    double zb[LV], zf[LV], mb = -INFINITY, mf = -INFINITY, sb = 0, sf = 0;
    int ib = 0, iff = 0;
    for (int v = 0; v < LV; v++) {
      zb[v] = 0;
      for (int k = 0; k < LH; k++) zb[v] += (double)l->hidden[r * LH + k] * l->head[v * LH + k];
      zf[v] = zb[v];
      for (int k = 0; k < LE; k++) zf[v] += (double)l->corr[r * LE + k] * l->w2[v * LE + k];
      if (zb[v] > mb) mb = zb[v], ib = v;
      if (zf[v] > mf) mf = zf[v], iff = v;
    }
    for (int v = 0; v < LV; v++) sb += exp(zb[v] - mb), sf += exp(zf[v] - mf);
    const double b = mb + log(sb) - zb[l->labels[r]], f = mf + log(sf) - zf[l->labels[r]];
    if (cef) cef[r] = f, ceb[r] = b, af[r] = iff, ab[r] = ib;
    L += l->weights[r] * (fs * f + bs * b);
  }
  return L;
}

typedef struct {
  lm_rig *l;
} lm_fd;
static double lm_probe(void *ctx) { return lm_loss(((lm_fd *)ctx)->l, 0.7, 0.3, NULL, NULL, NULL, NULL); }

Test(lmhead_domino, matches_a_dense_reference_and_its_gradients) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  static lm_rig l;
  lm_setup(&l);
  DF_ASSERT_OK(lm_run(ctx, &l, 0, 0.7f, 0.3f, true, &err), &err);
  static double cef[LR], ceb[LR];
  static int af[LR], ab[LR];
  lm_loss(&l, 0.7, 0.3, cef, ceb, af, ab);
  for (int r = 0; r < LR; r++) {
    if (l.labels[r] < 0) {
      cr_expect(l.ce_f[r] == 0 && l.ce_b[r] == 0 && !l.ok_f[r] && !l.ok_b[r], "skipped row %d", r);
      for (int k = 0; k < LH; k++) cr_expect_eq(l.dh[r * LH + k], 0.0f, "skipped row %d dhidden", r);
      continue;
    }
    cr_expect(fabs(l.ce_f[r] - cef[r]) <= 1e-5 * (1 + cef[r]), "ce_final[%d] = %g, want %g", r, l.ce_f[r], cef[r]);
    cr_expect(fabs(l.ce_b[r] - ceb[r]) <= 1e-5 * (1 + ceb[r]), "ce_base[%d] = %g, want %g", r, l.ce_b[r], ceb[r]);
    cr_expect_eq(l.ok_f[r], af[r] == l.labels[r], "correct_final[%d]", r);
    cr_expect_eq(l.ok_b[r], ab[r] == l.labels[r], "correct_base[%d]", r);
  }
  lm_fd fd = {&l};
  df_fd_check("lmhead_domino dhidden", l.hidden, l.dh, LR * LH, lm_probe, &fd, 1e-3, 2e-3, 1e-5, 300);
  df_fd_check("lmhead_domino dcorr", l.corr, l.dc, LR * LE, lm_probe, &fd, 1e-3, 2e-3, 1e-5, 300);
  df_fd_check("lmhead_domino dw2", l.w2, l.dw2, LV * LE, lm_probe, &fd, 1e-3, 2e-3, 1e-5, 185);
  df_ctx_destroy(ctx);
}

Test(lmhead_domino, same_bits_for_any_chunking_and_threads) {
  static lm_rig a, b;
  lm_setup(&a);
  lm_setup(&b);
  df_error err = {0};
  df_ctx *one = df_test_cpu_ctx(1), *three = df_test_cpu_ctx(3);
  DF_ASSERT_OK(lm_run(one, &a, 0, 0.6f, 0.4f, true, &err), &err);
  DF_ASSERT_OK(lm_run(three, &b, 17, 0.6f, 0.4f, true, &err), &err);
  cr_expect_eq(memcmp(a.ce_f, b.ce_f, sizeof a.ce_f), 0, "ce_final");
  cr_expect_eq(memcmp(a.ce_b, b.ce_b, sizeof a.ce_b), 0, "ce_base");
  cr_expect_eq(memcmp(a.dh, b.dh, sizeof a.dh), 0, "dhidden");
  cr_expect_eq(memcmp(a.dc, b.dc, sizeof a.dc), 0, "dcorr");
  df_expect_close("dw2 across chunkings", b.dw2, a.dw2, LV * LE, 1e-6, 1e-7);
  df_ctx_destroy(one), df_ctx_destroy(three);
}

// λ = 1: the final CE weighs 0, so the correction's gradients are exact zeros (SpecForge's head gets none).
Test(lmhead_domino, no_correction_gradient_at_final_scale_zero) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  static lm_rig l;
  lm_setup(&l);
  DF_ASSERT_OK(lm_run(ctx, &l, 0, 0.0f, 1.0f, true, &err), &err);
  for (int i = 0; i < LR * LE; i++) cr_expect_eq(l.dc[i], 0.0f, "dcorr[%d]", i);
  for (int i = 0; i < LV * LE; i++) cr_expect_eq(l.dw2[i], 0.0f, "dw2[%d]", i);
  df_tensor h = df_f32(l.hidden, LR, LH), hd = df_f32(l.head, LV, LH), c = df_f32(l.corr, LR, LE),
            w2 = df_f32(l.w2, LV, LE), lab = df_i32(l.labels, LR), cf = df_f32(l.ce_f, LR), cb = df_f32(l.ce_b, LR),
            of = df_u8(l.ok_f, LR), ob = df_u8(l.ok_b, LR), dh = df_f32(l.dh, LR, LH);
  const df_lmhead_domino_desc bad = {.final_scale = -1.0f, .base_scale = 1.0f};
  const df_lmhead_domino_in in = {.hidden = &h, .head = &hd, .corr = &c, .w2 = &w2, .labels = &lab};
  const df_lmhead_domino_out out = {
      .ce_final = &cf, .ce_base = &cb, .correct_final = &of, .correct_base = &ob, .dhidden = &dh};
  cr_expect_eq(df_lmhead_domino(ctx, &bad, &in, &out, &err), DF_ERR_INVALID);
  const df_lmhead_domino_desc ok = {.final_scale = 1.0f, .base_scale = 1.0f};
  cr_expect_eq(df_lmhead_domino(ctx, &ok, &in, &out, &err), DF_ERR_INVALID); // dhidden without dcorr / dw2
  cr_expect_str_eq(err.where, "dcorr");
  df_ctx_destroy(ctx);
}

// ---- block metrics ---------------------------------------------------------------------------------------------

// Two blocks of 4: block 0 valid 1,1,0,1 with final correct 1,1,x,0 and base 0,...; block 1 has no valid slot.
Test(domino_metrics, hand_checked_sums) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  enum { BS = 4, R = 8 };
  float cef[R] = {1, 2, 3, 4, 5, 6, 7, 8}, ceb[R] = {2, 2, 2, 2, 2, 2, 2, 2}, w[R] = {1, 0.5f, 0, 1, 0, 0, 0, 0};
  uint8_t okf[R] = {1, 1, 0, 0, 1, 1, 1, 1}, okb[R] = {0, 1, 1, 1, 0, 0, 0, 0}, v[R] = {1, 1, 0, 1, 0, 0, 0, 0};
  uint8_t keep[2] = {1, 1};
  double st[DF_DOMSTAT_POS + 2 * BS] = {0};
  df_tensor tcf = df_f32(cef, R), tcb = df_f32(ceb, R), tw = df_f32(w, R), tof = df_u8(okf, R), tob = df_u8(okb, R),
            tv = df_u8(v, R), tk = df_u8(keep, 2), ts = df_f64_on(DF_DEV_CPU, st, DF_DOMSTAT_POS + 2 * BS);
  const df_domino_metrics_in in = {.ce_final = &tcf,
                                   .ce_base = &tcb,
                                   .correct_final = &tof,
                                   .correct_base = &tob,
                                   .valid = &tv,
                                   .weights = &tw,
                                   .keep = &tk,
                                   .final_scale = 0.25,
                                   .base_scale = 0.5,
                                   .inv_den = 0.1};
  DF_ASSERT_OK(df_domino_block_metrics(ctx, BS, &in, &ts, &err), &err);
  const double F = 1 + 1 + 4, Bn = 2 + 1 + 2; // Σ w·ce
  cr_expect_float_eq(st[DF_DOMSTAT_LOSS], 0.25 * F + 0.5 * Bn, 1e-12);
  cr_expect_float_eq(st[DF_DOMSTAT_FINAL], 0.1 * F, 1e-12);
  cr_expect_float_eq(st[DF_DOMSTAT_BASE_NUM], Bn, 1e-12);
  cr_expect_float_eq(st[DF_DOMSTAT_WEIGHT], 2.5, 1e-12);
  cr_expect_float_eq(st[DF_DOMSTAT_ACC], 2, 0);
  cr_expect_float_eq(st[DF_DOMSTAT_BASE_ACC], 2, 0);
  cr_expect_float_eq(st[DF_DOMSTAT_ACC_DEN], 3, 0);
  // final: slots 0, 1 correct, slot 2 invalid (skipped), slot 3 wrong: run 2 → 3; base: slot 0 wrong → 1
  cr_expect_float_eq(st[DF_DOMSTAT_ACCEPT], 3, 0);
  cr_expect_float_eq(st[DF_DOMSTAT_BASE_ACCEPT], 1, 0);
  cr_expect_float_eq(st[DF_DOMSTAT_ACCEPT_DEN], 1, 0); // block 1 has no valid slot
  cr_expect_float_eq(st[DF_DOMSTAT_BLOCKS], 2, 0);
  const double pos_num[BS] = {1, 1, 0, 0}, pos_den[BS] = {1, 1, 0, 1};
  for (int k = 0; k < BS; k++) {
    cr_expect_float_eq(st[DF_DOMSTAT_POS + k], pos_num[k], 0, "pos_num[%d]", k);
    cr_expect_float_eq(st[DF_DOMSTAT_POS + BS + k], pos_den[k], 0, "pos_den[%d]", k);
  }
  df_tensor small = df_f64_on(DF_DEV_CPU, st, DF_DOMSTAT_POS);
  cr_expect_eq(df_domino_block_metrics(ctx, BS, &in, &small, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "stats");
  df_ctx_destroy(ctx);
}
