// The CUDA emulator stops what a GPU would refuse or what would only sometimes go wrong on one, naming the kernel, the
// launch's file:line and the rule: divergent barriers, shuffles with exited or absent lanes, lanes at different warp
// operations, launch shapes and shared memory a Hopper GPU refuses, host reads of device memory, copies with the
// wrong kind or past an allocation, kernels writing past an allocation or their shared memory, WMMA by half a warp.
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>

#include "tests/cuda/emu/emu_kernels.h"
#include "tests/cuda/emu/emu_test.h"

static float *dev_floats(int n) {
  float *d = NULL;
  if (cudaMalloc(&d, sizeof(float) * (size_t)n) != cudaSuccess) abort();
  return d;
}

static void run(void (*launch)(float *)) {
  launch(dev_floats(4096));
  cudaDeviceSynchronize();
}

static void exit_before_barrier(void) { run(bad_exit_before_barrier); }
static void barriers_in_branches(void) { run(bad_barriers_in_branches); }
static void shuffle_after_exit(void) { run(bad_shuffle_after_exit); }
static void different_shuffles(void) { run(bad_lanes_at_different_shuffles); }
static void mask_without_self(void) { run(bad_mask_without_self); }
static void block_too_large(void) { run(bad_block_too_large); }
static void block_too_deep(void) { run(bad_block_z_too_deep); }
static void grid_too_large(void) { run(bad_grid_y_too_large); }
static void smem_overrun(void) { run(bad_dynamic_smem_overrun); }
static void wmma_half_warp(void) { run(bad_wmma_half_warp); }
static void static_smem_too_large(void) { run(bad_static_smem_too_large); }

Test(emu_checks, divergent_syncthreads_after_an_early_return) {
  EMU_EXPECT_ABORT(exit_before_barrier,
                   "kernel exit_before_barrier launched at tests/cuda/emu/emu_kernels.cu:", "thread (5, 0, 0)",
                   "exited while 5 threads of the block wait at __syncthreads at "
                   "tests/cuda/emu/emu_kernels.cu:",
                   "HINT:");
}

Test(emu_checks, threads_at_different_syncthreads) {
  EMU_EXPECT_ABORT(barriers_in_branches, "kernel barriers_in_branches launched at",
                   "while 32 threads of the block wait", "HINT:");
}

Test(emu_checks, shuffle_with_an_exited_lane) {
  EMU_EXPECT_ABORT(shuffle_after_exit, "kernel shuffle_after_exit launched at", "thread (3, 0, 0)",
                   "exited while lanes 0x00000007 of its warp wait for it at __shfl_xor_sync");
}

Test(emu_checks, lanes_at_different_warp_operations) {
  EMU_EXPECT_ABORT(different_shuffles, "different warp operations", "__shfl_down_sync", "__shfl_xor_sync");
}

Test(emu_checks, mask_leaving_out_the_calling_lane) {
  EMU_EXPECT_ABORT(mask_without_self, "mask 0x0000ffff, which leaves out the calling lane 16");
}

Test(emu_checks, launch_shapes_a_hopper_gpu_refuses) {
  EMU_EXPECT_ABORT(block_too_large, "kernel noop launched at tests/cuda/emu/emu_kernels.cu:", "block (2048, 1, 1)",
                   "refused by the GPU");
  EMU_EXPECT_ABORT(block_too_deep, "block (1, 1, 65)");
  EMU_EXPECT_ABORT(grid_too_large, "grid (1, 65536, 1)");
}

static void smem_64k_without_optin(void) {
  reverse_in_dynamic_smem(dev_floats(64), 64, 64 * 1024);
  cudaDeviceSynchronize();
}

static void smem_over_227k(void) {
  optin_dynamic_smem(227 * 1024);
  reverse_in_dynamic_smem(dev_floats(64), 64, 228 * 1024);
  cudaDeviceSynchronize();
}

