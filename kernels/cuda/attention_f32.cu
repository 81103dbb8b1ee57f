// CUDA block attention in fp32 on the CUDA cores: the exact path (fp32 storage, and the GPU cross-check of the
// tensor-core kernels). One warp per query row walks exactly its visible keys (context [lo_row, anchor), then its
// own block) with an online softmax; lanes hold head-dim slices. The backward: dq per query row, and dk/dv per key
// row, each key row's warp visiting its query rows in (block, head, offset) order: deterministic, no atomics.
// Dot products reduce with an xor butterfly, so every lane holds the same bits and branches stay uniform.
#include "kernels/attn_tiles.h"
#include "kernels/cuda/attention_f32.cuh"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;

struct geom32 {
  int64_t B, N, bs, S, nH, nKV, hd, W, G, Q, KV;
  float scale;
};

geom32 make_geom32(const df_cu_attn_args *a) {
  geom32 g;
  g.B = a->B, g.N = a->N, g.bs = a->bs, g.S = a->S, g.nH = a->nH, g.nKV = a->nKV, g.hd = a->hd, g.W = a->window;
  g.G = g.nH / g.nKV, g.Q = g.N * g.bs, g.KV = g.S + g.Q, g.scale = a->scale;
  return g;
}

// A query row: q-order index row = (b·Q + qi)·nH + h.
struct qrow {
  int64_t b, qi, n, o, h, kh, a;
  bool keep;
};

__device__ qrow decode_row(const geom32 &g, int64_t row, const int32_t *anchors, const uint8_t *keep) {
  qrow r;
  r.h = row % g.nH;
  const int64_t tok = row / g.nH;
  r.b = tok / g.Q, r.qi = tok % g.Q, r.n = r.qi / g.bs, r.o = r.qi % g.bs, r.kh = r.h / g.G;
  r.keep = keep[r.b * g.N + r.n] != 0;
  r.a = anchors[r.b * g.N + r.n];
  return r;
}

__device__ __forceinline__ int64_t koff(const geom32 &g, int64_t b, int64_t j, int64_t kh) {
  return ((b * g.KV + j) * g.nKV + kh) * g.hd;
}
__device__ __forceinline__ int64_t lseoff(const geom32 &g, int64_t b, int64_t h, int64_t qi) {
  return (b * g.nH + h) * g.Q + qi;
}

// Lane-sliced row x[d] for d = lane + 32·i into regs (0 beyond hd), times mult.
template <int NV, typename T> __device__ void load_slice(const T *x, int64_t hd, float mult, float *regs) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t d = lane + 32 * i;
    regs[i] = d < hd ? mult * df_ld(x + d) : 0.0f;
  }
}

template <int NV, typename T> __device__ float dot_slice(const float *regs, const T *y, int64_t hd) {
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t d = lane + 32 * i;
    if (d < hd) s += regs[i] * df_ld(y + d);
  }
  return df_warp_sum(s);
}

// The row's visible keys as two ranges: context [c0, c1), block offsets [0, b1).
__device__ void visible_ranges(const geom32 &g, const qrow &r, int64_t *c0, int64_t *c1, int64_t *b1) {
  int64_t lo = g.W > 0 ? r.a + r.o - (g.W - 1) : 0;
  *c0 = lo > 0 ? lo : 0;
  *c1 = r.a;
  *b1 = g.W > 0 ? r.o + 1 : g.bs;
}

template <typename TI, typename TO, int NV>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_f32(geom32 g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep, TO *out,
                 float *lse) {
  const int64_t row = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5);
  if (row >= g.B * g.Q * g.nH) return;
  const int lane = threadIdx.x & 31;
  const qrow r = decode_row(g, row, anchors, keep);
  TO *orow = out + row * g.hd;
  if (!r.keep) {
    for (int64_t d = lane; d < g.hd; d += 32) df_st(orow + d, 0.0f);
    if (lane == 0) lse[lseoff(g, r.b, r.h, r.qi)] = -INFINITY;
    return;
  }
  float qv[NV], acc[NV];
  load_slice<NV>(q + row * g.hd, g.hd, g.scale, qv);
