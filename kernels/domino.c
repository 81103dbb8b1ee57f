// Dispatch and validation for Domino's ops (kernels/ops_domino.h): the GRU, the masked SiLU, the fused two-logit-set
// LM head and the block metrics. Activations, weights and their gradients take the storage dtype (f32 or bf16);
// per-row outputs, weights and flags are fp32 / u8, the stats f64.
#include <limits.h>
#include <math.h>

#include "kernels/check.h"

// t is a [rows, cols] matrix (any shape holding rows·cols elements with last dim cols) of storage st.
static df_status check_matrix(const df_ctx *ctx, const df_tensor *t, const char *name, int64_t rows, int64_t cols,
                              df_dtype st, df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, t, name, st, -1, err));
  if (t->ndim < 1 || df_last_dim(t) != cols || df_numel(t) != rows * cols)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s, expected [%lld, %lld]", name,
                   df_tensor_desc(t, d, sizeof d), (long long)rows, (long long)cols);
  return DF_OK;
}

// ---- GRU ----------------------------------------------------------------------------------------------------------

// w_hh [3G, G] gives G and the storage; gi [nb·stride, 3G] gives nb.
static df_status check_gru(const df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *rows,
                           const char *rows_name, int64_t rows_cols_per_g, df_dtype *st, int64_t *nb, int64_t *G,
                           df_error *err) {
  char d[96];
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_gru_desc", "desc is NULL");
  if (desc->stride < 1 || desc->steps < 1 || desc->steps > desc->stride)
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "1 <= steps <= stride", "steps %lld, stride %lld",
                   (long long)desc->steps, (long long)desc->stride);
  DF_TRY(df_check_storage(w_hh, "w_hh", st, err));
  DF_TRY(df_check_tensor(ctx, w_hh, "w_hh", *st, 2, err));
  *G = w_hh->shape[1];
  if (*G < 1 || *G > INT_MAX / 4 || w_hh->shape[0] != 3 * *G)
    return DF_FAIL(err, DF_ERR_INVALID, "w_hh", "W_hh is [3G, G] (row blocks r, z, n)", "tensor 'w_hh' is %s",
                   df_tensor_desc(w_hh, d, sizeof d));
  DF_TRY(df_check_tensor(ctx, rows, rows_name, *st, -1, err));
  const int64_t w = rows_cols_per_g * *G;
  if (rows->ndim < 1 || df_last_dim(rows) != w || df_numel(rows) % (w * desc->stride))
    return DF_FAIL(err, DF_ERR_INVALID, rows_name, "rows are whole sequences of `stride` rows",
                   "tensor '%s' is %s: not nb·%lld rows of %lld", rows_name, df_tensor_desc(rows, d, sizeof d),
                   (long long)desc->stride, (long long)w);
  *nb = df_numel(rows) / (w * desc->stride);
  return DF_OK;
}

df_status df_gru_forward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh, df_tensor *s,
                         df_tensor *gates, df_error *err) {
  df_dtype st;
  int64_t nb = 0, G = 0;
  DF_TRY(check_gru(ctx, desc, w_hh, gi, "gi", 3, &st, &nb, &G, err));
  const int64_t R = nb * desc->stride;
  DF_TRY(check_matrix(ctx, s, "s", R, G, st, err));
  if (gates) DF_TRY(check_matrix(ctx, gates, "gates", R, 4 * G, st, err));
  DF_REQUIRE_OP(ctx, DF_OP_GRU_FORWARD, st, err);
  return ctx->backend->gru_forward(ctx, desc, gi, w_hh, s, gates, err);
}

