// DSpark's head ops on a CUDA context against the same ops on a CPU context (the oracle): the strided 2-D copy
// (copied and added) and the Markov gate and rnn cell, forward and backward, in fp32 storage (the heads' storage).
// Tolerances: copy_2d bit-exact (a copy, or one fp32 add per element in the same order); the Markov ops 2e-6
// relative to max|ref| (σ through the same double exp; CUDA's tanhf is within 2 ulp of libm's, and products of a
// few such values stay within a few ulp).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

// The device tensor's values, compared with the CPU tensor's.
static void expect_same(cu_pair *p, const char *what, const df_tensor *g, const df_tensor *c, double rtol) {
  df_error err = {0};
  const int64_t n = df_numel(c);
  float *h = malloc(sizeof(float) * (size_t)n);
  DF_ASSERT_OK(df_copy(p->gpu, h, DF_DEV_CPU, g->data, DF_DEV_CUDA, sizeof(float) * (size_t)n, &err), &err);
  const float *want = c->data;
  if (rtol == 0) {
    for (int64_t i = 0; i < n; i++)
      cr_assert(h[i] == want[i], "%s at %lld: %g vs %g", what, (long long)i, h[i], want[i]);
  } else {
    df_expect_close(what, h, want, n, rtol, 1e-7);
  }
  free(h);
}

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = malloc(sizeof(float) * (size_t)n);
  df_test_fill_uniform(x, n, seed, lo, hi);
  return x;
}

Test(cuda_heads, copy_2d_copied_and_added_exact) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { SR = 40, SC = 24, DR = 30, DC = 50 };
  float *s = rnd(SR * SC, 1, -2, 2), *d = rnd(DR * DC, 2, -2, 2);
  df_tensor ts = df_f32(s, SR, SC), td = df_f32(d, DR, DC);
  df_tensor gs = cu_pair_dev(&p, &ts), gd = cu_pair_dev(&p, &td);
  // Every third source row's columns 3..19 into destination columns 7.., then added back onto columns 30...
  const df_copy_2d_desc descs[] = {
      {.rows = 12, .cols = 17, .src_offset = 3, .src_stride = 3 * SC, .dst_offset = 7, .dst_stride = DC},
      {.rows = 25,
       .cols = 20,
       .src_offset = SC,
       .src_stride = SC,
       .dst_offset = 30,
       .dst_stride = DC,
       .accumulate = true},
      {.rows = 1, .cols = SR * SC, .src_offset = 0, .src_stride = SR * SC, .dst_offset = 0, .dst_stride = SR * SC},
  };
  for (int i = 0; i < 2; i++) {
    DF_ASSERT_OK(df_copy_2d(p.cpu, &descs[i], &ts, &td, &err), &err);
    DF_ASSERT_OK(df_copy_2d(p.gpu, &descs[i], &gs, &gd, &err), &err);
    expect_same(&p, i ? "copy_2d added" : "copy_2d copied", &gd, &td, 0);
  }
  free(s), free(d), df_buffer_free(p.gpu, gs.data), df_buffer_free(p.gpu, gd.data);
  cu_pair_close(&p);
}

Test(cuda_heads, markov_gate_forward_backward_fp32) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { R = 96, r = 80, N = R * r };
  float *pre = rnd(N, 3, -6, 6), *e = rnd(N, 4, -2, 2), *du = rnd(N, 5, -1, 1), *de = rnd(N, 6, -1, 1);
  float *gate = calloc(N, 4), *u = calloc(N, 4), *dpre = calloc(N, 4);
  df_tensor tp = df_f32(pre, R, r), te = df_f32(e, R, r), tdu = df_f32(du, R, r), tde = df_f32(de, R, r);
  df_tensor tg = df_f32(gate, R, r), tu = df_f32(u, R, r), tdp = df_f32(dpre, R, r);
  df_tensor gp = cu_pair_dev(&p, &tp), ge = cu_pair_dev(&p, &te), gdu = cu_pair_dev(&p, &tdu),
            gde = cu_pair_dev(&p, &tde);
  df_tensor gg = cu_pair_dev(&p, &tg), gu = cu_pair_dev(&p, &tu), gdp = cu_pair_dev(&p, &tdp);
  DF_ASSERT_OK(df_markov_gate_forward(p.cpu, &tp, &te, &tg, &tu, &err), &err);
  DF_ASSERT_OK(df_markov_gate_forward(p.gpu, &gp, &ge, &gg, &gu, &err), &err);
  expect_same(&p, "gate", &gg, &tg, 2e-6);
  expect_same(&p, "u", &gu, &tu, 2e-6);
  // The backward reads the CPU's gate on both sides, so only the backward's own arithmetic is compared.
  df_tensor gg2 = cu_pair_dev(&p, &tg);
  DF_ASSERT_OK(df_markov_gate_backward(p.cpu, &tg, &te, &tdu, &tde, &tdp, &err), &err);
  DF_ASSERT_OK(df_markov_gate_backward(p.gpu, &gg2, &ge, &gdu, &gde, &gdp, &err), &err);
  expect_same(&p, "de (added to)", &gde, &tde, 2e-6);
  expect_same(&p, "dpre", &gdp, &tdp, 2e-6);
  // In place: gate = pre.
  df_tensor gp2 = cu_pair_dev(&p, &tp);
  DF_ASSERT_OK(df_markov_gate_forward(p.gpu, &gp2, &ge, &gp2, &gu, &err), &err);
  expect_same(&p, "gate in place", &gp2, &tg, 2e-6);
  df_tensor *all[] = {&gp, &ge, &gdu, &gde, &gg, &gu, &gdp, &gg2, &gp2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) df_buffer_free(p.gpu, all[i]->data);
  free(pre), free(e), free(du), free(de), free(gate), free(u), free(dpre);
  cu_pair_close(&p);
}

