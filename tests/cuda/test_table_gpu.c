// The CUDA backend table through the public op interface (kernels/ops.h) on a CUDA context, against the same ops on
// a CPU context: what the trainer calls with training.device: cuda. fp32 storage everywhere (the trainer's storage
// today); bf16 storage for the ops whose kernels take it, with bf16-rounded inputs on both sides.
// Tolerances: fp32 1e-5 of max|ref| unless a line says otherwise (GEMM accumulation order, libm vs CUDA exp); the
// deterministic sums (block metrics, fill, cast, gather, the norms in the CPU's block order) bit-exact; bf16 outputs
// 8e-3 (one rounding).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

// The device tensor's bytes in a new host buffer.
static void *host(cu_pair *p, const df_tensor *t) {
  df_error err = {0};
  const size_t bytes = (size_t)df_numel(t) * df_dtype_size(t->dtype);
  void *h = malloc(bytes ? bytes : 1);
  DF_ASSERT_OK(df_copy(p->gpu, h, DF_DEV_CPU, t->data, DF_DEV_CUDA, bytes, &err), &err);
  return h;
}

static void release(cu_pair *p, df_tensor *t) { df_buffer_free(p->gpu, t->data); }

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  df_test_fill_uniform(x, n, seed, lo, hi);
  return x;
}

static void expect_dev(cu_pair *p, const char *what, const df_tensor *g, const float *want, double rtol) {
  float *h = host(p, g);
  df_expect_close(what, h, want, df_numel(g), rtol, 1e-7);
  free(h);
}

Test(cuda_table, linear_matmul_axpy_fp32_and_bf16) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  enum { M = 70, K = 48, N = 40 };
  df_error err = {0};
  for (int pass = 0; pass < 2; pass++) {
    const bool bf = pass == 1;
    float *x = rnd(M * K, 1, -1, 1), *w = rnd(N * K, 2, -1, 1), *b = rnd(N, 3, -1, 1), *dy = rnd(M * N, 4, -1, 1);
    if (bf) cu_round_bf16(x, M * K), cu_round_bf16(w, N * K), cu_round_bf16(b, N), cu_round_bf16(dy, M * N);
    float *y = calloc(M * N, 4), *dx = calloc(M * K, 4), *dw = calloc(N * K, 4), *db = calloc(N, 4);
    df_tensor tx = df_f32(x, M, K), tw = df_f32(w, N, K), tb = df_f32(b, N), tdy = df_f32(dy, M, N);
    df_tensor ty = df_f32(y, M, N), tdx = df_f32(dx, M, K), tdw = df_f32(dw, N, K), tdb = df_f32(db, N);
    // The GPU side in the pass's storage dtype (bf16 tensors are made on the device by df_cast).
    df_tensor hs[8] = {tx, tw, tb, tdy, ty, tdx, tdw, tdb}, gs[8];
    for (int i = 0; i < 8; i++) {
      if (i >= 5) memset(hs[i].data, 0, (size_t)df_numel(&hs[i]) * 4); // gradients start at 0 on the GPU
      df_tensor f = cu_pair_dev(&p, &hs[i]);
      if (!bf) {
        gs[i] = f;
        continue;
      }
      gs[i] = f, gs[i].dtype = DF_BF16;
      void *d = NULL;
      DF_ASSERT_OK(df_buffer_alloc(p.gpu, 2 * (size_t)df_numel(&f), &d, &err), &err);
      gs[i].data = d;
      DF_ASSERT_OK(df_cast(p.gpu, &f, &gs[i], &err), &err);
      release(&p, &f);
    }
    // The uploads above zeroed the host gradients: compute the CPU reference again.
    DF_ASSERT_OK(df_linear_forward(p.cpu, &tx, &tw, &tb, &ty, &err), &err);
    memset(dx, 0, M * K * 4), memset(dw, 0, N * K * 4), memset(db, 0, N * 4);
    DF_ASSERT_OK(df_linear_backward(p.cpu, &tdy, &tx, &tw, &tdx, false, &tdw, &tdb, &err), &err);
    DF_ASSERT_OK(df_linear_forward(p.gpu, &gs[0], &gs[1], &gs[2], &gs[4], &err), &err);
    DF_ASSERT_OK(df_linear_backward(p.gpu, &gs[3], &gs[0], &gs[1], &gs[5], false, &gs[6], &gs[7], &err), &err);
    const double tol = bf ? 8e-3 : 1e-5;
    const float *want[4] = {y, dx, dw, db};
    const char *names[4] = {"linear y", "linear dx", "linear dw", "linear db"};
    for (int i = 0; i < 4; i++) {
      df_tensor f = gs[4 + i];
      if (bf) { // back to fp32 on the device for the comparison
        f.dtype = DF_F32;
        void *d = NULL;
        DF_ASSERT_OK(df_buffer_alloc(p.gpu, 4 * (size_t)df_numel(&f), &d, &err), &err);
        f.data = d;
        DF_ASSERT_OK(df_cast(p.gpu, &gs[4 + i], &f, &err), &err);
      }
      expect_dev(&p, names[i], &f, want[i], tol);
      if (bf) release(&p, &f);
    }
    // axpy: dy += 0.5·y (fp32 only: the reference is exact arithmetic of the same values).
    if (!bf) {
      for (int i = 0; i < M * N; i++) dy[i] += 0.5f * y[i];
      DF_ASSERT_OK(df_axpy(p.gpu, 0.5f, &gs[4], &gs[3], &err), &err);
      expect_dev(&p, "axpy", &gs[3], dy, 1e-6);
    }
    for (int i = 0; i < 8; i++) release(&p, &gs[i]);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
  }
  cu_pair_close(&p);
}

