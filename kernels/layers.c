// Dispatch and validation for the per-layer elementwise/row ops: RMSNorm, rotary embedding, SwiGLU and
// the embedding gather; also the default RoPE frequency table (HF's float32 formula).
#include <math.h>
#include <stdint.h>

#include "kernels/check.h"

// ---- RMSNorm -------------------------------------------------------------------------------------------

// x is viewed as [R, D] with D = len(w); other tensors are checked against that view.
static df_status check_rmsnorm_x_w(df_ctx *ctx, const df_tensor *x, const df_tensor *w, df_dtype *st, df_error *err) {
  char d[96];
  DF_TRY(df_check_storage(x, "x", st, err));
  DF_TRY(df_check_tensor(ctx, w, "w", *st, 1, err));
  DF_TRY(df_check_tensor(ctx, x, "x", *st, -1, err));
  int64_t dim = w->shape[0];
  if (dim <= 0) return DF_FAIL(err, DF_ERR_INVALID, "w", NULL, "tensor 'w' is empty; RMSNorm needs D >= 1");
  if (df_numel(x) % dim != 0)
    return DF_FAIL(err, DF_ERR_INVALID, "x", "x is normalized in groups of D = len(w) contiguous elements",
                   "tensor 'x' %s has %lld elements, not a multiple of D = %lld", df_tensor_desc(x, d, sizeof d),
                   (long long)df_numel(x), (long long)dim);
  return DF_OK;
}

static df_status check_rstd(df_ctx *ctx, const df_tensor *rstd, int64_t rows, df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, rstd, "rstd", DF_F32, -1, err));
  if (df_numel(rstd) != rows)
    return DF_FAIL(err, DF_ERR_INVALID, "rstd", "rstd holds one value per normalized row",
                   "tensor 'rstd' %s has %lld elements, expected R = %lld", df_tensor_desc(rstd, d, sizeof d),
                   (long long)df_numel(rstd), (long long)rows);
  return DF_OK;
}

df_status df_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                             df_tensor *rstd, df_error *err) {
  df_dtype st;
  DF_TRY(check_rmsnorm_x_w(ctx, x, w, &st, err));
  DF_TRY(df_check_tensor(ctx, y, "y", st, -1, err));
  DF_TRY(df_check_same_numel(x, "x", y, "y", err));
  DF_TRY(check_rstd(ctx, rstd, df_numel(x) / w->shape[0], err));
  if (!(eps >= 0.0f) || isinf(eps))
    return DF_FAIL(err, DF_ERR_INVALID, "eps", "use rms_norm_eps from the model config (e.g. 1e-6)",
                   "eps = %g must be finite and >= 0", (double)eps);
  DF_REQUIRE_OP(ctx, DF_OP_RMSNORM_FORWARD, st, err);
  return ctx->backend->rmsnorm_forward(ctx, x, w, eps, y, rstd, err);
}

df_status df_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                              const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_error *err) {
  df_dtype st;
  DF_TRY(check_rmsnorm_x_w(ctx, x, w, &st, err));
  DF_TRY(df_check_tensor(ctx, dy, "dy", st, -1, err));
  DF_TRY(df_check_same_numel(x, "x", dy, "dy", err));
  DF_TRY(check_rstd(ctx, rstd, df_numel(x) / w->shape[0], err));
  DF_TRY(df_check_tensor(ctx, dx, "dx", st, -1, err));
  DF_TRY(df_check_same_numel(x, "x", dx, "dx", err));
  if (dw) {
    DF_TRY(df_check_tensor(ctx, dw, "dw", df_grad_dtype(dw, st), 1, err));
    DF_TRY(df_check_dim(dw, "dw", 0, w->shape[0], err));
  }
  DF_REQUIRE_OP(ctx, DF_OP_RMSNORM_BACKWARD, st, err);
  return ctx->backend->rmsnorm_backward(ctx, dy, x, w, rstd, dx, accumulate_dx, dw, err);
}

