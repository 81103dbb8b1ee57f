// Dispatch and validation for the losses: fused LM head + cross-entropy, softmax L1 distance, BCE with logits.
// Hidden rows, the head and logits take the storage dtype (f32 or bf16); per-row losses, weights and the BCE's
// confidence logits are fp32.
#include <limits.h>
#include <math.h>

#include "kernels/check.h"

// BLAS takes int dimensions; a feature width or vocabulary beyond that is a caller mistake.
static df_status check_int_dim(const df_tensor *t, const char *name, int dim, df_error *err) {
  char d[96];
  if (t->shape[dim] < 1 || t->shape[dim] > INT_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s: dim %d must be in [1, INT_MAX]", name,
                   df_tensor_desc(t, d, sizeof d), dim);
  return DF_OK;
}

// t is viewed as [rows, last] and its last dim must be `last`.
static df_status check_last_dim(const df_tensor *t, const char *name, int64_t last, df_error *err) {
  char d[96];
  if (t->ndim < 1)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s, expected at least 1 dim", name,
                   df_tensor_desc(t, d, sizeof d));
  return df_check_dim(t, name, t->ndim - 1, last, err);
}

static df_status check_lmhead_desc(const df_lmhead_ce_desc *desc, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_lmhead_ce_desc", "desc is NULL");
  return df_check_chunked_loss(desc->chunk_rows, desc->grad_scale, err);
}

df_status df_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden, const df_tensor *head,
                       const df_tensor *labels, const df_tensor *weights, df_tensor *loss, df_tensor *correct,
                       df_tensor *dhidden, df_error *err) {
  DF_TRY(check_lmhead_desc(desc, err));
  df_dtype st;
  DF_TRY(df_check_storage(head, "head", &st, err));
  DF_TRY(df_check_tensor(ctx, head, "head", st, 2, err));
  DF_TRY(check_int_dim(head, "head", 0, err));
  DF_TRY(check_int_dim(head, "head", 1, err));
  DF_TRY(df_check_tensor(ctx, hidden, "hidden", st, -1, err));
  DF_TRY(check_last_dim(hidden, "hidden", head->shape[1], err));
  int64_t rows = df_rows(hidden);
  DF_TRY(df_check_per_row(ctx, labels, "labels", DF_I32, rows, err));
  if (weights) DF_TRY(df_check_per_row(ctx, weights, "weights", DF_F32, rows, err));
  DF_TRY(df_check_per_row(ctx, loss, "loss", DF_F32, rows, err));
  DF_TRY(df_check_per_row(ctx, correct, "correct", DF_U8, rows, err));
  if (dhidden) {
    DF_TRY(df_check_tensor(ctx, dhidden, "dhidden", st, -1, err));
    DF_TRY(df_check_same_numel(hidden, "hidden", dhidden, "dhidden", err));
  }
  // Label values live on the op's device, so each backend range-checks them before writing anything.
  DF_REQUIRE_OP(ctx, DF_OP_LMHEAD_CE, st, err);
  return ctx->backend->lmhead_ce(ctx, desc, hidden, head, labels, weights, loss, correct, dhidden, err);
}

// p and q are logit sets of one shape, viewed as [R, V].
static df_status check_logit_pair(const df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_dtype *st,
                                  df_error *err) {
  DF_TRY(df_check_storage(p, "p", st, err));
  DF_TRY(df_check_tensor(ctx, p, "p", *st, -1, err));
  DF_TRY(df_check_tensor(ctx, q, "q", *st, -1, err));
  if (p->ndim < 1 || df_last_dim(p) < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "p", "pass logits viewed as [R, V] with V >= 1", "tensor 'p' has no vocab");
  DF_TRY(check_last_dim(q, "q", df_last_dim(p), err));
  DF_TRY(df_check_same_numel(p, "p", q, "q", err));
  return DF_OK;
}

df_status df_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1, df_error *err) {
  df_dtype st;
  DF_TRY(check_logit_pair(ctx, p, q, &st, err));
  DF_TRY(df_check_per_row(ctx, l1, "l1", DF_F32, df_rows(p), err));
  DF_REQUIRE_OP(ctx, DF_OP_SOFTMAX_L1_FORWARD, st, err);
  return ctx->backend->softmax_l1_forward(ctx, p, q, l1, err);
}

df_status df_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                 df_tensor *dp, df_error *err) {
  df_dtype st;
  DF_TRY(check_logit_pair(ctx, p, q, &st, err));
  DF_TRY(df_check_per_row(ctx, dl1, "dl1", DF_F32, df_rows(p), err));
  DF_TRY(df_check_tensor(ctx, dp, "dp", st, -1, err));
  DF_TRY(df_check_same_numel(p, "p", dp, "dp", err));
  DF_REQUIRE_OP(ctx, DF_OP_SOFTMAX_L1_BACKWARD, st, err);
  return ctx->backend->softmax_l1_backward(ctx, p, q, dl1, dp, err);
}

// x and every per-element companion hold the same number of elements.
static df_status check_elementwise(const df_ctx *ctx, const df_tensor *x, const df_tensor *t, const char *tn,
                                   df_error *err) {
  DF_TRY(df_check_tensor(ctx, t, tn, DF_F32, -1, err));
  return df_check_same_numel(x, "x", t, tn, err);
}

df_status df_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss, df_error *err) {
  DF_TRY(df_check_tensor(ctx, x, "x", DF_F32, -1, err));
  DF_TRY(check_elementwise(ctx, x, t, "t", err));
  DF_TRY(check_elementwise(ctx, x, loss, "loss", err));
  DF_REQUIRE_OP(ctx, DF_OP_BCE_LOGITS_FORWARD, DF_F32, err);
  return ctx->backend->bce_logits_forward(ctx, x, t, loss, err);
}

df_status df_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                 df_tensor *dx, df_error *err) {
  DF_TRY(df_check_tensor(ctx, x, "x", DF_F32, -1, err));
  DF_TRY(check_elementwise(ctx, x, t, "t", err));
  DF_TRY(check_elementwise(ctx, x, dloss, "dloss", err));
  DF_TRY(check_elementwise(ctx, x, dx, "dx", err));
  DF_REQUIRE_OP(ctx, DF_OP_BCE_LOGITS_BACKWARD, DF_F32, err);
  return ctx->backend->bce_logits_backward(ctx, x, t, dloss, dx, err);
}
