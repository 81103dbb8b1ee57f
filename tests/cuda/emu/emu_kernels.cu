// Kernels for the CUDA emulator's own tests (tests/cuda/emu/test_emu_*.c), written as CUDA code and compiled through
// cu_rewrite like kernels/cuda/*.cu. The "bad_" ones break one rule each; the tests check that the emulator stops
// them with a message naming the kernel and the launch's file:line. (EMU builds only.)
#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <mma.h>

#include "tests/cuda/emu/emu_kernels.h"

using namespace nvcuda;

__global__ void exit_before_barrier(float *x) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  x[threadIdx.x] = 1.0f;
}

__global__ void barriers_in_branches(float *x) {
  if (threadIdx.x < 32) {
    x[threadIdx.x] = 1.0f;
    __syncthreads();
  } else {
    __syncthreads();
    x[threadIdx.x] = 2.0f;
  }
}

__global__ void shuffle_after_exit(float *x) {
  if (threadIdx.x == 3) return;
  x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

__global__ void lanes_at_different_shuffles(float *x) {
  float v = (float)threadIdx.x;
  if (threadIdx.x < 16)
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  else
    v = __shfl_down_sync(0xffffffffu, v, 1);
  x[threadIdx.x] = v;
}

__global__ void mask_without_self(float *x) { x[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (float)threadIdx.x, 1); }

__global__ void noop(float *x) {}

__global__ void reverse(float *x) {
  extern __shared__ float s[];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

__global__ void smem_overrun(float *x) {
  extern __shared__ float s[];
  s[threadIdx.x + 2 * blockDim.x] = x[threadIdx.x];
}

__global__ void write_past_end(float *x, int n) { x[n + 64 + threadIdx.x] = 1.0f; }

__global__ void wmma_half_warp(float *out) {
  __shared__ __align__(32) __nv_bfloat16 tile[256];
  for (int i = threadIdx.x; i < 256; i += 32) tile[i] = __float2bfloat16_rn(1.0f);
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  if (threadIdx.x < 16) wmma::load_matrix_sync(a, tile, 16);
  out[threadIdx.x] = 0.0f;
}

__global__ void big_static_smem(float *x) {
  __shared__ float big[10240]; // 40 KiB
  extern __shared__ float dyn[];
  big[threadIdx.x] = dyn[threadIdx.x] = 1.0f;
  x[threadIdx.x] = big[threadIdx.x];
}

__global__ void fresh_shared(float *out) {
  __shared__ float s[64];
  out[threadIdx.x] = s[threadIdx.x];
}

__global__ void fill_value(float *x, int n, float v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

__global__ void shuffles(int *out) {
  const int lane = threadIdx.x;
  int *o = out + lane * 8;
  o[0] = __shfl_sync(0xffffffffu, lane * 10, 7);
  o[1] = __shfl_up_sync(0xffffffffu, lane * 10, 3);
  o[2] = __shfl_down_sync(0xffffffffu, lane * 10, 5);
  o[3] = __shfl_xor_sync(0xffffffffu, lane * 10, 6);
  o[4] = __shfl_sync(0xffffffffu, lane * 10, 2, 8);
  o[5] = __shfl_xor_sync(0xffffffffu, lane * 10, 12, 8);
  o[6] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
  o[7] = __shfl_down_sync(0xffffffffu, lane * 10, 5, 8);
}

__global__ void wmma_tile(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c, float *d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_col_major);
}

__global__ void tree_sums(const float *x, double *sums) {
  __shared__ double part[256];
  const int t = threadIdx.x;
  part[t] = x[blockIdx.x * blockDim.x + t];
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    __syncthreads();
    if (t < half) part[t] += part[t + half];
  }
  if (t == 0) sums[blockIdx.x] = part[0];
}

__global__ void count(int *c) { atomicAdd(c, 1); }

// One __shared__ array per instantiation of a device function template, as CUDA has.
template <typename T> __device__ T *slot_of() {
  __shared__ T slot[32];
  return slot;
}

__global__ void two_instances(float *out) {
  float *f = slot_of<float>();
  int *i = slot_of<int>();
  f[threadIdx.x] = 1.5f * threadIdx.x;
  i[threadIdx.x] = 7 * (int)threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = f[threadIdx.x] + (float)i[threadIdx.x];
}

extern "C" void shared_per_instance(float *out) { two_instances<<<1, 32>>>(out); }

extern "C" void bad_exit_before_barrier(float *x) { exit_before_barrier<<<1, 64>>>(x); }
extern "C" void bad_barriers_in_branches(float *x) { barriers_in_branches<<<1, 64>>>(x); }
extern "C" void bad_shuffle_after_exit(float *x) { shuffle_after_exit<<<1, 32>>>(x); }
extern "C" void bad_lanes_at_different_shuffles(float *x) { lanes_at_different_shuffles<<<1, 32>>>(x); }
extern "C" void bad_mask_without_self(float *x) { mask_without_self<<<1, 32>>>(x); }
extern "C" void bad_block_too_large(float *x) { noop<<<1, 2048>>>(x); }
extern "C" void bad_block_z_too_deep(float *x) { noop<<<1, dim3(1, 1, 65)>>>(x); }
extern "C" void bad_grid_y_too_large(float *x) { noop<<<dim3(1, 65536), 32>>>(x); }
extern "C" void reverse_in_dynamic_smem(float *x, int n, size_t smem) { reverse<<<1, n, smem>>>(x); }
extern "C" int optin_dynamic_smem(size_t bytes) {
  return cudaFuncSetAttribute(reverse, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}
extern "C" void bad_dynamic_smem_overrun(float *x) { smem_overrun<<<1, 64, 256>>>(x); }
extern "C" void bad_write_past_end(float *x, int n) { write_past_end<<<1, 32>>>(x, n); }
extern "C" void bad_wmma_half_warp(float *out) { wmma_half_warp<<<1, 32>>>(out); }
extern "C" void bad_static_smem_too_large(float *x) { big_static_smem<<<1, 32, 16384>>>(x); }
extern "C" void read_fresh_shared(float *out) { fresh_shared<<<1, 64>>>(out); }
extern "C" void write_value(float *x, int n, float v, cudaStream_t s) {
  fill_value<<<(n + 127) / 128, 128, 0, s>>>(x, n, v);
}
extern "C" void shuffle_table(int *out) { shuffles<<<1, 32>>>(out); }
extern "C" void wmma_product(const void *a, const void *b, const float *c, float *d) {
  wmma_tile<<<1, 32>>>((const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, c, d);
}
extern "C" void block_sums(const float *x, double *sums, int blocks, int threads) {
  tree_sums<<<blocks, threads>>>(x, sums);
}
extern "C" void count_atomically(int *counter, int blocks) { count<<<blocks, 256>>>(counter); }
extern "C" cudaError_t sort_pairs_i32(void *temp, size_t *temp_bytes, const int32_t *keys_in, int32_t *keys_out,
                                      const int32_t *vals_in, int32_t *vals_out, int n, int begin_bit, int end_bit) {
  return cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, keys_in, keys_out, vals_in, vals_out, n, begin_bit, end_bit,
                                         (cudaStream_t)0);
}
