// Dispatch and validation for matmul, linear and axpy. Every tensor shares one storage dtype (f32 or bf16);
// the backend table says whether it takes it.
#include "kernels/check.h"

df_status df_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b, float alpha,
                    float beta, df_tensor *c, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(a, "a", &st, err));
  DF_TRY(df_check_tensor(ctx, a, "a", st, 2, err));
  DF_TRY(df_check_tensor(ctx, b, "b", st, 2, err));
  DF_TRY(df_check_tensor(ctx, c, "c", st, 2, err));
  int64_t m = trans_a ? a->shape[1] : a->shape[0];
  int64_t k = trans_a ? a->shape[0] : a->shape[1];
  int64_t kb = trans_b ? b->shape[1] : b->shape[0];
  int64_t n = trans_b ? b->shape[0] : b->shape[1];
  if (k != kb)
    return DF_FAIL(err, DF_ERR_INVALID, "b", NULL,
                   "matmul inner dims differ: op(a) is [%lld,%lld], op(b) is [%lld,%lld]", (long long)m, (long long)k,
                   (long long)kb, (long long)n);
  DF_TRY(df_check_dim(c, "c", 0, m, err));
  DF_TRY(df_check_dim(c, "c", 1, n, err));
  DF_REQUIRE_OP(ctx, DF_OP_MATMUL, st, err);
  return ctx->backend->matmul(ctx, a, trans_a, b, trans_b, alpha, beta, c, err);
}

static df_status check_linear(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b,
                              const df_tensor *y, const char *yname, df_dtype *st, df_error *err) {
  DF_TRY(df_check_storage(w, "w", st, err));
  DF_TRY(df_check_tensor(ctx, w, "w", *st, 2, err));
  DF_TRY(df_check_tensor(ctx, x, "x", *st, -1, err));
  DF_TRY(df_check_tensor(ctx, y, yname, *st, -1, err));
  DF_TRY(df_check_dim(x, "x", x->ndim - 1, w->shape[1], err));
  DF_TRY(df_check_dim(y, yname, y->ndim - 1, w->shape[0], err));
  if (df_rows(x) != df_rows(y))
    return DF_FAIL(err, DF_ERR_INVALID, yname, NULL, "'%s' has %lld rows but x has %lld", yname, (long long)df_rows(y),
                   (long long)df_rows(x));
  if (b) {
    DF_TRY(df_check_tensor(ctx, b, "b", *st, 1, err));
    DF_TRY(df_check_dim(b, "b", 0, w->shape[0], err));
  }
  return DF_OK;
}

df_status df_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b, df_tensor *y,
                            df_error *err) {
  df_dtype st;
  DF_TRY(check_linear(ctx, x, w, b, y, "y", &st, err));
  DF_REQUIRE_OP(ctx, DF_OP_LINEAR_FORWARD, st, err);
  return ctx->backend->linear_forward(ctx, x, w, b, y, err);
}

df_status df_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w, df_tensor *dx,
                             bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err) {
  df_dtype st;
  DF_TRY(check_linear(ctx, x, w, NULL, dy, "dy", &st, err));
  if (dx) DF_TRY(df_check_same_numel(x, "x", dx, "dx", err));
  if (dx) DF_TRY(df_check_tensor(ctx, dx, "dx", st, -1, err));
  if (dw) DF_TRY(df_check_tensor(ctx, dw, "dw", df_grad_dtype(dw, st), 2, err));
  if (dw) DF_TRY(df_check_same_numel(w, "w", dw, "dw", err));
  if (db) DF_TRY(df_check_tensor(ctx, db, "db", df_grad_dtype(db, st), 1, err));
  if (db) DF_TRY(df_check_dim(db, "db", 0, w->shape[0], err));
  DF_REQUIRE_OP(ctx, DF_OP_LINEAR_BACKWARD, st, err);
  return ctx->backend->linear_backward(ctx, dy, x, w, dx, accumulate_dx, dw, db, err);
}

df_status df_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(y, "y", &st, err));
  DF_TRY(df_check_tensor(ctx, x, "x", st, -1, err));
  DF_TRY(df_check_tensor(ctx, y, "y", st, -1, err));
  DF_TRY(df_check_same_numel(x, "x", y, "y", err));
  DF_REQUIRE_OP(ctx, DF_OP_AXPY, st, err);
  return ctx->backend->axpy(ctx, alpha, x, y, err);
}
