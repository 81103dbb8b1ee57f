// CPU oracles of EAGLE-3's objective ops (kernels/eagle3.h): the compact teacher's chunked pass over the target
// vocabulary (GEMM tiles of the head with an online max / sum and the first argmax), the teacher rows, the per-row
// KL / α / accuracy terms and their gradient, the step sums in a fixed order, and the greedy acceptance lengths.
// Row sums are in double; per-row results are stored fp32.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/context.h"
#include "kernels/cpu/gemm.h"

enum { LSE_CHUNK_ROWS = 256, LSE_VOCAB_BLOCK = 2048 };

// ---- the compact teacher ------------------------------------------------------------------------------------------

static df_status cpu_lmhead_lse_argmax(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden, const df_tensor *head,
                                       df_tensor *lse, df_tensor *argmax, df_error *err) {
  const int64_t R = hidden->shape[0], H = hidden->shape[1], V = head->shape[0];
  const int64_t c = chunk_rows > 0 ? chunk_rows : LSE_CHUNK_ROWS, vb = V < LSE_VOCAB_BLOCK ? V : LSE_VOCAB_BLOCK;
  const int nt = omp_get_max_threads();
  float *buf;
  double *state; // per chunk row: running max, running sum
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(c * vb), (void **)&buf, err));
  DF_TRY(df_ctx_workspace(ctx, 1, sizeof(double) * (size_t)(2 * c), (void **)&state, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const float *x = hidden->data, *w = head->data;
  float *out_lse = lse->data;
  int32_t *out_arg = argmax->data;
  for (int64_t r0 = 0; r0 < R; r0 += c) {
    const int64_t n = R - r0 < c ? R - r0 : c;
    for (int64_t r = 0; r < n; r++) state[2 * r] = -INFINITY, state[2 * r + 1] = 0.0, out_arg[r0 + r] = 0;
    for (int64_t v0 = 0; v0 < V; v0 += vb) {
      const int64_t nb = V - v0 < vb ? V - v0 : vb;
      df_cpu_sgemm(nt, false, true, n, nb, H, 1.0f, x + r0 * H, H, w + v0 * H, H, 0.0f, buf, nb);
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t r = 0; r < n; r++) {
        const float *z = buf + r * nb;
        int64_t best = -1;
        float bmax = -INFINITY;
        for (int64_t j = 0; j < nb; j++)
          if (z[j] > bmax) bmax = z[j], best = j;
        double m = state[2 * r], s = state[2 * r + 1];
        if (best >= 0 && bmax > m) { // strictly greater: the earlier maximum wins a tie
          s *= exp(m - (double)bmax);
          m = bmax;
          out_arg[r0 + r] = (int32_t)(v0 + best);
        }
        for (int64_t j = 0; j < nb; j++) s += exp((double)z[j] - m);
        state[2 * r] = m, state[2 * r + 1] = s;
      }
    }
    for (int64_t r = 0; r < n; r++) out_lse[r0 + r] = (float)(state[2 * r] + log(state[2 * r + 1]));
  }
  return DF_OK;
}

static df_status cpu_eagle3_teacher(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                                    const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio, df_tensor *pm,
                                    df_error *err) {
  (void)ctx, (void)err;
  const int64_t R = logits->shape[0], D = logits->shape[1], V = t2d->shape[0];
  float *z = logits->data, *ro = ratio->data, *po = pm->data;
  const float *lv = lse_v->data, *lm = loss_mask->data;
  const int32_t *am = argmax->data;
  const uint8_t *sel = t2d->data;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; r++) {
    float *zr = z + r * D;
    float mx = -INFINITY;
    for (int64_t d = 0; d < D; d++) mx = zr[d] > mx ? zr[d] : mx;
    double s = 0.0;
    for (int64_t d = 0; d < D; d++) s += exp((double)zr[d] - mx);
    const double lse_d = mx + log(s);
    for (int64_t d = 0; d < D; d++) zr[d] = (float)exp((double)zr[d] - lse_d);
    ro[r] = (float)exp(lse_d - (double)lv[r]);
    const int32_t tok = am[r];
    po[r] = tok >= 0 && tok < V && sel[tok] ? lm[r] : 0.0f;
  }
  return DF_OK;
}

// ---- the per-step objective ---------------------------------------------------------------------------------------

typedef struct {
  double lse, sum_p, alpha, beta; // beta = Σ q·g (g = ∂min(o, q)/∂q)
  int64_t pred;
} row_stats;

