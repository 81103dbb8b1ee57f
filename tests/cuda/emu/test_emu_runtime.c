// What the CUDA emulator runs, and when: fresh device and shared memory are NaN, queued work runs only when the host
// synchronises, a synchronous copy on the legacy stream waits for blocking streams but not for non-blocking ones,
// events order streams, an async copy into host memory reads NaN until the stream is synchronised, the warp
// intrinsics and a WMMA tile give CUDA's results, and blocks spread over CPU threads give the same bits.
#include <cuda_runtime.h>
#include <df_emu.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/emu/emu_kernels.h"
#include "tests/cuda/emu/emu_test.h"

Test(emu_runtime, fresh_device_memory_is_nan) {
  float *d = NULL, h[64];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 64; i++) cr_expect(isnan(h[i]), "element %d is %g", i, h[i]);
  cudaFree(d);
}

Test(emu_runtime, fresh_shared_memory_is_nan) {
  float *d = NULL, h[64];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  read_fresh_shared(d);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 64; i++) cr_expect(isnan(h[i]), "shared element %d is %g", i, h[i]);
  cudaFree(d);
}

Test(emu_runtime, shared_arrays_are_per_template_instance) {
  float *d = NULL, h[32];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  shared_per_instance(d);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 32; i++) cr_expect_eq(h[i], 1.5f * i + 7 * i, "element %d: %g", i, h[i]);
  cudaFree(d);
}

// A kernel writing pinned host memory: the host sees nothing until it synchronises.
Test(emu_runtime, launches_run_when_the_host_synchronises) {
  float *h = NULL;
  cr_assert_eq(cudaMallocHost(&h, 256 * sizeof(float)), cudaSuccess);
  for (int i = 0; i < 256; i++) h[i] = -1.0f;
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  write_value(h, 256, 7.0f, s);
  cr_expect_eq(h[0], -1.0f, "the kernel ran at launch");
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  for (int i = 0; i < 256; i++) cr_expect_eq(h[i], 7.0f);
  cudaStreamDestroy(s);
  cudaFreeHost(h);
}

