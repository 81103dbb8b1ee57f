// CUDA optimizer kernels over the flat buffers: a deterministic global gradient norm (per-chunk double partials,
// added in chunk order by one block) and one fused AdamW launch over every trainable chunk, with the gradient
// scale (1/Σw) and the clip coefficient read from device memory, the weight-decay flag per chunk, fp32 masters
// and moments, and the bf16 parameters rounded (to nearest even) from the updated masters. A non-finite norm makes
// the update a no-op on the device: the host learns of it from the one scalar it reads per step.
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

// Σ (scale·g)² of one chunk, in double; scale·g is rounded to fp32 first, as the CPU scales the buffer in place.
__global__ void __launch_bounds__(kThreads)
    chunk_sumsq(const df_cu_optim_chunk *chunks, const float *g, const float *d_scale, double *partial) {
  __shared__ double red[32];
  const df_cu_optim_chunk c = chunks[blockIdx.x];
  const float sc = d_scale ? *d_scale : 1.0f;
  double s = 0.0;
  for (int i = threadIdx.x; i < c.len; i += kThreads) {
    const float x = d_scale ? g[c.start + i] * sc : g[c.start + i];
    s += (double)x * (double)x;
  }
  s = df_block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Plain buffer: chunk k covers [k·CHUNK, min(n, (k+1)·CHUNK)).
__global__ void __launch_bounds__(kThreads) plain_sumsq(const float *x, int64_t n, double *partial) {
  __shared__ double red[32];
  const int64_t start = (int64_t)blockIdx.x * DF_CU_OPTIM_CHUNK;
  const int64_t chunk = DF_CU_OPTIM_CHUNK, len = n - start < chunk ? n - start : chunk;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < len; i += kThreads) s += (double)x[start + i] * (double)x[start + i];
  s = df_block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out = sqrt(Σ partial) (take_sqrt) or Σ partial: thread t adds partials t, t + 1024, ... in order, then the tree.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_partials(const double *partial, int64_t n, double *out, bool take_sqrt) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kReduceThreads) s += partial[i];
  s = df_block_sum(s, red);
  if (threadIdx.x == 0) *out = take_sqrt ? sqrt(s) : s;
}

struct adamw_args {
  df_cu_adamw_coefs c, c0; // decay chunks, no-decay chunks
  const float *d_scale;
  const double *d_norm;
  double max_norm;
};

template <typename P>
__global__ void __launch_bounds__(kThreads) adamw_fused(const df_cu_optim_chunk *chunks, float *master, P *param,
                                                        const float *grad, float *m, float *v, adamw_args a) {
  float clip = 1.0f;
  if (a.d_norm) {
    const double norm = *a.d_norm;
    if (!isfinite(norm)) return; // a non-finite gradient: skip the step (the trainer sees the norm)
    if (a.max_norm > 0.0) {
      const double cf = a.max_norm / (norm + 1e-6);
      if (cf < 1.0) clip = (float)cf;
    }
  }
  const float sc = a.d_scale ? *a.d_scale : 1.0f;
  const df_cu_optim_chunk ch = chunks[blockIdx.x];
  const df_cu_adamw_coefs c = ch.decay ? a.c : a.c0;
  for (int i = threadIdx.x; i < ch.len; i += kThreads) {
    const int64_t k = ch.start + i;
    float g = grad[k];
    if (a.d_scale) g = g * sc;
    if (clip < 1.0f) g = g * clip;
    const float mi = m[k] * c.beta1 + c.a1 * g;
    const float vi = v[k] * c.beta2 + c.a2 * g * g;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    m[k] = mi, v[k] = vi;
    const float p = master[k] * c.decay + c.neg_step_size * mi / denom;
    master[k] = p;
    if (param) df_st(param + k, p);
  }
}

__global__ void adamw_plain_kernel(float *p, const float *g, float *m, float *v, int64_t n, df_cu_adamw_coefs c) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
    const float gk = g[k];
    const float mi = m[k] * c.beta1 + c.a1 * gk;
    const float vi = v[k] * c.beta2 + c.a2 * gk * gk;
    const float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    m[k] = mi, v[k] = vi;
    p[k] = p[k] * c.decay + c.neg_step_size * mi / denom;
  }
}

} // namespace

extern "C" df_status df_cu_optim_plan_make(const int64_t *offsets, const int64_t *lengths, const uint8_t *decay,
                                           int nspan, df_cu_optim_plan *p, df_error *err) {
  memset(p, 0, sizeof *p);
  int64_t n = 0;
  for (int i = 0; i < nspan; i++) {
    if (offsets[i] < 0 || lengths[i] < 0)
      return DF_FAIL(err, DF_ERR_INVALID, "spans", NULL, "span %d has offset %lld, length %lld", i,
                     (long long)offsets[i], (long long)lengths[i]);
    n += (lengths[i] + DF_CU_OPTIM_CHUNK - 1) / DF_CU_OPTIM_CHUNK;
  }
  p->h_chunks = (df_cu_optim_chunk *)malloc(sizeof(df_cu_optim_chunk) * (size_t)(n > 0 ? n : 1));
  if (!p->h_chunks) return DF_FAIL(err, DF_ERR_NOMEM, "spans", NULL, "cannot allocate %lld chunks", (long long)n);
  int64_t k = 0;
  for (int i = 0; i < nspan; i++)
    for (int64_t o = 0; o < lengths[i]; o += DF_CU_OPTIM_CHUNK) {
      const int64_t chunk = DF_CU_OPTIM_CHUNK, len = lengths[i] - o < chunk ? lengths[i] - o : chunk;
      p->h_chunks[k++] = (df_cu_optim_chunk){.start = offsets[i] + o, .len = (int32_t)len, .decay = decay[i] != 0};
    }
  p->nchunks = n;
  return DF_OK;
}

