// Fused DSpark objective over the LM head (df_lmhead_dspark): PyTorch golden data for every chunking and
// thread count, bitwise chunk/thread invariance of the per-row outputs (and thread invariance of dw2), a naive
// double reference over many tiles and waves, dw2 accumulation, argument errors.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

// Tolerances (fp32 op vs float64 torch on the same fp32 inputs), as lmhead_ce's: the fp32 logits carry
// ~1e−6 relative GEMM rounding, CE inherits twice that; L1 = Σ|p − q| sums V fp32 probabilities (each within
// ~2^−23 relative); top-1 probabilities are 1/Σ exp. Gradients are V-term sums of fp32 terms: 1e−5 of the
// largest element. dconf = gs·w·α·(σ(c) − y) inherits the L1 error through y. Where the logits reach ±60
// (case c) their fp32 error is ~1e−5 absolute, so a probability p is good to ~p·1e−5 (observed 2.2e−6).
#define CE_RTOL   5e-7
#define CE_ATOL   2e-6
#define PROB_RTOL 1e-6
#define PROB_ATOL 1e-5
#define GRAD_RTOL 1e-5
#define GRAD_ATOL 1e-7

typedef struct {
  fx_file *f;
  df_tensor hidden, head, u, w2, teacher, labels, weights, conf;
  bool has_u, has_t, has_c, has_w;
  df_lmhead_dspark_desc d;
  int64_t R, H, V, r;
} dcase;

static dcase load_case(const char *file) {
  dcase c = {.f = fx_load(file)};
  c.hidden = fx_view(c.f, "hidden"), c.head = fx_view(c.f, "head"), c.labels = fx_view(c.f, "labels");
  if ((c.has_u = fx_has(c.f, "markov_u"))) c.u = fx_view(c.f, "markov_u"), c.w2 = fx_view(c.f, "markov_w2");
  if ((c.has_t = fx_has(c.f, "teacher"))) c.teacher = fx_view(c.f, "teacher");
  if ((c.has_c = fx_has(c.f, "conf"))) c.conf = fx_view(c.f, "conf");
  if ((c.has_w = fx_has(c.f, "weights"))) c.weights = fx_view(c.f, "weights");
  c.d = (df_lmhead_dspark_desc){.grad_scale = (float)fx_meta(c.f, "grad_scale"),
                                .alpha_ce = (float)fx_meta(c.f, "alpha_ce"),
                                .alpha_l1 = (float)fx_meta(c.f, "alpha_l1"),
                                .alpha_conf = (float)fx_meta(c.f, "alpha_conf")};
  c.R = c.hidden.shape[0], c.H = c.hidden.shape[1], c.V = c.head.shape[0], c.r = c.has_u ? c.u.shape[1] : 0;
  return c;
}

// Outputs of one run; NaN-filled first so anything left unwritten shows.
typedef struct {
  float *ce, *top1, *l1, *ttop1, *bce, *dh, *du, *dw2, *dconf;
  uint8_t *correct, *agree;
} douts;

static douts outs_alloc(const dcase *c) {
  size_t R = (size_t)c->R;
  douts o = {.ce = malloc(4 * R),
             .top1 = malloc(4 * R),
             .l1 = malloc(4 * R),
             .ttop1 = malloc(4 * R),
             .bce = malloc(4 * R),
             .dh = malloc(4 * R * (size_t)c->H),
             .du = malloc(4 * R * (size_t)(c->r + 1)),
             .dw2 = malloc(4 * (size_t)(c->V * (c->r + 1))),
             .dconf = malloc(4 * R),
             .correct = malloc(R),
             .agree = malloc(R)};
  return o;
}

static void outs_free(douts *o) {
  free(o->ce), free(o->top1), free(o->l1), free(o->ttop1), free(o->bce), free(o->dh), free(o->du), free(o->dw2);
  free(o->dconf), free(o->correct), free(o->agree);
}

