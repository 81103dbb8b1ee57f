// The training-time-test attention (kernels/eagle3.h): the forward against a dense masked softmax written in double
// here (step 0's causal keys of the sample's real positions plus the diagonal keys of steps 1 .. i, tools/reference/
// eagle3_step.py's midlayer), the backward against central differences of a probe loss through every input (q and
// every step's keys and values), GQA, padding, and the argument checks.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/eagle3.h"
#include "tests/common/fixture.h"

typedef struct {
  int64_t B, S, nH, nKV, hd, T, i;
  int32_t len[4];
  float *q, *k, *v, *out, *lse, *r; // r: the probe's weights over out
  df_ctx *ctx;
} case_t;

static df_tensor t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d) {
  return df_view(p, DF_F32, DF_DEV_CPU, 4, (const int64_t[]){a, b, c, d});
}

static void make(case_t *c, int64_t B, int64_t S, int64_t nH, int64_t nKV, int64_t hd, int64_t T, int64_t i,
                 const int32_t *len, uint64_t seed) {
  *c = (case_t){.B = B, .S = S, .nH = nH, .nKV = nKV, .hd = hd, .T = T, .i = i, .ctx = df_test_cpu_ctx(2)};
  memcpy(c->len, len, sizeof(int32_t) * (size_t)B);
  const int64_t nq = B * S * nH * hd, nk = T * B * S * nKV * hd;
  c->q = malloc(sizeof(float) * (size_t)nq), c->out = calloc((size_t)nq, sizeof(float));
  c->r = malloc(sizeof(float) * (size_t)nq), c->lse = calloc((size_t)(B * S * nH), sizeof(float));
  c->k = malloc(sizeof(float) * (size_t)nk), c->v = malloc(sizeof(float) * (size_t)nk);
  df_test_fill_uniform(c->q, nq, seed, -1, 1);
  df_test_fill_uniform(c->k, nk, seed + 1, -1, 1);
  df_test_fill_uniform(c->v, nk, seed + 2, -1, 1);
  df_test_fill_uniform(c->r, nq, seed + 3, -1, 1);
}

static void drop(case_t *c) {
  free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free(c->r);
  df_ctx_destroy(c->ctx);
}

static df_status fwd(case_t *c, df_error *err) {
  const df_ttt_attn_desc d = {.step = c->i, .scale = (float)(1.0 / sqrt((double)c->hd))};
  df_tensor q = t4(c->q, c->B, c->S, c->nH, c->hd), k = t4(c->k, c->T * c->B, c->S, c->nKV, c->hd);
  df_tensor v = t4(c->v, c->T * c->B, c->S, c->nKV, c->hd), o = t4(c->out, c->B, c->S, c->nH, c->hd);
  df_tensor len = df_view(c->len, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){c->B});
  df_tensor lse = df_view(c->lse, DF_F32, DF_DEV_CPU, 1, (const int64_t[]){c->B * c->S * c->nH});
  return df_ttt_attn_forward(c->ctx, &d, &q, &k, &v, &len, &o, &lse, err);
}

// The dense reference in double: out[b, p, h] over the visible keys.
static void reference(const case_t *c, double *out) {
  const int64_t grp = c->nH / c->nKV, hd = c->hd;
  const double scale = 1.0 / sqrt((double)hd);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t p = 0; p < c->S; p++)
      for (int64_t h = 0; h < c->nH; h++) {
        const float *q = c->q + ((b * c->S + p) * c->nH + h) * hd;
        double s[256], mx = -INFINITY, sum = 0;
        const float *vs[256];
        int n = 0;
        for (int64_t m = 0; m <= c->i; m++)
          for (int64_t j = 0; j < c->S; j++) {
            const bool visible = m == 0 ? j <= p && j < c->len[b] : j == p;
            if (!visible) continue;
            const int64_t off = (((m * c->B + b) * c->S + j) * c->nKV + h / grp) * hd;
            double dot = 0;
            for (int64_t e = 0; e < hd; e++) dot += (double)q[e] * c->k[off + e];
            s[n] = dot * scale, vs[n++] = c->v + off;
            mx = fmax(mx, dot * scale);
          }
        for (int x = 0; x < n; x++) sum += s[x] = exp(s[x] - mx);
        double *o = out + ((b * c->S + p) * c->nH + h) * hd;
        for (int64_t e = 0; e < hd; e++) {
          o[e] = 0;
          for (int x = 0; x < n; x++) o[e] += s[x] / sum * vs[x][e];
        }
      }
}

