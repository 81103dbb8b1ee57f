// The DSpark heads' ops on the CPU: df_copy_2d (exact values for copy and accumulate at offsets and strides; range,
// overlap and stride errors naming the argument), the gated head's gate and the rnn head's cell against their
// definitions evaluated here in double, their backwards against central differences of those definitions, the
// strict fake device giving the CPU's bits, and a table without the slots answering with op and backend.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

// ---- copy_2d ---------------------------------------------------------------------------------------------------

Test(copy_2d, copies_and_accumulates_strided_rows) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  float src[24], dst[30], want[30];
  for (int i = 0; i < 24; i++) src[i] = (float)(i + 1);
  for (int i = 0; i < 30; i++) dst[i] = want[i] = (float)(100 + i);
  // rows 3 of 2 columns: src 5 + i·6, dst 1 + i·10
  df_copy_2d_desc d = {.rows = 3, .cols = 2, .src_offset = 5, .src_stride = 6, .dst_offset = 1, .dst_stride = 10};
  df_tensor ts = df_f32(src, 4, 6), td = df_f32(dst, 3, 10);
  DF_ASSERT_OK(df_copy_2d(ctx, &d, &ts, &td, &err), &err);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) want[1 + i * 10 + j] = src[5 + i * 6 + j];
  for (int i = 0; i < 30; i++) cr_expect_eq(dst[i], want[i], "copy: dst[%d] = %g, want %g", i, dst[i], want[i]);
  d.accumulate = true;
  DF_ASSERT_OK(df_copy_2d(ctx, &d, &ts, &td, &err), &err);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) want[1 + i * 10 + j] += src[5 + i * 6 + j];
  for (int i = 0; i < 30; i++) cr_expect_eq(dst[i], want[i], "accumulate: dst[%d] = %g, want %g", i, dst[i], want[i]);
  df_ctx_destroy(ctx);
}