static void run(df_ctx *ctx, const dcase *c, int64_t chunk, bool grad, douts *o) {
  int64_t R = c->R;
  for (int64_t i = 0; i < R; i++) o->ce[i] = o->top1[i] = o->l1[i] = o->ttop1[i] = o->bce[i] = o->dconf[i] = NAN;
  for (int64_t i = 0; i < R * c->H; i++) o->dh[i] = NAN;
  for (int64_t i = 0; i < R * c->r; i++) o->du[i] = NAN;
  memset(o->dw2, 0, 4 * (size_t)(c->V * c->r)); // accumulated into
  df_tensor ce = df_f32(o->ce, R), top1 = df_f32(o->top1, R), l1 = df_f32(o->l1, R), tt = df_f32(o->ttop1, R);
  df_tensor bce = df_f32(o->bce, R), cor = df_u8(o->correct, R), ag = df_u8(o->agree, R);
  df_tensor dh = df_f32(o->dh, R, c->H), du = df_f32(o->du, R, c->r), dw2 = df_f32(o->dw2, c->V, c->r);
  df_tensor dconf = df_f32(o->dconf, R);
  df_lmhead_dspark_in in = {.hidden = &c->hidden,
                            .head = &c->head,
                            .markov_u = c->has_u ? &c->u : NULL,
                            .markov_w2 = c->has_u ? &c->w2 : NULL,
                            .teacher = c->has_t ? &c->teacher : NULL,
                            .labels = &c->labels,
                            .weights = c->has_w ? &c->weights : NULL,
                            .conf = c->has_c ? &c->conf : NULL};
  df_lmhead_dspark_out out = {.ce = &ce,
                              .correct = &cor,
                              .draft_top1 = &top1,
                              .l1 = c->has_t ? &l1 : NULL,
                              .agree = c->has_t ? &ag : NULL,
                              .teacher_top1 = c->has_t ? &tt : NULL,
                              .bce = c->has_c ? &bce : NULL,
                              .dhidden = grad ? &dh : NULL,
                              .du = grad && c->has_u ? &du : NULL,
                              .dw2 = grad && c->has_u ? &dw2 : NULL,
                              .dconf = grad && c->has_c ? &dconf : NULL};
  df_lmhead_dspark_desc d = c->d;
  d.chunk_rows = chunk;
  df_error err = {0};
  DF_ASSERT_OK(df_lmhead_dspark(ctx, &d, &in, &out, &err), &err);
}

static void expect_u8(const char *what, const uint8_t *got, const uint8_t *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    cr_expect_eq(got[i], want[i], "%s[%lld]: %d, expected %d", what, (long long)i, got[i], want[i]);
}

static void expect_golden(const dcase *c, const douts *o, bool grad) {
  df_expect_close("ce", o->ce, fx_get(c->f, "want_ce")->data, c->R, CE_RTOL, CE_ATOL);
  expect_u8("correct", o->correct, fx_get(c->f, "want_correct")->data, c->R);
  df_expect_close("draft_top1", o->top1, fx_get(c->f, "want_draft_top1")->data, c->R, PROB_RTOL, PROB_ATOL);
  if (c->has_t) {
    df_expect_close("l1", o->l1, fx_get(c->f, "want_l1")->data, c->R, PROB_RTOL, PROB_ATOL);
    expect_u8("agree", o->agree, fx_get(c->f, "want_agree")->data, c->R);
    df_expect_close("teacher_top1", o->ttop1, fx_get(c->f, "want_teacher_top1")->data, c->R, PROB_RTOL, PROB_ATOL);
  }
  if (c->has_c) df_expect_close("bce", o->bce, fx_get(c->f, "want_bce")->data, c->R, PROB_RTOL, PROB_ATOL);
  if (!grad) return;
  df_expect_close("dhidden", o->dh, fx_get(c->f, "want_dhidden")->data, c->R * c->H, GRAD_RTOL, GRAD_ATOL);
  if (c->has_u) {
    df_expect_close("du", o->du, fx_get(c->f, "want_du")->data, c->R * c->r, GRAD_RTOL, GRAD_ATOL);
    df_expect_close("dw2", o->dw2, fx_get(c->f, "want_dw2")->data, c->V * c->r, GRAD_RTOL, GRAD_ATOL);
  }
  if (c->has_c) df_expect_close("dconf", o->dconf, fx_get(c->f, "want_dconf")->data, c->R, GRAD_RTOL, 2e-7);
  // Skipped rows are exact zeros.
  const int32_t *lab = c->labels.data;
  for (int64_t r = 0; r < c->R; r++) {
    if (lab[r] >= 0) continue;
    cr_expect(o->ce[r] == 0 && o->top1[r] == 0, "skipped row %lld", (long long)r);
    for (int64_t k = 0; k < c->H; k++) cr_expect_eq(o->dh[r * c->H + k], 0.0f, "dhidden of skipped row");
    for (int64_t k = 0; k < c->r; k++) cr_expect_eq(o->du[r * c->r + k], 0.0f, "du of skipped row");
    if (c->has_c) cr_expect_eq(o->dconf[r], 0.0f, "dconf of skipped row");
  }
}

