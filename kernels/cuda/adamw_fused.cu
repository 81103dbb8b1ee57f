// CUDA fused optimizer step over the flat buffers (twin of kernels/cpu/adamw_fused.c): the masked global norm of
// the scaled gradient with the clip coefficient and the go/no-go flag written to device memory, and one AdamW pass
// that reads them, so an optimizer step needs no host value. The norm sums in the CPU's partition and lane order
// (blocks of 2^14 elements, 16 interleaved double accumulators, blocks in order), so GPU and CPU runs agree on the
// norm bit for bit; the AdamW arithmetic is the CPU's, operation by operation (the GPU may fuse multiply-adds).
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kBlock = 1 << 14, kLanes = 16, kThreads = 256;

template <typename G>
__global__ void masked_sumsq(const G *g, const uint8_t *mask, int64_t n, float scale, double *partial) {
  __shared__ double lane_sum[kLanes];
  const int64_t lo = (int64_t)blockIdx.x * kBlock, len = n - lo < kBlock ? n - lo : kBlock;
  const int j = threadIdx.x;
  if (j < kLanes) {
    double acc = 0.0;
    for (int64_t i = j; i < len; i += kLanes) {
      const double x = (double)(df_ld(g + lo + i) * scale);
      if (mask[lo + i] & DF_PARAM_TRAIN) acc += x * x;
    }
    lane_sum[j] = acc;
  }
  __syncthreads();
  if (j == 0) {
    double s = 0.0;
    for (int l = 0; l < kLanes; l++) s += lane_sum[l];
    partial[blockIdx.x] = s;
  }
}

__global__ void norm_finish(const double *partial, int64_t nb, double max_norm, const double *guard, int64_t nguard,
                            double *out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int64_t k = 0; k < nb; k++) s += partial[k];
  const double norm = sqrt(s), c = max_norm / (norm + 1e-6);
  bool ok = isfinite(norm);
  for (int64_t i = 0; i < nguard; i++) ok = ok && isfinite(guard[i]);
  out[DF_NORM_VALUE] = norm;
  out[DF_NORM_COEF] = c < 1.0 ? c : 1.0;
  out[DF_NORM_OK] = ok ? 1.0 : 0.0;
}

template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
    adamw_masked(float *master, const G *grad, float *m, float *v, const uint8_t *mask, const double *ns, P *params,
                 int64_t n, df_cu_adamw_coefs cd, df_cu_adamw_coefs cn, float scale) {
  if (ns && ns[DF_NORM_OK] == 0.0) return; // skipped on the device: nothing changes
  const double coef = ns ? ns[DF_NORM_COEF] : 1.0;
  const bool clip = coef < 1.0;
  const float cf = (float)coef;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint8_t mk = mask[i];
    if (!(mk & DF_PARAM_TRAIN)) continue;
    const df_cu_adamw_coefs &c = (mk & DF_PARAM_DECAY) ? cd : cn;
    float g = df_ld(grad + i) * scale;
    if (clip) g *= cf;
    const float mi = m[i] * c.beta1 + c.a1 * g;
    const float vi = v[i] * c.beta2 + c.a2 * g * g;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    m[i] = mi, v[i] = vi;
    const float p = master[i] * c.decay + c.neg_step_size * mi / denom;
    master[i] = p;
    if (params) df_st(params + i, p);
  }
}

} // namespace

static df_status cuda_grad_norm_clip(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad,
                                     const df_tensor *mask, const df_tensor *guard, df_tensor *out, df_error *err) {
  const int64_t n = df_numel(grad), nb = (n + kBlock - 1) / kBlock;
  double *partial = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)(nb > 0 ? nb : 1), (void **)&partial, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const cudaStream_t s = df_cuda_stream(ctx);
  if (nb > 0) {
    DF_CU_SWITCH_DT(grad->dtype, G, err, "grad_norm_clip.grad",
                    masked_sumsq<G><<<(unsigned)nb, 32, 0, s>>>((const G *)grad->data, (const uint8_t *)mask->data, n,
                                                                desc->grad_scale, partial));
    DF_CU_CHECK_LAUNCH(err, "grad_norm_clip.blocks");
  }
  norm_finish<<<1, 32, 0, s>>>(partial, nb, desc->max_norm, guard ? (const double *)guard->data : NULL,
                               guard ? df_numel(guard) : 0, (double *)out->data);
  DF_CU_CHECK_LAUNCH(err, "grad_norm_clip.finish");
  return DF_OK;
}

static df_status cuda_adamw_fused(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master,
                                  const df_tensor *grad, df_tensor *m, df_tensor *v, const df_tensor *mask,
                                  const df_tensor *norm_stats, df_tensor *params, df_error *err) {
  const df_adamw_hparams *hp = &desc->hp;
  const df_cu_adamw_coefs cd = df_cu_adamw_coefs_of(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->step);
  const df_cu_adamw_coefs cn = df_cu_adamw_coefs_of(hp->lr, hp->beta1, hp->beta2, hp->eps, 0.0f, hp->step);
  const int64_t n = df_numel(master);
  if (n <= 0) return DF_OK;
  unsigned blocks = df_cu_blocks(n, kThreads);
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  const cudaStream_t s = df_cuda_stream(ctx);
  const double *ns = norm_stats ? (const double *)norm_stats->data : NULL;
  const df_dtype pdt = params ? params->dtype : DF_F32;
  DF_CU_SWITCH_DT(grad->dtype, G, err, "adamw_fused.grad",
                  DF_CU_SWITCH_DT(pdt, P, err, "adamw_fused.params",
                                  adamw_masked<G, P><<<blocks, kThreads, 0, s>>>(
                                      (float *)master->data, (const G *)grad->data, (float *)m->data, (float *)v->data,
                                      (const uint8_t *)mask->data, ns, params ? (P *)params->data : (P *)NULL, n, cd,
                                      cn, desc->grad_scale)));
  DF_CU_CHECK_LAUNCH(err, "adamw_fused");
  return DF_OK;
}

extern "C" void df_cuda_register_adamw_fused(df_backend *be) {
  be->grad_norm_clip = cuda_grad_norm_clip;
  be->measures[DF_OP_GRAD_NORM_CLIP] = true;
  be->adamw_fused = cuda_adamw_fused;
}