Test(copy_2d, refuses_bad_ranges_overlap_and_strides) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  float src[12] = {0}, dst[12], keep[12];
  for (int i = 0; i < 12; i++) dst[i] = keep[i] = (float)i;
  df_tensor ts = df_f32(src, 12), td = df_f32(dst, 12);
  df_copy_2d_desc past_src = {.rows = 3, .cols = 4, .src_offset = 1, .src_stride = 4, .dst_stride = 4};
  cr_expect_eq(df_copy_2d(ctx, &past_src, &ts, &td, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "src");
  cr_expect(strstr(err.msg, "13"), "%s", err.msg); // the element it would reach
  df_copy_2d_desc past_dst = {.rows = 2, .cols = 4, .src_stride = 4, .dst_offset = 6, .dst_stride = 4};
  cr_expect_eq(df_copy_2d(ctx, &past_dst, &ts, &td, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dst");
  df_copy_2d_desc rows_overlap = {.rows = 2, .cols = 4, .src_stride = 4, .dst_stride = 3};
  cr_expect_eq(df_copy_2d(ctx, &rows_overlap, &ts, &td, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc");
  df_copy_2d_desc ok = {.rows = 2, .cols = 2, .src_stride = 2, .dst_offset = 6, .dst_stride = 2};
  df_tensor head = df_f32(dst, 6), tail = df_f32(dst + 4, 8);
  cr_expect_eq(df_copy_2d(ctx, &ok, &head, &tail, &err), DF_ERR_INVALID); // the same buffer
  cr_expect(strstr(err.msg, "overlap"), "%s", err.msg);
  for (int i = 0; i < 12; i++) cr_expect_eq(dst[i], keep[i], "a refused copy wrote dst[%d]", i);
  df_ctx_destroy(ctx);
}

// ---- gated gate ------------------------------------------------------------------------------------------------

enum { GR = 7, GRK = 5 };

typedef struct {
  float pre[GR * GRK], e[GR * GRK], du[GR * GRK];
} gate_case;

// Σ du ⊙ σ(pre) ⊙ e in double.
static double gate_probe(void *p) {
  const gate_case *c = p;
  double s = 0;
  for (int i = 0; i < GR * GRK; i++) s += (double)c->du[i] * sig(c->pre[i]) * c->e[i];
  return s;
}

Test(markov, gate_matches_its_definition_and_gradients) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  gate_case c;
  df_test_fill_uniform(c.pre, GR * GRK, 11, -3, 3);
  df_test_fill_uniform(c.e, GR * GRK, 12, -1, 1);
  df_test_fill_uniform(c.du, GR * GRK, 13, -1, 1);
  float gate[GR * GRK], u[GR * GRK], want_g[GR * GRK], want_u[GR * GRK];
  for (int i = 0; i < GR * GRK; i++) want_g[i] = (float)sig(c.pre[i]), want_u[i] = (float)(sig(c.pre[i]) * c.e[i]);
  df_tensor tp = df_f32(c.pre, GR, GRK), te = df_f32(c.e, GR, GRK), tg = df_f32(gate, GR, GRK), tu = df_f32(u, GR, GRK);
  DF_ASSERT_OK(df_markov_gate_forward(ctx, &tp, &te, &tg, &tu, &err), &err);
  df_expect_close_elementwise("gate", gate, want_g, GR * GRK, 1e-6, 1e-7);
  df_expect_close_elementwise("u", u, want_u, GR * GRK, 1e-6, 1e-7);
  // in place: gate over pre
  float inplace[GR * GRK];
  memcpy(inplace, c.pre, sizeof inplace);
  df_tensor ti = df_f32(inplace, GR, GRK);
  DF_ASSERT_OK(df_markov_gate_forward(ctx, &ti, &te, &ti, &tu, &err), &err);
  cr_expect_eq(memcmp(inplace, gate, sizeof gate), 0, "in place differs");
  // backward: de accumulates onto its contents, dpre is written
  float de[GR * GRK], de0[GR * GRK], dpre[GR * GRK], de_only[GR * GRK];
  df_test_fill_uniform(de0, GR * GRK, 14, -1, 1);
  memcpy(de, de0, sizeof de);
  df_tensor tdu = df_f32(c.du, GR, GRK), tde = df_f32(de, GR, GRK), tdp = df_f32(dpre, GR, GRK);
  DF_ASSERT_OK(df_markov_gate_backward(ctx, &tg, &te, &tdu, &tde, &tdp, &err), &err);
  for (int i = 0; i < GR * GRK; i++) de_only[i] = de[i] - de0[i];
  df_fd_check("d pre", c.pre, dpre, GR * GRK, gate_probe, &c, 1e-3, 1e-3, 1e-5, 64);
  df_fd_check("d e", c.e, de_only, GR * GRK, gate_probe, &c, 1e-3, 1e-3, 1e-5, 64);
  df_ctx_destroy(ctx);
}

// ---- rnn cell --------------------------------------------------------------------------------------------------

enum { NB = 3, BS = 4, RK = 5, SLOT = 2 };

typedef struct {
  float y[NB * 3 * RK], s_prev[NB * RK], ds[NB * RK], du[NB * BS * RK];
  bool has_prev;
} rnn_case;

// The cell in double: s = σ(a) s_prev + (1 − σ(a)) tanh(c), u = tanh(o).
static void rnn_ref(const rnn_case *c, int b, int j, double *s, double *u) {
  const float *yr = c->y + b * 3 * RK;
  double g = sig(yr[j]), prev = c->has_prev ? c->s_prev[b * RK + j] : 0.0;
  *s = g * prev + (1 - g) * tanh((double)yr[RK + j]);
  *u = tanh((double)yr[2 * RK + j]);
}

// Σ ds ⊙ s + Σ du[b·bs + slot] ⊙ u.
static double rnn_probe(void *p) {
  const rnn_case *c = p;
  double t = 0;
  for (int b = 0; b < NB; b++)
    for (int j = 0; j < RK; j++) {
      double s, u;
      rnn_ref(c, b, j, &s, &u);
      t += c->ds[b * RK + j] * s + c->du[(b * BS + SLOT) * RK + j] * u;
    }
  return t;
}

static void rnn_check(bool has_prev) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  rnn_case c = {.has_prev = has_prev};
  df_test_fill_uniform(c.y, NB * 3 * RK, 21, -2, 2);
  df_test_fill_uniform(c.s_prev, NB * RK, 22, -1, 1);
  df_test_fill_uniform(c.ds, NB * RK, 23, -1, 1);
  df_test_fill_uniform(c.du, NB * BS * RK, 24, -1, 1);
  float s[NB * RK], u[NB * BS * RK], want_s[NB * RK], want_u[NB * BS * RK];
  for (int i = 0; i < NB * BS * RK; i++) u[i] = want_u[i] = 7.0f; // rows of other slots stay
  for (int b = 0; b < NB; b++)
    for (int j = 0; j < RK; j++) {
      double sv, uv;
      rnn_ref(&c, b, j, &sv, &uv);
      want_s[b * RK + j] = (float)sv, want_u[(b * BS + SLOT) * RK + j] = (float)uv;
    }
  df_markov_rnn_desc d = {.slot = SLOT, .block_size = BS};
  df_tensor ty = df_f32(c.y, NB, 3 * RK), tsp = df_f32(c.s_prev, NB, RK), ts = df_f32(s, NB, RK),
            tu = df_f32(u, NB * BS, RK);
  DF_ASSERT_OK(df_markov_rnn_forward(ctx, &d, &ty, has_prev ? &tsp : NULL, &ts, &tu, &err), &err);
  df_expect_close_elementwise("s", s, want_s, NB * RK, 1e-6, 1e-7);
  df_expect_close_elementwise("u", u, want_u, NB * BS * RK, 1e-6, 1e-7);
  // backward: dy = ∂probe/∂y; ds out = ∂probe/∂s_prev
  float dy[NB * 3 * RK], ds[NB * RK];
  memcpy(ds, c.ds, sizeof ds);
  df_tensor tdu = df_f32(c.du, NB * BS, RK), tds = df_f32(ds, NB, RK), tdy = df_f32(dy, NB, 3 * RK);
  DF_ASSERT_OK(df_markov_rnn_backward(ctx, &d, &ty, has_prev ? &tsp : NULL, &tdu, &tds, &tdy, &err), &err);
  df_fd_check("d y", c.y, dy, NB * 3 * RK, rnn_probe, &c, 1e-3, 1e-3, 1e-5, 64);
  if (has_prev) df_fd_check("d s_prev", c.s_prev, ds, NB * RK, rnn_probe, &c, 1e-3, 1e-3, 1e-5, 64);
  // without du, the o part of dy is zero
  memcpy(ds, c.ds, sizeof ds);
  DF_ASSERT_OK(df_markov_rnn_backward(ctx, &d, &ty, has_prev ? &tsp : NULL, NULL, &tds, &tdy, &err), &err);
  for (int b = 0; b < NB; b++)
    for (int j = 0; j < RK; j++) cr_expect_eq(dy[b * 3 * RK + 2 * RK + j], 0.0f);
  df_ctx_destroy(ctx);
}

Test(markov, rnn_cell_matches_its_definition_and_gradients) {
  rnn_check(true);
  rnn_check(false); // slot 0: zero state
}

Test(markov, rnn_refuses_a_bad_slot_and_shapes) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  float y[NB * 3 * RK] = {0}, s[NB * RK], u[NB * BS * RK];
  df_tensor ty = df_f32(y, NB, 3 * RK), ts = df_f32(s, NB, RK), tu = df_f32(u, NB * BS, RK);
  df_markov_rnn_desc bad = {.slot = BS, .block_size = BS};
  cr_expect_eq(df_markov_rnn_forward(ctx, &bad, &ty, NULL, &ts, &tu, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc");
  df_markov_rnn_desc d = {.slot = 0, .block_size = BS};
  df_tensor short_u = df_f32(u, NB * BS - 1, RK);
  cr_expect_eq(df_markov_rnn_forward(ctx, &d, &ty, NULL, &ts, &short_u, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "u");
  df_tensor y2 = df_f32(y, NB, 2 * RK + 1);
  cr_expect_eq(df_markov_rnn_forward(ctx, &d, &y2, NULL, &ts, &tu, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "y");
  df_ctx_destroy(ctx);
}

// ---- the table -------------------------------------------------------------------------------------------------

// The gate and copy_2d on the strict fake device (memory the host cannot touch: the ops run only through the
// table) give the CPU's bits.
Test(markov, strict_fake_device_matches_the_cpu) {
  df_error err = {0};
  df_ctx *cpu = df_test_cpu_ctx(1), *dev = NULL;
  df_ctx_options o = {.device = DF_DEV_FAKE, .num_threads = 1, .backend = df_fake_strict_backend()};
  DF_ASSERT_OK(df_ctx_create(&o, &dev, &err), &err);
  float pre[GR * GRK], e[GR * GRK], g[GR * GRK], u[GR * GRK], back[2 * GR * GRK];
  df_test_fill_uniform(pre, GR * GRK, 31, -3, 3);
  df_test_fill_uniform(e, GR * GRK, 32, -1, 1);
  df_tensor tp = df_f32(pre, GR, GRK), te = df_f32(e, GR, GRK), tg = df_f32(g, GR, GRK), tu = df_f32(u, GR, GRK);
  DF_ASSERT_OK(df_markov_gate_forward(cpu, &tp, &te, &tg, &tu, &err), &err);
  const int64_t n = GR * GRK;
  float *d;
  DF_ASSERT_OK(df_buffer_alloc(dev, sizeof(float) * 6 * n, (void **)&d, &err), &err);
  DF_ASSERT_OK(df_copy(dev, d, DF_DEV_FAKE, pre, DF_DEV_CPU, sizeof pre, &err), &err);
  DF_ASSERT_OK(df_copy(dev, d + n, DF_DEV_FAKE, e, DF_DEV_CPU, sizeof e, &err), &err);
  df_tensor dp = df_f32_on(DF_DEV_FAKE, d, GR, GRK), dE = df_f32_on(DF_DEV_FAKE, d + n, GR, GRK),
            dg = df_f32_on(DF_DEV_FAKE, d + 2 * n, GR, GRK), du = df_f32_on(DF_DEV_FAKE, d + 3 * n, GR, GRK),
            dcat = df_f32_on(DF_DEV_FAKE, d + 4 * n, GR, 2 * GRK);
  DF_ASSERT_OK(df_markov_gate_forward(dev, &dp, &dE, &dg, &du, &err), &err);
  // [gate ; u] row by row on the device with two strided copies
  df_copy_2d_desc left = {.rows = GR, .cols = GRK, .src_stride = GRK, .dst_stride = 2 * GRK};
  df_copy_2d_desc right = {.rows = GR, .cols = GRK, .src_stride = GRK, .dst_offset = GRK, .dst_stride = 2 * GRK};
  DF_ASSERT_OK(df_copy_2d(dev, &left, &dg, &dcat, &err), &err);
  DF_ASSERT_OK(df_copy_2d(dev, &right, &du, &dcat, &err), &err);
  DF_ASSERT_OK(df_copy(dev, back, DF_DEV_CPU, d + 4 * n, DF_DEV_FAKE, sizeof back, &err), &err);
  for (int i = 0; i < GR; i++) {
    cr_expect_eq(memcmp(back + i * 2 * GRK, g + i * GRK, sizeof(float) * GRK), 0, "gate row %d differs", i);
    cr_expect_eq(memcmp(back + i * 2 * GRK + GRK, u + i * GRK, sizeof(float) * GRK), 0, "u row %d differs", i);
  }
  df_buffer_free(dev, d);
  df_ctx_destroy(dev), df_ctx_destroy(cpu);
}

Test(markov, missing_slots_name_op_and_backend) {
  df_backend lacking = *df_cpu_backend();
  lacking.name = "lacking";
  lacking.markov_rnn_forward = NULL;
  lacking.copy_2d = NULL;
  df_ctx *ctx = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_ctx_create_with(&lacking, NULL, &ctx, &err), &err);
  float y[NB * 3 * RK] = {0}, s[NB * RK], u[NB * BS * RK];
  df_tensor ty = df_f32(y, NB, 3 * RK), ts = df_f32(s, NB, RK), tu = df_f32(u, NB * BS, RK);
  df_markov_rnn_desc d = {.slot = 0, .block_size = BS};
  cr_expect_eq(df_markov_rnn_forward(ctx, &d, &ty, NULL, &ts, &tu, &err), DF_ERR_NOT_IMPLEMENTED);
  cr_expect(strstr(err.msg, "markov_rnn_forward") && strstr(err.msg, "lacking"), "%s", err.msg);
  df_copy_2d_desc c = {.rows = 1, .cols = 2, .src_stride = 2, .dst_stride = 2};
  cr_expect_eq(df_copy_2d(ctx, &c, &ts, &tu, &err), DF_ERR_NOT_IMPLEMENTED);
  cr_expect(strstr(err.msg, "copy_2d"), "%s", err.msg);
  df_ctx_destroy(ctx);
}
