// What every kernels/cuda/*.cu sees first in an EMU build (cu_rewrite puts `#include` of this file on the first line
// of its output): CUDA's qualifiers as nothing, the built-in variables of the current coroutine, the warp
// intrinsics as checked collectives with their call site, and the math the kernels use from the host's libm.
// Anything CUDA offers that is not here (inline PTX, cooperative groups, __constant__, texture objects, ...) fails
// to compile, loudly, instead of running wrong.
#ifndef DF_KERNELS_CUDA_EMU_PRELUDE_H
#define DF_KERNELS_CUDA_EMU_PRELUDE_H

#include <cmath>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/emu/device.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__    __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n)   __attribute__((aligned(n)))
#define __CUDACC_EMU__ 1
// `__shared__` survives only where cu_rewrite did not run (a header with shared variables): say so.
#define __shared__   _Pragma("GCC error \"__shared__ outside a .cu file cu_rewrite processed\"")
#define __constant__ _Pragma("GCC error \"__constant__ memory is not emulated\"")
#define __managed__  _Pragma("GCC error \"__managed__ memory is not emulated\"")

#define threadIdx (::df_emu::tls.tid)
#define blockIdx  (::df_emu::tls.bid)
#define blockDim  (::df_emu::tls.bdim)
#define gridDim   (::df_emu::tls.gdim)
#define warpSize  32

#define __syncthreads() ::df_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::df_emu::syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __ldg(p)        (*(p))

#define __shfl_sync(...)       ::df_emu::shfl_at<::df_emu::SHFL_IDX>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...)    ::df_emu::shfl_at<::df_emu::SHFL_UP>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...)  ::df_emu::shfl_at<::df_emu::SHFL_DOWN>(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...)   ::df_emu::shfl_at<::df_emu::SHFL_XOR>(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(mask, p) ::df_emu::vote(__FILE__, __LINE__, ::df_emu::VOTE_BALLOT, mask, (p))
#define __any_sync(mask, p)    (::df_emu::vote(__FILE__, __LINE__, ::df_emu::VOTE_ANY, mask, (p)) != 0)
#define __all_sync(mask, p)    (::df_emu::vote(__FILE__, __LINE__, ::df_emu::VOTE_ALL, mask, (p)) != 0)

using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

#endif
