// A build without nvcc has no CUDA backend table: a CUDA context fails to open (kernels/context.c says why).
#include "kernels/backend.h"

const df_backend *df_cuda_backend(void) { return NULL; }
