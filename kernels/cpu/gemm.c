// Row-major GEMM on libxsmm micro-kernels. libxsmm is column-major, so C[M, N] row-major is the column-major
// C'(N × M) = X(N × K) · Y(K × M) with X from B and Y from A:
//   B plain:      X is B as stored (ld ldb), copied into a contiguous block when it is reused across n-blocks;
//   B transposed: X is packed (transposed) per block;
//   A plain:      Y is A as stored (ld lda);
//   A transposed: Y is A as stored, read through TRANS_B; long rows are packed per n-block (TLB).
// In these kernel coordinates m = N (the vectorised dimension), n = M, and C' is cut into blocks of MB × nb;
// K runs in KB blocks, the first one with the caller's beta, the later ones with beta 1. A call is split into
// tasks (rectangles of C') shared by the threads; inside a task the loop is k-block, then m-block, then
// n-block. Every element is the canonical chain (one multiply-add per k, in order, across the fixed k-blocks),
// whether a calibrated libxsmm kernel or the portable loop computes it: its bits depend on nothing but its own
// row, column and K.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <libxsmm.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
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
  int min_m;    // m-blocks at least this wide run libxsmm kernels, narrower ones the portable loop
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

// ---- which libxsmm kernels compute the canonical chain ------------------------------------------------------
// libxsmm's generated code is not always one FMA chain per element: with AVX-512, blocks at most one vector wide
// (m <= 16) split k over several accumulators for some n, so their bits depend on the block shape. Once per
// process the kernels are checked against canonical chains over a battery of shapes; blocks narrower than the
// smallest width that passes (and everything, when none does) run the portable loop instead. That keeps every
// element the canonical chain, whichever path computes it. The result is a property of this CPU and libxsmm.
static int g_min_m = MB + 1; // narrowest m that libxsmm may compute; MB + 1: none

// One step of the canonical chain: a fused multiply-add where the CPU has one (as libxsmm's kernels use), else a
// multiply and an add (as its kernels for such CPUs do).
static inline float chain_step(float a, float b, float c) {
#ifdef __FMA__
  return fmaf(a, b, c);
#else
  return c + a * b;
#endif
}
static pthread_once_t g_calibrated = PTHREAD_ONCE_INIT;

enum { CAL_K = 300, CAL_N = 32 }; // the battery's largest k and n

static bool kernel_is_canonical(int64_t m, int64_t n, int64_t k, float beta, int flags, float *A) {
  float *B = A + MB * CAL_K, *C = B + CAL_K * CAL_N, *R = C + MB * CAL_N, alpha = 1.0f;
  for (int64_t i = 0; i < m * k; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  for (int64_t i = 0; i < k * n; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
  for (int64_t i = 0; i < m * n; i++) C[i] = R[i] = (float)((i * 31) % 100) * 1e-2f;
  const libxsmm_blasint lda = m, ldb = flags ? n : k, ldc = m;
  const libxsmm_smmfunction f = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, NULL);
  if (!f) return false;
  f(A, B, C);
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      float c = beta == 0.0f ? 0.0f : R[i + j * m];
      for (int64_t q = 0; q < k; q++) c = chain_step(A[i + q * m], flags ? B[j + q * n] : B[q + j * k], c);
      if (memcmp(&c, &C[i + j * m], sizeof c)) return false;
    }
  return true;
}

static bool widths_are_canonical(int from, float *buf) {
  const int ms[] = {from, from + 1, from + 7, 16, 24, 40, MB};
  const int ns[] = {1, 3, 8, 29}, ks[] = {7, CAL_K};
  for (size_t a = 0; a < sizeof ms / sizeof *ms; a++) {
    if (ms[a] < from || ms[a] > MB) continue;
    for (size_t b = 0; b < sizeof ns / sizeof *ns; b++)
      for (size_t c = 0; c < sizeof ks / sizeof *ks; c++)
        for (int beta = 0; beta < 2; beta++)
          for (int tb = 0; tb < 2; tb++)
            if (!kernel_is_canonical(ms[a], ns[b], ks[c], (float)beta, tb ? LIBXSMM_GEMM_FLAG_TRANS_B : 0, buf))
              return false;
  }
  return true;
}

