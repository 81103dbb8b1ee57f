// The ops of Domino's GRU logit correction (docs/domino-step.md §4-§7; modeling/domino_head.h composes them): the
// bias-free GRU over each block's head tokens, a row-masked SiLU between embed_proj's two linears, the fused chunked
// LM head that scores the base and the corrected logits of every row in one pass (never a [rows, V] tensor for
// either), and the per-block metric sums. Dispatched by kernels/domino.c; CPU oracles kernels/cpu/gru.c,
// lmhead_domino.c, domino_metrics.c; CUDA twins of the same names. Conventions as kernels/ops.h.
#ifndef DF_KERNELS_OPS_DOMINO_H
#define DF_KERNELS_OPS_DOMINO_H

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_ctx df_ctx;

// ---- the GRU (torch.nn.GRU, one layer, no bias, h₀ = 0, row blocks r, z, n) -----------------------------------
// nb sequences of `steps` steps, stored `stride` rows apart: row b·stride + t is step t of sequence b (the outputs of
// rows with t >= steps are set to 0, their inputs never read). With gi = x·W_ihᵀ [nb·stride, 3G] precomputed for every
// row and gh = s_{t−1}·W_hhᵀ (s_{−1} = 0), per step:
//   r = σ(gi_r + gh_r), z = σ(gi_z + gh_z), n = tanh(gi_n + r ⊙ gh_n), s_t = (1 − z) ⊙ n + z ⊙ s_{t−1}.
// The time loop is sequential (a GEMM and an elementwise pass per step), each step batched over the nb sequences.
typedef struct {
  int64_t steps;  // 1 <= steps <= stride
  int64_t stride; // rows per sequence
} df_gru_desc;

// s [nb·stride, G] receives s_t; gates [nb·stride, 4G] (r, z, n, gh_n), kept for the backward, or NULL (inference).
df_status df_gru_forward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh, df_tensor *s,
                         df_tensor *gates, df_error *err);
// ds [nb·stride, G]: dL/ds_t from outside the recurrence (read only); dgi [nb·stride, 3G] = dL/dgi (written; 0 on
// rows t >= steps); dw_hh [3G, G] += dL/dW_hh. s and gates come from the forward. (dW_ih = dgiᵀ·x and dx = dgi·W_ih
// are the caller's linear backward.)
df_status df_gru_backward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                          const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh, df_error *err);

// ---- row-masked SiLU (embed_proj's activation on the corrected rows only) -----------------------------------------
// x, y [R, E]; mask [R] u8: y_r = silu(x_r) where mask[r], else 0.
df_status df_masked_silu_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y, df_error *err);
// dx_r = dy_r ⊙ silu'(x_r) where mask[r], else 0 (written; dx may alias dy).
df_status df_masked_silu_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, const df_tensor *dy,
                                  df_tensor *dx, df_error *err);

// ---- the fused Domino LM head ---------------------------------------------------------------------------------
// Per row r with labels[r] >= 0 (every output of any other row is 0), both logit sets produced and consumed in row
// tiles (lmhead_ce's tiling, two logit sets per tile):
//   b = hidden_r · headᵀ                     base logits
//   f = b + corr_r · w2ᵀ                     final logits (embed_proj.2 of the correction latent; corr_r = 0: f = b)
//   ce_final[r] = −log softmax(f)[label], ce_base[r] likewise; correct_* = argmax == label (first maximum wins).
// With gradients, of L = Σ_r w_r (final_scale · ce_final[r] + base_scale · ce_base[r]):
//   dhidden [R, H] and dcorr [R, E] are written, dw2 [V, E] is added to.
typedef struct {
  int64_t chunk_rows; // 0: all rows in one chunk
  float final_scale, base_scale;
} df_lmhead_domino_desc;

typedef struct {
  const df_tensor *hidden;  // [R, H]
  const df_tensor *head;    // [V, H] frozen LM head
  const df_tensor *corr;    // [R, E] correction latent silu(embed_proj.0 [h ; s]) (0 on uncorrected rows)
  const df_tensor *w2;      // [V, E] embed_proj.2.weight
  const df_tensor *labels;  // [R] i32, < 0: row skipped
  const df_tensor *weights; // [R] f32, or NULL (all 1)
} df_lmhead_domino_in;

typedef struct {
  df_tensor *ce_final, *ce_base;           // [R] f32 (required)
  df_tensor *correct_final, *correct_base; // [R] u8 (required)
  df_tensor *dhidden, *dcorr, *dw2;        // NULL dhidden: forward only; dcorr and dw2 come with it
} df_lmhead_domino_out;

df_status df_lmhead_domino(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in,
                           const df_lmhead_domino_out *out, df_error *err);

// ---- per-block metric sums ------------------------------------------------------------------------------------
// Rows (block, slot), bs slots per block; f32 / u8 tensors hold nblocks·bs values (keep: nblocks). With v the
// validity (binary), w the loss weight, per call, stats [DF_DOMINO_STATS(bs)] f64 +=
//   loss = Σ w (final_scale·ce_final + base_scale·ce_base)        (the micro-step's scalar loss)
//   final / base = Σ w·ce_* · inv_den                              (SpecForge's final_loss / base_loss)
//   final_num / base_num / weight = Σ w·ce_final, Σ w·ce_base, Σ w
//   acc / base_acc / acc_den = Σ v·correct_final, Σ v·correct_base, Σ v
//   accept / base_accept = Σ over blocks with a valid slot of 1 + Σ_k v_k Π_{j≤k} (correct_j ∨ ¬v_j);
//   accept_den = those blocks; blocks = Σ keep; pos + k / pos + bs + k: Σ v·correct_final / Σ v of slot k.
// Each call sums its own rows from 0 in row order (double), then adds.
enum {
  DF_DOMSTAT_LOSS,
  DF_DOMSTAT_FINAL,
  DF_DOMSTAT_BASE,
  DF_DOMSTAT_FINAL_NUM,
  DF_DOMSTAT_BASE_NUM,
  DF_DOMSTAT_WEIGHT,
  DF_DOMSTAT_ACC,
  DF_DOMSTAT_BASE_ACC,
  DF_DOMSTAT_ACC_DEN,
  DF_DOMSTAT_ACCEPT,
  DF_DOMSTAT_BASE_ACCEPT,
  DF_DOMSTAT_ACCEPT_DEN,
  DF_DOMSTAT_BLOCKS,
  DF_DOMSTAT_POS
};
#define DF_DOMINO_STATS(bs) (DF_DOMSTAT_POS + 2 * (int64_t)(bs))

typedef struct {
  const df_tensor *ce_final, *ce_base;           // f32
  const df_tensor *correct_final, *correct_base; // u8
  const df_tensor *valid, *weights, *keep;       // u8, f32, u8 [nblocks]
  double final_scale, base_scale, inv_den;
} df_domino_metrics_in;

df_status df_domino_block_metrics(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in, df_tensor *stats,
                                  df_error *err);

#ifdef __cplusplus
}
#endif

#endif
