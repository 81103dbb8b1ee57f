// Block-sparse DFlash attention on the GPU: the fp32 path against the PyTorch goldens of the CPU attention tests
// and against the CPU op; the bf16 tensor-core path against the CPU op run on the same bf16-rounded inputs and
// against cuDNN's SDPA with the block mask as an additive bias; the large shape (S 3072, 512 anchors × 16, 32/8
// heads of 128); dropped blocks; bitwise determinism of both backward passes.
// Tolerances: fp32 path 2e-5 of max|ref| (+ 2e-6); tensor cores (bf16 P and dS in the products) relative L2 error
// ≤ 1e-2 per tensor and |lse diff| ≤ 2e-3; cuDNN vs tensor cores (both bf16 outputs) relative L2 ≤ 1e-2.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

typedef struct {
  int64_t B, N, bs, S, nH, nKV, hd, W;
  float scale;
} shp;

typedef struct {
  float *q, *k, *v, *dout;
  int32_t *anchors;
  uint8_t *keep;
} inputs;

typedef struct {
  float *out, *lse, *dq, *dk, *dv;
} results;

static int64_t nq(const shp *s) { return s->B * s->N * s->bs * s->nH * s->hd; }
static int64_t nk(const shp *s) { return s->B * (s->S + s->N * s->bs) * s->nKV * s->hd; }
static int64_t nl(const shp *s) { return s->B * s->nH * s->N * s->bs; }

static results alloc_results(const shp *s) {
  results r = {malloc(4 * nq(s)), malloc(4 * nl(s)), malloc(4 * nq(s)), malloc(4 * nk(s)), malloc(4 * nk(s))};
  return r;
}

static void free_results(results *r) { free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv); }

static inputs random_inputs(const shp *s, uint64_t seed, bool round_bf16) {
  inputs in = {malloc(4 * nq(s)),
               malloc(4 * nk(s)),
               malloc(4 * nk(s)),
               malloc(4 * nq(s)),
               malloc(sizeof(int32_t) * s->B * s->N),
               malloc((size_t)(s->B * s->N))};
  df_test_fill_uniform(in.q, nq(s), seed, -1, 1);
  df_test_fill_uniform(in.k, nk(s), seed + 1, -1, 1);
  df_test_fill_uniform(in.v, nk(s), seed + 2, -1, 1);
  df_test_fill_uniform(in.dout, nq(s), seed + 3, -1, 1);
  if (round_bf16) cu_round_bf16(in.q, nq(s)), cu_round_bf16(in.k, nk(s)), cu_round_bf16(in.v, nk(s));
  if (round_bf16) cu_round_bf16(in.dout, nq(s));
  uint64_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < s->B * s->N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    in.anchors[i] = s->S > 0 ? (int32_t)((x >> 33) % (uint64_t)s->S) : 0;
    in.keep[i] = (x >> 20) % 5 != 0; // about one block in five dropped
  }
  if (s->B * s->N > 1) in.anchors[0] = 0, in.keep[0] = 1; // a kept block with no context at all
  return in;
}

static void free_inputs(inputs *in) {
  free(in->q), free(in->k), free(in->v), free(in->dout), free(in->anchors), free(in->keep);
}

static df_block_attn_desc desc_of(const shp *s) {
  return (df_block_attn_desc){.context_len = s->S, .block_size = s->bs, .window = s->W, .scale = s->scale};
}

