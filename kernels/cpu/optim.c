// CPU optimizer ops: AdamW over flat fp32 buffers, a deterministic global L2 norm, clip by norm.
// Elementwise loops are `omp parallel for simd`; this file is built with -fno-math-errno (CMakeLists.txt)
// because GCC will not vectorize sqrtf while it may have to set errno.
#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"

// Below this many elements a parallel region costs more than it saves.
enum { OPTIM_PAR_MIN = 1 << 15 };

// Per-step scalars, rounded to fp32 where torch's CPU kernels round them (scalar operands become
// the tensor dtype), so our arithmetic follows torch's operation by operation.
typedef struct {
  float decay;              // 1 − lr·wd
  float beta1, a1;          // β1, 1 − β1
  float beta2, a2;          // β2, 1 − β2
  float bc2_sqrt;           // √(1 − β2^t)
  float eps, neg_step_size; // ε, −lr / (1 − β1^t)
} adamw_coefs;

static adamw_coefs adamw_coefs_of(const df_adamw_hparams *hp) {
  double t = (double)hp->step;
  double bc1 = 1.0 - pow((double)hp->beta1, t), bc2 = 1.0 - pow((double)hp->beta2, t);
  return (adamw_coefs){
      .decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay),
      .beta1 = hp->beta1,
      .a1 = (float)(1.0 - (double)hp->beta1),
      .beta2 = hp->beta2,
      .a2 = (float)(1.0 - (double)hp->beta2),
      .bc2_sqrt = (float)sqrt(bc2),
      .eps = hp->eps,
      .neg_step_size = (float)(-(double)hp->lr / bc1),
  };
}

df_status df_cpu_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                            const df_adamw_hparams *hp, df_error *err) {
  (void)err;
  const adamw_coefs c = adamw_coefs_of(hp);
  const int64_t n = df_numel(param);
  float *restrict pd = param->data, *restrict md = m->data, *restrict vd = v->data;
  const float *restrict gd = grad->data;
  // torch's _single_tensor_adamw in its operation order: mul_/add_, mul_/addcmul_, sqrt/div/add_, addcdiv_.
#pragma omp parallel for simd schedule(static) num_threads(ctx->num_threads) if (n > OPTIM_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float g = gd[i];
    float mi = md[i] * c.beta1 + c.a1 * g;
    float vi = vd[i] * c.beta2 + c.a2 * g * g;
    float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    md[i] = mi;
    vd[i] = vi;
    pd[i] = pd[i] * c.decay + c.neg_step_size * mi / denom;
  }
  return DF_OK;
}

// The norm's summation order is fixed by these blocks, not by the thread count: each block is summed
// in NORM_LANES interleaved double accumulators, then the block sums are added in buffer order.
enum { NORM_BLOCK = 1 << 14, NORM_LANES = 16 };

static int64_t norm_blocks(int64_t n) { return (n + NORM_BLOCK - 1) / NORM_BLOCK; }

// Σ x² of one block in double (each x² is exact in double; only the additions round).
static double block_sumsq(const float *x, int64_t n) {
  double acc[NORM_LANES] = {0};
  int64_t i = 0;
  for (; i + NORM_LANES <= n; i += NORM_LANES)
    for (int j = 0; j < NORM_LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
  for (int j = 0; i < n; i++, j++) acc[j] += (double)x[i] * (double)x[i];
  double s = 0.0;
  for (int j = 0; j < NORM_LANES; j++) s += acc[j];
  return s;
}

df_status df_cpu_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err) {
  int64_t total_blocks = 0, total = 0;
  for (int b = 0; b < nbufs; b++) total_blocks += norm_blocks(df_numel(&bufs[b])), total += df_numel(&bufs[b]);
  double *partial;
  DF_TRY(
      df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)(total_blocks > 0 ? total_blocks : 1), (void **)&partial, err));
  if (df_ctx_measure_only(ctx)) return *norm = 0.0, DF_OK; // measure path: the workspace, and the norm of zeros
#pragma omp parallel num_threads(ctx->num_threads) if (total > OPTIM_PAR_MIN)
  {
    int64_t first = 0; // index of buffer b's first block in `partial`
    for (int b = 0; b < nbufs; b++) {
      const float *x = bufs[b].data;
      const int64_t n = df_numel(&bufs[b]), nb = norm_blocks(n);
#pragma omp for schedule(static) nowait
      for (int64_t k = 0; k < nb; k++) {
        int64_t lo = k * NORM_BLOCK, len = n - lo < NORM_BLOCK ? n - lo : NORM_BLOCK;
        partial[first + k] = block_sumsq(x + lo, len);
      }
      first += nb;
    }
  }
  double s = 0.0;
  for (int64_t k = 0; k < total_blocks; k++) s += partial[k];
  *norm = sqrt(s);
  return DF_OK;
}

df_status df_cpu_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                              df_error *err) {
  (void)err;
  double c = max_norm / (norm + 1e-6);
  *coef = c < 1.0 ? c : 1.0;
  if (c >= 1.0) return DF_OK;
  const float cf = (float)c;
  int64_t total = 0;
  for (int b = 0; b < nbufs; b++) total += df_numel(&bufs[b]);
#pragma omp parallel num_threads(ctx->num_threads) if (total > OPTIM_PAR_MIN)
  for (int b = 0; b < nbufs; b++) {
    float *x = bufs[b].data;
    const int64_t n = df_numel(&bufs[b]);
#pragma omp for simd schedule(static) nowait
    for (int64_t i = 0; i < n; i++) x[i] *= cf;
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_optim(df_backend *be) {
  be->adamw_step = df_cpu_adamw_step;
  be->global_norm = df_cpu_global_norm;
  be->measures[DF_OP_GLOBAL_NORM] = true;
  be->clip_by_norm = df_cpu_clip_by_norm;
}
