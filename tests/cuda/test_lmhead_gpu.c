// Fused chunked LM head + CE and the fused DSpark objective on the GPU against the CPU ops, on fp32 storage and on
// bf16 storage (inputs rounded on the host so both sides see the same values), several chunk sizes, weights,
// skipped rows. Tolerances: fp32 per-row outputs 2e-5 of max|ref|, gradients 1e-4 (GEMM accumulation order and
// the CPU's polynomial exp); bf16 per-row outputs 1e-4 (logits still accumulate in fp32), gradients relative L2
// 1e-2 (d(logits) is rounded to bf16 before the dhidden GEMM). argmax flags must agree except where the two
// largest logits (computed here in double) are within 1e-4 of each other.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

// Rows whose top-2 logits are closer than tol: an argmax there may legitimately differ between two GEMMs.
static bool *near_ties(const float *x, const float *head, int64_t R, int64_t H, int64_t V, double tol) {
  bool *tie = calloc((size_t)R, 1);
  for (int64_t r = 0; r < R; r++) {
    double b1 = -INFINITY, b2 = -INFINITY;
    for (int64_t v = 0; v < V; v++) {
      double z = 0.0;
      for (int64_t h = 0; h < H; h++) z += (double)x[r * H + h] * head[v * H + h];
      if (z > b1)
        b2 = b1, b1 = z;
      else if (z > b2)
        b2 = z;
    }
    tie[r] = b1 - b2 < tol;
  }
  return tie;
}

static void expect_flags(const char *what, const uint8_t *got, const uint8_t *want, const bool *tie, int64_t R) {
  for (int64_t r = 0; r < R; r++)
    if (!tie[r]) cr_expect_eq(got[r], want[r], "%s[%lld]: got %d want %d", what, (long long)r, got[r], want[r]);
}

static void ce_case(cu_env *e, int64_t R, int64_t H, int64_t V, int64_t chunk, df_dtype dt, bool weighted) {
  float *x = malloc(4 * R * H), *head = malloc(4 * V * H), *w = malloc(4 * R), *loss = malloc(4 * R);
  float *dh = malloc(4 * R * H);
  int32_t *labels = malloc(4 * R);
  uint8_t *correct = malloc((size_t)R);
  df_test_fill_uniform(x, R * H, 900 + R, -1, 1);
  df_test_fill_uniform(head, V * H, 901 + V, -0.5f, 0.5f);
  df_test_fill_uniform(w, R, 902, 0.1f, 2.0f);
  for (int64_t r = 0; r < R; r++) labels[r] = r % 9 == 4 ? -1 : (int32_t)((r * 37) % V); // some skipped rows
  if (dt == DF_BF16) cu_round_bf16(x, R * H), cu_round_bf16(head, V * H);
  df_ctx *c = df_test_cpu_ctx(0);
  df_error err = {0};
  df_lmhead_ce_desc d = {.chunk_rows = 0, .grad_scale = 0.37f};
  df_tensor tx = df_f32(x, R, H), th = df_f32(head, V, H), tl = df_i32(labels, R), tw = df_f32(w, R);
  df_tensor tloss = df_f32(loss, R), tc = df_u8(correct, R), tdh = df_f32(dh, R, H);
  DF_ASSERT_OK(df_lmhead_ce(c, &d, &tx, &th, &tl, weighted ? &tw : NULL, &tloss, &tc, &tdh, &err), &err);
  df_ctx_destroy(c);
  void *gx = cu_upload(x, R * H, dt), *gh = cu_upload(head, V * H, dt), *gw = cu_upload(w, R, DF_F32);
  void *gl = cu_upload_bytes(labels, 4 * R), *gloss = cu_alloc(4 * R), *gc = cu_alloc((size_t)R);
  void *gdh = cu_alloc(4 * R * H);
  df_cu_lmhead_ce_args a = {.R = R,
                            .H = H,
                            .V = V,
                            .chunk_rows = chunk,
                            .hidden = gx,
                            .head = gh,
                            .dt = dt,
                            .labels = gl,
                            .weights = weighted ? gw : NULL,
                            .grad_scale = 0.37f,
                            .loss = gloss,
                            .correct = gc,
                            .dhidden = gdh,
                            .dh_dt = DF_F32};
  void *ws = cu_alloc(df_cu_lmhead_ce_workspace(&a));
  DF_ASSERT_OK(df_cu_lmhead_ce(e->g, e->s, &a, ws, &err), &err);
  float *hl = cu_download(e, gloss, R, DF_F32), *hd = cu_download(e, gdh, R * H, DF_F32);
  uint8_t *hc = malloc((size_t)R);
  cu_download_bytes(e, hc, gc, (size_t)R);
  bool *tie = near_ties(x, head, R, H, V, 1e-4);
  df_expect_close("ce loss", hl, loss, R, dt == DF_BF16 ? 1e-4 : 2e-5, 0.0);
  expect_flags("correct", hc, correct, tie, R);
  if (dt == DF_F32)
    df_expect_close("ce dhidden", hd, dh, R * H, 1e-4, 0.0);
  else
    cr_expect_leq(cu_rel_l2(hd, dh, R * H), 1e-2, "ce dhidden relative L2 %.3g", cu_rel_l2(hd, dh, R * H));
  for (int64_t r = 0; r < R; r++)
    if (labels[r] < 0) {
      cr_expect(hl[r] == 0.0f && hc[r] == 0, "a skipped row has loss 0 and correct 0");
      for (int64_t h = 0; h < H; h++) cr_expect(hd[r * H + h] == 0.0f, "a skipped row has zero gradient");
    }
  // Forward only: same losses, dhidden untouched.
  a.dhidden = NULL;
  DF_ASSERT_OK(df_cu_lmhead_ce(e->g, e->s, &a, ws, &err), &err);
  float *hl2 = cu_download(e, gloss, R, DF_F32);
  for (int64_t r = 0; r < R; r++) cr_expect_eq(hl2[r], hl[r], "forward-only loss differs");
  free(hl), free(hl2), free(hd), free(hc), free(tie), free(x), free(head), free(w), free(loss), free(dh), free(labels);
  free(correct);
  cu_free(gx), cu_free(gh), cu_free(gw), cu_free(gl), cu_free(gloss), cu_free(gc), cu_free(gdh), cu_free(ws);
}

