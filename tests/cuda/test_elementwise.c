// RMSNorm, RoPE, SwiGLU, embedding, casts, fill/scale/axpy/add on the GPU against the CPU ops (kernels/cpu/) run on
// the same (bf16-rounded where the GPU stores bf16) inputs. Tolerances per test: fp32 storage 1e-5 of max|ref|
// (the CPU's exp is a polynomial, cosf/sinf differ by an ulp); bf16 outputs 8e-3 (one rounding of 2^-8); casts
// bit-exact against the host's round-to-nearest-even.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

static df_ctx *cpu(void) { return df_test_cpu_ctx(1); }

// ---- RMSNorm ---------------------------------------------------------------------------------------------------

static void rmsnorm_case(cu_env *e, int64_t R, int64_t D, df_dtype dt, double rtol) {
  float *x = malloc(sizeof(float) * R * D), *w = malloc(sizeof(float) * D), *dy = malloc(sizeof(float) * R * D);
  float *y = malloc(sizeof(float) * R * D), *rstd = malloc(sizeof(float) * R), *dx = malloc(sizeof(float) * R * D);
  float *dw = calloc((size_t)D, sizeof(float));
  df_test_fill_uniform(x, R * D, 100 + D, -2, 2);
  df_test_fill_uniform(w, D, 200 + D, 0.5f, 1.5f);
  df_test_fill_uniform(dy, R * D, 300 + D, -1, 1);
  if (dt == DF_BF16) cu_round_bf16(x, R * D), cu_round_bf16(w, D), cu_round_bf16(dy, R * D);
  df_ctx *c = cpu();
  df_error err = {0};
  df_tensor tx = df_f32(x, R, D), tw = df_f32(w, D), ty = df_f32(y, R, D), tr = df_f32(rstd, R);
  df_tensor tdy = df_f32(dy, R, D), tdx = df_f32(dx, R, D), tdw = df_f32(dw, D);
  DF_ASSERT_OK(df_rmsnorm_forward(c, &tx, &tw, 1e-6f, &ty, &tr, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_backward(c, &tdy, &tx, &tw, &tr, &tdx, false, &tdw, &err), &err);
  void *gx = cu_upload(x, R * D, dt), *gw = cu_upload(w, D, dt), *gdy = cu_upload(dy, R * D, dt);
  void *gy = cu_alloc(4 * (size_t)(R * D)), *gdx = cu_alloc(4 * (size_t)(R * D));
  float *zeros = calloc((size_t)D, sizeof(float));
  void *gr = cu_alloc(4 * (size_t)R), *gdw = cu_upload(zeros, D, DF_F32);
  void *ws = cu_alloc(df_cu_rmsnorm_bwd_workspace(R, D));
  DF_ASSERT_OK(df_cu_rmsnorm_fwd(e->s, gx, dt, gw, dt, 1e-6f, gy, dt, gr, R, D, &err), &err);
  DF_ASSERT_OK(df_cu_rmsnorm_bwd(e->s, gdy, dt, gx, dt, gw, dt, gr, gdx, dt, false, gdw, DF_F32, R, D, ws, &err), &err);
  float *hy = cu_download(e, gy, R * D, dt), *hr = cu_download(e, gr, R, DF_F32);
  float *hdx = cu_download(e, gdx, R * D, dt), *hdw = cu_download(e, gdw, D, DF_F32);
  df_expect_close("rmsnorm y", hy, y, R * D, rtol, 0.0);
  df_expect_close("rmsnorm rstd", hr, rstd, R, 1e-6, 0.0);
  df_expect_close("rmsnorm dx", hdx, dx, R * D, rtol, 0.0);
  df_expect_close("rmsnorm dw", hdw, dw, D, 1e-5, 0.0); // dw is fp32 from the same inputs
  // Deterministic: a second backward adds exactly the same dw again.
  DF_ASSERT_OK(df_cu_rmsnorm_bwd(e->s, gdy, dt, gx, dt, gw, dt, gr, gdx, dt, false, gdw, DF_F32, R, D, ws, &err), &err);
  float *hdw2 = cu_download(e, gdw, D, DF_F32);
  for (int64_t j = 0; j < D; j++) cr_expect_eq(hdw2[j], hdw[j] + hdw[j], "dw not deterministic at %lld", (long long)j);
  free(hy), free(hr), free(hdx), free(hdw), free(hdw2), free(zeros);
  free(x), free(w), free(dy), free(y), free(rstd), free(dx), free(dw);
  cu_free(gx), cu_free(gw), cu_free(gdy), cu_free(gy), cu_free(gdx), cu_free(gr), cu_free(gdw), cu_free(ws);
  df_ctx_destroy(c);
}

Test(cuda_elementwise, rmsnorm_rows_and_heads_fp32_and_bf16) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  rmsnorm_case(&e, 37, 96, DF_F32, 1e-5);    // rows of an odd width
  rmsnorm_case(&e, 3000, 16, DF_F32, 1e-5);  // per-head q/k norm: many short rows, several dw chunks
  rmsnorm_case(&e, 64, 4096, DF_BF16, 8e-3); // bf16 storage at the draft's hidden size
  cu_env_close(&e);
}