df_status df_gru_backward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                          const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh,
                          df_error *err) {
  df_dtype st;
  int64_t nb = 0, G = 0;
  DF_TRY(check_gru(ctx, desc, w_hh, s, "s", 1, &st, &nb, &G, err));
  const int64_t R = nb * desc->stride;
  if (!gates) return DF_FAIL(err, DF_ERR_INVALID, "gates", "run df_gru_forward with gates", "gates is NULL");
  DF_TRY(check_matrix(ctx, gates, "gates", R, 4 * G, st, err));
  DF_TRY(check_matrix(ctx, ds, "ds", R, G, st, err));
  DF_TRY(check_matrix(ctx, dgi, "dgi", R, 3 * G, st, err));
  DF_TRY(check_matrix(ctx, dw_hh, "dw_hh", 3 * G, G, st, err));
  DF_REQUIRE_OP(ctx, DF_OP_GRU_BACKWARD, st, err);
  return ctx->backend->gru_backward(ctx, desc, w_hh, s, gates, ds, dgi, dw_hh, err);
}

// ---- masked SiLU --------------------------------------------------------------------------------------------------

static df_status check_silu(const df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_dtype *st, int64_t *R,
                            df_error *err) {
  DF_TRY(df_check_storage(x, "x", st, err));
  DF_TRY(df_check_tensor(ctx, x, "x", *st, -1, err));
  if (x->ndim < 1) return DF_FAIL(err, DF_ERR_INVALID, "x", NULL, "x is a scalar, expected [R, E]");
  *R = df_rows(x);
  return df_check_per_row(ctx, mask, "mask", DF_U8, *R, err);
}

df_status df_masked_silu_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y, df_error *err) {
  df_dtype st;
  int64_t R = 0;
  DF_TRY(check_silu(ctx, x, mask, &st, &R, err));
  DF_TRY(check_matrix(ctx, y, "y", R, df_last_dim(x), st, err));
  DF_REQUIRE_OP(ctx, DF_OP_MASKED_SILU_FORWARD, st, err);
  return ctx->backend->masked_silu_forward(ctx, x, mask, y, err);
}

df_status df_masked_silu_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, const df_tensor *dy,
                                  df_tensor *dx, df_error *err) {
  df_dtype st;
  int64_t R = 0;
  DF_TRY(check_silu(ctx, x, mask, &st, &R, err));
  DF_TRY(check_matrix(ctx, dy, "dy", R, df_last_dim(x), st, err));
  DF_TRY(check_matrix(ctx, dx, "dx", R, df_last_dim(x), st, err));
  DF_REQUIRE_OP(ctx, DF_OP_MASKED_SILU_BACKWARD, st, err);
  return ctx->backend->masked_silu_backward(ctx, x, mask, dy, dx, err);
}

// ---- the fused LM head --------------------------------------------------------------------------------------------

static df_status check_scales(const df_lmhead_domino_desc *d, df_error *err) {
  if (!d) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_lmhead_domino_desc", "desc is NULL");
  DF_TRY(df_check_chunked_loss(d->chunk_rows, d->final_scale, err));
  DF_TRY(df_check_chunked_loss(d->chunk_rows, d->base_scale, err));
  if (!(d->final_scale >= 0) || !(d->base_scale >= 0))
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "the two CE weights are (1 − λ)/Σw and λ/Σw: finite and >= 0",
                   "final_scale %g, base_scale %g", (double)d->final_scale, (double)d->base_scale);
  return DF_OK;
}

