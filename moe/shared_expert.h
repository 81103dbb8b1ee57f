// The MoE shared expert ("swiglu"): a dense SwiGLU MLP of width S every token passes through, with an
// optional per-token sigmoid gate z = sigmoid(x·g_sᵀ) (g_s (1, H)) scaling its output; forward and backward.
#ifndef DF_MOE_SHARED_EXPERT_H
#define DF_MOE_SHARED_EXPERT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t H, S;
  bool gated;         // shared_expert_gate = sigmoid
  float swiglu_limit; // the routed experts' clamp rule; 0: none
} df_moe_shared_spec;

// w1 gate, w3 up (S, H), w2 down (H, S), gate (1, H) when gated; gradients alike.
typedef struct {
  df_tensor w1, w3, w2, gate;
  df_tensor g1, g3, g2, ggate;
} df_moe_shared_params;

// What the forward keeps (caller memory).
typedef struct {
  float *gate; // (T, S) x·w1ᵀ
  float *up;   // (T, S) x·w3ᵀ
  float *z;    // (T) sigmoid(x·g_sᵀ) when gated
} df_moe_shared_saved;

int64_t df_moe_shared_saved_elems(const df_moe_shared_spec *s, int64_t T);
int64_t df_moe_shared_scratch_elems(const df_moe_shared_spec *s, int64_t T);
// Lays the saved regions out from mem (df_moe_shared_saved_elems floats).
df_moe_shared_saved df_moe_shared_saved_at(const df_moe_shared_spec *s, int64_t T, float *mem);

// y (T, H) += z ⊙ w2·swiglu(w1 x, w3 x) (z = 1 ungated). The activations are scaled by z before the down
// projection, as the routed experts scale by their combine weight.
df_status df_moe_shared_forward(df_ctx *ctx, const df_moe_shared_spec *s, const df_moe_shared_params *p,
                                const df_tensor *x, const df_moe_shared_saved *sv, float *scratch, df_tensor *y,
                                df_error *err);
// dx (T, H) += ∂/∂x of dy; parameter gradients added.
df_status df_moe_shared_backward(df_ctx *ctx, const df_moe_shared_spec *s, df_moe_shared_params *p, const df_tensor *x,
                                 const df_tensor *dy, const df_moe_shared_saved *sv, float *scratch, df_tensor *dx,
                                 df_error *err);

#ifdef __cplusplus
}
#endif

#endif