// ---- RoPE ------------------------------------------------------------------------------------------------------

Test(cuda_elementwise, rope_forward_backward_any_positions_scaled_table) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { T = 33, NH = 3, HD = 64 };
  float x[T * NH * HD], y[T * NH * HD], dx[T * NH * HD], inv[HD / 2];
  int32_t pos[T];
  df_test_fill_uniform(x, T * NH * HD, 400, -1, 1);
  df_rope_default_inv_freq(1e6, HD, inv);
  for (int i = 0; i < HD / 2; i++) inv[i] *= i % 3 == 0 ? 0.25f : 1.0f; // a scaled (YaRN-like) table
  for (int t = 0; t < T; t++) pos[t] = (t * 977) % 40000;               // arbitrary, unsorted positions
  const float mscale = 1.1f;
  df_ctx *c = cpu();
  df_error err = {0};
  df_tensor tx = df_f32(x, T, NH, HD), ty = df_f32(y, T, NH, HD), tdx = df_f32(dx, T, NH, HD);
  df_tensor tp = df_i32(pos, T), ti = df_f32(inv, HD / 2);
  DF_ASSERT_OK(df_rope_forward(c, &tx, &tp, &ti, mscale, &ty, &err), &err);
  DF_ASSERT_OK(df_rope_backward(c, &tx, &tp, &ti, mscale, &tdx, &err), &err);
  void *gx = cu_upload(x, T * NH * HD, DF_F32), *gp = cu_upload_bytes(pos, sizeof pos);
  void *gi = cu_upload(inv, HD / 2, DF_F32), *gy = cu_alloc(sizeof y);
  DF_ASSERT_OK(df_cu_rope(e.s, gx, DF_F32, gp, gi, mscale, 1.0f, gy, DF_F32, T, NH, HD, &err), &err);
  DF_ASSERT_OK(df_cu_rope(e.s, gx, DF_F32, gp, gi, mscale, -1.0f, gx, DF_F32, T, NH, HD, &err), &err); // in place
  float *hy = cu_download(&e, gy, T * NH * HD, DF_F32), *hdx = cu_download(&e, gx, T * NH * HD, DF_F32);
  // Angles up to 4e4 rad: cosf/sinf argument reduction differs by an ulp between libm and CUDA.
  df_expect_close("rope y", hy, y, T * NH * HD, 2e-5, 0.0);
  df_expect_close("rope dx (in place)", hdx, dx, T * NH * HD, 2e-5, 0.0);
  free(hy), free(hdx), cu_free(gx), cu_free(gp), cu_free(gi), cu_free(gy);
  df_ctx_destroy(c);
  cu_env_close(&e);
}

// ---- SwiGLU ----------------------------------------------------------------------------------------------------