// Row statistics of logits z [D] against the teacher row p [D] scaled by ratio (o = p · ratio).
static row_stats row_of(const float *z, const float *p, float ratio, int64_t D, bool need_alpha) {
  row_stats st = {.pred = 0};
  float mx = z[0];
  for (int64_t d = 1; d < D; d++)
    if (z[d] > mx) mx = z[d], st.pred = d;
  double s = 0.0;
  for (int64_t d = 0; d < D; d++) s += exp((double)z[d] - mx);
  st.lse = mx + log(s);
  for (int64_t d = 0; d < D; d++) st.sum_p += p[d];
  if (!need_alpha) return st;
  for (int64_t d = 0; d < D; d++) {
    const double q = exp((double)z[d] - st.lse), o = (double)p[d] * ratio;
    st.alpha += q < o ? q : o;
    st.beta += q < o ? q : (q == o ? 0.5 * q : 0.0);
  }
  return st;
}

// The teacher row a chunk row reads (−1: past the sample's end).
static inline int64_t teacher_row(const df_eagle3_loss_desc *d, int64_t r) {
  if (d->rows) return ((const int32_t *)d->rows->data)[r];
  const int64_t g = d->row0 + r;
  return g % d->S + d->step < d->S ? g + d->step : -1;
}

static df_status cpu_eagle3_loss_forward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                         const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out,
                                         df_error *err) {
  (void)ctx, (void)err;
  const int64_t c = z->shape[0], D = z->shape[1];
  const float *zz = z->data, *tp = t->target_p->data, *ratio = t->ratio->data, *pm = t->pm->data;
  const float *lm = t->loss_mask->data;
  const int32_t *tok = t->tokens->data, *d2t = t->d2t->data;
  float *kl = out->kl->data, *al = out->alpha->data, *la = out->log_alpha->data, *po = out->pm->data;
  float *co = out->correct->data, *mo = out->mask->data;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < c; r++) {
    const int64_t tr = teacher_row(desc, r);
    if (tr < 0) {
      kl[r] = al[r] = la[r] = po[r] = co[r] = mo[r] = 0.0f;
      continue;
    }
    const float *zr = zz + r * D, *p = tp + tr * D;
    const row_stats st = row_of(zr, p, ratio[tr], D, true);
    double pz = 0.0;
    for (int64_t d = 0; d < D; d++) pz += (double)p[d] * zr[d];
    const double w = pm[tr];
    kl[r] = (float)(w * (st.lse * st.sum_p - pz));
    al[r] = (float)(w * st.alpha);
    la[r] = (float)(st.alpha > 0 ? w * log(st.alpha) : 0.0);
    po[r] = (float)w;
    co[r] = st.pred + d2t[st.pred] == tok[tr] ? lm[tr] : 0.0f;
    mo[r] = lm[tr];
  }
  return DF_OK;
}

// The coefficients of ∂loss_i/∂z_r (times weight): the KL part multiplies (q·Σp − p), the α part q·(g − β).
typedef struct {
  double kl, alpha; // per unit pm; the α part also divides by α for the alpha loss
  bool alpha_over;
} step_coef;

static step_coef coef_of(const df_eagle3_loss_desc *d, const double *local) {
  const double den = local[DF_EAGLE3_SUM_PM] > 1e-8 ? local[DF_EAGLE3_SUM_PM] : 1e-8, N = (double)d->positions;
  switch (d->lk) {
  case DF_LK_ALPHA: return (step_coef){.kl = 0.0, .alpha = -d->weight / den, .alpha_over = true};
  case DF_LK_LAMBDA: {
    const double acc = local[DF_EAGLE3_SUM_ALPHA] / den, w = d->kl_scale * exp(-d->kl_decay * acc);
    return (step_coef){.kl = d->weight * w / N, .alpha = -d->weight * (1.0 - w) / den};
  }
  default: return (step_coef){.kl = d->weight / (d->pm_mean ? fmax(local[DF_EAGLE3_SUM_PM], 1e-6) : N), .alpha = 0.0};
  }
}