Test(cuda_lmhead, ce_matches_cpu_fp32_and_bf16_chunked) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  ce_case(&e, 150, 64, 1000, 0, DF_F32, true);
  ce_case(&e, 150, 64, 1000, 37, DF_F32, false); // several chunks, the last one partial
  ce_case(&e, 300, 128, 5003, 128, DF_BF16, true);
  cu_env_close(&e);
}

typedef struct {
  bool teacher, markov, conf;
} ds_opts;

static void dspark_case(cu_env *e, int64_t R, int64_t H, int64_t V, int64_t rk, int64_t chunk, df_dtype dt, ds_opts o) {
  float *x = malloc(4 * R * H), *head = malloc(4 * V * H), *tch = malloc(4 * R * H), *u = malloc(4 * R * rk);
  float *w2 = malloc(4 * V * rk), *w = malloc(4 * R), *conf = malloc(4 * R);
  int32_t *labels = malloc(4 * R);
  df_test_fill_uniform(x, R * H, 1900, -1, 1), df_test_fill_uniform(head, V * H, 1901, -0.5f, 0.5f);
  df_test_fill_uniform(tch, R * H, 1902, -1, 1), df_test_fill_uniform(u, R * rk, 1903, -1, 1);
  df_test_fill_uniform(w2, V * rk, 1904, -0.3f, 0.3f), df_test_fill_uniform(w, R, 1905, 0.1f, 2.0f);
  df_test_fill_uniform(conf, R, 1906, -3, 3);
  for (int64_t r = 0; r < R; r++) labels[r] = r % 7 == 2 ? -1 : (int32_t)((r * 53) % V);
  if (dt == DF_BF16)
    cu_round_bf16(x, R * H), cu_round_bf16(head, V * H), cu_round_bf16(tch, R * H), cu_round_bf16(u, R * rk),
        cu_round_bf16(w2, V * rk);
  // Outputs: 0 ce, 1 top1, 2 l1, 3 ttop1, 4 bce, 5 dconf; flags 0 correct, 1 agree; grads dh, du, dw2.
  float *per[6], *dh = malloc(4 * R * H), *du = malloc(4 * R * rk), *dw2 = calloc((size_t)(V * rk), 4);
  for (int i = 0; i < 6; i++) per[i] = calloc((size_t)R, 4);
  uint8_t *flags[2] = {calloc((size_t)R, 1), calloc((size_t)R, 1)};
  df_tensor tx = df_f32(x, R, H), th = df_f32(head, V, H), tt = df_f32(tch, R, H), tu = df_f32(u, R, rk);
  df_tensor tw2 = df_f32(w2, V, rk), tl = df_i32(labels, R), tw = df_f32(w, R), tcf = df_f32(conf, R);
  df_tensor tp[6], tf[2], tdh = df_f32(dh, R, H), tdu = df_f32(du, R, rk), tdw2 = df_f32(dw2, V, rk);
  for (int i = 0; i < 6; i++) tp[i] = df_f32(per[i], R);
  for (int i = 0; i < 2; i++) tf[i] = df_u8(flags[i], R);
  df_lmhead_dspark_desc d = {.chunk_rows = 0,
                             .grad_scale = 0.5f,
                             .alpha_ce = 1.0f,
                             .alpha_l1 = o.teacher ? 0.7f : 0.0f,
                             .alpha_conf = o.conf ? 0.3f : 0.0f};
  df_lmhead_dspark_in in = {.hidden = &tx,
                            .head = &th,
                            .markov_u = o.markov ? &tu : NULL,
                            .markov_w2 = o.markov ? &tw2 : NULL,
                            .teacher = o.teacher ? &tt : NULL,
                            .labels = &tl,
                            .weights = &tw,
                            .conf = o.conf ? &tcf : NULL};
  df_lmhead_dspark_out out = {.ce = &tp[0],
                              .correct = &tf[0],
                              .draft_top1 = &tp[1],
                              .l1 = o.teacher ? &tp[2] : NULL,
                              .agree = o.teacher ? &tf[1] : NULL,
                              .teacher_top1 = o.teacher ? &tp[3] : NULL,
                              .bce = o.conf ? &tp[4] : NULL,
                              .dhidden = &tdh,
                              .du = o.markov ? &tdu : NULL,
                              .dw2 = o.markov ? &tdw2 : NULL,
                              .dconf = o.conf ? &tp[5] : NULL};
  df_ctx *c = df_test_cpu_ctx(0);
  df_error err = {0};
  DF_ASSERT_OK(df_lmhead_dspark(c, &d, &in, &out, &err), &err);
  df_ctx_destroy(c);
  // The same on the GPU.
  void *gx = cu_upload(x, R * H, dt), *gh = cu_upload(head, V * H, dt), *gt = cu_upload(tch, R * H, dt);
  void *gu = cu_upload(u, R * rk, dt), *gw2 = cu_upload(w2, V * rk, dt), *gl = cu_upload_bytes(labels, 4 * R);
  void *gw = cu_upload(w, R, DF_F32), *gcf = cu_upload(conf, R, DF_F32);
  void *gp[6], *gf[2], *gdh = cu_alloc(4 * R * H), *gdu = cu_alloc(4 * R * rk);
  float *zero = calloc((size_t)(V * rk), 4);
  void *gdw2 = cu_upload(zero, V * rk, DF_F32);
  for (int i = 0; i < 6; i++) gp[i] = cu_alloc(4 * R);
  for (int i = 0; i < 2; i++) gf[i] = cu_alloc((size_t)R);
  df_cu_lmhead_dspark_args a = {.R = R,
                                .H = H,
                                .V = V,
                                .r = rk,
                                .chunk_rows = chunk,
                                .hidden = gx,
                                .head = gh,
                                .teacher = o.teacher ? gt : NULL,
                                .markov_u = o.markov ? gu : NULL,
                                .markov_w2 = o.markov ? gw2 : NULL,
                                .dt = dt,
                                .labels = gl,
                                .weights = gw,
                                .conf = o.conf ? gcf : NULL,
                                .grad_scale = 0.5f,
                                .alpha_ce = 1.0f,
                                .alpha_l1 = d.alpha_l1,
                                .alpha_conf = d.alpha_conf,
                                .ce = gp[0],
                                .correct = gf[0],
                                .draft_top1 = gp[1],
                                .l1 = o.teacher ? gp[2] : NULL,
                                .teacher_top1 = o.teacher ? gp[3] : NULL,
                                .bce = o.conf ? gp[4] : NULL,
                                .dconf = o.conf ? gp[5] : NULL,
                                .agree = o.teacher ? gf[1] : NULL,
                                .dhidden = gdh,
                                .du = o.markov ? gdu : NULL,
                                .dw2 = o.markov ? gdw2 : NULL,
                                .dh_dt = DF_F32};
  void *ws = cu_alloc(df_cu_lmhead_dspark_workspace(&a));
  DF_ASSERT_OK(df_cu_lmhead_dspark(e->g, e->s, &a, ws, &err), &err);
  const char *names[6] = {"ce", "draft_top1", "l1", "teacher_top1", "bce", "dconf"};
  const bool used[6] = {true, true, o.teacher, o.teacher, o.conf, o.conf};
  const double rt = dt == DF_BF16 ? 1e-4 : 2e-5;
  for (int i = 0; i < 6; i++) {
    if (!used[i]) continue;
    float *h = cu_download(e, gp[i], R, DF_F32);
    // l1 and bce sum |p − q| over V: relative to their own scale they carry the exps' rounding, hence 1e-4.
    df_expect_close(names[i], h, per[i], R, i >= 2 ? 1e-4 : rt, 1e-6);
    free(h);
  }
  bool *tie = near_ties(x, head, R, H, V, o.markov ? -1.0 : 1e-4); // with a Markov bias, compare only far ties
  if (!o.markov) {
    uint8_t *hc = malloc((size_t)R);
    cu_download_bytes(e, hc, gf[0], (size_t)R);
    expect_flags("correct", hc, flags[0], tie, R);
    free(hc);
  }
  float *hdh = cu_download(e, gdh, R * H, DF_F32);
  if (dt == DF_F32)
    df_expect_close("dspark dhidden", hdh, dh, R * H, 1e-4, 0.0);
  else
    cr_expect_leq(cu_rel_l2(hdh, dh, R * H), 1e-2, "dspark dhidden rel L2 %.3g", cu_rel_l2(hdh, dh, R * H));
  if (o.markov) {
    float *hdu = cu_download(e, gdu, R * rk, DF_F32), *hdw2 = cu_download(e, gdw2, V * rk, DF_F32);
    const double tol = dt == DF_F32 ? 1e-4 : 1e-2;
    cr_expect_leq(cu_rel_l2(hdu, du, R * rk), tol, "du rel L2 %.3g", cu_rel_l2(hdu, du, R * rk));
    cr_expect_leq(cu_rel_l2(hdw2, dw2, V * rk), tol, "dw2 rel L2 %.3g", cu_rel_l2(hdw2, dw2, V * rk));
    free(hdu), free(hdw2);
  }
  free(hdh), free(tie), free(zero);
  for (int i = 0; i < 6; i++) free(per[i]), cu_free(gp[i]);
  for (int i = 0; i < 2; i++) free(flags[i]), cu_free(gf[i]);
  free(x), free(head), free(tch), free(u), free(w2), free(w), free(conf), free(labels), free(dh), free(du), free(dw2);
  cu_free(gx), cu_free(gh), cu_free(gt), cu_free(gu), cu_free(gw2), cu_free(gl), cu_free(gw), cu_free(gcf);
  cu_free(gdh), cu_free(gdu), cu_free(gdw2), cu_free(ws);
}