// ---- Rotary embedding ----------------------------------------------------------------------------------

// HF: inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all in float32. The exponent is
// an fp32 quotient; the power is evaluated in double and rounded once (torch's float pow is within 1 ulp).
void df_rope_default_inv_freq(double theta, int head_dim, float *inv_freq) {
  float base = (float)theta;
  for (int i = 0; i < head_dim / 2; i++) {
    float e = (float)(2 * i) / (float)head_dim;
    float p = (float)pow((double)base, (double)e);
    inv_freq[i] = 1.0f / p;
  }
}

// Out and in must be the same buffer or disjoint: a shifted overlap would read already-rotated values.
static df_status check_alias(const df_tensor *in, const char *in_name, const df_tensor *out, const char *out_name,
                             df_error *err) {
  uintptr_t a = (uintptr_t)in->data, b = (uintptr_t)out->data, n = (uintptr_t)df_numel(in) * df_dtype_size(in->dtype);
  if (a != b && a < b + n && b < a + n)
    return DF_FAIL(err, DF_ERR_INVALID, out_name, "pass the same buffer (in place) or a separate one",
                   "'%s' partially overlaps '%s'", out_name, in_name);
  return DF_OK;
}

static df_status check_rope(df_ctx *ctx, const df_tensor *x, const char *xn, const df_tensor *pos,
                            const df_tensor *inv_freq, float mscale, const df_tensor *y, const char *yn, df_dtype *st,
                            df_error *err) {
  char d[96];
  DF_TRY(df_check_storage(x, xn, st, err));
  DF_TRY(df_check_tensor(ctx, x, xn, *st, 3, err));
  int64_t hd = x->shape[2];
  if (hd <= 0 || hd % 2 != 0)
    return DF_FAIL(err, DF_ERR_INVALID, xn, "the last dim is the head dim, rotated in two halves",
                   "tensor '%s' %s: head dim %lld must be even and > 0", xn, df_tensor_desc(x, d, sizeof d),
                   (long long)hd);
  DF_TRY(df_check_tensor(ctx, pos, "pos", DF_I32, 1, err));
  DF_TRY(df_check_dim(pos, "pos", 0, x->shape[0], err));
  DF_TRY(df_check_tensor(ctx, inv_freq, "inv_freq", DF_F32, 1, err));
  DF_TRY(df_check_dim(inv_freq, "inv_freq", 0, hd / 2, err));
  DF_TRY(df_check_tensor(ctx, y, yn, *st, -1, err));
  DF_TRY(df_check_same_numel(x, xn, y, yn, err));
  DF_TRY(check_alias(x, xn, y, yn, err));
  if (!isfinite(mscale))
    return DF_FAIL(err, DF_ERR_INVALID, "mscale", "use 1 for default RoPE", "mscale = %g is not finite",
                   (double)mscale);
  return DF_OK;
}

df_status df_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                          float mscale, df_tensor *y, df_error *err) {
  df_dtype st;
  DF_TRY(check_rope(ctx, x, "x", pos, inv_freq, mscale, y, "y", &st, err));
  DF_REQUIRE_OP(ctx, DF_OP_ROPE_FORWARD, st, err);
  return ctx->backend->rope_forward(ctx, x, pos, inv_freq, mscale, y, err);
}

df_status df_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                           float mscale, df_tensor *dx, df_error *err) {
  df_dtype st;
  DF_TRY(check_rope(ctx, dy, "dy", pos, inv_freq, mscale, dx, "dx", &st, err));
  DF_REQUIRE_OP(ctx, DF_OP_ROPE_BACKWARD, st, err);
  return ctx->backend->rope_backward(ctx, dy, pos, inv_freq, mscale, dx, err);
}

// ---- SwiGLU --------------------------------------------------------------------------------------------

