// Block-masked (DFlash) attention: PyTorch golden data (forward, lse, dq, dk, dv), finite differences,
// thread-count independence, dropped blocks and argument errors.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

// Tolerances vs the float64 reference: fp32 tile GEMMs over <= ~530 keys and a ~2-ulp exp give measured
// errors of at most 3e-7 relative to the largest value (1.2e-7..9.5e-7 absolute); 4e-6·max|ref| + 4e-7 leaves
// ~8x headroom for other BLAS kernels and still catches a key wrongly seen or hidden (an O(0.1) change).
#define RTOL 4e-6
#define ATOL 4e-7

typedef struct {
  df_block_attn_desc desc;
  int64_t B, N, bs, S, nH, nKV, hd;
} attn_shape;

static int64_t nq(const attn_shape *s) { return s->B * s->N * s->bs * s->nH * s->hd; }
static int64_t nk(const attn_shape *s) { return s->B * (s->S + s->N * s->bs) * s->nKV * s->hd; }
static int64_t nlse(const attn_shape *s) { return s->B * s->nH * s->N * s->bs; }

// Contiguous views over caller buffers for one shape.
typedef struct {
  df_tensor q, k, v, anchors, keep, out, lse, dout, dq, dk, dv;
} attn_views;

static attn_views make_views(const attn_shape *s, float *q, float *k, float *v, int32_t *anchors, uint8_t *keep,
                             float *out, float *lse, float *dout, float *dq, float *dk, float *dv) {
  int64_t Q = s->N * s->bs, KV = s->S + s->N * s->bs;
  return (attn_views){.q = df_f32(q, s->B, Q, s->nH, s->hd),
                      .k = df_f32(k, s->B, KV, s->nKV, s->hd),
                      .v = df_f32(v, s->B, KV, s->nKV, s->hd),
                      .anchors = df_i32(anchors, s->B, s->N),
                      .keep = df_u8(keep, s->B, s->N),
                      .out = df_f32(out, s->B, Q, s->nH, s->hd),
                      .lse = df_f32(lse, s->B, s->nH, Q),
                      .dout = df_f32(dout, s->B, Q, s->nH, s->hd),
                      .dq = df_f32(dq, s->B, Q, s->nH, s->hd),
                      .dk = df_f32(dk, s->B, KV, s->nKV, s->hd),
                      .dv = df_f32(dv, s->B, KV, s->nKV, s->hd)};
}

static df_status run_forward(df_ctx *ctx, const attn_shape *s, attn_views *t, df_error *err) {
  return df_block_attn_forward(ctx, &s->desc, &t->q, &t->k, &t->v, &t->anchors, &t->keep, &t->out, &t->lse, err);
}

static df_status run_backward(df_ctx *ctx, const attn_shape *s, attn_views *t, df_error *err) {
  return df_block_attn_backward(ctx, &s->desc, &t->q, &t->k, &t->v, &t->anchors, &t->keep, &t->out, &t->lse, &t->dout,
                                &t->dq, &t->dk, &t->dv, err);
}

// lse: −inf exactly where the reference has −inf (rows that see nothing), close elsewhere.
static void expect_lse(const float *got, const float *want, int64_t n) {
  float *g = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    bool want_empty = isinf(want[i]) && want[i] < 0;
    cr_expect_eq(isinf(got[i]) && got[i] < 0, want_empty, "lse[%lld] = %g, want %g", (long long)i, got[i], want[i]);
    g[i] = want_empty ? 0.0f : got[i];
    w[i] = want_empty ? 0.0f : want[i];
  }
  df_expect_close("lse", g, w, n, RTOL, ATOL);
  free(g), free(w);
}