// A bf16 copy on the device of host fp32 values (already bf16-exact), through df_cast.
static df_tensor dev_bf16(cu_pair *p, const df_tensor *h) {
  df_error err = {0};
  df_tensor f = cu_pair_dev(p, h), b = f;
  void *d = NULL;
  DF_ASSERT_OK(df_buffer_alloc(p->gpu, 2 * (size_t)df_numel(&f), &d, &err), &err);
  b.data = d, b.dtype = DF_BF16;
  DF_ASSERT_OK(df_cast(p->gpu, &f, &b, &err), &err);
  release(p, &f);
  return b;
}

// Mixed precision's weight gradients: bf16 activations, weights and output gradients, fp32 dw / db, added twice
// (two micro-steps). The products of bf16 values are exact in fp32, so the GPU matches the CPU's fp32 op on the
// same (bf16-rounded) inputs to fp32 accumulation order: 1e-5 of max |ref|.
Test(cuda_table, fp32_weight_gradients_under_bf16_storage) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { M = 70, K = 48, N = 40 };
  float *x = rnd(M * K, 31, -1, 1), *w = rnd(N * K, 32, -1, 1), *dy = rnd(M * N, 33, -1, 1);
  cu_round_bf16(x, M * K), cu_round_bf16(w, N * K), cu_round_bf16(dy, M * N);
  float *dw = calloc(N * K, 4), *db = calloc(N, 4);
  df_tensor tx = df_f32(x, M, K), tw = df_f32(w, N, K), tdy = df_f32(dy, M, N), tdw = df_f32(dw, N, K),
            tdb = df_f32(db, N);
  df_tensor gx = dev_bf16(&p, &tx), gw = dev_bf16(&p, &tw), gdy = dev_bf16(&p, &tdy);
  df_tensor gdw = cu_pair_dev(&p, &tdw), gdb = cu_pair_dev(&p, &tdb); // fp32, zero
  for (int k = 0; k < 2; k++) {
    DF_ASSERT_OK(df_linear_backward(p.cpu, &tdy, &tx, &tw, NULL, false, &tdw, &tdb, &err), &err);
    DF_ASSERT_OK(df_linear_backward(p.gpu, &gdy, &gx, &gw, NULL, false, &gdw, &gdb, &err), &err);
  }
  expect_dev(&p, "linear dw (f32 of bf16)", &gdw, dw, 1e-5);
  expect_dev(&p, "linear db (f32 of bf16)", &gdb, db, 1e-5);
  // RMSNorm: bf16 x, w, dy, dx; fp32 dw.
  enum { R = 36, D = 64 };
  float *nx = rnd(R * D, 34, -2, 2), *nw = rnd(D, 35, 0.5f, 1.5f), *ndy = rnd(R * D, 36, -1, 1);
  cu_round_bf16(nx, R * D), cu_round_bf16(nw, D), cu_round_bf16(ndy, R * D);
  float ny[R * D], nr[R], ndx[R * D], ndw[D] = {0};
  df_tensor ttx = df_f32(nx, R, D), ttw = df_f32(nw, D), tty = df_f32(ny, R, D), ttr = df_f32(nr, R);
  df_tensor ttdy = df_f32(ndy, R, D), ttdx = df_f32(ndx, R, D), ttdw = df_f32(ndw, D);
  DF_ASSERT_OK(df_rmsnorm_forward(p.cpu, &ttx, &ttw, 1e-6f, &tty, &ttr, &err), &err);
  df_tensor hx = dev_bf16(&p, &ttx), hw = dev_bf16(&p, &ttw), hdy = dev_bf16(&p, &ttdy), hdx = dev_bf16(&p, &ttdy);
  df_tensor hr = cu_pair_dev(&p, &ttr), hdw = cu_pair_dev(&p, &ttdw); // the CPU's rstd; fp32 dw, zero
  DF_ASSERT_OK(df_rmsnorm_backward(p.cpu, &ttdy, &ttx, &ttw, &ttr, &ttdx, false, &ttdw, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_backward(p.gpu, &hdy, &hx, &hw, &hr, &hdx, false, &hdw, &err), &err);
  expect_dev(&p, "rmsnorm dw (f32 of bf16)", &hdw, ndw, 1e-5);
  df_tensor *all[] = {&gx, &gw, &gdy, &gdw, &gdb, &hx, &hw, &hdy, &hdx, &hr, &hdw};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) release(&p, all[i]);
  free(x), free(w), free(dy), free(dw), free(db), free(nx), free(nw), free(ndy);
  cu_pair_close(&p);
}

