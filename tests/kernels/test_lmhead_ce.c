// Fused LM head + cross-entropy: PyTorch golden data for every chunking and thread count, bitwise
// chunk/thread invariance, a naive double reference over many tiles, finite differences, argument errors.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/vexp.h"
#include "tests/common/fixture.h"

// Tolerances (fp32 op vs float64 torch on the same fp32 inputs). The logits carry the fp32 GEMM rounding,
// ~sqrt(H)·2^-24·Σ|h_k·w_k| (≲ 1e−5 where logits reach ±60 in case c); loss = lse − z_label inherits about
// twice that: 5e−7 of max|loss| (≤ 110) + 2e−6 (observed: 1.1e−5 of 5.7e−5 allowed in case c, 4.8e−7 of 6e−6
// in case a). dhidden = grad_scale·w·(softmax − onehot)·head sums V terms of relative error ~1e−6: 3e−6 of
// max|dh| (observed 6e−7 relative).
#define LOSS_RTOL 5e-7
#define LOSS_ATOL 2e-6
#define DH_RTOL   3e-6
#define DH_ATOL   1e-7

typedef struct {
  fx_file *f;
  df_tensor hidden, head, labels, weights;
  bool has_w;
  float grad_scale;
  int64_t R, H, V;
} ce_case;

static ce_case load_case(const char *file) {
  ce_case c = {.f = fx_load(file)};
  c.hidden = fx_view(c.f, "hidden");
  c.head = fx_view(c.f, "head");
  c.labels = fx_view(c.f, "labels");
  c.has_w = fx_has(c.f, "weights");
  if (c.has_w) c.weights = fx_view(c.f, "weights");
  c.grad_scale = (float)fx_meta(c.f, "grad_scale");
  c.R = c.hidden.shape[0], c.H = c.hidden.shape[1], c.V = c.head.shape[0];
  return c;
}

// Runs the op with fresh NaN-filled outputs (so anything left unwritten shows); dh may be NULL.
static void run_ce(df_ctx *ctx, const ce_case *c, int64_t chunk, float *loss, uint8_t *correct, float *dh) {
  df_error err = {0};
  for (int64_t i = 0; i < c->R; i++) loss[i] = NAN, correct[i] = 0xAA;
  if (dh)
    for (int64_t i = 0; i < c->R * c->H; i++) dh[i] = NAN;
  df_tensor tl = df_f32(loss, c->R), tc = df_u8(correct, c->R), tdh = df_f32(dh, c->R, c->H);
  df_lmhead_ce_desc d = {.chunk_rows = chunk, .grad_scale = c->grad_scale};
  DF_ASSERT_OK(df_lmhead_ce(ctx, &d, &c->hidden, &c->head, &c->labels, c->has_w ? &c->weights : NULL, &tl, &tc,
                            dh ? &tdh : NULL, &err),
               &err);
}

static void expect_golden(const ce_case *c, const float *loss, const uint8_t *correct, const float *dh) {
  df_expect_close("loss", loss, fx_get(c->f, "loss")->data, c->R, LOSS_RTOL, LOSS_ATOL);
  const uint8_t *want = fx_get(c->f, "correct")->data;
  for (int64_t r = 0; r < c->R; r++) cr_expect_eq(correct[r], want[r], "correct[%lld]", (long long)r);
  if (dh) df_expect_close("dhidden", dh, fx_get(c->f, "dhidden")->data, c->R * c->H, DH_RTOL, DH_ATOL);
  // Ignored rows are exact zeros, not merely small.
  const int32_t *lab = c->labels.data;
  for (int64_t r = 0; r < c->R; r++) {
    if (lab[r] >= 0) continue;
    cr_expect_eq(loss[r], 0.0f, "loss of ignored row %lld", (long long)r);
    for (int64_t k = 0; dh && k < c->H; k++) cr_expect_eq(dh[r * c->H + k], 0.0f, "dhidden of ignored row");
  }
}