Test(cuda_lmhead, dspark_objective_matches_cpu) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  dspark_case(&e, 120, 64, 900, 8, 0, DF_F32, (ds_opts){false, false, false}); // CE only
  dspark_case(&e, 120, 64, 900, 8, 50, DF_F32, (ds_opts){true, false, true});  // teacher + confidence, chunked
  dspark_case(&e, 120, 64, 900, 8, 33, DF_F32, (ds_opts){true, true, true});   // everything
  dspark_case(&e, 200, 128, 2000, 16, 64, DF_BF16, (ds_opts){true, true, true});
  cu_env_close(&e);
}

Test(cuda_lmhead, softmax_l1_and_bce_match_cpu) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { R = 17, V = 777 };
  float p[R * V], q[R * V], dl1[R], l1[R], dp[R * V], x[R], t[R], dloss[R], bl[R], bdx[R];
  df_test_fill_uniform(p, R * V, 2000, -3, 3), df_test_fill_uniform(q, R * V, 2001, -3, 3);
  df_test_fill_uniform(dl1, R, 2002, -1, 1), df_test_fill_uniform(x, R, 2003, -30, 30);
  df_test_fill_uniform(t, R, 2004, 0, 1), df_test_fill_uniform(dloss, R, 2005, -1, 1);
  df_ctx *c = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tp = df_f32(p, R, V), tq = df_f32(q, R, V), td = df_f32(dl1, R), tl = df_f32(l1, R);
  df_tensor tdp = df_f32(dp, R, V), tx = df_f32(x, R), tt = df_f32(t, R), tg = df_f32(dloss, R);
  df_tensor tbl = df_f32(bl, R), tbd = df_f32(bdx, R);
  DF_ASSERT_OK(df_softmax_l1_forward(c, &tp, &tq, &tl, &err), &err);
  DF_ASSERT_OK(df_softmax_l1_backward(c, &tp, &tq, &td, &tdp, &err), &err);
  DF_ASSERT_OK(df_bce_logits_forward(c, &tx, &tt, &tbl, &err), &err);
  DF_ASSERT_OK(df_bce_logits_backward(c, &tx, &tt, &tg, &tbd, &err), &err);
  df_ctx_destroy(c);
  void *gp = cu_upload(p, R * V, DF_F32), *gq = cu_upload(q, R * V, DF_F32), *gd = cu_upload(dl1, R, DF_F32);
  void *gl = cu_alloc(4 * R), *gdp = cu_alloc(4 * R * V), *gx = cu_upload(x, R, DF_F32), *gt = cu_upload(t, R, DF_F32);
  void *gg = cu_upload(dloss, R, DF_F32), *gbl = cu_alloc(4 * R), *gbd = cu_alloc(4 * R);
  DF_ASSERT_OK(df_cu_softmax_l1_fwd(e.s, gp, gq, gl, R, V, &err), &err);
  DF_ASSERT_OK(df_cu_softmax_l1_bwd(e.s, gp, gq, gd, gdp, R, V, &err), &err);
  DF_ASSERT_OK(df_cu_bce_logits_fwd(e.s, gx, gt, gbl, R, &err), &err);
  DF_ASSERT_OK(df_cu_bce_logits_bwd(e.s, gx, gt, gg, gbd, R, &err), &err);
  float *hl = cu_download(&e, gl, R, DF_F32), *hdp = cu_download(&e, gdp, R * V, DF_F32);
  float *hbl = cu_download(&e, gbl, R, DF_F32), *hbd = cu_download(&e, gbd, R, DF_F32);
  df_expect_close("l1", hl, l1, R, 1e-5, 0.0);
  df_expect_close("dl1/dp", hdp, dp, R * V, 1e-4, 0.0);
  df_expect_close("bce", hbl, bl, R, 1e-6, 0.0); // double arithmetic on both sides
  df_expect_close("bce dx", hbd, bdx, R, 1e-6, 0.0);
  free(hl), free(hdp), free(hbl), free(hbd);
  cu_free(gp), cu_free(gq), cu_free(gd), cu_free(gl), cu_free(gdp), cu_free(gx), cu_free(gt), cu_free(gg);
  cu_free(gbl), cu_free(gbd);
  cu_env_close(&e);
}
