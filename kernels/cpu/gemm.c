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
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum {
  MB = 64,          // C' rows per kernel (four 16-float vectors)
  NB = 192,         // C' columns per kernel at most (a call evens its blocks out below this)
  NB_PACKED_Y = 96, // ... when Y blocks are packed (their buffer is on the stack)
  LD_PACK_Y = 512,  // a transposed A with rows this long (2 KiB) or longer is packed
  KB = 512,         // K per kernel: fixed, it decides the rounding
  SMALL_C = 1 << 17 // C' elements up to which a call is one task per thread (C' stays in cache across k)
};
#define MIN_PARALLEL_FLOPS 4e6 // below this a call runs on the calling thread

typedef struct {
  bool trans_x; // X is B transposed: always packed
  bool pack;    // X packed per (m-block, k-block) into a contiguous block (B transposed, or reused across n-blocks:
                // a strided X block spans hundreds of 4 KiB pages, a packed one a few dozen)
  bool trans_y; // Y is A transposed (read through TRANS_B)
  bool pack_y;  // ... and packed per (n-block, k-block): a task is then one n-block across all of m
  bool jit;     // libxsmm kernels; else the portable loop (same blocking, same per-element FMA chains)
  int64_t m, n, k;
  int64_t nb, nlast; // C' columns per block, and in the last block
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
  const int64_t mm = mr ? jb->m % MB : MB, nn = nr ? jb->nlast : jb->nb, kk = kr ? jb->k % KB : KB;
  libxsmm_blasint ldx = jb->pack ? mm : jb->ldb, ldy = jb->pack_y ? nn : jb->lda, ldc = jb->ldc;
  float alpha = 1.0f, b = first ? beta : 1.0f;
  jb->kern[first][mr][nr][kr] = libxsmm_smmdispatch(mm, nn, kk, &ldx, &ldy, &ldc, &alpha, &b, &flags, NULL);
  return jb->kern[first][mr][nr][kr] != NULL;
}

// Every block shape the call meets: full and remainder blocks in m and n; in k the first block (full unless
// K < KB) with the caller's beta, later full blocks and a last remainder with beta 1.
static bool dispatch_all(xjob *jb, float beta, int flags) {
  const bool m_shape[2] = {jb->m >= MB, jb->m % MB != 0},
             n_shape[2] = {jb->n > jb->nlast || jb->nlast == jb->nb, jb->nlast != jb->nb};
  const bool k_shape[2][2] = {{jb->k >= 2 * KB, jb->k > KB && jb->k % KB != 0}, {jb->k >= KB, jb->k < KB}};
  bool ok = true;
  for (int f = 0; f < 2; f++)
    for (int kr = 0; kr < 2; kr++)
      for (int mr = 0; mr < 2; mr++)
        for (int nr = 0; nr < 2; nr++)
          if (k_shape[f][kr] && m_shape[mr] && n_shape[nr]) ok = ok && dispatch(jb, f, mr, nr, kr, beta, flags);
  return ok;
}

// The X block (mm × kk, column-major with ld mm) of B; transposed in 16 × 16 tiles, so both the reads and the
// writes stay within a few cache lines.
static void pack_x(const xjob *jb, int64_t j0, int64_t mm, int64_t k0, int64_t kk, float *dst) {
  if (!jb->trans_x) { // X(j, k) = B[k·ldb + j]: row by row
    for (int64_t k = 0; k < kk; k++) memcpy(dst + k * mm, jb->B + (k0 + k) * jb->ldb + j0, sizeof(float) * (size_t)mm);
    return;
  }
  for (int64_t jt = 0; jt < mm; jt += 16)
    for (int64_t kt = 0; kt < kk; kt += 16) {
      const int64_t je = min64(jt + 16, mm), ke = min64(kt + 16, kk);
      for (int64_t j = jt; j < je; j++) {
        const float *src = jb->B + (j0 + j) * jb->ldb + k0;
        for (int64_t k = kt; k < ke; k++) dst[k * mm + j] = src[k];
      }
    }
}

// The Yᵀ block (nn × kk, rows of A, ld nn) of a transposed A.
static void pack_y(const xjob *jb, int64_t i0, int64_t nn, int64_t k0, int64_t kk, float *dst) {
  for (int64_t k = 0; k < kk; k++) memcpy(dst + k * nn, jb->A + (k0 + k) * jb->lda + i0, sizeof(float) * (size_t)nn);
}

// The portable block: C'(mm × nn) = X · Y (+ C' unless first with beta 0), one fmaf chain per element over k in
// order, like a libxsmm kernel; vectorised across the m (contiguous) dimension.
static void portable_block(const xjob *jb, int64_t mm, int64_t nn, int64_t kk, const float *x, int64_t ldx,
                           const float *y, int64_t ldy, float *c, bool zero) {
  for (int64_t i = 0; i < nn; i++) {
    float *ci = c + i * jb->ldc;
    if (zero)
      for (int64_t j = 0; j < mm; j++) ci[j] = 0.0f;
    for (int64_t k = 0; k < kk; k++) {
      const float yk = jb->trans_y ? y[k * ldy + i] : y[i * ldy + k];
      const float *xk = x + k * ldx;
      for (int64_t j = 0; j < mm; j++) ci[j] = fmaf(xk[j], yk, ci[j]);
    }
  }
}