static attn_shape fixture_shape(const fx_file *f) {
  const fx_tensor *q = fx_get(f, "q"), *k = fx_get(f, "k"), *a = fx_get(f, "anchors");
  attn_shape s = {.desc = {.context_len = (int64_t)fx_meta(f, "context_len"),
                           .block_size = (int64_t)fx_meta(f, "block_size"),
                           .window = (int64_t)fx_meta(f, "window"),
                           .scale = (float)fx_meta(f, "scale")},
                  .B = q->shape[0],
                  .N = a->shape[1],
                  .nH = q->shape[2],
                  .nKV = k->shape[2],
                  .hd = q->shape[3]};
  s.bs = s.desc.block_size, s.S = s.desc.context_len;
  return s;
}

static void check_golden(const char *file, int threads) {
  fx_file *f = fx_load(file);
  attn_shape s = fixture_shape(f);
  df_ctx *ctx = df_test_cpu_ctx(threads);
  df_error err = {0};
  float *out = malloc(sizeof(float) * (size_t)nq(&s)), *lse = malloc(sizeof(float) * (size_t)nlse(&s));
  float *dq = malloc(sizeof(float) * (size_t)nq(&s)), *dk = malloc(sizeof(float) * (size_t)nk(&s)),
        *dv = malloc(sizeof(float) * (size_t)nk(&s));
  // NaN poison: every element must be written, including rows of dropped blocks.
  memset(out, 0xff, sizeof(float) * (size_t)nq(&s)), memset(dq, 0xff, sizeof(float) * (size_t)nq(&s));
  memset(dk, 0xff, sizeof(float) * (size_t)nk(&s)), memset(dv, 0xff, sizeof(float) * (size_t)nk(&s));
  attn_views t =
      make_views(&s, fx_get(f, "q")->data, fx_get(f, "k")->data, fx_get(f, "v")->data, fx_get(f, "anchors")->data,
                 fx_get(f, "keep")->data, out, lse, fx_get(f, "dout")->data, dq, dk, dv);
  DF_ASSERT_OK(run_forward(ctx, &s, &t, &err), &err);
  df_expect_close("out", out, fx_get(f, "out")->data, nq(&s), RTOL, ATOL);
  expect_lse(lse, fx_get(f, "lse")->data, nlse(&s));
  // The backward reads the reference out and lse, so its check does not depend on the forward's.
  t.out = fx_view(f, "out"), t.lse = fx_view(f, "lse");
  DF_ASSERT_OK(run_backward(ctx, &s, &t, &err), &err);
  df_expect_close("dq", dq, fx_get(f, "dq")->data, nq(&s), RTOL, ATOL);
  df_expect_close("dk", dk, fx_get(f, "dk")->data, nk(&s), RTOL, ATOL);
  df_expect_close("dv", dv, fx_get(f, "dv")->data, nk(&s), RTOL, ATOL);
  free(out), free(lse), free(dq), free(dk), free(dv);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(attention, golden_gqa_full) { check_golden("kernels/attention_full.safetensors", 2); }
Test(attention, golden_mqa_window3) { check_golden("kernels/attention_window.safetensors", 2); }
Test(attention, golden_mha_window6) { check_golden("kernels/attention_mha.safetensors", 2); }
Test(attention, golden_long_context) { check_golden("kernels/attention_long.safetensors", 2); }
Test(attention, golden_long_window) { check_golden("kernels/attention_long_window.safetensors", 2); }
Test(attention, golden_single_thread) { check_golden("kernels/attention_long.safetensors", 1); }

// Dropped blocks: output rows exactly 0, lse −inf, no gradient; their anchors may hold anything.
Test(attention, dropped_blocks_are_zero_and_ignore_their_anchor) {
  fx_file *f = fx_load("kernels/attention_window.safetensors");
  attn_shape s = fixture_shape(f);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  int32_t anchors[8];
  uint8_t *keep = fx_get(f, "keep")->data;
  memcpy(anchors, fx_get(f, "anchors")->data, sizeof anchors);
  cr_assert_eq(s.B * s.N, 8);
  cr_assert_eq(keep[5], 0, "the fixture drops block [1,1]");
  anchors[5] = 1000000; // out of range, but the block is dropped
  float *out = malloc(sizeof(float) * (size_t)nq(&s)), *lse = malloc(sizeof(float) * (size_t)nlse(&s));
  float *dq = malloc(sizeof(float) * (size_t)nq(&s)), *dk = malloc(sizeof(float) * (size_t)nk(&s)),
        *dv = malloc(sizeof(float) * (size_t)nk(&s));
  attn_views t = make_views(&s, fx_get(f, "q")->data, fx_get(f, "k")->data, fx_get(f, "v")->data, anchors, keep, out,
                            lse, fx_get(f, "dout")->data, dq, dk, dv);
  DF_ASSERT_OK(run_forward(ctx, &s, &t, &err), &err);
  DF_ASSERT_OK(run_backward(ctx, &s, &t, &err), &err);
  df_expect_close("out", out, fx_get(f, "out")->data, nq(&s), RTOL, ATOL);
  int64_t row = s.nH * s.hd, Q = s.N * s.bs, KV = s.S + Q;
  for (int64_t o = 0; o < s.bs; o++) {
    int64_t tok = 1 * Q + 1 * s.bs + o; // sample 1, block 1
    for (int64_t i = 0; i < row; i++) {
      cr_expect_eq(out[tok * row + i], 0.0f, "out of a dropped block");
      cr_expect_eq(dq[tok * row + i], 0.0f, "dq of a dropped block");
    }
    for (int64_t h = 0; h < s.nH; h++)
      cr_expect_eq(lse[(1 * s.nH + h) * Q + s.bs + o], -INFINITY, "lse of a dropped row");
    int64_t key = 1 * KV + s.S + 1 * s.bs + o; // the dropped block's own keys get no gradient
    for (int64_t i = 0; i < s.nKV * s.hd; i++) {
      cr_expect_eq(dk[key * s.nKV * s.hd + i], 0.0f, "dk of a dropped block's keys");
      cr_expect_eq(dv[key * s.nKV * s.hd + i], 0.0f, "dv of a dropped block's keys");
    }
  }
  free(out), free(lse), free(dq), free(dk), free(dv);
  df_ctx_destroy(ctx);
  fx_free(f);
}

// ---------------------------------------------------------------------------------------------
// Finite differences of the probe loss Σ r·out, accumulated in double, on a tiny shape.

typedef struct {
  df_ctx *ctx;
  attn_shape s;
  attn_views t;
  const float *r;
} attn_probe;

static double attn_probe_loss(void *p) {
  attn_probe *ap = p;
  df_error err = {0};
  cr_assert_eq(run_forward(ap->ctx, &ap->s, &ap->t, &err), DF_OK, "%s", err.msg);
  const float *out = ap->t.out.data;
  double sum = 0.0;
  for (int64_t i = 0; i < nq(&ap->s); i++) sum += (double)ap->r[i] * out[i];
  return sum;
}

static void check_finite_differences(int64_t window) {
  enum { B = 1, N = 2, BS = 3, S = 5, NH = 2, NKV = 1, HD = 4, Q = N * BS, KV = S + Q };
  float q[B * Q * NH * HD], k[B * KV * NKV * HD], v[B * KV * NKV * HD], r[B * Q * NH * HD];
  float out[B * Q * NH * HD], lse[B * NH * Q], dq[B * Q * NH * HD], dk[B * KV * NKV * HD], dv[B * KV * NKV * HD];
  int32_t anchors[B * N] = {2, 4};
  uint8_t keep[B * N] = {1, 1};
  df_test_fill_uniform(q, B * Q * NH * HD, 11, -1, 1);
  df_test_fill_uniform(k, B * KV * NKV * HD, 12, -1, 1);
  df_test_fill_uniform(v, B * KV * NKV * HD, 13, -1, 1);
  df_test_fill_uniform(r, B * Q * NH * HD, 14, -1, 1);
  attn_probe ap = {.ctx = df_test_cpu_ctx(1),
                   .s = {.desc = {.context_len = S, .block_size = BS, .window = window, .scale = 0.7f},
                         .B = B,
                         .N = N,
                         .bs = BS,
                         .S = S,
                         .nH = NH,
                         .nKV = NKV,
                         .hd = HD},
                   .r = r};
  ap.t = make_views(&ap.s, q, k, v, anchors, keep, out, lse, r, dq, dk, dv); // dout = r: the probe's gradient
  df_error err = {0};
  DF_ASSERT_OK(run_forward(ap.ctx, &ap.s, &ap.t, &err), &err);
  DF_ASSERT_OK(run_backward(ap.ctx, &ap.s, &ap.t, &err), &err);
  // Central differences with h = 1e-2 in fp32: truncation h²·f‴/6 and rounding ε·|f|/h give ~1e-5 here (measured
  // max 1e-5); a missing term or scale in a gradient is off by O(0.01–0.1).
  df_fd_check("dq", q, dq, B * Q * NH * HD, attn_probe_loss, &ap, 1e-2, 2e-4, 5e-5, 48);
  df_fd_check("dk", k, dk, B * KV * NKV * HD, attn_probe_loss, &ap, 1e-2, 2e-4, 5e-5, 48);
  df_fd_check("dv", v, dv, B * KV * NKV * HD, attn_probe_loss, &ap, 1e-2, 2e-4, 5e-5, 48);
  df_ctx_destroy(ap.ctx);
}

Test(attention, finite_differences_full) { check_finite_differences(0); }
Test(attention, finite_differences_window2) { check_finite_differences(2); }

// ---------------------------------------------------------------------------------------------
// The backward's shared context dk/dv go through a fixed partition: the bits do not depend on the threads.

Test(attention, results_independent_of_thread_count) {
  attn_shape s = {.desc = {.context_len = 300, .block_size = 4, .window = 0, .scale = 0.25f},
                  .B = 1,
                  .N = 24,
                  .bs = 4,
                  .S = 300,
                  .nH = 4,
                  .nKV = 2,
                  .hd = 16};
  int32_t anchors[24];
  uint8_t keep[24];
  for (int n = 0; n < 24; n++) anchors[n] = n * 12 + (n % 3), keep[n] = n % 7 != 3;
  float *q = malloc(sizeof(float) * (size_t)nq(&s)), *k = malloc(sizeof(float) * (size_t)nk(&s)),
        *v = malloc(sizeof(float) * (size_t)nk(&s)), *dout = malloc(sizeof(float) * (size_t)nq(&s));
  df_test_fill_uniform(q, nq(&s), 21, -1, 1), df_test_fill_uniform(k, nk(&s), 22, -1, 1);
  df_test_fill_uniform(v, nk(&s), 23, -1, 1), df_test_fill_uniform(dout, nq(&s), 24, -1, 1);
  float *res[3][5];
  int threads[3] = {1, 2, 3};
  for (int ti = 0; ti < 3; ti++) {
    float **o = res[ti];
    o[0] = malloc(sizeof(float) * (size_t)nq(&s)), o[1] = malloc(sizeof(float) * (size_t)nlse(&s));
    o[2] = malloc(sizeof(float) * (size_t)nq(&s)), o[3] = malloc(sizeof(float) * (size_t)nk(&s));
    o[4] = malloc(sizeof(float) * (size_t)nk(&s));
    df_ctx *ctx = df_test_cpu_ctx(threads[ti]);
    df_error err = {0};
    attn_views t = make_views(&s, q, k, v, anchors, keep, o[0], o[1], dout, o[2], o[3], o[4]);
    DF_ASSERT_OK(run_forward(ctx, &s, &t, &err), &err);
    DF_ASSERT_OK(run_backward(ctx, &s, &t, &err), &err);
    df_ctx_destroy(ctx);
  }
  const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
  int64_t sizes[5] = {nq(&s), nlse(&s), nq(&s), nk(&s), nk(&s)};
  for (int ti = 1; ti < 3; ti++)
    for (int x = 0; x < 5; x++)
      cr_expect(!memcmp(res[0][x], res[ti][x], sizeof(float) * (size_t)sizes[x]), "%s differs between 1 and %d threads",
                names[x], threads[ti]);
  for (int ti = 0; ti < 3; ti++)
    for (int x = 0; x < 5; x++) free(res[ti][x]);
  free(q), free(k), free(v), free(dout);
}

// ---------------------------------------------------------------------------------------------
// Argument errors name the argument, and nothing is written.

typedef struct {
  attn_shape s;
  float q[2 * 8 * 4 * 4], k[2 * 14 * 2 * 4], v[2 * 14 * 2 * 4], out[2 * 8 * 4 * 4], lse[2 * 4 * 8];
  float dout[2 * 8 * 4 * 4], dq[2 * 8 * 4 * 4], dk[2 * 14 * 2 * 4], dv[2 * 14 * 2 * 4];
  int32_t anchors[4];
  uint8_t keep[4];
  attn_views t;
} bad_case;

// B = 2, N = 2, bs = 4, S = 6, nH = 4, nKV = 2, hd = 4; valid until a test breaks one thing.
static void bad_case_init(bad_case *c) {
  memset(c, 0, sizeof *c);
  c->s = (attn_shape){.desc = {.context_len = 6, .block_size = 4, .window = 0, .scale = 0.5f},
                      .B = 2,
                      .N = 2,
                      .bs = 4,
                      .S = 6,
                      .nH = 4,
                      .nKV = 2,
                      .hd = 4};
  int32_t a[4] = {0, 3, 2, 5};
  for (int i = 0; i < 4; i++) c->anchors[i] = a[i], c->keep[i] = 1;
  for (size_t i = 0; i < sizeof c->out / sizeof(float); i++) c->out[i] = 7.0f, c->dq[i] = 7.0f;
  c->t = make_views(&c->s, c->q, c->k, c->v, c->anchors, c->keep, c->out, c->lse, c->dout, c->dq, c->dk, c->dv);
}

static void expect_fwd_error(bad_case *c, const char *where) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  cr_expect_eq(run_forward(ctx, &c->s, &c->t, &err), DF_ERR_INVALID, "forward accepted a bad '%s'", where);
  cr_expect_str_eq(err.where, where, "the error names '%s' (got '%s': %s)", where, err.where, err.msg);
  err = (df_error){0};
  cr_expect_eq(run_backward(ctx, &c->s, &c->t, &err), DF_ERR_INVALID, "backward accepted a bad '%s'", where);
  cr_expect_str_eq(err.where, where, "the error names '%s' (got '%s': %s)", where, err.where, err.msg);
  for (size_t i = 0; i < sizeof c->out / sizeof(float); i++) {
    cr_expect_eq(c->out[i], 7.0f, "out was written on failure");
    cr_expect_eq(c->dq[i], 7.0f, "dq was written on failure");
  }
  df_ctx_destroy(ctx);
}

