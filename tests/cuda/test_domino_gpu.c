// Domino's ops on a CUDA context against the same ops on a CPU context (the oracle): the GRU forward and backward
// (fp32 and bf16 storage), the masked SiLU, the fused two-logit-set LM head (fp32 and bf16, several chunk sizes,
// skipped rows, final_scale 0) and the block metrics (bit-exact: one thread runs the CPU's loop). Tolerances: fp32
// elementwise / recurrent values 1e-5 of max|ref| (σ through the same double exp; CUDA's tanhf within 2 ulp; GEMM
// accumulation order), fp32 LM-head outputs 2e-5 and gradients 1e-4 (as lmhead_dspark's); bf16 relative L2 1e-2
// (values and gradients rounded to bf16 between the GEMMs).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = malloc(sizeof(float) * (size_t)n);
  df_test_fill_uniform(x, n, seed, lo, hi);
  return x;
}

// The device tensor (f32 or bf16) as fp32 host values.
static float *down(cu_pair *p, const df_tensor *g) {
  df_error err = {0};
  const int64_t n = df_numel(g);
  const size_t es = df_dtype_size(g->dtype);
  void *raw = malloc(es * (size_t)n);
  DF_ASSERT_OK(df_copy(p->gpu, raw, DF_DEV_CPU, g->data, DF_DEV_CUDA, es * (size_t)n, &err), &err);
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = g->dtype == DF_BF16 ? cu_bf16_value(((uint16_t *)raw)[i]) : ((float *)raw)[i];
  free(raw);
  return h;
}

static void expect_dev(cu_pair *p, const char *what, const df_tensor *g, const float *want, double rtol) {
  float *h = down(p, g);
  if (g->dtype == DF_BF16) {
    const double e = cu_rel_l2(h, want, df_numel(g));
    cr_expect(e <= rtol, "%s: relative L2 %.3g > %.3g", what, e, rtol);
  } else {
    df_expect_close(what, h, want, df_numel(g), rtol, 1e-7);
  }
  free(h);
}

// A device copy of host fp32 values as dtype dt with the given shape (bf16: rounded to nearest even).
static df_tensor dev_as(cu_pair *p, const float *h, df_dtype dt, int64_t rows, int64_t cols) {
  (void)p;
  df_tensor t = df_f32_on(DF_DEV_CUDA, cu_upload(h, rows * cols, dt), rows, cols);
  t.dtype = dt;
  return t;
}

// ---- GRU -------------------------------------------------------------------------------------------------------

static void gru_case(df_dtype dt) {
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { NB = 53, S = 7, T = 6, G = 40, R = NB * S };
  float *gi = rnd(R * 3 * G, 31, -1.5f, 1.5f), *whh = rnd(3 * G * G, 32, -0.3f, 0.3f), *ds = rnd(R * G, 33, -1, 1);
  if (dt == DF_BF16) cu_round_bf16(gi, R * 3 * G), cu_round_bf16(whh, 3 * G * G), cu_round_bf16(ds, R * G);
  float *s = calloc(R * G, 4), *gates = calloc(R * 4 * G, 4), *dgi = calloc(R * 3 * G, 4), *dw = calloc(3 * G * G, 4);
  const df_gru_desc d = {.steps = T, .stride = S};
  df_tensor tgi = df_f32(gi, R, 3 * G), tw = df_f32(whh, 3 * G, G), ts = df_f32(s, R, G), tg = df_f32(gates, R, 4 * G),
            tds = df_f32(ds, R, G), tdgi = df_f32(dgi, R, 3 * G), tdw = df_f32(dw, 3 * G, G);
  DF_ASSERT_OK(df_gru_forward(p.cpu, &d, &tgi, &tw, &ts, &tg, &err), &err);
  DF_ASSERT_OK(df_gru_backward(p.cpu, &d, &tw, &ts, &tg, &tds, &tdgi, &tdw, &err), &err);
  df_tensor ggi = dev_as(&p, gi, dt, R, 3 * G), gw = dev_as(&p, whh, dt, 3 * G, G), gs = dev_as(&p, s, dt, R, G),
            gg = dev_as(&p, gates, dt, R, 4 * G), gds = dev_as(&p, ds, dt, R, G), gdgi = dev_as(&p, dgi, dt, R, 3 * G);
  float *zero = calloc(3 * G * G, 4);
  df_tensor gdw = dev_as(&p, zero, dt, 3 * G, G);
  DF_ASSERT_OK(df_gru_forward(p.gpu, &d, &ggi, &gw, &gs, &gg, &err), &err);
  const double tol = dt == DF_BF16 ? 1e-2 : 1e-5;
  expect_dev(&p, "gru states", &gs, s, tol);
  expect_dev(&p, "gru gates", &gg, gates, tol);
  // the backward on the CPU's forward (both sides read the same states and gates)
  df_tensor gs2 = dev_as(&p, s, dt, R, G), gg2 = dev_as(&p, gates, dt, R, 4 * G);
  DF_ASSERT_OK(df_gru_backward(p.gpu, &d, &gw, &gs2, &gg2, &gds, &gdgi, &gdw, &err), &err);
  expect_dev(&p, "gru dgi", &gdgi, dgi, dt == DF_BF16 ? 2e-2 : 1e-4);
  expect_dev(&p, "gru dW_hh", &gdw, dw, dt == DF_BF16 ? 2e-2 : 1e-4);
  df_tensor *all[] = {&ggi, &gw, &gs, &gg, &gds, &gdgi, &gdw, &gs2, &gg2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) cu_free(all[i]->data);
  free(gi), free(whh), free(ds), free(s), free(gates), free(dgi), free(dw), free(zero);
  cu_pair_close(&p);
}

