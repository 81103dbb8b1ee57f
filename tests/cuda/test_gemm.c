// cuBLASLt GEMM wrapper and the grouped expert GEMMs against a double-precision loop reference on the host.
// Tolerances: fp32 operands 1e-5 of max|ref| (only the summation order differs; TF32 is off); bf16 operands rounded
// on the host first, so the products are exact and only the fp32 accumulation order differs: 1e-4; bf16 outputs
// add one rounding of 2^-8: 8e-3.
#include <stdlib.h>

#include "tests/cuda/cu_test.h"

// want[M, N] = alpha·op(A)·op(B) + beta·C (+ bias), row-major, in double.
static void ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, const float *C, int64_t ldc, const float *bias,
                     float *out, int64_t ldo) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++)
        s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (double)(tb ? B[j * ldb + k] : B[k * ldb + j]);
      double v = alpha * s + (C ? beta * (double)C[i * ldc + j] : 0.0) + (bias ? bias[j] : 0.0);
      out[i * ldo + j] = (float)v;
    }
}

typedef struct {
  bool ta, tb;
  int64_t M, N, K;
  df_dtype ab, cd;
  float alpha, beta;
  bool bias, separate_c;
  double rtol;
} gemm_case;

static void run_case(cu_env *e, const gemm_case *c, uint64_t seed) {
  const int64_t Ar = c->ta ? c->K : c->M, Ac = c->ta ? c->M : c->K, Br = c->tb ? c->N : c->K, Bc = c->tb ? c->K : c->N;
  float *A = malloc(sizeof(float) * Ar * Ac), *B = malloc(sizeof(float) * Br * Bc);
  float *C = malloc(sizeof(float) * c->M * c->N), *bias = malloc(sizeof(float) * c->N);
  float *want = malloc(sizeof(float) * c->M * c->N);
  df_test_fill_uniform(A, Ar * Ac, seed, -1, 1);
  df_test_fill_uniform(B, Br * Bc, seed + 1, -1, 1);
  df_test_fill_uniform(C, c->M * c->N, seed + 2, -1, 1);
  df_test_fill_uniform(bias, c->N, seed + 3, -1, 1);
  if (c->ab == DF_BF16) cu_round_bf16(A, Ar * Ac), cu_round_bf16(B, Br * Bc);
  if (c->cd == DF_BF16) cu_round_bf16(C, c->M * c->N), cu_round_bf16(bias, c->N);
  ref_gemm(c->ta, c->tb, c->M, c->N, c->K, c->alpha, A, Ac, B, Bc, c->beta, c->beta != 0 ? C : NULL, c->N,
           c->bias ? bias : NULL, want, c->N);
  void *dA = cu_upload(A, Ar * Ac, c->ab), *dB = cu_upload(B, Br * Bc, c->ab);
  void *dC = cu_upload(C, c->M * c->N, c->cd), *dbias = cu_upload(bias, c->N, c->cd);
  void *dD = c->separate_c ? cu_alloc((c->cd == DF_BF16 ? 2 : 4) * (size_t)(c->M * c->N)) : dC;
  df_cu_gemm_args a = {.trans_a = c->ta,
                       .trans_b = c->tb,
                       .M = c->M,
                       .N = c->N,
                       .K = c->K,
                       .A = dA,
                       .lda = Ac,
                       .B = dB,
                       .ldb = Bc,
                       .ab_dt = c->ab,
                       .C = c->separate_c ? dC : NULL,
                       .ldc = c->N,
                       .D = dD,
                       .ldd = c->N,
                       .cd_dt = c->cd,
                       .alpha = c->alpha,
                       .beta = c->beta,
                       .bias = c->bias ? dbias : NULL,
                       .bias_dt = c->cd};
  df_error err = {0};
  DF_ASSERT_OK(df_cu_gemm(e->g, e->s, &a, &err), &err);
  float *got = cu_download(e, dD, c->M * c->N, c->cd);
  df_expect_close("gemm D", got, want, c->M * c->N, c->rtol, 0.0);
  free(got), free(A), free(B), free(C), free(bias), free(want);
  cu_free(dA), cu_free(dB), cu_free(dC), cu_free(dbias);
  if (c->separate_c) cu_free(dD);
}

Test(cuda_gemm, fp32_all_transposes_match_double_reference) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  for (int t = 0; t < 4; t++) {
    gemm_case c = {.ta = t & 1,
                   .tb = t >> 1,
                   .M = 67,
                   .N = 45,
                   .K = 96,
                   .ab = DF_F32,
                   .cd = DF_F32,
                   .alpha = 0.75f,
                   .beta = 0.5f,
                   .rtol = 1e-5};
    run_case(&e, &c, 10 + t);
  }
  cu_env_close(&e);
}