// The CPU op (the oracle) on in.
static void cpu_attn(const shp *s, const inputs *in, results *r, bool backward) {
  df_ctx *c = df_test_cpu_ctx(0);
  df_error err = {0};
  const int64_t Q = s->N * s->bs, KV = s->S + Q;
  df_tensor q = df_f32(in->q, s->B, Q, s->nH, s->hd), k = df_f32(in->k, s->B, KV, s->nKV, s->hd);
  df_tensor v = df_f32(in->v, s->B, KV, s->nKV, s->hd), a = df_i32(in->anchors, s->B, s->N);
  df_tensor kp = df_u8(in->keep, s->B, s->N), out = df_f32(r->out, s->B, Q, s->nH, s->hd);
  df_tensor lse = df_f32(r->lse, s->B, s->nH, Q), dout = df_f32(in->dout, s->B, Q, s->nH, s->hd);
  df_tensor dq = df_f32(r->dq, s->B, Q, s->nH, s->hd), dk = df_f32(r->dk, s->B, KV, s->nKV, s->hd);
  df_tensor dv = df_f32(r->dv, s->B, KV, s->nKV, s->hd);
  const df_block_attn_desc d = desc_of(s);
  DF_ASSERT_OK(df_block_attn_forward(c, &d, &q, &k, &v, &a, &kp, &out, &lse, &err), &err);
  if (backward)
    DF_ASSERT_OK(df_block_attn_backward(c, &d, &q, &k, &v, &a, &kp, &out, &lse, &dout, &dq, &dk, &dv, &err), &err);
  df_ctx_destroy(c);
}

typedef struct {
  void *q, *k, *v, *dout, *out, *dq, *dk, *dv, *ws;
  int32_t *anchors;
  uint8_t *keep;
  float *lse;
  df_cu_attn_args a;
} gpu_attn;

static gpu_attn gpu_setup(const shp *s, const inputs *in, df_dtype dt, df_cu_attn_path path) {
  gpu_attn g = {0};
  g.q = cu_upload(in->q, nq(s), dt), g.k = cu_upload(in->k, nk(s), dt), g.v = cu_upload(in->v, nk(s), dt);
  g.dout = cu_upload(in->dout, nq(s), dt);
  g.anchors = cu_upload_bytes(in->anchors, sizeof(int32_t) * s->B * s->N);
  g.keep = cu_upload_bytes(in->keep, (size_t)(s->B * s->N));
  const size_t es = dt == DF_BF16 ? 2 : 4;
  g.out = cu_alloc(es * nq(s)), g.dq = cu_alloc(es * nq(s)), g.dk = cu_alloc(es * nk(s)), g.dv = cu_alloc(es * nk(s));
  g.lse = cu_alloc(4 * nl(s));
  g.a = (df_cu_attn_args){.B = s->B,
                          .N = s->N,
                          .bs = s->bs,
                          .S = s->S,
                          .nH = s->nH,
                          .nKV = s->nKV,
                          .hd = s->hd,
                          .window = s->W,
                          .scale = s->scale,
                          .q = g.q,
                          .k = g.k,
                          .v = g.v,
                          .in_dt = dt,
                          .anchors = g.anchors,
                          .keep = g.keep,
                          .out = g.out,
                          .out_dt = dt,
                          .lse = g.lse,
                          .dout = g.dout,
                          .dq = g.dq,
                          .dk = g.dk,
                          .dv = g.dv,
                          .grad_dt = dt,
                          .path = path};
  g.ws = cu_alloc(df_cu_block_attn_bwd_workspace(&g.a));
  return g;
}

static void gpu_free(gpu_attn *g) {
  void *p[] = {g->q, g->k, g->v, g->dout, g->out, g->dq, g->dk, g->dv, g->ws, g->anchors, g->keep, g->lse};
  for (size_t i = 0; i < sizeof p / sizeof *p; i++) cu_free(p[i]);
}

static void gpu_run(cu_env *e, gpu_attn *g, bool backward, results *r, const shp *s) {
  df_error err = {0};
  DF_ASSERT_OK(df_cu_block_attn_fwd(e->s, &g->a, &err), &err);
  if (backward) DF_ASSERT_OK(df_cu_block_attn_bwd(e->s, &g->a, g->ws, &err), &err);
  const df_dtype dt = g->a.in_dt;
  float *out = cu_download(e, g->out, nq(s), dt), *lse = cu_download(e, g->lse, nl(s), DF_F32);
  memcpy(r->out, out, 4 * nq(s)), memcpy(r->lse, lse, 4 * nl(s));
  free(out), free(lse);
  if (!backward) return;
  float *dq = cu_download(e, g->dq, nq(s), dt), *dk = cu_download(e, g->dk, nk(s), dt);
  float *dv = cu_download(e, g->dv, nk(s), dt);
  memcpy(r->dq, dq, 4 * nq(s)), memcpy(r->dk, dk, 4 * nk(s)), memcpy(r->dv, dv, 4 * nk(s));
  free(dq), free(dk), free(dv);
}

