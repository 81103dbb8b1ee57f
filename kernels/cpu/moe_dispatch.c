// CPU MoE dispatch: the stable counting sort of the routed slots by expert, and the per-row scalings of the routed
// experts (combine weights) and the shared expert (its sigmoid gate), forward and backward. fp32.
#include <math.h>

#include "kernels/check.h"

#define DISPATCH_PAR_MIN 32768

static df_status cpu_plan(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts, df_tensor *offsets,
                          df_tensor *slot, df_tensor *token, df_error *err) {
  (void)ctx, (void)err;
  const int64_t Tk = df_numel(indices), E = df_numel(counts);
  const int32_t *ind = indices->data, *cnt = counts->data;
  int32_t *off = offsets->data, *sl = slot->data, *tok = token->data;
  off[0] = 0;
  for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + cnt[e];
  // Stable: slots fill their expert's segment in increasing slot order, with off[e] as the cursor; afterwards
  // off[e] is the start of e + 1, so one shift restores the starts.
  for (int64_t i = 0; i < Tk; i++) {
    const int32_t pos = off[ind[i]]++;
    sl[pos] = (int32_t)i;
    tok[pos] = (int32_t)(i / k);
  }
  for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];
  off[0] = 0;
  return DF_OK;
}

static df_status cpu_scale_rows(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx, df_error *err) {
  (void)err;
  const int64_t N = h->shape[0], I = h->shape[1];
  float *hp = h->data;
  const float *wp = w->data;
  const int32_t *ix = idx ? idx->data : NULL;
#pragma omp parallel for num_threads(ctx->num_threads) if (N * I > DISPATCH_PAR_MIN) schedule(static)
  for (int64_t p = 0; p < N; p++) {
    const float c = wp[ix ? ix[p] : p];
    for (int64_t i = 0; i < I; i++) hp[p * I + i] *= c;
  }
  return DF_OK;
}

static df_status cpu_gate_backward(df_ctx *ctx, bool sig, df_tensor *dh, const df_tensor *act, const df_tensor *w,
                                   const df_tensor *idx, df_tensor *out, df_error *err) {
  (void)err;
  const int64_t N = dh->shape[0], I = dh->shape[1];
  float *d = dh->data, *o = out->data;
  const float *a = act->data, *wp = w->data;
  const int32_t *ix = idx ? idx->data : NULL;
#pragma omp parallel for num_threads(ctx->num_threads) if (N * I > DISPATCH_PAR_MIN) schedule(static)
  for (int64_t p = 0; p < N; p++) {
    const float *ar = a + p * I;
    float *dr = d + p * I;
    double dot = 0.0;
    for (int64_t i = 0; i < I; i++) dot += (double)dr[i] * ar[i];
    const int64_t q = ix ? ix[p] : p;
    const double c = wp[q];
    o[q] = sig ? (float)(c * (1.0 - c) * dot) : (float)dot;
    const float cf = wp[q];
    for (int64_t i = 0; i < I; i++) dr[i] *= cf;
  }
  return DF_OK;
}

static df_status cpu_sigmoid_scale(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err) {
  (void)err;
  const int64_t T = a->shape[0], S = a->shape[1];
  float *zp = z->data, *ap = a->data;
  for (int64_t t = 0; t < T; t++) zp[t] = (float)(1.0 / (1.0 + exp(-(double)zp[t])));
#pragma omp parallel for num_threads(ctx->num_threads) if (T * S > DISPATCH_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < S; i++) ap[t * S + i] *= zp[t];
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_moe_dispatch(df_backend *be) {
  be->moe_plan = cpu_plan;
  be->moe_scale_rows = cpu_scale_rows;
  be->moe_gate_backward = cpu_gate_backward;
  be->moe_sigmoid_scale = cpu_sigmoid_scale;
}