extern "C" void df_cu_optim_plan_free(df_cu_optim_plan *p) {
  free(p->h_chunks);
  memset(p, 0, sizeof *p);
}

extern "C" size_t df_cu_optim_norm_workspace(const df_cu_optim_plan *p) {
  return sizeof(double) * (size_t)(p->nchunks > 0 ? p->nchunks : 1);
}

extern "C" df_status df_cu_global_norm(df_cu_stream s, const df_cu_optim_plan *p, const float *grad,
                                       const float *d_grad_scale, void *workspace, double *d_norm, df_error *err) {
  double *partial = (double *)workspace;
  if (p->nchunks > 0) {
    if (p->nchunks > 2147483647) return DF_FAIL(err, DF_ERR_UNSUPPORTED, "global_norm", NULL, "too many chunks");
    chunk_sumsq<<<(unsigned)p->nchunks, kThreads, 0, s>>>(p->d_chunks, grad, d_grad_scale, partial);
    DF_CU_CHECK_LAUNCH(err, "global_norm.chunks");
  }
  reduce_partials<<<1, kReduceThreads, 0, s>>>(partial, p->nchunks, d_norm, true);
  DF_CU_CHECK_LAUNCH(err, "global_norm.reduce");
  return DF_OK;
}

extern "C" df_cu_adamw_coefs df_cu_adamw_coefs_of(float lr, float beta1, float beta2, float eps, float weight_decay,
                                                  int64_t step) {
  // The scalars rounded where torch rounds them (kernels/cpu/optim.c does the same).
  const double t = (double)step, bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
  df_cu_adamw_coefs c;
  c.decay = (float)(1.0 - (double)lr * (double)weight_decay);
  c.beta1 = beta1, c.a1 = (float)(1.0 - (double)beta1);
  c.beta2 = beta2, c.a2 = (float)(1.0 - (double)beta2);
  c.bc2_sqrt = (float)sqrt(bc2), c.eps = eps, c.neg_step_size = (float)(-(double)lr / bc1);
  return c;
}

extern "C" df_status df_cu_adamw(df_cu_stream s, const df_cu_optim_plan *p, float *master, void *param,
                                 df_dtype param_dt, const float *grad, float *m, float *v,
                                 const df_cu_adamw_coefs *coefs, const df_cu_adamw_coefs *coefs_nodecay,
                                 const float *d_grad_scale, const double *d_norm, double max_norm, df_error *err) {
  if (p->nchunks <= 0) return DF_OK;
  if (p->nchunks > 2147483647) return DF_FAIL(err, DF_ERR_UNSUPPORTED, "adamw", NULL, "too many chunks");
  adamw_args a;
  a.c = *coefs, a.c0 = *coefs_nodecay, a.d_scale = d_grad_scale, a.d_norm = d_norm, a.max_norm = max_norm;
  const unsigned blocks = (unsigned)p->nchunks;
  if (!param) {
    adamw_fused<float><<<blocks, kThreads, 0, s>>>(p->d_chunks, master, (float *)NULL, grad, m, v, a);
  } else if (param_dt == DF_BF16) {
    adamw_fused<bf16><<<blocks, kThreads, 0, s>>>(p->d_chunks, master, (bf16 *)param, grad, m, v, a);
  } else if (param_dt == DF_F32) {
    adamw_fused<float><<<blocks, kThreads, 0, s>>>(p->d_chunks, master, (float *)param, grad, m, v, a);
  } else {
    return df_cu_bad_dtype(err, "adamw.param", param_dt);
  }
  DF_CU_CHECK_LAUNCH(err, "adamw");
  return DF_OK;
}

extern "C" df_status df_cu_adamw_plain(df_cu_stream s, float *param, const float *grad, float *m, float *v, int64_t n,
                                       const df_cu_adamw_coefs *c, df_error *err) {
  if (n <= 0) return DF_OK;
  unsigned blocks = df_cu_blocks(n, kThreads);
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  adamw_plain_kernel<<<blocks, kThreads, 0, s>>>(param, grad, m, v, n, *c);
  DF_CU_CHECK_LAUNCH(err, "adamw_plain");
  return DF_OK;
}