static void run_task(const xjob *jb, const xtask *t, float beta, float *pack, float *ypack) {
  for (int64_t k0 = 0; k0 < jb->k; k0 += KB) {
    const int64_t kk = min64(KB, jb->k - k0);
    const int first = k0 == 0, kr = kk < KB;
    if (jb->pack_y) pack_y(jb, t->n0, t->n1 - t->n0, k0, kk, ypack); // the task's one n-block
    for (int64_t j0 = t->m0; j0 < t->m1; j0 += MB) {
      const int64_t mm = min64(MB, t->m1 - j0);
      const int mr = mm < MB;
      const float *x = jb->B + k0 * jb->ldb + j0;
      int64_t ldx = jb->ldb;
      if (jb->pack) pack_x(jb, j0, mm, k0, kk, pack), x = pack, ldx = mm;
      for (int64_t i0 = t->n0; i0 < t->n1; i0 += jb->nb) {
        const int64_t nn = min64(jb->nb, t->n1 - i0);
        const float *y = jb->trans_y ? jb->A + k0 * jb->lda + i0 : jb->A + i0 * jb->lda + k0;
        int64_t ldy = jb->lda;
        if (jb->pack_y) y = ypack, ldy = nn;
        float *c = jb->C + i0 * jb->ldc + j0;
        if (jb->jit)
          jb->kern[first][mr][nn != jb->nb][kr](x, y, c);
        else
          portable_block(jb, mm, nn, kk, x, ldx, y, ldy, c, first && beta == 0.0f);
      }
    }
  }
}

// Task t: rectangles of C', n-major so that consecutive tasks of a thread share their Y rows.
static xtask task_at(const xjob *jb, int64_t t, int64_t per_m, int64_t tn, int64_t tm) {
  const int64_t tn_i = t / per_m, tm_i = t % per_m;
  xtask x = {.m0 = tm_i * tm, .n0 = tn_i * tn};
  x.m1 = min64(x.m0 + tm, jb->m), x.n1 = min64(x.n0 + tn, jb->n);
  return x;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// n-blocks of even width (nblk of them, at most NB wide); task sizes tm × tn. With packed Y blocks a task is one
// n-block (at most NB_PACKED_Y wide) across all of m. Otherwise a large C' is cut into single
// m-blocks across all of n (a packed X block is then made once), or, with few m-blocks, by two n-blocks; a
// small one is one task per thread, split along its longer side.
static void plan_tasks(xjob *jb, int threads, int64_t *tm, int64_t *tn) {
  if (jb->pack_y) {
    jb->nb = ceil_div(jb->n, ceil_div(jb->n, NB_PACKED_Y));
    jb->nlast = jb->n - (ceil_div(jb->n, jb->nb) - 1) * jb->nb;
    *tm = jb->m, *tn = jb->nb;
    return;
  }
  int64_t nblk = ceil_div(jb->n, NB);
  const bool big = jb->m * jb->n > SMALL_C, split_n = !big && threads > 1 && jb->n > jb->m;
  if (split_n) nblk = ceil_div(nblk, threads) * threads;
  jb->nb = ceil_div(jb->n, nblk);
  nblk = ceil_div(jb->n, jb->nb);
  jb->nlast = jb->n - (nblk - 1) * jb->nb;
  *tm = jb->m, *tn = jb->n;
  if (big)
    *tm = MB, *tn = ceil_div(jb->m, MB) >= 4 * threads ? jb->n : 2 * jb->nb;
  else if (split_n)
    *tn = jb->nb * ceil_div(nblk, threads);
  else if (threads > 1)
    *tm = MB * ceil_div(ceil_div(jb->m, MB), threads);
}

static void run_blocked(xjob *jb, int threads, float beta) {
  int64_t tm, tn;
  jb->pack_y = jb->trans_y && jb->lda >= LD_PACK_Y && jb->k > 1;
  plan_tasks(jb, threads, &tm, &tn);
  jb->pack = jb->trans_x || (tn > jb->nb && jb->ldb != min64(MB, jb->m));
  jb->jit = dispatch_all(jb, beta, jb->trans_y ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
  const int64_t per_m = (jb->m + tm - 1) / tm, per_n = (jb->n + tn - 1) / tn, ntasks = per_m * per_n;
  if (ntasks < threads) threads = (int)ntasks;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    float pack[MB * KB] __attribute__((aligned(64)));           // X blocks, when packed
    float ypack[NB_PACKED_Y * KB] __attribute__((aligned(64))); // Y blocks, when packed
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntasks; t++) {
      const xtask x = task_at(jb, t, per_m, tn, tm);
      run_task(jb, &x, beta, pack, ypack);
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
  xjob jb = {.trans_x = trans_b,
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
  if (2.0 * (double)M * (double)N * (double)K < MIN_PARALLEL_FLOPS) threads = 1;
  run_blocked(&jb, threads, beta);
}

bool df_cpu_sgemm_uses_xsmm(void) {
  float alpha = 1.0f, beta = 0.0f;
  return libxsmm_smmdispatch(MB, NB, KB, NULL, NULL, NULL, &alpha, &beta, NULL, NULL) != NULL;
}
