// Fused AdamW + global norm + clip over flat buffers on the GPU against the CPU ops applied the trainer's way
// (grads × 1/Σw, df_global_norm, df_clip_by_norm, df_adamw_step per trainable span with its decay flag).
// Tolerances: the norm (double sums in another order) 1e-10 relative; masters and moments 2e-6 of max|ref| (the
// GPU may fuse multiply-adds); bf16 parameters bit-exact to the round-to-nearest-even of the GPU's own masters;
// untrainable gaps and skipped (non-finite) steps bit-exact.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cuda/cu_test.h"

enum { NSPAN = 3, TOTAL = 48000 };
static const int64_t OFF[NSPAN] = {0, 12000, 12032}, LEN[NSPAN] = {10000, 5, 30000};
static const uint8_t DECAY[NSPAN] = {1, 0, 1};

typedef struct {
  float *p, *g, *m, *v;
} state;

static state make_state(uint64_t seed) {
  state s = {malloc(4 * TOTAL), malloc(4 * TOTAL), malloc(4 * TOTAL), malloc(4 * TOTAL)};
  df_test_fill_uniform(s.p, TOTAL, seed, -1, 1), df_test_fill_uniform(s.g, TOTAL, seed + 1, -3, 3);
  df_test_fill_uniform(s.m, TOTAL, seed + 2, -0.1f, 0.1f), df_test_fill_uniform(s.v, TOTAL, seed + 3, 0, 0.01f);
  return s;
}

static void free_state(state *s) { free(s->p), free(s->g), free(s->m), free(s->v); }

// The CPU trainer's optimizer step; returns the norm (of the scaled gradients).
static double cpu_step(state *s, float scale, double max_norm, const df_adamw_hparams *hp) {
  df_ctx *c = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor gb[NSPAN];
  for (int i = 0; i < NSPAN; i++) {
    for (int64_t k = 0; k < LEN[i]; k++) s->g[OFF[i] + k] *= scale;
    gb[i] = df_f32(s->g + OFF[i], LEN[i]);
  }
  double norm = 0.0, coef = 1.0;
  DF_ASSERT_OK(df_global_norm(c, gb, NSPAN, &norm, &err), &err);
  if (!isfinite(norm)) {
    df_ctx_destroy(c);
    return norm;
  }
  DF_ASSERT_OK(df_clip_by_norm(c, gb, NSPAN, norm, max_norm, &coef, &err), &err);
  for (int i = 0; i < NSPAN; i++) {
    df_tensor p = df_f32(s->p + OFF[i], LEN[i]), m = df_f32(s->m + OFF[i], LEN[i]), v = df_f32(s->v + OFF[i], LEN[i]);
    df_adamw_hparams h = *hp;
    if (!DECAY[i]) h.weight_decay = 0.0f;
    DF_ASSERT_OK(df_adamw_step(c, &p, &gb[i], &m, &v, &h, &err), &err);
  }
  df_ctx_destroy(c);
  return norm;
}

