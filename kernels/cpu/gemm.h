// The CPU kernels' fp32 GEMM: libxsmm's JIT micro-kernels (the widest vector ISA libxsmm finds on this CPU),
// blocked here, and a portable loop for what libxsmm does not compute as one multiply-add chain per element
// (checked once per process; with AVX-512, blocks at most 16 wide) or not at all (LIBXSMM_TARGET=generic: then
// everything, much slower). Every output element is that chain over fixed 512-wide K blocks, so its bits depend
// on K alone: not on the thread count, nor on how rows or columns are split between calls. alpha ≠ 1,
// beta ∉ {0, 1} and both operands transposed go to OpenBLAS (no such guarantee).
#ifndef DF_KERNELS_CPU_GEMM_H
#define DF_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

// Row-major C[M, N] = alpha · op(A) · op(B) + beta · C with op(A) [M, K], op(B) [K, N] (as cblas_sgemm).
// threads > 1 lets a large call open its own OpenMP team; inside a parallel region pass 1 (the call then
// runs on the calling thread).
void df_cpu_sgemm(int threads, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

// Whether df_cpu_sgemm runs on libxsmm's kernels here (false: the portable loop). For benches and tests.
bool df_cpu_sgemm_uses_xsmm(void);

// One line naming what computes the GEMM here: libxsmm's target (LIBXSMM_TARGET or the CPU's widest ISA) and the
// narrowest block width it takes, or the portable loop. For benches.
const char *df_cpu_sgemm_describe(void);

#endif
