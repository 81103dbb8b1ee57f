// CUDA elementwise kernels (twin of kernels/cpu/elementwise.c): dtype casts (fp32 → bf16 rounds to nearest even),
// fill of any dtype, scale, y += alpha·x and out = a + b. Grid-stride loops, fp32 arithmetic, any mix of f32 /
// bf16 storage; the backend table's fill / scale / cast.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 65535u * 8u;

unsigned blocks_for(int64_t n) {
  unsigned b = df_cu_blocks(n, kThreads);
  return b < kMaxBlocks ? b : kMaxBlocks;
}

template <typename D, typename S> __global__ void cast_kernel(D *dst, const S *src, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(dst + i, df_ld(src + i));
}

template <typename T> __global__ void fill_kernel(T *dst, int64_t n, float value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(dst + i, value);
}

template <typename T> __global__ void fill_raw_kernel(T *dst, int64_t n, T value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

template <typename T> __global__ void scale_kernel(T *x, int64_t n, float alpha, const float *d_alpha) {
  const float a = d_alpha ? *d_alpha : alpha;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(x + i, df_ld(x + i) * a);
}

template <typename X, typename Y> __global__ void axpy_kernel(float alpha, const X *x, Y *y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(y + i, df_ld(y + i) + alpha * df_ld(x + i));
}

template <typename A, typename B, typename O> __global__ void add_kernel(const A *a, const B *b, O *out, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(out + i, df_ld(a + i) + df_ld(b + i));
}

} // namespace

extern "C" df_status df_cu_cast(df_cu_stream s, void *dst, df_dtype dst_dt, const void *src, df_dtype src_dt, int64_t n,
                                df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dst_dt, D, err, "cast.dst",
                  DF_CU_SWITCH_DT(src_dt, S, err, "cast.src",
                                  cast_kernel<D, S><<<blocks_for(n), kThreads, 0, s>>>((D *)dst, (const S *)src, n)));
  DF_CU_CHECK_LAUNCH(err, "cast");
  return DF_OK;
}

extern "C" df_status df_cu_fill(df_cu_stream s, void *dst, df_dtype dt, int64_t n, float value, df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "fill", fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>((T *)dst, n, value));
  DF_CU_CHECK_LAUNCH(err, "fill");
  return DF_OK;
}

// ---- the backend table's slots ---------------------------------------------------------------------------------

static df_status cuda_fill(df_ctx *ctx, df_tensor *t, double value, df_error *err) {
  const cudaStream_t s = df_cuda_stream(ctx);
  const int64_t n = df_numel(t);
  if (n <= 0) return DF_OK;
  if (value == 0.0 && !signbit(value)) { // every dtype's zero is all-zero bytes
    DF_CU_TRY(err, cudaMemsetAsync(t->data, 0, (size_t)n * df_dtype_size(t->dtype), s), "fill (memset)");
    return DF_OK;
  }
  const unsigned b = blocks_for(n);
  switch (t->dtype) {
  case DF_F32:
  case DF_BF16: return df_cu_fill((df_cu_stream)s, t->data, t->dtype, n, (float)value, err);
  case DF_F64: fill_raw_kernel<double><<<b, kThreads, 0, s>>>((double *)t->data, n, value); break;
  case DF_I64: fill_raw_kernel<int64_t><<<b, kThreads, 0, s>>>((int64_t *)t->data, n, (int64_t)value); break;
  case DF_I32: fill_raw_kernel<int32_t><<<b, kThreads, 0, s>>>((int32_t *)t->data, n, (int32_t)value); break;
  case DF_U8:
  case DF_BOOL:
    DF_CU_TRY(err, cudaMemsetAsync(t->data, (int)(uint8_t)value, (size_t)n, s), "fill (memset)");
    return DF_OK;
  default: return df_cu_bad_dtype(err, "fill", t->dtype);
  }
  DF_CU_CHECK_LAUNCH(err, "fill");
  return DF_OK;
}

static df_status cuda_scale(df_ctx *ctx, df_tensor *t, float alpha, df_error *err) {
  return df_cu_scale(df_cuda_cu_stream(ctx), t->data, t->dtype, df_numel(t), alpha, NULL, err);
}

static df_status cuda_cast(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err) {
  const int64_t n = df_numel(src);
  if (src->dtype == dst->dtype) {
    DF_CU_TRY(err,
              cudaMemcpyAsync(dst->data, src->data, (size_t)n * df_dtype_size(src->dtype), cudaMemcpyDeviceToDevice,
                              df_cuda_stream(ctx)),
              "cast (copy)");
    return DF_OK;
  }
  return df_cu_cast(df_cuda_cu_stream(ctx), dst->data, dst->dtype, src->data, src->dtype, n, err);
}

extern "C" void df_cuda_register_elementwise(df_backend *be) {
  be->fill = cuda_fill;
  be->scale = cuda_scale;
  be->cast = cuda_cast;
}

extern "C" df_status df_cu_scale(df_cu_stream s, void *x, df_dtype dt, int64_t n, float alpha, const float *d_alpha,
                                 df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "scale", scale_kernel<T><<<blocks_for(n), kThreads, 0, s>>>((T *)x, n, alpha, d_alpha));
  DF_CU_CHECK_LAUNCH(err, "scale");
  return DF_OK;
}

extern "C" df_status df_cu_axpy(df_cu_stream s, float alpha, const void *x, df_dtype x_dt, void *y, df_dtype y_dt,
                                int64_t n, df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(x_dt, X, err, "axpy.x",
                  DF_CU_SWITCH_DT(y_dt, Y, err, "axpy.y",
                                  axpy_kernel<X, Y>
                                  <<<blocks_for(n), kThreads, 0, s>>>(alpha, (const X *)x, (Y *)y, n)));
  DF_CU_CHECK_LAUNCH(err, "axpy");
  return DF_OK;
}

extern "C" df_status df_cu_add(df_cu_stream s, const void *a, df_dtype a_dt, const void *b, df_dtype b_dt, void *out,
                               df_dtype out_dt, int64_t n, df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(a_dt, A, err, "add.a",
                  DF_CU_SWITCH_DT(b_dt, B, err, "add.b",
                                  DF_CU_SWITCH_DT(out_dt, O, err, "add.out",
                                                  add_kernel<A, B, O><<<blocks_for(n), kThreads, 0, s>>>(
                                                      (const A *)a, (const B *)b, (O *)out, n))));
  DF_CU_CHECK_LAUNCH(err, "add");
  return DF_OK;
}
