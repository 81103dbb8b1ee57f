// CPU RMSNorm (HF Qwen3RMSNorm): y = x · rsqrt(mean(x²) + eps) · w over rows of D elements.
// Reductions (mean of squares, the per-row dot of the backward, the dw column sums) run in double; dw is
// summed per fixed block of rows and the blocks are added in order, so it is bitwise the same for any
// thread count.
#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"

// Below this many elements a call stays on the calling thread.
#define RMS_PAR_MIN 32768
// dw partial sums: at most this many row blocks, each at least RMS_BLOCK_MIN rows.
#define RMS_MAX_BLOCKS 64
#define RMS_BLOCK_MIN  16
#define RMS_COL_CHUNK  64

static float row_rstd(const float *x, int64_t dim, float eps) {
  double ss = 0.0;
  // simd reduction: lane-wise double partials, a fixed order for a given build.
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < dim; j++) ss += (double)x[j] * x[j];
  return (float)(1.0 / sqrt(ss / (double)dim + eps));
}

df_status df_cpu_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                                 df_tensor *rstd, df_error *err) {
  (void)err;
  const int64_t dim = w->shape[0], rows = df_numel(x) / dim;
  const float *xd = x->data, *wd = w->data; // x [R, D], w [D]
  float *yd = y->data, *rd = rstd->data;    // y [R, D], rstd [R]
#pragma omp parallel for num_threads(ctx->num_threads) if (rows * dim > RMS_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = xd + r * dim;
    float *yr = yd + r * dim;
    float s = row_rstd(xr, dim, eps);
    rd[r] = s;
    for (int64_t j = 0; j < dim; j++) yr[j] = (xr[j] * s) * wd[j];
  }
  return DF_OK;
}

// One row of the backward. With y = w·x·r, r = (mean(x²) + eps)^-½:
//   dx_j = r·w_j·dy_j − x_j · r³/D · Σ_k dy_k·w_k·x_k;   dw_j += dy_j·x_j·r.
// dwp (double, may be NULL) receives the dw contribution; dy is read before dx is written.
static void rmsnorm_backward_row(const float *dy, const float *x, const float *w, float r, int64_t dim, float *dx,
                                 bool accumulate_dx, double *dwp) {
  double dot = 0.0;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < dim; j++) dot += (double)dy[j] * w[j] * x[j];
  const double rd = r;
  const float c = (float)(rd * rd * rd * dot / (double)dim);
  if (dwp)
    for (int64_t j = 0; j < dim; j++) dwp[j] += (double)dy[j] * x[j] * rd;
  if (accumulate_dx)
    for (int64_t j = 0; j < dim; j++) dx[j] += r * (w[j] * dy[j]) - c * x[j];
  else
    for (int64_t j = 0; j < dim; j++) dx[j] = r * (w[j] * dy[j]) - c * x[j];
}

df_status df_cpu_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                  const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                  df_error *err) {
  const int64_t dim = w->shape[0], rows = df_numel(x) / dim;
  const float *dyd = dy->data, *xd = x->data, *wd = w->data, *rd = rstd->data; // [R, D], [R, D], [D], [R]
  float *dxd = dx->data;                                                       // [R, D]
  // The row blocking depends only on R, never on the thread count: that is what makes dw deterministic.
  int64_t per_block = (rows + RMS_MAX_BLOCKS - 1) / RMS_MAX_BLOCKS;
  if (per_block < RMS_BLOCK_MIN) per_block = RMS_BLOCK_MIN;
  const int64_t nblocks = rows > 0 ? (rows + per_block - 1) / per_block : 0;
  double *part = NULL; // [nblocks, D] dw partial sums
  if (dw && nblocks > 0) {
    part = calloc((size_t)(nblocks * dim), sizeof(double));
    if (!part)
      return DF_FAIL(err, DF_ERR_NOMEM, "dw", NULL, "cannot allocate %lld x %lld dw partial sums", (long long)nblocks,
                     (long long)dim);
  }
  const bool par = rows * dim > RMS_PAR_MIN;
#pragma omp parallel num_threads(ctx->num_threads) if (par)
  {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
      double *pb = part ? part + b * dim : NULL;
      const int64_t r1 = (b + 1) * per_block < rows ? (b + 1) * per_block : rows;
      for (int64_t r = b * per_block; r < r1; r++)
        rmsnorm_backward_row(dyd + r * dim, xd + r * dim, wd, rd[r], dim, dxd + r * dim, accumulate_dx, pb);
    }
    if (part) {
      float *dwd = dw->data; // [D]
      // Blocks added in index order for every column; columns in chunks so the reads stay row-wise.
#pragma omp for schedule(static)
      for (int64_t j0 = 0; j0 < dim; j0 += RMS_COL_CHUNK) {
        const int64_t n = dim - j0 < RMS_COL_CHUNK ? dim - j0 : RMS_COL_CHUNK;
        double s[RMS_COL_CHUNK] = {0};
        for (int64_t b = 0; b < nblocks; b++)
          for (int64_t j = 0; j < n; j++) s[j] += part[b * dim + j0 + j];
        for (int64_t j = 0; j < n; j++) dwd[j0 + j] += (float)s[j];
      }
    }
  }
  free(part);
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_rmsnorm(df_backend *be) {
  be->rmsnorm_forward = df_cpu_rmsnorm_forward;
  be->rmsnorm_backward = df_cpu_rmsnorm_backward;
}