Test(cuda_table, fill_scale_cast_gather_exact) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { N = 1000 };
  float *x = rnd(N, 10, -3, 3);
  int32_t ibuf[N];
  uint8_t ubuf[N];
  double dbuf[N];
  df_tensor tf = df_f32(x, N), ti = df_i32(ibuf, N), tu = df_u8(ubuf, N);
  df_tensor td = df_view(dbuf, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(N));
  df_tensor gf = cu_pair_dev(&p, &tf), gi = cu_pair_dev(&p, &ti), gu = cu_pair_dev(&p, &tu), gd = cu_pair_dev(&p, &td);
  DF_ASSERT_OK(df_fill(p.gpu, &gi, -7.9, &err), &err);
  DF_ASSERT_OK(df_fill(p.gpu, &gu, 3, &err), &err);
  DF_ASSERT_OK(df_fill(p.gpu, &gd, 0.1, &err), &err);
  int32_t *hi = host(&p, &gi);
  uint8_t *hu = host(&p, &gu);
  double *hd = host(&p, &gd);
  for (int i = 0; i < N; i++) cr_assert(hi[i] == -7 && hu[i] == 3 && hd[i] == 0.1, "fill of i32 / u8 / f64 at %d", i);
  DF_ASSERT_OK(df_scale(p.gpu, &gf, 0.25f, &err), &err);
  float *hf = host(&p, &gf);
  for (int i = 0; i < N; i++) cr_assert_eq(hf[i], x[i] * 0.25f, "scale at %d", i);
  // cast f32 → bf16 → f32 equals the host's round to nearest even.
  uint16_t bb[N];
  df_tensor tb = df_view(bb, DF_BF16, DF_DEV_CPU, 1, DF_SHAPE(N)), gb = cu_pair_dev(&p, &tb);
  DF_ASSERT_OK(df_cast(p.gpu, &gf, &gb, &err), &err);
  uint16_t *hb = host(&p, &gb);
  for (int i = 0; i < N; i++) cr_assert_eq(hb[i], cu_bf16_bits(hf[i]), "cast at %d", i);
  // gather_rows with holes against the CPU op.
  enum { R = 30, H = 16, NR = 20 };
  float *src = rnd(NR * H, 11, -1, 1), out[R * H];
  int32_t idx[R];
  for (int r = 0; r < R; r++) idx[r] = r % 4 == 1 ? -1 : (r * 7) % NR;
  df_tensor ts = df_f32(src, NR, H), tix = df_i32(idx, R), to = df_f32(out, R, H);
  DF_ASSERT_OK(df_gather_rows(p.cpu, &ts, &tix, &to, &err), &err);
  df_tensor gs = cu_pair_dev(&p, &ts), gix = cu_pair_dev(&p, &tix), go = cu_pair_dev(&p, &to);
  DF_ASSERT_OK(df_gather_rows(p.gpu, &gs, &gix, &go, &err), &err);
  float *ho = host(&p, &go);
  for (int i = 0; i < R * H; i++) cr_assert_eq(ho[i], out[i], "gather_rows at %d", i);
  free(hi), free(hu), free(hd), free(hf), free(hb), free(ho), free(x), free(src);
  df_tensor *all[] = {&gf, &gi, &gu, &gd, &gb, &gs, &gix, &go};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) release(&p, all[i]);
  cu_pair_close(&p);
}

