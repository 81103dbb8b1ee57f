// CPU GRU of Domino's prefix_gru (kernels/ops_domino.h), the oracle: per step one GEMM over the nb sequences
// (df_cpu_sgemm: bits independent of the thread count) and an elementwise pass in fp32 with σ through a double exp,
// as the Markov cell. The backward walks the steps in reverse, carrying dL/ds_{t−1} = dL/ds_t ⊙ z + dgh·W_hh, and
// adds dW_hh step by step in a fixed order. Elementwise passes split over sequences: no value depends on threads.
#include <math.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/gemm.h"

enum { GRU_PAR_MIN = 1 << 14 };

static inline float gru_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

static df_status cpu_gru_forward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh,
                                 df_tensor *s, df_tensor *gates, df_error *err) {
  const int64_t G = w_hh->shape[1], S = desc->stride, T = desc->steps, nb = df_numel(s) / (S * G);
  const int th = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float *gh;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(nb * 3 * G + 1), (void **)&gh, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const float *giv = gi->data, *w = w_hh->data;
  float *sv = s->data, *gv = gates ? gates->data : NULL;
  for (int64_t t = 0; t < T; t++) {
    // gh[nb, 3G] = s_{t−1} · W_hhᵀ, s_{t−1} the rows b·S + t − 1 (leading dimension S·G)
    if (t > 0) df_cpu_sgemm(th, false, true, nb, 3 * G, G, 1.0f, sv + (t - 1) * G, S * G, w, G, 0.0f, gh, 3 * G);
#pragma omp parallel for num_threads(th) if (nb * G > GRU_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
      const float *x = giv + (b * S + t) * 3 * G, *h = gh + b * 3 * G, *prev = t ? sv + (b * S + t - 1) * G : NULL;
      float *out = sv + (b * S + t) * G, *g = gv ? gv + (b * S + t) * 4 * G : NULL;
      for (int64_t j = 0; j < G; j++) {
        const float hr = t ? h[j] : 0.0f, hz = t ? h[G + j] : 0.0f, hn = t ? h[2 * G + j] : 0.0f;
        const float r = gru_sigmoid(x[j] + hr), z = gru_sigmoid(x[G + j] + hz), n = tanhf(x[2 * G + j] + r * hn);
        out[j] = (1.0f - z) * n + z * (prev ? prev[j] : 0.0f);
        if (g) g[j] = r, g[G + j] = z, g[2 * G + j] = n, g[3 * G + j] = hn;
      }
    }
  }
  for (int64_t b = 0; b < nb; b++) // rows past the last step: 0
    for (int64_t t = T; t < S; t++) {
      memset(sv + (b * S + t) * G, 0, sizeof(float) * (size_t)G);
      if (gv) memset(gv + (b * S + t) * 4 * G, 0, sizeof(float) * 4 * (size_t)G);
    }
  return DF_OK;
}

// dL/d(pre-activations) of step t for every sequence: dgi (rows of step t) and dgh (the hidden side, whose n block
// carries r), and carry ← dh ⊙ z (the direct path to s_{t−1}).
static void gru_step_back(int th, int64_t nb, int64_t G, int64_t S, int64_t t, const float *sv, const float *gv,
                          const float *dsv, float *carry, float *dgi, float *dgh) {
#pragma omp parallel for num_threads(th) if (nb * G > GRU_PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    const float *g = gv + (b * S + t) * 4 * G, *prev = t ? sv + (b * S + t - 1) * G : NULL;
    const float *d = dsv + (b * S + t) * G;
    float *c = carry + b * G, *dx = dgi + (b * S + t) * 3 * G, *dh_ = dgh + b * 3 * G;
    for (int64_t j = 0; j < G; j++) {
      const float r = g[j], z = g[G + j], n = g[2 * G + j], hn = g[3 * G + j], p = prev ? prev[j] : 0.0f;
      const float dh = d[j] + c[j];
      const float dpn = dh * (1.0f - z) * (1.0f - n * n);
      const float dpz = dh * (p - n) * z * (1.0f - z);
      const float dpr = dpn * hn * r * (1.0f - r);
      dx[j] = dpr, dx[G + j] = dpz, dx[2 * G + j] = dpn;
      dh_[j] = dpr, dh_[G + j] = dpz, dh_[2 * G + j] = dpn * r;
      c[j] = dh * z;
    }
  }
}

static df_status cpu_gru_backward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                                  const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh,
                                  df_error *err) {
  const int64_t G = w_hh->shape[1], S = desc->stride, T = desc->steps, nb = df_numel(s) / (S * G);
  const int th = ctx->num_threads > 0 ? ctx->num_threads : 1;
  float *carry;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(nb * 4 * G + 1), (void **)&carry, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  float *dgh = carry + nb * G;
  memset(carry, 0, sizeof(float) * (size_t)(nb * G));
  const float *sv = s->data, *gv = gates->data, *dsv = ds->data, *w = w_hh->data;
  float *dx = dgi->data, *dw = dw_hh->data;
  for (int64_t t = T - 1; t >= 0; t--) {
    gru_step_back(th, nb, G, S, t, sv, gv, dsv, carry, dx, dgh);
    if (t == 0) break; // s_{−1} = 0: no W_hh term
    // carry += dgh · W_hh [nb, G];  dW_hh += dghᵀ · s_{t−1} [3G, G]
    df_cpu_sgemm(th, false, false, nb, G, 3 * G, 1.0f, dgh, 3 * G, w, G, 1.0f, carry, G);
    df_cpu_sgemm(th, true, false, 3 * G, G, nb, 1.0f, dgh, 3 * G, sv + (t - 1) * G, S * G, 1.0f, dw, G);
  }
  for (int64_t b = 0; b < nb; b++)
    for (int64_t t = T; t < S; t++) memset(dx + (b * S + t) * 3 * G, 0, sizeof(float) * 3 * (size_t)G);
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_gru(df_backend *be) {
  be->gru_forward = cpu_gru_forward;
  be->gru_backward = cpu_gru_backward;
  be->measures[DF_OP_GRU_FORWARD] = be->measures[DF_OP_GRU_BACKWARD] = true;
}