// Per-row outputs bitwise equal (b against a).
static void expect_rows_bitwise(const dcase *c, const douts *a, const douts *b, bool grad, const char *what) {
  size_t R = (size_t)c->R;
  bool same = !memcmp(a->ce, b->ce, 4 * R) && !memcmp(a->top1, b->top1, 4 * R) && !memcmp(a->correct, b->correct, R);
  if (c->has_t)
    same = same && !memcmp(a->l1, b->l1, 4 * R) && !memcmp(a->ttop1, b->ttop1, 4 * R) && !memcmp(a->agree, b->agree, R);
  if (c->has_c) same = same && !memcmp(a->bce, b->bce, 4 * R);
  if (grad) {
    same = same && !memcmp(a->dh, b->dh, 4 * R * (size_t)c->H) && !memcmp(a->du, b->du, 4 * R * (size_t)c->r);
    if (c->has_c) same = same && !memcmp(a->dconf, b->dconf, 4 * R);
  }
  cr_expect(same, "per-row outputs are not bitwise equal: %s", what);
}

// Every chunking and thread count: golden values; per-row outputs bitwise equal to the first run; dw2 bitwise
// equal between thread counts for one chunking.
static void check_case(const char *file) {
  dcase c = load_case(file);
  douts o0 = outs_alloc(&c), o = outs_alloc(&c), o1 = outs_alloc(&c);
  df_ctx *ctx[3] = {df_test_cpu_ctx(1), df_test_cpu_ctx(2), df_test_cpu_ctx(3)};
  run(ctx[0], &c, 0, true, &o0);
  expect_golden(&c, &o0, true);
  const int64_t chunks[] = {0, 4, 7, 48, c.R, 3 * c.R};
  char what[96];
  for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
    for (int t = 0; t < 3; t++) {
      run(ctx[t], &c, chunks[k], true, &o);
      expect_golden(&c, &o, true);
      snprintf(what, sizeof what, "chunk %lld, %d threads", (long long)chunks[k], t + 1);
      expect_rows_bitwise(&c, &o0, &o, true, what);
      if (t == 0) memcpy(o1.dw2, o.dw2, 4 * (size_t)(c.V * c.r));
      cr_expect(!memcmp(o1.dw2, o.dw2, 4 * (size_t)(c.V * c.r)), "dw2 bitwise across threads: %s", what);
      run(ctx[t], &c, chunks[k], false, &o);
      expect_golden(&c, &o, false);
      expect_rows_bitwise(&c, &o0, &o, false, what);
    }
  }
  for (int t = 0; t < 3; t++) df_ctx_destroy(ctx[t]);
  outs_free(&o0), outs_free(&o), outs_free(&o1);
  fx_free(c.f);
}

