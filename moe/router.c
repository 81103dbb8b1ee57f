// The MoE router: plain fp32 loops over rows for everything but the logit GEMM (which goes through the op
// interface). Every per-row step is independent of the others, and every reduction runs in a fixed order,
// so the routing is bitwise the same for any thread count.
#include "moe/router.h"

#include <math.h>
#include <string.h>

// Below this many elements a loop stays on the calling thread.
#define ROUTER_PAR_MIN 16384
// Columns per centering work item (one 64-byte line of fp32).
#define CENTER_COLS 16

static int nthreads(df_ctx *ctx) { return df_ctx_num_threads(ctx); }

df_moe_router_spec df_moe_router_spec_from(const df_moe_config *m, int64_t H) {
  return (df_moe_router_spec){.H = H,
                              .E = m->n_routed_experts,
                              .k = m->num_experts_per_tok,
                              .score_func = m->scoring_func,
                              .norm_topk_prob = m->norm_topk_prob,
                              .routed_scaling_factor = (float)m->routed_scaling_factor,
                              .n_group = m->n_group,
                              .topk_group = m->topk_group};
}

df_status df_moe_router_spec_check(const df_moe_router_spec *s, df_error *err) {
  if (s->H <= 0 || s->E <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "n_routed_experts", "the router needs hidden_size > 0 and experts > 0",
                   "router of H = %lld, E = %lld", (long long)s->H, (long long)s->E);
  if (s->k < 1 || s->k > s->E)
    return DF_FAIL(err, DF_ERR_INVALID, "num_experts_per_tok", "choose 1 <= num_experts_per_tok <= n_routed_experts",
                   "k = %lld with E = %lld experts", (long long)s->k, (long long)s->E);
  if (s->n_group < 1 || s->E % s->n_group || s->topk_group < 1 || s->topk_group > s->n_group)
    return DF_FAIL(err, DF_ERR_INVALID, "n_group", "n_group must divide the expert count; 1 <= topk_group <= n_group",
                   "n_group = %lld, topk_group = %lld, E = %lld", (long long)s->n_group, (long long)s->topk_group,
                   (long long)s->E);
  if (s->topk_group * (s->E / s->n_group) < s->k)
    return DF_FAIL(err, DF_ERR_INVALID, "topk_group", "keep more groups or route fewer experts per token",
                   "the %lld kept groups of %lld experts cannot supply k = %lld distinct experts",
                   (long long)s->topk_group, (long long)(s->E / s->n_group), (long long)s->k);
  return DF_OK;
}

// ---- centering -----------------------------------------------------------------------------------------

static df_status check_rows_per_sample(int64_t T, int64_t n, df_error *err) {
  if (n <= 0 || T % n)
    return DF_FAIL(err, DF_ERR_INVALID, "rows_per_sample",
                   "sample centering needs the FFN rows grouped per sample (N·bs rows each)",
                   "%lld rows do not split into samples of %lld rows", (long long)T, (long long)n);
  return DF_OK;
}

df_status df_moe_center_sample_forward(df_ctx *ctx, const float *x, int64_t T, int64_t H, int64_t rows_per_sample,
                                       float *u, float *batch_mean, df_error *err) {
  DF_TRY(check_rows_per_sample(T, rows_per_sample, err));
  const int64_t n = rows_per_sample, B = T / n;
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * H > ROUTER_PAR_MIN) schedule(static)
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

void df_moe_center_sample_backward(df_ctx *ctx, const float *du, int64_t T, int64_t H, int64_t rows_per_sample,
                                   float *dx, bool accumulate) {
  const int64_t n = rows_per_sample, B = T / n;
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * H > ROUTER_PAR_MIN) schedule(static)
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
}

void df_moe_center_fixed(df_ctx *ctx, const float *x, const float *mu, int64_t T, int64_t H, float *u) {
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * H > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < H; c++) u[t * H + c] = x[t * H + c] - mu[c];
}

// ---- scores --------------------------------------------------------------------------------------------

