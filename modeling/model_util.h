// Pieces the draft models share (modeling/draft_model.c, eagle3_model.c, peagle_model.c): the activation arena's
// carver, the RoPE table on the device, strided column copies between activations, and the part of a Llama decoder
// layer after its attention (o_proj, the residual, post_attention_layernorm, the SwiGLU MLP) forward and backward.
#ifndef DF_MODELING_MODEL_UTIL_H
#define DF_MODELING_MODEL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Hands out 64-byte aligned pieces of an arena; with base NULL it only measures (off is the size).
typedef struct {
  char *base;
  size_t off;
} df_carver;

static inline void *df_carve(df_carver *c, size_t bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += (bytes + 63) & ~(size_t)63;
  return p;
}

// The RoPE inverse frequencies (hd / 2 fp32) of rope on ctx's device, and the attention scaling it implies.
df_status df_rope_upload(const df_rope_config *rope, int64_t hd, df_ctx *ctx, float **inv_freq, float *mscale,
                         df_error *err);

// cols columns of rows rows between two row-major matrices of dtype dt on ctx's device (offsets and leading
// dimensions in elements), copied or added.
df_status df_cols_copy(df_ctx *ctx, df_dtype dt, int64_t rows, int64_t cols, const void *src, int64_t s_off,
                       int64_t s_ld, void *dst, int64_t d_off, int64_t d_ld, bool add, df_error *err);

// A parameter's weight and gradient views.
typedef struct {
  df_tensor w, g;
} df_pview;

// The layer after its attention over R rows, activations in dtype dt (statistics fp32):
//   h_mid = res + attn·oᵀ, y = post_norm(h_mid), a = silu(y·gateᵀ) ⊙ (y·upᵀ), h_out = h_mid + a·downᵀ.
typedef struct {
  df_pview *o, *post_norm, *gate, *up, *down; // the gradients are added to
  int64_t H, I, qd;
  float eps;
  df_dtype dt;
} df_llama_tail;

typedef struct {
  void *attn, *h_mid, *y, *g, *u, *a, *h_out; // (R, qd), (R, H), (R, H), (R, I) × 3, (R, H)
  float *rstd_p;                              // (R)
} df_llama_tail_acts;

static inline df_llama_tail df_llama_tail_of(df_pview *o, df_pview *post_norm, df_pview *gate, df_pview *up,
                                             df_pview *down, int64_t H, int64_t I, int64_t qd, float eps, df_dtype dt) {
  return (df_llama_tail){o, post_norm, gate, up, down, H, I, qd, eps, dt};
}

df_status df_llama_tail_forward(df_ctx *ctx, const df_llama_tail *t, int64_t R, const void *res,
                                const df_llama_tail_acts *a, df_error *err);
// dh (R, H) holds ∂loss/∂h_out on entry and ∂loss/∂h_mid on return (the residual's gradient included); dattn
// (R, qd) is written; da, dg, du (R, I) and dy (R, H) are scratch. The weights' gradients are added.
df_status df_llama_tail_backward(df_ctx *ctx, const df_llama_tail *t, int64_t R, const df_llama_tail_acts *a, void *dh,
                                 void *dattn, void *da, void *dg, void *du, void *dy, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
