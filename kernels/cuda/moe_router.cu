// CUDA MoE router in fp32 (the CPU twin: moe/router.c): score functions evaluated in double and stored fp32,
// selection per token in one warp (selection bias, group-limited masking to −inf, top-k best first with ties to
// the lower expert id, combine weights from the unbiased scores, renormalised with + 1e−20, scaled), per-expert
// counts by integer atomics (order-independent), and the backward of weights and scores.
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kMaxE = 1024, kMaxK = 32, kPerLane = kMaxE / 32, kMaxGroups = 256;

__device__ __forceinline__ double softplus_d(double z) { return (z > 0 ? z : 0.0) + log1p(exp(-fabs(z))); }
__device__ __forceinline__ double sigmoid_d(double z) { return 1.0 / (1.0 + exp(-z)); }

__global__ void __launch_bounds__(kThreads)
    scores_fwd_kernel(df_cu_score_func f, int64_t T, int64_t E, const float *logits, float *scores) {
  const int64_t t = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float *l = logits + t * E;
  float *s = scores + t * E;
  if (f == DF_CU_SCORE_SOFTMAX) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t e = lane; e < E; e += 32) mx = fmax(mx, (double)l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int64_t e = lane; e < E; e += 32) sum += exp((double)l[e] - mx);
    sum = df_warp_sum(sum);
    for (int64_t e = lane; e < E; e += 32) s[e] = (float)(exp((double)l[e] - mx) / sum);
  } else if (f == DF_CU_SCORE_SIGMOID) {
    for (int64_t e = lane; e < E; e += 32) s[e] = (float)sigmoid_d(l[e]);
  } else {
    for (int64_t e = lane; e < E; e += 32) s[e] = (float)sqrt(softplus_d(l[e]));
  }
}

__global__ void __launch_bounds__(kThreads)
    scores_bwd_kernel(df_cu_score_func f, int64_t T, int64_t E, const float *logits, const float *scores,
                      const float *dscores, float *dlogits) {
  const int64_t t = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float *l = logits + t * E, *s = scores + t * E, *ds = dscores + t * E;
  float *dl = dlogits + t * E;
  if (f == DF_CU_SCORE_SOFTMAX) {
    double dot = 0.0;
    for (int64_t e = lane; e < E; e += 32) dot += (double)ds[e] * s[e];
    dot = df_warp_sum(dot); // every lane has read its ds before any lane writes dl (which may alias ds)
    for (int64_t e = lane; e < E; e += 32) dl[e] = (float)((double)s[e] * ((double)ds[e] - dot));
  } else if (f == DF_CU_SCORE_SIGMOID) {
    for (int64_t e = lane; e < E; e += 32) {
      const double p = sigmoid_d(l[e]);
      dl[e] = (float)(ds[e] * p * (1.0 - p));
    }
  } else {
    for (int64_t e = lane; e < E; e += 32) {
      const double r = sqrt(softplus_d(l[e]));
      dl[e] = r > 0 ? (float)(ds[e] * sigmoid_d(l[e]) / (2.0 * r)) : 0.0f;
    }
  }
}

