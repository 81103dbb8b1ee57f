// Helpers of the GPU bench programs (bench/gpu_*.c, built only with the CUDA backend): one stream with cuBLAS
// handles and the GEMM context, tracked device allocations, random device fills (a random host pattern uploaded
// tile by tile: timing on zeros flatters GEMMs), CUDA-event timing, NVTX ranges, and the peak numbers the MFU is
// taken against. Header-only: each bench/*.c is its own program.
#ifndef DF_BENCH_GPU_UTIL_H
#define DF_BENCH_GPU_UTIL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/launch.h"

// H200 SXM dense bf16 tensor peak (the datasheet's, = H100 SXM), and what a large bf16 GEMM measured on an H200
// of this workplace (.library/device/KINDS.md: 769–798 TFLOP/s on 8192³).
#define GPU_PEAK_BF16_TFLOPS     989.4
#define GPU_MEASURED_GEMM_TFLOPS 790.0

#define GPU_CHECK(call)                                                                                                \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess) {                                                                                           \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));                    \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

#define GPU_TRY(call)                                                                                                  \
  do {                                                                                                                 \
    df_error err_ = {0};                                                                                               \
    df_status st_ = (call);                                                                                            \
    if (st_ != DF_OK) {                                                                                                \
      fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #call);                                                \
      df_error_print(&err_);                                                                                           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

typedef struct {
  cudaStream_t s;
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  void *gemm_ws;
  df_cu_gemm_ctx *g;
  size_t allocated; // bytes through gpu_alloc
} gpu_env;

static inline int gpu_visible(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static inline void *gpu_alloc(gpu_env *e, size_t bytes) {
  void *p = NULL;
  GPU_CHECK(cudaMalloc(&p, bytes ? bytes : 256));
  e->allocated += bytes;
  return p;
}

static inline gpu_env gpu_env_open(void) {
  gpu_env e;
  memset(&e, 0, sizeof e);
  GPU_CHECK(cudaSetDevice(0));
  GPU_CHECK(cudaStreamCreate(&e.s));
  if (cublasLtCreate(&e.lt) != CUBLAS_STATUS_SUCCESS || cublasCreate(&e.blas) != CUBLAS_STATUS_SUCCESS ||
      cublasSetStream(e.blas, e.s) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "cuBLAS initialisation failed\n");
    exit(1);
  }
  const size_t ws = (size_t)32 << 20;
  e.gemm_ws = gpu_alloc(&e, ws);
  df_error err = {0};
  if (df_cu_gemm_ctx_create(e.lt, e.blas, e.gemm_ws, ws, &e.g, &err) != DF_OK) {
    df_error_print(&err);
    exit(1);
  }
  return e;
}

static inline void gpu_env_close(gpu_env *e) {
  cudaStreamSynchronize(e->s);
  df_cu_gemm_ctx_destroy(e->g);
  cublasDestroy(e->blas);
  cublasLtDestroy(e->lt);
  cudaStreamDestroy(e->s);
}

// Fills n elements of dtype dt with uniform values in [-scale, scale): a 4 Mi-element random host tile uploaded
// repeatedly (offsets shift the pattern between tensors).
static inline void gpu_fill_random(gpu_env *e, void *d, int64_t n, df_dtype dt, float scale, uint64_t seed) {
  enum { TILE = 1 << 22 };
  static float *tile = NULL;
  static void *dtile = NULL;
  if (!tile) {
    tile = (float *)malloc(sizeof(float) * TILE);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < TILE; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      tile[i] = (float)((x >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
    }
    GPU_CHECK(cudaMalloc(&dtile, sizeof(float) * TILE));
    GPU_CHECK(cudaMemcpy(dtile, tile, sizeof(float) * TILE, cudaMemcpyHostToDevice));
  }
  const size_t es = dt == DF_BF16 ? 2 : 4;
  for (int64_t o = 0; o < n; o += TILE / 2) {
    const int64_t shift = (int64_t)((seed * 7919 + (uint64_t)o) % (TILE / 2)),
                  len = n - o < TILE / 2 ? n - o : TILE / 2;
    GPU_TRY(df_cu_cast(e->s, (char *)d + (size_t)o * es, dt, (float *)dtile + shift, DF_F32, len, &err_));
  }
  GPU_TRY(df_cu_scale(e->s, d, dt, n, scale, NULL, &err_));
}

typedef struct {
  cudaEvent_t a, b;
} gpu_timer;

static inline gpu_timer gpu_timer_make(void) {
  gpu_timer t;
  GPU_CHECK(cudaEventCreate(&t.a));
  GPU_CHECK(cudaEventCreate(&t.b));
  return t;
}

static inline void gpu_timer_start(gpu_timer *t, cudaStream_t s) { GPU_CHECK(cudaEventRecord(t->a, s)); }

// Milliseconds since gpu_timer_start (waits for the stream).
static inline double gpu_timer_stop(gpu_timer *t, cudaStream_t s) {
  GPU_CHECK(cudaEventRecord(t->b, s));
  GPU_CHECK(cudaEventSynchronize(t->b));
  float ms = 0;
  GPU_CHECK(cudaEventElapsedTime(&ms, t->a, t->b));
  return ms;
}

static inline int gpu_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static inline double gpu_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, gpu_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline double gpu_used_gib(void) {
  size_t f = 0, t = 0;
  cudaMemGetInfo(&f, &t);
  return (double)(t - f) / (double)(1u << 30);
}

#endif
