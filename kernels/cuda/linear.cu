// CUDA matmul / linear / axpy (twin of kernels/cpu/linear.c): every GEMM through the cached cuBLASLt wrapper
// (kernels/cuda/gemm.cu) in the storage dtype, fp32 compute; the bias as cuBLASLt's BIAS epilogue; the bias
// gradient as column sums in double, rows in order (deterministic), added in the storage dtype.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

df_cu_gemm_args gemm_of(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                        int64_t ldb, df_dtype st, void *D, int64_t ldd, float alpha, float beta) {
  df_cu_gemm_args g = {};
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = st, g.D = D, g.ldd = ldd, g.cd_dt = st, g.alpha = alpha, g.beta = beta;
  return g;
}

// db[j] += Σ_i dy[i, j], rows in order, in double (db f32 or the storage dtype).
template <typename T, typename TB> __global__ void column_sums_add(TB *db, const T *dy, int64_t rows, int64_t n) {
  const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (j >= n) return;
  double s = 0.0;
  for (int64_t i = 0; i < rows; i++) s += df_ld(dy + i * n + j);
  df_st(db + j, df_ld(db + j) + (float)s);
}

} // namespace

static df_status cuda_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b,
                             float alpha, float beta, df_tensor *c, df_error *err) {
  const int64_t m = c->shape[0], n = c->shape[1], k = trans_a ? a->shape[0] : a->shape[1];
  df_cu_gemm_args g =
      gemm_of(trans_a, trans_b, m, n, k, a->data, a->shape[1], b->data, b->shape[1], c->dtype, c->data, n, alpha, beta);
  return df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &g, err);
}

static df_status cuda_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b,
                                     df_tensor *y, df_error *err) {
  const int64_t m = df_rows(x), k = w->shape[1], n = w->shape[0];
  df_cu_gemm_args g = gemm_of(false, true, m, n, k, x->data, k, w->data, k, y->dtype, y->data, n, 1.0f, 0.0f);
  if (b) g.bias = b->data, g.bias_dt = b->dtype; // y = x·wᵀ + b in the GEMM's epilogue
  return df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &g, err);
}

static df_status cuda_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                      df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err) {
  const int64_t m = df_rows(x), k = w->shape[1], n = w->shape[0];
  const df_dtype st = dy->dtype;
  df_cu_gemm_ctx *g = df_cuda_gemm(ctx);
  const df_cu_stream s = df_cuda_cu_stream(ctx);
  if (dx) { // dx[M, K] (=/+=) dy[M, N] · w[N, K]
    df_cu_gemm_args a =
        gemm_of(false, false, m, k, n, dy->data, n, w->data, k, st, dx->data, k, 1.0f, accumulate_dx ? 1.0f : 0.0f);
    DF_TRY(df_cu_gemm(g, s, &a, err));
  }
  if (dw) { // dw[N, K] += dy[M, N]ᵀ · x[M, K] (dw f32 under bf16 storage: fp32 output, no bf16 rounding)
    df_cu_gemm_args a = gemm_of(true, false, n, k, m, dy->data, n, x->data, k, st, dw->data, k, 1.0f, 1.0f);
    a.cd_dt = dw->dtype;
    DF_TRY(df_cu_gemm(g, s, &a, err));
  }
  if (db && db->dtype != st) { // f32 bias gradient of bf16 storage
    column_sums_add<bf16, float>
        <<<df_cu_blocks(n, 256), 256, 0, s>>>((float *)db->data, (const bf16 *)dy->data, m, n);
  } else if (db) {
    DF_CU_SWITCH_DT(st, T, err, "linear_backward.db",
                    column_sums_add<T, T>
                    <<<df_cu_blocks(n, 256), 256, 0, s>>>((T *)db->data, (const T *)dy->data, m, n));
    DF_CU_CHECK_LAUNCH(err, "linear_backward.column_sums");
  }
  return DF_OK;
}

static df_status cuda_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  return df_cu_axpy(df_cuda_cu_stream(ctx), alpha, x->data, x->dtype, y->data, y->dtype, df_numel(x), err);
}

extern "C" void df_cuda_register_linear(df_backend *be) {
  be->matmul = cuda_matmul;
  be->linear_forward = cuda_linear_forward;
  be->linear_backward = cuda_linear_backward;
  be->axpy = cuda_axpy;
}
