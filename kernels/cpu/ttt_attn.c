// CPU oracle of the training-time-test attention (kernels/eagle3.h): per query row the visible keys are step 0's
// causal prefix of the sample's real positions and the diagonal keys of steps 1 .. i; the mask is never built. The
// backward recomputes the probabilities from the saved log-sum-exp: dq and the diagonal key gradients per query row,
// step 0's key gradients per key row (so no two threads write one row, and the sums run in a fixed order).
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/context.h"

typedef struct {
  int64_t B, S, nH, hd, nKV, T, i, grp;
  float scale;
  const float *q, *k, *v;
  const int32_t *len;
} ttt_dims;

static ttt_dims dims_of(const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k, const df_tensor *v,
                        const df_tensor *lengths) {
  ttt_dims d = {.B = q->shape[0],
                .S = q->shape[1],
                .nH = q->shape[2],
                .hd = q->shape[3],
                .T = k->shape[0] / q->shape[0],
                .nKV = k->shape[2],
                .i = desc->step,
                .scale = desc->scale,
                .q = q->data,
                .k = k->data,
                .v = v->data,
                .len = lengths->data};
  d.grp = d.nH / d.nKV;
  return d;
}

static inline const float *q_row(const ttt_dims *d, int64_t b, int64_t p, int64_t h) {
  return d->q + ((b * d->S + p) * d->nH + h) * d->hd;
}
// Row (step m, sample b, position j, kv head g) of a [T·B, S, nKV, hd] cache.
static inline int64_t kv_off(const ttt_dims *d, int64_t m, int64_t b, int64_t j, int64_t g) {
  return (((m * d->B + b) * d->S + j) * d->nKV + g) * d->hd;
}

static inline float dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
  for (int64_t x = 0; x < n; x++) s += a[x] * b[x];
  return s;
}

// Step 0's visible keys of query p: positions 0 .. n0 − 1.
static inline int64_t causal_count(const ttt_dims *d, int64_t b, int64_t p) {
  const int64_t L = d->len[b];
  return (p < L - 1 ? p : L - 1) + 1;
}

// Scores of one query against its visible keys: s[0 .. n0) step 0's, s[n0 .. n0 + i) the diagonal of steps 1 .. i.
static int64_t scores(const ttt_dims *d, int64_t b, int64_t p, int64_t h, float *s) {
  const int64_t g = h / d->grp, n0 = causal_count(d, b, p), hd = d->hd;
  const float *qp = q_row(d, b, p, h);
  for (int64_t j = 0; j < n0; j++) s[j] = d->scale * dot(qp, d->k + kv_off(d, 0, b, j, g), hd);
  for (int64_t m = 1; m <= d->i; m++) s[n0 + m - 1] = d->scale * dot(qp, d->k + kv_off(d, m, b, p, g), hd);
  return n0;
}

static inline const float *key_v(const ttt_dims *d, const float *base, int64_t b, int64_t p, int64_t g, int64_t n0,
                                 int64_t x) {
  return x < n0 ? base + kv_off(d, 0, b, x, g) : base + kv_off(d, x - n0 + 1, b, p, g);
}

static df_status cpu_ttt_attn_forward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                      const df_tensor *v, const df_tensor *lengths, df_tensor *out, df_tensor *lse,
                                      df_error *err) {
  const ttt_dims d = dims_of(desc, q, k, v, lengths);
  const int nt = omp_get_max_threads();
  const size_t per = (size_t)(d.S + d.T);
  float *scratch;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * per * (size_t)nt, (void **)&scratch, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  float *o = out->data, *l = lse->data;
#pragma omp parallel num_threads(nt)
  {
    float *s = scratch + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 4)
    for (int64_t bp = 0; bp < d.B * d.S; bp++) {
      const int64_t b = bp / d.S, p = bp % d.S;
      for (int64_t h = 0; h < d.nH; h++) {
        const int64_t n0 = scores(&d, b, p, h, s), n = n0 + d.i, g = h / d.grp;
        float mx = -INFINITY;
        for (int64_t x = 0; x < n; x++) mx = s[x] > mx ? s[x] : mx;
        double sum = 0.0;
        for (int64_t x = 0; x < n; x++) sum += (double)(s[x] = expf(s[x] - mx));
        float *op = o + ((b * d.S + p) * d.nH + h) * d.hd;
        memset(op, 0, sizeof(float) * (size_t)d.hd);
        const float inv = (float)(1.0 / sum);
        for (int64_t x = 0; x < n; x++) {
          const float w = s[x] * inv, *vp = key_v(&d, d.v, b, p, g, n0, x);
          for (int64_t e = 0; e < d.hd; e++) op[e] += w * vp[e];
        }
        l[(b * d.S + p) * d.nH + h] = mx + (float)log(sum);
      }
    }
  }
  return DF_OK;
}