// Every slot of a block of 4, the state carried from slot to slot on each side, backward from the last slot down.
Test(cuda_heads, markov_rnn_cell_every_slot_fp32) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  df_error err = {0};
  enum { NB = 37, r = 48, BS = 4 };
  float *y = rnd(NB * 3 * r, 7, -3, 3), *du = rnd(NB * BS * r, 8, -1, 1), *ds = rnd(NB * r, 9, -1, 1);
  float *s[BS], *u = calloc(NB * BS * r, 4), *dy = calloc(NB * 3 * r, 4);
  df_tensor ty = df_f32(y, NB, 3 * r), tdu = df_f32(du, NB * BS, r), tds = df_f32(ds, NB, r);
  df_tensor tu = df_f32(u, NB * BS, r), tdy = df_f32(dy, NB, 3 * r), ts[BS], gs[BS];
  df_tensor gy = cu_pair_dev(&p, &ty), gdu = cu_pair_dev(&p, &tdu), gds = cu_pair_dev(&p, &tds),
            gu = cu_pair_dev(&p, &tu), gdy = cu_pair_dev(&p, &tdy);
  for (int k = 0; k < BS; k++) {
    s[k] = calloc(NB * r, 4);
    ts[k] = df_f32(s[k], NB, r);
    gs[k] = cu_pair_dev(&p, &ts[k]);
  }
  for (int k = 0; k < BS; k++) {
    const df_markov_rnn_desc d = {.slot = k, .block_size = BS};
    DF_ASSERT_OK(df_markov_rnn_forward(p.cpu, &d, &ty, k ? &ts[k - 1] : NULL, &ts[k], &tu, &err), &err);
    DF_ASSERT_OK(df_markov_rnn_forward(p.gpu, &d, &gy, k ? &gs[k - 1] : NULL, &gs[k], &gu, &err), &err);
    expect_same(&p, "state", &gs[k], &ts[k], 1e-5);
  }
  expect_same(&p, "u (every slot)", &gu, &tu, 2e-6);
  for (int k = BS - 1; k >= 0; k--) {
    const df_markov_rnn_desc d = {.slot = k, .block_size = BS};
    const bool with_du = k != 1; // slot 1 without an output gradient (du NULL: its o-part is zero)
    DF_ASSERT_OK(df_markov_rnn_backward(p.cpu, &d, &ty, k ? &ts[k - 1] : NULL, with_du ? &tdu : NULL, &tds, &tdy, &err),
                 &err);
    DF_ASSERT_OK(df_markov_rnn_backward(p.gpu, &d, &gy, k ? &gs[k - 1] : NULL, with_du ? &gdu : NULL, &gds, &gdy, &err),
                 &err);
    expect_same(&p, "dy", &gdy, &tdy, 1e-5);
    expect_same(&p, "ds (carried)", &gds, &tds, 1e-5);
  }
  df_tensor *all[] = {&gy, &gdu, &gds, &gu, &gdy};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) df_buffer_free(p.gpu, all[i]->data);
  for (int k = 0; k < BS; k++) df_buffer_free(p.gpu, gs[k].data), free(s[k]);
  free(y), free(du), free(ds), free(u), free(dy);
  cu_pair_close(&p);
}
