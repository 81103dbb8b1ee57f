// CUDA DSpark loss pieces outside the fused head (the CPU twin: kernels/cpu/dspark_loss.c): the softmax L1 distance
// between draft and teacher logit rows (a thread block per row; sums in double, fixed reduction trees), and BCE
// with logits elementwise, in double like the CPU.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/lmhead_rows.cuh"

namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ float sign_of(float d) { return (float)((d > 0.0f) - (d < 0.0f)); }

// forward: l1[r] = Σ |P − Q|; backward: dp = dl1·P·(sign(P − Q) − Σ sign·P).
__global__ void __launch_bounds__(kThreads)
    softmax_l1_kernel(const float *p, const float *q, const float *dl1, float *l1, float *dp, int64_t V) {
  __shared__ df_row_stats scratch[32];
  __shared__ double red[32];
  const int64_t r = blockIdx.x;
  const float *pr = p + r * V, *qr = q + r * V;
  const df_row_stats sp = df_row_stats_of(pr, V, scratch);
  const df_row_stats sq = df_row_stats_of(qr, V, scratch);
  const float ip = (float)(1.0 / sp.s), iq = (float)(1.0 / sq.s);
  double acc = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float P = expf(pr[v] - sp.m) * ip, Q = expf(qr[v] - sq.m) * iq;
    acc += dp ? (double)(sign_of(P - Q) * P) : fabs((double)P - (double)Q);
  }
  acc = df_block_sum(acc, red);
  if (!dp) {
    if (threadIdx.x == 0) l1[r] = (float)acc;
    return;
  }
  const float g = dl1[r], af = (float)acc;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float P = expf(pr[v] - sp.m) * ip, Q = expf(qr[v] - sq.m) * iq;
    dp[r * V + v] = g * P * (sign_of(P - Q) - af);
  }
}

__device__ __forceinline__ double sigmoid_d(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

__global__ void bce_kernel(const float *x, const float *t, const float *dloss, float *out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double xi = x[i];
    if (dloss)
      out[i] = (float)((double)dloss[i] * (sigmoid_d(xi) - (double)t[i]));
    else
      out[i] = (float)(fmax(xi, 0.0) - xi * t[i] + log1p(exp(-fabs(xi))));
  }
}

} // namespace

extern "C" df_status df_cu_softmax_l1_fwd(df_cu_stream s, const float *p, const float *q, float *l1, int64_t R,
                                          int64_t V, df_error *err) {
  if (R <= 0) return DF_OK;
  softmax_l1_kernel<<<(unsigned)R, kThreads, 0, s>>>(p, q, NULL, l1, NULL, V);
  DF_CU_CHECK_LAUNCH(err, "softmax_l1_fwd");
  return DF_OK;
}

extern "C" df_status df_cu_softmax_l1_bwd(df_cu_stream s, const float *p, const float *q, const float *dl1, float *dp,
                                          int64_t R, int64_t V, df_error *err) {
  if (R <= 0) return DF_OK;
  softmax_l1_kernel<<<(unsigned)R, kThreads, 0, s>>>(p, q, dl1, NULL, dp, V);
  DF_CU_CHECK_LAUNCH(err, "softmax_l1_bwd");
  return DF_OK;
}

extern "C" df_status df_cu_bce_logits_fwd(df_cu_stream s, const float *x, const float *t, float *loss, int64_t n,
                                          df_error *err) {
  if (n <= 0) return DF_OK;
  const unsigned b = df_cu_blocks(n, 256), grid = b < 65535u ? b : 65535u;
  bce_kernel<<<grid, 256, 0, s>>>(x, t, NULL, loss, n);
  DF_CU_CHECK_LAUNCH(err, "bce_logits_fwd");
  return DF_OK;
}

extern "C" df_status df_cu_bce_logits_bwd(df_cu_stream s, const float *x, const float *t, const float *dloss, float *dx,
                                          int64_t n, df_error *err) {
  if (n <= 0) return DF_OK;
  const unsigned b = df_cu_blocks(n, 256), grid = b < 65535u ? b : 65535u;
  bce_kernel<<<grid, 256, 0, s>>>(x, t, dloss, dx, n);
  DF_CU_CHECK_LAUNCH(err, "bce_logits_bwd");
  return DF_OK;
}

// ---- the backend table's slots (fp32 logits) ---------------------------------------------------------------------

static df_status cuda_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1,
                                         df_error *err) {
  return df_cu_softmax_l1_fwd(df_cuda_cu_stream(ctx), (const float *)p->data, (const float *)q->data, (float *)l1->data,
                              df_rows(p), df_last_dim(p), err);
}

static df_status cuda_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                          df_tensor *dp, df_error *err) {
  return df_cu_softmax_l1_bwd(df_cuda_cu_stream(ctx), (const float *)p->data, (const float *)q->data,
                              (const float *)dl1->data, (float *)dp->data, df_rows(p), df_last_dim(p), err);
}

static df_status cuda_bce_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss, df_error *err) {
  return df_cu_bce_logits_fwd(df_cuda_cu_stream(ctx), (const float *)x->data, (const float *)t->data,
                              (float *)loss->data, df_numel(x), err);
}

static df_status cuda_bce_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                   df_tensor *dx, df_error *err) {
  return df_cu_bce_logits_bwd(df_cuda_cu_stream(ctx), (const float *)x->data, (const float *)t->data,
                              (const float *)dloss->data, (float *)dx->data, df_numel(x), err);
}

extern "C" void df_cuda_register_dspark_loss(df_backend *be) {
  be->softmax_l1_forward = cuda_softmax_l1_forward;
  be->softmax_l1_backward = cuda_softmax_l1_backward;
  be->bce_logits_forward = cuda_bce_forward;
  be->bce_logits_backward = cuda_bce_backward;
}
