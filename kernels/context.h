// The backend context behind df_ctx (private to kernels/): device, thread count, backend handles.
#ifndef DF_KERNELS_CONTEXT_H
#define DF_KERNELS_CONTEXT_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

struct df_ctx {
  df_device device;
  int num_threads;
  int cuda_device;
  void *cuda; // CUDA backend state (handles, stream); NULL on the CPU
};

#ifdef __cplusplus
}
#endif

#endif
