// CUDA elementwise kernels: dtype casts (fp32 → bf16 rounds to nearest even), fill, scale, y += alpha·x and
// out = a + b. Grid-stride loops, fp32 arithmetic, any mix of f32 / bf16 storage.
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