Test(cuda_table, norm_rope_swiglu_embedding_attention_fp32) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  // RMSNorm per head.
  enum { T = 24, NH = 4, HD = 32 };
  float *x = rnd(T * NH * HD, 20, -2, 2), *w = rnd(HD, 21, 0.5f, 1.5f), *dy = rnd(T * NH * HD, 22, -1, 1);
  float y[T * NH * HD], r[T * NH], dx[T * NH * HD], dw[HD] = {0};
  df_tensor tx = df_f32(x, T, NH, HD), tw = df_f32(w, HD), ty = df_f32(y, T, NH, HD), tr = df_f32(r, T * NH);
  df_tensor tdy = df_f32(dy, T, NH, HD), tdx = df_f32(dx, T, NH, HD), tdw = df_f32(dw, HD);
  df_tensor gx = cu_pair_dev(&p, &tx), gw = cu_pair_dev(&p, &tw), gy = cu_pair_dev(&p, &ty), gr = cu_pair_dev(&p, &tr),
            gdy = cu_pair_dev(&p, &tdy);
  df_tensor gdx = cu_pair_dev(&p, &tdx), gdw = cu_pair_dev(&p, &tdw);
  DF_ASSERT_OK(df_rmsnorm_forward(p.cpu, &tx, &tw, 1e-6f, &ty, &tr, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_backward(p.cpu, &tdy, &tx, &tw, &tr, &tdx, false, &tdw, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_forward(p.gpu, &gx, &gw, 1e-6f, &gy, &gr, &err), &err);
  DF_ASSERT_OK(df_rmsnorm_backward(p.gpu, &gdy, &gx, &gw, &gr, &gdx, false, &gdw, &err), &err);
  expect_dev(&p, "rmsnorm y", &gy, y, 1e-5), expect_dev(&p, "rmsnorm dx", &gdx, dx, 1e-5);
  expect_dev(&p, "rmsnorm dw", &gdw, dw, 1e-5);
  // RoPE forward in place on the normalised rows.
  float inv[HD / 2], yr[T * NH * HD];
  int32_t pos[T];
  df_rope_default_inv_freq(1e4, HD, inv);
  for (int t = 0; t < T; t++) pos[t] = 3 * t + 1;
  df_tensor tp = df_i32(pos, T), ti = df_f32(inv, HD / 2), tyr = df_f32(yr, T, NH, HD);
  df_tensor gp = cu_pair_dev(&p, &tp), gi = cu_pair_dev(&p, &ti);
  DF_ASSERT_OK(df_rope_forward(p.cpu, &ty, &tp, &ti, 1.0f, &tyr, &err), &err);
  DF_ASSERT_OK(df_rope_forward(p.gpu, &gy, &gp, &gi, 1.0f, &gy, &err), &err);
  expect_dev(&p, "rope (in place)", &gy, yr, 2e-5);
  // SwiGLU forward / backward with a clamp.
  const int64_t n = T * NH * HD;
  float h[T * NH * HD], dg[T * NH * HD], du[T * NH * HD];
  df_tensor th = df_f32(h, n), tdg = df_f32(dg, n), tdu = df_f32(du, n), tg = df_f32(x, n), tu = df_f32(dy, n);
  df_tensor gh = cu_pair_dev(&p, &th), gdg = cu_pair_dev(&p, &tdg), gdu = cu_pair_dev(&p, &tdu);
  df_tensor gg = gx, gu = gdy;
  gg.ndim = gu.ndim = 1, gg.shape[0] = gu.shape[0] = n, gg.stride[0] = gu.stride[0] = 1;
  DF_ASSERT_OK(df_swiglu_forward(p.cpu, &tg, &tu, 0.8f, &th, &err), &err);
  DF_ASSERT_OK(df_swiglu_backward(p.cpu, &tu, &tg, &tu, 0.8f, &tdg, &tdu, &err), &err);
  DF_ASSERT_OK(df_swiglu_forward(p.gpu, &gg, &gu, 0.8f, &gh, &err), &err);
  DF_ASSERT_OK(df_swiglu_backward(p.gpu, &gu, &gg, &gu, 0.8f, &gdg, &gdu, &err), &err);
  expect_dev(&p, "swiglu h", &gh, h, 1e-5), expect_dev(&p, "swiglu dg", &gdg, dg, 1e-5);
  expect_dev(&p, "swiglu du", &gdu, du, 1e-5);
  // Embedding gather and scatter (bit-exact: same order).
  enum { V = 17, E = 8, TT = 50 };
  float *tab = rnd(V * E, 23, -1, 1), *dout = rnd(TT * E, 24, -1, 1), eo[TT * E], dtab[V * E];
  int32_t ids[TT];
  for (int t = 0; t < TT; t++) ids[t] = (t * 5) % V;
  memcpy(dtab, tab, sizeof dtab);
  df_tensor tt = df_f32(tab, V, E), tid = df_i32(ids, TT), teo = df_f32(eo, TT, E), tdo = df_f32(dout, TT, E);
  df_tensor tdt = df_f32(dtab, V, E), gt = cu_pair_dev(&p, &tt), gid = cu_pair_dev(&p, &tid),
            geo = cu_pair_dev(&p, &teo);
  df_tensor gdo = cu_pair_dev(&p, &tdo), gdt = cu_pair_dev(&p, &tt);
  DF_ASSERT_OK(df_embedding_forward(p.cpu, &tt, &tid, &teo, &err), &err);
  DF_ASSERT_OK(df_embedding_backward(p.cpu, &tdo, &tid, &tdt, &err), &err);
  DF_ASSERT_OK(df_embedding_forward(p.gpu, &gt, &gid, &geo, &err), &err);
  DF_ASSERT_OK(df_embedding_backward(p.gpu, &gdo, &gid, &gdt, &err), &err);
  expect_dev(&p, "embedding out", &geo, eo, 0.0), expect_dev(&p, "embedding dtable", &gdt, dtab, 0.0);
  // Block attention on the GQA golden's inputs.
  fx_file *f = fx_load("kernels/attention_full.safetensors");
  df_block_attn_desc d = {.context_len = (int64_t)fx_meta(f, "context_len"),
                          .block_size = (int64_t)fx_meta(f, "block_size"),
                          .window = (int64_t)fx_meta(f, "window"),
                          .scale = (float)fx_meta(f, "scale")};
  const char *in_names[6] = {"q", "k", "v", "anchors", "keep", "dout"};
  df_tensor hin[6], gin[6];
  for (int i = 0; i < 6; i++) hin[i] = fx_view(f, in_names[i]), gin[i] = cu_pair_dev(&p, &hin[i]);
  const fx_tensor *fo = fx_get(f, "out"), *fl = fx_get(f, "lse"), *fk = fx_get(f, "dk");
  float *o = malloc(4 * fx_numel(fo)), *l = malloc(4 * fx_numel(fl)), *dq = malloc(4 * fx_numel(fo));
  float *dk = malloc(4 * fx_numel(fk)), *dv = malloc(4 * fx_numel(fk));
  df_tensor to2 = hin[0], tl = df_view(l, DF_F32, DF_DEV_CPU, fl->ndim, fl->shape), tdq = hin[0], tdk = hin[1];
  df_tensor tdv = hin[1];
  to2.data = o, tdq.data = dq, tdk.data = dk, tdv.data = dv;
  df_tensor go = cu_pair_dev(&p, &to2), gl = cu_pair_dev(&p, &tl), gdq = cu_pair_dev(&p, &tdq),
            gdk = cu_pair_dev(&p, &tdk), gdv = cu_pair_dev(&p, &tdv);
  DF_ASSERT_OK(df_block_attn_forward(p.cpu, &d, &hin[0], &hin[1], &hin[2], &hin[3], &hin[4], &to2, &tl, &err), &err);
  DF_ASSERT_OK(df_block_attn_backward(p.cpu, &d, &hin[0], &hin[1], &hin[2], &hin[3], &hin[4], &to2, &tl, &hin[5], &tdq,
                                      &tdk, &tdv, &err),
               &err);
  DF_ASSERT_OK(df_block_attn_forward(p.gpu, &d, &gin[0], &gin[1], &gin[2], &gin[3], &gin[4], &go, &gl, &err), &err);
  DF_ASSERT_OK(df_block_attn_backward(p.gpu, &d, &gin[0], &gin[1], &gin[2], &gin[3], &gin[4], &go, &gl, &gin[5], &gdq,
                                      &gdk, &gdv, &err),
               &err);
  expect_dev(&p, "attention out", &go, o, 2e-5), expect_dev(&p, "attention dq", &gdq, dq, 2e-5);
  expect_dev(&p, "attention dk", &gdk, dk, 2e-5), expect_dev(&p, "attention dv", &gdv, dv, 2e-5);
  free(o), free(l), free(dq), free(dk), free(dv), free(x), free(w), free(dy), free(tab), free(dout);
  df_tensor *all[] = {&gx,  &gw,  &gy,     &gr,     &gdy,    &gdx,    &gdw,    &gp,    &gi, &gh,
                      &gdg, &gdu, &gt,     &gid,    &geo,    &gdo,    &gdt,    &go,    &gl, &gdq,
                      &gdk, &gdv, &gin[0], &gin[1], &gin[2], &gin[3], &gin[4], &gin[5]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) release(&p, all[i]);
  fx_free(f);
  cu_pair_close(&p);
}

Test(cuda_table, losses_metrics_and_optimizer_fp32) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  // Fused LM head + CE with weights and a skipped row.
  enum { R = 48, H = 32, V = 300, BS = 4 };
  float *hid = rnd(R * H, 30, -1, 1), *head = rnd(V * H, 31, -0.5f, 0.5f), *wts = rnd(R, 32, 0.1f, 1), loss[R];
  float dh[R * H];
  int32_t lab[R];
  uint8_t cor[R];
  for (int r = 0; r < R; r++) lab[r] = r % 5 == 3 ? -1 : (r * 11) % V;
  df_lmhead_ce_desc cd = {.chunk_rows = 20, .grad_scale = 0.5f};
  df_tensor th = df_f32(hid, R, H), thd = df_f32(head, V, H), tlb = df_i32(lab, R), tw = df_f32(wts, R);
  df_tensor tls = df_f32(loss, R), tc = df_u8(cor, R), tdh = df_f32(dh, R, H);
  df_tensor gh = cu_pair_dev(&p, &th), ghd = cu_pair_dev(&p, &thd), glb = cu_pair_dev(&p, &tlb),
            gw = cu_pair_dev(&p, &tw), gls = cu_pair_dev(&p, &tls);
  df_tensor gc = cu_pair_dev(&p, &tc), gdh = cu_pair_dev(&p, &tdh);
  DF_ASSERT_OK(df_lmhead_ce(p.cpu, &cd, &th, &thd, &tlb, &tw, &tls, &tc, &tdh, &err), &err);
  DF_ASSERT_OK(df_lmhead_ce(p.gpu, &cd, &gh, &ghd, &glb, &gw, &gls, &gc, &gdh, &err), &err);
  expect_dev(&p, "lmhead_ce loss", &gls, loss, 2e-5), expect_dev(&p, "lmhead_ce dhidden", &gdh, dh, 1e-4);
  // D-PACE weights (every mode) and the block metrics on those rows.
  float dw[R], rw[R];
  df_tensor tdw = df_f32(dw, R), trw = df_f32(rw, R), gdw = cu_pair_dev(&p, &tdw), grw = cu_pair_dev(&p, &trw);
  for (int mode = DF_DPACE_ONE; mode <= DF_DPACE_RATIO; mode++) {
    DF_ASSERT_OK(df_dpace_weights(p.cpu, (df_dpace_mode)mode, 0.3, BS, &tls, &tw, &tdw, &trw, &err), &err);
    DF_ASSERT_OK(df_dpace_weights(p.gpu, (df_dpace_mode)mode, 0.3, BS, &gls, &gw, &gdw, &grw, &err), &err);
    float *gotw = host(&p, &gdw);
    df_expect_close("dpace weights", gotw, dw, R, 1e-6, 0.0); // exp of libm vs CUDA: an ulp
    free(gotw);
    expect_dev(&p, "dpace row weights", &grw, rw, 1e-6);
  }
  uint8_t valid[R], keep[R / BS];
  for (int r = 0; r < R; r++) valid[r] = r % 7 != 0;
  for (int b = 0; b < R / BS; b++) keep[b] = b % 3 != 1;
  double stats[64] = {0};
  df_tensor tv = df_u8(valid, R), tk = df_u8(keep, R / BS);
  df_tensor ts = df_view(stats, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(DF_BLOCK_STATS(BS)));
  df_tensor gv = cu_pair_dev(&p, &tv), gk = cu_pair_dev(&p, &tk), gs = cu_pair_dev(&p, &ts);
  DF_ASSERT_OK(df_block_metrics(p.cpu, BS, &tls, &tc, &tw, &tv, &tk, &ts, &err), &err);
  // The GPU's own loss and flags differ by rounding: give both sides the CPU's.
  df_tensor gls2 = cu_pair_dev(&p, &tls), gc2 = cu_pair_dev(&p, &tc);
  DF_ASSERT_OK(df_block_metrics(p.gpu, BS, &gls2, &gc2, &gw, &gv, &gk, &gs, &err), &err);
  double *gstats = host(&p, &gs);
  for (int i = 0; i < DF_BLOCK_STATS(BS); i++) cr_expect(gstats[i] == stats[i], "block stat %d differs", i);
  free(gstats);
  // The fused optimizer step: masked norm (the CPU's block order: bit-exact), clip, AdamW with decay flags.
  enum { NP = 40000 };
  float *g = rnd(NP, 33, -2, 2), *ms = rnd(NP, 34, -1, 1), *m1 = rnd(NP, 35, -0.1f, 0.1f), *v1 = rnd(NP, 36, 0, 0.01f);
  uint8_t *mask = malloc(NP);
  for (int i = 0; i < NP; i++) mask[i] = i % 97 == 0 ? 0 : (i % 3 ? DF_PARAM_TRAIN | DF_PARAM_DECAY : DF_PARAM_TRAIN);
  double ns[3];
  df_tensor tg = df_f32(g, NP), tm = df_u8(mask, NP), tms = df_f32(ms, NP), tm1 = df_f32(m1, NP), tv1 = df_f32(v1, NP);
  df_tensor tns = df_view(ns, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(3));
  df_tensor gg = cu_pair_dev(&p, &tg), gm = cu_pair_dev(&p, &tm), gms = cu_pair_dev(&p, &tms),
            gm1 = cu_pair_dev(&p, &tm1), gv1 = cu_pair_dev(&p, &tv1);
  df_tensor gns_t = cu_pair_dev(&p, &tns);
  df_grad_norm_desc nd = {.grad_scale = 0.125f, .max_norm = 1.0};
  df_adamw_fused_desc ad = {
      .hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3},
      .grad_scale = 0.125f};
  DF_ASSERT_OK(df_grad_norm_clip(p.cpu, &nd, &tg, &tm, NULL, &tns, &err), &err);
  DF_ASSERT_OK(df_adamw_fused(p.cpu, &ad, &tms, &tg, &tm1, &tv1, &tm, &tns, NULL, &err), &err);
  DF_ASSERT_OK(df_grad_norm_clip(p.gpu, &nd, &gg, &gm, NULL, &gns_t, &err), &err);
  DF_ASSERT_OK(df_adamw_fused(p.gpu, &ad, &gms, &gg, &gm1, &gv1, &gm, &gns_t, NULL, &err), &err);
  double *gns = host(&p, &gns_t);
  cr_expect(gns[0] == ns[0] && gns[1] == ns[1] && gns[2] == ns[2], "norm stats %.17g %.17g %g vs CPU %.17g %.17g %g",
            gns[0], gns[1], gns[2], ns[0], ns[1], ns[2]);
  free(gns);
  expect_dev(&p, "fused masters", &gms, ms, 2e-6), expect_dev(&p, "fused m", &gm1, m1, 2e-6);
  expect_dev(&p, "fused v", &gv1, v1, 2e-6);
  free(hid), free(head), free(wts), free(g), free(ms), free(m1), free(v1), free(mask);
  df_tensor *all[] = {&gh, &ghd, &glb,  &gw,  &gls, &gc, &gdh, &gdw, &grw, &gv,
                      &gk, &gs,  &gls2, &gc2, &gg,  &gm, &gms, &gm1, &gv1, &gns_t};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) release(&p, all[i]);
  cu_pair_close(&p);
}