static void softmax_row(const float *l, float *s, int64_t E) {
  double mx = -INFINITY, sum = 0.0;
  for (int64_t e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
  for (int64_t e = 0; e < E; e++) sum += exp((double)l[e] - mx);
  for (int64_t e = 0; e < E; e++) s[e] = (float)(exp((double)l[e] - mx) / sum);
}

static inline double softplus(double z) { return (z > 0 ? z : 0.0) + log1p(exp(-fabs(z))); }
static inline double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

void df_moe_scores_forward(df_ctx *ctx, df_moe_score_func f, int64_t T, int64_t E, const float *logits, float *scores) {
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *l = logits + t * E;
    float *s = scores + t * E;
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
}

void df_moe_scores_backward(df_ctx *ctx, df_moe_score_func f, int64_t T, int64_t E, const float *logits,
                            const float *scores, const float *dscores, float *dlogits) {
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *l = logits + t * E, *s = scores + t * E, *ds = dscores + t * E;
    float *dl = dlogits + t * E;
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
}

// ---- selection -----------------------------------------------------------------------------------------

// Keeps the topk_group groups with the largest sum of their top-2 (top-1 for groups of one) selection
// scores; every expert of another group gets −inf. Ties between groups go to the lower group id.
static void mask_groups(const df_moe_router_spec *s, float *sel, float *gscore, float *gkeep) {
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

// Per row: the selection scores (E), group scores and kept flags (n_group each), the top-k values (k).
static int64_t sel_stride(const df_moe_router_spec *s) { return s->E + 2 * s->n_group + s->k; }

int64_t df_moe_router_sel_elems(const df_moe_router_spec *s, int64_t T) { return T * sel_stride(s); }

void df_moe_router_select(df_ctx *ctx, const df_moe_router_spec *s, const float *sel_shift, float *sel,
                          df_moe_routing *r) {
  const int64_t T = r->T, E = s->E, k = s->k, stride = sel_stride(s);
  const bool grouped = s->topk_group < s->n_group;
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    const float *sc = r->scores + t * E;
    float *row = sel + t * stride, *gscore = row + E, *gkeep = gscore + s->n_group, *val = gkeep + s->n_group;
    for (int64_t e = 0; e < E; e++) row[e] = sel_shift ? sc[e] + sel_shift[e] : sc[e];
    if (grouped) mask_groups(s, row, gscore, gkeep);
    int32_t *idx = r->indices + t * k;
    topk_row(row, E, k, idx, val);
    // Combine weights from the unbiased scores.
    float *w = r->weights + t * k;
    double sum = 0.0;
    for (int64_t j = 0; j < k; j++) sum += sc[idx[j]];
    const double scale = s->norm_topk_prob ? s->routed_scaling_factor / (sum + 1e-20) : s->routed_scaling_factor;
    for (int64_t j = 0; j < k; j++) w[j] = (float)(sc[idx[j]] * scale);
  }
  memset(r->counts, 0, sizeof(int32_t) * (size_t)E);
  for (int64_t i = 0; i < T * k; i++) r->counts[r->indices[i]]++;
}

df_status df_moe_router_forward(df_ctx *ctx, const df_moe_router_spec *s, const df_tensor *u, const df_tensor *w,
                                const df_tensor *b, const float *sel_shift, float *sel, df_moe_routing *r,
                                df_error *err) {
  df_tensor logits = df_view(r->logits, DF_F32, u->device, 2, (const int64_t[]){r->T, s->E});
  DF_TRY(df_linear_forward(ctx, u, w, b, &logits, err));
  df_moe_scores_forward(ctx, s->score_func, r->T, s->E, r->logits, r->scores);
  df_moe_router_select(ctx, s, sel_shift, sel, r);
  return DF_OK;
}

// ---- backward ------------------------------------------------------------------------------------------

void df_moe_router_weights_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r,
                                    const float *dweights, const float *aux_row, float *dscores) {
  const int64_t T = r->T, E = s->E, k = s->k;
  const double f = s->routed_scaling_factor;
#pragma omp parallel for num_threads(nthreads(ctx)) if (T * E > ROUTER_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < T; t++) {
    float *ds = dscores + t * E;
    for (int64_t e = 0; e < E; e++) ds[e] = aux_row ? aux_row[e] : 0.0f;
    if (!dweights) continue;
    const int32_t *idx = r->indices + t * k;
    const float *sc = r->scores + t * E, *w = r->weights + t * k, *dw = dweights + t * k;
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
}

df_status df_moe_router_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r, const df_tensor *u,
                                 const df_tensor *w, df_tensor *dw, const float *dweights, const float *aux_row,
                                 float *dlogits, df_tensor *du, df_error *err) {
  df_moe_router_weights_backward(ctx, s, r, dweights, aux_row, dlogits);
  df_moe_scores_backward(ctx, s->score_func, r->T, s->E, r->logits, r->scores, dlogits, dlogits);
  df_tensor dl = df_view(dlogits, DF_F32, u->device, 2, (const int64_t[]){r->T, s->E});
  return df_linear_backward(ctx, &dl, u, w, du, false, dw, NULL, err);
}