// Markov latent, teacher, confidence, weights, skipped rows; α = (0.1, 0.9, 1.0), SpecForge's defaults.
Test(lmhead_dspark, golden_full) { check_case("kernels/lmhead_dspark_a.safetensors"); }
// No Markov head, no confidence logits; one row with teacher == draft (L1 = 0, sign(0) = 0: no L1 gradient).
Test(lmhead_dspark, golden_no_markov_tie) { check_case("kernels/lmhead_dspark_b.safetensors"); }
// No teacher (CE only, α_l1 = 0), large logits (±60), label −100 skipped.
Test(lmhead_dspark, golden_ce_only_large_logits) { check_case("kernels/lmhead_dspark_c.safetensors"); }
// R = 60 spans two 48-row blocks; α_conf = 2.
Test(lmhead_dspark, golden_two_blocks) { check_case("kernels/lmhead_dspark_d.safetensors"); }

// Case b row 2: the teacher is the draft, so L1 is exactly 0 and agree is 1.
Test(lmhead_dspark, identical_teacher_row) {
  dcase c = load_case("kernels/lmhead_dspark_b.safetensors");
  douts o = outs_alloc(&c);
  df_ctx *ctx = df_test_cpu_ctx(1);
  run(ctx, &c, 0, true, &o);
  cr_expect_eq(o.l1[2], 0.0f);
  cr_expect_eq(o.agree[2], 1);
  df_ctx_destroy(ctx);
  outs_free(&o);
  fx_free(c.f);
}

// dw2 is added to, not written.
Test(lmhead_dspark, dw2_accumulates) {
  dcase c = load_case("kernels/lmhead_dspark_a.safetensors");
  douts o = outs_alloc(&c);
  df_ctx *ctx = df_test_cpu_ctx(2);
  run(ctx, &c, 0, true, &o);
  int64_t n = c.V * c.r;
  float *once = malloc(4 * (size_t)n), *twice = malloc(4 * (size_t)n);
  memcpy(once, o.dw2, 4 * (size_t)n);
  for (int64_t i = 0; i < n; i++) twice[i] = 2 * once[i];
  df_tensor ce = df_f32(o.ce, c.R), cor = df_u8(o.correct, c.R), dh = df_f32(o.dh, c.R, c.H);
  df_tensor du = df_f32(o.du, c.R, c.r), dw2 = df_f32(o.dw2, c.V, c.r), dconf = df_f32(o.dconf, c.R);
  df_lmhead_dspark_in in = {&c.hidden, &c.head, &c.u, &c.w2, &c.teacher, &c.labels, &c.weights, &c.conf};
  df_lmhead_dspark_out out = {.ce = &ce, .correct = &cor, .dhidden = &dh, .du = &du, .dw2 = &dw2, .dconf = &dconf};
  df_error err = {0};
  DF_ASSERT_OK(df_lmhead_dspark(ctx, &c.d, &in, &out, &err), &err);
  df_expect_close("dw2 after two calls", o.dw2, twice, n, 1e-6, 1e-9);
  free(once), free(twice);
  df_ctx_destroy(ctx);
  outs_free(&o);
  fx_free(c.f);
}

// ---- naive double reference over many tiles ------------------------------------------------------------------

typedef struct {
  int64_t R, H, V, r;
  const float *x, *w, *u, *w2, *xt, *wt, *conf;
  const int32_t *lab;
  double gs, ace, al1, aconf;
} naive_in;

typedef struct {
  double *ce, *l1, *bce, *dh, *du, *dw2, *dconf;
} naive_out;

static void naive_logits(const naive_in *n, int64_t r, const float *x, bool markov, double *z) {
  for (int64_t v = 0; v < n->V; v++) {
    double s = 0;
    for (int64_t k = 0; k < n->H; k++) s += (double)x[r * n->H + k] * n->w[v * n->H + k];
    for (int64_t k = 0; markov && k < n->r; k++) s += (double)n->u[r * n->r + k] * n->w2[v * n->r + k];
    z[v] = s;
  }
}

