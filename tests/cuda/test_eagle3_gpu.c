// EAGLE-3's CUDA ops (kernels/cuda/ttt_attn.cu, eagle3_loss.cu) through the op interface on a CUDA context against
// the CPU oracles on a CPU context: the TTT attention forward and backward (GQA, padding, several steps, gradients
// accumulated into the cache), the compact teacher's lse / argmax over several vocabulary blocks, the teacher rows,
// the per-row terms and their gradient for the three LK types, the step sums and the acceptance lengths, and one
// whole EAGLE-3 micro-step (draftforge step on the eagle3_step fixtures) on --device cuda against the CPU.
// Tolerances: 1e-5 of max|ref| for fp32 outputs (exp and accumulation order), sums in double 1e-9 relative,
// argmax and counts exact (random data, no near ties).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/eagle3.h"
#include "modeling/safetensors.h"
#include "tests/cuda/cu_test.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

static void *to_host(cu_pair *p, const df_tensor *t) {
  df_error err = {0};
  const size_t bytes = (size_t)df_numel(t) * df_dtype_size(t->dtype);
  void *h = malloc(bytes ? bytes : 1);
  DF_ASSERT_OK(df_copy(p->gpu, h, DF_DEV_CPU, t->data, DF_DEV_CUDA, bytes, &err), &err);
  return h;
}

static void expect_dev(cu_pair *p, const char *what, const df_tensor *g, const float *want, double rtol) {
  float *h = to_host(p, g);
  df_expect_close(what, h, want, df_numel(g), rtol, 1e-7);
  free(h);
}

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  df_test_fill_uniform(x, n, seed, lo, hi);
  return x;
}

static df_tensor t4(float *p, int64_t a, int64_t b, int64_t c, int64_t d) {
  return df_view(p, DF_F32, DF_DEV_CPU, 4, (const int64_t[]){a, b, c, d});
}

Test(cuda_eagle3, ttt_attention_forward_and_backward) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  enum { B = 2, S = 37, nH = 8, nKV = 2, hd = 64, T = 4 };
  int32_t len[B] = {37, 21};
  float *q = rnd(B * S * nH * hd, 1, -1, 1), *k = rnd(T * B * S * nKV * hd, 2, -1, 1);
  float *v = rnd(T * B * S * nKV * hd, 3, -1, 1), *go = rnd(B * S * nH * hd, 4, -1, 1);
  float *o = calloc(B * S * nH * hd, 4), *lse = calloc(B * S * nH, 4), *dq = calloc(B * S * nH * hd, 4);
  float *dk = calloc(T * B * S * nKV * hd, 4), *dv = calloc(T * B * S * nKV * hd, 4);
  df_tensor tq = t4(q, B, S, nH, hd), tk = t4(k, T * B, S, nKV, hd), tv = t4(v, T * B, S, nKV, hd);
  df_tensor to = t4(o, B, S, nH, hd), tgo = t4(go, B, S, nH, hd), tdq = t4(dq, B, S, nH, hd);
  df_tensor tdk = t4(dk, T * B, S, nKV, hd), tdv = t4(dv, T * B, S, nKV, hd);
  df_tensor tl = df_view(len, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){B}), tlse = df_f32(lse, B * S * nH);
  df_tensor g[11];
  const df_tensor *h[11] = {&tq, &tk, &tv, &tl, &to, &tlse, &tgo, &tdq, &tdk, &tdv, NULL};
  for (int i = 0; i < 10; i++) g[i] = cu_pair_dev(&p, h[i]);
  df_error err = {0};
  for (int64_t i = T - 1; i >= 0; i--) { // the backward order of a micro-step: the cache gradients accumulate
    const df_ttt_attn_desc d = {.step = i, .scale = 0.125f};
    DF_ASSERT_OK(df_ttt_attn_forward(p.cpu, &d, &tq, &tk, &tv, &tl, &to, &tlse, &err), &err);
    DF_ASSERT_OK(df_ttt_attn_forward(p.gpu, &d, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &err), &err);
    expect_dev(&p, "ttt out", &g[4], o, 1e-5);
    expect_dev(&p, "ttt lse", &g[5], lse, 1e-5);
    DF_ASSERT_OK(df_ttt_attn_backward(p.cpu, &d, &tq, &tk, &tv, &tl, &to, &tlse, &tgo, &tdq, &tdk, &tdv, &err), &err);
    DF_ASSERT_OK(
        df_ttt_attn_backward(p.gpu, &d, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7], &g[8], &g[9], &err),
        &err);
    expect_dev(&p, "ttt dq", &g[7], dq, 1e-5);
  }
  expect_dev(&p, "ttt dk (every step)", &g[8], dk, 1e-5);
  expect_dev(&p, "ttt dv (every step)", &g[9], dv, 1e-5);
  for (int i = 0; i < 10; i++) df_buffer_free(p.gpu, g[i].data);
  free(q), free(k), free(v), free(go), free(o), free(lse), free(dq), free(dk), free(dv);
  cu_pair_close(&p);
}

