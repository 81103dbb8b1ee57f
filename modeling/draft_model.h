// The draft backbone (the decoder DFlash, DSpark and Domino drafts share: fc + hidden_norm over the target features,
// decoder layers over [context; block], final norm, DSpark heads when the config has them): parameters (SpecForge
// checkpoint names) in one flat table, HF-style init, and the forward/backward of one micro-batch through the op
// interface. Owns its activation arena.
#ifndef DF_MODELING_DRAFT_MODEL_H
#define DF_MODELING_DRAFT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/ffn.h"
#include "modeling/param_table.h"
#include "modeling/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_draft_model df_draft_model;

// One micro-batch as the strategy prepared it. Host arrays by default (the model uploads them); with on_device the
// arrays already live on the context's device (strategies/dflash/stage.c staged them) and are copied device to device.
typedef struct {
  int64_t B, S, N;            // batch, padded context length, blocks per sample (block size from config)
  const float *target_hidden; // (B, S, K·H) raw concatenated target features (fp32)
  const float *block_embed;   // (B, N·bs, H) frozen-embedding rows of the block input ids, in the storage dtype
  const int32_t *anchors;     // (B, N) block n of sample b covers positions anchor .. anchor+bs−1
  const uint8_t *keep;        // (B, N) 0 = padding block: sees nothing, outputs 0 from attention
  // (B·N·bs) and (B·(S + N·bs)) position ids (df_draft_fill_positions), or NULL: the model derives them from
  // host anchors (then the arrays must be host memory)
  const int32_t *pos_q, *pos_kv;
  bool on_device; // the arrays are on the context's device; anchors were validated where they were built
  // Where a training forward's FFN statistics go (modeling/ffn.h set_stats: f64 sums on the device, weighted by
  // ffn_stats_den); NULL: they stay in the layers' own records.
  double *ffn_stats;
  double ffn_stats_den;
} df_draft_batch;

// Position ids of a batch: block slot k of block n sits at anchor + k; context rows at 0..S−1. Padding blocks
// (whose anchors may be anything) use anchor 0: they see nothing and are seen by nothing. pos_q (B·N·bs),
// pos_kv (B·(S + N·bs)): per sample the S context positions, then its block positions.
void df_draft_fill_positions(int64_t B, int64_t S, int64_t N, int64_t bs, const int32_t *anchors, const uint8_t *keep,
                             int32_t *pos_q, int32_t *pos_kv);

// Builds the parameter table from the config and allocates params and grads (grads zeroed).
// Table order (also the init order): fc.weight, hidden_norm.weight, then per layer i input_layernorm,
// self_attn.{q,k,v,o}_proj (weight, then bias iff attention_bias, per projection), self_attn.{q,k}_norm,
// post_attention_layernorm, mlp.{gate,up,down}_proj, and last norm.weight. cfg is borrowed: it must outlive
// the model. The MLP is built through modeling/ffn.h.
df_status df_draft_model_create(const df_draft_config *cfg, df_ctx *ctx, df_draft_model **out, df_error *err);
// The same with the forward's storage dtype (modeling/ and kernels/ ops: activations, their gradients and the weights
// the forward reads). DF_BF16 is mixed precision: the fp32 parameters (df_draft_model_weights) are the masters the
// optimizer updates and checkpoints hold, a bf16 copy of them (df_draft_model_compute_params) is what the forward and
// backward read, and the weight gradients stay fp32; norms' statistics, softmax statistics and losses are fp32 in any
// case. DF_F32 is df_draft_model_create. A draft the bf16 path does not cover yet is refused (reason below).
df_status df_draft_model_create_as(const df_draft_config *cfg, df_ctx *ctx, df_dtype storage, df_draft_model **out,
                                   df_error *err);
void df_draft_model_free(df_draft_model *m);

const df_params *df_draft_model_params(const df_draft_model *m);
float *df_draft_model_weights(df_draft_model *m); // flat (df_params_numel) fp32 parameters
float *df_draft_model_grads(df_draft_model *m);   // flat fp32 gradients, same layout
df_dtype df_draft_model_storage(const df_draft_model *m);
// bf16 storage: the flat bf16 copy of the masters (df_params_numel elements) that df_adamw_fused refreshes with each
// update; NULL for fp32 storage.
void *df_draft_model_compute_params(df_draft_model *m);
// Rounds the masters into the bf16 copy: after anything but the fused AdamW wrote the masters (init, load, a resume,
// a ZeRO-1 all-gather, a test hook). A no-op for fp32 storage.
df_status df_draft_model_sync_params(df_draft_model *m, df_error *err);

