// Row-major GEMM on libxsmm micro-kernels. libxsmm is column-major, so C[M, N] row-major is the column-major
// C'(N × M) = X(N × K) · Y(K × M) with X from B and Y from A:
//   B plain:      X is B as stored (ld ldb);  B transposed: X is packed per block (ld = block width)
//   A plain:      Y is A as stored (ld lda);  A transposed: Y is A as stored, read through TRANS_B
// In these kernel coordinates m = N (the vectorised dimension), n = M, and C' is cut into blocks of MB × NB;
// K runs in KB blocks, the first one with the caller's beta, the later ones with beta 1. A call is split into
// tasks (rectangles of C') shared by the threads; inside a task the loop is k-block, then m-block, then
// n-block, so a Y block is reused across the task's m-blocks and an X block across its n-blocks.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <libxsmm.h>
#include <math.h>
#include <stddef.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum {
  MB = 64,          // C' rows per kernel (four 16-float vectors)
  NB = 192,         // C' columns per kernel
  KB = 512,         // K per kernel: fixed, it decides the rounding
  TASK_N = 384,     // C' columns per task when C' is large
  SMALL_C = 1 << 17 // C' elements up to which a call is one task per thread (C' stays in cache across k)
};
#define MIN_PARALLEL_FLOPS 4e6 // below this a call runs on the calling thread

typedef struct {
  bool pack;    // X is B transposed: packed per (m-block, k-block)
  bool trans_y; // Y is A transposed (read through TRANS_B)
  bool jit;     // libxsmm kernels; else the portable loop (same blocking, same per-element FMA chains)
  int64_t m, n, k;
  const float *A, *B;
  int64_t lda, ldb, ldc;
  float *C;
  // [first k-block][m remainder][n remainder][k remainder]; NULL where no such block exists
  libxsmm_smmfunction kern[2][2][2][2];
} xjob;

typedef struct {
  int64_t m0, m1, n0, n1;
} xtask;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The kernel for one block shape; false when libxsmm has none.
static bool dispatch(xjob *jb, int first, int mr, int nr, int kr, float beta, int flags) {
  const int64_t mm = mr ? jb->m % MB : MB, nn = nr ? jb->n % NB : NB, kk = kr ? jb->k % KB : KB;
  libxsmm_blasint ldx = jb->pack ? mm : jb->ldb, ldy = jb->lda, ldc = jb->ldc;
  float alpha = 1.0f, b = first ? beta : 1.0f;
  jb->kern[first][mr][nr][kr] = libxsmm_smmdispatch(mm, nn, kk, &ldx, &ldy, &ldc, &alpha, &b, &flags, NULL);
  return jb->kern[first][mr][nr][kr] != NULL;
}

// Every block shape the call meets: full and remainder blocks in m and n; in k the first block (full unless
// K < KB) with the caller's beta, later full blocks and a last remainder with beta 1.
static bool dispatch_all(xjob *jb, float beta, int flags) {
  const bool m_shape[2] = {jb->m >= MB, jb->m % MB != 0}, n_shape[2] = {jb->n >= NB, jb->n % NB != 0};
  const bool k_shape[2][2] = {{jb->k >= 2 * KB, jb->k > KB && jb->k % KB != 0}, {jb->k >= KB, jb->k < KB}};
  bool ok = true;
  for (int f = 0; f < 2; f++)
    for (int kr = 0; kr < 2; kr++)
      for (int mr = 0; mr < 2; mr++)
        for (int nr = 0; nr < 2; nr++)
          if (k_shape[f][kr] && m_shape[mr] && n_shape[nr]) ok = ok && dispatch(jb, f, mr, nr, kr, beta, flags);
  return ok;
}

// X(j, k) = B[j·ldb + k] for the block's mm × kk entries, column-major with ld mm.
static void pack_x(const xjob *jb, int64_t j0, int64_t mm, int64_t k0, int64_t kk, float *dst) {
  for (int64_t j = 0; j < mm; j++) {
    const float *src = jb->B + (j0 + j) * jb->ldb + k0;
    for (int64_t k = 0; k < kk; k++) dst[k * mm + j] = src[k];
  }
}

// The portable block: C'(mm × nn) = X · Y (+ C' unless first with beta 0), one fmaf chain per element over k in
// order, like a libxsmm kernel; vectorised across the m (contiguous) dimension.
static void portable_block(const xjob *jb, int64_t mm, int64_t nn, int64_t kk, const float *x, int64_t ldx,
                           const float *y, float *c, bool zero) {
  for (int64_t i = 0; i < nn; i++) {
    float *ci = c + i * jb->ldc;
    if (zero)
      for (int64_t j = 0; j < mm; j++) ci[j] = 0.0f;
    for (int64_t k = 0; k < kk; k++) {
      const float yk = jb->trans_y ? y[k * jb->lda + i] : y[i * jb->lda + k];
      const float *xk = x + k * ldx;
      for (int64_t j = 0; j < mm; j++) ci[j] = fmaf(xk[j], yk, ci[j]);
    }
  }
}

