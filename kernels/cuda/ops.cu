// CUDA backend: context lifetime (device, stream, cuBLAS / cuBLASLt handles) and the op dispatch
// skeleton. matmul, linear and axpy run (fp32 cuBLAS for now; bf16 cuBLASLt arrives with the CUDA issue);
// every other op answers DF_ERR_NOT_IMPLEMENTED until its kernel is written.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "kernels/check.h"

typedef struct {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  cublasLtHandle_t blaslt;
} cuda_backend;

static df_status cuda_fail(df_error *err, cudaError_t e, const char *what) {
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, what, "check the driver and CUDA_VISIBLE_DEVICES", "%s: %s", what,
                 cudaGetErrorString(e));
}

static df_status blas_fail(df_error *err, cublasStatus_t s, const char *what) {
  return DF_FAIL(err, DF_ERR_INVALID, what, NULL, "%s failed with cuBLAS status %d", what, (int)s);
}

extern "C" int df_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

extern "C" df_status df_cuda_ctx_init(int device, void **backend, df_error *err) {
  *backend = NULL;
  int n = df_cuda_device_count();
  if (device < 0 || device >= n)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "device", "use the CPU backend on a machine without a GPU",
                   "CUDA device %d requested but %d device(s) are visible", device, n);
  cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
  if (!cb) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot allocate the CUDA backend");
  cb->device = device;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreate(&cb->stream);
  if (e != cudaSuccess) {
    free(cb);
    return cuda_fail(err, e, "cudaSetDevice/cudaStreamCreate");
  }
  cublasStatus_t s = cublasCreate(&cb->blas);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(cb->blas, cb->stream);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtCreate(&cb->blaslt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cudaStreamDestroy(cb->stream);
    free(cb);
    return blas_fail(err, s, "cublasCreate");
  }
  *backend = cb;
  return DF_OK;
}

extern "C" void df_cuda_ctx_free(void *backend) {
  cuda_backend *cb = (cuda_backend *)backend;
  if (!cb) return;
  cublasLtDestroy(cb->blaslt);
  cublasDestroy(cb->blas);
  cudaStreamDestroy(cb->stream);
  free(cb);
}

extern "C" df_status df_cuda_alloc(void *backend, size_t bytes, void **out, df_error *err) {
  (void)backend;
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
  return e == cudaSuccess ? DF_OK : cuda_fail(err, e, "cudaMalloc");
}

extern "C" void df_cuda_free(void *backend, void *p) {
  (void)backend;
  cudaFree(p);
}

extern "C" df_status df_cuda_memcpy(void *backend, void *dst, const void *src, size_t bytes, int kind, df_error *err) {
  static const cudaMemcpyKind kinds[] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
  cuda_backend *cb = (cuda_backend *)backend;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kinds[kind], cb->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
  return e == cudaSuccess ? DF_OK : cuda_fail(err, e, "cudaMemcpy");
}

extern "C" df_status df_cuda_sync(void *backend, df_error *err) {
  cudaError_t e = cudaStreamSynchronize(((cuda_backend *)backend)->stream);
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? DF_OK : cuda_fail(err, e, "cudaStreamSynchronize");
}

static cuda_backend *backend_of(df_ctx *ctx) { return (cuda_backend *)ctx->cuda; }

// Row-major C[M,N] = alpha op(A) op(B) + beta C is column-major Cᵀ = alpha op(B)ᵀ op(A)ᵀ + beta Cᵀ.
static df_status sgemm_rowmajor(df_ctx *ctx, bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                                int lda, const float *b, int ldb, float beta, float *c, int ldc, df_error *err) {
  cublasStatus_t s = cublasSgemm(backend_of(ctx)->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
  return s == CUBLAS_STATUS_SUCCESS ? DF_OK : blas_fail(err, s, "cublasSgemm");
}

extern "C" df_status df_cuda_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b,
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

static unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }

extern "C" df_status df_cuda_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b,
                                            df_tensor *y, df_error *err) {
  int m = (int)df_rows(x), k = (int)w->shape[1], n = (int)w->shape[0];
  float beta = 0.0f;
  if (b) {
    broadcast_rows<<<blocks_for((int64_t)m * n), 256, 0, backend_of(ctx)->stream>>>((float *)y->data,
                                                                                    (const float *)b->data, m, n);
    beta = 1.0f;
  }
  return sgemm_rowmajor(ctx, false, true, m, n, k, 1.0f, (const float *)x->data, k, (const float *)w->data, k, beta,
                        (float *)y->data, n, err);
}

