// CUDA RMSNorm (rows and per-head q/k norm: a row is any run of D contiguous elements), the CPU twin's math:
// y = (x·rstd)·w with rstd = 1/sqrt(mean(x²) + eps), reductions in double. One warp per row. The dw of the
// backward sums over a fixed partition of the rows (chunk size from R alone), each chunk's column partials in
// double, then the chunks in order: the same bits on every run and every GPU.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kRowsPerBlock = 8; // warps per block, one row each
constexpr int kMaxChunks = 1024;

int64_t chunk_rows(int64_t R) {
  int64_t c = (R + kMaxChunks - 1) / kMaxChunks;
  return c < 64 ? 64 : c;
}

template <typename X, typename W, typename Y>
__global__ void rmsnorm_fwd_kernel(const X *x, const W *w, float eps, Y *y, float *rstd, int64_t R, int64_t D) {
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const X *xr = x + r * D;
  double ss = 0.0;
  for (int64_t j = lane; j < D; j += 32) {
    double v = df_ld(xr + j);
    ss += v * v;
  }
  ss = df_warp_sum(ss);
  const float s = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
  if (lane == 0) rstd[r] = s;
  Y *yr = y + r * D;
  for (int64_t j = lane; j < D; j += 32) df_st(yr + j, (df_ld(xr + j) * s) * df_ld(w + j));
}

// dx_j = r·(w_j·dy_j) − c·x_j with c = r³/D · Σ_k dy_k·w_k·x_k (double). dy is read before dx is written, so
// dx may alias dy.
template <typename G, typename X, typename W, typename O>
__global__ void rmsnorm_bwd_dx_kernel(const G *dy, const X *x, const W *w, const float *rstd, O *dx, bool acc,
                                      int64_t R, int64_t D) {
  const int64_t r = blockIdx.x * (int64_t)kRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const G *gr = dy + r * D;
  const X *xr = x + r * D;
  double dot = 0.0;
  for (int64_t j = lane; j < D; j += 32) dot += (double)df_ld(gr + j) * (double)df_ld(w + j) * (double)df_ld(xr + j);
  dot = df_warp_sum(dot);
  const float rs = rstd[r];
  const double rd = rs;
  const float c = (float)(rd * rd * rd * dot / (double)D);
  O *o = dx + r * D;
  for (int64_t j = lane; j < D; j += 32) {
    const float v = rs * (df_ld(w + j) * df_ld(gr + j)) - c * df_ld(xr + j);
    df_st(o + j, acc ? df_ld(o + j) + v : v);
  }
}

// partial[p, j] = Σ over the rows of chunk p of dy_rj·x_rj·rstd_r (double). Block (32, 8): 32 columns, 8 row lanes.
template <typename G, typename X>
__global__ void rmsnorm_dw_partial_kernel(const G *dy, const X *x, const float *rstd, double *partial, int64_t R,
                                          int64_t D, int64_t rows_per_chunk) {
  __shared__ double acc[8][32];
  const int64_t j = blockIdx.x * 32 + threadIdx.x, p = blockIdx.y;
  const int64_t r0 = p * rows_per_chunk, r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
  double s = 0.0;
  if (j < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
      s += (double)df_ld(dy + r * D + j) * (double)df_ld(x + r * D + j) * (double)rstd[r];
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    double t = 0.0;
    for (int i = 0; i < 8; i++) t += acc[i][threadIdx.x];
    partial[p * D + j] = t;
  }
}

template <typename W> __global__ void rmsnorm_dw_reduce_kernel(const double *partial, int64_t P, int64_t D, W *dw) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= D) return;
  double t = 0.0;
  for (int64_t p = 0; p < P; p++) t += partial[p * D + j];
  df_st(dw + j, df_ld(dw + j) + (float)t);
}

} // namespace

extern "C" df_status df_cu_rmsnorm_fwd(df_cu_stream s, const void *x, df_dtype x_dt, const void *w, df_dtype w_dt,
                                       float eps, void *y, df_dtype y_dt, float *rstd, int64_t R, int64_t D,
                                       df_error *err) {
  if (R <= 0) return DF_OK;
  const unsigned blocks = df_cu_blocks(R, kRowsPerBlock);
  DF_CU_SWITCH_DT(x_dt, X, err, "rmsnorm.x",
                  DF_CU_SWITCH_DT(w_dt, W, err, "rmsnorm.w",
                                  DF_CU_SWITCH_DT(y_dt, Y, err, "rmsnorm.y",
                                                  rmsnorm_fwd_kernel<X, W, Y><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
                                                      (const X *)x, (const W *)w, eps, (Y *)y, rstd, R, D))));
  DF_CU_CHECK_LAUNCH(err, "rmsnorm_fwd");
  return DF_OK;
}

