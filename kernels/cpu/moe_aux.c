// CPU MoE statistics and state: the router-input centering (forward, backward), the aux loss with the routing
// statistics, the aux loss's score gradient, and the deferred updates (EMA centering mean, noaux_tc bias).
// Reductions run in double in a fixed order.
#include <math.h>

#include "kernels/check.h"

#define CENTER_PAR_MIN 16384
// Columns per centering work item (one 64-byte line of fp32).
#define CENTER_COLS 16

// u = x − (per-sample mean) or x − mu.
static df_status cpu_center_forward(df_ctx *ctx, int64_t rps, const df_tensor *xt, const df_tensor *mut, df_tensor *ut,
                                    df_tensor *bmt, df_error *err) {
  (void)err;
  const int64_t T = xt->shape[0], H = xt->shape[1];
  const float *x = xt->data;
  float *u = ut->data, *batch_mean = bmt ? bmt->data : NULL;
  if (mut) {
    const float *mu = mut->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * H > CENTER_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < H; c++) u[t * H + c] = x[t * H + c] - mu[c];
    return DF_OK;
  }
  const int64_t n = rps, B = T / n;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * H > CENTER_PAR_MIN) schedule(static)
  for (int64_t c0 = 0; c0 < H; c0 += CENTER_COLS) {
    const int64_t w = H - c0 < CENTER_COLS ? H - c0 : CENTER_COLS;
    double total[CENTER_COLS] = {0};
    for (int64_t b = 0; b < B; b++) {
      const float *xb = x + b * n * H + c0; // (n, H) block, columns c0..c0+w
      float *ub = u + b * n * H + c0;
      double acc[CENTER_COLS] = {0};
      float mean[CENTER_COLS];
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < w; c++) acc[c] += xb[r * H + c];
      for (int64_t c = 0; c < w; c++) {
        mean[c] = (float)(acc[c] / (double)n);
        total[c] += acc[c] / (double)n;
      }
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < w; c++) ub[r * H + c] = xb[r * H + c] - mean[c];
    }
    if (batch_mean)
      for (int64_t c = 0; c < w; c++) batch_mean[c0 + c] = (float)(total[c] / (double)B);
  }
  return DF_OK;
}

static df_status cpu_center_backward(df_ctx *ctx, int64_t rps, const df_tensor *dut, df_tensor *dxt, bool accumulate,
                                     df_error *err) {
  (void)err;
  const int64_t T = dut->shape[0], H = dut->shape[1], n = rps, B = T / n;
  const float *du = dut->data;
  float *dx = dxt->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * H > CENTER_PAR_MIN) schedule(static)
  for (int64_t c0 = 0; c0 < H; c0 += CENTER_COLS) {
    const int64_t w = H - c0 < CENTER_COLS ? H - c0 : CENTER_COLS;
    for (int64_t b = 0; b < B; b++) {
      const float *gb = du + b * n * H + c0;
      float *db = dx + b * n * H + c0;
      double acc[CENTER_COLS] = {0};
      float mean[CENTER_COLS];
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < w; c++) acc[c] += gb[r * H + c];
      for (int64_t c = 0; c < w; c++) mean[c] = (float)(acc[c] / (double)n);
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < w; c++) {
          const float g = gb[r * H + c] - mean[c];
          db[r * H + c] = accumulate ? db[r * H + c] + g : g;
        }
    }
  }
  return DF_OK;
}

// switch (transformers' load_balancing_loss_func for one layer, no mask):
//   L = coeff · E · Σ_e (counts_e / T) · P_e,  P_e = (1/T) Σ_t s_te.
static double switch_loss(double coeff, int64_t T, int64_t E, const float *scores, const int32_t *counts) {
  if (T <= 0) return 0.0;
  double loss = 0.0;
  for (int64_t e = 0; e < E; e++) {
    double p = 0.0; // P_e · T
    for (int64_t t = 0; t < T; t++) p += scores[t * E + e];
    loss += ((double)counts[e] / (double)T) * (p / (double)T);
  }
  return coeff * (double)E * loss;
}

