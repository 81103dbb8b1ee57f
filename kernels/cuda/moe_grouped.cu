// Grouped expert GEMMs over rows sorted by expert, with the segment offsets on the device (twin of
// kernels/cpu/moe_experts.c): no host copy of the counts, so an MoE step needs no synchronisation. Segment e is
// rows [off[e], off[e + 1]) of x [Tk, in]; the stacked weight w is [E, out, in].
//   forward   y_e  = x_e · w_eᵀ           (written)
//   dx        dx_e = dy_e · w_e           (written or added)
//   dw        dw_e += dy_eᵀ · x_e         (one block per (expert, tile) summing its rows in order: no atomics)
// Tiled fp32 CUDA-core kernels (64 × 64 tiles, 4 × 4 per thread), f32 or bf16 storage; every output element is a
// sum in a fixed order, so results are the same bits on every run. Row-tile blocks find their (expert, tile) by a
// walk over the offsets; Σ_e ceil(n_e / 64) <= ceil(Tk / 64) + E bounds the grid.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

enum { GT = 64, GK = 16, GTHREADS = 256 };

// C[m, n] (= or +=) Σ_k A[m, k] · B(k, n) over segment rows m, with A row-major [*, K] and B(k, n) = b[k·bk + n·bn]
// taken from expert e's slice of b.
template <typename T>
__global__ void grouped_rows_kernel(const T *a, const T *b, T *c, const int32_t *off, int E, int64_t K, int64_t N,
                                    int64_t bk, int64_t bn, int64_t b_expert, bool accumulate) {
  __shared__ float as[GK][GT + 1];
  __shared__ float bs_[GK][GT + 1];
  // Which (expert, row tile) this block owns.
  int64_t tile = blockIdx.x, e = 0, r0 = -1, r1 = -1;
  for (; e < E; e++) {
    const int64_t n_e = off[e + 1] - off[e], t_e = (n_e + GT - 1) / GT;
    if (tile < t_e) {
      r0 = off[e] + tile * GT;
      r1 = off[e + 1];
      break;
    }
    tile -= t_e;
  }
  if (r0 < 0) return; // past the last tile
  const int64_t n0 = (int64_t)blockIdx.y * GT;
  const T *be = b + e * b_expert;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += GK) {
    for (int i = threadIdx.x; i < GK * GT; i += GTHREADS) {
      const int kk = i % GK, mm = i / GK; // A: consecutive threads along k
      const int64_t row = r0 + mm, kx = k0 + kk;
      as[kk][mm] = row < r1 && kx < K ? df_ld(a + row * K + kx) : 0.0f;
      const int nn = i % GT, kb = i / GT; // B: consecutive threads along n
      const int64_t col = n0 + nn, ky = k0 + kb;
      bs_[kb][nn] = col < N && ky < K ? df_ld(be + ky * bk + col * bn) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < GK; kk++)
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] += as[kk][ty * 4 + i] * bs_[kk][tx * 4 + j];
    __syncthreads();
  }
  for (int i = 0; i < 4; i++) {
    const int64_t row = r0 + ty * 4 + i;
    if (row >= r1) continue;
    for (int j = 0; j < 4; j++) {
      const int64_t col = n0 + tx * 4 + j;
      if (col >= N) continue;
      T *p = c + row * N + col;
      df_st(p, accumulate ? df_ld(p) + acc[i][j] : acc[i][j]);
    }
  }
}