Test(attention, valid_bad_case_is_accepted) {
  bad_case c;
  bad_case_init(&c);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  DF_ASSERT_OK(run_forward(ctx, &c.s, &c.t, &err), &err);
  DF_ASSERT_OK(run_backward(ctx, &c.s, &c.t, &err), &err);
  df_ctx_destroy(ctx);
}

Test(attention, rejects_anchor_out_of_range) {
  bad_case c;
  bad_case_init(&c);
  c.anchors[3] = 6; // == S
  expect_fwd_error(&c, "anchors[1,1]");
  bad_case_init(&c);
  c.anchors[2] = -1;
  expect_fwd_error(&c, "anchors[1,0]");
}

Test(attention, rejects_heads_not_divisible) {
  bad_case c;
  bad_case_init(&c);
  c.t.q = df_f32(c.q, 2, 8, 3, 4); // 3 query heads over 2 kv heads
  expect_fwd_error(&c, "k");
}

Test(attention, rejects_wrong_shapes) {
  bad_case c;
  bad_case_init(&c);
  c.t.q = df_f32(c.q, 2, 7, 4, 4); // N·bs = 8 rows expected
  expect_fwd_error(&c, "q");
  bad_case_init(&c);
  c.t.v = df_f32(c.v, 2, 14, 2, 2); // head dim differs from q
  expect_fwd_error(&c, "v");
  bad_case_init(&c);
  c.t.k = df_f32(c.k, 2, 13, 2, 4); // S + N·bs = 14 rows expected
  expect_fwd_error(&c, "k");
  bad_case_init(&c);
  c.t.keep = df_u8(c.keep, 2, 1);
  expect_fwd_error(&c, "keep");
  bad_case_init(&c);
  c.t.out = df_f32(c.out, 2, 8, 4, 2);
  expect_fwd_error(&c, "out");
  bad_case_init(&c);
  c.t.lse = df_f32(c.lse, 2, 8, 4); // [B, nH, N·bs] expected
  expect_fwd_error(&c, "lse");
  bad_case_init(&c);
  c.t.anchors = df_f32(c.anchors, 2, 2); // i32 expected
  expect_fwd_error(&c, "anchors");
}

