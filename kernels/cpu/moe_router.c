// CPU MoE router: score functions (forward and backward), top-k selection with the balance shift and the group
// limit, and the combine weights' backward. fp32 storage, double accumulation; every row is independent and every
// reduction runs in a fixed order, so the routing is bitwise the same for any thread count.
#include <math.h>
#include <string.h>

#include "kernels/check.h"

// Below this many elements a loop stays on the calling thread.
#define ROUTER_PAR_MIN 16384

// ---- scores -------------------------------------------------------------------------------------------------------

static void softmax_row(const float *l, float *s, int64_t E) {
  double mx = -INFINITY, sum = 0.0;
  for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
  for (int64_t e = 0; e < E; e++) sum += exp((double)l[e] - mx);
  for (int64_t e = 0; e < E; e++) s[e] = (float)(exp((double)l[e] - mx) / sum);
}

static inline double softplus(double z) { return (z > 0 ? z : 0.0) + log1p(exp(-fabs(z))); }
static inline double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

static df_status cpu_scores_forward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores,
                                    df_error *err) {
  (void)err;
  const int64_t T = logits->shape[0], E = logits->shape[1];
  const float *lg = logits->data;
  float *sc = scores->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *l = lg + t * E;
    float *s = sc + t * E;
    switch (f) {
    case DF_MOE_SCORE_SOFTMAX: softmax_row(l, s, E); break;
    case DF_MOE_SCORE_SIGMOID:
      for (int64_t e = 0; e < E; e++) s[e] = (float)sigmoid(l[e]);
      break;
    case DF_MOE_SCORE_SQRTSOFTPLUS:
      for (int64_t e = 0; e < E; e++) s[e] = (float)sqrt(softplus(l[e]));
      break;
    }
  }
  return DF_OK;
}

static df_status cpu_scores_backward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, const df_tensor *scores,
                                     const df_tensor *dscores, df_tensor *dlogits, df_error *err) {
  (void)err;
  const int64_t T = logits->shape[0], E = logits->shape[1];
  const float *lg = logits->data, *sc = scores->data, *dsc = dscores->data;
  float *dlg = dlogits->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *l = lg + t * E, *s = sc + t * E, *ds = dsc + t * E;
    float *dl = dlg + t * E;
    switch (f) {
    case DF_MOE_SCORE_SOFTMAX: {
      double dot = 0.0; // ds·s, then dℓ = s ⊙ (ds − ds·s)
      for (int64_t e = 0; e < E; e++) dot += (double)ds[e] * s[e];
      for (int64_t e = 0; e < E; e++) dl[e] = (float)((double)s[e] * ((double)ds[e] - dot));
      break;
    }
    case DF_MOE_SCORE_SIGMOID:
      for (int64_t e = 0; e < E; e++) {
        const double p = sigmoid(l[e]); // from ℓ, not the rounded s
        dl[e] = (float)(ds[e] * p * (1.0 - p));
      }
      break;
    case DF_MOE_SCORE_SQRTSOFTPLUS:
      // d sqrt(sp(ℓ)) = sigmoid(ℓ) / (2·sqrt(sp(ℓ))); sp underflows to 0 only where the slope is 0 too.
      for (int64_t e = 0; e < E; e++) {
        const double r = sqrt(softplus(l[e]));
        dl[e] = r > 0 ? (float)(ds[e] * sigmoid(l[e]) / (2.0 * r)) : 0.0f;
      }
      break;
    }
  }
  return DF_OK;
}

// ---- selection ----------------------------------------------------------------------------------------------------

// Keeps the topk_group groups with the largest sum of their top-2 (top-1 for groups of one) selection scores; every
// expert of another group gets −inf. Ties between groups go to the lower group id.
static void mask_groups(const df_moe_route_desc *s, float *sel, float *gscore, float *gkeep) {
  const int64_t G = s->n_group, gsz = s->E / G;
  for (int64_t g = 0; g < G; g++) {
    const float *v = sel + g * gsz;
    float top1 = v[0], top2 = -INFINITY;
    for (int64_t i = 1; i < gsz; i++) {
      if (v[i] > top1) {
        top2 = top1;
        top1 = v[i];
      } else if (v[i] > top2) {
        top2 = v[i];
      }
    }
    gscore[g] = gsz >= 2 ? top1 + top2 : top1;
    gkeep[g] = 0.0f;
  }
  for (int64_t j = 0; j < s->topk_group; j++) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; g++)
      if (gkeep[g] == 0.0f && (best < 0 || gscore[g] > gscore[best])) best = g;
    gkeep[best] = 1.0f;
  }
  for (int64_t g = 0; g < G; g++)
    if (gkeep[g] == 0.0f)
      for (int64_t i = 0; i < gsz; i++) sel[g * gsz + i] = -INFINITY;
}

