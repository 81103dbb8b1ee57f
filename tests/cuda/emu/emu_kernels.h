// Launchers of the kernels in tests/cuda/emu/emu_kernels.cu (C-callable): each queues one kernel on the legacy
// stream (or s) and returns; the tests synchronise. The "bad_" ones break a rule the CUDA emulator checks.
#ifndef DF_TESTS_CUDA_EMU_EMU_KERNELS_H
#define DF_TESTS_CUDA_EMU_EMU_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void bad_exit_before_barrier(float *x);  // thread 5 returns, the other 63 reach __syncthreads
void bad_barriers_in_branches(float *x); // two halves of the block at two different __syncthreads
void bad_shuffle_after_exit(float *x);   // lane 3 returns, the others shuffle with the full mask
void bad_lanes_at_different_shuffles(float *x);
void bad_mask_without_self(float *x);                       // lanes 16..31 call with mask 0x0000ffff
void bad_block_too_large(float *x);                         // 2048 threads
void bad_block_z_too_deep(float *x);                        // block (1, 1, 65)
void bad_grid_y_too_large(float *x);                        // grid (1, 65536)
void reverse_in_dynamic_smem(float *x, int n, size_t smem); // n threads, smem bytes of dynamic shared memory
int optin_dynamic_smem(size_t bytes);     // cudaFuncSetAttribute(MaxDynamicSharedMemorySize) of that kernel
void bad_dynamic_smem_overrun(float *x);  // writes past its 256 bytes
void bad_write_past_end(float *x, int n); // x has n floats: writes x[n + 64 ...]
void bad_wmma_half_warp(float *out);      // lanes 0..15 load a fragment, 16..31 do not
void bad_static_smem_too_large(float *x); // 40 KiB static + 16 KiB dynamic
void read_fresh_shared(float *out);       // out[i] = a never-written __shared__ element
void shared_per_instance(float *out);     // a template's __shared__ array, instantiated for float and int
void write_value(float *x, int n, float v, cudaStream_t s);
void shuffle_table(int *out); // 32 lanes × 8 results: idx, up, down, xor, width 8 variants, ballot
void wmma_product(const void *a_bf16, const void *b_bf16, const float *c, float *d); // one 16×16×16 tile, row / col
void block_sums(const float *x, double *sums, int blocks, int threads); // one double sum per block, tree order
void count_atomically(int *counter, int blocks);
// cub::DeviceRadixSort::SortPairs on int32 keys and values (the legacy stream).
cudaError_t sort_pairs_i32(void *temp, size_t *temp_bytes, const int32_t *keys_in, int32_t *keys_out,
                           const int32_t *vals_in, int32_t *vals_out, int n, int begin_bit, int end_bit);

#ifdef __cplusplus
}
#endif

#endif