Test(emu_checks, dynamic_shared_memory_over_48k_needs_the_opt_in) {
  EMU_EXPECT_ABORT(smem_64k_without_optin, "kernel reverse launched at",
                   "65536 bytes of dynamic shared memory exceed "
                   "the 48 KiB",
                   "cudaFuncSetAttribute");
  EMU_EXPECT_ABORT(smem_over_227k, "233472 bytes of dynamic shared memory");
  EMU_EXPECT_ABORT(static_smem_too_large, "kernel big_static_smem", "more than 49152");
  // With the opt-in the same launch runs, and runs right.
  cr_assert_eq(optin_dynamic_smem(64 * 1024), cudaSuccess);
  cr_expect_eq(optin_dynamic_smem(228 * 1024), cudaErrorInvalidValue, "over 227 KiB is refused");
  float h[64], *d = dev_floats(64);
  for (int i = 0; i < 64; i++) h[i] = (float)i;
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
  reverse_in_dynamic_smem(d, 64, 64 * 1024);
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 64; i++) cr_expect_eq(h[i], (float)(63 - i));
  cudaFree(d);
}

static void host_reads_device_memory(void) {
  float *d = dev_floats(64);
  volatile float x = d[10]; // host code: faults
  (void)x;
}

Test(emu_checks, host_read_of_device_memory_names_the_allocation) {
  EMU_EXPECT_ABORT(host_reads_device_memory, "host code read device memory", "byte 40 of the device allocation",
                   "made by cudaMalloc at tests/cuda/emu/test_emu_checks.c:", "HINT:");
}

static void copy_wrong_kind(void) {
  float h[16] = {0}, *d = dev_floats(16);
  cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice); // reversed: h is the destination
}

static void copy_host_as_device(void) {
  float a[16] = {0}, b[16];
  cudaMemcpy(b, a, sizeof a, cudaMemcpyDeviceToHost);
}

static void copy_past_end(void) {
  float h[64] = {0}, *d = dev_floats(16);
  cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
}

static void memset_past_end(void) {
  float *d = dev_floats(16);
  cudaMemsetAsync(d + 8, 0, 16 * sizeof(float), 0);
}

Test(emu_checks, copies_with_the_wrong_kind_or_past_the_allocation) {
  EMU_EXPECT_ABORT(copy_wrong_kind,
                   "cudaMemcpy at tests/cuda/emu/test_emu_checks.c:", "cudaMemcpyHostToDevice names the destination",
                   "as device memory, but it is host memory");
  EMU_EXPECT_ABORT(copy_host_as_device, "cudaMemcpyDeviceToHost names the source");
  EMU_EXPECT_ABORT(copy_past_end, "256 bytes at the destination", "run 192 bytes past the end of the device allocation",
                   "made by cudaMalloc at tests/cuda/emu/test_emu_checks.c:");
  EMU_EXPECT_ABORT(memset_past_end, "cudaMemsetAsync", "run 32 bytes past the end");
}

static void kernel_writes_past_end(void) {
  float *d = dev_floats(1000);
  bad_write_past_end(d, 1000);
  cudaDeviceSynchronize();
}

static void host_pointer_argument(void) {
  static float h[64];
  bad_write_past_end(h, 0);
}

static void freed_pointer_argument(void) {
  float *d = dev_floats(64);
  cudaFree(d);
  bad_write_past_end(d, 0);
}

Test(emu_checks, kernels_past_their_memory) {
  EMU_EXPECT_ABORT(kernel_writes_past_end, "kernel write_past_end launched at", "wrote address",
                   "past the end of the device allocation");
  EMU_EXPECT_ABORT(host_pointer_argument, "pointer argument #0", "host memory");
  EMU_EXPECT_ABORT(freed_pointer_argument, "pointer argument #0", "freed by cudaFree at");
  EMU_EXPECT_ABORT(smem_overrun, "kernel smem_overrun", "past the end of its 256 bytes of dynamic shared memory");
}

Test(emu_checks, wmma_by_half_a_warp) {
  EMU_EXPECT_ABORT(wmma_half_warp, "kernel wmma_half_warp", "WMMA", "lane 16 made 0 WMMA steps");
}