// Every chunking (R not a multiple, a multiple, one chunk) and thread count: golden values, and bitwise
// equal to each other because a row's arithmetic never depends on its tile.
static void check_case(const char *file) {
  ce_case c = load_case(file);
  size_t nr = (size_t)c.R, nh = (size_t)(c.R * c.H);
  float *loss0 = malloc(4 * nr), *dh0 = malloc(4 * nh), *loss = malloc(4 * nr), *dh = malloc(4 * nh);
  uint8_t *cor0 = malloc(nr), *cor = malloc(nr);
  df_ctx *ctx1 = df_test_cpu_ctx(1), *ctx2 = df_test_cpu_ctx(2);
  run_ce(ctx1, &c, 0, loss0, cor0, dh0);
  expect_golden(&c, loss0, cor0, dh0);
  const int64_t chunks[] = {0, 4, 7, c.R, 3 * c.R};
  for (int t = 0; t < 2; t++)
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
      run_ce(t ? ctx2 : ctx1, &c, chunks[k], loss, cor, dh);
      expect_golden(&c, loss, cor, dh);
      cr_expect(!memcmp(loss, loss0, 4 * nr), "loss bitwise, chunk %lld threads %d", (long long)chunks[k], t + 1);
      cr_expect(!memcmp(dh, dh0, 4 * nh), "dhidden bitwise, chunk %lld threads %d", (long long)chunks[k], t + 1);
      cr_expect(!memcmp(cor, cor0, nr), "correct, chunk %lld threads %d", (long long)chunks[k], t + 1);
      // Forward only: same loss and correct, bit for bit.
      run_ce(t ? ctx2 : ctx1, &c, chunks[k], loss, cor, NULL);
      cr_expect(!memcmp(loss, loss0, 4 * nr), "forward-only loss, chunk %lld", (long long)chunks[k]);
      cr_expect(!memcmp(cor, cor0, nr), "forward-only correct, chunk %lld", (long long)chunks[k]);
    }
  df_ctx_destroy(ctx1);
  df_ctx_destroy(ctx2);
  free(loss0), free(dh0), free(loss), free(dh), free(cor0), free(cor);
  fx_free(c.f);
}

// Case a: R = 21, H = 24, V = 203, ignored rows, weights, grad_scale 0.37, an exact argmax tie (first wins).
Test(lmhead_ce, golden_ties_weights_ignored) { check_case("kernels/lmhead_ce_a.safetensors"); }
// Case b: no weights (all 1), grad_scale 1, label −100 ignored.
Test(lmhead_ce, golden_unweighted) { check_case("kernels/lmhead_ce_b.safetensors"); }
// Case c: logits up to ±60 (stability of the log-sum-exp), grad_scale 2.5.
Test(lmhead_ce, golden_large_logits) { check_case("kernels/lmhead_ce_c.safetensors"); }

Test(lmhead_ce, first_maximum_wins) {
  // Rows 3 and 4 of case a have head rows 11 and 140 (equal) as their maximum; labels 11 and 140.
  ce_case c = load_case("kernels/lmhead_ce_a.safetensors");
  const int32_t *lab = c.labels.data;
  cr_assert(lab[3] == 11 && lab[4] == 140, "fixture layout changed");
  float loss[21];
  uint8_t cor[21];
  df_ctx *ctx = df_test_cpu_ctx(1);
  run_ce(ctx, &c, 0, loss, cor, NULL);
  cr_expect_eq(cor[3], 1, "the first of two equal maxima is the argmax");
  cr_expect_eq(cor[4], 0, "the second of two equal maxima is not");
  df_ctx_destroy(ctx);
  fx_free(c.f);
}

// Naive double reference: loss, correct, dhidden = grad_scale·w·(softmax − onehot)·head.
static void naive_ce(const float *x, const float *w, const int32_t *lab, const float *wt, float gs, int64_t R,
                     int64_t H, int64_t V, double *loss, uint8_t *cor, double *dh) {
  double *z = malloc(sizeof(double) * (size_t)V);
  for (int64_t r = 0; r < R; r++) {
    double m = -INFINITY, s = 0;
    int64_t am = 0;
    for (int64_t v = 0; v < V; v++) {
      z[v] = 0;
      for (int64_t k = 0; k < H; k++) z[v] += (double)x[r * H + k] * w[v * H + k];
      if (z[v] > m) m = z[v], am = v;
    }
    for (int64_t v = 0; v < V; v++) s += exp(z[v] - m);
    for (int64_t k = 0; k < H; k++) dh[r * H + k] = 0;
    loss[r] = lab[r] < 0 ? 0 : m + log(s) - z[lab[r]];
    cor[r] = lab[r] >= 0 && am == lab[r];
    if (lab[r] < 0) continue;
    for (int64_t v = 0; v < V; v++) {
      double g = gs * wt[r] * (exp(z[v] - m) / s - (v == lab[r]));
      for (int64_t k = 0; k < H; k++) dh[r * H + k] += g * w[v * H + k];
    }
  }
  free(z);
}