Test(cuda_domino, gru_forward_backward_fp32) {
  CU_REQUIRE_GPU();
  gru_case(DF_F32);
}

Test(cuda_domino, gru_forward_backward_bf16) {
  CU_REQUIRE_GPU();
  gru_case(DF_BF16);
}

// ---- masked SiLU -----------------------------------------------------------------------------------------------

Test(cuda_domino, masked_silu_fp32) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { R = 301, E = 48 };
  float *x = rnd(R * E, 41, -6, 6), *dy = rnd(R * E, 42, -1, 1), *y = calloc(R * E, 4), *dx = calloc(R * E, 4);
  uint8_t m[R];
  for (int r = 0; r < R; r++) m[r] = r % 5 != 0;
  df_tensor tx = df_f32(x, R, E), tdy = df_f32(dy, R, E), ty = df_f32(y, R, E), tdx = df_f32(dx, R, E),
            tm = df_u8(m, R);
  DF_ASSERT_OK(df_masked_silu_forward(p.cpu, &tx, &tm, &ty, &err), &err);
  DF_ASSERT_OK(df_masked_silu_backward(p.cpu, &tx, &tm, &tdy, &tdx, &err), &err);
  df_tensor gx = cu_pair_dev(&p, &tx), gdy = cu_pair_dev(&p, &tdy), gy = cu_pair_dev(&p, &ty),
            gm = cu_pair_dev(&p, &tm);
  DF_ASSERT_OK(df_masked_silu_forward(p.gpu, &gx, &gm, &gy, &err), &err);
  expect_dev(&p, "silu", &gy, y, 2e-6);
  DF_ASSERT_OK(df_masked_silu_backward(p.gpu, &gx, &gm, &gdy, &gdy, &err), &err); // in place over dy
  expect_dev(&p, "silu backward", &gdy, dx, 2e-6);
  df_buffer_free(p.gpu, gx.data), df_buffer_free(p.gpu, gdy.data), df_buffer_free(p.gpu, gy.data);
  df_buffer_free(p.gpu, gm.data);
  free(x), free(dy), free(y), free(dx);
  cu_pair_close(&p);
}

// ---- the fused LM head ---------------------------------------------------------------------------------------------

