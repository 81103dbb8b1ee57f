// CUDA twins of kernels/cpu/domino_metrics.c: the row-masked SiLU (one thread per element, σ through a double exp as
// on the CPU, f32 or bf16 storage) and Domino's block metric sums (a few thousand rows per micro-step: one thread
// runs the CPU loop in its exact order, so the double sums are the CPU's bit for bit).
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

template <typename T>
__global__ void masked_silu_fwd_kernel(const T *x, const uint8_t *mask, T *y, int64_t R, int64_t E) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= R * E) return;
  const float v = df_ld(x + i);
  df_st(y + i, mask[i / E] ? v * silu_sigmoid(v) : 0.0f);
}

template <typename T>
__global__ void masked_silu_bwd_kernel(const T *x, const uint8_t *mask, const T *dy, T *dx, int64_t R, int64_t E) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= R * E) return;
  const float v = df_ld(x + i), s = silu_sigmoid(v), d = df_ld(dy + i); // read dy before dx (may alias) is written
  df_st(dx + i, mask[i / E] ? d * s * (1.0f + v * (1.0f - s)) : 0.0f);
}

struct dm_ptrs {
  const float *cef, *ceb, *w;
  const uint8_t *okf, *okb, *v, *keep;
  double fs, bs, inv;
};

__device__ double accept_run(const uint8_t *valid, const uint8_t *correct, int64_t bs) {
  double a = 0.0;
  for (int64_t k = 0; k < bs; k++) {
    if (!valid[k]) continue;
    if (!correct[k]) break;
    a += 1.0;
  }
  return a;
}

__global__ void domino_metrics_kernel(int64_t bs, int64_t R, dm_ptrs p, double *st) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s[DF_DOMSTAT_POS];
  for (int i = 0; i < DF_DOMSTAT_POS; i++) s[i] = 0.0;
  for (int64_t r = 0; r < R; r++) {
    const double wr = p.w[r], f = wr * p.cef[r], b = wr * p.ceb[r];
    s[DF_DOMSTAT_LOSS] += p.fs * f + p.bs * b;
    s[DF_DOMSTAT_FINAL] += f * p.inv, s[DF_DOMSTAT_BASE] += b * p.inv;
    s[DF_DOMSTAT_FINAL_NUM] += f, s[DF_DOMSTAT_BASE_NUM] += b, s[DF_DOMSTAT_WEIGHT] += wr;
    if (!p.v[r]) continue;
    s[DF_DOMSTAT_ACC] += p.okf[r], s[DF_DOMSTAT_BASE_ACC] += p.okb[r], s[DF_DOMSTAT_ACC_DEN] += 1.0;
  }
  const int64_t nb = R / bs;
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *vb = p.v + i * bs;
    s[DF_DOMSTAT_BLOCKS] += p.keep[i];
    bool any = false;
    for (int64_t k = 0; k < bs; k++) any = any || vb[k];
    if (!any) continue;
    s[DF_DOMSTAT_ACCEPT] += 1.0 + accept_run(vb, p.okf + i * bs, bs);
    s[DF_DOMSTAT_BASE_ACCEPT] += 1.0 + accept_run(vb, p.okb + i * bs, bs);
    s[DF_DOMSTAT_ACCEPT_DEN] += 1.0;
  }
  for (int i = 0; i < DF_DOMSTAT_POS; i++) st[i] += s[i];
  for (int64_t k = 0; k < bs; k++) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < nb; i++) {
      const int64_t r = i * bs + k;
      if (p.v[r]) num += p.okf[r], den += 1.0;
    }
    st[DF_DOMSTAT_POS + k] += num, st[DF_DOMSTAT_POS + bs + k] += den;
  }
}

} // namespace

static df_status cuda_masked_silu_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y,
                                          df_error *err) {
  const int64_t R = df_rows(x), E = df_last_dim(x);
  if (R * E <= 0) return DF_OK;
  DF_CU_SWITCH_DT(x->dtype, T, err, "masked_silu_forward",
                  masked_silu_fwd_kernel<T><<<df_cu_blocks(R * E, kThreads), kThreads, 0, df_cuda_stream(ctx)>>>(
                      (const T *)x->data, (const uint8_t *)mask->data, (T *)y->data, R, E));
  DF_CU_CHECK_LAUNCH(err, "masked_silu_forward");
  return DF_OK;
}

static df_status cuda_masked_silu_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, const df_tensor *dy,
                                           df_tensor *dx, df_error *err) {
  const int64_t R = df_rows(x), E = df_last_dim(x);
  if (R * E <= 0) return DF_OK;
  DF_CU_SWITCH_DT(x->dtype, T, err, "masked_silu_backward",
                  masked_silu_bwd_kernel<T><<<df_cu_blocks(R * E, kThreads), kThreads, 0, df_cuda_stream(ctx)>>>(
                      (const T *)x->data, (const uint8_t *)mask->data, (const T *)dy->data, (T *)dx->data, R, E));
  DF_CU_CHECK_LAUNCH(err, "masked_silu_backward");
  return DF_OK;
}

static df_status cuda_domino_block_metrics(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in, df_tensor *stats,
                                           df_error *err) {
  dm_ptrs p;
  p.cef = (const float *)in->ce_final->data, p.ceb = (const float *)in->ce_base->data;
  p.w = (const float *)in->weights->data, p.okf = (const uint8_t *)in->correct_final->data;
  p.okb = (const uint8_t *)in->correct_base->data, p.v = (const uint8_t *)in->valid->data;
  p.keep = (const uint8_t *)in->keep->data;
  p.fs = in->final_scale, p.bs = in->base_scale, p.inv = in->inv_den;
  domino_metrics_kernel<<<1, 32, 0, df_cuda_stream(ctx)>>>(bs, df_numel(in->ce_final), p, (double *)stats->data);
  DF_CU_CHECK_LAUNCH(err, "domino_block_metrics");
  return DF_OK;
}

extern "C" void df_cuda_register_domino_metrics(df_backend *be) {
  be->masked_silu_forward = cuda_masked_silu_forward;
  be->masked_silu_backward = cuda_masked_silu_backward;
  be->domino_block_metrics = cuda_domino_block_metrics;
}
