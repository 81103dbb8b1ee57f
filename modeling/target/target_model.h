// The target LLM's own forward (Qwen3 dense decoder; Llama and Qwen2 from the same code): loaded strictly
// from an HF directory, run through the op interface with a KV cache, returning the hidden states of chosen
// layers, the final post-norm state and logits. Capture, regeneration and speculative-decoding eval use it;
// online training will too (docs/target.md).
#ifndef DF_MODELING_TARGET_MODEL_H
#define DF_MODELING_TARGET_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_TARGET_QWEN3 = 0, DF_TARGET_LLAMA = 1, DF_TARGET_QWEN2 = 2 } df_target_family;

// The resolved architecture (config.json), immutable once built.
typedef struct {
  df_target_family family;
  const char *model_type;
  int64_t num_layers, hidden, vocab, heads, kv_heads, head_dim, intermediate;
  double rms_norm_eps;
  bool qk_norm;         // Qwen3: per-head RMSNorm of q and k before RoPE
  bool qkv_bias;        // biases on q/k/v_proj (Qwen2 always; Qwen3/Llama when attention_bias)
  bool o_bias;          // bias on o_proj (Qwen3/Llama attention_bias)
  bool tied;            // lm_head = embed_tokens
  df_rope_config rope;  // default, linear, yarn or llama3 (HF semantics)
  int64_t max_position; // max_position_embeddings
} df_target_spec;

const char *df_target_family_name(df_target_family f);

// Reads dir/config.json (or a text_config inside it) into spec; refuses what the forward does not implement
// (sliding windows, MLP biases, activations other than SiLU, MoE targets), naming the key.
df_status df_target_spec_from_dir(const char *dir, df_target_spec *spec, df_error *err);

typedef struct df_target df_target;

// Loads the weights strictly (every parameter present with its shape, nothing unexpected but RoPE buffers and a
// tied lm_head), single or sharded safetensors, any float dtype, converted to fp32 on ctx's device.
df_status df_target_load(const char *dir, df_ctx *ctx, df_target **out, df_error *err);
// The same target with its device buffers allocated but no weight read (their contents undefined): what a memory
// plan (a measuring context, kernels/ops.h df_ctx_options.measure) sizes from config.json alone.
df_status df_target_create(const char *dir, df_ctx *ctx, df_target **out, df_error *err);
void df_target_free(df_target *t);
const df_target_spec *df_target_get_spec(const df_target *t);
df_ctx *df_target_ctx(const df_target *t);
// Read-only views of the embedding [V, H] and the LM head [V, H] (the embedding when tied), on ctx's device.
df_tensor df_target_embed(const df_target *t);
df_tensor df_target_lm_head(const df_target *t);

// One sequence's KV cache, `capacity` positions long.
typedef struct df_target_cache df_target_cache;
df_status df_target_cache_create(df_target *t, int64_t capacity, df_target_cache **out, df_error *err);
void df_target_cache_free(df_target_cache *c);
int64_t df_target_cache_len(const df_target_cache *c);
int64_t df_target_cache_capacity(const df_target_cache *c);
// Drops every position >= len (speculative decoding rolls back rejected tokens); len <= the current length.
df_status df_target_cache_truncate(df_target_cache *c, int64_t len, df_error *err);

// What one forward returns; every pointer may be NULL (not computed). Float outputs live on ctx's device.
typedef struct {
  int num_capture;        // K
  const int *capture_ids; // layer ids L: the output of decoder layer L, 0 <= L < layers; = HF hidden_states[L + 1]
                          // except for the last layer, whose HF entry is post-norm (final_hidden) and ours is not
  float *captured;        // (T, K·H) the K layers' outputs concatenated in capture_ids order
  float *final_hidden;    // (T, H) after the final norm
  int64_t logits_from;    // logits and argmax cover rows logits_from .. T−1
  float *logits;          // (T − logits_from, V)
  int32_t *argmax;        // host (T − logits_from): greedy next token of each of those rows (first maximum)
  float *all_hidden;      // (L + 1, T, H) HF hidden_states as transformers returns them (tests; last = post-norm)
} df_target_outputs;

// Runs T new tokens (host ids) at positions len .. len+T−1 of the cache and appends their keys/values.
// On failure the cache length is unchanged.
df_status df_target_forward(df_target *t, df_target_cache *c, const int32_t *ids, int64_t T,
                            const df_target_outputs *out, df_error *err);

// ---- generation (target_generate.c) ---------------------------------------------------------------------

enum { DF_TARGET_MAX_EOS = 8 };

// The end-of-sequence ids of an HF directory: eos_token_id (an integer or a list) of config.json and of
// generation_config.json, merged; *n = 0 when neither names one.
df_status df_target_eos_ids(const char *dir, int32_t *ids, int *n, df_error *err);

// Greedy decoding (temperature 0): resets the cache, prefills prompt (P >= 1 tokens), then appends up to
// max_new tokens one at a time, stopping after the first one that is in eos (which is kept). out receives the
// generated ids; the cache then holds prompt + all generated tokens but the last.
df_status df_target_generate_greedy(df_target *t, df_target_cache *c, const int32_t *prompt, int64_t P, int64_t max_new,
                                    const int32_t *eos, int n_eos, int32_t *out, int64_t *n_out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
