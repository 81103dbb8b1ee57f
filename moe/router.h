// The MoE top-k router in fp32: input centering, logits (x − c)·Wᵀ + b, the score function, selection
// (balance shift, group limit, top-k), combine weights, per-expert counts, and the backward of all of it —
// composed of ops (kernels/ops_moe.h); nothing here touches tensor data.
#ifndef DF_MOE_ROUTER_H
#define DF_MOE_ROUTER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops_moe.h"
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t H, E, k;
  df_moe_score_func score_func;
  bool norm_topk_prob;         // weights ← weights / (Σ weights + 1e−20)
  float routed_scaling_factor; // always multiplies the weights
  int64_t n_group, topk_group; // group-limited iff topk_group < n_group
} df_moe_router_spec;

// The spec taken from a resolved config, for hidden size H.
df_moe_router_spec df_moe_router_spec_from(const df_moe_config *m, int64_t H);
// Sizes positive, 1 <= k <= E, n_group divides E, the kept groups hold at least k experts.
df_status df_moe_router_spec_check(const df_moe_router_spec *s, df_error *err);

// One routing of T rows (memory on the context's device; the backward reads logits, scores, indices and weights).
typedef struct {
  int64_t T;
  float *logits;    // (T, E) ℓ = u·Wᵀ + b
  float *scores;    // (T, E) s = score_func(ℓ), unbiased
  int32_t *indices; // (T, k) distinct per row, best selection score first (ties → lower expert id)
  float *weights;   // (T, k) combine weights s[idx] (renormalised) × routed_scaling_factor
  int32_t *counts;  // (E) assignments per expert; Σ = T·k
} df_moe_routing;

// The op interface's selection rule for a spec.
df_moe_route_desc df_moe_router_desc(const df_moe_router_spec *s);

// ---- centering (router input only; the experts see the raw rows): df_moe_center_* ops on raw device rows -------

// u = x − (mean of x over each sample's rows): samples are consecutive blocks of rows_per_sample rows of x (T, H).
// batch_mean (H), when not NULL, receives the mean over all T rows (the EMA stash).
df_status df_moe_center_sample_forward(df_ctx *ctx, const float *x, int64_t T, int64_t H, int64_t rows_per_sample,
                                       float *u, float *batch_mean, df_error *err);
// dx (= or +=) du − (mean of du over each sample's rows): the per-sample mean stays in the graph.
df_status df_moe_center_sample_backward(df_ctx *ctx, const float *du, int64_t T, int64_t H, int64_t rows_per_sample,
                                        float *dx, bool accumulate, df_error *err);
// u = x − mu (mu (H), the running mean used in eval).
df_status df_moe_center_fixed(df_ctx *ctx, const float *x, const float *mu, int64_t T, int64_t H, float *u,
                              df_error *err);

// ---- router ---------------------------------------------------------------------------------------------

// Selection from r->scores (+ sel_shift (E), the balance controller's bias, when not NULL): df_moe_select.
df_status df_moe_router_select(df_ctx *ctx, const df_moe_router_spec *s, const float *sel_shift, df_moe_routing *r,
                               df_error *err);

// Logits, scores and selection for u (T, H) with router weight w (E, H) and optional logit bias b (E).
df_status df_moe_router_forward(df_ctx *ctx, const df_moe_router_spec *s, const df_tensor *u, const df_tensor *w,
                                const df_tensor *b, const float *sel_shift, df_moe_routing *r, df_error *err);

// dscores (T, E) (written) = ∂/∂s of Σ dweights·weights (dweights (T, k), may be NULL) plus aux_row (E), the
// gradient of a term that is linear in every row's scores (the switch aux loss), when not NULL.
df_status df_moe_router_weights_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r,
                                         const float *dweights, const float *aux_row, float *dscores, df_error *err);

// The whole router backward: dlogits (T, E) is scratch; dw (E, H) += dℓᵀ·u (NULL: no router gradient);
// du (T, H) = dℓ·W (written). Selection indices are piecewise constant and pass no gradient.
df_status df_moe_router_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r, const df_tensor *u,
                                 const df_tensor *w, df_tensor *dw, const float *dweights, const float *aux_row,
                                 float *dlogits, df_tensor *du, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
