// Dispatch and validation for the DSpark Markov-head ops (the gated gate and the rnn cell; kernels/ops.h).
#include "kernels/check.h"

// t is a [rows, cols] view (any shape holding rows·cols elements, last dim cols) of storage st.
static df_status check_rows(const df_ctx *ctx, const df_tensor *t, const char *name, df_dtype st, int64_t rows,
                            int64_t cols, df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, t, name, st, -1, err));
  if (df_numel(t) != rows * cols || (t->ndim > 0 && df_last_dim(t) != cols))
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' %s should be [%lld, %lld]", name,
                   df_tensor_desc(t, d, sizeof d), (long long)rows, (long long)cols);
  return DF_OK;
}

df_status df_markov_gate_forward(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate, df_tensor *u,
                                 df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(e, "e", &st, err));
  DF_TRY(df_check_tensor(ctx, e, "e", st, 2, err));
  const int64_t R = e->shape[0], r = e->shape[1];
  DF_TRY(check_rows(ctx, pre, "pre", st, R, r, err));
  DF_TRY(check_rows(ctx, gate, "gate", st, R, r, err));
  DF_TRY(check_rows(ctx, u, "u", st, R, r, err));
  DF_REQUIRE_OP(ctx, DF_OP_MARKOV_GATE_FORWARD, st, err);
  return ctx->backend->markov_gate_forward(ctx, pre, e, gate, u, err);
}

df_status df_markov_gate_backward(df_ctx *ctx, const df_tensor *gate, const df_tensor *e, const df_tensor *du,
                                  df_tensor *de, df_tensor *dpre, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(e, "e", &st, err));
  DF_TRY(df_check_tensor(ctx, e, "e", st, 2, err));
  const int64_t R = e->shape[0], r = e->shape[1];
  DF_TRY(check_rows(ctx, gate, "gate", st, R, r, err));
  DF_TRY(check_rows(ctx, du, "du", st, R, r, err));
  DF_TRY(check_rows(ctx, de, "de", st, R, r, err));
  DF_TRY(check_rows(ctx, dpre, "dpre", st, R, r, err));
  DF_REQUIRE_OP(ctx, DF_OP_MARKOV_GATE_BACKWARD, st, err);
  return ctx->backend->markov_gate_backward(ctx, gate, e, du, de, dpre, err);
}

// y [nb, 3r] gives nb and r; the slot lies in [0, bs) and u / du hold nb·bs rows of r.
static df_status check_rnn(const df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y, df_dtype *st,
                           int64_t *nb, int64_t *r, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", NULL, "desc is NULL");
  if (desc->block_size < 1 || desc->slot < 0 || desc->slot >= desc->block_size)
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "slot in [0, block_size), block_size >= 1",
                   "bad rnn slot %lld of block size %lld", (long long)desc->slot, (long long)desc->block_size);
  DF_TRY(df_check_storage(y, "y", st, err));
  DF_TRY(df_check_tensor(ctx, y, "y", *st, 2, err));
  if (y->shape[1] % 3 || y->shape[1] == 0)
    return DF_FAIL(err, DF_ERR_INVALID, "y", "y holds (a, c, o): 3·r columns", "y has %lld columns, not 3·r",
                   (long long)y->shape[1]);
  *nb = y->shape[0], *r = y->shape[1] / 3;
  return DF_OK;
}

df_status df_markov_rnn_forward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                const df_tensor *s_prev, df_tensor *s, df_tensor *u, df_error *err) {
  df_dtype st;
  int64_t nb = 0, r = 0;
  DF_TRY(check_rnn(ctx, desc, y, &st, &nb, &r, err));
  if (s_prev) DF_TRY(check_rows(ctx, s_prev, "s_prev", st, nb, r, err));
  DF_TRY(check_rows(ctx, s, "s", st, nb, r, err));
  DF_TRY(check_rows(ctx, u, "u", st, nb * desc->block_size, r, err));
  DF_REQUIRE_OP(ctx, DF_OP_MARKOV_RNN_FORWARD, st, err);
  return ctx->backend->markov_rnn_forward(ctx, desc, y, s_prev, s, u, err);
}

df_status df_markov_rnn_backward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                 const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                 df_error *err) {
  df_dtype st;
  int64_t nb = 0, r = 0;
  DF_TRY(check_rnn(ctx, desc, y, &st, &nb, &r, err));
  if (s_prev) DF_TRY(check_rows(ctx, s_prev, "s_prev", st, nb, r, err));
  if (du) DF_TRY(check_rows(ctx, du, "du", st, nb * desc->block_size, r, err));
  DF_TRY(check_rows(ctx, ds, "ds", st, nb, r, err));
  DF_TRY(check_rows(ctx, dy, "dy", st, nb, 3 * r, err));
  DF_REQUIRE_OP(ctx, DF_OP_MARKOV_RNN_BACKWARD, st, err);
  return ctx->backend->markov_rnn_backward(ctx, desc, y, s_prev, du, ds, dy, err);
}
