// CUDA matmul / linear / axpy (twin of kernels/cpu/linear.c): fp32 cuBLAS GEMMs on the context's stream and
// small bias / column-sum / axpy kernels. bf16 storage through cuBLASLt arrives with the CUDA issue.
#include "kernels/cuda/backend.h"

// Row-major C[M,N] = alpha op(A) op(B) + beta C is column-major Cᵀ = alpha op(B)ᵀ op(A)ᵀ + beta Cᵀ.
static df_status sgemm_rowmajor(df_ctx *ctx, bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                                int lda, const float *b, int ldb, float beta, float *c, int ldc, df_error *err) {
  cublasStatus_t s = cublasSgemm(df_cuda_of(ctx)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
  return s == CUBLAS_STATUS_SUCCESS ? DF_OK : df_cuda_blas_fail(err, s, "cublasSgemm");
}

static df_status cuda_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b,
                             float alpha, float beta, df_tensor *c, df_error *err) {
  int m = (int)c->shape[0], n = (int)c->shape[1];
  int k = (int)(trans_a ? a->shape[0] : a->shape[1]);
  return sgemm_rowmajor(ctx, trans_a, trans_b, m, n, k, alpha, (const float *)a->data, (int)a->shape[1],
                        (const float *)b->data, (int)b->shape[1], beta, (float *)c->data, n, err);
}

__global__ void broadcast_rows(float *y, const float *b, int64_t rows, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < rows * n) y[i] = b[i % n];
}

// db[j] += Σ_i dy[i, j], rows in order (deterministic).
__global__ void column_sums_add(float *db, const float *dy, int64_t rows, int64_t n) {
  int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= n) return;
  float s = 0.0f;
  for (int64_t i = 0; i < rows; i++) s += dy[i * n + j];
  db[j] += s;
}

__global__ void axpy_kernel(float alpha, const float *x, float *y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] += alpha * x[i];
}

static df_status cuda_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b,
                                     df_tensor *y, df_error *err) {
  int m = (int)df_rows(x), k = (int)w->shape[1], n = (int)w->shape[0];
  float beta = 0.0f;
  if (b) {
    broadcast_rows<<<df_cuda_blocks((int64_t)m * n, 256), 256, 0, df_cuda_stream(ctx)>>>((float *)y->data,
                                                                                         (const float *)b->data, m, n);
    DF_CUDA_CHECK_LAUNCH(err, "broadcast_rows");
    beta = 1.0f;
  }
  return sgemm_rowmajor(ctx, false, true, m, n, k, 1.0f, (const float *)x->data, k, (const float *)w->data, k, beta,
                        (float *)y->data, n, err);
}

static df_status cuda_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                      df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err) {
  int m = (int)df_rows(x), k = (int)w->shape[1], n = (int)w->shape[0];
  const float *dyd = (const float *)dy->data;
  if (dx)
    DF_TRY(sgemm_rowmajor(ctx, false, false, m, k, n, 1.0f, dyd, n, (const float *)w->data, k,
                          accumulate_dx ? 1.0f : 0.0f, (float *)dx->data, k, err));
  if (dw)
    DF_TRY(sgemm_rowmajor(ctx, true, false, n, k, m, 1.0f, dyd, n, (const float *)x->data, k, 1.0f, (float *)dw->data,
                          k, err));
  if (db) {
    column_sums_add<<<df_cuda_blocks(n, 256), 256, 0, df_cuda_stream(ctx)>>>((float *)db->data, dyd, m, n);
    DF_CUDA_CHECK_LAUNCH(err, "column_sums_add");
  }
  return DF_OK;
}

static df_status cuda_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  int64_t n = df_numel(x);
  axpy_kernel<<<df_cuda_blocks(n, 256), 256, 0, df_cuda_stream(ctx)>>>(alpha, (const float *)x->data, (float *)y->data,
                                                                       n);
  DF_CUDA_CHECK_LAUNCH(err, "axpy_kernel");
  return DF_OK;
}

extern "C" void df_cuda_register_linear(df_backend *be) {
  be->matmul = cuda_matmul;
  be->linear_forward = cuda_linear_forward;
  be->linear_backward = cuda_linear_backward;
  be->axpy = cuda_axpy;
}