Test(ttt_attn, forward_matches_the_dense_masked_softmax) {
  const int32_t len[2] = {5, 3};
  for (int64_t i = 0; i < 3; i++) {
    case_t c;
    make(&c, 2, 5, 4, 2, 8, 3, i, len, 11 + (uint64_t)i);
    df_error err = {0};
    DF_ASSERT_OK(fwd(&c, &err), &err);
    const int64_t n = c.B * c.S * c.nH * c.hd;
    double *want = malloc(sizeof(double) * (size_t)n);
    float *wf = malloc(sizeof(float) * (size_t)n);
    reference(&c, want);
    for (int64_t x = 0; x < n; x++) wf[x] = (float)want[x];
    df_expect_close("ttt attention out", c.out, wf, n, 1e-5, 1e-6);
    free(want), free(wf);
    drop(&c);
  }
}

// Probe loss Σ r · out over the forward, in double.
static double probe(void *self) {
  case_t *c = self;
  df_error err = {0};
  if (fwd(c, &err) != DF_OK) return NAN;
  double s = 0;
  for (int64_t x = 0; x < c->B * c->S * c->nH * c->hd; x++) s += (double)c->r[x] * c->out[x];
  return s;
}

Test(ttt_attn, backward_matches_finite_differences) {
  const int32_t len[2] = {6, 4}; // the second sample has padding keys and padding queries
  for (int64_t i = 0; i < 3; i += 2) {
    case_t c;
    make(&c, 2, 6, 4, 2, 4, 3, i, len, 7 + (uint64_t)i);
    df_error err = {0};
    DF_ASSERT_OK(fwd(&c, &err), &err);
    const int64_t nq = c.B * c.S * c.nH * c.hd, nk = c.T * c.B * c.S * c.nKV * c.hd;
    float *dq = malloc(sizeof(float) * (size_t)nq), *dk = calloc((size_t)nk, sizeof(float));
    float *dv = calloc((size_t)nk, sizeof(float));
    const df_ttt_attn_desc d = {.step = c.i, .scale = (float)(1.0 / sqrt((double)c.hd))};
    df_tensor q = t4(c.q, c.B, c.S, c.nH, c.hd), k = t4(c.k, c.T * c.B, c.S, c.nKV, c.hd);
    df_tensor v = t4(c.v, c.T * c.B, c.S, c.nKV, c.hd), o = t4(c.out, c.B, c.S, c.nH, c.hd);
    df_tensor len_t = df_view(c.len, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){c.B});
    df_tensor lse = df_view(c.lse, DF_F32, DF_DEV_CPU, 1, (const int64_t[]){c.B * c.S * c.nH});
    df_tensor go = t4(c.r, c.B, c.S, c.nH, c.hd), gq = t4(dq, c.B, c.S, c.nH, c.hd);
    df_tensor gk = t4(dk, c.T * c.B, c.S, c.nKV, c.hd), gv = t4(dv, c.T * c.B, c.S, c.nKV, c.hd);
    DF_ASSERT_OK(df_ttt_attn_backward(c.ctx, &d, &q, &k, &v, &len_t, &o, &lse, &go, &gq, &gk, &gv, &err), &err);
    df_fd_check("dq", c.q, dq, nq, probe, &c, 1e-3, 2e-3, 2e-4, 60);
    df_fd_check("dk (every step)", c.k, dk, nk, probe, &c, 1e-3, 2e-3, 2e-4, 120);
    df_fd_check("dv (every step)", c.v, dv, nk, probe, &c, 1e-3, 2e-3, 2e-4, 120);
    // keys of steps after i and padding keys of step 0 are seen by nobody: no gradient
    for (int64_t m = i + 1; m < c.T; m++)
      for (int64_t x = 0; x < c.B * c.S * c.nKV * c.hd; x++)
        cr_expect_eq(dk[m * c.B * c.S * c.nKV * c.hd + x], 0.0f, "step %lld key gradient", (long long)m);
    const int64_t pad = ((1 * c.S + 5) * c.nKV) * c.hd; // sample 1, position 5 >= length 4, step 0
    for (int64_t x = 0; x < c.nKV * c.hd; x++) cr_expect_eq(dk[pad + x], 0.0f, "padding key gradient");
    free(dq), free(dk), free(dv);
    drop(&c);
  }
}