extern "C" df_status df_cuda_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                             df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db,
                                             df_error *err) {
  int m = (int)df_rows(x), k = (int)w->shape[1], n = (int)w->shape[0];
  const float *dyd = (const float *)dy->data;
  if (dx)
    DF_TRY(sgemm_rowmajor(ctx, false, false, m, k, n, 1.0f, dyd, n, (const float *)w->data, k,
                          accumulate_dx ? 1.0f : 0.0f, (float *)dx->data, k, err));
  if (dw)
    DF_TRY(sgemm_rowmajor(ctx, true, false, n, k, m, 1.0f, dyd, n, (const float *)x->data, k, 1.0f, (float *)dw->data,
                          k, err));
  if (db) column_sums_add<<<blocks_for(n), 256, 0, backend_of(ctx)->stream>>>((float *)db->data, dyd, m, n);
  return DF_OK;
}

extern "C" df_status df_cuda_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  (void)err;
  int64_t n = df_numel(x);
  axpy_kernel<<<blocks_for(n), 256, 0, backend_of(ctx)->stream>>>(alpha, (const float *)x->data, (float *)y->data, n);
  return DF_OK;
}

// Ops whose kernels are not written yet: each says so and names itself.
#define DF_CUDA_TODO(op)                                                                                               \
  return DF_FAIL(err, DF_ERR_NOT_IMPLEMENTED, #op, "run this op on the CPU backend", "op %s has no CUDA kernel yet",   \
                 #op)

extern "C" df_status df_cuda_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps,
                                             df_tensor *y, df_tensor *rstd, df_error *err) {
  DF_CUDA_TODO(rmsnorm_forward);
}

extern "C" df_status df_cuda_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                              const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                              df_error *err) {
  DF_CUDA_TODO(rmsnorm_backward);
}

extern "C" df_status df_cuda_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos,
                                          const df_tensor *inv_freq, float mscale, df_tensor *y, df_error *err) {
  DF_CUDA_TODO(rope_forward);
}

extern "C" df_status df_cuda_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos,
                                           const df_tensor *inv_freq, float mscale, df_tensor *dx, df_error *err) {
  DF_CUDA_TODO(rope_backward);
}

extern "C" df_status df_cuda_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit,
                                            df_tensor *h, df_error *err) {
  DF_CUDA_TODO(swiglu_forward);
}

extern "C" df_status df_cuda_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u,
                                             float limit, df_tensor *dg, df_tensor *du, df_error *err) {
  DF_CUDA_TODO(swiglu_backward);
}

extern "C" df_status df_cuda_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids,
                                               df_tensor *out, df_error *err) {
  DF_CUDA_TODO(embedding_forward);
}

extern "C" df_status df_cuda_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids,
                                                df_tensor *dtable, df_error *err) {
  DF_CUDA_TODO(embedding_backward);
}

extern "C" df_status df_cuda_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                                const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                                const df_tensor *keep, df_tensor *out, df_tensor *lse, df_error *err) {
  DF_CUDA_TODO(block_attn_forward);
}

extern "C" df_status df_cuda_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                                 const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                                 const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                                 const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                                 df_error *err) {
  DF_CUDA_TODO(block_attn_backward);
}

extern "C" df_status df_cuda_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden,
                                       const df_tensor *head, const df_tensor *labels, const df_tensor *weights,
                                       df_tensor *loss, df_tensor *correct, df_tensor *dhidden, df_error *err) {
  DF_CUDA_TODO(lmhead_ce);
}

extern "C" df_status df_cuda_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1,
                                                df_error *err) {
  DF_CUDA_TODO(softmax_l1_forward);
}

extern "C" df_status df_cuda_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q,
                                                 const df_tensor *dl1, df_tensor *dp, df_error *err) {
  DF_CUDA_TODO(softmax_l1_backward);
}

extern "C" df_status df_cuda_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss,
                                                df_error *err) {
  DF_CUDA_TODO(bce_logits_forward);
}

extern "C" df_status df_cuda_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t,
                                                 const df_tensor *dloss, df_tensor *dx, df_error *err) {
  DF_CUDA_TODO(bce_logits_backward);
}

extern "C" df_status df_cuda_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc,
                                           const df_lmhead_dspark_in *in, const df_lmhead_dspark_out *out,
                                           df_error *err) {
  DF_CUDA_TODO(lmhead_dspark);
}

extern "C" df_status df_cuda_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m,
                                        df_tensor *v, const df_adamw_hparams *hp, df_error *err) {
  DF_CUDA_TODO(adamw_step);
}

extern "C" df_status df_cuda_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err) {
  DF_CUDA_TODO(global_norm);
}

extern "C" df_status df_cuda_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm,
                                          double *coef, df_error *err) {
  DF_CUDA_TODO(clip_by_norm);
}