static void naive_softmax(double *z, int64_t V) {
  double m = -INFINITY, s = 0;
  for (int64_t v = 0; v < V; v++) m = fmax(m, z[v]);
  for (int64_t v = 0; v < V; v++) s += (z[v] = exp(z[v] - m));
  for (int64_t v = 0; v < V; v++) z[v] /= s;
}

static void naive(const naive_in *n, naive_out *o) {
  double *p = malloc(8 * (size_t)n->V), *q = malloc(8 * (size_t)n->V), *g = malloc(8 * (size_t)n->V);
  memset(o->dh, 0, 8 * (size_t)(n->R * n->H)), memset(o->du, 0, 8 * (size_t)(n->R * n->r));
  memset(o->dw2, 0, 8 * (size_t)(n->V * n->r));
  for (int64_t r = 0; r < n->R; r++) {
    o->ce[r] = o->l1[r] = o->bce[r] = o->dconf[r] = 0;
    if (n->lab[r] < 0) continue;
    naive_logits(n, r, n->x, true, p);
    naive_logits(n, r, n->xt, false, q);
    naive_softmax(p, n->V), naive_softmax(q, n->V);
    double l1 = 0, a = 0;
    for (int64_t v = 0; v < n->V; v++) {
      double s = (p[v] > q[v]) - (p[v] < q[v]);
      l1 += fabs(p[v] - q[v]), a += s * p[v];
    }
    double c = n->conf[r], y = fmin(fmax(1 - 0.5 * l1, 0), 1), sig = 1 / (1 + exp(-c)), cw = n->gs * n->wt[r];
    o->ce[r] = -log(p[n->lab[r]]), o->l1[r] = l1;
    o->bce[r] = fmax(c, 0) - c * y + log1p(exp(-fabs(c)));
    o->dconf[r] = cw * n->aconf * (sig - y);
    for (int64_t v = 0; v < n->V; v++) {
      double s = (p[v] > q[v]) - (p[v] < q[v]);
      g[v] = cw * (n->ace * (p[v] - (v == n->lab[r])) + n->al1 * p[v] * (s - a));
      for (int64_t k = 0; k < n->H; k++) o->dh[r * n->H + k] += g[v] * n->w[v * n->H + k];
      for (int64_t k = 0; k < n->r; k++) {
        o->du[r * n->r + k] += g[v] * n->w2[v * n->r + k];
        o->dw2[v * n->r + k] += g[v] * n->u[r * n->r + k];
      }
    }
  }
  free(p), free(q), free(g);
}

static float *to_f32(const double *x, int64_t n) {
  float *y = malloc(4 * (size_t)n);
  for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
  return y;
}

