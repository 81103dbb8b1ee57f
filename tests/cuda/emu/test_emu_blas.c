// The emulated cuBLASLt, cuBLAS and CUB against their documented behaviour: column-major products with both
// transposes, leading dimensions, strided batches, alpha / beta, the BIAS epilogue and bf16 rounding against a
// double reference (1e-5 of max |ref|; bf16 outputs 8e-3); beta = 0 never reading C (C poisoned with NaN); the
// documented statuses for bad arguments and for calls that break the heuristic's promises (alignment, workspace);
// the grouped GEMM's type table; the radix sort's storage query, stable order over a bit range and signed keys.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/emu/emu_kernels.h"
#include "tests/cuda/emu/emu_test.h"

static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static float *filled(int64_t n, int seed) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++)
    x[i] = (float)(((i * 2654435761u + (uint64_t)seed * 40503u) >> 7) % 2001) / 1000.0f - 1.0f;
  return x;
}

static void *upload(const float *h, int64_t n, cudaDataType_t t) {
  void *d = NULL;
  const size_t es = t == CUDA_R_16BF ? 2 : 4;
  cr_assert_eq(cudaMalloc(&d, es * (size_t)n), cudaSuccess);
  if (t == CUDA_R_16BF) {
    uint16_t *b = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = bf16_bits(h[i]);
    cudaMemcpy(d, b, 2 * (size_t)n, cudaMemcpyHostToDevice);
    free(b);
  } else {
    cudaMemcpy(d, h, 4 * (size_t)n, cudaMemcpyHostToDevice);
  }
  return d;
}

static float *download(const void *d, int64_t n, cudaDataType_t t) {
  float *h = malloc(sizeof(float) * (size_t)n);
  if (t == CUDA_R_16BF) {
    uint16_t *b = malloc(2 * (size_t)n);
    cudaMemcpy(b, d, 2 * (size_t)n, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; i++) h[i] = bf16_value(b[i]);
    free(b);
  } else {
    cudaMemcpy(h, d, 4 * (size_t)n, cudaMemcpyDeviceToHost);
  }
  return h;
}

typedef struct {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c, d;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulAlgo_t algo;
  void *ws;
  size_t ws_bytes;
} lt_call;

static void layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int batch,
                   int64_t stride) {
  cr_assert_eq(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld), CUBLAS_STATUS_SUCCESS);
  if (batch > 1) {
    int32_t b = batch;
    cr_assert_eq(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
        CUBLAS_STATUS_SUCCESS);
  }
}

