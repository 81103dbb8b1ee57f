// CUDA SwiGLU with the optional clamp, the CPU twin's arithmetic (sigmoid = 1/(1 + expf(−a)); the clamp
// written as a ternary so NaN stays NaN; a clipped element passes no gradient, torch.clamp's inclusive rule).
// Rows with strides, so g and u can be the two halves of one fused gate/up GEMM output.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

__device__ __forceinline__ float clamp_hi(float x, float hi) { return x > hi ? hi : x; }
__device__ __forceinline__ float clamp_pm(float x, float lim) { return x > lim ? lim : (x < -lim ? -lim : x); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename I, typename H>
__global__ void swiglu_fwd_kernel(const I *g, const I *u, int64_t ldg, int64_t ldu, float limit, H *h, int64_t ldh,
                                  int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    float a = df_ld(g + r * ldg + c), b = df_ld(u + r * ldu + c);
    if (limit > 0.0f) a = clamp_hi(a, limit), b = clamp_pm(b, limit);
    df_st(h + r * ldh + c, a * sigmoidf_(a) * b);
  }
}

template <typename I, typename G, typename O>
__global__ void swiglu_bwd_kernel(const I *g, const I *u, int64_t ldg, int64_t ldu, float limit, const G *dh,
                                  int64_t lddh, O *dg, O *du, int64_t ldd, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float gi = df_ld(g + r * ldg + c), ui = df_ld(u + r * ldu + c), d = df_ld(dh + r * lddh + c);
    float a = gi, b = ui, pass_g = 1.0f, pass_u = 1.0f;
    if (limit > 0.0f) {
      a = clamp_hi(gi, limit), b = clamp_pm(ui, limit);
      pass_g = gi <= limit ? 1.0f : 0.0f;
      pass_u = ui >= -limit && ui <= limit ? 1.0f : 0.0f;
    }
    const float sg = sigmoidf_(a);
    df_st(dg + r * ldd + c, pass_g * (d * b * (sg * (1.0f + a * (1.0f - sg)))));
    df_st(du + r * ldd + c, pass_u * (d * (a * sg)));
  }
}

unsigned grid_for(int64_t n) {
  unsigned b = df_cu_blocks(n, 256);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

} // namespace

extern "C" df_status df_cu_swiglu_fwd(df_cu_stream s, const df_cu_swiglu_in *in, void *h, df_dtype h_dt, int64_t ldh,
                                      df_error *err) {
  const int64_t n = in->rows * in->cols;
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(in->in_dt, I, err, "swiglu.in",
                  DF_CU_SWITCH_DT(h_dt, H, err, "swiglu.h",
                                  swiglu_fwd_kernel<I, H>
                                  <<<grid_for(n), 256, 0, s>>>((const I *)in->g, (const I *)in->u, in->ldg, in->ldu,
                                                               in->limit, (H *)h, ldh, in->rows, in->cols)));
  DF_CU_CHECK_LAUNCH(err, "swiglu_fwd");
  return DF_OK;
}

extern "C" df_status df_cu_swiglu_bwd(df_cu_stream s, const df_cu_swiglu_in *in, const void *dh, df_dtype dh_dt,
                                      int64_t lddh, void *dg, void *du, df_dtype out_dt, int64_t ldd, df_error *err) {
  const int64_t n = in->rows * in->cols;
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(
      in->in_dt, I, err, "swiglu.in",
      DF_CU_SWITCH_DT(dh_dt, G, err, "swiglu.dh",
                      DF_CU_SWITCH_DT(out_dt, O, err, "swiglu.dg",
                                      swiglu_bwd_kernel<I, G, O><<<grid_for(n), 256, 0, s>>>(
                                          (const I *)in->g, (const I *)in->u, in->ldg, in->ldu, in->limit,
                                          (const G *)dh, lddh, (O *)dg, (O *)du, ldd, in->rows, in->cols))));
  DF_CU_CHECK_LAUNCH(err, "swiglu_bwd");
  return DF_OK;
}

// ---- the backend table's slots: g, u, h of one shape, one contiguous row of n elements -------------------------

static df_status cuda_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                                     df_error *err) {
  const int64_t n = df_numel(g);
  df_cu_swiglu_in in = {1, n, g->data, u->data, n, n, g->dtype, limit};
  return df_cu_swiglu_fwd(df_cuda_cu_stream(ctx), &in, h->data, h->dtype, n, err);
}

static df_status cuda_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u,
                                      float limit, df_tensor *dg, df_tensor *du, df_error *err) {
  const int64_t n = df_numel(g);
  df_cu_swiglu_in in = {1, n, g->data, u->data, n, n, g->dtype, limit};
  if (dg->dtype != du->dtype) return df_cu_bad_dtype(err, "swiglu.du", du->dtype);
  return df_cu_swiglu_bwd(df_cuda_cu_stream(ctx), &in, dh->data, dh->dtype, n, dg->data, du->data, dg->dtype, n, err);
}

extern "C" void df_cuda_register_swiglu(df_backend *be) {
  be->swiglu_forward = cuda_swiglu_forward;
  be->swiglu_backward = cuda_swiglu_backward;
}