#pragma unroll
  for (int i = 0; i < NV; i++) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  int64_t c0, c1, b1;
  visible_ranges(g, r, &c0, &c1, &b1);
  const int64_t nctx = c1 > c0 ? c1 - c0 : 0;
  for (int64_t t = 0; t < nctx + b1; t++) {
    const int64_t j = t < nctx ? c0 + t : g.S + r.n * g.bs + (t - nctx);
    const float s = dot_slice<NV>(qv, k + koff(g, r.b, j, r.kh), g.hd);
    float vv[NV];
    load_slice<NV>(v + koff(g, r.b, j, r.kh), g.hd, 1.0f, vv);
    if (s > m) { // new running max: rescale what was summed so far
      const float alpha = expf(m - s);
      m = s;
      l = l * alpha + 1.0f;
#pragma unroll
      for (int i = 0; i < NV; i++) acc[i] = acc[i] * alpha + vv[i];
    } else {
      const float p = expf(s - m);
      l += p;
#pragma unroll
      for (int i = 0; i < NV; i++) acc[i] += p * vv[i];
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t d = lane + 32 * i;
    if (d < g.hd) df_st(orow + d, acc[i] * inv);
  }
  if (lane == 0) lse[lseoff(g, r.b, r.h, r.qi)] = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <typename TI, typename TG, int NV>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_f32(geom32 g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep,
                    const float *lse, const float *D, const TG *dout, TG *dq) {
  const int64_t row = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5);
  if (row >= g.B * g.Q * g.nH) return;
  const int lane = threadIdx.x & 31;
  const qrow r = decode_row(g, row, anchors, keep);
  TG *dqrow = dq + row * g.hd;
  if (!r.keep) {
    for (int64_t d = lane; d < g.hd; d += 32) df_st(dqrow + d, 0.0f);
    return;
  }
  float qv[NV], dov[NV], acc[NV];
  load_slice<NV>(q + row * g.hd, g.hd, g.scale, qv);
  load_slice<NV>(dout + row * g.hd, g.hd, 1.0f, dov);
#pragma unroll
  for (int i = 0; i < NV; i++) acc[i] = 0.0f;
  const float L = lse[lseoff(g, r.b, r.h, r.qi)], Dr = D[lseoff(g, r.b, r.h, r.qi)];
  int64_t c0, c1, b1;
  visible_ranges(g, r, &c0, &c1, &b1);
  const int64_t nctx = c1 > c0 ? c1 - c0 : 0;
  for (int64_t t = 0; t < nctx + b1; t++) {
    const int64_t j = t < nctx ? c0 + t : g.S + r.n * g.bs + (t - nctx);
    const TI *kr = k + koff(g, r.b, j, r.kh);
    const float p = expf(dot_slice<NV>(qv, kr, g.hd) - L);
    const float ds = p * (dot_slice<NV>(dov, v + koff(g, r.b, j, r.kh), g.hd) - Dr);
    float kv[NV];
    load_slice<NV>(kr, g.hd, 1.0f, kv);
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] += ds * kv[i];
  }
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t d = lane + 32 * i;
    if (d < g.hd) df_st(dqrow + d, g.scale * acc[i]);
  }
}

template <typename TI, typename TG, int NV>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkv_f32(geom32 g, const TI *q, const TI *k, const TI *v, const int32_t *anchors, const uint8_t *keep,
                     const float *lse, const float *D, const TG *dout, TG *dk, TG *dv) {
  const int64_t krow = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5); // (b, j, kh) in k order
  if (krow >= g.B * g.KV * g.nKV) return;
  const int lane = threadIdx.x & 31;
  const int64_t kh = krow % g.nKV, j = krow / g.nKV % g.KV, b = krow / g.nKV / g.KV;
  float kv[NV], vv[NV], ak[NV], av[NV];
  load_slice<NV>(k + krow * g.hd, g.hd, 1.0f, kv);
  load_slice<NV>(v + krow * g.hd, g.hd, 1.0f, vv);