Test(cuda_eagle3, compact_teacher_and_teacher_rows) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  enum { R = 300, H = 64, V = 20000, D = 512 };
  float *x = rnd(R * H, 5, -1, 1), *w = rnd(V * H, 6, -1, 1), *lse = calloc(R, 4), *lm = rnd(R, 7, 0, 1);
  int32_t *arg = calloc(R, 4);
  df_tensor tx = df_f32(x, R, H), tw = df_f32(w, V, H), tlse = df_f32(lse, R);
  df_tensor ta = df_view(arg, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){R});
  df_tensor gx = cu_pair_dev(&p, &tx), gw = cu_pair_dev(&p, &tw), glse = cu_pair_dev(&p, &tlse),
            ga = cu_pair_dev(&p, &ta);
  df_error err = {0};
  DF_ASSERT_OK(df_lmhead_lse_argmax(p.cpu, 64, &tx, &tw, &tlse, &ta, &err), &err);
  DF_ASSERT_OK(df_lmhead_lse_argmax(p.gpu, 64, &gx, &gw, &glse, &ga, &err), &err);
  expect_dev(&p, "teacher lse", &glse, lse, 1e-5);
  int32_t *garg = to_host(&p, &ga);
  for (int r = 0; r < R; r++) cr_expect_eq(garg[r], arg[r], "argmax[%d]", r);
  free(garg);
  // the teacher rows over the first D ids
  float *z = rnd(R * D, 8, -4, 4), *ratio = calloc(R, 4), *pm = calloc(R, 4);
  uint8_t *t2d = calloc(V, 1);
  for (int i = 0; i < D; i++) t2d[i * 3] = 1;
  for (int r = 0; r < R; r++) lm[r] = lm[r] > 0.3f;
  df_tensor tz = df_f32(z, R, D), tr = df_f32(ratio, R), tp = df_f32(pm, R), tm = df_f32(lm, R);
  df_tensor tt = df_view(t2d, DF_U8, DF_DEV_CPU, 1, (const int64_t[]){V});
  df_tensor gz = cu_pair_dev(&p, &tz), gr = cu_pair_dev(&p, &tr), gp = cu_pair_dev(&p, &tp), gm = cu_pair_dev(&p, &tm);
  df_tensor gt = cu_pair_dev(&p, &tt);
  DF_ASSERT_OK(df_eagle3_teacher(p.cpu, &tz, &tlse, &ta, &tt, &tm, &tr, &tp, &err), &err);
  DF_ASSERT_OK(df_eagle3_teacher(p.gpu, &gz, &glse, &ga, &gt, &gm, &gr, &gp, &err), &err);
  expect_dev(&p, "target_p", &gz, z, 1e-5);
  expect_dev(&p, "ratio", &gr, ratio, 1e-5);
  expect_dev(&p, "position mask", &gp, pm, 0);
  df_tensor gs[] = {gx, gw, glse, ga, gz, gr, gp, gm, gt};
  for (size_t i = 0; i < sizeof gs / sizeof *gs; i++) df_buffer_free(p.gpu, gs[i].data);
  free(x), free(w), free(lse), free(lm), free(arg), free(z), free(ratio), free(pm), free(t2d);
  cu_pair_close(&p);
}

