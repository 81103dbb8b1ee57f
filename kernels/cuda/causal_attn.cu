// CUDA causal attention over a KV cache: one warp per (sample, query, head); the lanes split the head dim and
// walk the visible keys once with an online softmax. Plain and correct first; tiling comes with the CUDA work.
// Launched on the context's stream (kernels/cuda/backend.h), in order with every other op and copy.
#include <math.h>

#include "kernels/cuda/backend.h"

enum { MAX_PER_LANE = 8 }; // head_dim <= 256

__global__ void causal_attn_kernel(const float *q, const float *k, const float *v, float *out, int64_t B, int64_t T,
                                   int64_t nH, int64_t hd, int64_t C, int64_t nKV, int64_t past, int64_t window,
                                   float scale) {
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= B * T * nH) return;
  const int64_t h = warp % nH, t = warp / nH % T, b = warp / (nH * T), g = h / (nH / nKV);
  const float *qp = q + ((b * T + t) * nH + h) * hd;
  float qv[MAX_PER_LANE], acc[MAX_PER_LANE];
  for (int i = 0; i < MAX_PER_LANE; i++) {
    int64_t d = lane + 32 * i;
    qv[i] = d < hd ? qp[d] : 0.0f;
    acc[i] = 0.0f;
  }
  const int64_t pos = past + t;
  int64_t lo = window > 0 ? pos - window + 1 : 0;
  lo = lo < 0 ? 0 : lo;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = lo; j <= pos; j++) {
    const float *kp = k + ((b * C + j) * nKV + g) * hd, *vp = v + ((b * C + j) * nKV + g) * hd;
    float dot = 0.0f;
    for (int i = 0; i < MAX_PER_LANE; i++) {
      int64_t d = lane + 32 * i;
      if (d < hd) dot += qv[i] * kp[d];
    }
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * scale, mn = fmaxf(m, s), c = expf(m - mn), p = expf(s - mn);
    l = l * c + p;
    for (int i = 0; i < MAX_PER_LANE; i++) {
      int64_t d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * c + p * vp[d];
    }
    m = mn;
  }
  float *op = out + ((b * T + t) * nH + h) * hd;
  for (int i = 0; i < MAX_PER_LANE; i++) {
    int64_t d = lane + 32 * i;
    if (d < hd) op[d] = acc[i] / l;
  }
}

static df_status cuda_causal_attn_forward(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q,
                                          const df_tensor *k, const df_tensor *v, df_tensor *out, df_error *err) {
  const int64_t B = q->shape[0], T = q->shape[1], nH = q->shape[2], hd = q->shape[3];
  if (hd > 32 * MAX_PER_LANE)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "q", "head_dim up to 256 is supported on CUDA",
                   "head_dim %lld is too large for the CUDA causal attention", (long long)hd);
  const int64_t warps = B * T * nH, threads = 128;
  const unsigned blocks = (unsigned)((warps * 32 + threads - 1) / threads);
  causal_attn_kernel<<<blocks, threads, 0, df_cuda_stream(ctx)>>>(
      (const float *)q->data, (const float *)k->data, (const float *)v->data, (float *)out->data, B, T, nH, hd,
      k->shape[1], k->shape[2], desc->past, desc->window, desc->scale);
  DF_CUDA_CHECK_LAUNCH(err, "causal_attn_kernel");
  return DF_OK;
}

extern "C" void df_cuda_register_causal_attn(df_backend *be) { be->causal_attn_forward = cuda_causal_attn_forward; }