extern "C" size_t df_cu_sumsq_workspace(int64_t n) {
  const int64_t k = (n + DF_CU_OPTIM_CHUNK - 1) / DF_CU_OPTIM_CHUNK;
  return sizeof(double) * (size_t)(k > 0 ? k : 1);
}

extern "C" df_status df_cu_sumsq(df_cu_stream s, const float *x, int64_t n, double *d_out, void *workspace,
                                 df_error *err) {
  const int64_t k = (n + DF_CU_OPTIM_CHUNK - 1) / DF_CU_OPTIM_CHUNK;
  double *partial = (double *)workspace;
  if (k > 0) {
    plain_sumsq<<<(unsigned)k, kThreads, 0, s>>>(x, n, partial);
    DF_CU_CHECK_LAUNCH(err, "sumsq.chunks");
  }
  reduce_partials<<<1, kReduceThreads, 0, s>>>(partial, k, d_out, false);
  DF_CU_CHECK_LAUNCH(err, "sumsq.reduce");
  return DF_OK;
}

// ---- the backend table's slots (the unfused, per-buffer op-interface pieces; fp32) -------------------------------

namespace {

constexpr int kNormBlock = 1 << 14, kNormLanes = 16; // kernels/cpu/optim.c's partition and lanes

// partial[first + k] = Σ x² of block k of x (kNormBlock elements, kNormLanes interleaved double accumulators, then
// the lanes in order): the CPU's arithmetic exactly (x² of an fp32 value is exact in double, so a fused
// multiply-add rounds the same), hence the same bits.
__global__ void cpu_order_sumsq(const float *x, int64_t n, double *partial) {
  __shared__ double lane_sum[kNormLanes];
  const int64_t lo = (int64_t)blockIdx.x * kNormBlock, len = n - lo < kNormBlock ? n - lo : kNormBlock;
  const int j = threadIdx.x;
  if (j < kNormLanes) {
    double acc = 0.0;
    for (int64_t i = j; i < len; i += kNormLanes) acc += (double)x[lo + i] * (double)x[lo + i];
    lane_sum[j] = acc;
  }
  __syncthreads();
  if (j == 0) {
    double s = 0.0;
    for (int l = 0; l < kNormLanes; l++) s += lane_sum[l];
    partial[blockIdx.x] = s;
  }
}

__global__ void sum_in_order(const double *partial, int64_t n, double *out) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int64_t k = 0; k < n; k++) s += partial[k];
  *out = s;
}

} // namespace

static df_status cuda_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                                 const df_adamw_hparams *hp, df_error *err) {
  const df_cu_adamw_coefs c = df_cu_adamw_coefs_of(hp->lr, hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->step);
  return df_cu_adamw_plain(df_cuda_cu_stream(ctx), (float *)param->data, (const float *)grad->data, (float *)m->data,
                           (float *)v->data, df_numel(param), &c, err);
}

// The norm is returned on the host (the op's contract), so this op synchronises once.
static df_status cuda_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err) {
  int64_t total = 0;
  for (int b = 0; b < nbufs; b++) total += (df_numel(&bufs[b]) + kNormBlock - 1) / kNormBlock;
  double *partial = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)(total + 1), (void **)&partial, err));
  if (df_ctx_measure_only(ctx)) return *norm = 0.0, DF_OK; // measure path: the workspace, and the norm of zeros
  const cudaStream_t s = df_cuda_stream(ctx);
  int64_t first = 0;
  for (int b = 0; b < nbufs; b++) {
    const int64_t n = df_numel(&bufs[b]), nb = (n + kNormBlock - 1) / kNormBlock;
    if (nb == 0) continue;
    cpu_order_sumsq<<<(unsigned)nb, 32, 0, s>>>((const float *)bufs[b].data, n, partial + first);
    DF_CU_CHECK_LAUNCH(err, "global_norm.blocks");
    first += nb;
  }
  sum_in_order<<<1, 32, 0, s>>>(partial, total, partial + total);
  DF_CU_CHECK_LAUNCH(err, "global_norm.sum");
  double sum = 0.0;
  DF_CU_TRY(err, cudaMemcpyAsync(&sum, partial + total, sizeof sum, cudaMemcpyDeviceToHost, s), "global_norm (read)");
  DF_CU_TRY(err, cudaStreamSynchronize(s), "global_norm (sync)");
  *norm = sqrt(sum);
  return DF_OK;
}

static df_status cuda_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                                   df_error *err) {
  const double c = max_norm / (norm + 1e-6);
  *coef = c < 1.0 ? c : 1.0;
  if (c >= 1.0) return DF_OK;
  for (int b = 0; b < nbufs; b++)
    DF_TRY(df_cu_scale(df_cuda_cu_stream(ctx), bufs[b].data, DF_F32, df_numel(&bufs[b]), (float)c, NULL, err));
  return DF_OK;
}

extern "C" void df_cuda_register_optim(df_backend *be) {
  be->adamw_step = cuda_adamw_step;
  be->global_norm = cuda_global_norm;
  be->measures[DF_OP_GLOBAL_NORM] = true;
  be->clip_by_norm = cuda_clip_by_norm;
}
