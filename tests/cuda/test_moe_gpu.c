// MoE pieces on the GPU against their CPU twins in moe/: score functions and their backward, selection (plain,
// with a selection bias, group-limited), the weights' backward, centering, the EMA and noaux_tc updates, the switch
// aux loss, load statistics, the dispatch plan, the routed experts (fp32 and bf16) and the gated shared expert.
// Tolerances: routing math in double on both sides: 1e-6 of max|ref|, indices, counts and the dispatch plan exact;
// fp32 experts 1e-5 (grouped cuBLAS vs OpenBLAS accumulation order); bf16 experts relative L2 1e-2; the
// gather-combine bit-exact (same inputs, the CPU's order).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/aux_loss.h"
#include "moe/experts.h"
#include "moe/router.h"
#include "moe/shared_expert.h"
#include "tests/cuda/cu_test.h"

static df_ctx *cpu(void) { return df_test_cpu_ctx(1); }

// ---- router ----------------------------------------------------------------------------------------------------

static void scores_case(cu_env *e, df_moe_score_func f) {
  enum { T = 70, E = 64 };
  float l[T * E], s[T * E], ds[T * E], dl[T * E];
  df_test_fill_uniform(l, T * E, 3300 + f, -4, 4), df_test_fill_uniform(ds, T * E, 3310 + f, -1, 1);
  df_ctx *c = cpu();
  df_moe_scores_forward(c, f, T, E, l, s);
  df_moe_scores_backward(c, f, T, E, l, s, ds, dl);
  df_ctx_destroy(c);
  df_error err = {0};
  void *gl = cu_upload(l, T * E, DF_F32), *gs = cu_alloc(sizeof s), *gds = cu_upload(ds, T * E, DF_F32);
  DF_ASSERT_OK(df_cu_moe_scores_fwd(e->s, (df_cu_score_func)f, T, E, gl, gs, &err), &err);
  DF_ASSERT_OK(df_cu_moe_scores_bwd(e->s, (df_cu_score_func)f, T, E, gl, gs, gds, gds, &err), &err); // in place
  float *hs = cu_download(e, gs, T * E, DF_F32), *hdl = cu_download(e, gds, T * E, DF_F32);
  df_expect_close("scores", hs, s, T * E, 1e-6, 0.0);
  df_expect_close("dlogits", hdl, dl, T * E, 1e-6, 0.0);
  free(hs), free(hdl), cu_free(gl), cu_free(gs), cu_free(gds);
}

Test(cuda_moe, score_functions_forward_backward) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  scores_case(&e, DF_MOE_SCORE_SOFTMAX);
  scores_case(&e, DF_MOE_SCORE_SIGMOID);
  scores_case(&e, DF_MOE_SCORE_SQRTSOFTPLUS);
  cu_env_close(&e);
}