Test(cuda_eagle3, step_objective_sums_and_gradients) {
  CU_REQUIRE_GPU();
  cu_pair p = cu_pair_open();
  enum { B = 3, S = 40, R = B * S, D = 700, T = 3 };
  float *tp = rnd(R * D, 9, 0, 1), *ratio = rnd(R, 10, 0.2f, 0.9f), *pm = rnd(R, 11, 0, 1), *lm = rnd(R, 12, 0, 1);
  for (int r = 0; r < R; r++) { // teacher rows are softmaxes
    double s = 0;
    for (int d = 0; d < D; d++) s += tp[r * D + d];
    for (int d = 0; d < D; d++) tp[r * D + d] = (float)(tp[r * D + d] / s);
    lm[r] = lm[r] > 0.2f, pm[r] = lm[r] * (pm[r] > 0.3f);
  }
  int32_t tok[R], d2t[D];
  for (int r = 0; r < R; r++) tok[r] = (r * 7) % (D + 50);
  for (int d = 0; d < D; d++) d2t[d] = d < 400 ? 0 : 50;
  df_tensor ttp = df_f32(tp, R, D), tr = df_f32(ratio, R), tpm = df_f32(pm, R), tlm = df_f32(lm, R);
  df_tensor ttok = df_view(tok, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){R});
  df_tensor td2t = df_view(d2t, DF_I32, DF_DEV_CPU, 1, (const int64_t[]){D});
  df_tensor g_tp = cu_pair_dev(&p, &ttp), g_r = cu_pair_dev(&p, &tr), g_pm = cu_pair_dev(&p, &tpm);
  df_tensor g_lm = cu_pair_dev(&p, &tlm), g_tok = cu_pair_dev(&p, &ttok), g_d2t = cu_pair_dev(&p, &td2t);
  const df_eagle3_teacher_rows ct = {&ttp, &tr, &tpm, &tlm, &ttok, &td2t},
                               gt = {&g_tp, &g_r, &g_pm, &g_lm, &g_tok, &g_d2t};
  df_error err = {0};
  for (int lk = 0; lk <= 2; lk++)
    for (int64_t step = 0; step < T; step++) {
      float *z = rnd(R * D, 13 + step, -3, 3), *terms = calloc(6 * R, 4), *dz = calloc(R * D, 4);
      double local[DF_EAGLE3_STEP_LOCAL] = {0}, stats[16] = {0};
      df_tensor tz = df_f32(z, R, D), tdz = df_f32(dz, R, D), tt[6], gtt[6];
      for (int i = 0; i < 6; i++) tt[i] = df_f32(terms + i * R, R), gtt[i] = cu_pair_dev(&p, &tt[i]);
      df_tensor tl = df_view(local, DF_F64, DF_DEV_CPU, 1, (const int64_t[]){DF_EAGLE3_STEP_LOCAL});
      df_tensor ts = df_view(stats, DF_F64, DF_DEV_CPU, 1, (const int64_t[]){16});
      df_tensor gz = cu_pair_dev(&p, &tz), gdz = cu_pair_dev(&p, &tdz), gl = cu_pair_dev(&p, &tl),
                gs = cu_pair_dev(&p, &ts);
      const df_eagle3_row_terms co = {&tt[0], &tt[1], &tt[2], &tt[3], &tt[4], &tt[5]};
      const df_eagle3_row_terms go = {&gtt[0], &gtt[1], &gtt[2], &gtt[3], &gtt[4], &gtt[5]};
      const df_eagle3_loss_desc d = {.step = step,
                                     .S = S,
                                     .row0 = 0,
                                     .positions = R,
                                     .lk = (df_lk_loss)lk,
                                     .kl_scale = 0.7,
                                     .kl_decay = 2.0,
                                     .weight = 0.8};
      const df_eagle3_sums_desc sd = {.step = step,
                                      .positions = R,
                                      .lk = (df_lk_loss)lk,
                                      .kl_scale = 0.7,
                                      .kl_decay = 2.0,
                                      .step_weight = 0.64,
                                      .loss_num = 0,
                                      .acc_num = 1,
                                      .acc_den = 2,
                                      .step_block = 3};
      DF_ASSERT_OK(df_eagle3_loss_forward(p.cpu, &d, &tz, &ct, &co, &err), &err);
      DF_ASSERT_OK(df_eagle3_loss_forward(p.gpu, &d, &gz, &gt, &go, &err), &err);
      for (int i = 0; i < 6; i++) expect_dev(&p, "row terms", &gtt[i], terms + i * R, 1e-5);
      DF_ASSERT_OK(df_eagle3_step_sums(p.cpu, &sd, &co, &tl, &ts, &err), &err);
      DF_ASSERT_OK(df_eagle3_step_sums(p.gpu, &sd, &go, &gl, &gs, &err), &err);
      double *hs = to_host(&p, &gs);
      for (int i = 0; i < 3 + DF_EAGLE3_STEP_STATS; i++)
        cr_expect(fabs(hs[i] - stats[i]) <= 1e-9 * fabs(stats[i]) + 1e-12, "stats[%d] %.17g vs %.17g", i, hs[i],
                  stats[i]);
      free(hs);
      DF_ASSERT_OK(df_eagle3_loss_backward(p.cpu, &d, &tz, &ct, &tl, &tdz, &err), &err);
      DF_ASSERT_OK(df_eagle3_loss_backward(p.gpu, &d, &gz, &gt, &gl, &gdz, &err), &err);
      expect_dev(&p, "dz", &gdz, dz, 1e-5);
      for (int i = 0; i < 6; i++) df_buffer_free(p.gpu, gtt[i].data);
      df_buffer_free(p.gpu, gz.data), df_buffer_free(p.gpu, gdz.data), df_buffer_free(p.gpu, gl.data);
      df_buffer_free(p.gpu, gs.data);
      free(z), free(terms), free(dz);
    }
  // the acceptance lengths
  float correct[T * R];
  for (int i = 0; i < T * R; i++) correct[i] = (i * 13 % 7) != 0;
  double st[2] = {0};
  df_tensor tc = df_f32(correct, T, R), tst = df_view(st, DF_F64, DF_DEV_CPU, 1, (const int64_t[]){2});
  df_tensor gc = cu_pair_dev(&p, &tc), gst = cu_pair_dev(&p, &tst);
  DF_ASSERT_OK(df_eagle3_accept(p.cpu, &tc, &tlm, 0, 1, &tst, &err), &err);
  DF_ASSERT_OK(df_eagle3_accept(p.gpu, &gc, &g_lm, 0, 1, &gst, &err), &err);
  double *hst = to_host(&p, &gst);
  cr_expect_eq(hst[0], st[0]);
  cr_expect_eq(hst[1], st[1]);
  free(hst);
  df_tensor all[] = {g_tp, g_r, g_pm, g_lm, g_tok, g_d2t, gc, gst};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) df_buffer_free(p.gpu, all[i].data);
  free(tp), free(ratio), free(pm), free(lm);
  cu_pair_close(&p);
}