Test(cuda_gemm, bf16_operands_fp32_accumulate_and_beta_one) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  // The weight-gradient form: D (fp32) += Aᵀ·B over bf16 operands.
  gemm_case c = {.ta = true,
                 .tb = false,
                 .M = 128,
                 .N = 96,
                 .K = 333,
                 .ab = DF_BF16,
                 .cd = DF_F32,
                 .alpha = 1.0f,
                 .beta = 1.0f,
                 .rtol = 1e-4};
  run_case(&e, &c, 20);
  // The activation form: bf16 output of x·Wᵀ.
  gemm_case d = {.ta = false,
                 .tb = true,
                 .M = 200,
                 .N = 136,
                 .K = 64,
                 .ab = DF_BF16,
                 .cd = DF_BF16,
                 .alpha = 1.0f,
                 .beta = 0.0f,
                 .rtol = 8e-3};
  run_case(&e, &d, 21);
  cu_env_close(&e);
}

Test(cuda_gemm, bias_and_residual_epilogues) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  gemm_case b32 = {
      .tb = true, .M = 64, .N = 48, .K = 80, .ab = DF_F32, .cd = DF_F32, .alpha = 1.0f, .bias = true, .rtol = 1e-5};
  run_case(&e, &b32, 30);
  gemm_case b16 = {
      .tb = true, .M = 64, .N = 48, .K = 80, .ab = DF_BF16, .cd = DF_BF16, .alpha = 1.0f, .bias = true, .rtol = 8e-3};
  run_case(&e, &b16, 31);
  // D = A·Bᵀ + C with C a separate residual buffer.
  gemm_case r = {.tb = true,
                 .M = 96,
                 .N = 64,
                 .K = 64,
                 .ab = DF_BF16,
                 .cd = DF_BF16,
                 .alpha = 1.0f,
                 .beta = 1.0f,
                 .separate_c = true,
                 .rtol = 8e-3};
  run_case(&e, &r, 32);
  cu_env_close(&e);
}

Test(cuda_gemm, descriptors_are_cached_per_shape) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  gemm_case c = {.tb = true, .M = 32, .N = 32, .K = 32, .ab = DF_F32, .cd = DF_F32, .alpha = 1.0f, .rtol = 1e-5};
  run_case(&e, &c, 40);
  int n1 = df_cu_gemm_cache_size(e.g);
  run_case(&e, &c, 41); // same shape (and cudaMalloc alignment): no new entry
  cr_expect_eq(df_cu_gemm_cache_size(e.g), n1, "a repeated shape must reuse its cached descriptors");
  c.M = 33;
  run_case(&e, &c, 42);
  cr_expect_eq(df_cu_gemm_cache_size(e.g), n1 + 1, "a new shape adds one entry");
  cu_env_close(&e);
}

Test(cuda_gemm, strided_batch) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { BATCH = 3, M = 20, N = 24, K = 16 };
  float A[BATCH * M * K], B[BATCH * N * K], want[BATCH * M * N];
  df_test_fill_uniform(A, BATCH * M * K, 50, -1, 1);
  df_test_fill_uniform(B, BATCH * N * K, 51, -1, 1);
  for (int b = 0; b < BATCH; b++)
    ref_gemm(false, true, M, N, K, 1.0f, A + b * M * K, K, B + b * N * K, K, 0.0f, NULL, N, NULL, want + b * M * N, N);
  void *dA = cu_upload(A, BATCH * M * K, DF_F32), *dB = cu_upload(B, BATCH * N * K, DF_F32);
  void *dD = cu_alloc(sizeof(float) * BATCH * M * N);
  df_cu_gemm_args a = {.trans_b = true,
                       .M = M,
                       .N = N,
                       .K = K,
                       .A = dA,
                       .lda = K,
                       .B = dB,
                       .ldb = K,
                       .ab_dt = DF_F32,
                       .D = dD,
                       .ldd = N,
                       .cd_dt = DF_F32,
                       .alpha = 1.0f,
                       .batch = BATCH,
                       .stride_a = M * K,
                       .stride_b = N * K,
                       .stride_d = M * N};
  df_error err = {0};
  DF_ASSERT_OK(df_cu_gemm(e.g, e.s, &a, &err), &err);
  float *got = cu_download(&e, dD, BATCH * M * N, DF_F32);
  df_expect_close("batched D", got, want, BATCH * M * N, 1e-5, 0.0);
  free(got), cu_free(dA), cu_free(dB), cu_free(dD);
  cu_env_close(&e);
}