static cublasStatus_t heuristic(lt_call *c, uint64_t ws_max) {
  cr_assert_eq(cublasLtMatmulPreferenceCreate(&c->pref), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(
      cublasLtMatmulPreferenceSetAttribute(c->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max, sizeof ws_max),
      CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(c->lt, c->op, c->a, c->b, c->c, c->d, c->pref, 1, &r, &found);
  if (st == CUBLAS_STATUS_SUCCESS) {
    cr_assert_eq(found, 1);
    c->algo = r.algo;
    c->ws_bytes = r.workspaceSize;
    if (c->ws_bytes) cr_assert_eq(cudaMalloc(&c->ws, c->ws_bytes), cudaSuccess);
  }
  return st;
}

static void lt_close(lt_call *c) {
  cublasLtMatmulPreferenceDestroy(c->pref), cublasLtMatmulDescDestroy(c->op);
  cublasLtMatrixLayoutDestroy(c->a), cublasLtMatrixLayoutDestroy(c->b), cublasLtMatrixLayoutDestroy(c->c);
  cublasLtMatrixLayoutDestroy(c->d), cublasLtDestroy(c->lt);
  cudaFree(c->ws);
}

// Column-major D (m × n, ldd) = alpha·op(A)·op(B) + beta·C (+ bias), batch b, against a double reference.
static void lt_case(bool ta, bool tb, int m, int n, int k, int batch, cudaDataType_t abt, cudaDataType_t cdt,
                    float alpha, float beta, bool bias, double rtol) {
  const int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1, ldc = m + 2, ldd = m + 5;
  const int64_t sa = (int64_t)lda * (ta ? m : k), sb = (int64_t)ldb * (tb ? k : n), sc = (int64_t)ldc * n,
                sd = (int64_t)ldd * n;
  float *A = filled(sa * batch, 1), *B = filled(sb * batch, 2), *C = filled(sc * batch, 3), *bv = filled(m, 4);
  if (abt == CUDA_R_16BF)
    for (int64_t i = 0; i < sa * batch; i++) A[i] = bf16_value(bf16_bits(A[i]));
  if (abt == CUDA_R_16BF)
    for (int64_t i = 0; i < sb * batch; i++) B[i] = bf16_value(bf16_bits(B[i]));
  if (cdt == CUDA_R_16BF) {
    for (int64_t i = 0; i < sc * batch; i++) C[i] = bf16_value(bf16_bits(C[i]));
    for (int i = 0; i < m; i++) bv[i] = bf16_value(bf16_bits(bv[i]));
  }
  void *dA = upload(A, sa * batch, abt), *dB = upload(B, sb * batch, abt), *dC = upload(C, sc * batch, cdt);
  void *dbias = upload(bv, m, cdt), *dD = NULL;
  cr_assert_eq(cudaMalloc(&dD, (cdt == CUDA_R_16BF ? 2 : 4) * (size_t)(sd * batch)), cudaSuccess);
  lt_call c = {0};
  cr_assert_eq(cublasLtCreate(&c.lt), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa),
               CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob),
               CUBLAS_STATUS_SUCCESS);
  if (bias) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias),
                 CUBLAS_STATUS_SUCCESS);
  }
  layout(&c.a, abt, ta ? k : m, ta ? m : k, lda, batch, sa);
  layout(&c.b, abt, tb ? n : k, tb ? k : n, ldb, batch, sb);
  layout(&c.c, cdt, m, n, ldc, batch, sc);
  layout(&c.d, cdt, m, n, ldd, batch, sd);
  cr_assert_eq(heuristic(&c, 1 << 20), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(
      cublasLtMatmul(c.lt, c.op, &alpha, dA, c.a, dB, c.b, &beta, dC, c.c, dD, c.d, &c.algo, c.ws, c.ws_bytes, 0),
      CUBLAS_STATUS_SUCCESS);
  float *got = download(dD, sd * batch, cdt);
  double worst = 0, ref_max = 0;
  for (int bi = 0; bi < batch; bi++)
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        double s = 0;
        for (int p = 0; p < k; p++) {
          const float a = ta ? A[bi * sa + i * lda + p] : A[bi * sa + p * lda + i];
          const float b = tb ? B[bi * sb + p * ldb + j] : B[bi * sb + j * ldb + p];
          s += (double)a * b;
        }
        double want = alpha * s + beta * C[bi * sc + j * ldc + i] + (bias ? bv[i] : 0.0);
        worst = fmax(worst, fabs(got[bi * sd + j * ldd + i] - want));
        ref_max = fmax(ref_max, fabs(want));
      }
  cr_expect_leq(worst, rtol * ref_max, "ta %d tb %d batch %d bias %d: max |D - ref| %.3g > %.3g", ta, tb, batch, bias,
                worst, rtol * ref_max);
  free(A), free(B), free(C), free(bv), free(got);
  cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dbias), cudaFree(dD);
  lt_close(&c);
}

Test(emu_blas, lt_matmul_is_column_major_with_transposes_batches_and_bias) {
  for (int t = 0; t < 4; t++) lt_case(t & 1, t >> 1, 19, 13, 23, 1, CUDA_R_32F, CUDA_R_32F, 0.75f, 0.5f, false, 1e-5);
  lt_case(true, false, 17, 9, 40, 3, CUDA_R_32F, CUDA_R_32F, 1.0f, 1.0f, false, 1e-5);
  lt_case(false, true, 24, 16, 32, 2, CUDA_R_16BF, CUDA_R_16BF, 1.0f, 0.0f, true, 8e-3);
  lt_case(false, true, 24, 16, 32, 1, CUDA_R_16BF, CUDA_R_32F, 1.0f, 0.0f, true, 1e-5);
}

