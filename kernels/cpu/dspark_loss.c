// CPU DSpark loss extras: softmax L1 distance between draft and teacher logits (forward, backward into the
// draft), and BCE with logits for the confidence head. Rows run in parallel; row sums are in double.
#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"
#include "kernels/cpu/vexp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

// softmax(z) [V] into out; forward and backward share this so that sign(P − Q) is the same in both.
static void row_softmax(const float *z, int64_t V, float *out) {
  float m = z[0];
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; v++) {
    out[v] = df_exp_nonpos(z[v] - m);
    s += (double)out[v];
  }
  float inv = (float)(1.0 / s);
#pragma omp simd
  for (int64_t v = 0; v < V; v++) out[v] *= inv;
}

// torch.sign: 0 for ties, so equal probabilities pass no gradient.
static inline float sign_of(float d) { return (float)((d > 0.0f) - (d < 0.0f)); }

typedef struct {
  const float *p, *q, *dl1; // [R, V], [R, V], [R] (backward only)
  float *l1, *dp;           // [R] (forward) or [R, V] (backward)
  int64_t R, V;
} l1_job;

// l1[r] = Σ_v |P_v − Q_v|.
static void l1_forward_row(const l1_job *jb, int64_t r, float *P, float *Q) {
  row_softmax(jb->p + r * jb->V, jb->V, P);
  row_softmax(jb->q + r * jb->V, jb->V, Q);
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < jb->V; v++) s += fabs((double)P[v] - (double)Q[v]);
  jb->l1[r] = (float)s;
}

// dp_j = dl1 · P_j · (s_j − Σ_v s_v P_v), s = sign(P − Q).
static void l1_backward_row(const l1_job *jb, int64_t r, float *P, float *Q) {
  int64_t V = jb->V;
  row_softmax(jb->p + r * V, V, P);
  row_softmax(jb->q + r * V, V, Q);
  double a = 0.0;
#pragma omp simd reduction(+ : a)
  for (int64_t v = 0; v < V; v++) {
    Q[v] = sign_of(P[v] - Q[v]); // Q now holds the signs
    a += (double)Q[v] * P[v];
  }
  float g = jb->dl1[r], af = (float)a;
  float *dp = jb->dp + r * V;
#pragma omp simd
  for (int64_t v = 0; v < V; v++) dp[v] = g * P[v] * (Q[v] - af);
}

// Runs one row function over all rows with per-thread [2, V] probability scratch.
static df_status l1_rows(df_ctx *ctx, const l1_job *jb, void (*row)(const l1_job *, int64_t, float *, float *),
                         df_error *err) {
  int nthreads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  if (jb->R < nthreads) nthreads = jb->R > 0 ? (int)jb->R : 1;
  float *scratch = malloc(sizeof(float) * 2 * (size_t)jb->V * (size_t)nthreads); // [threads, 2, V]
  if (!scratch)
    return DF_FAIL(err, DF_ERR_NOMEM, "softmax_l1", "use fewer threads", "cannot allocate %d × 2 × %lld floats",
                   nthreads, (long long)jb->V);
#pragma omp parallel num_threads(nthreads)
  {
#ifdef _OPENMP
    float *P = scratch + 2 * (size_t)jb->V * (size_t)omp_get_thread_num();
#else
    float *P = scratch;
#endif
#pragma omp for schedule(static)
    for (int64_t r = 0; r < jb->R; r++) row(jb, r, P, P + jb->V);
  }
  free(scratch);
  return DF_OK;
}

df_status df_cpu_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1, df_error *err) {
  l1_job jb = {.p = p->data, .q = q->data, .l1 = l1->data, .R = df_rows(p), .V = df_last_dim(p)};
  return l1_rows(ctx, &jb, l1_forward_row, err);
}

df_status df_cpu_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                     df_tensor *dp, df_error *err) {
  l1_job jb = {.p = p->data, .q = q->data, .dl1 = dl1->data, .dp = dp->data, .R = df_rows(p), .V = df_last_dim(p)};
  return l1_rows(ctx, &jb, l1_backward_row, err);
}

df_status df_cpu_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss,
                                    df_error *err) {
  const float *xd = x->data, *td = t->data;
  float *ld = loss->data;
  int64_t n = df_numel(x);
  // max(x, 0) − x·t + log1p(exp(−|x|)): no overflow for any x, as torch's binary_cross_entropy_with_logits.
#pragma omp parallel for num_threads(ctx->num_threads) if (n > 1 << 15)
  for (int64_t i = 0; i < n; i++) {
    double xi = xd[i];
    ld[i] = (float)(fmax(xi, 0.0) - xi * td[i] + log1p(exp(-fabs(xi))));
  }
  return DF_OK;
}

// sigmoid without overflow: exp of a non-positive argument only.
static inline double sigmoid(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

df_status df_cpu_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                     df_tensor *dx, df_error *err) {
  const float *xd = x->data, *td = t->data, *gd = dloss->data;
  float *dxd = dx->data;
  int64_t n = df_numel(x);
#pragma omp parallel for num_threads(ctx->num_threads) if (n > 1 << 15)
  for (int64_t i = 0; i < n; i++) dxd[i] = (float)((double)gd[i] * (sigmoid(xd[i]) - (double)td[i]));
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_dspark_loss(df_backend *be) {
  be->softmax_l1_forward = df_cpu_softmax_l1_forward;
  be->softmax_l1_backward = df_cpu_softmax_l1_backward;
  be->bce_logits_forward = df_cpu_bce_logits_forward;
  be->bce_logits_backward = df_cpu_bce_logits_backward;
}