// lse: −inf in exactly the same places; elsewhere within atol.
static void expect_lse(const float *got, const float *want, int64_t n, double atol) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const bool we = isinf(want[i]) && want[i] < 0, ge = isinf(got[i]) && got[i] < 0;
    cr_expect_eq(ge, we, "lse[%lld] = %g, want %g", (long long)i, got[i], want[i]);
    if (!we && !ge) worst = fmax(worst, isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]));
  }
  cr_expect_leq(worst, atol, "lse max |diff| %.3g > %.3g", worst, atol);
}

static void expect_rel(const char *what, const float *got, const float *want, int64_t n, double tol) {
  const double e = cu_rel_l2(got, want, n);
  cr_expect_leq(e, tol, "%s: relative L2 error %.3g > %.3g", what, e, tol);
}

static void compare(const shp *s, const results *got, const results *want, bool backward, bool tensor_cores) {
  if (tensor_cores) {
    expect_rel("out", got->out, want->out, nq(s), 1e-2);
    expect_lse(got->lse, want->lse, nl(s), 2e-3);
    if (!backward) return;
    expect_rel("dq", got->dq, want->dq, nq(s), 1e-2);
    expect_rel("dk", got->dk, want->dk, nk(s), 1e-2);
    expect_rel("dv", got->dv, want->dv, nk(s), 1e-2);
  } else {
    df_expect_close("out", got->out, want->out, nq(s), 2e-5, 2e-6);
    expect_lse(got->lse, want->lse, nl(s), 2e-5 * 10);
    if (!backward) return;
    df_expect_close("dq", got->dq, want->dq, nq(s), 2e-5, 2e-6);
    df_expect_close("dk", got->dk, want->dk, nk(s), 2e-5, 2e-6);
    df_expect_close("dv", got->dv, want->dv, nk(s), 2e-5, 2e-6);
  }
}

// Dropped blocks: output and dq rows exactly 0, lse −inf.
static void expect_dropped_zero(const shp *s, const inputs *in, const results *r) {
  const int64_t Q = s->N * s->bs;
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t n = 0; n < s->N; n++) {
      if (in->keep[b * s->N + n]) continue;
      for (int64_t o = 0; o < s->bs; o++)
        for (int64_t h = 0; h < s->nH; h++) {
          cr_expect(isinf(r->lse[(b * s->nH + h) * Q + n * s->bs + o]), "lse of a dropped row");
          for (int64_t d = 0; d < s->hd; d++) {
            const int64_t i = ((b * Q + n * s->bs + o) * s->nH + h) * s->hd + d;
            cr_expect(r->out[i] == 0.0f && r->dq[i] == 0.0f, "dropped row not zero");
          }
        }
    }
}

static void check_case(const shp *s, uint64_t seed) {
  cu_env e = cu_env_open();
  for (int pass = 0; pass < 2; pass++) {
    const bool tc = pass == 1;
    inputs in = random_inputs(s, seed, tc);
    results want = alloc_results(s), got = alloc_results(s);
    cpu_attn(s, &in, &want, true);
    gpu_attn g = gpu_setup(s, &in, tc ? DF_BF16 : DF_F32, tc ? DF_CU_ATTN_TENSOR_CORE : DF_CU_ATTN_FP32);
    gpu_run(&e, &g, true, &got, s);
    compare(s, &got, &want, true, tc);
    expect_dropped_zero(s, &in, &got);
    gpu_free(&g), free_results(&want), free_results(&got), free_inputs(&in);
  }
  cu_env_close(&e);
}