static void run_task(const xjob *jb, const xtask *t, float beta, float *pack) {
  for (int64_t k0 = 0; k0 < jb->k; k0 += KB) {
    const int64_t kk = min64(KB, jb->k - k0);
    const int first = k0 == 0, kr = kk < KB;
    for (int64_t j0 = t->m0; j0 < t->m1; j0 += MB) {
      const int64_t mm = min64(MB, t->m1 - j0);
      const int mr = mm < MB;
      const float *x = jb->B + k0 * jb->ldb + j0;
      int64_t ldx = jb->ldb;
      if (jb->pack) pack_x(jb, j0, mm, k0, kk, pack), x = pack, ldx = mm;
      for (int64_t i0 = t->n0; i0 < t->n1; i0 += NB) {
        const int64_t nn = min64(NB, t->n1 - i0);
        const float *y = jb->trans_y ? jb->A + k0 * jb->lda + i0 : jb->A + i0 * jb->lda + k0;
        float *c = jb->C + i0 * jb->ldc + j0;
        if (jb->jit)
          jb->kern[first][mr][nn < NB][kr](x, y, c);
        else
          portable_block(jb, mm, nn, kk, x, ldx, y, c, first && beta == 0.0f);
      }
    }
  }
}

// Task t of ntasks: with a small C', the threads split it along its longer side (whole blocks); otherwise
// MB × TASK_N rectangles, n-major so that consecutive tasks of a thread share their Y rows.
static xtask task_at(const xjob *jb, int64_t t, int64_t per_m, int64_t tn, int64_t tm) {
  const int64_t tn_i = t / per_m, tm_i = t % per_m;
  xtask x = {.m0 = tm_i * tm, .n0 = tn_i * tn};
  x.m1 = min64(x.m0 + tm, jb->m), x.n1 = min64(x.n0 + tn, jb->n);
  return x;
}

static void plan_tasks(const xjob *jb, int threads, int64_t *tm, int64_t *tn) {
  if (jb->m * jb->n > SMALL_C) {
    *tm = MB, *tn = TASK_N;
    return;
  }
  *tm = jb->m, *tn = jb->n;
  if (threads <= 1) return;
  if (jb->m >= jb->n) { // split m into whole MB blocks
    const int64_t blocks = (jb->m + MB - 1) / MB, per = (blocks + threads - 1) / threads;
    *tm = per * MB;
  } else {
    const int64_t blocks = (jb->n + NB - 1) / NB, per = (blocks + threads - 1) / threads;
    *tn = per * NB;
  }
}

static void run_blocked(xjob *jb, int threads, float beta) {
  int64_t tm, tn;
  plan_tasks(jb, threads, &tm, &tn);
  const int64_t per_m = (jb->m + tm - 1) / tm, per_n = (jb->n + tn - 1) / tn, ntasks = per_m * per_n;
  if (ntasks < threads) threads = (int)ntasks;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float pack[MB * KB] __attribute__((aligned(64))); // B-transposed blocks (unused otherwise)
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntasks; t++) {
      const xtask x = task_at(jb, t, per_m, tn, tm);
      run_task(jb, &x, beta, pack);
    }
  }
}

static void run_blas(int threads, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  (void)threads; // OpenBLAS (OpenMP build) takes the team size from the OpenMP ICV and stays single-threaded
                 // inside a parallel region
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N,
              (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void df_cpu_sgemm(int threads, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  const bool blocked = alpha == 1.0f && (beta == 0.0f || beta == 1.0f) && !(trans_a && trans_b) && K > 0;
  if (!blocked) {
    run_blas(threads, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  xjob jb = {.pack = trans_b,
             .trans_y = trans_a,
             .m = N,
             .n = M,
             .k = K,
             .A = A,
             .B = B,
             .lda = lda,
             .ldb = ldb,
             .ldc = ldc,
             .C = C};
  jb.jit = dispatch_all(&jb, beta, trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
  if (2.0 * (double)M * (double)N * (double)K < MIN_PARALLEL_FLOPS) threads = 1;
  run_blocked(&jb, threads, beta);
}

bool df_cpu_sgemm_uses_xsmm(void) {
  float alpha = 1.0f, beta = 0.0f;
  return libxsmm_smmdispatch(MB, NB, KB, NULL, NULL, NULL, &alpha, &beta, NULL, NULL) != NULL;
}
