// The sparse-MoE ops: router scores, top-k selection, the dispatch plan, the per-row scalings of the experts and
// the shared expert, the input centering, the aux loss with the routing statistics, and the deferred updates
// (EMA centering mean, noaux_tc selection bias). Forward and backward, over df_tensor views on the context's
// device; moe/ composes them (moe/layer.c) and owns config, registries and layouts. The CPU twins are
// kernels/cpu/moe_router.c, moe_dispatch.c and moe_aux.c; the grouped expert GEMMs are linear ops per expert.
//
// Router math is fp32 (scores, weights, logits, statistics), accumulated in double; indices and counts are i32;
// the statistics vectors are f64. Every reduction runs in a fixed order: results are bitwise the same for any
// thread count.
#ifndef DF_KERNELS_OPS_MOE_H
#define DF_KERNELS_OPS_MOE_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Score functions (moe/registry_core.c names them; a new one is a registry row plus its cases in
// kernels/cpu/moe_router.c and its CUDA twin).
typedef enum { DF_MOE_SCORE_SOFTMAX = 0, DF_MOE_SCORE_SIGMOID, DF_MOE_SCORE_SQRTSOFTPLUS } df_moe_score_func;
// Auxiliary load-balancing losses (moe/registry_core.c: "switch").
typedef enum { DF_MOE_AUX_SWITCH = 0 } df_moe_aux_type;

// The top-k router's selection rule.
typedef struct {
  int64_t E, k;
  int64_t n_group, topk_group; // group-limited iff topk_group < n_group
  bool norm_topk_prob;         // weights ← weights / (Σ weights + 1e−20)
  float routed_scaling_factor; // always multiplies the weights
} df_moe_route_desc;

// scores (T, E) = f(logits (T, E)): softmax over E (max-subtracted), sigmoid, or sqrt(softplus) with the stable
// softplus max(ℓ, 0) + log1p(e^−|ℓ|); evaluated in double, stored in fp32.
df_status df_moe_scores_forward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores,
                                df_error *err);
// dlogits (T, E) from dscores (T, E) (may alias dlogits).
df_status df_moe_scores_backward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, const df_tensor *scores,
                                 const df_tensor *dscores, df_tensor *dlogits, df_error *err);

// Selection from scores (T, E) plus sel_shift (E) (the balance bias; NULL: none): group-limited masking to −inf
// (groups ranked by the sum of their top-2 selection scores, ties to the lower group), top-k best first (ties to
// the lower expert id; a NaN never displaces anything), combine weights from the unbiased scores, and counts (E)
// of assignments per expert (Σ = T·k). indices, counts: i32 (T, k), (E); weights: f32 (T, k).
df_status df_moe_select(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores, const df_tensor *sel_shift,
                        df_tensor *indices, df_tensor *weights, df_tensor *counts, df_error *err);
// dscores (T, E) (written) = ∂/∂s of Σ dweights·weights (dweights (T, k); NULL: none) plus aux_row (E; NULL: none),
// the gradient of a term linear in every row's scores (the switch aux loss).
df_status df_moe_select_backward(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores,
                                 const df_tensor *indices, const df_tensor *weights, const df_tensor *dweights,
                                 const df_tensor *aux_row, df_tensor *dscores, df_error *err);

// ---- centering (the router input only) ----------------------------------------------------------------------------

// u (T, H) = x − mu (mu (H): the running mean, eval), or, with mu NULL, x − the mean of each sample's rows (samples:
// consecutive blocks of rows_per_sample rows; T a multiple of it); batch_mean (H), when not NULL, receives the mean
// over all rows (the EMA stash). Accumulates in double in row order.
df_status df_moe_center_forward(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *x, const df_tensor *mu,
                                df_tensor *u, df_tensor *batch_mean, df_error *err);
// dx (T, H) (= or +=) du − the mean of du over each sample's rows.
df_status df_moe_center_backward(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *du, df_tensor *dx,
                                 bool accumulate, df_error *err);

// ---- dispatch -----------------------------------------------------------------------------------------------------

// The stable counting sort of the T·k slots by expert: offsets (E + 1) the exclusive scan of counts (E), slot (Tk)
// the slot t·k + j at each sorted position (increasing slot within an expert), token (Tk) = slot / k. i32 all.
df_status df_moe_plan(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts, df_tensor *offsets,
                      df_tensor *slot, df_tensor *token, df_error *err);
