// C-callable launchers of the CUDA kernels (kernels/cuda/*.cu), each taking a stream and raw device pointers,
// dimensions and storage dtypes; queued, never synchronising or allocating (scratch comes from the caller, sized by
// the *_workspace functions). Arguments are trusted: the op dispatchers in kernels/*.c validate them. Launch
// failures come back as a df_status naming the kernel.
//
// This branch carries the MoE group only (moe_router.cu, moe_dispatch.cu, moe_aux.cu, written on the cuda branch);
// kernels/cuda/moe.cu adapts them to the backend table's MoE slots.
#ifndef DF_KERNELS_CUDA_LAUNCH_H
#define DF_KERNELS_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *df_cu_stream; // cudaStream_t without the CUDA headers

// ---- moe_router.cu, moe_dispatch.cu, moe_aux.cu: the sparse-MoE FFN pieces --------------------------------------

typedef enum { DF_CU_SCORE_SOFTMAX = 0, DF_CU_SCORE_SIGMOID = 1, DF_CU_SCORE_SQRTSOFTPLUS = 2 } df_cu_score_func;

typedef struct {
  int64_t E, k;
  df_cu_score_func score;
  bool norm_topk_prob;
  float routed_scaling_factor;
  int64_t n_group, topk_group;
} df_cu_router_spec;

// scores [T, E] from fp32 logits (evaluated in double, stored fp32), and the backward dlogits (may alias dscores).
df_status df_cu_moe_scores_fwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                               float *scores, df_error *err);
df_status df_cu_moe_scores_bwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                               const float *scores, const float *dscores, float *dlogits, df_error *err);
// Selection per token (one warp): scores (+ sel_shift), group-limited masking to −inf, top-k best first with ties
// to the lower expert id, combine weights from the unbiased scores; counts [E] int32 (zeroed here, integer atomics).
// E <= 1024, k <= 32.
df_status df_cu_moe_select(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                           const float *sel_shift, int32_t *indices, float *weights, int32_t *counts, df_error *err);
// dscores (written) = aux_row (E, may be NULL) + ∂/∂s of Σ dweights·weights.
df_status df_cu_moe_weights_bwd(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                                const int32_t *indices, const float *weights, const float *dweights,
                                const float *aux_row, float *dscores, df_error *err);

// Centering: u = x − per-sample column mean (samples are consecutive blocks of rps rows); batch_mean [H] = mean
// over all rows (may be NULL). Backward: dx (= or +=) du − per-sample mean of du. Fixed: u = x − mu.
df_status df_cu_moe_center_sample_fwd(df_cu_stream s, const float *x, int64_t T, int64_t H, int64_t rps, float *u,
                                      float *batch_mean, df_error *err);
df_status df_cu_moe_center_sample_bwd(df_cu_stream s, const float *du, int64_t T, int64_t H, int64_t rps, float *dx,
                                      bool accumulate, df_error *err);
df_status df_cu_moe_center_fixed(df_cu_stream s, const float *x, const float *mu, int64_t T, int64_t H, float *u,
                                 df_error *err);
// μ ← m on the first update (*steps == 0), else ρ·μ + (1−ρ)·m; *steps += 1 (all on the device).
df_status df_cu_moe_center_ema(df_cu_stream s, int64_t H, const float *stash, float *mu, float *steps, double rho,
                               df_error *err);
// noaux_tc: β_e += rate · sign(mean(load) − load_e), load = counts (device).
df_status df_cu_moe_noaux_update(df_cu_stream s, int64_t E, const int32_t *counts, float *bias, float rate,
                                 df_error *err);
// Switch aux loss *d_loss = coeff·E·Σ_e (counts_e/T)·(Σ_t s_te / T) (double, column sums in a fixed order), and
// its score-gradient row: row[e] = upstream·coeff·E·counts_e / T². Load stats: out[0..2] = max/mean, min/mean,
// fraction of unused experts.
size_t df_cu_moe_aux_workspace(int64_t T, int64_t E);
df_status df_cu_moe_switch_loss(df_cu_stream s, double coeff, int64_t T, int64_t E, const float *scores,
                                const int32_t *counts, void *workspace, double *d_loss, df_error *err);
df_status df_cu_moe_switch_grad_row(df_cu_stream s, double coeff, int64_t T, int64_t E, const int32_t *counts,
                                    double upstream, float *row, df_error *err);
df_status df_cu_moe_load_stats(df_cu_stream s, const int32_t *counts, int64_t E, int64_t T, int64_t k, double *d_out,
                               df_error *err);

// Dispatch plan, the CPU's stable counting sort: offsets [E+1] (exclusive scan of counts), slot [Tk] (slot t·k + j
// of each sorted position, sorted stably by expert), token [Tk] = slot / k, pos_of_slot [Tk] (the inverse).
size_t df_cu_moe_plan_workspace(int64_t Tk, int64_t E);
df_status df_cu_moe_plan(df_cu_stream s, int64_t T, int64_t k, int64_t E, const int32_t *indices, const int32_t *counts,
                         int32_t *offsets, int32_t *slot, int32_t *token, int32_t *pos_of_slot, void *workspace,
                         df_error *err);
// h[p, :] *= w[slot[p]] over [Tk, I] (the combine weight before the down projection).
df_status df_cu_moe_scale_rows(df_cu_stream s, void *h, df_dtype dt, int64_t Tk, int64_t I, const float *w,
                               const int32_t *slot, df_error *err);
// y[t] (= or +=) Σ_j ys[pos_of_slot[t·k + j]] with the k rows added in increasing sorted position (the CPU's
// order): deterministic, no atomics.
df_status df_cu_moe_combine(df_cu_stream s, const void *ys, df_dtype ys_dt, const int32_t *pos_of_slot, int64_t T,
                            int64_t k, int64_t H, void *y, df_dtype y_dt, bool accumulate, df_error *err);
// Backward of h = w·a per sorted row: dweights[slot[p]] = dh_p·a_p (double dot), then dh_p *= w[slot[p]] in place.
df_status df_cu_moe_dweights(df_cu_stream s, void *dh, df_dtype dh_dt, const void *act, df_dtype act_dt, int64_t Tk,
                             int64_t I, const float *w, const int32_t *slot, float *dweights, df_error *err);
// Shared-expert gate: z[t] = sigmoid(zlogit[t]) in place, then a[t, :] *= z[t]; backward dzeta[t] =
// z(1−z)·(da_t·act_t) and da[t, :] *= z[t] in place.
df_status df_cu_rows_sigmoid_scale(df_cu_stream s, float *z, void *a, df_dtype dt, int64_t T, int64_t S, df_error *err);
df_status df_cu_rows_gate_bwd(df_cu_stream s, const float *z, void *da, df_dtype da_dt, const void *act,
                              df_dtype act_dt, int64_t T, int64_t S, float *dzeta, df_error *err);

// Rows scaled by a per-row factor: a[t, :] *= z[t].
df_status df_cu_rows_scale(df_cu_stream s, const float *z, void *a, df_dtype dt, int64_t T, int64_t S, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