extern "C" size_t df_cu_rmsnorm_bwd_workspace(int64_t R, int64_t D) {
  if (R <= 0) return 0;
  const int64_t P = (R + chunk_rows(R) - 1) / chunk_rows(R);
  return sizeof(double) * (size_t)(P * D);
}

extern "C" df_status df_cu_rmsnorm_bwd(df_cu_stream s, const void *dy, df_dtype dy_dt, const void *x, df_dtype x_dt,
                                       const void *w, df_dtype w_dt, const float *rstd, void *dx, df_dtype dx_dt,
                                       bool accumulate_dx, void *dw, df_dtype dw_dt, int64_t R, int64_t D,
                                       void *workspace, df_error *err) {
  if (R <= 0) return DF_OK;
  // dw first: dx may alias dy.
  if (dw) {
    const int64_t rc = chunk_rows(R), P = (R + rc - 1) / rc;
    dim3 grid((unsigned)((D + 31) / 32), (unsigned)P), block(32, 8);
    DF_CU_SWITCH_DT(dy_dt, G, err, "rmsnorm.dy",
                    DF_CU_SWITCH_DT(x_dt, X, err, "rmsnorm.x",
                                    rmsnorm_dw_partial_kernel<G, X><<<grid, block, 0, s>>>(
                                        (const G *)dy, (const X *)x, rstd, (double *)workspace, R, D, rc)));
    DF_CU_CHECK_LAUNCH(err, "rmsnorm_dw_partial");
    DF_CU_SWITCH_DT(dw_dt, W, err, "rmsnorm.dw",
                    rmsnorm_dw_reduce_kernel<W>
                    <<<df_cu_blocks(D, 256), 256, 0, s>>>((const double *)workspace, P, D, (W *)dw));
    DF_CU_CHECK_LAUNCH(err, "rmsnorm_dw_reduce");
  }
  const unsigned blocks = df_cu_blocks(R, kRowsPerBlock);
  DF_CU_SWITCH_DT(dy_dt, G, err, "rmsnorm.dy",
                  DF_CU_SWITCH_DT(x_dt, X, err, "rmsnorm.x",
                                  DF_CU_SWITCH_DT(w_dt, W, err, "rmsnorm.w",
                                                  DF_CU_SWITCH_DT(dx_dt, O, err, "rmsnorm.dx",
                                                                  rmsnorm_bwd_dx_kernel<G, X, W, O>
                                                                  <<<blocks, 32 * kRowsPerBlock, 0, s>>>(
                                                                      (const G *)dy, (const X *)x, (const W *)w, rstd,
                                                                      (O *)dx, accumulate_dx, R, D)))));
  DF_CU_CHECK_LAUNCH(err, "rmsnorm_bwd_dx");
  return DF_OK;
}

// ---- the backend table's slots ---------------------------------------------------------------------------------

static df_status cuda_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                                      df_tensor *rstd, df_error *err) {
  const int64_t D = w->shape[0], R = df_numel(x) / D;
  return df_cu_rmsnorm_fwd(df_cuda_cu_stream(ctx), x->data, x->dtype, w->data, w->dtype, eps, y->data, y->dtype,
                           (float *)rstd->data, R, D, err);
}

static df_status cuda_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                       const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                       df_error *err) {
  const int64_t D = w->shape[0], R = df_numel(x) / D;
  void *ws = NULL;
  if (dw) DF_TRY(df_ctx_workspace(ctx, 0, df_cu_rmsnorm_bwd_workspace(R, D), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_rmsnorm_bwd(df_cuda_cu_stream(ctx), dy->data, dy->dtype, x->data, x->dtype, w->data, w->dtype,
                           (const float *)rstd->data, dx->data, dx->dtype, accumulate_dx, dw ? dw->data : NULL,
                           dw ? dw->dtype : DF_F32, R, D, ws, err);
}

extern "C" void df_cuda_register_rmsnorm(df_backend *be) {
  be->rmsnorm_forward = cuda_rmsnorm_forward;
  be->rmsnorm_backward = cuda_rmsnorm_backward;
  be->measures[DF_OP_RMSNORM_BACKWARD] = true;
}
