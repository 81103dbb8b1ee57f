// The fp32 (CUDA-core) block attention, private to kernels/cuda/attention*.cu: called by the public launchers
// in attention.cu for fp32 inputs or DF_CU_ATTN_FP32. D = rowsum(dout ∘ out) comes precomputed ([B, nH, N·bs]).
#ifndef DF_KERNELS_CUDA_ATTENTION_F32_CUH
#define DF_KERNELS_CUDA_ATTENTION_F32_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/launch.h"

df_status df_cu_attn_f32_fwd(cudaStream_t s, const df_cu_attn_args *a, df_error *err);
df_status df_cu_attn_f32_bwd(cudaStream_t s, const df_cu_attn_args *a, const float *D, df_error *err);
df_status df_cu_attn_rowdot(cudaStream_t s, const df_cu_attn_args *a, float *D, df_error *err);

#endif