Test(cuda_elementwise, swiglu_with_and_without_clamp_on_fused_halves) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { R = 19, I = 40 };
  float gu[R * 2 * I], g[R * I], u[R * I], dh[R * I], h[R * I], dg[R * I], du[R * I];
  df_test_fill_uniform(gu, R * 2 * I, 500, -4, 4);
  df_test_fill_uniform(dh, R * I, 501, -1, 1);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < I; i++) g[r * I + i] = gu[r * 2 * I + i], u[r * I + i] = gu[r * 2 * I + I + i];
  df_ctx *c = cpu();
  df_error err = {0};
  void *ggu = cu_upload(gu, R * 2 * I, DF_F32), *gdh = cu_upload(dh, R * I, DF_F32);
  void *gh = cu_alloc(sizeof h), *gdgu = cu_alloc(sizeof gu);
  const float limits[2] = {0.0f, 1.5f};
  for (int li = 0; li < 2; li++) {
    df_tensor tg = df_f32(g, R, I), tu = df_f32(u, R, I), th = df_f32(h, R, I), tdh = df_f32(dh, R, I);
    df_tensor tdg = df_f32(dg, R, I), tdu = df_f32(du, R, I);
    DF_ASSERT_OK(df_swiglu_forward(c, &tg, &tu, limits[li], &th, &err), &err);
    DF_ASSERT_OK(df_swiglu_backward(c, &tdh, &tg, &tu, limits[li], &tdg, &tdu, &err), &err);
    df_cu_swiglu_in in = {.rows = R,
                          .cols = I,
                          .g = ggu,
                          .u = (float *)ggu + I,
                          .ldg = 2 * I,
                          .ldu = 2 * I,
                          .in_dt = DF_F32,
                          .limit = limits[li]};
    DF_ASSERT_OK(df_cu_swiglu_fwd(e.s, &in, gh, DF_F32, I, &err), &err);
    DF_ASSERT_OK(df_cu_swiglu_bwd(e.s, &in, gdh, DF_F32, I, gdgu, (float *)gdgu + I, DF_F32, 2 * I, &err), &err);
    float *hh = cu_download(&e, gh, R * I, DF_F32), *hgu = cu_download(&e, gdgu, R * 2 * I, DF_F32);
    float hg[R * I], hu[R * I];
    for (int r = 0; r < R; r++)
      for (int i = 0; i < I; i++) hg[r * I + i] = hgu[r * 2 * I + i], hu[r * I + i] = hgu[r * 2 * I + I + i];
    df_expect_close("swiglu h", hh, h, R * I, 1e-5, 0.0);
    df_expect_close("swiglu dg", hg, dg, R * I, 1e-5, 0.0);
    df_expect_close("swiglu du", hu, du, R * I, 1e-5, 0.0);
    if (li == 1)
      for (int k = 0; k < R * I; k++)
        if (u[k] > 1.5f || u[k] < -1.5f) cr_expect_eq(hu[k], 0.0f, "a clamped up value passed a gradient");
    free(hh), free(hgu);
  }
  cu_free(ggu), cu_free(gdh), cu_free(gh), cu_free(gdgu);
  df_ctx_destroy(c);
  cu_env_close(&e);
}

// ---- embedding -------------------------------------------------------------------------------------------------

Test(cuda_elementwise, embedding_gather_and_deterministic_scatter) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { V = 50, H = 72, T = 300 };
  float *tab = malloc(sizeof(float) * V * H), *dout = malloc(sizeof(float) * T * H),
        *out = malloc(sizeof(float) * T * H);
  float *dtab = malloc(sizeof(float) * V * H);
  int32_t ids[T];
  df_test_fill_uniform(tab, V * H, 600, -1, 1);
  df_test_fill_uniform(dout, T * H, 601, -1, 1);
  memcpy(dtab, tab, sizeof(float) * V * H);                           // dtable is added to: start from non-zero values
  for (int t = 0; t < T; t++) ids[t] = t % 7 == 0 ? 3 : (t * 13) % V; // id 3 repeats many times
  df_ctx *c = cpu();
  df_error err = {0};
  df_tensor tt = df_f32(tab, V, H), ti = df_i32(ids, T), to = df_f32(out, T, H), td = df_f32(dout, T, H);
  df_tensor tdt = df_f32(dtab, V, H);
  DF_ASSERT_OK(df_embedding_forward(c, &tt, &ti, &to, &err), &err);
  DF_ASSERT_OK(df_embedding_backward(c, &td, &ti, &tdt, &err), &err);
  void *gt = cu_upload(tab, V * H, DF_F32), *gi = cu_upload_bytes(ids, sizeof ids), *go = cu_alloc(4 * T * H);
  void *gd = cu_upload(dout, T * H, DF_F32), *gdt = cu_upload(tab, V * H, DF_F32);
  void *ws = cu_alloc(df_cu_embedding_bwd_workspace(T, V));
  DF_ASSERT_OK(df_cu_embedding_fwd(e.s, gt, DF_F32, gi, go, DF_F32, T, V, H, &err), &err);
  DF_ASSERT_OK(df_cu_embedding_bwd(e.s, gd, DF_F32, gi, gdt, DF_F32, T, V, H, ws, &err), &err);
  float *ho = cu_download(&e, go, T * H, DF_F32), *hdt = cu_download(&e, gdt, V * H, DF_F32);
  for (int k = 0; k < T * H; k++) cr_assert_eq(ho[k], out[k], "gather is a copy: bit-exact");
  // Both sides add each id's rows in token order onto the same start values: bit-exact.
  for (int k = 0; k < V * H; k++) cr_assert_eq(hdt[k], dtab[k], "scatter-add differs at %d", k);
  free(ho), free(hdt), free(tab), free(dout), free(out), free(dtab);
  cu_free(gt), cu_free(gi), cu_free(go), cu_free(gd), cu_free(gdt), cu_free(ws);
  df_ctx_destroy(c);
  cu_env_close(&e);
}