static void select_case(cu_env *e, const df_moe_router_spec *sp, bool shift, uint64_t seed) {
  const int64_t T = 200, E = sp->E, k = sp->k;
  float *sc = malloc(4 * T * E), *sh = malloc(4 * E), *sel = malloc(4 * df_moe_router_sel_elems(sp, T));
  float *w = malloc(4 * T * k), *dw = malloc(4 * T * k), *ds = malloc(4 * T * E), *aux = malloc(4 * E);
  int32_t *idx = malloc(4 * T * k), *cnt = malloc(4 * E);
  df_test_fill_uniform(sc, T * E, seed, 0, 1), df_test_fill_uniform(sh, E, seed + 1, -0.2f, 0.2f);
  df_test_fill_uniform(dw, T * k, seed + 2, -1, 1), df_test_fill_uniform(aux, E, seed + 3, -0.1f, 0.1f);
  df_moe_routing r = {.T = T, .scores = sc, .indices = idx, .weights = w, .counts = cnt};
  df_ctx *c = cpu();
  df_moe_router_select(c, sp, shift ? sh : NULL, sel, &r);
  df_moe_router_weights_backward(c, sp, &r, dw, aux, ds);
  df_ctx_destroy(c);
  df_cu_router_spec cs = {.E = E,
                          .k = k,
                          .score = (df_cu_score_func)sp->score_func,
                          .norm_topk_prob = sp->norm_topk_prob,
                          .routed_scaling_factor = sp->routed_scaling_factor,
                          .n_group = sp->n_group,
                          .topk_group = sp->topk_group};
  df_error err = {0};
  void *gsc = cu_upload(sc, T * E, DF_F32), *gsh = cu_upload(sh, E, DF_F32), *gi = cu_alloc(4 * T * k);
  void *gw = cu_alloc(4 * T * k), *gc = cu_alloc(4 * E), *gdw = cu_upload(dw, T * k, DF_F32);
  void *gaux = cu_upload(aux, E, DF_F32), *gds = cu_alloc(4 * T * E);
  DF_ASSERT_OK(df_cu_moe_select(e->s, &cs, T, gsc, shift ? gsh : NULL, gi, gw, gc, &err), &err);
  DF_ASSERT_OK(df_cu_moe_weights_bwd(e->s, &cs, T, gsc, gi, gw, gdw, gaux, gds, &err), &err);
  int32_t *hi = malloc(4 * T * k), *hc = malloc(4 * E);
  cu_download_bytes(e, hi, gi, 4 * T * k), cu_download_bytes(e, hc, gc, 4 * E);
  for (int64_t i = 0; i < T * k; i++) cr_assert_eq(hi[i], idx[i], "top-k index [%lld]", (long long)i);
  for (int64_t x = 0; x < E; x++) cr_assert_eq(hc[x], cnt[x], "count of expert %lld", (long long)x);
  float *hw = cu_download(e, gw, T * k, DF_F32), *hds = cu_download(e, gds, T * E, DF_F32);
  df_expect_close("combine weights", hw, w, T * k, 1e-6, 0.0);
  df_expect_close("dscores", hds, ds, T * E, 1e-6, 0.0);
  free(hi), free(hc), free(hw), free(hds), free(sc), free(sh), free(sel), free(w), free(dw), free(ds), free(aux);
  free(idx), free(cnt);
  cu_free(gsc), cu_free(gsh), cu_free(gi), cu_free(gw), cu_free(gc), cu_free(gdw), cu_free(gaux), cu_free(gds);
}

Test(cuda_moe, selection_plain_biased_and_grouped) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  df_moe_router_spec plain = {.H = 8,
                              .E = 512,
                              .k = 10,
                              .score_func = DF_MOE_SCORE_SOFTMAX,
                              .norm_topk_prob = true,
                              .routed_scaling_factor = 1.0f,
                              .n_group = 1,
                              .topk_group = 1};
  select_case(&e, &plain, false, 3400);
  df_moe_router_spec biased = {.H = 8,
                               .E = 64,
                               .k = 6,
                               .score_func = DF_MOE_SCORE_SIGMOID,
                               .norm_topk_prob = true,
                               .routed_scaling_factor = 1.5f,
                               .n_group = 1,
                               .topk_group = 1};
  select_case(&e, &biased, true, 3500);
  df_moe_router_spec grouped = {.H = 8,
                                .E = 64,
                                .k = 6,
                                .score_func = DF_MOE_SCORE_SQRTSOFTPLUS,
                                .norm_topk_prob = false,
                                .routed_scaling_factor = 2.5f,
                                .n_group = 8,
                                .topk_group = 3};
  select_case(&e, &grouped, true, 3600);
  cu_env_close(&e);
}

// ---- centering, EMA, noaux_tc, aux loss, stats -----------------------------------------------------------------