static void lm_case(df_dtype dt, int64_t chunk, float fs, float bs) {
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { R = 203, H = 96, V = 1000, E = 32 };
  float *h = rnd(R * H, 51, -1, 1), *head = rnd(V * H, 52, -0.5f, 0.5f), *c = rnd(R * E, 53, -1, 1),
        *w2 = rnd(V * E, 54, -1, 1), *w = rnd(R, 55, 0.1f, 1);
  for (int r = 0; r < R; r += 7) memset(c + r * E, 0, sizeof(float) * E);
  if (dt == DF_BF16)
    cu_round_bf16(h, R * H), cu_round_bf16(head, V * H), cu_round_bf16(c, R * E), cu_round_bf16(w2, V * E);
  int32_t lab[R];
  for (int r = 0; r < R; r++) lab[r] = r % 11 == 5 ? -1 : (r * 37) % V;
  float *cef = calloc(R, 4), *ceb = calloc(R, 4), *dh = calloc(R * H, 4), *dc = calloc(R * E, 4),
        *dw2 = calloc(V * E, 4);
  uint8_t okf[R], okb[R];
  df_tensor th = df_f32(h, R, H), thd = df_f32(head, V, H), tc = df_f32(c, R, E), tw2 = df_f32(w2, V, E),
            tl = df_i32(lab, R), tw = df_f32(w, R), tcf = df_f32(cef, R), tcb = df_f32(ceb, R), tof = df_u8(okf, R),
            tob = df_u8(okb, R), tdh = df_f32(dh, R, H), tdc = df_f32(dc, R, E), tdw2 = df_f32(dw2, V, E);
  const df_lmhead_domino_desc d = {.chunk_rows = chunk, .final_scale = fs, .base_scale = bs};
  const df_lmhead_domino_in in = {.hidden = &th, .head = &thd, .corr = &tc, .w2 = &tw2, .labels = &tl, .weights = &tw};
  const df_lmhead_domino_out out = {.ce_final = &tcf,
                                    .ce_base = &tcb,
                                    .correct_final = &tof,
                                    .correct_base = &tob,
                                    .dhidden = &tdh,
                                    .dcorr = &tdc,
                                    .dw2 = &tdw2};
  DF_ASSERT_OK(df_lmhead_domino(p.cpu, &d, &in, &out, &err), &err);
  df_tensor gh = dev_as(&p, h, dt, R, H), ghd = dev_as(&p, head, dt, V, H), gc = dev_as(&p, c, dt, R, E),
            gw2 = dev_as(&p, w2, dt, V, E), gl = cu_pair_dev(&p, &tl), gw = cu_pair_dev(&p, &tw),
            gcf = cu_pair_dev(&p, &tcf), gcb = cu_pair_dev(&p, &tcb), gof = cu_pair_dev(&p, &tof),
            gob = cu_pair_dev(&p, &tob), gdh = dev_as(&p, dh, dt, R, H), gdc = dev_as(&p, dc, dt, R, E);
  float *zero = calloc(V * E, 4);
  df_tensor gdw2 = dev_as(&p, zero, dt, V, E);
  const df_lmhead_domino_in gin = {.hidden = &gh, .head = &ghd, .corr = &gc, .w2 = &gw2, .labels = &gl, .weights = &gw};
  const df_lmhead_domino_out gout = {.ce_final = &gcf,
                                     .ce_base = &gcb,
                                     .correct_final = &gof,
                                     .correct_base = &gob,
                                     .dhidden = &gdh,
                                     .dcorr = &gdc,
                                     .dw2 = &gdw2};
  DF_ASSERT_OK(df_lmhead_domino(p.gpu, &d, &gin, &gout, &err), &err);
  const bool bf = dt == DF_BF16;
  expect_dev(&p, "ce_final", &gcf, cef, bf ? 1e-4 : 2e-5);
  expect_dev(&p, "ce_base", &gcb, ceb, bf ? 1e-4 : 2e-5);
  expect_dev(&p, "dhidden", &gdh, dh, bf ? 1e-2 : 1e-4);
  if (fs > 0) {
    expect_dev(&p, "dcorr", &gdc, dc, bf ? 1e-2 : 1e-4);
    expect_dev(&p, "dw2", &gdw2, dw2, bf ? 1e-2 : 1e-4);
  } else { // exact zeros
    float *hc = down(&p, &gdc), *hw = down(&p, &gdw2);
    for (int i = 0; i < R * E; i++) cr_expect_eq(hc[i], 0.0f, "dcorr[%d] at final_scale 0", i);
    for (int i = 0; i < V * E; i++) cr_expect_eq(hw[i], 0.0f, "dw2[%d] at final_scale 0", i);
    free(hc), free(hw);
  }
  df_tensor *all[] = {&gh, &ghd, &gc, &gw2, &gdh, &gdc, &gdw2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) cu_free(all[i]->data);
  df_tensor *own[] = {&gl, &gw, &gcf, &gcb, &gof, &gob};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++) df_buffer_free(p.gpu, own[i]->data);
  free(h), free(head), free(c), free(w2), free(w), free(cef), free(ceb), free(dh), free(dc), free(dw2), free(zero);
  cu_pair_close(&p);
}

