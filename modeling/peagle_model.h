// The P-EAGLE draft (SpecForge's PEagleDraftModel, docs/peagle.md §2): its own embedding (initialised from the
// target's and trained), fc over three captured target layers, a trained mask_hidden standing in for the captured
// features of the rows that draft further ahead, num_hidden_layers decoder layers (layer 0 reads
// [input_layernorm(embedding) ; hidden_norm(hidden)], 2H wide, as EAGLE-3's midlayer; the others are plain Llama
// layers), the final norm and lm_head over the draft vocabulary with the d2t / t2d buffers. Its parameters are entries
// of the draft model's table (SpecForge's checkpoint names, registration order). A training micro-batch is laid out
// dense as [depth, sample, position]: row (d, b, p) drafts the token d + 2 positions after p of sample b; every depth
// runs in one pass per layer with the training-time-test attention (kernels/eagle3.h), which is exactly P-EAGLE's
// mask there (depth-0 keys causally, the same position's keys of depths 1 .. d). The strategy reads the rows COD
// sampling chose and drops the rest.
#ifndef DF_MODELING_PEAGLE_MODEL_H
#define DF_MODELING_PEAGLE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_peagle_model df_peagle_model;
struct df_draft_model;

// Appends the draft's entries to p in SpecForge's registration order (also the cold-init order): embed_tokens, fc,
// mask_hidden [1, 1, 3·Ht], layers.0.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}, layers.i (the same without hidden_norm, q/k/v reading H),
// norm, lm_head; then the buffers t2d (BOOL [V]) and d2t (I64 [D]).
df_status df_peagle_add_params(const df_draft_config *cfg, df_params *p, df_error *err);
// The cold-init standard deviation of an entry when it is not the config's initializer_range (0: that one):
// mask_hidden draws N(0, 1), as SpecForge's torch.randn.
double df_peagle_init_std(const df_draft_config *cfg, const char *name);
df_status df_peagle_model_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_peagle_model **out, df_error *err);
void df_peagle_model_free(df_peagle_model *m);
// The P-EAGLE part of a draft model (NULL for another kind).
df_peagle_model *df_draft_model_peagle(struct df_draft_model *m);

const df_draft_config *df_peagle_config(const df_peagle_model *m);
// lm_head [D, H] and its gradient; the embedding [V, H] (the draft's own) on the model's device.
void df_peagle_lm_head(df_peagle_model *m, df_tensor *w, df_tensor *g);
void df_peagle_embedding(df_peagle_model *m, df_tensor *w);
df_dtype df_peagle_storage(const df_peagle_model *m);
int64_t df_peagle_activation_bytes(const df_peagle_model *m);

// ---- training -----------------------------------------------------------------------------------------------------
// One micro-batch of T depths over B samples of S positions (R = B·S); device arrays, untouched until the backward.
typedef struct {
  int64_t B, S, T;
  const float *aux;       // (R, 3·Ht) the captured layers, in the model's storage dtype
  const int32_t *ids;     // (T, R) depth 0: the token at p + 1 (0 past the sample's end); depth d > 0: the mask token
  const int32_t *pos;     // (T, R) RoPE positions p + d
  const int32_t *lengths; // (B) rows of each sample (depth-0 keys j < length are real)
} df_peagle_batch;

// Every layer over the T·R rows; *out (T·R, H) is norm(h_L) in the storage dtype, valid until the next forward.
df_status df_peagle_forward(df_peagle_model *m, const df_peagle_batch *b, const float **out, df_error *err);
// The backward of the last forward given d_out (T·R, H) = ∂loss/∂out: parameter gradients are added.
df_status df_peagle_backward(df_peagle_model *m, const float *d_out, df_error *err);

// ---- speculative decoding -----------------------------------------------------------------------------------------
// Each layer's keys and values of one sequence at positions 0 .. cap − 1 (fp32 storage).
typedef struct df_peagle_cache df_peagle_cache;
df_status df_peagle_cache_create(df_peagle_model *m, int64_t cap, df_peagle_cache **out, df_error *err);
void df_peagle_cache_free(df_peagle_cache *c);
// n rows at cache positions start .. start + n − 1 attend causally to the cache (positions < start are kept): the
// first n0 rows read the captured features aux (n0, 3·Ht), the other n − n0 are mask rows (mask_hidden); ids (n) are
// the rows' tokens (the mask token on the mask rows). Parallel drafting appends the K − 1 mask rows of the last anchor
// right after it, so causal attention is P-EAGLE's mask. *out (n, H) is norm(h_L). Device arrays; fp32 drafts only.
df_status df_peagle_decode(df_peagle_model *m, df_peagle_cache *c, int64_t start, int64_t n, int64_t n0,
                           const float *aux, const int32_t *ids, const float **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
