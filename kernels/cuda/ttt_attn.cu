// CUDA twin of the training-time-test attention (kernels/eagle3.h; the CPU oracle is kernels/cpu/ttt_attn.c).
// Forward: one warp per (sample, position, head); the lanes split the head dim and walk step 0's causal keys and the
// diagonal keys of steps 1 .. i once with an online softmax. Backward: one warp per (sample, position, kv head) for dq
// and the diagonal keys (the heads of a group in turn, so one warp owns each diagonal key row), then one warp per
// (sample, key position, kv head) for step 0's keys, summing the queries that see it in a fixed order: no atomics.
// fp32 storage. Plain and correct first; tiling comes with the GPU work.
#include <math.h>

#include "kernels/context.h"
#include "kernels/cuda/backend.h"

enum { TTT_MAX_PER_LANE = 8 }; // head_dim <= 256

typedef struct {
  int64_t B, S, nH, hd, nKV, i, grp;
  float scale;
} ttt_shape;

__device__ __forceinline__ int64_t ttt_kv(const ttt_shape &d, int64_t m, int64_t b, int64_t j, int64_t g) {
  return (((m * d.B + b) * d.S + j) * d.nKV + g) * d.hd;
}

__device__ __forceinline__ float ttt_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The x-th visible key row of query (b, p): step 0's position x for x < n0, else step x − n0 + 1 at p.
__device__ __forceinline__ int64_t ttt_key_row(const ttt_shape &d, int64_t b, int64_t p, int64_t g, int64_t n0,
                                               int64_t x) {
  return x < n0 ? ttt_kv(d, 0, b, x, g) : ttt_kv(d, x - n0 + 1, b, p, g);
}

__global__ void ttt_fwd_kernel(ttt_shape d, const float *q, const float *k, const float *v, const int32_t *len,
                               float *out, float *lse) {
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= d.B * d.S * d.nH) return;
  const int64_t h = warp % d.nH, p = warp / d.nH % d.S, b = warp / (d.nH * d.S), g = h / d.grp;
  const int64_t L = len[b], n0 = (p < L - 1 ? p : L - 1) + 1, n = n0 + d.i;
  const float *qp = q + ((b * d.S + p) * d.nH + h) * d.hd;
  float qv[TTT_MAX_PER_LANE], acc[TTT_MAX_PER_LANE];
  for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
    const int64_t x = lane + 32 * e;
    qv[e] = x < d.hd ? qp[x] : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t x = 0; x < n; x++) {
    const int64_t row = ttt_key_row(d, b, p, g, n0, x);
    float dot = 0.0f;
    for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
      const int64_t y = lane + 32 * e;
      if (y < d.hd) dot += qv[e] * k[row + y];
    }
    const float s = ttt_warp_sum(dot) * d.scale, mn = fmaxf(m, s), c = expf(m - mn), w = expf(s - mn);
    l = l * c + w;
    for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
      const int64_t y = lane + 32 * e;
      if (y < d.hd) acc[e] = acc[e] * c + w * v[row + y];
    }
    m = mn;
  }
  float *op = out + ((b * d.S + p) * d.nH + h) * d.hd;
  for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
    const int64_t y = lane + 32 * e;
    if (y < d.hd) op[y] = acc[e] / l;
  }
  if (lane == 0) lse[(b * d.S + p) * d.nH + h] = m + logf(l);
}

// dq, D = Σ dout·out, and the diagonal keys' gradients of query row (b, p) for every head of kv group g.
__global__ void ttt_bwd_query_kernel(ttt_shape d, const float *q, const float *k, const float *v, const int32_t *len,
                                     const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                     float *dv, float *Dsave) {
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= d.B * d.S * d.nKV) return;
  const int64_t g = warp % d.nKV, p = warp / d.nKV % d.S, b = warp / (d.nKV * d.S);
  const int64_t L = len[b], n0 = (p < L - 1 ? p : L - 1) + 1, n = n0 + d.i;
  for (int64_t h = g * d.grp; h < (g + 1) * d.grp; h++) {
    const int64_t r = (b * d.S + p) * d.nH + h;
    const float *qp = q + r * d.hd, *go = dout + r * d.hd, *op = out + r * d.hd;
    float qv[TTT_MAX_PER_LANE], gv[TTT_MAX_PER_LANE], acc[TTT_MAX_PER_LANE], Dp = 0.0f;
    for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
      const int64_t y = lane + 32 * e;
      qv[e] = y < d.hd ? qp[y] : 0.0f;
      gv[e] = y < d.hd ? go[y] : 0.0f;
      acc[e] = 0.0f;
      Dp += y < d.hd ? gv[e] * op[y] : 0.0f;
    }
    Dp = ttt_warp_sum(Dp);
    if (lane == 0) Dsave[r] = Dp;
    for (int64_t x = 0; x < n; x++) {
      const int64_t row = ttt_key_row(d, b, p, g, n0, x);
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
        const int64_t y = lane + 32 * e;
        if (y < d.hd) s += qv[e] * k[row + y], dp += gv[e] * v[row + y];
      }
      s = ttt_warp_sum(s), dp = ttt_warp_sum(dp);
      const float P = expf(s * d.scale - lse[r]), ds = P * (dp - Dp) * d.scale;
      for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
        const int64_t y = lane + 32 * e;
        if (y >= d.hd) continue;
        acc[e] += ds * k[row + y];
        if (x >= n0) dk[row + y] += ds * qv[e], dv[row + y] += P * gv[e]; // this warp owns the diagonal row
      }
    }
    for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
      const int64_t y = lane + 32 * e;
      if (y < d.hd) dq[r * d.hd + y] = acc[e];
    }
  }
}

