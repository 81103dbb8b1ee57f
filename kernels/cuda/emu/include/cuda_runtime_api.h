// CUDA's runtime API header, emulated: the same declarations as cuda_runtime.h (kernels/cuda/emu/).
#include "cuda_runtime.h"