// More rows than one tile holds (tiles are at most 256 rows), ignored rows straddling tile and chunk
// borders, every thread count: against the naive double reference.
Test(lmhead_ce, many_tiles_match_naive_reference) {
  enum { R = 700, H = 8, V = 97 };
  float *x = malloc(4 * R * H), *w = malloc(4 * V * H), *wt = malloc(4 * R), *loss = malloc(4 * R),
        *dh = malloc(4 * R * H), *lossf = malloc(4 * R), *dhf = malloc(4 * R * H), *dhw = malloc(4 * R * H);
  double *rl = malloc(8 * R), *rdh = malloc(8 * R * H);
  float wantl[R];
  int32_t lab[R];
  uint8_t cor[R], rc[R];
  df_test_fill_uniform(x, R * H, 11, -2, 2);
  df_test_fill_uniform(w, V * H, 12, -1, 1);
  df_test_fill_uniform(wt, R, 13, 0, 2);
  for (int r = 0; r < R; r++) lab[r] = (r % 9 == 4 || (r >= 250 && r < 270)) ? -1 : (r * 37) % V;
  naive_ce(x, w, lab, wt, 0.25f, R, H, V, rl, rc, rdh);
  for (int i = 0; i < R; i++) wantl[i] = (float)rl[i];
  for (int i = 0; i < R * H; i++) dhw[i] = (float)rdh[i];
  df_tensor tx = df_f32(x, R, H), tw = df_f32(w, V, H), tlab = df_i32(lab, R), twt = df_f32(wt, R);
  df_tensor tl = df_f32(loss, R), tc = df_u8(cor, R), tdh = df_f32(dh, R, H);
  df_error err = {0};
  const int64_t chunks[] = {0, 255, 256, 300};
  for (int t = 1; t <= 2; t++) {
    df_ctx *ctx = df_test_cpu_ctx(t);
    for (int k = 0; k < 4; k++) {
      df_lmhead_ce_desc d = {.chunk_rows = chunks[k], .grad_scale = 0.25f};
      DF_ASSERT_OK(df_lmhead_ce(ctx, &d, &tx, &tw, &tlab, &twt, &tl, &tc, &tdh, &err), &err);
      df_expect_close("loss", loss, wantl, R, 1e-6, 1e-6);
      df_expect_close("dhidden", dh, dhw, R * H, 1e-5, 1e-7);
      cr_expect(!memcmp(cor, rc, R), "correct, chunk %lld threads %d", (long long)chunks[k], t);
      if (t == 1 && k == 0) memcpy(lossf, loss, 4 * R), memcpy(dhf, dh, 4 * R * H);
      cr_expect(!memcmp(loss, lossf, 4 * R) && !memcmp(dh, dhf, 4 * R * H), "bitwise, chunk %lld threads %d",
                (long long)chunks[k], t);
    }
    df_ctx_destroy(ctx);
  }
  free(x), free(w), free(wt), free(loss), free(dh), free(lossf), free(dhf), free(dhw), free(rl), free(rdh);
}

// Probe: Σ grad_scale · w · loss from the forward op, in double.
typedef struct {
  df_ctx *ctx;
  df_tensor x, w, lab, wt, loss, cor;
  float gs;
  int64_t R;
} ce_probe;

static double ce_probe_loss(void *p) {
  ce_probe *cp = p;
  df_error err = {0};
  df_lmhead_ce_desc d = {.chunk_rows = 2, .grad_scale = cp->gs};
  df_lmhead_ce(cp->ctx, &d, &cp->x, &cp->w, &cp->lab, &cp->wt, &cp->loss, &cp->cor, NULL, &err);
  const float *l = cp->loss.data, *wt = cp->wt.data;
  double s = 0;
  for (int64_t r = 0; r < cp->R; r++) s += (double)cp->gs * wt[r] * l[r];
  return s;
}

