// The CUDA runtime API of the emulator (DF_CUDA=EMU; docs/gpu-training.md "Running the CUDA code without a GPU"):
// the subset draftforge calls, with CUDA's names, types and error codes, served on the CPU by
// kernels/cuda/emu/*.cpp. C-compatible (tests/cuda/*.c and train/dist/comm_nccl.c include it). The memory calls are
// macros that add the caller's file:line, so a checker message names the call that broke a rule.
#ifndef DF_EMU_CUDA_RUNTIME_H
#define DF_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDART_VERSION 13000

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorMisalignedAddress = 716,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9
} cudaFuncAttribute;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

#define cudaStreamDefault      0x00
#define cudaStreamNonBlocking  0x01
#define cudaStreamLegacy       ((cudaStream_t)0x1)
#define cudaEventDefault       0x00
#define cudaEventBlockingSync  0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault   0x00

struct uint3 {
  unsigned int x, y, z;
};
typedef struct uint3 uint3;

struct dim3 {
  unsigned int x, y, z;
#ifdef __cplusplus
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
#endif
};
typedef struct dim3 dim3;

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t e);

// The memory calls carry the call site (file:line) into the checkers' messages.
cudaError_t df_emu_cudaMalloc(void **p, size_t bytes, const char *file, int line);
cudaError_t df_emu_cudaFree(void *p, const char *file, int line);
cudaError_t df_emu_cudaMallocHost(void **p, size_t bytes, const char *file, int line);
cudaError_t df_emu_cudaFreeHost(void *p, const char *file, int line);
cudaError_t df_emu_cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *file,
                              int line);
cudaError_t df_emu_cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                                   const char *file, int line);
cudaError_t df_emu_cudaMemset(void *dst, int value, size_t bytes, const char *file, int line);
cudaError_t df_emu_cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s, const char *file, int line);

#define cudaMalloc(p, n)                df_emu_cudaMalloc((void **)(p), (n), __FILE__, __LINE__)
#define cudaFree(p)                     df_emu_cudaFree((void *)(p), __FILE__, __LINE__)
#define cudaMallocHost(p, n)            df_emu_cudaMallocHost((void **)(p), (n), __FILE__, __LINE__)
#define cudaFreeHost(p)                 df_emu_cudaFreeHost((void *)(p), __FILE__, __LINE__)
#define cudaMemcpy(d, s, n, k)          df_emu_cudaMemcpy((d), (s), (n), (k), __FILE__, __LINE__)
#define cudaMemcpyAsync(d, s, n, k, st) df_emu_cudaMemcpyAsync((d), (s), (n), (k), (st), __FILE__, __LINE__)
#define cudaMemset(d, v, n)             df_emu_cudaMemset((d), (v), (n), __FILE__, __LINE__)
#define cudaMemsetAsync(d, v, n, st)    df_emu_cudaMemsetAsync((d), (v), (n), (st), __FILE__, __LINE__)
// (The async calls take their stream explicitly here; CUDA's default-argument form is not emulated.)

// Kernel attributes (the C entry; C++ gets CUDA's template below).
cudaError_t df_emu_cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}
template <typename T> static inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
  return df_emu_cudaFuncSetAttribute((const void *)entry, attr, value);
}
#else
#define cudaFuncSetAttribute(f, a, v) df_emu_cudaFuncSetAttribute((const void *)(f), (a), (v))
#endif

#include "df_emu.h"

#endif
