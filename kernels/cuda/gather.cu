// CUDA row gather with holes (twin of kernels/cpu/gather.c): out[r] = src[idx[r]] for idx[r] >= 0, a zero row for
// idx[r] < 0. The embedding gather kernel does exactly this (an index outside [0, N) gives a zero row); indices
// >= N are the caller's bug, validated on the host where they were built. And the strided 2-D copy (DSpark's
// row pieces): one thread per element, copied or added, between two distinct buffers of one storage dtype.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

enum { COPY_THREADS = 256 };

template <typename T>
__global__ void copy_2d_kernel(const T *src, T *dst, int64_t rows, int64_t cols, int64_t src_stride, int64_t dst_stride,
                               bool accumulate) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  const T *sp = src + r * src_stride + c;
  T *dp = dst + r * dst_stride + c;
  if (accumulate)
    df_st(dp, df_ld(dp) + df_ld(sp));
  else
    *dp = *sp;
}

extern "C" df_status df_cu_copy_2d(df_cu_stream st, df_dtype dt, const void *src, int64_t src_offset,
                                   int64_t src_stride, void *dst, int64_t dst_offset, int64_t dst_stride, int64_t rows,
                                   int64_t cols, bool accumulate, df_error *err) {
  const int64_t n = rows * cols;
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(
      dt, T, err, "copy_2d",
      copy_2d_kernel<T><<<df_cu_blocks(n, COPY_THREADS), COPY_THREADS, 0, st>>>(
          (const T *)src + src_offset, (T *)dst + dst_offset, rows, cols, src_stride, dst_stride, accumulate));
  DF_CU_CHECK_LAUNCH(err, "copy_2d_kernel");
  return DF_OK;
}

static df_status cuda_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out,
                                  df_error *err) {
  return df_cu_embedding_fwd(df_cuda_cu_stream(ctx), src->data, src->dtype, (const int32_t *)idx->data, out->data,
                             out->dtype, df_numel(idx), src->shape[0], src->shape[1], err);
}

static df_status cuda_copy_2d(df_ctx *ctx, const df_copy_2d_desc *c, const df_tensor *src, df_tensor *dst,
                              df_error *err) {
  return df_cu_copy_2d(df_cuda_cu_stream(ctx), src->dtype, src->data, c->src_offset, c->src_stride, dst->data,
                       c->dst_offset, c->dst_stride, c->rows, c->cols, c->accumulate, err);
}

extern "C" void df_cuda_register_gather(df_backend *be) {
  be->gather_rows = cuda_gather_rows;
  be->copy_2d = cuda_copy_2d;
}
