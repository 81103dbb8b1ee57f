// CUDA row gather with holes (twin of kernels/cpu/gather.c): out[r] = src[idx[r]] for idx[r] >= 0, a zero row for
// idx[r] < 0. The embedding gather kernel does exactly this (an index outside [0, N) gives a zero row); indices
// >= N are the caller's bug, validated on the host where they were built.
#include "kernels/cuda/backend.h"

static df_status cuda_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out,
                                  df_error *err) {
  return df_cu_embedding_fwd(df_cuda_cu_stream(ctx), src->data, src->dtype, (const int32_t *)idx->data, out->data,
                             out->dtype, df_numel(idx), src->shape[0], src->shape[1], err);
}

extern "C" void df_cuda_register_gather(df_backend *be) { be->gather_rows = cuda_gather_rows; }
