// The EAGLE-3 draft (SpecForge's LlamaForCausalLMEagle3, docs/eagle3-step.md §3): fc over three captured target
// layers (EAGLE 3.1: an RMSNorm per layer first), one decoder layer `midlayer` whose q/k/v read
// [input_layernorm(embedding) ; hidden_norm(hidden)] (2H), the final norm and lm_head over the draft vocabulary, with
// the d2t / t2d buffers; the embedding is the target's, frozen. Its parameters are entries of the draft model's
// table (SpecForge / SGLang checkpoint names, registration order), so checkpoints, the optimizer, warm starts and
// exports treat it as any draft; this module binds views into them and runs the training-time test step by step
// (forward T steps, then backward T−1 .. 0) and the autoregressive decode of speculative decoding, through ops only.
#ifndef DF_MODELING_EAGLE3_MODEL_H
#define DF_MODELING_EAGLE3_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_eagle3_model df_eagle3_model;
struct df_draft_model;

// Appends the draft's entries to p in SpecForge's registration order (also the cold-init order): midlayer
// self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, hidden_norm, input_layernorm, post_attention_layernorm, fc,
// fc_norm.{0,1,2} (EAGLE 3.1), norm, lm_head; then the buffers t2d (BOOL [V]) and d2t (I64 [D]), not trained.
df_status df_eagle3_add_params(const df_draft_config *cfg, df_params *p, df_error *err);
// Views of the parameters in weights / grads (the draft model's flat buffers on ctx's device) and the RoPE table.
df_status df_eagle3_model_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_eagle3_model **out, df_error *err);
void df_eagle3_model_free(df_eagle3_model *m);
// The EAGLE-3 part of a draft model (NULL for another kind).
df_eagle3_model *df_draft_model_eagle3(struct df_draft_model *m);
// SpecForge's initial buffers in a host copy of the flat parameters: t2d all true, d2t 0 (the identity mapping).
void df_eagle3_init_buffers(const df_params *p, float *flat);

const df_draft_config *df_eagle3_config(const df_eagle3_model *m);
// lm_head [D, H] and its gradient, on the model's device.
void df_eagle3_lm_head(df_eagle3_model *m, df_tensor *w, df_tensor *g);

// ---- the vocabulary mapping ---------------------------------------------------------------------------------------
// d2t [D] (draft id d is target id d + d2t[d]) and t2d [V] (0/1) as host arrays, read from or written into the flat
// weights (one copy each way when the device is not the host).
df_status df_eagle3_vocab_read(df_eagle3_model *m, int64_t *d2t, uint8_t *t2d, df_error *err);
// The same for any draft whose table p holds the t2d / d2t buffers (EAGLE-3 and P-EAGLE) in the flat weights.
df_status df_eagle_vocab_read(df_ctx *ctx, const df_params *p, float *weights, int64_t *d2t, uint8_t *t2d,
                              df_error *err);
df_status df_eagle_vocab_write(df_ctx *ctx, const df_params *p, float *weights, const int64_t *d2t, const uint8_t *t2d,
                               df_error *err);
df_status df_eagle3_vocab_write(df_eagle3_model *m, const int64_t *d2t, const uint8_t *t2d, df_error *err);

// ---- the training-time test ---------------------------------------------------------------------------------------
// One micro-batch of T steps; every array lives on the model's device and must stay untouched until the backward ran.
// aux, embed, *out and d_out hold elements of the model's storage dtype (df_eagle3_storage: bf16 in mixed precision,
// the float pointers then address bf16 elements); the model's statistics and its TTT attention (keys, values and
// their gradients, the softmax statistics) stay fp32.
typedef struct {
  int64_t B, S, T;
  const float *aux;       // (B·S, 3·Ht) the captured layers, concatenated
  const int32_t *ids;     // (T, B·S) step i's input tokens: the token at p + 1 + i (0 past the sample's end)
  const int32_t *pos;     // (T, B·S) step i's RoPE positions: p + i
  const int32_t *lengths; // (B) rows of each sample (the step-0 keys j < length are real)
  const float *embed;     // (V, H) the target's embedding (frozen)
  int64_t vocab;
} df_eagle3_batch;

// Lays the activations out for the batch and computes step 0's hidden input fc(aux) (fc_norm first in EAGLE 3.1).
df_status df_eagle3_begin(df_eagle3_model *m, const df_eagle3_batch *b, df_error *err);
// Step i (in order 0, 1, ..): *out (B·S, H) is what lm_head reads (norm(h), or h with norm_output false), valid until
// the model's next begin.
df_status df_eagle3_step_forward(df_eagle3_model *m, int64_t i, const float **out, df_error *err);
// The backward of step i (in order T−1 .. 0 after the forwards) given d_out (B·S, H), the gradient of the loss with
// respect to step i's *out: parameter gradients are added; step 0 ends with fc (and fc_norm).
df_status df_eagle3_step_backward(df_eagle3_model *m, int64_t i, const float *d_out, df_error *err);
// The storage dtype of the activations: the weight views' (bf16 when the draft model stores bf16).
df_dtype df_eagle3_storage(const df_eagle3_model *m);
// Bytes of the activation arena of the last begin.
int64_t df_eagle3_activation_bytes(const df_eagle3_model *m);

// ---- autoregressive decoding (speculative decoding)
// ------------------------------------------------------------------- The draft's own KV cache for one sequence:
// positions 0 .. cap − 1.
typedef struct df_eagle3_cache df_eagle3_cache;
df_status df_eagle3_cache_create(df_eagle3_model *m, int64_t cap, df_eagle3_cache **out, df_error *err);
void df_eagle3_cache_free(df_eagle3_cache *c);
// n new rows at positions start .. start + n − 1 (the cache keeps positions < start): hidden (n, H) is the draft's
// hidden input (from_aux: (n, 3·Ht) captured features, projected by fc first), ids (n) the tokens embedded with embed
// (V, H); the rows attend causally to the cache. *h_out (n, H) the layer output (the next draft step's hidden input)
// and *logits_in (n, H) what lm_head reads; both valid until the next decode. Device arrays.
df_status df_eagle3_decode(df_eagle3_model *m, df_eagle3_cache *c, int64_t start, int64_t n, const float *hidden,
                           bool from_aux, const int32_t *ids, const float *embed, int64_t vocab, const float **h_out,
                           const float **logits_in, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