// HF post_init: every weight / router / embedding of ndim >= 2 (linear weights, and the stacked MoE experts
// [E, out, in]) ~ N(0, initializer_range) drawn in table order, row-major, from df_rng_init(seed,
// DF_RNG_STREAM_INIT) as (float)(initializer_range · df_rng_normal); biases and buffers 0; norms 1.
df_status df_draft_model_init(df_draft_model *m, uint64_t seed, df_error *err);
// What a cold start takes from the target after the init (SpecForge's model.load_target_embedding): a P-EAGLE draft's
// own embed_tokens becomes the target's embedding embed (vocab, hidden) (host fp32); nothing for the other kinds.
df_status df_draft_model_init_from_target(df_draft_model *m, const float *embed, int64_t vocab, int64_t hidden,
                                          df_error *err);
// Strict load from a safetensors file or HF directory (every parameter filled, nothing extra); MoE tensors
// pass through the config's checkpoint layout (moe/layout.h). The MoE centering buffers (gate.input_mean,
// gate.input_mean_steps) are required.
df_status df_draft_model_load(df_draft_model *m, const char *path, df_error *err);
// The same; centering_optional (warm start) lets the centering buffers be absent (they keep their values).
df_status df_draft_model_load_ex(df_draft_model *m, const char *path, bool centering_optional, df_error *err);

// The decoder layers' FFNs ([n] = num_hidden_layers), for the MoE hooks of moe/ffn_moe.h (dense FFNs are
// skipped by every hook). The model forward sets their rows per sample (N·bs) itself.
df_ffn *const *df_draft_model_ffns(const df_draft_model *m, int *n);
bool df_draft_model_is_moe(const df_draft_model *m);
// The FFNs with their kind, for the run's FFN hooks (modeling/ffn.h df_ffn_set_*; no-ops for a dense draft).
df_ffn_set df_draft_model_ffn_set(const df_draft_model *m);
// Training (default) or eval for every MoE layer: eval forwards apply no deferred update, stash nothing and
// produce no aux loss. A no-op for dense drafts.
void df_draft_model_set_training(df_draft_model *m, bool training);

// Forward of one micro-batch; *out_hidden points at the final-normed hidden states (B, N·bs, H) in the storage dtype,
// owned by the model and valid until the next forward. Activations needed by the backward are kept; the batch is copied
// (uploaded, or copied device to device), so its arrays may be reused as soon as this returns.
df_status df_draft_model_forward(df_draft_model *m, const df_draft_batch *batch, const float **out_hidden,
                                 df_error *err);
// Backward of the last forward: d_hidden (B, N·bs, H) → parameter gradients added into the grads buffer.
// d_hidden (storage dtype) lives on the context's device, like out_hidden. Calling it twice adds the gradients twice.
df_status df_draft_model_backward(df_draft_model *m, const float *d_hidden, df_error *err);
void df_draft_model_zero_grads(df_draft_model *m);
// Called by df_draft_model_backward whenever the gradient of [from, numel) of the flat buffer is complete for this
// backward (work queued on the context: all of it is in order before what the context queues next): after the final
// norm, then after each layer from the last to the first. The parameters are laid out fc, hidden_norm, layers 0..L-1,
// norm, heads, and the heads' gradient is complete before the backward starts. A data-parallel trainer starts the
// reduction of those buckets while the lower layers still run (train/trainer/trainer_dp.c). NULL: none.
typedef df_status (*df_grads_ready_fn)(void *user, int64_t from, df_error *err);
void df_draft_model_on_grads_ready(df_draft_model *m, df_grads_ready_fn fn, void *user);

// Bytes of activation memory the last forward needed (the trainer prints it after its first micro-step): the arena laid
// out for its (B, S, N), i.e. the batch copy, everything the backward keeps, and the backward's scratch.
int64_t df_draft_model_activation_bytes(const df_draft_model *m);

#ifdef __cplusplus
}
#endif

#endif