Test(emu_runtime, async_copy_into_host_memory_reads_nan_until_synchronised) {
  float *h = NULL, *d = NULL, src[64];
  for (int i = 0; i < 64; i++) src[i] = (float)i;
  cr_assert_eq(cudaMallocHost(&h, sizeof src), cudaSuccess);
  cr_assert_eq(cudaMalloc(&d, sizeof src), cudaSuccess);
  cr_assert_eq(cudaMemcpy(d, src, sizeof src, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaMemcpyAsync(h, d, sizeof src, cudaMemcpyDeviceToHost, s), cudaSuccess);
  for (int i = 0; i < 64; i++) cr_expect(isnan(h[i]), "read before the synchronisation: %g", h[i]);
  cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
  for (int i = 0; i < 64; i++) cr_expect_eq(h[i], (float)i);
  cudaStreamDestroy(s), cudaFree(d), cudaFreeHost(h);
}

// cudaMemcpy (legacy stream) waits for blocking streams' earlier work, never for a non-blocking stream's.
Test(emu_runtime, legacy_copies_do_not_wait_for_non_blocking_streams) {
  float *d = NULL, h[128];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  cr_assert_eq(cudaMemset(d, 0, sizeof h), cudaSuccess);
  cudaStream_t nb, blocking;
  cr_assert_eq(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaStreamCreate(&blocking), cudaSuccess);
  write_value(d, 128, 3.0f, nb);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_expect_eq(h[0], 0.0f, "a legacy-stream copy waited for a non-blocking stream");
  cr_assert_eq(cudaStreamSynchronize(nb), cudaSuccess);
  write_value(d, 128, 5.0f, blocking);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_expect_eq(h[0], 5.0f, "a legacy-stream copy must wait for a blocking stream's earlier work");
  cudaStreamDestroy(nb), cudaStreamDestroy(blocking), cudaFree(d);
}

// An event recorded after a write on one stream orders a second stream's read after it.
Test(emu_runtime, events_order_streams) {
  float *d = NULL, *h = NULL;
  cr_assert_eq(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  cr_assert_eq(cudaMallocHost(&h, 64 * sizeof(float)), cudaSuccess);
  cudaStream_t a, b;
  cudaEvent_t e;
  cr_assert_eq(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cr_assert_eq(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  write_value(d, 64, 9.0f, a);
  cr_assert_eq(cudaEventRecord(e, a), cudaSuccess);
  cr_assert_eq(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
  cr_assert_eq(cudaMemcpyAsync(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, b), cudaSuccess);
  cr_assert_eq(cudaStreamSynchronize(b), cudaSuccess); // drains a up to the event first
  for (int i = 0; i < 64; i++) cr_expect_eq(h[i], 9.0f);
  cudaEventDestroy(e), cudaStreamDestroy(a), cudaStreamDestroy(b), cudaFree(d), cudaFreeHost(h);
}

Test(emu_runtime, warp_intrinsics_give_cudas_results) {
  int *d = NULL, h[32 * 8];
  cr_assert_eq(cudaMalloc(&d, sizeof h), cudaSuccess);
  shuffle_table(d);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++) ballot |= (l % 3 == 0 ? 1u : 0u) << l;
  for (int l = 0; l < 32; l++) {
    const int *o = h + l * 8, seg = l & ~7;
    cr_expect_eq(o[0], 70, "lane %d: __shfl_sync from 7", l);
    cr_expect_eq(o[1], (l >= 3 ? l - 3 : l) * 10, "lane %d: __shfl_up_sync by 3", l);
    cr_expect_eq(o[2], (l + 5 < 32 ? l + 5 : l) * 10, "lane %d: __shfl_down_sync by 5", l);
    cr_expect_eq(o[3], (l ^ 6) * 10, "lane %d: __shfl_xor_sync 6", l);
    cr_expect_eq(o[4], (seg + 2) * 10, "lane %d: __shfl_sync lane 2 of width 8", l);
    const int x = l ^ 12;
    cr_expect_eq(o[5], ((x & ~7) > seg ? l : x) * 10, "lane %d: __shfl_xor_sync 12, width 8", l);
    cr_expect_eq((unsigned)o[6], ballot, "lane %d: __ballot_sync", l);
    cr_expect_eq(o[7], ((l & 7) + 5 < 8 ? l + 5 : l) * 10, "lane %d: __shfl_down_sync by 5, width 8", l);
  }
  cudaFree(d);
}

static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_value(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// A row-major A and a column-major B tile through WMMA: D = A·B + C, stored column-major; fp32 sums of exact bf16
// products: within 1e-5 of the double reference.
Test(emu_runtime, wmma_tile_product) {
  uint16_t a[256], b[256];
  float c[256], d[256], av[256], bv[256];
  for (int i = 0; i < 256; i++) {
    a[i] = bf16_bits((float)((i * 37) % 17) / 8.0f - 1.0f), av[i] = bf16_value(a[i]);
    b[i] = bf16_bits((float)((i * 11) % 13) / 6.0f - 1.0f), bv[i] = bf16_value(b[i]);
    c[i] = (float)(i % 7) - 3.0f;
  }
  void *da, *db, *dc, *dd;
  cr_assert_eq(cudaMalloc(&da, sizeof a), cudaSuccess);
  cr_assert_eq(cudaMalloc(&db, sizeof b), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dc, sizeof c), cudaSuccess);
  cr_assert_eq(cudaMalloc(&dd, sizeof d), cudaSuccess);
  cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice), cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
  cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
  wmma_product(da, db, dc, dd);
  cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 16; n++) {
      double want = c[m * 16 + n];
      for (int k = 0; k < 16; k++) want += (double)av[m * 16 + k] * bv[n * 16 + k]; // B column-major: b[n·16 + k]
      cr_expect(fabs(d[n * 16 + m] - want) <= 1e-5 * (1 + fabs(want)), "D[%d][%d] = %g, want %g", m, n, d[n * 16 + m],
                want);
    }
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

// Barrier trees in many blocks: the same bits on one CPU thread and on two, and atomics count every thread.
Test(emu_runtime, results_do_not_depend_on_the_thread_count) {
  enum { BLOCKS = 64, THREADS = 256 };
  float *x = malloc(sizeof(float) * BLOCKS * THREADS), *dx;
  for (int i = 0; i < BLOCKS * THREADS; i++) x[i] = sinf((float)i) * 1e3f;
  double a[BLOCKS], b[BLOCKS], *ds;
  cr_assert_eq(cudaMalloc(&dx, sizeof(float) * BLOCKS * THREADS), cudaSuccess);
  cr_assert_eq(cudaMalloc(&ds, sizeof a), cudaSuccess);
  cudaMemcpy(dx, x, sizeof(float) * BLOCKS * THREADS, cudaMemcpyHostToDevice);
  omp_set_num_threads(1);
  block_sums(dx, ds, BLOCKS, THREADS);
  cudaMemcpy(a, ds, sizeof a, cudaMemcpyDeviceToHost);
  omp_set_num_threads(2);
  block_sums(dx, ds, BLOCKS, THREADS);
  cudaMemcpy(b, ds, sizeof b, cudaMemcpyDeviceToHost);
  cr_expect(!memcmp(a, b, sizeof a), "block sums differ between 1 and 2 CPU threads");
  double want = 0;
  for (int t = 0; t < THREADS; t++) want += x[t];
  cr_expect(fabs(a[0] - want) < 1e-9 * THREADS * 1e3, "block 0 sums to %.17g, want %.17g", a[0], want);
  int *dc, count = 0;
  cr_assert_eq(cudaMalloc(&dc, sizeof(int)), cudaSuccess);
  cudaMemset(dc, 0, sizeof(int));
  count_atomically(dc, 50);
  cudaMemcpy(&count, dc, sizeof count, cudaMemcpyDeviceToHost);
  cr_expect_eq(count, 50 * 256);
  cudaFree(dx), cudaFree(ds), cudaFree(dc), free(x);
}

Test(emu_runtime, live_device_memory_is_counted) {
  const size_t before = df_emu_live_device_bytes();
  void *p = NULL;
  cr_assert_eq(cudaMalloc(&p, 1000), cudaSuccess);
  cr_expect_eq(df_emu_live_device_bytes(), before + 1000);
  cudaFree(p);
  cr_expect_eq(df_emu_live_device_bytes(), before);
}