df_status df_lmhead_domino(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in,
                           const df_lmhead_domino_out *out, df_error *err) {
  char d[96];
  if (!in || !out || !in->hidden || !in->head || !in->corr || !in->w2 || !in->labels)
    return DF_FAIL(err, DF_ERR_INVALID, "lmhead_domino", "pass hidden, head, corr, w2 and labels",
                   "a required input is NULL");
  DF_TRY(check_scales(desc, err));
  df_dtype st;
  DF_TRY(df_check_storage(in->head, "head", &st, err));
  DF_TRY(df_check_tensor(ctx, in->head, "head", st, 2, err));
  const int64_t V = in->head->shape[0], H = in->head->shape[1];
  if (V < 1 || V > INT_MAX || H < 1 || H > INT_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "head", NULL, "tensor 'head' is %s: dims must be in [1, INT_MAX]",
                   df_tensor_desc(in->head, d, sizeof d));
  DF_TRY(df_check_tensor(ctx, in->hidden, "hidden", st, -1, err));
  if (in->hidden->ndim < 1 || df_last_dim(in->hidden) != H)
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "hidden rows must be as wide as the head",
                   "tensor 'hidden' is %s, expected last dim %lld", df_tensor_desc(in->hidden, d, sizeof d),
                   (long long)H);
  const int64_t R = df_rows(in->hidden);
  DF_TRY(df_check_tensor(ctx, in->w2, "w2", st, 2, err));
  const int64_t E = in->w2->shape[1];
  if (in->w2->shape[0] != V || E < 1 || E > INT_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "w2", "embed_proj.2.weight is [V, E]", "tensor 'w2' is %s for V = %lld",
                   df_tensor_desc(in->w2, d, sizeof d), (long long)V);
  DF_TRY(check_matrix(ctx, in->corr, "corr", R, E, st, err));
  DF_TRY(df_check_per_row(ctx, in->labels, "labels", DF_I32, R, err));
  if (in->weights) DF_TRY(df_check_per_row(ctx, in->weights, "weights", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, out->ce_final, "ce_final", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, out->ce_base, "ce_base", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, out->correct_final, "correct_final", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, out->correct_base, "correct_base", DF_U8, R, err));
  if (out->dhidden) {
    if (!out->dcorr || !out->dw2)
      return DF_FAIL(err, DF_ERR_INVALID, "dcorr", "pass dcorr and dw2 with dhidden", "dcorr or dw2 is missing");
    DF_TRY(check_matrix(ctx, out->dhidden, "dhidden", R, H, st, err));
    DF_TRY(check_matrix(ctx, out->dcorr, "dcorr", R, E, st, err));
    DF_TRY(check_matrix(ctx, out->dw2, "dw2", V, E, df_grad_dtype(out->dw2, st), err)); // fp32 under bf16
  }
  DF_REQUIRE_OP(ctx, DF_OP_LMHEAD_DOMINO, st, err);
  return ctx->backend->lmhead_domino(ctx, desc, in, out, err);
}

// ---- block metrics ------------------------------------------------------------------------------------------------

df_status df_domino_block_metrics(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in, df_tensor *stats,
                                  df_error *err) {
  char d[96];
  if (!in) return DF_FAIL(err, DF_ERR_INVALID, "in", NULL, "NULL argument to df_domino_block_metrics");
  if (bs < 1) return DF_FAIL(err, DF_ERR_INVALID, "bs", "pass the block size (>= 1)", "bs = %lld", (long long)bs);
  DF_TRY(df_check_tensor(ctx, in->ce_final, "ce_final", DF_F32, -1, err));
  const int64_t R = df_numel(in->ce_final);
  if (R % bs)
    return DF_FAIL(err, DF_ERR_INVALID, "rows", "rows are whole blocks of bs slots",
                   "%lld rows are not a multiple of bs = %lld", (long long)R, (long long)bs);
  DF_TRY(df_check_per_row(ctx, in->ce_base, "ce_base", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, in->correct_final, "correct_final", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, in->correct_base, "correct_base", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, in->valid, "valid", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, in->weights, "weights", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, in->keep, "keep", DF_U8, R / bs, err));
  if (!isfinite(in->final_scale) || !isfinite(in->base_scale) || !isfinite(in->inv_den))
    return DF_FAIL(err, DF_ERR_INVALID, "in", "pass finite loss coefficients", "final %g, base %g, inv_den %g",
                   in->final_scale, in->base_scale, in->inv_den);
  DF_TRY(df_check_tensor(ctx, stats, "stats", DF_F64, -1, err));
  if (df_numel(stats) < DF_DOMINO_STATS(bs))
    return DF_FAIL(err, DF_ERR_INVALID, "stats", "size it with DF_DOMINO_STATS(bs)",
                   "tensor 'stats' %s holds fewer than %lld sums", df_tensor_desc(stats, d, sizeof d),
                   (long long)DF_DOMINO_STATS(bs));
  DF_REQUIRE_OP(ctx, DF_OP_DOMINO_BLOCK_METRICS, DF_F32, err);
  return ctx->backend->domino_block_metrics(ctx, bs, in, stats, err);
}