static df_status check_swiglu(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_dtype *st,
                              df_error *err) {
  DF_TRY(df_check_storage(g, "g", st, err));
  DF_TRY(df_check_tensor(ctx, g, "g", *st, -1, err));
  DF_TRY(df_check_tensor(ctx, u, "u", *st, -1, err));
  DF_TRY(df_check_same_numel(g, "g", u, "u", err));
  if (!(limit >= 0.0f) || isinf(limit))
    return DF_FAIL(err, DF_ERR_INVALID, "limit", "use 0 to disable the clamp (swiglu_limit)",
                   "limit = %g must be finite and >= 0", (double)limit);
  return DF_OK;
}

df_status df_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                            df_error *err) {
  df_dtype st;
  DF_TRY(check_swiglu(ctx, g, u, limit, &st, err));
  DF_TRY(df_check_tensor(ctx, h, "h", st, -1, err));
  DF_TRY(df_check_same_numel(g, "g", h, "h", err));
  DF_REQUIRE_OP(ctx, DF_OP_SWIGLU_FORWARD, st, err);
  return ctx->backend->swiglu_forward(ctx, g, u, limit, h, err);
}

df_status df_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u, float limit,
                             df_tensor *dg, df_tensor *du, df_error *err) {
  df_dtype st;
  DF_TRY(check_swiglu(ctx, g, u, limit, &st, err));
  DF_TRY(df_check_tensor(ctx, dh, "dh", st, -1, err));
  DF_TRY(df_check_same_numel(g, "g", dh, "dh", err));
  DF_TRY(df_check_tensor(ctx, dg, "dg", st, -1, err));
  DF_TRY(df_check_same_numel(g, "g", dg, "dg", err));
  DF_TRY(df_check_tensor(ctx, du, "du", st, -1, err));
  DF_TRY(df_check_same_numel(g, "g", du, "du", err));
  DF_REQUIRE_OP(ctx, DF_OP_SWIGLU_BACKWARD, st, err);
  return ctx->backend->swiglu_backward(ctx, dh, g, u, limit, dg, du, err);
}

// ---- Embedding -----------------------------------------------------------------------------------------

// ids may have any shape (T = numel); the rows tensor (out or dout) is viewed as [T, H].
static df_status check_embedding(df_ctx *ctx, const df_tensor *table, const char *tn, const df_tensor *ids,
                                 const df_tensor *rows, const char *rn, df_dtype *st, df_error *err) {
  char d[96];
  DF_TRY(df_check_storage(table, tn, st, err));
  DF_TRY(df_check_tensor(ctx, table, tn, *st, 2, err));
  DF_TRY(df_check_tensor(ctx, ids, "ids", DF_I32, -1, err));
  DF_TRY(df_check_tensor(ctx, rows, rn, *st, -1, err));
  if (df_last_dim(rows) != table->shape[1] || df_numel(rows) != df_numel(ids) * table->shape[1])
    return DF_FAIL(err, DF_ERR_INVALID, rn, NULL, "tensor '%s' %s should be [T = %lld, H = %lld]", rn,
                   df_tensor_desc(rows, d, sizeof d), (long long)df_numel(ids), (long long)table->shape[1]);
  return DF_OK;
}

df_status df_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                               df_error *err) {
  df_dtype st;
  DF_TRY(check_embedding(ctx, table, "table", ids, out, "out", &st, err));
  DF_REQUIRE_OP(ctx, DF_OP_EMBEDDING_FORWARD, st, err);
  return ctx->backend->embedding_forward(ctx, table, ids, out, err);
}

df_status df_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(dout, "dout", &st, err));
  if (st == DF_BF16 && dtable && dtable->dtype == DF_F32) { // mixed precision: an fp32 table gradient
    df_tensor as_storage = *dtable;
    as_storage.dtype = st;
    DF_TRY(check_embedding(ctx, &as_storage, "dtable", ids, dout, "dout", &st, err));
    DF_TRY(df_check_tensor(ctx, dtable, "dtable", DF_F32, 2, err));
  } else {
    DF_TRY(check_embedding(ctx, dtable, "dtable", ids, dout, "dout", &st, err));
  }
  DF_REQUIRE_OP(ctx, DF_OP_EMBEDDING_BACKWARD, st, err);
  return ctx->backend->embedding_backward(ctx, dout, ids, dtable, err);
}

