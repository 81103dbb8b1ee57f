// CPU Markov-head ops (DSpark): the gated head's gate and the rnn head's cell, forward and backward, in the
// arithmetic the heads' host loops used (σ through a double exp, tanhf), so results are bit for bit theirs.
// Elementwise: a parallel split cannot change any value.
#include <math.h>

#include "kernels/check.h"

enum { MARKOV_PAR_MIN = 1 << 15 };

static inline float sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

static df_status cpu_markov_gate_forward(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate,
                                         df_tensor *u, df_error *err) {
  (void)err;
  const int64_t n = df_numel(e);
  const float *p = pre->data, *ev = e->data;
  float *g = gate->data, *uv = u->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (n > MARKOV_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float s = sigmoid(p[i]);
    g[i] = s;
    uv[i] = s * ev[i];
  }
  return DF_OK;
}

static df_status cpu_markov_gate_backward(df_ctx *ctx, const df_tensor *gate, const df_tensor *e, const df_tensor *du,
                                          df_tensor *de, df_tensor *dpre, df_error *err) {
  (void)err;
  const int64_t n = df_numel(e);
  const float *g = gate->data, *ev = e->data, *d = du->data;
  float *dev = de->data, *dp = dpre->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (n > MARKOV_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    dev[i] += d[i] * g[i];
    dp[i] = d[i] * ev[i] * g[i] * (1.0f - g[i]);
  }
  return DF_OK;
}

static df_status cpu_markov_rnn_forward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                        const df_tensor *s_prev, df_tensor *s, df_tensor *u, df_error *err) {
  (void)err;
  const int64_t nb = y->shape[0], r = y->shape[1] / 3, bs = desc->block_size, k = desc->slot;
  const float *yv = y->data, *sp = s_prev ? s_prev->data : NULL;
  float *sv = s->data, *uv = u->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (nb * r > MARKOV_PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    const float *yr = yv + b * 3 * r;
    float *ur = uv + (b * bs + k) * r;
    for (int64_t j = 0; j < r; j++) {
      float g = sigmoid(yr[j]), tc = tanhf(yr[r + j]), prev = sp ? sp[b * r + j] : 0.0f;
      sv[b * r + j] = g * prev + (1.0f - g) * tc;
      ur[j] = tanhf(yr[2 * r + j]);
    }
  }
  return DF_OK;
}

static df_status cpu_markov_rnn_backward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                         const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                         df_error *err) {
  (void)err;
  const int64_t nb = y->shape[0], r = y->shape[1] / 3, bs = desc->block_size, k = desc->slot;
  const float *yv = y->data, *sp = s_prev ? s_prev->data : NULL, *duv = du ? du->data : NULL;
  float *dsv = ds->data, *dyv = dy->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (nb * r > MARKOV_PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    const float *yr = yv + b * 3 * r, *dur = duv ? duv + (b * bs + k) * r : NULL;
    float *dyr = dyv + b * 3 * r, *dsr = dsv + b * r;
    for (int64_t j = 0; j < r; j++) {
      float g = sigmoid(yr[j]), tc = tanhf(yr[r + j]), to = tanhf(yr[2 * r + j]);
      float prev = sp ? sp[b * r + j] : 0.0f, dsk = dsr[j];
      dyr[j] = dsk * (prev - tc) * g * (1.0f - g);
      dyr[r + j] = dsk * (1.0f - g) * (1.0f - tc * tc);
      dyr[2 * r + j] = dur ? dur[j] * (1.0f - to * to) : 0.0f;
      dsr[j] = dsk * g;
    }
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_markov(df_backend *be) {
  be->markov_gate_forward = cpu_markov_gate_forward;
  be->markov_gate_backward = cpu_markov_gate_backward;
  be->markov_rnn_forward = cpu_markov_rnn_forward;
  be->markov_rnn_backward = cpu_markov_rnn_backward;
}