#pragma unroll
  for (int i = 0; i < NV; i++) ak[i] = 0.0f, av[i] = 0.0f;
  const bool block = j >= g.S;
  const int64_t n0 = block ? (j - g.S) / g.bs : 0, n1 = block ? n0 + 1 : g.N, jj = block ? (j - g.S) % g.bs : j;
  for (int64_t n = n0; n < n1; n++) {
    if (!keep[b * g.N + n]) continue;
    const int64_t a = anchors[b * g.N + n];
    if (!block && !(j < a && j >= df_attn_ctx_lo(a, g.W))) continue;
    for (int64_t hq = 0; hq < g.G; hq++) {
      const int64_t h = kh * g.G + hq;
      for (int64_t o = 0; o < g.bs; o++) {
        if (!df_attn_visible(a, g.W, g.bs, o, block, jj)) continue;
        const int64_t qi = n * g.bs + o, row = (b * g.Q + qi) * g.nH + h;
        float qv[NV], dov[NV];
        load_slice<NV>(q + row * g.hd, g.hd, g.scale, qv);
        load_slice<NV>(dout + row * g.hd, g.hd, 1.0f, dov);
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; i++) s += qv[i] * kv[i], dp += dov[i] * vv[i];
        s = df_warp_sum(s), dp = df_warp_sum(dp);
        const float p = expf(s - lse[lseoff(g, b, h, qi)]);
        const float ds = p * (dp - D[lseoff(g, b, h, qi)]);
#pragma unroll
        for (int i = 0; i < NV; i++) ak[i] += ds * qv[i], av[i] += p * dov[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int64_t d = lane + 32 * i;
    if (d < g.hd) df_st(dk + krow * g.hd + d, ak[i]), df_st(dv + krow * g.hd + d, av[i]);
  }
}

template <typename TI, typename TO, int NV>
df_status fwd_nv(cudaStream_t s, const geom32 &g, const df_cu_attn_args *a, df_error *err) {
  const int64_t rows = g.B * g.Q * g.nH;
  attn_fwd_f32<TI, TO, NV><<<df_cu_blocks(rows, kWarps), kThreads, 0, s>>>(
      g, (const TI *)a->q, (const TI *)a->k, (const TI *)a->v, a->anchors, a->keep, (TO *)a->out, a->lse);
  DF_CU_CHECK_LAUNCH(err, "block_attn_fwd (fp32)");
  return DF_OK;
}

template <typename TI, typename TG, int NV>
df_status bwd_nv(cudaStream_t s, const geom32 &g, const df_cu_attn_args *a, const float *D, df_error *err) {
  const int64_t rows = g.B * g.Q * g.nH, krows = g.B * g.KV * g.nKV;
  attn_bwd_dq_f32<TI, TG, NV><<<df_cu_blocks(rows, kWarps), kThreads, 0, s>>>(
      g, (const TI *)a->q, (const TI *)a->k, (const TI *)a->v, a->anchors, a->keep, a->lse, D, (const TG *)a->dout,
      (TG *)a->dq);
  DF_CU_CHECK_LAUNCH(err, "block_attn_bwd_dq (fp32)");
  attn_bwd_dkv_f32<TI, TG, NV><<<df_cu_blocks(krows, kWarps), kThreads, 0, s>>>(
      g, (const TI *)a->q, (const TI *)a->k, (const TI *)a->v, a->anchors, a->keep, a->lse, D, (const TG *)a->dout,
      (TG *)a->dk, (TG *)a->dv);
  DF_CU_CHECK_LAUNCH(err, "block_attn_bwd_dkv (fp32)");
  return DF_OK;
}

df_status check_hd(const df_cu_attn_args *a, df_error *err) {
  if (a->hd < 1 || a->hd > 256)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "block_attn", NULL, "head_dim %lld outside [1, 256]", (long long)a->hd);
  return DF_OK;
}

} // namespace

// Lane slices per head dim: ceil(hd / 32) rounded up to 1, 2, 4 or 8.
#define DF_ATTN_NV_SWITCH(hd, NV, ...)                                                                                 \
  do {                                                                                                                 \
    if ((hd) <= 32) {                                                                                                  \
      constexpr int NV = 1;                                                                                            \
      __VA_ARGS__;                                                                                                     \
    } else if ((hd) <= 64) {                                                                                           \
      constexpr int NV = 2;                                                                                            \
      __VA_ARGS__;                                                                                                     \
    } else if ((hd) <= 128) {                                                                                          \
      constexpr int NV = 4;                                                                                            \
      __VA_ARGS__;                                                                                                     \
    } else {                                                                                                           \
      constexpr int NV = 8;                                                                                            \
      __VA_ARGS__;                                                                                                     \
    }                                                                                                                  \
  } while (0)

df_status df_cu_attn_f32_fwd(cudaStream_t s, const df_cu_attn_args *a, df_error *err) {
  DF_TRY(check_hd(a, err));
  const geom32 g = make_geom32(a);
  DF_CU_SWITCH_DT(a->in_dt, TI, err, "block_attn.q",
                  DF_CU_SWITCH_DT(a->out_dt, TO, err, "block_attn.out",
                                  DF_ATTN_NV_SWITCH(a->hd, NV, return fwd_nv<TI, TO, NV>(s, g, a, err))));
}

df_status df_cu_attn_f32_bwd(cudaStream_t s, const df_cu_attn_args *a, const float *D, df_error *err) {
  DF_TRY(check_hd(a, err));
  const geom32 g = make_geom32(a);
  DF_CU_SWITCH_DT(a->in_dt, TI, err, "block_attn.q",
                  DF_CU_SWITCH_DT(a->grad_dt, TG, err, "block_attn.dq",
                                  DF_ATTN_NV_SWITCH(a->hd, NV, return bwd_nv<TI, TG, NV>(s, g, a, D, err))));
}
