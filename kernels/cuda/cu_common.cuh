// Private helpers of the CUDA kernels (kernels/cuda/*.cu only): the checked-launch macro, fp32 / bf16 loads and
// stores (bf16 rounds to nearest even), warp and block reductions, and the storage-dtype switch.
#ifndef DF_KERNELS_CUDA_CU_COMMON_CUH
#define DF_KERNELS_CUDA_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/launch.h"

typedef __nv_bfloat16 bf16;

// Every launch is followed by this: a bad configuration or a sticky error is reported naming the kernel.
#define DF_CU_CHECK_LAUNCH(err, name)                                                                                  \
  do {                                                                                                                 \
    cudaError_t df_cu_e_ = cudaGetLastError();                                                                         \
    if (df_cu_e_ != cudaSuccess)                                                                                       \
      return DF_FAIL((err), DF_ERR_INVALID, (name), "run with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel",      \
                     "CUDA launch of %s failed: %s", (name), cudaGetErrorString(df_cu_e_));                            \
  } while (0)

// A CUDA runtime call that may fail (attributes, memsets, copies).
#define DF_CU_TRY(err, call, what)                                                                                     \
  do {                                                                                                                 \
    cudaError_t df_cu_e_ = (call);                                                                                     \
    if (df_cu_e_ != cudaSuccess)                                                                                       \
      return DF_FAIL((err), DF_ERR_INVALID, (what), NULL, "%s failed: %s", (what), cudaGetErrorString(df_cu_e_));      \
  } while (0)

static inline df_status df_cu_bad_dtype(df_error *err, const char *what, df_dtype dt) {
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, what, "CUDA kernels store f32 or bf16", "%s: dtype %s is not supported", what,
                 df_dtype_name(dt));
}

static inline unsigned df_cu_blocks(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b));
}

// ---- loads and stores in fp32 arithmetic -------------------------------------------------------------------

__device__ __forceinline__ float df_ld(const float *p) { return *p; }
__device__ __forceinline__ float df_ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void df_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void df_st(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

// Calls body with T = float or bf16 for a storage dtype; any other dtype returns the error.
#define DF_CU_SWITCH_DT(dt, T, err, what, ...)                                                                         \
  do {                                                                                                                 \
    if ((dt) == DF_F32) {                                                                                              \
      typedef float T;                                                                                                 \
      __VA_ARGS__;                                                                                                     \
    } else if ((dt) == DF_BF16) {                                                                                      \
      typedef bf16 T;                                                                                                  \
      __VA_ARGS__;                                                                                                     \
    } else {                                                                                                           \
      return df_cu_bad_dtype((err), (what), (dt));                                                                     \
    }                                                                                                                  \
  } while (0)

// ---- reductions --------------------------------------------------------------------------------------------

template <typename V> __device__ __forceinline__ V df_warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float df_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum, the same tree for every call with the same blockDim (deterministic); every thread gets the
// result. scratch holds 32 values; blockDim.x is a multiple of 32.
template <typename V> __device__ V df_block_sum(V v, V *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = df_warp_sum(v);
  __syncthreads(); // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  V t = lane < nw ? scratch[lane] : (V)0;
  return df_warp_sum(t);
}

__device__ inline float df_block_max(float v, float *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = df_warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : -INFINITY;
  return df_warp_max(t);
}

// (value, index) maximum with ties to the lower index: torch.argmax's first maximum. NaN never wins.
struct df_argmax_t {
  float v;
  int i;
};

__device__ __forceinline__ df_argmax_t df_argmax_pick(df_argmax_t a, df_argmax_t b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ __forceinline__ df_argmax_t df_warp_argmax(df_argmax_t a) {
  for (int o = 16; o > 0; o >>= 1) {
    df_argmax_t b = {__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    a = df_argmax_pick(a, b);
  }
  return a;
}

__device__ inline df_argmax_t df_block_argmax(df_argmax_t a, df_argmax_t *scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  a = df_warp_argmax(a);
  __syncthreads();
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  df_argmax_t t = lane < nw ? scratch[lane] : df_argmax_t{-INFINITY, 0x7fffffff};
  return df_warp_argmax(t);
}

#endif