static void calibrate(void) {
  float *buf = malloc(sizeof(float) * (MB * CAL_K + CAL_K * CAL_N + 2 * MB * CAL_N));
  const int candidates[] = {1, 17, 33};
  for (size_t i = 0; buf && i < sizeof candidates / sizeof *candidates; i++)
    if (widths_are_canonical(candidates[i], buf)) {
      g_min_m = candidates[i];
      break;
    }
  free(buf); // without it, nothing runs on libxsmm: slower, never wrong
}

static int min_jit_m(void) {
  pthread_once(&g_calibrated, calibrate);
  return g_min_m;
}

// ---- one call ------------------------------------------------------------------------------------------------

// The kernel for one block shape; false when libxsmm has none.
static bool dispatch(xjob *jb, int first, int mr, int nr, int kr, float beta, int flags) {
  const int64_t mm = mr ? jb->m % MB : MB, nn = nr ? jb->nlast : jb->nb, kk = kr ? jb->k % KB : KB;
  libxsmm_blasint ldx = jb->pack ? mm : jb->ldb, ldy = jb->pack_y ? nn : jb->lda, ldc = jb->ldc;
  float alpha = 1.0f, b = first ? beta : 1.0f;
  jb->kern[first][mr][nr][kr] = libxsmm_smmdispatch(mm, nn, kk, &ldx, &ldy, &ldc, &alpha, &b, &flags, NULL);
  return jb->kern[first][mr][nr][kr] != NULL;
}