// One warp per token; row (E) and group scores live in this warp's shared slice.
__global__ void __launch_bounds__(kThreads)
    select_kernel(df_cu_router_spec sp, int64_t T, const float *scores, const float *shift, int32_t *indices,
                  float *weights, int32_t *counts) {
  __shared__ float rows[kWarps][kMaxE];
  __shared__ float gsc[kWarps][kMaxGroups];
  __shared__ uint8_t gkeep[kWarps][kMaxGroups];
  __shared__ int32_t picked[kWarps][kMaxK];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = blockIdx.x * (int64_t)kWarps + w;
  if (t >= T) return;
  const int64_t E = sp.E, k = sp.k, G = sp.n_group, gsz = E / G;
  const float *sc = scores + t * E;
  float *row = rows[w];
  // A NaN selection score is treated as −inf, so every round of the argmax below has a candidate.
  for (int64_t e = lane; e < E; e += 32) {
    const float x = shift ? sc[e] + shift[e] : sc[e];
    row[e] = isnan(x) ? -INFINITY : x;
  }
  __syncwarp();
  if (sp.topk_group < G) {
    // Group score: top1 + top2 of the group (top1 alone for groups of one), scanned in expert order.
    for (int64_t g = lane; g < G; g += 32) {
      const float *v = row + g * gsz;
      float top1 = v[0], top2 = -INFINITY;
      for (int64_t i = 1; i < gsz; i++) {
        if (v[i] > top1) {
          top2 = top1, top1 = v[i];
        } else if (v[i] > top2) {
          top2 = v[i];
        }
      }
      const float gs = gsz >= 2 ? top1 + top2 : top1;
      gsc[w][g] = isnan(gs) ? -INFINITY : gs;
    }
    __syncwarp();
    // Keep the topk_group best groups, ties to the lower group id.
    for (int64_t g = lane; g < G; g += 32) gkeep[w][g] = 0;
    __syncwarp();
    for (int64_t j = 0; j < sp.topk_group; j++) {
      df_argmax_t best = {-INFINITY, 0x7fffffff};
      for (int64_t g = lane; g < G; g += 32)
        if (!gkeep[w][g]) best = df_argmax_pick(best, df_argmax_t{gsc[w][g], (int)g});
      best = df_warp_argmax(best);
      if (lane == 0) gkeep[w][best.i] = 1;
      __syncwarp();
    }
    for (int64_t e = lane; e < E; e += 32)
      if (!gkeep[w][e / gsz]) row[e] = -INFINITY;
    __syncwarp();
  }
  // Top-k: k rounds of a warp argmax over the experts not taken yet (a per-lane bit mask, lane owns e ≡ lane).
  uint32_t taken = 0;
  int32_t *idx = indices + t * k;
  for (int64_t j = 0; j < k; j++) {
    df_argmax_t best = {-INFINITY, 0x7fffffff};
    for (int i = 0; i < kPerLane; i++) {
      const int64_t e = lane + 32 * i;
      if (e < E && !((taken >> i) & 1u)) best = df_argmax_pick(best, df_argmax_t{row[e], (int)e});
    }
    best = df_warp_argmax(best);
    if ((best.i & 31) == lane) taken |= 1u << (best.i >> 5);
    if (lane == 0) picked[w][j] = best.i, idx[j] = best.i;
    __syncwarp();
  }
  if (lane == 0) {
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) sum += sc[picked[w][j]];
    const double scale = sp.norm_topk_prob ? sp.routed_scaling_factor / (sum + 1e-20) : sp.routed_scaling_factor;
    for (int64_t j = 0; j < k; j++) {
      weights[t * k + j] = (float)(sc[picked[w][j]] * scale);
      atomicAdd(&counts[picked[w][j]], 1);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    weights_bwd_kernel(df_cu_router_spec sp, int64_t T, const float *scores, const int32_t *indices,
                       const float *weights, const float *dweights, const float *aux_row, float *dscores) {
  const int64_t t = blockIdx.x * (int64_t)kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const int64_t E = sp.E, k = sp.k;
  float *ds = dscores + t * E;
  for (int64_t e = lane; e < E; e += 32) ds[e] = aux_row ? aux_row[e] : 0.0f;
  __syncwarp();
  if (!dweights || lane != 0) return;
  const int32_t *idx = indices + t * k;
  const float *sc = scores + t * E, *w = weights + t * k, *dw = dweights + t * k;
  const double f = sp.routed_scaling_factor;
  if (sp.norm_topk_prob) {
    double sum = 0.0, dot = 0.0;
    for (int64_t j = 0; j < k; j++) sum += sc[idx[j]], dot += (double)dw[j] * w[j];
    const double D = sum + 1e-20;
    for (int64_t j = 0; j < k; j++) ds[idx[j]] += (float)((f * dw[j] - dot) / D);
  } else {
    for (int64_t j = 0; j < k; j++) ds[idx[j]] += (float)(f * dw[j]);
  }
}

} // namespace

extern "C" df_status df_cu_moe_scores_fwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                                          float *scores, df_error *err) {
  if (T <= 0) return DF_OK;
  scores_fwd_kernel<<<df_cu_blocks(T, kWarps), kThreads, 0, s>>>(f, T, E, logits, scores);
  DF_CU_CHECK_LAUNCH(err, "moe_scores_fwd");
  return DF_OK;
}

extern "C" df_status df_cu_moe_scores_bwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                                          const float *scores, const float *dscores, float *dlogits, df_error *err) {
  if (T <= 0) return DF_OK;
  scores_bwd_kernel<<<df_cu_blocks(T, kWarps), kThreads, 0, s>>>(f, T, E, logits, scores, dscores, dlogits);
  DF_CU_CHECK_LAUNCH(err, "moe_scores_bwd");
  return DF_OK;
}

extern "C" df_status df_cu_moe_select(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                                      const float *sel_shift, int32_t *indices, float *weights, int32_t *counts,
                                      df_error *err) {
  if (sp->E < 1 || sp->E > kMaxE || sp->k < 1 || sp->k > kMaxK || sp->k > sp->E || sp->n_group < 1 ||
      sp->E % sp->n_group || sp->topk_group < 1 || sp->topk_group > sp->n_group || sp->n_group > kMaxGroups)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "moe_select",
                   "the CUDA router takes E <= 1024 experts, k <= 32 and n_group <= 256",
                   "router E = %lld, k = %lld, n_group = %lld, topk_group = %lld", (long long)sp->E, (long long)sp->k,
                   (long long)sp->n_group, (long long)sp->topk_group);
  DF_CU_TRY(err, cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)sp->E, (cudaStream_t)s), "moe_select.counts");
  if (T <= 0) return DF_OK;
  select_kernel<<<df_cu_blocks(T, kWarps), kThreads, 0, s>>>(*sp, T, scores, sel_shift, indices, weights, counts);
  DF_CU_CHECK_LAUNCH(err, "moe_select");
  return DF_OK;
}

extern "C" df_status df_cu_moe_weights_bwd(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                                           const int32_t *indices, const float *weights, const float *dweights,
                                           const float *aux_row, float *dscores, df_error *err) {
  if (T <= 0) return DF_OK;
  weights_bwd_kernel<<<df_cu_blocks(T, kWarps), kThreads, 0, s>>>(*sp, T, scores, indices, weights, dweights, aux_row,
                                                                  dscores);
  DF_CU_CHECK_LAUNCH(err, "moe_weights_bwd");
  return DF_OK;
}
