// CPU matmul / linear / axpy: every GEMM goes through df_cpu_sgemm (kernels/cpu/gemm.h), on the context's
// threads.
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/gemm.h"

df_status df_cpu_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b, float alpha,
                        float beta, df_tensor *c, df_error *err) {
  (void)err;
  int64_t m = c->shape[0], n = c->shape[1], k = trans_a ? a->shape[0] : a->shape[1];
  df_cpu_sgemm(ctx->num_threads, trans_a, trans_b, m, n, k, alpha, a->data, a->shape[1], b->data, b->shape[1], beta,
               c->data, n);
  return DF_OK;
}

df_status df_cpu_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b, df_tensor *y,
                                df_error *err) {
  (void)err;
  int64_t m = df_rows(x), k = w->shape[1], n = w->shape[0];
  float *yd = y->data;
  float beta = 0.0f;
  if (b) {
    const float *bd = b->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (m > 64)
    for (int64_t i = 0; i < m; i++) memcpy(yd + (size_t)i * n, bd, sizeof(float) * (size_t)n);
    beta = 1.0f;
  }
  // y[M,N] = x[M,K] · w[N,K]ᵀ
  df_cpu_sgemm(ctx->num_threads, false, true, m, n, k, 1.0f, x->data, k, w->data, k, beta, yd, n);
  return DF_OK;
}

df_status df_cpu_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                 df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err) {
  (void)err;
  int64_t m = df_rows(x), k = w->shape[1], n = w->shape[0];
  const int nt = ctx->num_threads;
  // dx[M,K] = dy[M,N] · w[N,K]
  if (dx)
    df_cpu_sgemm(nt, false, false, m, k, n, 1.0f, dy->data, n, w->data, k, accumulate_dx ? 1.0f : 0.0f, dx->data, k);
  // dw[N,K] += dy[M,N]ᵀ · x[M,K]
  if (dw) df_cpu_sgemm(nt, true, false, n, k, m, 1.0f, dy->data, n, x->data, k, 1.0f, dw->data, k);
  if (db) {
    const float *dyd = dy->data;
    float *dbd = db->data;
    // Column sums in a fixed row order per column: deterministic for any thread count.
#pragma omp parallel for num_threads(ctx->num_threads) if ((int64_t)m * n > 65536)
    for (int64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (int64_t i = 0; i < m; i++) s += dyd[(size_t)i * n + j];
      dbd[j] += (float)s;
    }
  }
  return DF_OK;
}

df_status df_cpu_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  (void)err;
  int64_t n = df_numel(x);
  const float *xd = x->data;
  float *yd = y->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (n > 1 << 16)
  for (int64_t i = 0; i < n; i++) yd[i] += alpha * xd[i];
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_linear(df_backend *be) {
  be->matmul = df_cpu_matmul;
  be->linear_forward = df_cpu_linear_forward;
  be->linear_backward = df_cpu_linear_backward;
  be->axpy = df_cpu_axpy;
}
