// Internal to the DFlash model (modeling/dflash_*.c): one decoder layer's parameters, saved activations and
// backward scratch, its forward/backward through the op interface, and the RoPE frequency table.
#ifndef DF_MODELING_DRAFT_LAYER_H
#define DF_MODELING_DRAFT_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/ffn.h"
#include "modeling/param_table.h"

// A parameter and its gradient, as views on the model's device.
typedef struct {
  df_tensor w, g;
} dflash_pview;

// Sizes of one forward (shape letters as in docs): T block rows, C context rows, KV key rows.
typedef struct {
  int64_t B, S, N, bs;
  int64_t Q;  // N·bs block rows per sample
  int64_t T;  // B·Q
  int64_t C;  // B·S
  int64_t KV; // B·(S+Q)
  int64_t H, nH, nKV, hd;
} dflash_dims;

typedef struct {
  int64_t index;
  int64_t window; // sliding_window for sliding layers, 0 for full attention
  bool has_bias;
  dflash_pview in_norm, post_norm; // [H]
  dflash_pview q_w, k_w, v_w, o_w; // [nH·hd, H], [nKV·hd, H], [nKV·hd, H], [H, nH·hd]
  dflash_pview q_b, k_b, v_b, o_b; // biases (only when has_bias)
  dflash_pview q_norm, k_norm;     // [hd]
  df_ffn *ffn;
} draft_layer;

// What one layer keeps from forward to backward (views into the model's arena).
typedef struct {
  float *x;         // (B, Q, H) input_layernorm(h_in)
  float *rstd_in;   // (B·Q)
  float *q_raw;     // (B, Q, nH·hd) q_proj(x)
  float *q_rstd;    // (B·Q·nH)
  float *q;         // (B, Q, nH, hd) after q_norm and RoPE
  float *k_raw;     // (B, S+Q, nKV·hd) k_proj([ctx ; x])
  float *k_rstd;    // (B·(S+Q)·nKV)
  float *k;         // (B, S+Q, nKV, hd) after k_norm and RoPE
  float *v;         // (B, S+Q, nKV, hd) v_proj([ctx ; x])
  float *attn;      // (B, Q, nH, hd) attention output
  float *lse;       // (B, nH, Q)
  float *h_mid;     // (B, Q, H) h_in + o_proj(attn)
  float *y;         // (B, Q, H) post_attention_layernorm(h_mid)
  float *rstd_post; // (B·Q)
  float *ffn_saved; // the FFN's own (df_ffn saved_elems(B·Q))
} draft_layer_acts;

// Backward scratch shared by all layers (views into the arena).
typedef struct {
  float *dh;     // (B, Q, H) residual-stream gradient
  float *dtmp;   // (B, Q, H) gradient of a norm output (y, then x)
  float *dattn;  // (B, Q, nH·hd) d(attention out), reused for d(q_raw)
  float *dq;     // (B, Q, nH, hd)
  float *dk;     // (B, S+Q, nKV, hd)
  float *dk_raw; // (B, S+Q, nKV·hd)
  float *dv;     // (B, S+Q, nKV, hd)
  float *dctx;   // (B, S, H) gradient of the shared context, summed over layers
  float *ffn;    // the FFN scratch (forward and backward)
} dflash_scratch;

// Read-only inputs every layer shares in one forward/backward (arena views on the model's device).
typedef struct {
  const float *ctx;       // (B, S, H) hidden_norm(fc(target_hidden))
  const int32_t *pos_q;   // (B·Q) block positions anchor + k
  const int32_t *pos_kv;  // (B·(S+Q)) 0..S−1, then the block positions, per sample
  const int32_t *anchors; // (B, N)
  const uint8_t *keep;    // (B, N)
  const float *inv_freq;  // (hd/2)
  float mscale;           // RoPE cos/sin multiplier
  float eps;              // rms_norm_eps
  df_device dev;
  df_dtype dt; // storage of the activations, their gradients and the weights the forward reads (f32 or bf16); the
               // statistics (rstd, lse) and inv_freq are fp32 whatever it is. Arena pointers are typed float * but
               // hold dt elements: offsets go through the layer's element arithmetic.
} dflash_shared;

// Appends layer i's parameters to p in checkpoint order (the FFN's last) and creates its FFN.
df_status draft_layer_add_params(const df_draft_config *cfg, int64_t i, df_params *p, draft_layer *L, df_error *err);
// Resolves the layer's views once the table is final and the flat buffers exist.
df_status draft_layer_bind(draft_layer *L, const df_params *p, float *weights, float *grads, df_device dev,
                           df_error *err);
void draft_layer_free(draft_layer *L);

// h_out (B, Q, H) = layer(h_in (B, Q, H)); activations go to a, the FFN's temporaries to scr->ffn.
df_status draft_layer_forward(df_ctx *ctx, const draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                              const float *h_in, float *h_out, draft_layer_acts *a, dflash_scratch *scr, df_error *err);
// On entry scr->dh holds ∂/∂h_out, on return ∂/∂h_in. The context gradient goes to scr->dctx, written when
// first_ctx_write (the first layer the backward visits) and added to otherwise.
df_status draft_layer_backward(df_ctx *ctx, draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                               const float *h_in, const draft_layer_acts *a, dflash_scratch *scr, bool first_ctx_write,
                               df_error *err);

// The RoPE frequency table of HF's rope_type (default, linear, yarn, llama3) in float32 as transformers
// computes it: inv_freq [head_dim/2] and the cos/sin multiplier (YaRN's attention factor, else 1).
df_status dflash_rope_table(const df_rope_config *rc, float *inv_freq, float *mscale, df_error *err);

#endif
