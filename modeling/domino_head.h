// Domino's GRU logit correction on top of the DFlash backbone (docs/domino-step.md §2, §4; SpecForge's
// DominoDraftModel.apply_logits_head). Its parameters live in the draft model's table (modeling/draft_model.c adds
// and binds them when the config is a Domino draft), after norm.weight, in this order and with SpecForge's names:
//   prefix_gru.weight_ih_l0   [3G, H]    nn.GRU(H, G, bias=False): row blocks r, z, n
//   prefix_gru.weight_hh_l0   [3G, G]
//   embed_proj.0.weight       [E, H+G]   Linear(H + G → E, no bias), then SiLU
//   embed_proj.2.weight       [V, E]     Linear(E → V, no bias): the correction logits (the fused op adds them)
// Init: the two GRU weights draw U(−1/√G, 1/√G) (torch.nn.GRU's own init, which HF's _init_weights leaves alone) as
// (float)((2u − 1)/√G) from the table's init stream, the embed_proj weights the table's N(0, initializer_range).
// Checkpoints under SpecForge's legacy logit_head.* container load through df_domino_head_legacy_renames.
//
// Rows are the draft's block rows in (block, slot) order, R = nblocks · bs. Per block, with x_k = embed(t_k) the
// frozen target embedding of the head token t_k of slot k (the strategy builds the tokens: docs/domino-step.md §3):
//   s_0 .. = GRU(x_0 .. x_{L−1}),  L = bs (shift_label) or bs − 1, h₀ = 0
//   slot k >= suffix_start reads state s_k (shift_label) or s_{k−1}: c_k = silu(W₁ [h_k ; s]) [E]; other slots c_k = 0
//   final logits = lm_head h_k + W₂ c_k   (df_lmhead_domino with corr = c, w2 = W₂)
// Every step is an op on the head's context (kernels/ops_domino.h and ops.h), so the head runs on the CPU, the fake
// devices and the GPU alike.
#ifndef DF_MODELING_DOMINO_HEAD_H
#define DF_MODELING_DOMINO_HEAD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/ops_domino.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"
#include "modeling/strict_load.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_DOMINO_GRU_IH   "prefix_gru.weight_ih_l0"
#define DF_DOMINO_GRU_HH   "prefix_gru.weight_hh_l0"
#define DF_DOMINO_PROJ0    "embed_proj.0.weight"
#define DF_DOMINO_PROJ2    "embed_proj.2.weight"
#define DF_DOMINO_GRU_PREF "prefix_gru."

typedef struct df_domino_head df_domino_head;
struct df_draft_model;

// The first slot whose logits get the correction: pure_draft_prefix_len with shift_label, else 1 + it.
int64_t df_domino_suffix_start(const df_draft_config *cfg);
// GRU steps per block: bs with shift_label, bs − 1 without (the last slot's token is never read).
int64_t df_domino_gru_steps(const df_draft_config *cfg);

// Adds the head's parameters for cfg (nothing for a draft that is not a Domino draft).
df_status df_domino_head_add_params(const df_draft_config *cfg, df_params *p, df_error *err);
// The cold-init bound of a parameter: 1/√G for the two GRU weights (drawn uniform in ±bound), 0 for every other.
double df_domino_head_init_bound(const df_draft_config *cfg, const char *name);

// Binds the head to the model's flat weights and grads (the table is final). cfg is borrowed.
df_status df_domino_head_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                float *grads, df_domino_head **out, df_error *err);
void df_domino_head_free(df_domino_head *h);

// The head of a Domino draft model (NULL for another draft). Defined in modeling/draft_model.c.
df_domino_head *df_draft_model_domino_head(struct df_draft_model *m);

// embed_proj.2.weight [V, E] and its gradient, for the fused op (valid while the model lives).
const df_tensor *df_domino_head_w2(const df_domino_head *h);
df_tensor *df_domino_head_w2_grad(df_domino_head *h);
int64_t df_domino_head_emb_dim(const df_domino_head *h);

// What a forward reads, all on the head's context's device: hidden [R, H] in the draft's storage dtype (borrowed until
// the backward), the head tokens [R] i32 (< V) and the corrected-row flags [R] u8 (slot >= suffix_start; copied), the
// frozen target embedding [V, H] (storage dtype).
//
// Mixed precision (bf16 storage): the GRU and embed_proj.0 are an fp32 island on their fp32 masters; hidden and the
// embedding rows are cast up at its entry, the latent c down for the fused LM head (embed_proj.2 is read in bf16 there,
// its gradient fp32), dcorr up and the head's d(hidden) summed in fp32 and rounded once.
typedef struct {
  int64_t nblocks, bs;
  const void *hidden;
  const int32_t *head_ids;
  const uint8_t *corrected;
  const df_tensor *embed;
} df_domino_head_in;

// Forward: *corr receives the correction latent c [R, E] in the storage dtype (0 on uncorrected rows), owned by the
// head and valid until the next forward or backward.
df_status df_domino_head_forward(df_domino_head *h, const df_domino_head_in *in, const void **corr, df_error *err);
// Backward of the last forward: dcorr [R, E] (device, storage dtype) → parameter gradients added into the model's
// grads, and the head's input gradient added into dhidden [R, H] (storage dtype).
df_status df_domino_head_backward(df_domino_head *h, const void *dcorr, void *dhidden, df_error *err);

// logit_head.prefix_gru.* → prefix_gru.*, logit_head.embed_proj.* → embed_proj.* (SpecForge's
// normalize_draft_head_checkpoint_keys); *n receives the count.
const df_rename *df_domino_head_legacy_renames(int *n);

#ifdef __cplusplus
}
#endif

#endif
