// The DSpark heads on top of the DFlash backbone (shared/reference/dflash-dspark.md §2.1): the Markov head
// (vanilla | gated | rnn), whose logit bias is W2·u for a latent u of rank r, and the confidence head. Their
// parameters live in the draft model's table (modeling/draft_model.c adds and binds them when the config is a
// DSpark draft), after norm.weight, in this order and with SpecForge's checkpoint names:
//   markov_head.markov_w1.weight   [V, r]      Embedding: W1[prev] is the previous token's latent
//   markov_head.markov_w2.weight   [V, r]      Linear(r → V, no bias)
//   markov_head.gate_proj.{weight [r, H+r], bias [r]}            gated only: Linear(H + r → r) on [h ; W1[prev]]
//   markov_head.joint_proj.{weight [3r, 2r+H], bias [3r]}        rnn only: Linear(2r + H → 3r) on [s ; W1[prev] ; h]
//   confidence_head.proj.{weight [1, H (+ r)], bias [1]}         with the confidence head
// Init is the table's HF rule (2-D weights and the embedding N(0, initializer_range), biases 0); SpecForge has
// no special init for these heads. Checkpoints written under the legacy logit_head.* container load through
// df_dspark_heads_legacy_renames.
//
// Rows are the draft's block rows in (block, slot) order, R = nblocks · bs; h is the final-normed draft hidden
// state (the one the LM head reads), prev the previous token of each row. Per row:
//   e = W1[prev]
//   vanilla  u = e
//   gated    g = σ(Wg [h ; e] + bg),  u = g ⊙ e
//   rnn      per block, slots k = 0..bs−1 in order, state s = 0 before slot 0:
//            (a, c, o) = Wj [s ; e ; h] + bj;  u = tanh(o);  s ← σ(a) ⊙ s + (1 − σ(a)) ⊙ tanh(c)
//   Markov logit bias = W2 · u (the fused LM-head op adds it: df_lmhead_dspark's markov_u / markov_w2)
//   confidence logit  = wc · [h ; e] + bc  (or wc · h + bc without confidence_head_with_markov)
// Every step is an op on the heads' context (kernels/ops.h: df_linear_*, df_embedding_*, df_copy_2d,
// df_markov_gate_*, df_markov_rnn_*), so the heads run wherever the model's context does: the CPU, the fake
// devices of the residency tests, and a GPU once its backend fills those slots (until then the table's error
// names the missing op).
#ifndef DF_MODELING_DSPARK_HEADS_H
#define DF_MODELING_DSPARK_HEADS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"
#include "modeling/strict_load.h"

#ifdef __cplusplus
extern "C" {
#endif

// Every confidence-head tensor name starts with this (the one part of a draft SGLang keeps in fp32).
#define DF_DSPARK_CONFIDENCE_PREFIX "confidence_head."

typedef struct df_dspark_heads df_dspark_heads;
struct df_draft_model;

// Adds the heads' parameters for cfg (a DSpark draft; nothing for markov_rank 0 without a confidence head).
df_status df_dspark_heads_add_params(const df_draft_config *cfg, df_params *p, df_error *err);

// Binds the heads to the model's flat weights and grads (the table is final). cfg is borrowed.
df_status df_dspark_heads_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_dspark_heads **out, df_error *err);
void df_dspark_heads_free(df_dspark_heads *h);

// The heads of a DSpark draft model (NULL for a DFlash draft). Defined in modeling/draft_model.c.
df_dspark_heads *df_draft_model_dspark_heads(struct df_draft_model *m);

int64_t df_dspark_heads_markov_rank(const df_dspark_heads *h); // 0: no Markov head
bool df_dspark_heads_has_confidence(const df_dspark_heads *h);
// W2 [V, r] and its gradient, for the fused op (valid while the model lives; only with a Markov head).
const df_tensor *df_dspark_heads_w2(const df_dspark_heads *h);
df_tensor *df_dspark_heads_w2_grad(df_dspark_heads *h);

// Forward over nblocks · bs rows: hidden [R, H] (borrowed until the backward), prev [R] token ids in
// [0, V) (copied). *latent receives u [R, r] (NULL without a Markov head), *conf the confidence logits [R] (NULL
// without a confidence head); both are owned by the heads and valid until the next forward. Every pointer here
// and in the backward is memory of the heads' context's device.
df_status df_dspark_heads_forward(df_dspark_heads *h, int64_t nblocks, int64_t bs, const float *hidden,
                                  const int32_t *prev, const float **latent, const float **conf, df_error *err);

// Backward of the last forward: du [R, r] (NULL: zero) and dconf [R] (NULL: zero) → parameter gradients
// added into the model's grads, and the heads' input gradient added into dhidden [R, H].
df_status df_dspark_heads_backward(df_dspark_heads *h, const float *du, const float *dconf, float *dhidden,
                                   df_error *err);

// logit_head.markov_head.* → markov_head.*, logit_head.confidence_head.* → confidence_head.* (SpecForge's
// normalize_draft_head_checkpoint_keys); *n receives the count.
const df_rename *df_dspark_heads_legacy_renames(int *n);

// ---- export ------------------------------------------------------------------------------------------------

// SpecForge's DSpark export normalization (scripts/gates/normalize_dflash_export.py), on a parsed config.json
// of a DSpark draft (modified in place): model_type must be "qwen3"; markov_rank (dflash_config's, else the
// top level's) must be a positive integer and markov_head_type (likewise) one of vanilla | gated | rnn (any
// case; written lower-case); each of markov_rank, markov_head_type, enable_confidence_head and
// confidence_head_with_markov present in dflash_config is copied to the top level, where a different value is
// a conflict and fails; architectures becomes ["Qwen3DSparkModel"]; auto_map is deleted. dflash_config gets
// projector_type "dspark" and attention_mode (default "gqa", lower-case) when absent, as SpecForge's
// DSparkDraftModel writes them into the config it saves. `source` names the file in errors; on failure the
// document is left unchanged.
df_status df_dspark_normalize_export_config(json_t *config, const char *source, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