// Step 0's key row (b, j, g): every query p >= j of the group's heads (none when j is padding).
__global__ void ttt_bwd_key_kernel(ttt_shape d, const float *q, const float *k, const float *v, const int32_t *len,
                                   const float *lse, const float *dout, const float *Dsave, float *dk, float *dv) {
  const int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= d.B * d.S * d.nKV) return;
  const int64_t g = warp % d.nKV, j = warp / d.nKV % d.S, b = warp / (d.nKV * d.S);
  if (j >= len[b]) return;
  const int64_t row = ttt_kv(d, 0, b, j, g);
  float kv_[TTT_MAX_PER_LANE], vv[TTT_MAX_PER_LANE], gk[TTT_MAX_PER_LANE], gvv[TTT_MAX_PER_LANE];
  for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
    const int64_t y = lane + 32 * e;
    kv_[e] = y < d.hd ? k[row + y] : 0.0f;
    vv[e] = y < d.hd ? v[row + y] : 0.0f;
    gk[e] = gvv[e] = 0.0f;
  }
  for (int64_t h = g * d.grp; h < (g + 1) * d.grp; h++)
    for (int64_t p = j; p < d.S; p++) {
      const int64_t r = (b * d.S + p) * d.nH + h;
      const float *qp = q + r * d.hd, *go = dout + r * d.hd;
      float s = 0.0f, dp = 0.0f;
      for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
        const int64_t y = lane + 32 * e;
        if (y < d.hd) s += qp[y] * kv_[e], dp += go[y] * vv[e];
      }
      s = ttt_warp_sum(s), dp = ttt_warp_sum(dp);
      const float P = expf(s * d.scale - lse[r]), ds = P * (dp - Dsave[r]) * d.scale;
      for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
        const int64_t y = lane + 32 * e;
        if (y < d.hd) gk[e] += ds * qp[y], gvv[e] += P * go[y];
      }
    }
  for (int e = 0; e < TTT_MAX_PER_LANE; e++) {
    const int64_t y = lane + 32 * e;
    if (y < d.hd) dk[row + y] += gk[e], dv[row + y] += gvv[e];
  }
}

static ttt_shape shape_of(const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k) {
  ttt_shape d;
  d.B = q->shape[0], d.S = q->shape[1], d.nH = q->shape[2], d.hd = q->shape[3], d.nKV = k->shape[2];
  d.i = desc->step, d.grp = d.nH / d.nKV, d.scale = desc->scale;
  return d;
}

static df_status check_hd(int64_t hd, df_error *err) {
  if (hd <= 32 * TTT_MAX_PER_LANE) return DF_OK;
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "q", "head_dim up to 256 is supported on CUDA",
                 "head_dim %lld is too large for the CUDA TTT attention", (long long)hd);
}

static unsigned warps_grid(int64_t warps, int threads) { return (unsigned)((warps * 32 + threads - 1) / threads); }

static df_status cuda_ttt_attn_forward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q,
                                       const df_tensor *k, const df_tensor *v, const df_tensor *lengths, df_tensor *out,
                                       df_tensor *lse, df_error *err) {
  const ttt_shape d = shape_of(desc, q, k);
  DF_TRY(check_hd(d.hd, err));
  ttt_fwd_kernel<<<warps_grid(d.B * d.S * d.nH, 128), 128, 0, df_cuda_stream(ctx)>>>(
      d, (const float *)q->data, (const float *)k->data, (const float *)v->data, (const int32_t *)lengths->data,
      (float *)out->data, (float *)lse->data);
  DF_CUDA_CHECK_LAUNCH(err, "ttt_fwd_kernel");
  return DF_OK;
}

static df_status cuda_ttt_attn_backward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q,
                                        const df_tensor *k, const df_tensor *v, const df_tensor *lengths,
                                        const df_tensor *out, const df_tensor *lse, const df_tensor *dout,
                                        df_tensor *dq, df_tensor *dk, df_tensor *dv, df_error *err) {
  const ttt_shape d = shape_of(desc, q, k);
  DF_TRY(check_hd(d.hd, err));
  float *Dsave = NULL;
  DF_TRY(df_ctx_workspace(ctx, 1, sizeof(float) * (size_t)(d.B * d.S * d.nH), (void **)&Dsave, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  cudaStream_t s = df_cuda_stream(ctx);
  const unsigned grid = warps_grid(d.B * d.S * d.nKV, 128);
  ttt_bwd_query_kernel<<<grid, 128, 0, s>>>(d, (const float *)q->data, (const float *)k->data, (const float *)v->data,
                                            (const int32_t *)lengths->data, (const float *)out->data,
                                            (const float *)lse->data, (const float *)dout->data, (float *)dq->data,
                                            (float *)dk->data, (float *)dv->data, Dsave);
  DF_CUDA_CHECK_LAUNCH(err, "ttt_bwd_query_kernel");
  ttt_bwd_key_kernel<<<grid, 128, 0, s>>>(d, (const float *)q->data, (const float *)k->data, (const float *)v->data,
                                          (const int32_t *)lengths->data, (const float *)lse->data,
                                          (const float *)dout->data, Dsave, (float *)dk->data, (float *)dv->data);
  DF_CUDA_CHECK_LAUNCH(err, "ttt_bwd_key_kernel");
  return DF_OK;
}

extern "C" void df_cuda_register_ttt_attn(df_backend *be) {
  be->ttt_attn_forward = cuda_ttt_attn_forward;
  be->ttt_attn_backward = cuda_ttt_attn_backward;
  be->measures[DF_OP_TTT_ATTN_BACKWARD] = true;
}