Test(lmhead_ce, finite_differences) {
  enum { R = 4, H = 5, V = 7 };
  float x[R * H], w[V * H], wt[R] = {0.5f, 2.0f, 1.3f, 0.9f}, loss[R], dh[R * H];
  int32_t lab[R] = {3, -1, 0, 6};
  uint8_t cor[R];
  df_test_fill_uniform(x, R * H, 21, -1, 1);
  df_test_fill_uniform(w, V * H, 22, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  ce_probe cp = {
      ctx, df_f32(x, R, H), df_f32(w, V, H), df_i32(lab, R), df_f32(wt, R), df_f32(loss, R), df_u8(cor, R), 0.7f, R};
  df_tensor tdh = df_f32(dh, R, H);
  df_lmhead_ce_desc d = {.chunk_rows = 0, .grad_scale = cp.gs};
  DF_ASSERT_OK(df_lmhead_ce(ctx, &d, &cp.x, &cp.w, &cp.lab, &cp.wt, &cp.loss, &cp.cor, &tdh, &err), &err);
  // h = 1e−2: truncation ~h²·|f'''| ≲ 1e−5 and fp32 rounding of the probe ~1e−7/h = 1e−5 (observed ≤ 1e−5).
  df_fd_check("dhidden", x, dh, R * H, ce_probe_loss, &cp, 1e-2, 1e-4, 2e-5, 64);
  df_ctx_destroy(ctx);
}

// The vectorizable exp used by the softmax loops: within 2 ulp of libm's exp over [−87, 0] (relative
// error ≤ 2·2⁻²⁴ ≈ 1.2e−7), exact 1 at 0, and clamped (finite, tiny) below.
Test(lmhead_ce, exp_kernel_accuracy) {
  double worst = 0;
  for (int i = 0; i <= 870000; i++) {
    float x = -(float)i * 1e-4f;
    double want = exp((double)x), got = df_exp_nonpos(x);
    worst = fmax(worst, fabs(got - want) / want);
  }
  cr_expect_leq(worst, 1.2e-7, "max relative error %.3g", worst);
  cr_expect_eq(df_exp_nonpos(0.0f), 1.0f);
  cr_expect_eq(df_exp_nonpos(-1000.0f), 0.0f, "exactly 0 below −87");
}

Test(lmhead_ce, no_rows) {
  float w[6] = {0};
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor tx = df_f32(NULL, 0, 3), tw = df_f32(w, 2, 3), tlab = df_i32(NULL, 0), tl = df_f32(NULL, 0),
            tc = df_u8(NULL, 0), tdh = df_f32(NULL, 0, 3);
  df_lmhead_ce_desc d = {.grad_scale = 1};
  DF_ASSERT_OK(df_lmhead_ce(ctx, &d, &tx, &tw, &tlab, NULL, &tl, &tc, &tdh, &err), &err);
  df_ctx_destroy(ctx);
}

// Bad arguments: each call fails with DF_ERR_INVALID naming `where`, and writes nothing.
typedef struct {
  float x[6], w[12], wt[2], loss[2], dh[6];
  int32_t lab[2];
  uint8_t cor[2];
  df_tensor tx, tw, tlab, twt, tl, tc, tdh;
  df_lmhead_ce_desc d;
} bad_args;

static void bad_init(bad_args *b) {
  memset(b, 0, sizeof *b);
  b->lab[0] = 1, b->lab[1] = 3;
  b->loss[0] = b->loss[1] = 42.0f;
  b->tx = df_f32(b->x, 2, 3), b->tw = df_f32(b->w, 4, 3), b->tlab = df_i32(b->lab, 2), b->twt = df_f32(b->wt, 2);
  b->tl = df_f32(b->loss, 2), b->tc = df_u8(b->cor, 2), b->tdh = df_f32(b->dh, 2, 3);
  b->d = (df_lmhead_ce_desc){.chunk_rows = 0, .grad_scale = 1.0f};
}

static void expect_bad(df_ctx *ctx, bad_args *b, const char *where) {
  df_error err = {0};
  cr_expect_eq(df_lmhead_ce(ctx, &b->d, &b->tx, &b->tw, &b->tlab, &b->twt, &b->tl, &b->tc, &b->tdh, &err),
               DF_ERR_INVALID, "expected a failure naming %s", where);
  cr_expect_str_eq(err.where, where);
  cr_expect(b->loss[0] == 42.0f && b->loss[1] == 42.0f, "nothing written when '%s' is bad", where);
}

Test(lmhead_ce, rejects_bad_arguments) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  bad_args b;
  bad_init(&b);
  b.lab[1] = 4; // = V
  expect_bad(ctx, &b, "labels");
  df_error err = {0};
  df_lmhead_ce(ctx, &b.d, &b.tx, &b.tw, &b.tlab, &b.twt, &b.tl, &b.tc, &b.tdh, &err);
  cr_expect(strstr(err.msg, "labels[1] = 4") != NULL, "the message names the row: %s", err.msg);
  bad_init(&b), b.tlab = df_f32(b.lab, 2);
  expect_bad(ctx, &b, "labels");
  bad_init(&b), b.tx = df_f32(b.x, 3, 2);
  expect_bad(ctx, &b, "hidden");
  bad_init(&b), b.tw = df_f32(b.w, 12);
  expect_bad(ctx, &b, "head");
  bad_init(&b), b.twt = df_f32(b.wt, 1);
  expect_bad(ctx, &b, "weights");
  bad_init(&b), b.tl = df_f32(b.loss, 1);
  expect_bad(ctx, &b, "loss");
  bad_init(&b), b.tc = df_f32(b.cor, 2);
  expect_bad(ctx, &b, "correct");
  bad_init(&b), b.tdh = df_f32(b.dh, 2, 2);
  expect_bad(ctx, &b, "dhidden");
  bad_init(&b), b.d.chunk_rows = -1;
  expect_bad(ctx, &b, "chunk_rows");
  bad_init(&b), b.d.grad_scale = NAN;
  expect_bad(ctx, &b, "grad_scale");
  bad_init(&b);
  cr_expect_eq(df_lmhead_ce(ctx, NULL, &b.tx, &b.tw, &b.tlab, &b.twt, &b.tl, &b.tc, &b.tdh, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc");
  df_ctx_destroy(ctx);
}
