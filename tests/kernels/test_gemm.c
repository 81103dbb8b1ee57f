// The CPU backend's GEMM (kernels/cpu/gemm.h): every transpose and beta against a double reference at shapes
// that cut blocks in m, n and k; bits independent of the thread count and of how rows are split between calls;
// the OpenBLAS cases. CTest also runs this file with LIBXSMM_TARGET=generic (kernels.gemm_portable): the portable
// loop must pass the same checks.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm.h"
#include "tests/common/fixture.h"

typedef struct {
  bool ta, tb;
  int64_t M, N, K;
} gemm_case;

// Row-major op(X)[i, k].
static double at(const float *x, int64_t ld, bool trans, int64_t i, int64_t k) {
  return trans ? x[k * ld + i] : x[i * ld + k];
}

static void reference(const gemm_case *c, const float *A, const float *B, float alpha, float beta, const float *C0,
                      double *out, int64_t ldc) {
  const int64_t lda = c->ta ? c->M : c->K, ldb = c->tb ? c->K : c->N;
  for (int64_t i = 0; i < c->M; i++)
    for (int64_t j = 0; j < c->N; j++) {
      double s = 0.0;
      for (int64_t k = 0; k < c->K; k++) s += at(A, lda, c->ta, i, k) * at(B, ldb, c->tb, k, j);
      out[i * c->N + j] = alpha * s + beta * C0[i * ldc + j];
    }
}

// C has a leading dimension wider than N (ldc = N + 3), so strided output is covered too.
static void check_case(const gemm_case *c, float alpha, float beta, int threads) {
  const int64_t lda = c->ta ? c->M : c->K, ldb = c->tb ? c->K : c->N, ldc = c->N + 3;
  float *A = malloc(sizeof(float) * (size_t)(c->M * c->K)), *B = malloc(sizeof(float) * (size_t)(c->K * c->N));
  float *C = malloc(sizeof(float) * (size_t)(c->M * ldc)), *C0 = malloc(sizeof(float) * (size_t)(c->M * ldc));
  double *want = malloc(sizeof(double) * (size_t)(c->M * c->N));
  df_test_fill_uniform(A, c->M * c->K, 11, -1, 1);
  df_test_fill_uniform(B, c->K * c->N, 12, -1, 1);
  df_test_fill_uniform(C0, c->M * ldc, 13, -1, 1);
  memcpy(C, C0, sizeof(float) * (size_t)(c->M * ldc));
  reference(c, A, B, alpha, beta, C0, want, ldc);
  df_cpu_sgemm(threads, c->ta, c->tb, c->M, c->N, c->K, alpha, A, lda, B, ldb, beta, C, ldc);
  double worst = 0.0;
  bool pad_kept = true;
  for (int64_t i = 0; i < c->M; i++) {
    for (int64_t j = 0; j < c->N; j++) worst = fmax(worst, fabs(C[i * ldc + j] - want[i * c->N + j]));
    for (int64_t j = c->N; j < ldc; j++) pad_kept = pad_kept && C[i * ldc + j] == C0[i * ldc + j];
  }
  // Each term is a product of two values in [-1, 1): fp32 accumulation error stays below K · 2⁻²³ · K.
  const double tol = 2e-7 * (double)c->K * sqrt((double)c->K) + 1e-6;
  cr_expect(worst <= tol, "ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g threads=%d: max error %.3g > %.3g", c->ta,
            c->tb, (long long)c->M, (long long)c->N, (long long)c->K, alpha, beta, threads, worst, tol);
  cr_expect(pad_kept, "columns beyond N were written (ldc > N)");
  free(A), free(B), free(C), free(C0), free(want);
}

// Shapes around the blocking (64-wide m, 192-wide n, 512-deep k blocks; large outputs split into tasks).
static const gemm_case CASES[] = {
    {false, false, 7, 5, 3},       {false, true, 64, 64, 64},    {true, false, 65, 129, 513},
    {false, false, 200, 70, 1030}, {false, true, 391, 200, 700}, {true, false, 1000, 300, 100},
    {false, true, 3, 1000, 33},    {true, false, 700, 3, 1500},  {false, false, 1, 1, 1},
};

Test(gemm, reports_its_kernels) {
  const char *t = getenv("LIBXSMM_TARGET");
  if (t && !strcmp(t, "generic"))
    cr_expect(!df_cpu_sgemm_uses_xsmm(), "LIBXSMM_TARGET=generic must select the portable loop");
}

Test(gemm, every_transpose_and_beta_against_double) {
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++)
    for (int t = 1; t <= 2; t++) {
      check_case(&CASES[i], 1.0f, 0.0f, t);
      check_case(&CASES[i], 1.0f, 1.0f, t);
    }
}

