// The switch load-balancing loss and the load statistics. Reductions run in double in a fixed order.
#include "moe/aux_loss.h"

double df_moe_switch_loss(double coeff, int64_t T, int64_t E, int64_t k, const float *scores, const int32_t *counts) {
  (void)k;
  if (T <= 0) return 0.0;
  double loss = 0.0;
  for (int64_t e = 0; e < E; e++) {
    double p = 0.0; // P_e · T
    for (int64_t t = 0; t < T; t++) p += scores[t * E + e];
    loss += ((double)counts[e] / (double)T) * (p / (double)T);
  }
  return coeff * (double)E * loss;
}

double df_moe_switch_loss_from_sums(double coeff, int64_t T, int64_t E, int64_t k, const double *score_sums,
                                    const int32_t *counts) {
  (void)k;
  if (T <= 0) return 0.0;
  double loss = 0.0;
  for (int64_t e = 0; e < E; e++) loss += ((double)counts[e] / (double)T) * (score_sums[e] / (double)T);
  return coeff * (double)E * loss;
}

void df_moe_switch_score_grad_row(double coeff, int64_t T, int64_t E, int64_t k, const int32_t *counts, double upstream,
                                  float *row) {
  (void)k;
  const double c = T > 0 ? upstream * coeff * (double)E / ((double)T * (double)T) : 0.0;
  for (int64_t e = 0; e < E; e++) row[e] = (float)(c * counts[e]);
}

static const df_moe_aux_loss AUX_LOSSES[] = {
    [DF_MOE_AUX_SWITCH] = {.name = "switch",
                           .value = df_moe_switch_loss,
                           .score_grad_row = df_moe_switch_score_grad_row,
                           .value_from_sums = df_moe_switch_loss_from_sums},
};

df_status df_moe_aux_loss_get(df_moe_aux_type type, const df_moe_aux_loss **out, df_error *err) {
  *out = NULL;
  if ((unsigned)type >= sizeof AUX_LOSSES / sizeof *AUX_LOSSES || !AUX_LOSSES[type].name)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_aux_loss_type", "the registered aux losses are: switch",
                   "unknown aux loss type %d", (int)type);
  *out = &AUX_LOSSES[type];
  return DF_OK;
}

df_moe_load_stats df_moe_load_stats_of(const int32_t *counts, int64_t E, int64_t T, int64_t k) {
  df_moe_load_stats st = {0};
  if (E <= 0 || T <= 0 || k <= 0) return st;
  int32_t mx = counts[0], mn = counts[0];
  int64_t unused = 0;
  for (int64_t e = 0; e < E; e++) {
    mx = counts[e] > mx ? counts[e] : mx;
    mn = counts[e] < mn ? counts[e] : mn;
    unused += counts[e] == 0;
  }
  const double uniform = (double)T * (double)k / (double)E;
  st.load_max_ratio = mx / uniform;
  st.load_min_ratio = mn / uniform;
  st.experts_unused_frac = (double)unused / (double)E;
  return st;
}