// dw_e[o, i] += Σ_{r in segment e} dy[r, o] · x[r, i]; grid (out tiles, in tiles, E).
template <typename T>
__global__ void grouped_wgrad_kernel(const T *dy, const T *x, T *dw, const int32_t *off, int64_t out, int64_t in) {
  __shared__ float ds[GK][GT + 1];
  __shared__ float xs[GK][GT + 1];
  const int64_t e = blockIdx.z, o0 = (int64_t)blockIdx.x * GT, i0 = (int64_t)blockIdx.y * GT;
  const int64_t r0 = off[e], r1 = off[e + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t rb = r0; rb < r1; rb += GK) {
    for (int t = threadIdx.x; t < GK * GT; t += GTHREADS) {
      const int cc = t % GT, rr = t / GT;
      const int64_t row = rb + rr;
      ds[rr][cc] = row < r1 && o0 + cc < out ? df_ld(dy + row * out + o0 + cc) : 0.0f;
      xs[rr][cc] = row < r1 && i0 + cc < in ? df_ld(x + row * in + i0 + cc) : 0.0f;
    }
    __syncthreads();
    for (int rr = 0; rr < GK; rr++)
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] += ds[rr][ty * 4 + i] * xs[rr][tx * 4 + j];
    __syncthreads();
  }
  T *we = dw + e * out * in;
  for (int i = 0; i < 4; i++) {
    const int64_t o = o0 + ty * 4 + i;
    if (o >= out) continue;
    for (int j = 0; j < 4; j++) {
      const int64_t c = i0 + tx * 4 + j;
      if (c < in) df_st(we + o * in + c, df_ld(we + o * in + c) + acc[i][j]);
    }
  }
}

static dim3 row_grid(int64_t Tk, int64_t E, int64_t N) {
  return dim3((unsigned)((Tk + GT - 1) / GT + E), (unsigned)((N + GT - 1) / GT));
}

extern "C" df_status df_cu_moe_grouped_fwd(df_cu_stream s, df_dtype dt, const void *x, const void *w,
                                           const int32_t *offsets, void *y, int64_t Tk, int64_t E, int64_t in,
                                           int64_t out, df_error *err) {
  if (Tk <= 0 || out <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "moe_grouped_forward",
                  grouped_rows_kernel<T><<<row_grid(Tk, E, out), GTHREADS, 0, s>>>(
                      (const T *)x, (const T *)w, (T *)y, offsets, (int)E, in, out, 1, in, out * in, false));
  DF_CU_CHECK_LAUNCH(err, "grouped_rows_kernel");
  return DF_OK;
}

extern "C" df_status df_cu_moe_grouped_bwd(df_cu_stream s, df_dtype dt, const void *dy, const void *x, const void *w,
                                           const int32_t *offsets, void *dx, bool accumulate_dx, void *dw, int64_t Tk,
                                           int64_t E, int64_t in, int64_t out, df_error *err) {
  if (Tk <= 0) return DF_OK;
  if (dw) { // first: dx may alias x
    const dim3 grid((unsigned)((out + GT - 1) / GT), (unsigned)((in + GT - 1) / GT), (unsigned)E);
    DF_CU_SWITCH_DT(dt, T, err, "moe_grouped_backward",
                    grouped_wgrad_kernel<T>
                    <<<grid, GTHREADS, 0, s>>>((const T *)dy, (const T *)x, (T *)dw, offsets, out, in));
    DF_CU_CHECK_LAUNCH(err, "grouped_wgrad_kernel");
  }
  if (dx) {
    DF_CU_SWITCH_DT(dt, T, err, "moe_grouped_backward",
                    grouped_rows_kernel<T>
                    <<<row_grid(Tk, E, in), GTHREADS, 0, s>>>((const T *)dy, (const T *)w, (T *)dx, offsets, (int)E,
                                                              out, in, in, 1, out * in, accumulate_dx));
    DF_CU_CHECK_LAUNCH(err, "grouped_rows_kernel");
  }
  return DF_OK;
}

// ---- the backend table's grouped-GEMM slots (kernels/ops_moe.h) ------------------------------------------------

static df_status cuda_grouped_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                                      df_tensor *y, df_error *err) {
  return df_cu_moe_grouped_fwd(df_cuda_cu_stream(ctx), x->dtype, x->data, w->data, (const int32_t *)offsets->data,
                               y->data, x->shape[0], w->shape[0], w->shape[2], w->shape[1], err);
}

static df_status cuda_grouped_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                       const df_tensor *offsets, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                       df_error *err) {
  return df_cu_moe_grouped_bwd(df_cuda_cu_stream(ctx), x->dtype, dy->data, x->data, w->data,
                               (const int32_t *)offsets->data, dx ? dx->data : NULL, accumulate_dx,
                               dw ? dw->data : NULL, x->shape[0], w->shape[0], w->shape[2], w->shape[1], err);
}

extern "C" void df_cuda_register_moe_grouped(df_backend *be) {
  be->moe_grouped_forward = cuda_grouped_forward;
  be->moe_grouped_backward = cuda_grouped_backward;
}
