// Dispatch and validation for the KV-cache causal attention (kernels/causal_attn.h).
#include "kernels/causal_attn.h"

#include <math.h>

#include "kernels/check.h"

df_status df_causal_attn_forward(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                 const df_tensor *v, df_tensor *out, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_causal_attn_desc", "attention desc is missing");
  if (desc->past < 0 || desc->window < 0 || !(desc->scale > 0.0f) || isinf(desc->scale))
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "past >= 0, window >= 0 (0 = full), a finite scale > 0",
                   "bad desc: past %lld, window %lld, scale %g", (long long)desc->past, (long long)desc->window,
                   (double)desc->scale);
  df_dtype st;
  DF_TRY(df_check_storage(q, "q", &st, err));
  DF_TRY(df_check_tensor(ctx, q, "q", st, 4, err));
  DF_TRY(df_check_tensor(ctx, k, "k", st, 4, err));
  DF_TRY(df_check_tensor(ctx, v, "v", st, 4, err));
  DF_TRY(df_check_tensor(ctx, out, "out", st, 4, err));
  const int64_t B = q->shape[0], T = q->shape[1], nH = q->shape[2], hd = q->shape[3];
  const int64_t C = k->shape[1], nKV = k->shape[2];
  if (nH < 1 || hd < 1) return DF_FAIL(err, DF_ERR_INVALID, "q", NULL, "q needs at least one head of one element");
  if (nKV < 1 || nH % nKV)
    return DF_FAIL(err, DF_ERR_INVALID, "k", "num_attention_heads must be a multiple of num_key_value_heads",
                   "k has %lld kv heads, which does not divide q's %lld heads", (long long)nKV, (long long)nH);
  if (C < desc->past + T)
    return DF_FAIL(err, DF_ERR_INVALID, "k", "the cache must hold the past rows and the new ones",
                   "k has %lld rows but past + T = %lld", (long long)C, (long long)(desc->past + T));
  const int64_t kv_shape[4] = {B, C, nKV, hd};
  for (int d = 0; d < 4; d++) {
    DF_TRY(df_check_dim(k, "k", d, kv_shape[d], err));
    DF_TRY(df_check_dim(v, "v", d, kv_shape[d], err));
    DF_TRY(df_check_dim(out, "out", d, q->shape[d], err));
  }
  DF_REQUIRE_OP(ctx, DF_OP_CAUSAL_ATTN_FORWARD, st, err);
  if (T == 0 || B == 0) return DF_OK;
  return ctx->backend->causal_attn_forward(ctx, desc, q, k, v, out, err);
}
