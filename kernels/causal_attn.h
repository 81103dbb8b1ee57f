// Causal self-attention over a KV cache (the target model's attention): T new queries attend to every cached
// key up to their own position. One entry of the backend table (kernels/backend.h: causal_attn_forward), with its
// dispatcher in kernels/causal_attn.c and its twins in cpu/causal_attn.c and cuda/causal_attn.cu.
#ifndef DF_KERNELS_CAUSAL_ATTN_H
#define DF_KERNELS_CAUSAL_ATTN_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t past;   // cached rows before the new queries: query t sits at position past + t
  int64_t window; // 0: full attention; W > 0: sliding window, key j visible iff j > past + t − W
  float scale;    // softmax scale, normally 1/sqrt(hd)
} df_causal_attn_desc;

// q [B, T, nH, hd]; k, v [B, C, nKV, hd] with C >= past + T (rows past .. past+T−1 already hold the new
// tokens' keys and values; rows beyond are not read); out [B, T, nH, hd]. Query t of sample b sees keys
// j <= past + t. GQA: query head h reads kv head h / (nH / nKV). Forward only (the target is frozen).
df_status df_causal_attn_forward(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                 const df_tensor *v, df_tensor *out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