// What libxsmm does not cover goes to OpenBLAS: other alpha / beta values and both operands transposed.
Test(gemm, fallback_cases_against_double) {
  const gemm_case tt = {true, true, 70, 90, 130}, nn = {false, false, 70, 90, 130};
  check_case(&tt, 1.0f, 0.0f, 2);
  check_case(&nn, 0.5f, 1.0f, 2);
  check_case(&nn, 1.0f, -2.0f, 2);
  check_case(&nn, 1.0f, 1.0f, 2);
}

// One multiply-add per k, in order (fused where the CPU has FMA): what every element must equal bit for bit.
static float chain(const float *A, int64_t lda, bool ta, const float *B, int64_t ldb, bool tb, int64_t i, int64_t j,
                   int64_t K, float c) {
  for (int64_t k = 0; k < K; k++) {
    const float a = (float)at(A, lda, ta, i, k), b = (float)at(B, ldb, tb, k, j);
#ifdef __FMA__
    c = fmaf(a, b, c);
#else
    c = c + a * b;
#endif
  }
  return c;
}

Test(gemm, every_element_is_the_canonical_chain) {
  // {37, 5, 700} and {3, 16, 40}: the direct path; {700, 512, 160} with A transposed: the transposed-A scratch
  const int64_t shapes[][3] = {{37, 5, 700}, {3, 16, 40}, {70, 17, 1100}, {200, 64, 9}, {9, 130, 513}, {700, 512, 160}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (int tr = 0; tr < 3; tr++) // A plain, A transposed, B transposed
      for (int beta = 0; beta < 2; beta++) {
        const bool ta = tr == 1, tb = tr == 2;
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = ta ? M : K, ldb = tb ? K : N;
        float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
        float *C = malloc(sizeof(float) * (size_t)(M * N)), *C0 = malloc(sizeof(float) * (size_t)(M * N));
        df_test_fill_uniform(A, M * K, 31, -1, 1);
        df_test_fill_uniform(B, K * N, 32, -1, 1);
        df_test_fill_uniform(C0, M * N, 33, -1, 1);
        memcpy(C, C0, sizeof(float) * (size_t)(M * N));
        df_cpu_sgemm(2, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, (float)beta, C, N);
        int64_t bad = 0;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            const float want = chain(A, lda, ta, B, ldb, tb, i, j, K, beta ? C0[i * N + j] : 0.0f);
            bad += memcmp(&want, &C[i * N + j], sizeof want) != 0;
          }
        cr_expect(bad == 0, "M=%lld N=%lld K=%lld ta=%d tb=%d beta=%d: %lld elements are not the canonical chain",
                  (long long)M, (long long)N, (long long)K, ta, tb, beta, (long long)bad);
        free(A), free(B), free(C), free(C0);
      }
}

// The property the fused LM-head ops rely on: an element's bits depend on nothing but its own row and column and
// K: not on the thread count, its position, or the other rows and columns of the call.
Test(gemm, rows_are_bitwise_independent_of_threads_and_splits) {
  enum { M = 300, N = 777, K = 1100 };
  float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
  float *C1 = malloc(sizeof(float) * M * N), *C2 = malloc(sizeof(float) * M * N);
  df_test_fill_uniform(A, M * K, 21, -1, 1);
  df_test_fill_uniform(B, K * N, 22, -1, 1);
  const bool tas[2] = {false, true};
  for (int v = 0; v < 2; v++) {
    const bool ta = tas[v];
    const int64_t lda = ta ? M : K;
    // One call on one thread, versus three threads and then calls of 1, 47 and the rest rows.
    df_cpu_sgemm(1, ta, false, M, N, K, 1.0f, A, lda, B, N, 0.0f, C1, N);
    df_cpu_sgemm(3, ta, false, M, N, K, 1.0f, A, lda, B, N, 0.0f, C2, N);
    cr_expect(!memcmp(C1, C2, sizeof(float) * M * N), "ta=%d: 1 and 3 threads differ", ta);
    const int64_t cuts[4] = {0, 1, 48, M};
    for (int c = 0; c < 3; c++) {
      const int64_t r0 = cuts[c], rows = cuts[c + 1] - r0;
      const float *a = ta ? A + r0 : A + r0 * K;
      df_cpu_sgemm(2, ta, false, rows, N, K, 1.0f, a, lda, B, N, 0.0f, C2 + r0 * N, N);
    }
    cr_expect(!memcmp(C1, C2, sizeof(float) * M * N), "ta=%d: rows split into calls differ", ta);
    const int64_t cols[4] = {0, 5, 300, N}; // and columns split into calls
    for (int c = 0; c < 3; c++)
      df_cpu_sgemm(2, ta, false, M, cols[c + 1] - cols[c], K, 1.0f, A, lda, B + cols[c], N, 0.0f, C2 + cols[c], N);
    cr_expect(!memcmp(C1, C2, sizeof(float) * M * N), "ta=%d: columns split into calls differ", ta);
  }
  free(A), free(B), free(C1), free(C2);
}
