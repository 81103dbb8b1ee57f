// CUDA rotary embedding, NeoX rotate-half, the CPU twin's arithmetic: angle = fp32(pos)·inv_freq[i] in fp32,
// c = cosf(angle)·mscale, s = sign·(sinf(angle)·mscale) (full-precision cosf/sinf, not the fast intrinsics), then
// y1 = x1·c − x2·s, y2 = x2·c + x1·s. One thread per (token, head, frequency) pair reads both halves before
// writing either, so y may be x.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

template <typename X, typename Y>
__global__ void rope_kernel(const X *x, const int32_t *pos, const float *inv_freq, float mscale, float sign, Y *y,
                            int64_t T, int64_t nh, int64_t hd) {
  const int64_t half = hd / 2, n = T * nh * half;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t f = i % half, row = i / half, t = row / nh;
    const float angle = (float)pos[t] * inv_freq[f];
    const float c = cosf(angle) * mscale, sn = sign * (sinf(angle) * mscale);
    const int64_t o = row * hd + f;
    const float a = df_ld(x + o), b = df_ld(x + o + half);
    df_st(y + o, a * c - b * sn);
    df_st(y + o + half, b * c + a * sn);
  }
}

} // namespace

extern "C" df_status df_cu_rope(df_cu_stream s, const void *x, df_dtype x_dt, const int32_t *pos, const float *inv_freq,
                                float mscale, float sign, void *y, df_dtype y_dt, int64_t T, int64_t nh, int64_t hd,
                                df_error *err) {
  const int64_t n = T * nh * (hd / 2);
  if (n <= 0) return DF_OK;
  unsigned blocks = df_cu_blocks(n, 256);
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  DF_CU_SWITCH_DT(x_dt, X, err, "rope.x",
                  DF_CU_SWITCH_DT(y_dt, Y, err, "rope.y",
                                  rope_kernel<X, Y><<<blocks, 256, 0, s>>>((const X *)x, pos, inv_freq, mscale, sign,
                                                                           (Y *)y, T, nh, hd)));
  DF_CU_CHECK_LAUNCH(err, "rope");
  return DF_OK;
}

// ---- the backend table's slots ---------------------------------------------------------------------------------

static df_status cuda_rope(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                           float mscale, float sign, df_tensor *y, df_error *err) {
  return df_cu_rope(df_cuda_cu_stream(ctx), x->data, x->dtype, (const int32_t *)pos->data,
                    (const float *)inv_freq->data, mscale, sign, y->data, y->dtype, x->shape[0], x->shape[1],
                    x->shape[2], err);
}

static df_status cuda_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                                   float mscale, df_tensor *y, df_error *err) {
  return cuda_rope(ctx, x, pos, inv_freq, mscale, 1.0f, y, err);
}

static df_status cuda_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                                    float mscale, df_tensor *dx, df_error *err) {
  return cuda_rope(ctx, dy, pos, inv_freq, mscale, -1.0f, dx, err);
}

extern "C" void df_cuda_register_rope(df_backend *be) {
  be->rope_forward = cuda_rope_forward;
  be->rope_backward = cuda_rope_backward;
}
