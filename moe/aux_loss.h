// MoE auxiliary load-balancing losses (registry by df_moe_aux_type: "switch") with their gradient into the
// router scores, and the per-layer load metrics (moe/load_max_ratio, moe/load_min_ratio, ...).
#ifndef DF_MOE_AUX_LOSS_H
#define DF_MOE_AUX_LOSS_H

#include <stdint.h>

#include "base/error.h"
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// One aux loss over a micro-batch's routing: scores (T, E), counts (E) (detached), coefficient coeff.
typedef struct {
  const char *name;
  // The coefficient-scaled loss value.
  double (*value)(double coeff, int64_t T, int64_t E, int64_t k, const float *scores, const int32_t *counts);
  // ∂loss/∂s_te for every row when that gradient is the same row for all t (true of the switch loss):
  // row (E) = upstream · ∂loss/∂s_t·.
  void (*score_grad_row)(double coeff, int64_t T, int64_t E, int64_t k, const int32_t *counts, double upstream,
                         float *row);
  // The value from the column sums Σ_t s_te (E) instead of the scores: what data parallel computes from the
  // sums and counts reduced over the ranks' rows (T = all ranks' rows).
  double (*value_from_sums)(double coeff, int64_t T, int64_t E, int64_t k, const double *score_sums,
                            const int32_t *counts);
} df_moe_aux_loss;

// The registered aux loss of that type; fails naming moe_aux_loss_type for an unknown one.
df_status df_moe_aux_loss_get(df_moe_aux_type type, const df_moe_aux_loss **out, df_error *err);

// switch (transformers' load_balancing_loss_func for one layer, no mask):
//   L = coeff · E · Σ_e (counts_e / T) · P_e,  P_e = (1/T) Σ_t s_te;  ∂L/∂s_te = coeff · E · counts_e / T².
double df_moe_switch_loss(double coeff, int64_t T, int64_t E, int64_t k, const float *scores, const int32_t *counts);
double df_moe_switch_loss_from_sums(double coeff, int64_t T, int64_t E, int64_t k, const double *score_sums,
                                    const int32_t *counts);
void df_moe_switch_score_grad_row(double coeff, int64_t T, int64_t E, int64_t k, const int32_t *counts, double upstream,
                                  float *row);

// Load statistics of one routing (T rows, k per row): counts relative to the uniform load T·k/E.
typedef struct {
  double load_max_ratio;      // max_e counts / (T·k/E), <= E/k
  double load_min_ratio;      // min_e counts / (T·k/E)
  double experts_unused_frac; // #{e : counts_e = 0} / E
} df_moe_load_stats;

df_moe_load_stats df_moe_load_stats_of(const int32_t *counts, int64_t E, int64_t T, int64_t k);

#ifdef __cplusplus
}
#endif

#endif