// h (N, I) row p *= w[idx[p]] (idx i32 (N); NULL: w[p]); w f32.
df_status df_moe_scale_rows(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx, df_error *err);
// The backward of h = c·a for a per-row scalar c: for each row p of dh, act (N, I), the dot d = dh_p·act_p (double),
// then dh_p *= c_p. Routed experts (sigmoid false): c_p = w[idx[p]], out[idx[p]] = d. Shared-expert gate
// (sigmoid true, idx NULL): c_p = w[p] = z_p a sigmoid output, out[p] = z_p(1 − z_p)·d (the gate logit's gradient).
df_status df_moe_gate_backward(df_ctx *ctx, bool sigmoid, df_tensor *dh, const df_tensor *act, const df_tensor *w,
                               const df_tensor *idx, df_tensor *out, df_error *err);
// z (T) ← sigmoid(z) (in double), then a (T, S) row t *= z[t]: the shared expert's gate.
df_status df_moe_sigmoid_scale(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err);

// Grouped expert GEMMs over rows sorted by expert: segment e = rows [offsets[e], offsets[e + 1]) of x (Tk, in) meets
// expert e of the stacked weight w (E, out, in). Forward: y_e (Tk, out) = x_e·w_eᵀ (written).
df_status df_moe_grouped_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                                 df_tensor *y, df_error *err);
// Backward per segment: dw_e += dy_eᵀ·x_e (dw NULL: frozen experts), then dx_e (= or +=) dy_e·w_e (dx NULL: none).
// dx may alias x: each segment's weight gradient is taken before its dx is written.
df_status df_moe_grouped_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                  const df_tensor *offsets, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                  df_error *err);

// ---- aux loss, routing statistics, deferred updates -------------------------------------------------------------

// One routing's statistics, f64: the aux loss weighted by den (the objective's part), the aux loss, the load
// ratios (counts relative to the uniform load T·k/E), max |selection bias|, then each expert's share of the T·k
// slots.
enum {
  DF_MOE_STAT_AUX_NUM, // den · aux
  DF_MOE_STAT_AUX,     // aux (coefficient-scaled; 0 when coeff = 0)
  DF_MOE_STAT_LOAD_MAX,
  DF_MOE_STAT_LOAD_MIN,
  DF_MOE_STAT_UNUSED, // #{e : counts_e = 0} / E
  DF_MOE_STAT_BIAS_ABS_MAX,
  DF_MOE_STAT_LOAD // E values
};
#define DF_MOE_STATS(E) (DF_MOE_STAT_LOAD + (E))
typedef struct {
  df_moe_aux_type aux; // the loss (when coeff > 0)
  double coeff;        // 0: no aux loss (its entries are 0)
  int64_t k;
  double den; // weight of the aux loss in DF_MOE_STAT_AUX_NUM
} df_moe_stats_desc;
// stats [DF_MOE_STATS(E)] f64 (= or += when accumulate) from scores (T, E) and counts (E); bias (E) f32 or NULL;
// count_stash (E) f32, when not NULL, receives the counts (the noaux_tc controller's load).
df_status df_moe_route_stats(df_ctx *ctx, const df_moe_stats_desc *desc, const df_tensor *scores,
                             const df_tensor *counts, const df_tensor *bias, df_tensor *stats, bool accumulate,
                             df_tensor *count_stash, df_error *err);
// row (E) f32 = upstream · ∂aux/∂s_t· (the same for every row t of a T-row routing; switch: coeff·E·counts / T²).
df_status df_moe_aux_backward(df_ctx *ctx, const df_moe_stats_desc *desc, int64_t T, const df_tensor *counts,
                              double upstream, df_tensor *row, df_error *err);
// The EMA of the centering mean: mu (H) ← stash when steps[0] = 0, else ρ·mu + (1 − ρ)·stash; steps[0] += 1 (f32).
df_status df_moe_center_ema(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps,
                            df_error *err);
// noaux_tc: bias_e += rate · sign(mean(load) − load_e), sign(0) = 0; load (E) f32 (counts, summed over ranks).
df_status df_moe_noaux_update(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