Test(ttt_attn, the_accumulation_over_steps_completes_step_keys) {
  // dk of step 0 summed over the backwards of steps 2, 1, 0 equals the finite difference of Σ_i r_i · out_i.
  const int32_t len[1] = {4};
  case_t c;
  make(&c, 1, 4, 2, 1, 4, 3, 0, len, 3);
  const int64_t nq = c.S * c.nH * c.hd, nk = c.T * c.S * c.nKV * c.hd;
  float *dk = calloc((size_t)nk, sizeof(float)), *dv = calloc((size_t)nk, sizeof(float));
  float *dq = malloc(sizeof(float) * (size_t)nq);
  df_error err = {0};
  for (int64_t i = c.T - 1; i >= 0; i--) {
    c.i = i;
    DF_ASSERT_OK(fwd(&c, &err), &err);
    const df_ttt_attn_desc d = {.step = i, .scale = 0.5f};
    df_tensor q = t4(c.q, 1, c.S, c.nH, c.hd), k = t4(c.k, c.T, c.S, 1, c.hd), v = t4(c.v, c.T, c.S, 1, c.hd);
    df_tensor o = t4(c.out, 1, c.S, c.nH, c.hd), len_t = df_view(c.len, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){1});
    df_tensor lse = df_view(c.lse, DF_F32, DF_DEV_CPU, 1, (const int64_t[]){c.S * c.nH});
    df_tensor go = t4(c.r, 1, c.S, c.nH, c.hd), gq = t4(dq, 1, c.S, c.nH, c.hd);
    df_tensor gk = t4(dk, c.T, c.S, 1, c.hd), gv = t4(dv, c.T, c.S, 1, c.hd);
    DF_ASSERT_OK(df_ttt_attn_backward(c.ctx, &d, &q, &k, &v, &len_t, &o, &lse, &go, &gq, &gk, &gv, &err), &err);
  }
  // the same probe r for every step: Σ_i Σ r · out_i, differentiated by differences
  for (int64_t x = 0; x < c.S * c.hd; x += 3) { // step 0's keys: every step reads them
    const float k0 = c.k[x];
    double f[2];
    for (int s = 0; s < 2; s++) {
      c.k[x] = k0 + (s ? -1e-3f : 1e-3f);
      f[s] = 0;
      for (int64_t i = 0; i < c.T; i++) c.i = i, f[s] += probe(&c);
    }
    c.k[x] = k0;
    const double fd = (f[0] - f[1]) / 2e-3;
    cr_expect(fabs(fd - dk[x]) <= 2e-3 + 2e-3 * fabs(fd), "dk0[%lld]: %g vs finite differences %g", (long long)x,
              (double)dk[x], fd);
  }
  free(dk), free(dv), free(dq);
  drop(&c);
}

Test(ttt_attn, bad_arguments_name_the_argument) {
  const int32_t len[1] = {4};
  case_t c;
  make(&c, 1, 4, 4, 3, 4, 2, 0, len, 5); // 3 kv heads do not divide 4 heads
  df_error err = {0};
  cr_expect_eq(fwd(&c, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "k");
  drop(&c);
  make(&c, 1, 4, 2, 1, 4, 2, 2, len, 5); // step 2 of a 2-step cache
  cr_expect_eq(fwd(&c, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc.step");
  drop(&c);
}