// 700 rows (15 blocks, several tiles and waves per chunk), skipped rows across block, tile and chunk borders,
// every thread count up to 4: against the naive double reference; dw2 bitwise across thread counts.
Test(lmhead_dspark, many_tiles_match_naive_reference, .timeout = 120) {
  enum { R = 700, H = 8, V = 97, RK = 3 };
  float *x = malloc(4 * R * H), *w = malloc(4 * V * H), *u = malloc(4 * R * RK), *w2 = malloc(4 * V * RK);
  float *xt = malloc(4 * R * H), *wt = malloc(4 * R), *conf = malloc(4 * R);
  int32_t *lab = malloc(4 * R);
  df_test_fill_uniform(x, R * H, 31, -2, 2), df_test_fill_uniform(w, V * H, 32, -1, 1);
  df_test_fill_uniform(u, R * RK, 33, -1, 1), df_test_fill_uniform(w2, V * RK, 34, -1, 1);
  df_test_fill_uniform(xt, R * H, 35, -2, 2), df_test_fill_uniform(wt, R, 36, 0, 2);
  df_test_fill_uniform(conf, R, 37, -3, 3);
  for (int r = 0; r < R; r++) lab[r] = (r % 9 == 4 || (r >= 250 && r < 270)) ? -1 : (r * 37) % V;
  naive_in ni = {R, H, V, RK, x, w, u, w2, xt, wt, conf, lab, 0.25, 0.1, 0.9, 1.0};
  naive_out no = {malloc(8 * R),      malloc(8 * R),      malloc(8 * R), malloc(8 * R * H),
                  malloc(8 * R * RK), malloc(8 * V * RK), malloc(8 * R)};
  naive(&ni, &no);
  float *wce = to_f32(no.ce, R), *wl1 = to_f32(no.l1, R), *wbce = to_f32(no.bce, R), *wdh = to_f32(no.dh, R * H);
  float *wdu = to_f32(no.du, R * RK), *wdw2 = to_f32(no.dw2, V * RK), *wdc = to_f32(no.dconf, R);
  dcase c = {.hidden = df_f32(x, R, H),
             .head = df_f32(w, V, H),
             .u = df_f32(u, R, RK),
             .w2 = df_f32(w2, V, RK),
             .teacher = df_f32(xt, R, H),
             .labels = df_i32(lab, R),
             .weights = df_f32(wt, R),
             .conf = df_f32(conf, R),
             .has_u = true,
             .has_t = true,
             .has_c = true,
             .has_w = true,
             .d = {.grad_scale = 0.25f, .alpha_ce = 0.1f, .alpha_l1 = 0.9f, .alpha_conf = 1.0f},
             .R = R,
             .H = H,
             .V = V,
             .r = RK};
  douts o = outs_alloc(&c), o1 = outs_alloc(&c);
  const int64_t chunks[] = {0, 255, 300};
  for (int k = 0; k < 3; k++)
    for (int t = 1; t <= 4; t++) {
      df_ctx *ctx = df_test_cpu_ctx(t);
      run(ctx, &c, chunks[k], true, &o);
      df_ctx_destroy(ctx);
      df_expect_close("ce", o.ce, wce, R, 1e-6, 1e-6);
      df_expect_close("l1", o.l1, wl1, R, 1e-6, 1e-6);
      df_expect_close("bce", o.bce, wbce, R, 1e-6, 1e-6);
      df_expect_close("dhidden", o.dh, wdh, R * H, 1e-5, 1e-8);
      df_expect_close("du", o.du, wdu, R * RK, 1e-5, 1e-8);
      df_expect_close("dw2", o.dw2, wdw2, V * RK, 1e-5, 1e-8);
      df_expect_close("dconf", o.dconf, wdc, R, 1e-5, 1e-8);
      if (t == 1) memcpy(o1.dw2, o.dw2, 4 * V * RK);
      cr_expect(!memcmp(o1.dw2, o.dw2, 4 * V * RK), "dw2 bitwise, chunk %lld, %d threads", (long long)chunks[k], t);
    }
  outs_free(&o), outs_free(&o1);
  free(wce), free(wl1), free(wbce), free(wdh), free(wdu), free(wdw2), free(wdc);
  free(no.ce), free(no.l1), free(no.bce), free(no.dh), free(no.du), free(no.dw2), free(no.dconf);
  free(x), free(w), free(u), free(w2), free(xt), free(wt), free(conf), free(lab);
}

// ---- argument errors -----------------------------------------------------------------------------------------

typedef struct {
  float x[6], w[12], u[4], w2[8], xt[6], conf[2], ce[2], dh[6], du[4], dw2[8], dconf[2];
  int32_t lab[2];
  uint8_t cor[2];
  df_tensor tx, tw, tu, tw2, txt, tconf, tlab, tce, tcor, tdh, tdu, tdw2, tdconf;
  df_lmhead_dspark_in in;
  df_lmhead_dspark_out out;
  df_lmhead_dspark_desc d;
} bad_args;

