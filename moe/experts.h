// The routed experts, "grouped" backend: the T·k (token, slot) assignments sorted stably by expert into
// contiguous segments, one GEMM triple per non-empty expert on its segment, the combine weight applied before
// the down projection, and a deterministic fp32 scatter-add into the [T, H] routed sum; and the backward.
// Both moe_dispatch values (sorted_loop, grouped_mm) run this path: ops only (kernels/ops_moe.h), so every buffer
// may live on the device; on the CPU one GEMM triple per segment (OpenBLAS), experts spread over the OpenMP threads.
#ifndef DF_MOE_EXPERTS_H
#define DF_MOE_EXPERTS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t H, I, E, k;
  float swiglu_limit; // 0: no clamp
} df_moe_experts_spec;

// Stacked weights and their gradients (views on the model's device): w1 gate, w3 up (E, I, H), w2 down (E, H, I).
// The gradient views are not touched when frozen (moe_freeze_experts).
typedef struct {
  df_tensor w1, w3, w2;
  df_tensor g1, g3, g2;
  bool frozen;
} df_moe_experts_params;

// What the forward keeps for the backward (device memory, Tk = T·k sorted positions).
typedef struct {
  int64_t T;
  int32_t *slot;    // (Tk) slot t·k + j of each sorted position (stable sort by expert id)
  int32_t *token;   // (Tk) slot / k
  int32_t *offsets; // (E + 1) segment starts: exclusive cumulative sum of the counts
  float *gate;      // (Tk, I) x·w1[e]ᵀ per sorted position
  float *up;        // (Tk, I) x·w3[e]ᵀ
} df_moe_slots;

// The stable counting sort of the slots by expert (df_moe_plan): fills slot, token and offsets from indices (T, k)
// and counts (E).
df_status df_moe_slots_plan(df_ctx *ctx, const df_moe_experts_spec *s, int64_t T, const int32_t *indices,
                            const int32_t *counts, df_moe_slots *d, df_error *err);

// Scratch floats of forward and backward for T rows.
int64_t df_moe_experts_forward_scratch_elems(const df_moe_experts_spec *s, int64_t T);
int64_t df_moe_experts_backward_scratch_elems(const df_moe_experts_spec *s, int64_t T);

// y (T, H) = Σ_j w_tj · expert_{idx_tj}(x_t) (written), for x (T, H), indices (T, k), weights (T, k),
// counts (E). Fills d (dispatch plan and pre-activations).
df_status df_moe_experts_forward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                 const df_tensor *x, const int32_t *indices, const float *weights,
                                 const int32_t *counts, df_moe_slots *d, float *scratch, df_tensor *y, df_error *err);

// From dy (T, H): dweights (T, k) written (∂/∂w_tj = dy_t · down_e(h_unscaled)); dx (T, H) added to; expert
// gradients added into p's gradient views unless p->frozen.
df_status df_moe_experts_backward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                  const df_tensor *x, const df_tensor *dy, const float *weights, const df_moe_slots *d,
                                  float *scratch, float *dweights, df_tensor *dx, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
