// Dispatch and validation for the block-masked (DFlash) attention, forward and backward.
#include <math.h>
#include <stdio.h>

#include "kernels/check.h"

// The sizes every attention tensor is checked against, taken from q, anchors and desc.
typedef struct {
  int64_t B, N, bs, S, nH, nKV, hd;
  df_dtype st; // storage of q, k, v, out and their gradients (lse stays fp32)
} attn_dims;

static df_status check_desc(const df_block_attn_desc *desc, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_block_attn_desc", "attention desc is missing");
  if (desc->block_size < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "desc.block_size", "use the draft config's block_size (e.g. 16)",
                   "block_size is %lld, must be >= 1", (long long)desc->block_size);
  if (desc->context_len < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "desc.context_len", NULL, "context_len is %lld, must be >= 0",
                   (long long)desc->context_len);
  if (desc->window < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "desc.window", "use 0 for full attention", "window is %lld, must be >= 0",
                   (long long)desc->window);
  if (!isfinite(desc->scale))
    return DF_FAIL(err, DF_ERR_INVALID, "desc.scale", "normally 1/sqrt(head_dim)", "scale is not finite");
  return DF_OK;
}

// A 4-d tensor of exactly [d0, d1, d2, d3].
static df_status check_4d(const df_tensor *t, const char *name, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                          df_error *err) {
  DF_TRY(df_check_dim(t, name, 0, d0, err));
  DF_TRY(df_check_dim(t, name, 1, d1, err));
  DF_TRY(df_check_dim(t, name, 2, d2, err));
  return df_check_dim(t, name, 3, d3, err);
}

// Anchors of kept blocks must index the context; dropped blocks may hold anything (padding uses 0).
static df_status check_anchor_values(const df_tensor *anchors, const df_tensor *keep, int64_t S, df_error *err) {
  const int32_t *a = anchors->data;
  const uint8_t *kp = keep->data;
  int64_t B = anchors->shape[0], N = anchors->shape[1];
  for (int64_t i = 0; i < B * N; i++) {
    if (!kp[i] || (a[i] >= 0 && a[i] < S)) continue;
    char where[64];
    snprintf(where, sizeof where, "anchors[%lld,%lld]", (long long)(i / N), (long long)(i % N));
    return DF_FAIL(err, DF_ERR_INVALID, where, "anchors of kept blocks index the context: 0 <= anchor < context_len",
                   "anchor %d of a kept block is outside [0, %lld)", a[i], (long long)S);
  }
  return DF_OK;
}

// Validates the inputs shared by forward and backward and fills the sizes.
static df_status check_inputs(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                              const df_tensor *v, const df_tensor *anchors, const df_tensor *keep, attn_dims *d,
                              df_error *err) {
  DF_TRY(check_desc(desc, err));
  df_dtype st;
  DF_TRY(df_check_storage(q, "q", &st, err));
  DF_TRY(df_check_tensor(ctx, q, "q", st, 4, err));
  DF_TRY(df_check_tensor(ctx, k, "k", st, 4, err));
  DF_TRY(df_check_tensor(ctx, v, "v", st, 4, err));
  DF_TRY(df_check_tensor(ctx, anchors, "anchors", DF_I32, 2, err));
  DF_TRY(df_check_tensor(ctx, keep, "keep", DF_U8, 2, err));
  *d = (attn_dims){.B = q->shape[0],
                   .N = anchors->shape[1],
                   .bs = desc->block_size,
                   .S = desc->context_len,
                   .nH = q->shape[2],
                   .nKV = k->shape[2],
                   .hd = q->shape[3],
                   .st = st};
  DF_TRY(df_check_dim(anchors, "anchors", 0, d->B, err));
  DF_TRY(df_check_dim(keep, "keep", 0, d->B, err));
  DF_TRY(df_check_dim(keep, "keep", 1, d->N, err));
  DF_TRY(df_check_dim(q, "q", 1, d->N * d->bs, err));
  if (d->nH < 1 || d->hd < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "q", NULL, "q needs at least one head of at least one element");
  if (d->nKV < 1 || d->nH % d->nKV != 0)
    return DF_FAIL(err, DF_ERR_INVALID, "k", "num_attention_heads must be a multiple of num_key_value_heads",
                   "k has %lld kv heads, which does not divide q's %lld heads", (long long)d->nKV, (long long)d->nH);
  DF_TRY(check_4d(k, "k", d->B, d->S + d->N * d->bs, d->nKV, d->hd, err));
  DF_TRY(check_4d(v, "v", d->B, d->S + d->N * d->bs, d->nKV, d->hd, err));
  // The backend reads anchors to size its loops, so their values are checked here when they are host memory
  // (elsewhere the batch builder checked them on the host before the upload).
  if (df_ctx_host_addressable(ctx)) DF_TRY(check_anchor_values(anchors, keep, d->S, err));
  return DF_OK;
}

static df_status check_q_like(df_ctx *ctx, const df_tensor *t, const char *name, const attn_dims *d, df_error *err) {
  DF_TRY(df_check_tensor(ctx, t, name, d->st, 4, err));
  return check_4d(t, name, d->B, d->N * d->bs, d->nH, d->hd, err);
}

static df_status check_lse(df_ctx *ctx, const df_tensor *lse, const attn_dims *d, df_error *err) {
  DF_TRY(df_check_tensor(ctx, lse, "lse", DF_F32, 3, err));
  DF_TRY(df_check_dim(lse, "lse", 0, d->B, err));
  DF_TRY(df_check_dim(lse, "lse", 1, d->nH, err));
  return df_check_dim(lse, "lse", 2, d->N * d->bs, err);
}

df_status df_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                const df_tensor *v, const df_tensor *anchors, const df_tensor *keep, df_tensor *out,
                                df_tensor *lse, df_error *err) {
  attn_dims d;
  DF_TRY(check_inputs(ctx, desc, q, k, v, anchors, keep, &d, err));
  DF_TRY(check_q_like(ctx, out, "out", &d, err));
  DF_TRY(check_lse(ctx, lse, &d, err));
  DF_REQUIRE_OP(ctx, DF_OP_BLOCK_ATTN_FORWARD, d.st, err);
  return ctx->backend->block_attn_forward(ctx, desc, q, k, v, anchors, keep, out, lse, err);
}

df_status df_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                 const df_tensor *v, const df_tensor *anchors, const df_tensor *keep,
                                 const df_tensor *out, const df_tensor *lse, const df_tensor *dout, df_tensor *dq,
                                 df_tensor *dk, df_tensor *dv, df_error *err) {
  attn_dims d;
  DF_TRY(check_inputs(ctx, desc, q, k, v, anchors, keep, &d, err));
  DF_TRY(check_q_like(ctx, out, "out", &d, err));
  DF_TRY(check_lse(ctx, lse, &d, err));
  DF_TRY(check_q_like(ctx, dout, "dout", &d, err));
  DF_TRY(check_q_like(ctx, dq, "dq", &d, err));
  DF_TRY(df_check_tensor(ctx, dk, "dk", d.st, 4, err));
  DF_TRY(check_4d(dk, "dk", d.B, d.S + d.N * d.bs, d.nKV, d.hd, err));
  DF_TRY(df_check_tensor(ctx, dv, "dv", d.st, 4, err));
  DF_TRY(check_4d(dv, "dv", d.B, d.S + d.N * d.bs, d.nKV, d.hd, err));
  DF_REQUIRE_OP(ctx, DF_OP_BLOCK_ATTN_BACKWARD, d.st, err);
  return ctx->backend->block_attn_backward(ctx, desc, q, k, v, anchors, keep, out, lse, dout, dq, dk, dv, err);
}