Test(cuda_moe, centering_forward_backward_and_fixed) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { T = 96, H = 40, RPS = 32 };
  float x[T * H], u[T * H], mean[H], du[T * H], dx[T * H], mu[H], uf[T * H];
  df_test_fill_uniform(x, T * H, 3700, -2, 2), df_test_fill_uniform(du, T * H, 3701, -1, 1);
  df_test_fill_uniform(mu, H, 3702, -1, 1);
  for (int i = 0; i < T * H; i++) dx[i] = 0.5f;
  df_ctx *c = cpu();
  df_error err = {0};
  DF_ASSERT_OK(df_moe_center_sample_forward(c, x, T, H, RPS, u, mean, &err), &err);
  df_moe_center_sample_backward(c, du, T, H, RPS, dx, true);
  df_moe_center_fixed(c, x, mu, T, H, uf);
  df_ctx_destroy(c);
  float half[T * H];
  for (int i = 0; i < T * H; i++) half[i] = 0.5f;
  void *gx = cu_upload(x, T * H, DF_F32), *gu = cu_alloc(sizeof u), *gm = cu_alloc(sizeof mean);
  void *gdu = cu_upload(du, T * H, DF_F32), *gdx = cu_upload(half, T * H, DF_F32), *gmu = cu_upload(mu, H, DF_F32);
  void *guf = cu_alloc(sizeof uf);
  DF_ASSERT_OK(df_cu_moe_center_sample_fwd(e.s, gx, T, H, RPS, gu, gm, &err), &err);
  DF_ASSERT_OK(df_cu_moe_center_sample_bwd(e.s, gdu, T, H, RPS, gdx, true, &err), &err);
  DF_ASSERT_OK(df_cu_moe_center_fixed(e.s, gx, gmu, T, H, guf, &err), &err);
  float *hu = cu_download(&e, gu, T * H, DF_F32), *hm = cu_download(&e, gm, H, DF_F32);
  float *hdx = cu_download(&e, gdx, T * H, DF_F32), *huf = cu_download(&e, guf, T * H, DF_F32);
  df_expect_close("centered u", hu, u, T * H, 1e-6, 0.0);
  df_expect_close("batch mean", hm, mean, H, 1e-6, 0.0);
  df_expect_close("centering backward (accumulated)", hdx, dx, T * H, 1e-6, 0.0);
  for (int i = 0; i < T * H; i++) cr_assert_eq(huf[i], uf[i], "fixed centering is one subtraction");
  free(hu), free(hm), free(hdx), free(huf);
  cu_free(gx), cu_free(gu), cu_free(gm), cu_free(gdu), cu_free(gdx), cu_free(gmu), cu_free(guf);
  cu_env_close(&e);
}

Test(cuda_moe, ema_noaux_switch_loss_and_stats) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { E = 48, T = 2500, K = 4, H = 10 };
  int32_t counts[E];
  float scores[T * E], bias[E], stash[H], mu[H];
  df_test_fill_uniform(scores, T * E, 3800, 0, 1), df_test_fill_uniform(bias, E, 3801, -0.1f, 0.1f);
  df_test_fill_uniform(stash, H, 3802, -1, 1), df_test_fill_uniform(mu, H, 3803, -1, 1);
  int64_t tot = 0;
  for (int x = 0; x < E; x++) counts[x] = (x * 37) % 400, tot += counts[x];
  counts[5] = 0;
  df_error err = {0};
  const double coeff = 0.001, rho = 0.99;
  void *gc = cu_upload_bytes(counts, sizeof counts), *gs = cu_upload(scores, T * E, DF_F32);
  void *gb = cu_upload(bias, E, DF_F32), *gst = cu_upload(stash, H, DF_F32), *gmu = cu_upload(mu, H, DF_F32);
  const float one = 1.0f;
  void *gsteps = cu_upload(&one, 1, DF_F32), *gl = cu_alloc(8), *gst3 = cu_alloc(24), *grow = cu_alloc(4 * E);
  void *ws = cu_alloc(df_cu_moe_aux_workspace(T, E));
  DF_ASSERT_OK(df_cu_moe_center_ema(e.s, H, gst, gmu, gsteps, rho, &err), &err);
  DF_ASSERT_OK(df_cu_moe_noaux_update(e.s, E, gc, gb, 0.01f, &err), &err);
  DF_ASSERT_OK(df_cu_moe_switch_loss(e.s, coeff, T, E, gs, gc, ws, gl, &err), &err);
  DF_ASSERT_OK(df_cu_moe_switch_grad_row(e.s, coeff, T, E, gc, 2.0, grow, &err), &err);
  DF_ASSERT_OK(df_cu_moe_load_stats(e.s, gc, E, T, K, gst3, &err), &err);
  float *hmu = cu_download(&e, gmu, H, DF_F32), *hb = cu_download(&e, gb, E, DF_F32),
        *hrow = cu_download(&e, grow, E, DF_F32);
  float hsteps = 0;
  double hl = 0, hst[3];
  cu_download_bytes(&e, &hsteps, gsteps, 4), cu_download_bytes(&e, &hl, gl, 8), cu_download_bytes(&e, hst, gst3, 24);
  // EMA (steps was 1, not the first update): μ ← ρμ + (1 − ρ)m.
  float want_mu[H];
  for (int c = 0; c < H; c++) want_mu[c] = (float)(rho * (double)mu[c] + (1.0 - rho) * (double)stash[c]);
  df_expect_close("EMA mean", hmu, want_mu, H, 1e-7, 0.0);
  cr_expect_eq(hsteps, 2.0f, "steps counts updates");
  double mean = 0;
  for (int x = 0; x < E; x++) mean += counts[x];
  mean /= E;
  for (int x = 0; x < E; x++) {
    const float sgn = mean - counts[x] > 0 ? 1.0f : (mean - counts[x] < 0 ? -1.0f : 0.0f);
    cr_expect_eq(hb[x], bias[x] + 0.01f * sgn, "noaux_tc bias %d", x);
  }
  const double want = df_moe_switch_loss(coeff, T, E, K, scores, counts);
  cr_expect_leq(fabs(hl - want), 1e-12 * fabs(want) + 1e-18, "switch loss %.17g vs %.17g", hl, want);
  float row[E];
  df_moe_switch_score_grad_row(coeff, T, E, K, counts, 2.0, row);
  for (int x = 0; x < E; x++) cr_expect_eq(hrow[x], row[x], "aux grad row %d", x);
  const df_moe_load_stats st = df_moe_load_stats_of(counts, E, T, K);
  cr_expect(hst[0] == st.load_max_ratio && hst[1] == st.load_min_ratio && hst[2] == st.experts_unused_frac,
            "load stats differ");
  free(hmu), free(hb), free(hrow);
  cu_free(gc), cu_free(gs), cu_free(gb), cu_free(gst), cu_free(gmu), cu_free(gsteps), cu_free(gl), cu_free(gst3);
  cu_free(grow), cu_free(ws);
  (void)tot;
  cu_env_close(&e);
}