// Per query row: D = Σ dout·out, dq, and the diagonal keys' gradients (row p of steps 1 .. i belongs to this query).
static void backward_queries(const ttt_dims *d, const float *out, const float *lse, const float *dout, float *dq,
                             float *dk, float *dv, float *Dsave, float *s, int64_t b, int64_t p) {
  const int64_t hd = d->hd;
  for (int64_t h = 0; h < d->nH; h++) {
    const int64_t r = (b * d->S + p) * d->nH + h, n0 = scores(d, b, p, h, s), n = n0 + d->i, g = h / d->grp;
    const float *go = dout + r * hd, *qp = q_row(d, b, p, h);
    const float Dr = dot(go, out + r * hd, hd);
    Dsave[r] = Dr;
    float *gq = dq + r * hd;
    memset(gq, 0, sizeof(float) * (size_t)hd);
    for (int64_t x = 0; x < n; x++) {
      const float P = expf(s[x] - lse[r]);
      const float dP = dot(go, key_v(d, d->v, b, p, g, n0, x), hd), ds = P * (dP - Dr) * d->scale;
      const float *kp = key_v(d, d->k, b, p, g, n0, x);
      for (int64_t e = 0; e < hd; e++) gq[e] += ds * kp[e];
      if (x < n0) continue; // step 0's keys: backward_keys
      float *gk = dk + kv_off(d, x - n0 + 1, b, p, g), *gv = dv + kv_off(d, x - n0 + 1, b, p, g);
      for (int64_t e = 0; e < hd; e++) gk[e] += ds * qp[e], gv[e] += P * go[e];
    }
  }
}

// Step 0's key row j of kv head g: every query p >= j of the head group that sees it.
static void backward_key(const ttt_dims *d, const float *lse, const float *dout, const float *Dsave, float *dk,
                         float *dv, int64_t b, int64_t j, int64_t g) {
  const int64_t hd = d->hd;
  if (j >= d->len[b]) return; // padding: seen by nobody
  const float *kj = d->k + kv_off(d, 0, b, j, g), *vj = d->v + kv_off(d, 0, b, j, g);
  float *gk = dk + kv_off(d, 0, b, j, g), *gv = dv + kv_off(d, 0, b, j, g);
  for (int64_t h = g * d->grp; h < (g + 1) * d->grp; h++)
    for (int64_t p = j; p < d->S; p++) {
      const int64_t r = (b * d->S + p) * d->nH + h;
      const float *qp = q_row(d, b, p, h), *go = dout + r * hd;
      const float P = expf(d->scale * dot(qp, kj, hd) - lse[r]);
      const float ds = P * (dot(go, vj, hd) - Dsave[r]) * d->scale;
      for (int64_t e = 0; e < hd; e++) gk[e] += ds * qp[e], gv[e] += P * go[e];
    }
}

static df_status cpu_ttt_attn_backward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q,
                                       const df_tensor *k, const df_tensor *v, const df_tensor *lengths,
                                       const df_tensor *out, const df_tensor *lse, const df_tensor *dout, df_tensor *dq,
                                       df_tensor *dk, df_tensor *dv, df_error *err) {
  const ttt_dims d = dims_of(desc, q, k, v, lengths);
  const int nt = omp_get_max_threads();
  const size_t per = (size_t)(d.S + d.T), nD = (size_t)(d.B * d.S * d.nH);
  float *scratch, *Dsave;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * per * (size_t)nt, (void **)&scratch, err));
  DF_TRY(df_ctx_workspace(ctx, 1, sizeof(float) * nD, (void **)&Dsave, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const float *o = out->data, *l = lse->data, *go = dout->data;
  float *gq = dq->data, *gk = dk->data, *gv = dv->data;
#pragma omp parallel num_threads(nt)
  {
    float *s = scratch + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 4)
    for (int64_t bp = 0; bp < d.B * d.S; bp++) backward_queries(&d, o, l, go, gq, gk, gv, Dsave, s, bp / d.S, bp % d.S);
#pragma omp for schedule(dynamic, 4)
    for (int64_t x = 0; x < d.B * d.S * d.nKV; x++)
      backward_key(&d, l, go, Dsave, gk, gv, x / (d.S * d.nKV), x / d.nKV % d.S, x % d.nKV);
  }
  return DF_OK;
}

void df_cpu_register_ttt_attn(df_backend *be) {
  be->ttt_attn_forward = cpu_ttt_attn_forward;
  be->ttt_attn_backward = cpu_ttt_attn_backward;
  be->measures[DF_OP_TTT_ATTN_FORWARD] = be->measures[DF_OP_TTT_ATTN_BACKWARD] = true;
}