// One whole micro-step through the strategy on a CUDA context in fp32 storage: the loss terms and every gradient
// against the CPU.
Test(cuda_eagle3, step_on_cuda_equals_the_cpu) {
  CU_REQUIRE_GPU();
  const char *recipe = DF_SOURCE_DIR "/tests/fixtures/eagle3_step/ttt3_lk_lambda_trunc/recipe.yaml";
  df_step_result a, b;
  df_error err = {0};
  const df_device_choice cpu = DF_DEVICE_CPU, cuda = DF_DEVICE_CUDA;
  DF_ASSERT_OK(df_step_run(recipe, "/tmp/df_cuda_eagle3_cpu", 1, &cpu, &a, &err), &err);
  const char *fp32[] = {"model.torch_dtype=float32"}; // the CPU's storage (bf16, the CUDA default: test_step_gpu.c)
  DF_ASSERT_OK(df_step_run_ex(recipe, fp32, 1, "/tmp/df_cuda_eagle3_gpu", 1, &cuda, &b, &err), &err);
  cr_expect(fabs(a.loss - b.loss) <= 1e-5 * fabs(a.loss), "loss %.9g vs %.9g", b.loss, a.loss);
  df_step_result_free(&a), df_step_result_free(&b);
  df_st_file *fa = NULL, *fb = NULL;
  DF_ASSERT_OK(df_st_open("/tmp/df_cuda_eagle3_cpu/grads.safetensors", &fa, &err), &err);
  DF_ASSERT_OK(df_st_open("/tmp/df_cuda_eagle3_gpu/grads.safetensors", &fb, &err), &err);
  cr_assert_eq(df_st_count(fa), df_st_count(fb));
  for (int i = 0; i < df_st_count(fa); i++) {
    const df_st_tensor *x = df_st_at(fa, i), *y = df_st_find(fb, x->name);
    cr_assert_not_null(y, "%s", x->name);
    float *u = malloc(sizeof(float) * (size_t)x->numel), *v = malloc(sizeof(float) * (size_t)x->numel);
    DF_ASSERT_OK(df_st_read_f32(fa, x, u, x->numel, &err), &err);
    DF_ASSERT_OK(df_st_read_f32(fb, y, v, y->numel, &err), &err);
    df_expect_close(x->name, v, u, x->numel, 1e-4, 1e-7);
    free(u), free(v);
  }
  df_st_close(fa), df_st_close(fb);
}