// ---- experts ---------------------------------------------------------------------------------------------------

typedef struct {
  int64_t T, H, I, E, k;
  float *x, *w1, *w3, *w2, *dy, *weights;
  int32_t *idx, *counts;
} moe_data;

static moe_data make_moe(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, bool round, uint64_t seed) {
  moe_data m = {.T = T, .H = H, .I = I, .E = E, .k = k};
  m.x = malloc(4 * T * H), m.w1 = malloc(4 * E * I * H), m.w3 = malloc(4 * E * I * H), m.w2 = malloc(4 * E * H * I);
  m.dy = malloc(4 * T * H), m.weights = malloc(4 * T * k), m.idx = malloc(4 * T * k), m.counts = calloc((size_t)E, 4);
  df_test_fill_uniform(m.x, T * H, seed, -1, 1), df_test_fill_uniform(m.w1, E * I * H, seed + 1, -0.2f, 0.2f);
  df_test_fill_uniform(m.w3, E * I * H, seed + 2, -0.2f, 0.2f),
      df_test_fill_uniform(m.w2, E * H * I, seed + 3, -0.2f, 0.2f);
  df_test_fill_uniform(m.dy, T * H, seed + 4, -1, 1), df_test_fill_uniform(m.weights, T * k, seed + 5, 0, 1);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) { // k distinct experts per row; expert E−1 never used
      const int32_t ex = (int32_t)((t * 7 + j * 3) % (E - 1));
      m.idx[t * k + j] = ex;
      m.counts[ex]++;
    }
  if (round) {
    cu_round_bf16(m.x, T * H), cu_round_bf16(m.w1, E * I * H), cu_round_bf16(m.w3, E * I * H);
    cu_round_bf16(m.w2, E * H * I), cu_round_bf16(m.dy, T * H);
  }
  return m;
}

static void free_moe(moe_data *m) {
  free(m->x), free(m->w1), free(m->w3), free(m->w2), free(m->dy), free(m->weights), free(m->idx), free(m->counts);
}