Test(cuda_attention, gqa_full_attention_both_paths_match_cpu) {
  CU_REQUIRE_GPU();
  shp s = {.B = 2, .N = 6, .bs = 16, .S = 100, .nH = 8, .nKV = 2, .hd = 64, .W = 0, .scale = 0.125f};
  check_case(&s, 1000);
}

Test(cuda_attention, mqa_sliding_window_head_dim_128) {
  CU_REQUIRE_GPU();
  shp s = {.B = 1, .N = 5, .bs = 16, .S = 200, .nH = 4, .nKV = 1, .hd = 128, .W = 20, .scale = 0.088f};
  check_case(&s, 1100);
}

Test(cuda_attention, more_than_64_rows_per_block_and_long_blocks) {
  CU_REQUIRE_GPU();
  shp a = {.B = 1, .N = 3, .bs = 16, .S = 150, .nH = 8, .nKV = 1, .hd = 32, .W = 0, .scale = 0.17f}; // 128 rows
  check_case(&a, 1200);
  shp b = {.B = 1, .N = 2, .bs = 80, .S = 70, .nH = 2, .nKV = 2, .hd = 24, .W = 9, .scale = 0.2f}; // bs > 64
  check_case(&b, 1300);
}

// The PyTorch goldens of tests/kernels/test_attention.c (float64 references of fp32 inputs) through the fp32 path.
static void check_golden(const char *file) {
  fx_file *f = fx_load(file);
  const fx_tensor *q = fx_get(f, "q"), *k = fx_get(f, "k"), *a = fx_get(f, "anchors");
  shp s = {.B = q->shape[0],
           .N = a->shape[1],
           .bs = (int64_t)fx_meta(f, "block_size"),
           .S = (int64_t)fx_meta(f, "context_len"),
           .nH = q->shape[2],
           .nKV = k->shape[2],
           .hd = q->shape[3],
           .W = (int64_t)fx_meta(f, "window"),
           .scale = (float)fx_meta(f, "scale")};
  inputs in = {fx_get(f, "q")->data,    fx_get(f, "k")->data,       fx_get(f, "v")->data,
               fx_get(f, "dout")->data, fx_get(f, "anchors")->data, fx_get(f, "keep")->data};
  results want = {fx_get(f, "out")->data, fx_get(f, "lse")->data, fx_get(f, "dq")->data, fx_get(f, "dk")->data,
                  fx_get(f, "dv")->data};
  cu_env e = cu_env_open();
  results got = alloc_results(&s);
  gpu_attn g = gpu_setup(&s, &in, DF_F32, DF_CU_ATTN_FP32);
  gpu_run(&e, &g, true, &got, &s);
  compare(&s, &got, &want, true, false);
  gpu_free(&g), free_results(&got);
  cu_env_close(&e);
  fx_free(f);
}

Test(cuda_attention, goldens_fp32_path) {
  CU_REQUIRE_GPU();
  check_golden("kernels/attention_full.safetensors");
  check_golden("kernels/attention_window.safetensors");
  check_golden("kernels/attention_mha.safetensors");
  check_golden("kernels/attention_long.safetensors");
  check_golden("kernels/attention_long_window.safetensors");
}

static bool same_bits(cu_env *e, const void *d, const float *h, int64_t n, df_dtype dt) {
  float *x = cu_download(e, d, n, dt);
  const bool same = !memcmp(x, h, 4 * (size_t)n);
  free(x);
  return same;
}

