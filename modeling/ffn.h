// The feed-forward block of a draft decoder layer behind one small vtable, so the layer code never knows
// whether it is the dense SwiGLU MLP or a sparse MoE. An FFN adds its parameters to the model's table,
// resolves its views once the flat buffers exist, and runs forward/backward on rows of [R, H].
#ifndef DF_MODELING_FFN_H
#define DF_MODELING_FFN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_ffn df_ffn;

// Memory is the caller's: `saved` holds what the backward needs (kept from forward to backward, one
// region per layer); `scratch` is free to reuse between calls (shared by every layer, forward and backward).
typedef struct {
  const char *kind; // "dense", "moe", ...
  // fp32 elements of saved / scratch memory for R rows (an upper bound when the need is data-dependent).
  int64_t (*saved_elems)(const df_ffn *f, int64_t rows);
  int64_t (*scratch_elems)(const df_ffn *f, int64_t rows);
  // Called after the table is finalized and the flat buffers are allocated on the context's device.
  df_status (*bind)(df_ffn *f, const df_params *p, float *weights, float *grads, df_device dev, df_error *err);
  // y [R, H] = ffn(x [R, H]).
  df_status (*forward)(df_ffn *f, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved, float *scratch,
                       df_error *err);
  // dx [R, H] (= or +=) ∂/∂x of dy [R, H]; parameter gradients are added into the bound grads buffer.
  df_status (*backward)(df_ffn *f, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                        bool accumulate_dx, const float *saved, float *scratch, df_error *err);
  void (*destroy)(df_ffn *f);
} df_ffn_vtable;

// Every implementation starts with this header.
struct df_ffn {
  const df_ffn_vtable *vt;
  int64_t layer; // decoder layer index (names: layers.{layer}.mlp.*)
};

// Builds the FFN the config asks for at layer `layer` and appends its parameters to p (not yet finalized),
// in checkpoint order: the MoE FFN (moe/ffn_moe.h) when the config names a moe_preset, else the dense SwiGLU MLP.
df_status df_ffn_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);
// The dense SwiGLU MLP: mlp.{gate,up,down}_proj.weight ([I, H], [I, H], [H, I]); y = down(silu(gate x) ⊙ up x).
df_status df_ffn_dense_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);

static inline void df_ffn_free(df_ffn *f) {
  if (f) f->vt->destroy(f);
}

#ifdef __cplusplus
}
#endif

#endif