static void experts_case(cu_env *e, df_dtype dt, float limit) {
  moe_data m = make_moe(45, 32, 24, 9, 3, dt == DF_BF16, 3900);
  const int64_t T = m.T, H = m.H, I = m.I, E = m.E, k = m.k, Tk = T * k;
  // CPU reference.
  df_moe_experts_spec sp = {.H = H, .I = I, .E = E, .k = k, .swiglu_limit = limit};
  float *g1 = calloc((size_t)(E * I * H), 4), *g3 = calloc((size_t)(E * I * H), 4),
        *g2 = calloc((size_t)(E * H * I), 4);
  df_moe_experts_params p = {.w1 = df_f32(m.w1, E, I, H),
                             .w3 = df_f32(m.w3, E, I, H),
                             .w2 = df_f32(m.w2, E, H, I),
                             .g1 = df_f32(g1, E, I, H),
                             .g3 = df_f32(g3, E, I, H),
                             .g2 = df_f32(g2, E, H, I)};
  int32_t *slot = malloc(4 * Tk), *token = malloc(4 * Tk), *offs = malloc(4 * (E + 1));
  float *gate = malloc(4 * Tk * I), *up = malloc(4 * Tk * I), *y = malloc(4 * T * H), *dx = calloc((size_t)(T * H), 4);
  float *dwts = malloc(4 * Tk);
  df_moe_slots d = {.slot = slot, .token = token, .offsets = offs, .gate = gate, .up = up};
  int64_t nsc = df_moe_experts_forward_scratch_elems(&sp, T), nsb = df_moe_experts_backward_scratch_elems(&sp, T);
  float *scratch = malloc(4 * (nsc > nsb ? nsc : nsb));
  df_ctx *c = cpu();
  df_error err = {0};
  df_tensor tx = df_f32(m.x, T, H), ty = df_f32(y, T, H), tdy = df_f32(m.dy, T, H), tdx = df_f32(dx, T, H);
  DF_ASSERT_OK(df_moe_experts_forward(c, &sp, &p, &tx, m.idx, m.weights, m.counts, &d, scratch, &ty, &err), &err);
  DF_ASSERT_OK(df_moe_experts_backward(c, &sp, &p, &tx, &tdy, m.weights, &d, scratch, dwts, &tdx, &err), &err);
  df_ctx_destroy(c);
  // GPU.
  float *zero = calloc((size_t)(E * I * H > T * H ? E * I * H : T * H), 4);
  df_cu_moe_experts_args a = {.T = T,
                              .H = H,
                              .I = I,
                              .E = E,
                              .k = k,
                              .swiglu_limit = limit,
                              .dt = dt,
                              .x = cu_upload(m.x, T * H, dt),
                              .w1 = cu_upload(m.w1, E * I * H, dt),
                              .w3 = cu_upload(m.w3, E * I * H, dt),
                              .w2 = cu_upload(m.w2, E * H * I, dt),
                              .g1 = cu_upload(zero, E * I * H, DF_F32),
                              .g3 = cu_upload(zero, E * I * H, DF_F32),
                              .g2 = cu_upload(zero, E * H * I, DF_F32),
                              .indices = cu_upload_bytes(m.idx, 4 * Tk),
                              .weights = cu_upload(m.weights, Tk, DF_F32),
                              .counts = cu_upload_bytes(m.counts, 4 * E),
                              .h_counts = m.counts,
                              .offsets = cu_alloc(4 * (E + 1)),
                              .slot = cu_alloc(4 * Tk),
                              .token = cu_alloc(4 * Tk),
                              .pos = cu_alloc(4 * Tk),
                              .gate = cu_alloc(4 * Tk * I),
                              .up = cu_alloc(4 * Tk * I)};
  size_t wf = df_cu_moe_experts_fwd_workspace(&a), wb = df_cu_moe_experts_bwd_workspace(&a);
  void *ws = cu_alloc(wf > wb ? wf : wb), *gy = cu_alloc(4 * T * H), *gdy = cu_upload(m.dy, T * H, dt);
  void *gdx = cu_upload(zero, T * H, DF_F32), *gdw = cu_alloc(4 * Tk);
  DF_ASSERT_OK(df_cu_moe_experts_fwd(e->g, e->s, &a, gy, DF_F32, ws, &err), &err);
  DF_ASSERT_OK(df_cu_moe_experts_bwd(e->g, e->s, &a, gdy, dt, gdw, gdx, DF_F32, ws, &err), &err);
  int32_t *hslot = malloc(4 * Tk), *hoff = malloc(4 * (E + 1));
  cu_download_bytes(e, hslot, a.slot, 4 * Tk), cu_download_bytes(e, hoff, a.offsets, 4 * (E + 1));
  for (int64_t i = 0; i < Tk; i++) cr_assert_eq(hslot[i], slot[i], "dispatch slot [%lld]", (long long)i);
  for (int64_t x = 0; x <= E; x++) cr_assert_eq(hoff[x], offs[x], "expert offset [%lld]", (long long)x);
  float *hy = cu_download(e, gy, T * H, DF_F32), *hdx = cu_download(e, gdx, T * H, DF_F32);
  float *hdw = cu_download(e, gdw, Tk, DF_F32), *hg1 = cu_download(e, a.g1, E * I * H, DF_F32);
  float *hg3 = cu_download(e, a.g3, E * I * H, DF_F32), *hg2 = cu_download(e, a.g2, E * H * I, DF_F32);
  if (dt == DF_F32) {
    df_expect_close("experts y", hy, y, T * H, 1e-5, 0.0), df_expect_close("experts dx", hdx, dx, T * H, 1e-5, 0.0);
    df_expect_close("dweights", hdw, dwts, Tk, 1e-5, 0.0), df_expect_close("dw1", hg1, g1, E * I * H, 1e-5, 0.0);
    df_expect_close("dw3", hg3, g3, E * I * H, 1e-5, 0.0), df_expect_close("dw2", hg2, g2, E * H * I, 1e-5, 0.0);
  } else {
    const float *got[6] = {hy, hdx, hdw, hg1, hg3, hg2}, *want[6] = {y, dx, dwts, g1, g3, g2};
    const int64_t n[6] = {T * H, T * H, Tk, E * I * H, E * I * H, E * H * I};
    const char *names[6] = {"y", "dx", "dweights", "dw1", "dw3", "dw2"};
    for (int i = 0; i < 6; i++)
      cr_expect_leq(cu_rel_l2(got[i], want[i], n[i]), 1e-2, "bf16 experts %s rel L2 %.3g", names[i],
                    cu_rel_l2(got[i], want[i], n[i]));
  }
  for (int64_t x = 0; x < H * I; x++) cr_expect_eq(hg2[(E - 1) * H * I + x], 0.0f, "unused expert got a gradient");
  free(hy), free(hdx), free(hdw), free(hg1), free(hg3), free(hg2), free(hslot), free(hoff);
  void *dev[] = {(void *)a.x,
                 (void *)a.w1,
                 (void *)a.w3,
                 (void *)a.w2,
                 a.g1,
                 a.g3,
                 a.g2,
                 (void *)a.indices,
                 (void *)a.weights,
                 (void *)a.counts,
                 a.offsets,
                 a.slot,
                 a.token,
                 a.pos,
                 a.gate,
                 a.up,
                 ws,
                 gy,
                 gdy,
                 gdx,
                 gdw};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cu_free(dev[i]);
  free(g1), free(g3), free(g2), free(slot), free(token), free(offs), free(gate), free(up), free(y), free(dx);
  free(dwts), free(scratch), free(zero), free_moe(&m);
}