Test(cuda_attention, backward_is_bitwise_deterministic) {
  CU_REQUIRE_GPU();
  shp s = {.B = 1, .N = 24, .bs = 16, .S = 300, .nH = 8, .nKV = 2, .hd = 64, .W = 0, .scale = 0.125f};
  cu_env e = cu_env_open();
  for (int pass = 0; pass < 2; pass++) {
    const df_dtype dt = pass ? DF_BF16 : DF_F32;
    inputs in = random_inputs(&s, 1400, pass == 1);
    gpu_attn g = gpu_setup(&s, &in, dt, pass ? DF_CU_ATTN_TENSOR_CORE : DF_CU_ATTN_FP32);
    results r = alloc_results(&s);
    gpu_run(&e, &g, true, &r, &s);
    df_error err = {0};
    DF_ASSERT_OK(df_cu_block_attn_bwd(e.s, &g.a, g.ws, &err), &err); // again, same inputs
    cr_expect(same_bits(&e, g.dq, r.dq, nq(&s), dt), "dq differs between two runs");
    cr_expect(same_bits(&e, g.dk, r.dk, nk(&s), dt), "dk differs between two runs");
    cr_expect(same_bits(&e, g.dv, r.dv, nk(&s), dt), "dv differs between two runs");
    gpu_free(&g), free_results(&r), free_inputs(&in);
  }
  cu_env_close(&e);
}

// cuDNN SDPA with the DFlash mask as a bias against the tensor-core forward, on kept rows.
static void check_cudnn(const shp *s, uint64_t seed, bool sorted_anchors) {
  cu_env e = cu_env_open();
  df_error err = {0};
  df_cu_sdpa *sdpa = NULL;
  df_status st = df_cu_sdpa_create(&sdpa, &err);
  if (st == DF_ERR_UNSUPPORTED && strstr(err.where, "libcudnn"))
    cr_skip_test("cuDNN cannot be loaded (%s): the SDPA oracle comparison is skipped", err.msg);
  DF_ASSERT_OK(st, &err);
  inputs in = random_inputs(s, seed, true);
  if (sorted_anchors) // SpecForge's sorted anchors, spread over the context
    for (int64_t n = 0; n < s->N; n++) in.anchors[n] = (int32_t)(1 + n * (s->S - 1) / s->N), in.keep[n] = n % 17 != 5;
  gpu_attn g = gpu_setup(s, &in, DF_BF16, DF_CU_ATTN_TENSOR_CORE);
  results tc = alloc_results(s);
  gpu_run(&e, &g, false, &tc, s);
  const int64_t Q = s->N * s->bs, KV = s->S + Q;
  void *bias = cu_alloc(2 * (size_t)(s->B * Q * KV)), *kr = cu_alloc(2 * (size_t)(s->B * KV * s->nH * s->hd));
  void *vr = cu_alloc(2 * (size_t)(s->B * KV * s->nH * s->hd)), *o = cu_alloc(2 * nq(s));
  float *stats = cu_alloc(4 * nl(s));
  DF_ASSERT_OK(df_cu_dflash_bias(e.s, &g.a, bias, &err), &err);
  DF_ASSERT_OK(df_cu_repeat_kv(e.s, g.k, kr, s->B, KV, s->nKV, s->nH, s->hd, &err), &err);
  DF_ASSERT_OK(df_cu_repeat_kv(e.s, g.v, vr, s->B, KV, s->nKV, s->nH, s->hd, &err), &err);
  DF_ASSERT_OK(df_cu_sdpa_fwd(sdpa, e.s, s->B, s->nH, Q, KV, s->hd, s->scale, g.q, kr, vr, bias, o, stats, &err), &err);
  float *ho = cu_download(&e, o, nq(s), DF_BF16), *hs = cu_download(&e, stats, nl(s), DF_F32);
  // Compare kept rows only (a dropped block's row is fully masked; its cuDNN output is meaningless).
  int64_t kept = 0;
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t n = 0; n < s->N; n++) kept += in.keep[b * s->N + n];
  float *go = malloc(4 * (size_t)(kept * s->bs * s->nH * s->hd)),
        *wo = malloc(4 * (size_t)(kept * s->bs * s->nH * s->hd));
  int64_t m = 0;
  double worst_lse = 0.0;
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t n = 0; n < s->N; n++) {
      if (!in.keep[b * s->N + n]) continue;
      const int64_t row0 = (b * Q + n * s->bs) * s->nH * s->hd, len = s->bs * s->nH * s->hd;
      memcpy(go + m, tc.out + row0, 4 * (size_t)len), memcpy(wo + m, ho + row0, 4 * (size_t)len);
      m += len;
      for (int64_t h = 0; h < s->nH; h++)
        for (int64_t o2 = 0; o2 < s->bs; o2++) {
          const int64_t li = (b * s->nH + h) * Q + n * s->bs + o2;
          worst_lse = fmax(worst_lse, fabs((double)tc.lse[li] - hs[li]));
        }
    }
  expect_rel("out vs cuDNN SDPA", go, wo, m, 1e-2);
  cr_expect_leq(worst_lse, 5e-3, "lse vs cuDNN softmax stats: max |diff| %.3g", worst_lse);
  free(go), free(wo), free(ho), free(hs);
  cu_free(bias), cu_free(kr), cu_free(vr), cu_free(o), cu_free(stats);
  gpu_free(&g), free_results(&tc), free_inputs(&in);
  df_cu_sdpa_destroy(sdpa);
  cu_env_close(&e);
}