static void bad_init(bad_args *b) {
  memset(b, 0, sizeof *b);
  b->lab[0] = 1, b->lab[1] = 3, b->ce[0] = b->ce[1] = 42.0f;
  b->tx = df_f32(b->x, 2, 3), b->tw = df_f32(b->w, 4, 3), b->tu = df_f32(b->u, 2, 2), b->tw2 = df_f32(b->w2, 4, 2);
  b->txt = df_f32(b->xt, 2, 3), b->tconf = df_f32(b->conf, 2), b->tlab = df_i32(b->lab, 2);
  b->tce = df_f32(b->ce, 2), b->tcor = df_u8(b->cor, 2), b->tdh = df_f32(b->dh, 2, 3), b->tdu = df_f32(b->du, 2, 2);
  b->tdw2 = df_f32(b->dw2, 4, 2), b->tdconf = df_f32(b->dconf, 2);
  b->in = (df_lmhead_dspark_in){&b->tx, &b->tw, &b->tu, &b->tw2, &b->txt, &b->tlab, NULL, &b->tconf};
  b->out = (df_lmhead_dspark_out){
      .ce = &b->tce, .correct = &b->tcor, .dhidden = &b->tdh, .du = &b->tdu, .dw2 = &b->tdw2, .dconf = &b->tdconf};
  b->d = (df_lmhead_dspark_desc){.grad_scale = 1, .alpha_ce = 0.1f, .alpha_l1 = 0.9f, .alpha_conf = 1};
}

static void expect_bad(df_ctx *ctx, bad_args *b, const char *where) {
  df_error err = {0};
  cr_expect_eq(df_lmhead_dspark(ctx, &b->d, &b->in, &b->out, &err), DF_ERR_INVALID, "expected a failure naming %s",
               where);
  cr_expect_str_eq(err.where, where);
  cr_expect(b->ce[0] == 42.0f && b->ce[1] == 42.0f, "nothing written when '%s' is bad", where);
}

Test(lmhead_dspark, rejects_bad_arguments) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  bad_args b;
  bad_init(&b);
  df_error err = {0};
  DF_ASSERT_OK(df_lmhead_dspark(ctx, &b.d, &b.in, &b.out, &err), &err);
  bad_init(&b), b.lab[1] = 4;
  expect_bad(ctx, &b, "labels");
  bad_init(&b), b.in.teacher = NULL;
  expect_bad(ctx, &b, "teacher"); // the L1 term needs it
  bad_init(&b), b.in.teacher = NULL, b.in.conf = NULL, b.out.dconf = NULL, b.d.alpha_l1 = 0;
  DF_ASSERT_OK(df_lmhead_dspark(ctx, &b.d, &b.in, &b.out, &err), &err); // CE only is fine
  bad_init(&b), b.in.markov_w2 = NULL;
  expect_bad(ctx, &b, "markov_w2");
  bad_init(&b), b.in.markov_u = NULL;
  expect_bad(ctx, &b, "markov_u");
  bad_init(&b), b.tw2 = df_f32(b.w2, 2, 4);
  expect_bad(ctx, &b, "markov_w2");
  bad_init(&b), b.tu = df_f32(b.u, 4);
  expect_bad(ctx, &b, "markov_u");
  bad_init(&b), b.out.dw2 = NULL;
  expect_bad(ctx, &b, "dw2");
  bad_init(&b), b.out.dconf = NULL;
  expect_bad(ctx, &b, "dconf");
  bad_init(&b), b.txt = df_f32(b.xt, 3, 2);
  expect_bad(ctx, &b, "teacher");
  bad_init(&b), b.d.alpha_l1 = -1;
  expect_bad(ctx, &b, "alpha_l1");
  bad_init(&b), b.d.grad_scale = INFINITY;
  expect_bad(ctx, &b, "grad_scale");
  bad_init(&b), b.tce = df_f32(b.ce, 1);
  cr_expect_eq(df_lmhead_dspark(ctx, &b.d, &b.in, &b.out, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "ce");
  df_ctx_destroy(ctx);
}