// beta = 0: C is never read, so a NaN-filled C gives a finite D.
Test(emu_blas, beta_zero_does_not_read_c) {
  enum { M = 8, N = 8, K = 8 };
  float A[M * K], B[K * N];
  for (int i = 0; i < M * K; i++) A[i] = 1.0f, B[i] = 2.0f;
  void *dA = upload(A, M * K, CUDA_R_32F), *dB = upload(B, K * N, CUDA_R_32F), *dC = NULL, *dD = NULL;
  cr_assert_eq(cudaMalloc(&dC, sizeof(float) * M * N), cudaSuccess); // fresh: NaN bytes
  cr_assert_eq(cudaMalloc(&dD, sizeof(float) * M * N), cudaSuccess);
  lt_call c = {0};
  cr_assert_eq(cublasLtCreate(&c.lt), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  layout(&c.a, CUDA_R_32F, M, K, M, 1, 0), layout(&c.b, CUDA_R_32F, K, N, K, 1, 0);
  layout(&c.c, CUDA_R_32F, M, N, M, 1, 0), layout(&c.d, CUDA_R_32F, M, N, M, 1, 0);
  cr_assert_eq(heuristic(&c, 0), CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.0f, beta = 0.0f;
  cr_assert_eq(cublasLtMatmul(c.lt, c.op, &alpha, dA, c.a, dB, c.b, &beta, dC, c.c, dD, c.d, &c.algo, NULL, 0, 0),
               CUBLAS_STATUS_SUCCESS);
  float *D = download(dD, M * N, CUDA_R_32F);
  for (int i = 0; i < M * N; i++) cr_expect_eq(D[i], 2.0f * K, "D[%d] = %g", i, D[i]);
  free(D), cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
  lt_close(&c);
}

Test(emu_blas, lt_statuses_for_bad_calls) {
  void *dA = NULL, *dB = NULL, *dD = NULL;
  cr_assert_eq(cudaMalloc(&dA, 4096), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dB, 4096), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dD, 4096), cudaSuccess);
  lt_call c = {0};
  cr_assert_eq(cublasLtCreate(&c.lt), CUBLAS_STATUS_SUCCESS);
  cr_assert_eq(cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  int64_t wrong = CUBLAS_OP_T; // TRANSA is an int32_t attribute
  cr_expect_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &wrong, sizeof wrong),
               CUBLAS_STATUS_INVALID_VALUE);
  layout(&c.a, CUDA_R_32F, 8, 8, 8, 1, 0), layout(&c.b, CUDA_R_32F, 7, 8, 8, 1, 0); // k 8 vs 7
  layout(&c.c, CUDA_R_32F, 8, 8, 8, 1, 0), layout(&c.d, CUDA_R_32F, 8, 8, 8, 1, 0);
  cr_expect_eq(heuristic(&c, 1 << 20), CUBLAS_STATUS_INVALID_VALUE, "op(A) 8 x 8 times op(B) 7 x 8");
  cublasLtMatrixLayoutDestroy(c.b), cublasLtMatmulPreferenceDestroy(c.pref);
  layout(&c.b, CUDA_R_32F, 8, 8, 8, 1, 0);
  cr_assert_eq(heuristic(&c, 1 << 20), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  // The algorithm was chosen for 256-byte aligned pointers (the default preference): a 4-byte aligned A breaks it.
  cr_expect_eq(cublasLtMatmul(c.lt, c.op, &one, (char *)dA + 4, c.a, dB, c.b, &zero, dD, c.c, dD, c.d, &c.algo, c.ws,
                              c.ws_bytes, 0),
               CUBLAS_STATUS_NOT_SUPPORTED);
  cr_expect_eq(
      cublasLtMatmul(c.lt, c.op, &one, dA, c.a, dB, c.b, &zero, dD, c.c, dD, c.d, &c.algo, c.ws, c.ws_bytes / 2, 0),
      CUBLAS_STATUS_INVALID_VALUE, "less workspace than the algorithm asked for");
  cublasLtMatrixLayout_t c2;
  layout(&c2, CUDA_R_32F, 8, 8, 16, 1, 0);
  cr_expect_eq(cublasLtMatmul(c.lt, c.op, &one, dA, c.a, dB, c.b, &one, dD, c2, dD, c.d, &c.algo, c.ws, c.ws_bytes, 0),
               CUBLAS_STATUS_INVALID_VALUE, "in place with different C and D layouts");
  cublasLtMatrixLayoutDestroy(c2);
  cublasLtMatrixLayout_t d16;
  layout(&d16, CUDA_R_16BF, 8, 8, 8, 1, 0);
  cr_expect_eq(
      cublasLtMatmul(c.lt, c.op, &one, dA, c.a, dB, c.b, &zero, dD, d16, dD, d16, &c.algo, c.ws, c.ws_bytes, 0),
      CUBLAS_STATUS_NOT_SUPPORTED, "fp32 operands into a bf16 D");
  cublasLtMatrixLayoutDestroy(d16);
  cudaFree(dA), cudaFree(dB), cudaFree(dD);
  lt_close(&c);
}