Test(attention, rejects_bad_desc) {
  bad_case c;
  bad_case_init(&c);
  c.s.desc.block_size = 0;
  expect_fwd_error(&c, "desc.block_size");
  bad_case_init(&c);
  c.s.desc.window = -1;
  expect_fwd_error(&c, "desc.window");
  bad_case_init(&c);
  c.s.desc.context_len = 5; // k has 14 = 6 + 8 rows
  expect_fwd_error(&c, "k");
}

Test(attention, backward_rejects_bad_gradients) {
  bad_case c;
  bad_case_init(&c);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  struct {
    df_tensor *t;
    df_tensor bad;
    const char *name;
  } cases[] = {{&c.t.dout, df_f32(c.dout, 2, 8, 2, 8), "dout"},
               {&c.t.dq, df_f32(c.dq, 2, 8, 4, 2), "dq"},
               {&c.t.dk, df_f32(c.dk, 2, 14, 1, 8), "dk"},
               {&c.t.dv, df_f32(c.dv, 2, 13, 2, 4), "dv"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    df_tensor keep = *cases[i].t;
    *cases[i].t = cases[i].bad;
    cr_expect_eq(run_backward(ctx, &c.s, &c.t, &err), DF_ERR_INVALID, "backward accepted a bad '%s'", cases[i].name);
    cr_expect_str_eq(err.where, cases[i].name);
    *cases[i].t = keep;
  }
  for (size_t i = 0; i < sizeof c.dq / sizeof(float); i++) cr_expect_eq(c.dq[i], 7.0f, "dq was written on failure");
  df_ctx_destroy(ctx);
}

// No anchors at all (N = 0): nothing to attend, and every key gradient is written as 0.
Test(attention, no_anchors_writes_zero_key_gradients) {
  attn_shape s = {.desc = {.context_len = 5, .block_size = 4, .window = 0, .scale = 0.5f},
                  .B = 1,
                  .N = 0,
                  .bs = 4,
                  .S = 5,
                  .nH = 2,
                  .nKV = 1,
                  .hd = 4};
  float k[20], v[20], dk[20], dv[20], one = 0.0f;
  df_test_fill_uniform(k, 20, 31, -1, 1), df_test_fill_uniform(v, 20, 32, -1, 1);
  for (int i = 0; i < 20; i++) dk[i] = dv[i] = NAN;
  int32_t a = 0;
  uint8_t kp = 1;
  attn_views t = make_views(&s, &one, k, v, &a, &kp, &one, &one, &one, &one, dk, dv);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  DF_ASSERT_OK(run_forward(ctx, &s, &t, &err), &err);
  DF_ASSERT_OK(run_backward(ctx, &s, &t, &err), &err);
  for (int i = 0; i < 20; i++) cr_expect(dk[i] == 0.0f && dv[i] == 0.0f, "key gradient %d not zeroed", i);
  df_ctx_destroy(ctx);
}