// ---- casts and the small elementwise ops -------------------------------------------------------------------------

Test(cuda_elementwise, casts_round_to_nearest_even_bit_exact) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { N = 4096 };
  float x[N];
  df_test_fill_uniform(x, N, 700, -1000, 1000);
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f800000u, 0xff800000u,
                              0x7fc00000u, 0x00000001u, 0x80000000u, 0x7f7fffffu, 0x3f7fffffu};
  for (size_t i = 0; i < sizeof special / sizeof *special; i++) memcpy(&x[i], &special[i], 4); // ties, inf, NaN, ...
  df_error err = {0};
  void *gx = cu_upload(x, N, DF_F32), *gb = cu_alloc(2 * N), *gf = cu_alloc(4 * N);
  DF_ASSERT_OK(df_cu_cast(e.s, gb, DF_BF16, gx, DF_F32, N, &err), &err);
  DF_ASSERT_OK(df_cu_cast(e.s, gf, DF_F32, gb, DF_BF16, N, &err), &err);
  uint16_t hb[N];
  cu_download_bytes(&e, hb, gb, sizeof hb);
  float *hf = cu_download(&e, gf, N, DF_F32);
  for (int i = 0; i < N; i++) {
    const uint16_t want = cu_bf16_bits(x[i]);
    if (isnan(x[i])) {
      cr_expect((hb[i] & 0x7f80u) == 0x7f80u && (hb[i] & 0x7fu) != 0, "NaN must stay NaN at %d", i);
      continue;
    }
    cr_expect_eq(hb[i], want, "bf16 of %a: got 0x%04x want 0x%04x", (double)x[i], hb[i], want);
    cr_expect_eq(hf[i], cu_bf16_value(want), "bf16 → f32 must be exact");
  }
  free(hf), cu_free(gx), cu_free(gb), cu_free(gf);
  cu_env_close(&e);
}

Test(cuda_elementwise, fill_scale_axpy_add) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { N = 1000 };
  float a[N], b[N];
  df_test_fill_uniform(a, N, 800, -1, 1);
  df_test_fill_uniform(b, N, 801, -1, 1);
  df_error err = {0};
  void *ga = cu_upload(a, N, DF_F32), *gb = cu_upload(b, N, DF_F32), *gc = cu_alloc(4 * N);
  const float two = 2.0f;
  void *gtwo = cu_upload(&two, 1, DF_F32);
  DF_ASSERT_OK(df_cu_add(e.s, ga, DF_F32, gb, DF_F32, gc, DF_F32, N, &err), &err); // c = a + b
  DF_ASSERT_OK(df_cu_axpy(e.s, 0.5f, ga, DF_F32, gc, DF_F32, N, &err), &err);      // c += 0.5·a
  DF_ASSERT_OK(df_cu_scale(e.s, gc, DF_F32, N, 0.0f, gtwo, &err), &err);           // c *= *d_alpha (2)
  DF_ASSERT_OK(df_cu_scale(e.s, gc, DF_F32, N, 0.25f, NULL, &err), &err);          // c *= 0.25
  DF_ASSERT_OK(df_cu_fill(e.s, gb, DF_F32, N / 2, 3.0f, &err), &err);              // b[0 : N/2] = 3
  float *hc = cu_download(&e, gc, N, DF_F32), *hb = cu_download(&e, gb, N, DF_F32);
  for (int i = 0; i < N; i++) {
    float c = a[i] + b[i];
    c = c + 0.5f * a[i];
    c = c * 2.0f;
    c = c * 0.25f;
    cr_expect_eq(hc[i], c, "elementwise chain at %d", i);
    cr_expect_eq(hb[i], i < N / 2 ? 3.0f : b[i], "fill at %d", i);
  }
  free(hc), free(hb), cu_free(ga), cu_free(gb), cu_free(gc), cu_free(gtwo);
  cu_env_close(&e);
}