Test(cuda_domino, lmhead_fp32_one_pass) {
  CU_REQUIRE_GPU();
  lm_case(DF_F32, 0, 0.63f, 0.37f);
}
Test(cuda_domino, lmhead_fp32_chunks) {
  CU_REQUIRE_GPU();
  lm_case(DF_F32, 64, 0.5f, 0.5f);
}
Test(cuda_domino, lmhead_fp32_lambda_one) {
  CU_REQUIRE_GPU();
  lm_case(DF_F32, 50, 0.0f, 1.0f);
}
Test(cuda_domino, lmhead_bf16) {
  CU_REQUIRE_GPU();
  lm_case(DF_BF16, 96, 0.7f, 0.3f);
}

// ---- metrics ---------------------------------------------------------------------------------------------------

Test(cuda_domino, block_metrics_bit_exact) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { BS = 6, NB = 41, R = BS * NB };
  float *cef = rnd(R, 61, 0, 8), *ceb = rnd(R, 62, 0, 8), *w = rnd(R, 63, 0, 1);
  uint8_t okf[R], okb[R], v[R], keep[NB];
  for (int r = 0; r < R; r++) okf[r] = (r * 7) % 3 != 0, okb[r] = (r * 5) % 4 != 0, v[r] = r % 13 != 2;
  for (int i = 0; i < NB; i++) keep[i] = i % 9 != 4;
  double st[DF_DOMSTAT_POS + 2 * BS] = {0};
  df_tensor tcf = df_f32(cef, R), tcb = df_f32(ceb, R), tw = df_f32(w, R), tof = df_u8(okf, R), tob = df_u8(okb, R),
            tv = df_u8(v, R), tk = df_u8(keep, NB), ts = df_f64_on(DF_DEV_CPU, st, DF_DOMSTAT_POS + 2 * BS);
  df_domino_metrics_in in = {.ce_final = &tcf,
                             .ce_base = &tcb,
                             .correct_final = &tof,
                             .correct_base = &tob,
                             .valid = &tv,
                             .weights = &tw,
                             .keep = &tk,
                             .final_scale = 0.3,
                             .base_scale = 0.7,
                             .inv_den = 0.01};
  DF_ASSERT_OK(df_domino_block_metrics(p.cpu, BS, &in, &ts, &err), &err);
  df_tensor gcf = cu_pair_dev(&p, &tcf), gcb = cu_pair_dev(&p, &tcb), gw = cu_pair_dev(&p, &tw),
            gof = cu_pair_dev(&p, &tof), gob = cu_pair_dev(&p, &tob), gv = cu_pair_dev(&p, &tv),
            gk = cu_pair_dev(&p, &tk);
  double zero[DF_DOMSTAT_POS + 2 * BS] = {0};
  df_tensor tz = df_f64_on(DF_DEV_CPU, zero, DF_DOMSTAT_POS + 2 * BS), gs = cu_pair_dev(&p, &tz);
  df_domino_metrics_in gin = {.ce_final = &gcf,
                              .ce_base = &gcb,
                              .correct_final = &gof,
                              .correct_base = &gob,
                              .valid = &gv,
                              .weights = &gw,
                              .keep = &gk,
                              .final_scale = 0.3,
                              .base_scale = 0.7,
                              .inv_den = 0.01};
  DF_ASSERT_OK(df_domino_block_metrics(p.gpu, BS, &gin, &gs, &err), &err);
  double back[DF_DOMSTAT_POS + 2 * BS];
  DF_ASSERT_OK(df_copy(p.gpu, back, DF_DEV_CPU, gs.data, DF_DEV_CUDA, sizeof back, &err), &err);
  for (int i = 0; i < DF_DOMSTAT_POS + 2 * BS; i++)
    cr_expect(back[i] == st[i], "stats[%d]: %.17g vs %.17g", i, back[i], st[i]);
  df_tensor *all[] = {&gcf, &gcb, &gw, &gof, &gob, &gv, &gk, &gs};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) df_buffer_free(p.gpu, all[i]->data);
  free(cef), free(ceb), free(w);
  cu_pair_close(&p);
}
