// CPU Domino elementwise ops and block metrics (kernels/ops_domino.h): the row-masked SiLU between embed_proj's two
// linears, and the per-block metric sums in row order with double accumulators from 0 per call (SpecForge's
// _domino_objective_chunk_terms and compute_accept_len, docs/domino-step.md §7).
#include <math.h>
#include <string.h>

#include "kernels/check.h"

enum { SILU_PAR_MIN = 1 << 15 };

static inline float silu_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

static df_status cpu_masked_silu_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y,
                                         df_error *err) {
  (void)err;
  const int64_t R = df_rows(x), E = df_last_dim(x);
  const float *xv = x->data;
  const uint8_t *m = mask->data;
  float *yv = y->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (R * E > SILU_PAR_MIN)
  for (int64_t r = 0; r < R; r++)
    for (int64_t j = 0; j < E; j++) {
      const float v = xv[r * E + j];
      yv[r * E + j] = m[r] ? v * silu_sigmoid(v) : 0.0f;
    }
  return DF_OK;
}

static df_status cpu_masked_silu_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, const df_tensor *dy,
                                          df_tensor *dx, df_error *err) {
  (void)err;
  const int64_t R = df_rows(x), E = df_last_dim(x);
  const float *xv = x->data, *d = dy->data;
  const uint8_t *m = mask->data;
  float *o = dx->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (R * E > SILU_PAR_MIN)
  for (int64_t r = 0; r < R; r++)
    for (int64_t j = 0; j < E; j++) {
      const float v = xv[r * E + j], sg = silu_sigmoid(v);
      o[r * E + j] = m[r] ? d[r * E + j] * sg * (1.0f + v * (1.0f - sg)) : 0.0f;
    }
  return DF_OK;
}

// compute_accept_len: the valid slots of the leading run in which every valid slot is correct.
static double accept_run(const uint8_t *valid, const uint8_t *correct, int64_t bs) {
  double a = 0.0;
  for (int64_t k = 0; k < bs; k++) {
    if (!valid[k]) continue; // neither breaks nor extends the run
    if (!correct[k]) break;
    a += 1.0;
  }
  return a;
}

static df_status cpu_domino_block_metrics(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in, df_tensor *stats,
                                          df_error *err) {
  (void)ctx, (void)err;
  const int64_t R = df_numel(in->ce_final), nb = R / bs;
  const float *cf = in->ce_final->data, *cb = in->ce_base->data, *w = in->weights->data;
  const uint8_t *okf = in->correct_final->data, *okb = in->correct_base->data, *v = in->valid->data;
  const uint8_t *kp = in->keep->data;
  double *st = stats->data;
  double s[DF_DOMSTAT_POS] = {0};
  for (int64_t r = 0; r < R; r++) {
    const double wr = w[r], f = wr * cf[r], b = wr * cb[r];
    s[DF_DOMSTAT_LOSS] += in->final_scale * f + in->base_scale * b;
    s[DF_DOMSTAT_FINAL] += f * in->inv_den, s[DF_DOMSTAT_BASE] += b * in->inv_den;
    s[DF_DOMSTAT_FINAL_NUM] += f, s[DF_DOMSTAT_BASE_NUM] += b, s[DF_DOMSTAT_WEIGHT] += wr;
    if (!v[r]) continue;
    s[DF_DOMSTAT_ACC] += okf[r], s[DF_DOMSTAT_BASE_ACC] += okb[r], s[DF_DOMSTAT_ACC_DEN] += 1.0;
  }
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *vb = v + i * bs;
    s[DF_DOMSTAT_BLOCKS] += kp[i];
    bool any = false;
    for (int64_t k = 0; k < bs; k++) any = any || vb[k];
    if (!any) continue;
    s[DF_DOMSTAT_ACCEPT] += 1.0 + accept_run(vb, okf + i * bs, bs);
    s[DF_DOMSTAT_BASE_ACCEPT] += 1.0 + accept_run(vb, okb + i * bs, bs);
    s[DF_DOMSTAT_ACCEPT_DEN] += 1.0;
  }
  for (int i = 0; i < DF_DOMSTAT_POS; i++) st[i] += s[i];
  for (int64_t k = 0; k < bs; k++) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < nb; i++) {
      const int64_t r = i * bs + k;
      if (v[r]) num += okf[r], den += 1.0;
    }
    st[DF_DOMSTAT_POS + k] += num, st[DF_DOMSTAT_POS + bs + k] += den;
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_domino_metrics(df_backend *be) {
  be->masked_silu_forward = cpu_masked_silu_forward;
  be->masked_silu_backward = cpu_masked_silu_backward;
  be->domino_block_metrics = cpu_domino_block_metrics;
}