Test(cuda_attention, tensor_cores_match_cudnn_sdpa_small) {
  CU_REQUIRE_GPU();
  shp s = {.B = 2, .N = 6, .bs = 16, .S = 100, .nH = 8, .nKV = 2, .hd = 64, .W = 0, .scale = 0.125f};
  check_cudnn(&s, 1500, false);
  shp w = {.B = 1, .N = 8, .bs = 16, .S = 256, .nH = 4, .nKV = 2, .hd = 128, .W = 32, .scale = 0.088f};
  check_cudnn(&w, 1600, false);
}

// The Qwen3-8B DFlash training shape: S 3072, 512 anchors × 16, 32 query / 8 kv heads of 128.
static const shp LARGE = {
    .B = 1, .N = 512, .bs = 16, .S = 3072, .nH = 32, .nKV = 8, .hd = 128, .W = 0, .scale = 0.08838834764831845f};

Test(cuda_attention, large_shape_tensor_cores_match_cudnn, .timeout = 300) {
  CU_REQUIRE_GPU();
  CU_GPU_ONLY_SHAPE("the Qwen3-8B DFlash shape (S 3072, 512 anchors x 16, 32/8 heads of 128)");
  check_cudnn(&LARGE, 1700, true);
}

Test(cuda_attention, large_shape_tensor_cores_match_fp32_path_and_cpu_forward, .timeout = 300) {
  CU_REQUIRE_GPU();
  CU_GPU_ONLY_SHAPE("the Qwen3-8B DFlash shape (S 3072, 512 anchors x 16, 32/8 heads of 128)");
  const shp *s = &LARGE;
  cu_env e = cu_env_open();
  inputs in = random_inputs(s, 1800, true);
  for (int64_t n = 0; n < s->N; n++) in.anchors[n] = (int32_t)(1 + n * (s->S - 1) / s->N), in.keep[n] = n % 17 != 5;
  results tc = alloc_results(s), f32 = alloc_results(s), cpu = alloc_results(s);
  gpu_attn g = gpu_setup(s, &in, DF_BF16, DF_CU_ATTN_TENSOR_CORE);
  gpu_run(&e, &g, true, &tc, s);
  gpu_free(&g);
  // The fp32 kernels on the same bf16 values: the GPU oracle of the backward at this size.
  gpu_attn h = gpu_setup(s, &in, DF_F32, DF_CU_ATTN_FP32);
  gpu_run(&e, &h, true, &f32, s);
  gpu_free(&h);
  compare(s, &tc, &f32, true, true);
  cpu_attn(s, &in, &cpu, false); // the CPU forward only: its backward at this size is too slow for the check
  df_expect_close("fp32 path out vs CPU", f32.out, cpu.out, nq(s), 2e-5, 2e-6);
  expect_lse(f32.lse, cpu.lse, nl(s), 2e-4);
  free_results(&tc), free_results(&f32), free_results(&cpu), free_inputs(&in);
  cu_env_close(&e);
}