static void gpu_step_case(double max_norm, bool poison_nan) {
  cu_env e = cu_env_open();
  df_error err = {0};
  state cpu = make_state(3000), ref0 = make_state(3000);
  if (poison_nan) cpu.g[OFF[2] + 77] = NAN, ref0.g[OFF[2] + 77] = NAN;
  const float scale = 0.125f;
  const df_adamw_hparams hp = {
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 7};
  const double norm = cpu_step(&cpu, scale, max_norm, &hp);
  df_cu_optim_plan plan;
  DF_ASSERT_OK(df_cu_optim_plan_make(OFF, LEN, DECAY, NSPAN, &plan, &err), &err);
  plan.d_chunks = cu_upload_bytes(plan.h_chunks, sizeof(df_cu_optim_chunk) * (size_t)plan.nchunks);
  void *gp = cu_upload(ref0.p, TOTAL, DF_F32), *gg = cu_upload(ref0.g, TOTAL, DF_F32);
  void *gm = cu_upload(ref0.m, TOTAL, DF_F32), *gv = cu_upload(ref0.v, TOTAL, DF_F32), *gb = cu_alloc(2 * TOTAL);
  void *gs = cu_upload(&scale, 1, DF_F32), *gn = cu_alloc(sizeof(double)),
       *ws = cu_alloc(df_cu_optim_norm_workspace(&plan));
  const df_cu_adamw_coefs c = df_cu_adamw_coefs_of(hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.step);
  const df_cu_adamw_coefs c0 = df_cu_adamw_coefs_of(hp.lr, hp.beta1, hp.beta2, hp.eps, 0.0f, hp.step);
  DF_ASSERT_OK(df_cu_global_norm(e.s, &plan, gg, gs, ws, gn, &err), &err);
  DF_ASSERT_OK(df_cu_adamw(e.s, &plan, gp, gb, DF_BF16, gg, gm, gv, &c, &c0, gs, gn, max_norm, &err), &err);
  double gnorm = 0.0;
  cu_download_bytes(&e, &gnorm, gn, sizeof gnorm);
  float *hp_ = cu_download(&e, gp, TOTAL, DF_F32), *hm = cu_download(&e, gm, TOTAL, DF_F32);
  float *hv = cu_download(&e, gv, TOTAL, DF_F32);
  uint16_t *hb = malloc(2 * TOTAL);
  cu_download_bytes(&e, hb, gb, 2 * TOTAL);
  if (poison_nan) {
    cr_expect(!isfinite(gnorm), "a NaN gradient must give a non-finite norm");
    cr_expect(!memcmp(hp_, ref0.p, 4 * TOTAL) && !memcmp(hm, ref0.m, 4 * TOTAL) && !memcmp(hv, ref0.v, 4 * TOTAL),
              "a non-finite norm must skip the whole update");
  } else {
    cr_expect_leq(fabs(gnorm - norm), 1e-10 * norm, "norm %.17g vs CPU %.17g", gnorm, norm);
    df_expect_close("masters", hp_, cpu.p, TOTAL, 2e-6, 0.0);
    df_expect_close("m", hm, cpu.m, TOTAL, 2e-6, 0.0);
    df_expect_close("v", hv, cpu.v, TOTAL, 2e-6, 0.0);
    for (int i = 0; i < NSPAN; i++)
      for (int64_t k = 0; k < LEN[i]; k++) {
        const int64_t x = OFF[i] + k;
        cr_expect_eq(hb[x], cu_bf16_bits(hp_[x]), "bf16 param at %lld is not RNE(master)", (long long)x);
      }
    for (int64_t x = OFF[0] + LEN[0]; x < OFF[1]; x++) // an untrainable gap (a buffer) is never touched
      cr_expect(hp_[x] == ref0.p[x] && hm[x] == ref0.m[x] && hv[x] == ref0.v[x], "gap element %lld changed",
                (long long)x);
  }
  free(hp_), free(hm), free(hv), free(hb), free_state(&cpu), free_state(&ref0);
  cu_free(gp), cu_free(gg), cu_free(gm), cu_free(gv), cu_free(gb), cu_free(gs), cu_free(gn), cu_free(ws);
  cu_free((void *)plan.d_chunks);
  df_cu_optim_plan_free(&plan);
  cu_env_close(&e);
}

Test(cuda_optim, fused_adamw_without_clipping) {
  CU_REQUIRE_GPU();
  gpu_step_case(1e9, false);
}

Test(cuda_optim, fused_adamw_with_clipping) {
  CU_REQUIRE_GPU();
  gpu_step_case(0.5, false);
}

Test(cuda_optim, non_finite_gradient_skips_the_step_on_device) {
  CU_REQUIRE_GPU();
  gpu_step_case(1.0, true);
}

Test(cuda_optim, norm_is_bitwise_deterministic) {
  CU_REQUIRE_GPU();
  cu_env e = cu_env_open();
  df_error err = {0};
  state s = make_state(3100);
  df_cu_optim_plan plan;
  DF_ASSERT_OK(df_cu_optim_plan_make(OFF, LEN, DECAY, NSPAN, &plan, &err), &err);
  plan.d_chunks = cu_upload_bytes(plan.h_chunks, sizeof(df_cu_optim_chunk) * (size_t)plan.nchunks);
  void *gg = cu_upload(s.g, TOTAL, DF_F32), *gn = cu_alloc(16), *ws = cu_alloc(df_cu_optim_norm_workspace(&plan));
  double n1 = 0, n2 = 0;
  DF_ASSERT_OK(df_cu_global_norm(e.s, &plan, gg, NULL, ws, gn, &err), &err);
  DF_ASSERT_OK(df_cu_global_norm(e.s, &plan, gg, NULL, ws, (double *)gn + 1, &err), &err);
  cu_download_bytes(&e, &n1, gn, 8);
  cu_download_bytes(&e, &n2, (double *)gn + 1, 8);
  cr_expect(!memcmp(&n1, &n2, 8), "two norms of the same buffer differ");
  free_state(&s), cu_free(gg), cu_free(gn), cu_free(ws), cu_free((void *)plan.d_chunks);
  df_cu_optim_plan_free(&plan);
  cu_env_close(&e);
}
