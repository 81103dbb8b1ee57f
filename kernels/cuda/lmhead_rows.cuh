// Row statistics shared by the fused LM-head kernels (lmhead_ce.cu, lmhead_dspark.cu), private to them: one
// thread block per logit row computes the max, the first argmax and Σ exp(z − max) in one online pass (each thread
// rescales its running sum when its max grows; partials merge in a fixed tree, so the result is deterministic).
#ifndef DF_KERNELS_CUDA_LMHEAD_ROWS_CUH
#define DF_KERNELS_CUDA_LMHEAD_ROWS_CUH

#include "kernels/cuda/cu_common.cuh"

struct df_row_stats {
  float m;  // max
  int arg;  // first index of the max
  double s; // Σ exp(z − m)
};

__device__ __forceinline__ df_row_stats df_row_stats_merge(df_row_stats a, df_row_stats b) {
  if (b.m > a.m || (b.m == a.m && b.arg < a.arg)) {
    df_row_stats t = a;
    a = b, b = t;
  }
  // a has the larger max (or the same max with the lower index).
  if (b.m != -INFINITY) a.s += b.s * (double)expf(b.m - a.m);
  return a;
}

// Stats of z [V] (fp32) by the whole block; every thread receives them. scratch: 32 entries.
__device__ inline df_row_stats df_row_stats_of(const float *z, int64_t V, df_row_stats *scratch) {
  df_row_stats st = {-INFINITY, 0x7fffffff, 0.0};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = z[v];
    if (x > st.m) {
      st.s = st.m == -INFINITY ? 1.0 : st.s * (double)expf(st.m - x) + 1.0;
      st.m = x, st.arg = (int)v;
    } else if (st.m != -INFINITY) {
      st.s += (double)expf(x - st.m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    df_row_stats b;
    b.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    b.arg = __shfl_xor_sync(0xffffffffu, st.arg, o);
    b.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    st = df_row_stats_merge(st, b);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = st;
  __syncthreads();
  if (warp == 0) {
    st = lane < nw ? scratch[lane] : df_row_stats{-INFINITY, 0x7fffffff, 0.0};
    for (int o = 16; o > 0; o >>= 1) {
      df_row_stats b;
      b.m = __shfl_xor_sync(0xffffffffu, st.m, o);
      b.arg = __shfl_xor_sync(0xffffffffu, st.arg, o);
      b.s = __shfl_xor_sync(0xffffffffu, st.s, o);
      st = df_row_stats_merge(st, b);
    }
    if (lane == 0) scratch[0] = st;
  }
  __syncthreads();
  return scratch[0];
}

// Logit rows per chunk so the fp32 logits (plus bf16 gradients) of one chunk stay near 1 GiB.
static inline int64_t df_lmhead_chunk_for(int64_t R, int64_t ldz, int64_t bytes_per_elem) {
  int64_t c = ((int64_t)1 << 30) / (ldz * bytes_per_elem);
  c = c / 64 * 64;
  if (c < 64) c = 64;
  return c < R ? c : (R > 0 ? R : 1);
}

static inline int64_t df_lmhead_ld(int64_t V) { return (V + 15) / 16 * 16; }

#endif