// Every block shape the call meets that is wide enough for libxsmm: full and remainder blocks in m and n; in k the
// first block (full unless K < KB) with the caller's beta, later full blocks and a last remainder with beta 1.
static bool dispatch_all(xjob *jb, float beta, int flags) {
  const bool m_shape[2] = {jb->m >= MB && MB >= jb->min_m, jb->m % MB >= jb->min_m},
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

// The portable block: C'(mm × nn) = X · Y (+ C' unless first with beta 0), one canonical chain per element over k
// in order, as a libxsmm kernel that passed calibration computes it; vectorised across the m (contiguous) dimension.
static void portable_block(const xjob *jb, int64_t mm, int64_t nn, int64_t kk, const float *x, int64_t ldx,
                           const float *y, int64_t ldy, float *c, bool zero) {
  for (int64_t i = 0; i < nn; i++) {
    float *ci = c + i * jb->ldc;
    if (zero)
      for (int64_t j = 0; j < mm; j++) ci[j] = 0.0f;
    for (int64_t k = 0; k < kk; k++) {
      const float yk = jb->trans_y ? y[k * ldy + i] : y[i * ldy + k];
      const float *xk = x + k * ldx;
      for (int64_t j = 0; j < mm; j++) ci[j] = chain_step(xk[j], yk, ci[j]);
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
        if (mm >= jb->min_m)
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
  jb->min_m = min_jit_m();
  if (!dispatch_all(jb, beta, jb->trans_y ? LIBXSMM_GEMM_FLAG_TRANS_B : 0)) jb->min_m = MB + 1;
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

// A call whose every block would run the portable loop on one thread anyway (C' narrower than the narrowest
// calibrated kernel, too small to split): no kernel dispatch, task plan or parallel region. Attention's per-tile
// products at small head sizes are such calls, tens of thousands per step, where that set-up cost more than the
// arithmetic. C' is computed DW columns (one vector) by up to four rows at a time, the four in registers so that
// four chains are in flight; X comes straight from B when a full DW run is contiguous, else from a zero-padded
// pack per k-block. Each element is still one chain over k in order, from 0 (beta 0) or from C, so the bits are
// the portable loop's.
enum { DW = 16 };

typedef struct {
  const float *x; // X(j, k) of the DW columns at x[k·xs + j]
  int64_t xs;
  const float *y; // Y(k, i) of the first row at y[k·ys], row i + r at + r·yr
  int64_t ys, yr;
  int64_t kk;
} direct_span;

static void direct_rows4(const direct_span *d, float acc[4][DW]) {
  float a0[DW], a1[DW], a2[DW], a3[DW];
  memcpy(a0, acc[0], sizeof a0), memcpy(a1, acc[1], sizeof a1), memcpy(a2, acc[2], sizeof a2);
  memcpy(a3, acc[3], sizeof a3);
  const float *y = d->y;
  const int64_t yr = d->yr;
  for (int64_t k = 0; k < d->kk; k++, y += d->ys) {
    const float *xk = d->x + k * d->xs, y0 = y[0], y1 = y[yr], y2 = y[2 * yr], y3 = y[3 * yr];
    for (int j = 0; j < DW; j++) {
      a0[j] = chain_step(xk[j], y0, a0[j]), a1[j] = chain_step(xk[j], y1, a1[j]);
      a2[j] = chain_step(xk[j], y2, a2[j]), a3[j] = chain_step(xk[j], y3, a3[j]);
    }
  }
  memcpy(acc[0], a0, sizeof a0), memcpy(acc[1], a1, sizeof a1), memcpy(acc[2], a2, sizeof a2);
  memcpy(acc[3], a3, sizeof a3);
}

static void direct_row(const direct_span *d, float acc[DW]) {
  float a[DW];
  memcpy(a, acc, sizeof a);
  const float *y = d->y;
  for (int64_t k = 0; k < d->kk; k++, y += d->ys) {
    const float *xk = d->x + k * d->xs, yk = y[0];
    for (int j = 0; j < DW; j++) a[j] = chain_step(xk[j], yk, a[j]);
  }
  memcpy(acc, a, sizeof a);
}

// A row of C' into a DW-wide accumulator and back (full rows as one fixed-size copy; short ones masked).
static void load_acc(float acc[DW], const float *c, int64_t mm, bool zero) {
  if (zero) {
    memset(acc, 0, sizeof(float) * DW);
  } else if (mm == DW) {
    memcpy(acc, c, sizeof(float) * DW);
  } else {
    for (int j = 0; j < DW; j++) acc[j] = j < mm ? c[j] : 0.0f;
  }
}

static void store_acc(float *c, const float acc[DW], int64_t mm) {
  if (mm == DW) {
    memcpy(c, acc, sizeof(float) * DW);
  } else {
    for (int j = 0; j < DW; j++)
      if (j < mm) c[j] = acc[j];
  }
}

static void run_direct(const xjob *jb, float beta) {
  float xp[KB * DW] __attribute__((aligned(64)));
  const int64_t ys = jb->trans_y ? jb->lda : 1, yr = jb->trans_y ? 1 : jb->lda;
  for (int64_t j0 = 0; j0 < jb->m; j0 += DW) {
    const int64_t mm = min64(DW, jb->m - j0);
    for (int64_t k0 = 0; k0 < jb->k; k0 += KB) {
      direct_span d = {.x = jb->B + k0 * jb->ldb + j0, .xs = jb->ldb, .ys = ys, .yr = yr};
      d.kk = min64(KB, jb->k - k0);
      if (jb->trans_x || mm < DW) { // pack X(j0.., k0..): B[j·ldb + k] (B transposed) or B[k·ldb + j]
        memset(xp, 0, sizeof(float) * (size_t)(d.kk * DW));
        for (int64_t j = 0; j < mm; j++)
          for (int64_t k = 0; k < d.kk; k++)
            xp[k * DW + j] = jb->trans_x ? jb->B[(j0 + j) * jb->ldb + k0 + k] : jb->B[(k0 + k) * jb->ldb + j0 + j];
        d.x = xp, d.xs = DW;
      }
      const bool zero = k0 == 0 && beta == 0.0f;
      for (int64_t i0 = 0; i0 < jb->n; i0 += 4) {
        const int rows = (int)min64(4, jb->n - i0);
        float acc[4][DW];
        for (int r = 0; r < rows; r++) load_acc(acc[r], jb->C + (i0 + r) * jb->ldc + j0, mm, zero);
        d.y = jb->A + (jb->trans_y ? k0 * jb->lda + i0 : i0 * jb->lda + k0);
        if (rows == 4) {
          direct_rows4(&d, acc);
        } else {
          for (int r = 0; r < rows; r++) {
            direct_span dr = d;
            dr.y += r * yr;
            direct_row(&dr, acc[r]);
          }
        }
        for (int r = 0; r < rows; r++) store_acc(jb->C + (i0 + r) * jb->ldc + j0, acc[r], mm);
      }
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

// ---- A transposed with long rows ----------------------------------------------------------------------------
// dW = dYᵀ · X of a wide layer reads A = dY [K, M] transposed: each kernel's Y block is nn floats from each of kk
// rows a whole row (M floats) apart, so even the packed-Y path spends its time on TLB misses and copies (98 GF/s at
// M 3072, K 1024 against 227 for the plain layout). Such a call, made outside a parallel region, first transposes
// A into a scratch of M × K and runs the plain layout on it: the same products in the same k order, so the same
// chains and bits. The scratch is one process-wide buffer, grown and kept; a call that finds it taken (another
// thread's GEMM, e.g. the online target's) keeps the packed-Y path, and so does a narrow C (N < 512), where the
// transpose of a long A costs more than it saves (M 1024, N 256, K 12288: 206 GF/s packed, 119 transposed).
enum { TRANSPOSE_MIN_M = 512, TRANSPOSE_MIN_N = 512 }; // N: each transposed element is used N times
#define TRANSPOSE_MIN_FLOPS 5e7
static pthread_mutex_t g_at_mu = PTHREAD_MUTEX_INITIALIZER;
static float *g_at;
static size_t g_at_cap;

static bool transpose_a(int threads, int64_t M, int64_t K, const float *A, int64_t lda) {
  const size_t need = (size_t)M * (size_t)K;
  if (need > g_at_cap) {
    float *p = realloc(g_at, sizeof(float) * need);
    if (!p) return false;
    g_at = p, g_at_cap = need;
  }
  float *at = g_at;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t it = 0; it < M; it += 16) // 16 × 16 tiles: reads and writes stay within a few cache lines
    for (int64_t kt = 0; kt < K; kt += 16) {
      const int64_t ie = min64(it + 16, M), ke = min64(kt + 16, K);
      for (int64_t k = kt; k < ke; k++)
        for (int64_t i = it; i < ie; i++) at[i * K + k] = A[k * lda + i];
    }
  return true;
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
  if (threads == 1 && N < min_jit_m()) {
    run_direct(&jb, beta);
    return;
  }
  const bool wide_ta = trans_a && M >= TRANSPOSE_MIN_M && N >= TRANSPOSE_MIN_N && lda >= LD_PACK_Y && threads > 1 &&
                       2.0 * (double)M * (double)N * (double)K >= TRANSPOSE_MIN_FLOPS;
#ifdef _OPENMP
  const bool outside = !omp_in_parallel();
#else
  const bool outside = true;
#endif
  if (wide_ta && outside && pthread_mutex_trylock(&g_at_mu) == 0) {
    if (transpose_a(threads, M, K, A, lda)) {
      jb.trans_y = false, jb.A = g_at, jb.lda = K;
      run_blocked(&jb, threads, beta);
      pthread_mutex_unlock(&g_at_mu);
      return;
    }
    pthread_mutex_unlock(&g_at_mu);
  }
  run_blocked(&jb, threads, beta);
}

bool df_cpu_sgemm_uses_xsmm(void) { return min_jit_m() <= MB; }

const char *df_cpu_sgemm_describe(void) {
  static char line[160];
  const int m = min_jit_m();
  const char *arch = libxsmm_get_target_arch();
  if (m > MB)
    snprintf(line, sizeof line, "portable loop (libxsmm target %s: no canonical kernels)", arch ? arch : "?");
  else if (m > 1)
    snprintf(line, sizeof line, "libxsmm %s JIT kernels, blocks narrower than %d on the portable loop",
             arch ? arch : "?", m);
  else
    snprintf(line, sizeof line, "libxsmm %s JIT kernels", arch ? arch : "?");
  return line;
}