// ---- Row gather ------------------------------------------------------------------------------------------------

df_status df_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out, df_error *err) {
  char d[96];
  df_dtype st;
  DF_TRY(df_check_storage(src, "src", &st, err));
  DF_TRY(df_check_tensor(ctx, src, "src", st, 2, err));
  DF_TRY(df_check_tensor(ctx, idx, "idx", DF_I32, -1, err));
  DF_TRY(df_check_tensor(ctx, out, "out", st, -1, err));
  if (df_last_dim(out) != src->shape[1] || df_numel(out) != df_numel(idx) * src->shape[1])
    return DF_FAIL(err, DF_ERR_INVALID, "out", NULL, "tensor 'out' %s should be [R = %lld, H = %lld]",
                   df_tensor_desc(out, d, sizeof d), (long long)df_numel(idx), (long long)src->shape[1]);
  DF_REQUIRE_OP(ctx, DF_OP_GATHER_ROWS, st, err);
  return ctx->backend->gather_rows(ctx, src, idx, out, err);
}

// ---- Strided 2-D copy ------------------------------------------------------------------------------------------

// The last element a (rows, cols, offset, stride) pattern touches lies inside t.
static df_status check_extent(const df_tensor *t, const char *name, int64_t rows, int64_t cols, int64_t offset,
                              int64_t stride, df_error *err) {
  char d[96];
  const int64_t end = offset + (rows - 1) * stride + cols;
  if (end > df_numel(t))
    return DF_FAIL(err, DF_ERR_INVALID, name, "offset + (rows - 1)·stride + cols must not exceed the tensor",
                   "tensor '%s' %s holds %lld elements; the copy reaches element %lld", name,
                   df_tensor_desc(t, d, sizeof d), (long long)df_numel(t), (long long)end);
  return DF_OK;
}

df_status df_copy_2d(df_ctx *ctx, const df_copy_2d_desc *desc, const df_tensor *src, df_tensor *dst, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", NULL, "desc is NULL");
  const df_copy_2d_desc *c = desc;
  if (c->rows < 0 || c->cols < 0 || c->src_offset < 0 || c->dst_offset < 0 || c->src_stride < 0 ||
      (c->rows > 1 && c->dst_stride < c->cols))
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "rows, cols, offsets >= 0; dst_stride >= cols (rows may not overlap)",
                   "bad copy: %lld x %lld, src %lld + i*%lld, dst %lld + i*%lld", (long long)c->rows,
                   (long long)c->cols, (long long)c->src_offset, (long long)c->src_stride, (long long)c->dst_offset,
                   (long long)c->dst_stride);
  df_dtype st;
  DF_TRY(df_check_storage(src, "src", &st, err));
  DF_TRY(df_check_tensor(ctx, src, "src", st, -1, err));
  DF_TRY(df_check_tensor(ctx, dst, "dst", st, -1, err));
  const size_t es = df_dtype_size(st);
  const uintptr_t s0 = (uintptr_t)src->data, s1 = s0 + (size_t)df_numel(src) * es;
  const uintptr_t d0 = (uintptr_t)dst->data, d1 = d0 + (size_t)df_numel(dst) * es;
  if (s0 < d1 && d0 < s1)
    return DF_FAIL(err, DF_ERR_INVALID, "dst", "copy between two distinct buffers", "src and dst overlap");
  if (c->rows == 0 || c->cols == 0) return DF_OK;
  DF_TRY(check_extent(src, "src", c->rows, c->cols, c->src_offset, c->src_stride, err));
  DF_TRY(check_extent(dst, "dst", c->rows, c->cols, c->dst_offset, c->dst_stride, err));
  DF_REQUIRE_OP(ctx, DF_OP_COPY_2D, st, err);
  return ctx->backend->copy_2d(ctx, desc, src, dst, err);
}