Test(emu_blas, grouped_gemm_takes_one_type_for_a_b_and_c) {
  cublasHandle_t h;
  cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  enum { M = 16, N = 8, K = 32 };
  float A[M * K], B[K * N];
  for (int i = 0; i < M * K; i++) A[i] = bf16_value(bf16_bits((float)(i % 5) - 2.0f));
  for (int i = 0; i < K * N; i++) B[i] = bf16_value(bf16_bits((float)(i % 3) - 1.0f));
  void *dA = upload(A, M * K, CUDA_R_16BF), *dB = upload(B, K * N, CUDA_R_16BF), *dC = NULL, **dp = NULL;
  cr_assert_eq(cudaMalloc(&dC, 4 * M * N), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dp, 3 * sizeof(void *)), cudaSuccess);
  void *ptrs[3] = {dA, dB, dC};
  cudaMemcpy(dp, ptrs, sizeof ptrs, cudaMemcpyHostToDevice);
  const cublasOperation_t op = CUBLAS_OP_N;
  const int m = M, n = N, k = K, one = 1;
  const float alpha = 1.0f, beta = 0.0f;
  cr_expect_eq(cublasGemmGroupedBatchedEx(h, &op, &op, &m, &n, &k, &alpha, (const void *const *)dp, CUDA_R_16BF, &m,
                                          (const void *const *)dp + 1, CUDA_R_16BF, &k, &beta, dp + 2, CUDA_R_32F, &m,
                                          1, &one, CUBLAS_COMPUTE_32F),
               CUBLAS_STATUS_NOT_SUPPORTED, "bf16 A and B with an fp32 C is not in cuBLAS's table");
  cr_expect_eq(cublasGemmGroupedBatchedEx(h, &op, &op, &m, &n, &k, &alpha, (const void *const *)dp, CUDA_R_16BF, &m,
                                          (const void *const *)dp + 1, CUDA_R_16BF, &k, &beta, dp + 2, CUDA_R_16BF, &m,
                                          1, &one, CUBLAS_COMPUTE_32F),
               CUBLAS_STATUS_SUCCESS);
  const int bad_ld = m - 1;
  cr_expect_eq(cublasGemmGroupedBatchedEx(h, &op, &op, &m, &n, &k, &alpha, (const void *const *)dp, CUDA_R_16BF,
                                          &bad_ld, (const void *const *)dp + 1, CUDA_R_16BF, &k, &beta, dp + 2,
                                          CUDA_R_16BF, &m, 1, &one, CUBLAS_COMPUTE_32F),
               CUBLAS_STATUS_INVALID_VALUE, "lda < m");
  float *C = download(dC, M * N, CUDA_R_16BF); // the bf16 product, column-major
  for (int j = 0; j < N; j++)
    for (int i = 0; i < M; i++) {
      float want = 0;
      for (int p = 0; p < K; p++) want += A[p * M + i] * B[j * K + p];
      cr_expect_eq(C[j * M + i], bf16_value(bf16_bits(want)), "C[%d][%d]", i, j);
    }
  free(C), cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dp);
  cublasDestroy(h);
}

Test(emu_blas, radix_sort_pairs_is_cubs) {
  enum { N = 1000 };
  int32_t keys[N], vals[N], ko[N], vo[N];
  for (int i = 0; i < N; i++) keys[i] = (int32_t)((i * 7919) % 37) - 5 + ((i % 3) << 8), vals[i] = i;
  size_t bytes = 0;
  cr_assert_eq(sort_pairs_i32(NULL, &bytes, NULL, NULL, NULL, NULL, N, 0, 6), cudaSuccess);
  cr_assert_gt(bytes, 0, "the query sets temp_storage_bytes");
  int32_t *dk, *dv, *dko, *dvo;
  void *temp;
  cr_assert_eq(cudaMalloc(&dk, sizeof keys), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dv, sizeof vals), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dko, sizeof keys), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dvo, sizeof vals), cudaSuccess);
  cr_assert_eq(cudaMalloc(&temp, bytes), cudaSuccess);
  cudaMemcpy(dk, keys, sizeof keys, cudaMemcpyHostToDevice), cudaMemcpy(dv, vals, sizeof vals, cudaMemcpyHostToDevice);
  size_t small = bytes - 1;
  cr_expect_eq(sort_pairs_i32(temp, &small, dk, dko, dv, dvo, N, 0, 6), cudaErrorInvalidValue);
  cr_assert_eq(sort_pairs_i32(temp, &bytes, dk, dko, dv, dvo, N, 0, 6), cudaSuccess);
  cudaMemcpy(ko, dko, sizeof ko, cudaMemcpyDeviceToHost), cudaMemcpy(vo, dvo, sizeof vo, cudaMemcpyDeviceToHost);
  // Bits [0, 6) of the key with the sign bit flipped (CUB's order for signed keys), stable.
  for (int i = 1; i < N; i++) {
    const uint32_t a = ((uint32_t)ko[i - 1] ^ 0x80000000u) & 63, b = ((uint32_t)ko[i] ^ 0x80000000u) & 63;
    cr_expect(a < b || (a == b && vo[i - 1] < vo[i]), "position %d: digit %u (value %d) then %u (value %d)", i, a,
              vo[i - 1], b, vo[i]);
  }
  for (int i = 0; i < N; i++) cr_expect_eq(ko[i], keys[vo[i]], "keys travel with their values");
  cudaFree(dk), cudaFree(dv), cudaFree(dko), cudaFree(dvo), cudaFree(temp);
}