static df_status cpu_eagle3_loss_backward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                          const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                          df_error *err) {
  (void)ctx, (void)err;
  const int64_t c = z->shape[0], D = z->shape[1];
  const step_coef k = coef_of(desc, local->data);
  const float *zz = z->data, *tp = t->target_p->data, *ratio = t->ratio->data, *pm = t->pm->data;
  float *g = dz->data;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < c; r++) {
    const int64_t tr = teacher_row(desc, r);
    float *gr = g + r * D;
    if (tr < 0 || pm[tr] == 0.0f) {
      memset(gr, 0, sizeof(float) * (size_t)D);
      continue;
    }
    const float *zr = zz + r * D, *p = tp + tr * D;
    const bool need_alpha = k.alpha != 0.0;
    const row_stats st = row_of(zr, p, ratio[tr], D, need_alpha);
    double ca = k.alpha * pm[tr];
    if (k.alpha_over) ca = st.alpha > 0 ? ca / st.alpha : 0.0;
    const double ck = k.kl * pm[tr];
    for (int64_t d = 0; d < D; d++) {
      const double q = exp((double)zr[d] - st.lse), o = (double)p[d] * ratio[tr];
      const double gq = q < o ? 1.0 : (q == o ? 0.5 : 0.0);
      gr[d] = (float)(ck * (q * st.sum_p - p[d]) + (need_alpha ? ca * q * (gq - st.beta) : 0.0));
    }
  }
  return DF_OK;
}

static df_status cpu_eagle3_step_sums(df_ctx *ctx, const df_eagle3_sums_desc *d, const df_eagle3_row_terms *rows,
                                      df_tensor *local, df_tensor *stats, df_error *err) {
  (void)ctx, (void)err;
  const int64_t R = df_numel(rows->kl);
  const float *src[DF_EAGLE3_STEP_LOCAL] = {rows->kl->data, rows->alpha->data,   rows->log_alpha->data,
                                            rows->pm->data, rows->correct->data, rows->mask->data};
  double sums[DF_EAGLE3_STEP_LOCAL] = {0};
  for (int k = 0; k < DF_EAGLE3_STEP_LOCAL; k++)
    for (int64_t r = 0; r < R; r++) sums[k] += src[k][r];
  const double den = sums[DF_EAGLE3_SUM_PM] > 1e-8 ? sums[DF_EAGLE3_SUM_PM] : 1e-8;
  const double kl_den = d->pm_mean ? fmax(sums[DF_EAGLE3_SUM_PM], 1e-6) : (double)d->positions;
  const double kl = sums[DF_EAGLE3_SUM_KL] / kl_den, acc = sums[DF_EAGLE3_SUM_ALPHA] / den;
  const double log_acc = sums[DF_EAGLE3_SUM_LOG_ALPHA] / den;
  double loss = kl;
  if (d->lk == DF_LK_ALPHA) loss = -log_acc;
  if (d->lk == DF_LK_LAMBDA) {
    const double w = d->kl_scale * exp(-d->kl_decay * acc);
    loss = w * kl + (1.0 - w) * (1.0 - acc);
  }
  double *lo = local->data, *st = stats->data, *blk = st + d->step_block;
  memcpy(lo, sums, sizeof sums);
  for (int k = 0; k < DF_EAGLE3_STEP_LOCAL; k++) blk[k] += sums[k];
  blk[DF_EAGLE3_S_KL_LOSS] += kl, blk[DF_EAGLE3_S_LOSS] += loss;
  blk[DF_EAGLE3_S_ACCEPT_RATE] += acc, blk[DF_EAGLE3_S_LOG_ACCEPT] += log_acc;
  st[d->loss_num] += d->step_weight * loss;
  st[d->acc_num] += sums[DF_EAGLE3_SUM_CORRECT], st[d->acc_den] += sums[DF_EAGLE3_SUM_MASK];
  return DF_OK;
}

static df_status cpu_eagle3_accept(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                                   int64_t blocks, df_tensor *stats, df_error *err) {
  (void)ctx, (void)err;
  const int64_t T = correct->shape[0], R = correct->shape[1];
  const float *c = correct->data, *m = mask->data;
  double acc = 0.0, n = 0.0;
  for (int64_t r = 0; r < R; r++) {
    if (!(m[r] > 0.0f)) continue;
    int64_t run = 0;
    while (run < T && c[run * R + r] > 0.0f) run++;
    acc += (double)(1 + run), n += 1.0;
  }
  double *st = stats->data;
  st[accept_sum] += acc, st[blocks] += n;
  return DF_OK;
}

void df_cpu_register_eagle3_loss(df_backend *be) {
  be->lmhead_lse_argmax = cpu_lmhead_lse_argmax;
  be->eagle3_teacher = cpu_eagle3_teacher;
  be->eagle3_loss_forward = cpu_eagle3_loss_forward;
  be->eagle3_loss_backward = cpu_eagle3_loss_backward;
  be->eagle3_step_sums = cpu_eagle3_step_sums;
  be->eagle3_accept = cpu_eagle3_accept;
  be->measures[DF_OP_LMHEAD_LSE_ARGMAX] = true;
}