// The k largest of sel (E), best first; equal values keep expert order (lower id first). One pass with an
// insertion-sorted list: a NaN never displaces anything, and the k ids are distinct by construction.
static void topk_row(const float *sel, int64_t E, int64_t k, int32_t *idx, float *val) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; e++) {
    const float v = sel[e];
    if (n == k && !(v > val[k - 1])) continue;
    int64_t pos = n < k ? n : k - 1; // slot freed at the end of the list
    while (pos > 0 && v > val[pos - 1]) {
      val[pos] = val[pos - 1];
      idx[pos] = idx[pos - 1];
      pos--;
    }
    val[pos] = v;
    idx[pos] = (int32_t)e;
    if (n < k) n++;
  }
}

// Per row of the workspace: the selection scores (E), group scores and kept flags (n_group each), the top-k values.
static int64_t sel_stride(const df_moe_route_desc *s) { return s->E + 2 * s->n_group + s->k; }

static df_status cpu_select(df_ctx *ctx, const df_moe_route_desc *s, const df_tensor *scores,
                            const df_tensor *sel_shift, df_tensor *indices, df_tensor *weights, df_tensor *counts,
                            df_error *err) {
  const int64_t T = scores->shape[0], E = s->E, k = s->k, stride = sel_stride(s);
  const bool grouped = s->topk_group < s->n_group;
  float *sel;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(T * stride), (void **)&sel, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const float *scr = scores->data, *shift = sel_shift ? sel_shift->data : NULL;
  int32_t *ind = indices->data, *cnt = counts->data;
  float *wts = weights->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *sc = scr + t * E;
    float *row = sel + t * stride, *gscore = row + E, *gkeep = gscore + s->n_group, *val = gkeep + s->n_group;
    for (int64_t e = 0; e < E; e++) row[e] = shift ? sc[e] + shift[e] : sc[e];
    if (grouped) mask_groups(s, row, gscore, gkeep);
    int32_t *idx = ind + t * k;
    topk_row(row, E, k, idx, val);
    // Combine weights from the unbiased scores.
    float *w = wts + t * k;
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) sum += sc[idx[j]];
    const double scale = s->norm_topk_prob ? s->routed_scaling_factor / (sum + 1e-20) : s->routed_scaling_factor;
    for (int64_t j = 0; j < k; j++) w[j] = (float)(sc[idx[j]] * scale);
  }
  memset(cnt, 0, sizeof(int32_t) * (size_t)E);
  for (int64_t i = 0; i < T * k; i++) cnt[ind[i]]++;
  return DF_OK;
}

static df_status cpu_select_backward(df_ctx *ctx, const df_moe_route_desc *s, const df_tensor *scores,
                                     const df_tensor *indices, const df_tensor *weights, const df_tensor *dweights,
                                     const df_tensor *aux_row, df_tensor *dscores, df_error *err) {
  (void)err;
  const int64_t T = scores->shape[0], E = s->E, k = s->k;
  const double f = s->routed_scaling_factor;
  const float *scr = scores->data, *wts = weights->data, *dwt = dweights ? dweights->data : NULL;
  const float *aux = aux_row ? aux_row->data : NULL;
  const int32_t *ind = indices->data;
  float *dsc = dscores->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *ds = dsc + t * E;
    for (int64_t e = 0; e < E; e++) ds[e] = aux ? aux[e] : 0.0f;
    if (!dwt) continue;
    const int32_t *idx = ind + t * k;
    const float *sc = scr + t * E, *w = wts + t * k, *dw = dwt + t * k;
    if (s->norm_topk_prob) {
      // w_j = f·s_j / D, D = Σ s + 1e−20:  ∂/∂s_j = (f·dw_j − Σ_i dw_i·w_i) / D.
      double sum = 0.0, dot = 0.0;
      for (int64_t j = 0; j < k; j++) {
        sum += sc[idx[j]];
        dot += (double)dw[j] * w[j];
      }
      const double D = sum + 1e-20;
      for (int64_t j = 0; j < k; j++) ds[idx[j]] += (float)((f * dw[j] - dot) / D);
    } else {
      for (int64_t j = 0; j < k; j++) ds[idx[j]] += (float)(f * dw[j]);
    }
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_moe_router(df_backend *be) {
  be->moe_scores_forward = cpu_scores_forward;
  be->moe_scores_backward = cpu_scores_backward;
  be->moe_select = cpu_select;
  be->measures[DF_OP_MOE_SELECT] = true;
  be->moe_select_backward = cpu_select_backward;
}