// Grouped expert GEMMs: forward x·W_eᵀ per expert segment, data gradient dy·W_e, weight gradient += dy_eᵀ·x_e,
// including an empty expert (its gradient must stay untouched).
Test(cuda_gemm, grouped_expert_gemms_match_per_expert_reference) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { E = 4, N = 24, K = 40 };
  const int32_t rows[E] = {5, 0, 17, 9}, offs[E] = {0, 5, 5, 22};
  const int64_t R = 31;
  float *X = malloc(sizeof(float) * R * K), *W = malloc(sizeof(float) * E * N * K), *dY = malloc(sizeof(float) * R * N);
  float *dW0 = malloc(sizeof(float) * E * N * K), *want = malloc(sizeof(float) * R * N);
  float *wantx = malloc(sizeof(float) * R * K), *wantw = malloc(sizeof(float) * E * N * K);
  df_test_fill_uniform(X, R * K, 60, -1, 1);
  df_test_fill_uniform(W, E * N * K, 61, -1, 1);
  df_test_fill_uniform(dY, R * N, 62, -1, 1);
  df_test_fill_uniform(dW0, E * N * K, 63, -1, 1);
  cu_round_bf16(X, R * K), cu_round_bf16(W, E * N * K), cu_round_bf16(dY, R * N);
  for (int x = 0; x < E * N * K; x++) wantw[x] = dW0[x];
  for (int ex = 0; ex < E; ex++) {
    if (!rows[ex]) continue;
    ref_gemm(false, true, rows[ex], N, K, 1, X + offs[ex] * K, K, W + ex * N * K, K, 0, NULL, N, NULL,
             want + offs[ex] * N, N);
    ref_gemm(false, false, rows[ex], K, N, 1, dY + offs[ex] * N, N, W + ex * N * K, K, 0, NULL, K, NULL,
             wantx + offs[ex] * K, K);
    ref_gemm(true, false, N, K, rows[ex], 1, dY + offs[ex] * N, N, X + offs[ex] * K, K, 1, dW0 + ex * N * K, K, NULL,
             wantw + ex * N * K, K);
  }
  void *dX = cu_upload(X, R * K, DF_BF16), *dWt = cu_upload(W, E * N * K, DF_BF16),
       *ddY = cu_upload(dY, R * N, DF_BF16);
  void *dD = cu_alloc(sizeof(float) * R * N), *dDx = cu_alloc(sizeof(float) * R * K);
  void *ddW = cu_upload(dW0, E * N * K, DF_F32), *ws = cu_alloc(df_cu_grouped_workspace(E));
  df_error err = {0};
  df_cu_grouped_args f = {.E = E,
                          .h_rows = rows,
                          .h_offsets = offs,
                          .N = N,
                          .K = K,
                          .X = dX,
                          .ldx = K,
                          .W = dWt,
                          .stride_w = N * K,
                          .trans_w = true,
                          .D = dD,
                          .ldd = N,
                          .ab_dt = DF_BF16,
                          .d_dt = DF_F32};
  DF_ASSERT_OK(df_cu_gemm_grouped(e.g, e.s, &f, ws, &err), &err);
  // data gradient: dx_e[rows, K] = dy_e[rows, N] · W_e[N, K]
  df_cu_grouped_args b = {.E = E,
                          .h_rows = rows,
                          .h_offsets = offs,
                          .N = K,
                          .K = N,
                          .X = ddY,
                          .ldx = N,
                          .W = dWt,
                          .stride_w = N * K,
                          .trans_w = false,
                          .D = dDx,
                          .ldd = K,
                          .ab_dt = DF_BF16,
                          .d_dt = DF_F32};
  DF_ASSERT_OK(df_cu_gemm_grouped(e.g, e.s, &b, ws, &err), &err);
  df_cu_grouped_wgrad_args w = {.E = E,
                                .h_rows = rows,
                                .h_offsets = offs,
                                .N = N,
                                .K = K,
                                .dY = ddY,
                                .lddy = N,
                                .X = dX,
                                .ldx = K,
                                .dW = ddW,
                                .stride_dw = N * K,
                                .ab_dt = DF_BF16};
  DF_ASSERT_OK(df_cu_gemm_grouped_wgrad(e.g, e.s, &w, ws, &err), &err);
  float *got = cu_download(&e, dD, R * N, DF_F32), *gotx = cu_download(&e, dDx, R * K, DF_F32);
  float *gotw = cu_download(&e, ddW, E * N * K, DF_F32);
  df_expect_close("grouped forward", got, want, R * N, 1e-4, 0.0);
  df_expect_close("grouped dgrad", gotx, wantx, R * K, 1e-4, 0.0);
  df_expect_close("grouped wgrad (+= into fp32)", gotw, wantw, E * N * K, 1e-4, 0.0);
  for (int x = 0; x < N * K; x++) cr_expect_eq(gotw[N * K + x], dW0[N * K + x], "the empty expert's gradient changed");
  free(got), free(gotx), free(gotw), free(X), free(W), free(dY), free(dW0), free(want), free(wantx), free(wantw);
  cu_free(dX), cu_free(dWt), cu_free(ddY), cu_free(dD), cu_free(dDx), cu_free(ddW), cu_free(ws);
  cu_env_close(&e);
}