Test(cuda_moe, routed_experts_forward_backward) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  experts_case(&e, DF_F32, 0.0f);
  experts_case(&e, DF_F32, 0.4f); // the DeepSeek-V4 clamp, scaled to these magnitudes
  experts_case(&e, DF_BF16, 0.0f);
  cu_env_close(&e);
}

Test(cuda_moe, gated_shared_expert_forward_backward) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  enum { T = 40, H = 32, S = 48 };
  float x[T * H], w1[S * H], w3[S * H], w2[H * S], wg[H], dy[T * H], y[T * H], dx[T * H];
  float g1[S * H] = {0}, g3[S * H] = {0}, g2[H * S] = {0}, gg[H] = {0};
  df_test_fill_uniform(x, T * H, 4000, -1, 1), df_test_fill_uniform(w1, S * H, 4001, -0.3f, 0.3f);
  df_test_fill_uniform(w3, S * H, 4002, -0.3f, 0.3f), df_test_fill_uniform(w2, H * S, 4003, -0.3f, 0.3f);
  df_test_fill_uniform(wg, H, 4004, -0.3f, 0.3f), df_test_fill_uniform(dy, T * H, 4005, -1, 1);
  df_test_fill_uniform(y, T * H, 4006, -1, 1); // the shared output is added onto the routed sum
  for (int i = 0; i < T * H; i++) dx[i] = 0.25f;
  float y0[T * H];
  memcpy(y0, y, sizeof y);
  df_moe_shared_spec sp = {.H = H, .S = S, .gated = true};
  df_moe_shared_params p = {.w1 = df_f32(w1, S, H),
                            .w3 = df_f32(w3, S, H),
                            .w2 = df_f32(w2, H, S),
                            .gate = df_f32(wg, 1, H),
                            .g1 = df_f32(g1, S, H),
                            .g3 = df_f32(g3, S, H),
                            .g2 = df_f32(g2, H, S),
                            .ggate = df_f32(gg, 1, H)};
  float *saved = malloc(4 * df_moe_shared_saved_elems(&sp, T)),
        *scratch = malloc(4 * df_moe_shared_scratch_elems(&sp, T));
  df_moe_shared_saved sv = df_moe_shared_saved_at(&sp, T, saved);
  df_ctx *c = cpu();
  df_error err = {0};
  df_tensor tx = df_f32(x, T, H), ty = df_f32(y, T, H), tdy = df_f32(dy, T, H), tdx = df_f32(dx, T, H);
  DF_ASSERT_OK(df_moe_shared_forward(c, &sp, &p, &tx, &sv, scratch, &ty, &err), &err);
  DF_ASSERT_OK(df_moe_shared_backward(c, &sp, &p, &tx, &tdy, &sv, scratch, &tdx, &err), &err);
  df_ctx_destroy(c);
  float zeros[S * H] = {0}, quarter[T * H];
  for (int i = 0; i < T * H; i++) quarter[i] = 0.25f;
  df_cu_moe_shared_args a = {.T = T,
                             .H = H,
                             .S = S,
                             .gated = true,
                             .dt = DF_F32,
                             .x = cu_upload(x, T * H, DF_F32),
                             .w1 = cu_upload(w1, S * H, DF_F32),
                             .w3 = cu_upload(w3, S * H, DF_F32),
                             .w2 = cu_upload(w2, H * S, DF_F32),
                             .wg = cu_upload(wg, H, DF_F32),
                             .g1 = cu_upload(zeros, S * H, DF_F32),
                             .g3 = cu_upload(zeros, S * H, DF_F32),
                             .g2 = cu_upload(zeros, H * S, DF_F32),
                             .gg = cu_upload(zeros, H, DF_F32),
                             .gate = cu_alloc(4 * T * S),
                             .up = cu_alloc(4 * T * S),
                             .z = cu_alloc(4 * T)};
  void *ws = cu_alloc(df_cu_moe_shared_workspace(&a)), *gy = cu_upload(y0, T * H, DF_F32);
  void *gdy = cu_upload(dy, T * H, DF_F32), *gdx = cu_upload(quarter, T * H, DF_F32);
  DF_ASSERT_OK(df_cu_moe_shared_fwd(e.g, e.s, &a, gy, DF_F32, ws, &err), &err);
  DF_ASSERT_OK(df_cu_moe_shared_bwd(e.g, e.s, &a, gdy, DF_F32, gdx, DF_F32, ws, &err), &err);
  float *hy = cu_download(&e, gy, T * H, DF_F32), *hdx = cu_download(&e, gdx, T * H, DF_F32);
  float *h1 = cu_download(&e, a.g1, S * H, DF_F32), *h3 = cu_download(&e, a.g3, S * H, DF_F32);
  float *h2 = cu_download(&e, a.g2, H * S, DF_F32), *hg = cu_download(&e, a.gg, H, DF_F32);
  df_expect_close("shared y", hy, y, T * H, 1e-5, 0.0), df_expect_close("shared dx", hdx, dx, T * H, 1e-5, 0.0);
  df_expect_close("shared dw1", h1, g1, S * H, 1e-5, 0.0), df_expect_close("shared dw3", h3, g3, S * H, 1e-5, 0.0);
  df_expect_close("shared dw2", h2, g2, H * S, 1e-5, 0.0), df_expect_close("shared dgate", hg, gg, H, 1e-5, 0.0);
  free(hy), free(hdx), free(h1), free(h3), free(h2), free(hg), free(saved), free(scratch);
  void *dev[] = {(void *)a.x, (void *)a.w1, (void *)a.w3, (void *)a.w2, (void *)a.wg, a.g1, a.g3, a.g2,
                 a.gg,        a.gate,       a.up,         a.z,          ws,           gy,   gdy,  gdx};
  for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cu_free(dev[i]);
  cu_env_close(&e);
}