static df_status cpu_route_stats(df_ctx *ctx, const df_moe_stats_desc *d, const df_tensor *scores,
                                 const df_tensor *counts, const df_tensor *bias, df_tensor *stats, bool accumulate,
                                 df_tensor *count_stash, df_error *err) {
  (void)ctx, (void)err;
  const int64_t T = scores->shape[0], E = scores->shape[1], k = d->k;
  const int32_t *c = counts->data;
  double v[DF_MOE_STAT_LOAD] = {0};
  if (d->coeff > 0) {
    switch (d->aux) {
    case DF_MOE_AUX_SWITCH: v[DF_MOE_STAT_AUX] = switch_loss(d->coeff, T, E, scores->data, c); break;
    }
  }
  v[DF_MOE_STAT_AUX_NUM] = d->den > 0 ? v[DF_MOE_STAT_AUX] * d->den : 0.0;
  if (T > 0) {
    int32_t mx = c[0], mn = c[0];
    int64_t unused = 0;
    for (int64_t e = 0; e < E; e++) {
      mx = c[e] > mx ? c[e] : mx;
      mn = c[e] < mn ? c[e] : mn;
      unused += c[e] == 0;
    }
    const double uniform = (double)T * (double)k / (double)E;
    v[DF_MOE_STAT_LOAD_MAX] = mx / uniform;
    v[DF_MOE_STAT_LOAD_MIN] = mn / uniform;
    v[DF_MOE_STAT_UNUSED] = (double)unused / (double)E;
  }
  if (bias) {
    const float *b = bias->data;
    float m = 0.0f;
    for (int64_t e = 0; e < E; e++) m = fabsf(b[e]) > m ? fabsf(b[e]) : m;
    v[DF_MOE_STAT_BIAS_ABS_MAX] = m;
  }
  double *out = stats->data;
  for (int i = 0; i < DF_MOE_STAT_LOAD; i++) out[i] = accumulate ? out[i] + v[i] : v[i];
  for (int64_t e = 0; e < E; e++) {
    const double share = T * k > 0 ? (double)c[e] / (double)(T * k) : 0.0;
    out[DF_MOE_STAT_LOAD + e] = accumulate ? out[DF_MOE_STAT_LOAD + e] + share : share;
  }
  if (count_stash) {
    float *s = count_stash->data;
    for (int64_t e = 0; e < E; e++) s[e] = (float)c[e];
  }
  return DF_OK;
}

// switch: ∂L/∂s_te = coeff · E · counts_e / T², the same for every row.
static df_status cpu_aux_backward(df_ctx *ctx, const df_moe_stats_desc *d, int64_t T, const df_tensor *counts,
                                  double upstream, df_tensor *row, df_error *err) {
  (void)ctx, (void)err;
  const int64_t E = df_numel(counts);
  const int32_t *c = counts->data;
  float *r = row->data;
  double scale = 0.0;
  switch (d->aux) {
  case DF_MOE_AUX_SWITCH: scale = T > 0 ? upstream * d->coeff * (double)E / ((double)T * (double)T) : 0.0; break;
  }
  for (int64_t e = 0; e < E; e++) r[e] = (float)(scale * c[e]);
  return DF_OK;
}

// μ ← m on the first update, then μ ← ρ·μ + (1 − ρ)·m.
static df_status cpu_center_ema(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps,
                                df_error *err) {
  (void)ctx, (void)err;
  const int64_t H = df_numel(stash);
  const float *s = stash->data;
  float *m = mu->data, *n = steps->data;
  const bool first = n[0] == 0.0f;
  for (int64_t c = 0; c < H; c++) m[c] = first ? s[c] : (float)(rho * (double)m[c] + (1.0 - rho) * (double)s[c]);
  n[0] += 1.0f;
  return DF_OK;
}

static df_status cpu_noaux_update(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias, df_error *err) {
  (void)ctx, (void)err;
  const int64_t E = df_numel(load);
  const float *l = load->data;
  float *b = bias->data;
  double mean = 0.0;
  for (int64_t e = 0; e < E; e++) mean += l[e];
  mean /= (double)E;
  for (int64_t e = 0; e < E; e++) {
    const double gap = mean - l[e];
    const float sgn = gap > 0 ? 1.0f : (gap < 0 ? -1.0f : 0.0f);
    b[e] += rate * sgn;
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_moe_aux(df_backend *be) {
  be->moe_center_forward = cpu_center_forward;
  be->moe_center_backward = cpu_center_backward;
  be->moe_route_stats = cpu_route_stats;
  be->moe_aux_backward = cpu_aux_backward;
  be->moe_center_ema = cpu_center_ema;
  be->moe_noaux_update = cpu_noaux_update;
}
