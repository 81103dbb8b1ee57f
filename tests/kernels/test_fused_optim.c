// The fused optimizer step (grad_norm_clip + adamw_fused over the flat buffer, kernels/ops.h) against the
// per-tensor sequence it replaces — scale in place, df_global_norm, df_clip_by_norm, df_adamw_step per trainable
// tensor with its decay flag: bit for bit on the CPU; the mask keeps padding and buffers untouched; a non-finite
// norm or guard skips the step on the device.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

// Four "tensors" in one flat buffer with padding between them: trainable+decay, trainable, a buffer, trainable.
enum { N = 4096 + 48, NT = 4 };
static const int64_t off[NT] = {0, 1040, 3000, 3100}, len[NT] = {1030, 1900, 90, 1000};
static const uint8_t flags[NT] = {DF_PARAM_TRAIN | DF_PARAM_DECAY, DF_PARAM_TRAIN, 0, DF_PARAM_TRAIN};

typedef struct {
  float p[N], g[N], m[N], v[N];
  uint8_t mask[N];
} flat;

static void flat_make(flat *f, float gscale) {
  memset(f, 0, sizeof *f);
  df_test_fill_uniform(f->p, N, 1, -1.0f, 1.0f);
  df_test_fill_uniform(f->g, N, 2, -gscale, gscale);
  df_test_fill_uniform(f->m, N, 3, -0.01f, 0.01f);
  df_test_fill_uniform(f->v, N, 4, 0.0f, 0.001f);
  for (int t = 0; t < NT; t++)
    for (int64_t i = off[t]; i < off[t] + len[t]; i++) f->mask[i] = flags[t];
  for (int64_t i = 0; i < N; i++)
    if (!f->mask[i]) f->g[i] = 5.0f; // padding and the buffer carry garbage that must not count
}

static const df_adamw_hparams HP = {
    .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};

// The old sequence on a copy: g *= scale per trainable tensor, norm, clip, AdamW per tensor.
static void reference(flat *f, float scale, double max_norm, double *norm, double *coef) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor gv[NT], pv[NT], mv[NT], vv[NT];
  int k = 0;
  bool decay[NT];
  for (int t = 0; t < NT; t++) {
    if (!flags[t]) continue;
    for (int64_t i = off[t]; i < off[t] + len[t]; i++) f->g[i] *= scale;
    gv[k] = df_f32(f->g + off[t], len[t]), pv[k] = df_f32(f->p + off[t], len[t]);
    mv[k] = df_f32(f->m + off[t], len[t]), vv[k] = df_f32(f->v + off[t], len[t]);
    decay[k++] = flags[t] & DF_PARAM_DECAY;
  }
  DF_ASSERT_OK(df_global_norm(ctx, gv, k, norm, &err), &err);
  DF_ASSERT_OK(df_clip_by_norm(ctx, gv, k, *norm, max_norm, coef, &err), &err);
  for (int j = 0; j < k; j++) {
    df_adamw_hparams hp = HP;
    hp.weight_decay = decay[j] ? HP.weight_decay : 0.0f;
    DF_ASSERT_OK(df_adamw_step(ctx, &pv[j], &gv[j], &mv[j], &vv[j], &hp, &err), &err);
  }
  df_ctx_destroy(ctx);
}

static void fused(flat *f, float scale, double max_norm, const double *guard, double *stats) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor p = df_f32(f->p, N), g = df_f32(f->g, N), m = df_f32(f->m, N), v = df_f32(f->v, N);
  df_tensor mk = df_u8(f->mask, N), st = df_view(stats, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(DF_NORM_STATS));
  df_tensor gd = df_view((void *)guard, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(2));
  df_grad_norm_desc nd = {.grad_scale = scale, .max_norm = max_norm};
  DF_ASSERT_OK(df_grad_norm_clip(ctx, &nd, &g, &mk, guard ? &gd : NULL, &st, &err), &err);
  df_adamw_fused_desc ad = {.hp = HP, .grad_scale = scale};
  DF_ASSERT_OK(df_adamw_fused(ctx, &ad, &p, &g, &m, &v, &mk, &st, NULL, &err), &err);
  df_ctx_destroy(ctx);
}

static void expect_same_state(const flat *a, const flat *b) {
  for (int64_t i = 0; i < N; i++) {
    if (!a->mask[i]) continue;
    cr_assert(a->p[i] == b->p[i] && a->m[i] == b->m[i] && a->v[i] == b->v[i], "element %lld: p %.9g vs %.9g",
              (long long)i, a->p[i], b->p[i]);
  }
}

static void check(float gscale, double max_norm, bool expect_clip) {
  static flat a, b, orig;
  flat_make(&orig, gscale);
  a = orig, b = orig;
  const float scale = 1.0f / 7.0f;
  double norm, coef, stats[DF_NORM_STATS];
  reference(&a, scale, max_norm, &norm, &coef);
  fused(&b, scale, max_norm, NULL, stats);
  cr_expect_float_eq(stats[DF_NORM_VALUE], norm, 1e-12 * norm, "norm %.17g vs %.17g", stats[DF_NORM_VALUE], norm);
  cr_expect_float_eq(stats[DF_NORM_COEF], coef, 1e-12, "coef");
  cr_expect_eq(stats[DF_NORM_OK], 1.0);
  cr_expect_eq(coef < 1.0, expect_clip);
  expect_same_state(&a, &b);
  for (int64_t i = 0; i < N; i++) // untrainable elements: never touched, gradients left as they were
    if (!b.mask[i]) cr_assert(b.p[i] == orig.p[i] && b.m[i] == orig.m[i] && b.v[i] == orig.v[i] && b.g[i] == 5.0f);
  for (int64_t i = 0; i < N; i++) cr_assert(!b.mask[i] || b.g[i] == orig.g[i], "the gradient is read, not scaled");
}

Test(fused_optim, matches_the_per_tensor_sequence_unclipped) { check(0.01f, 1e9, false); }
Test(fused_optim, matches_the_per_tensor_sequence_clipped) { check(1.0f, 0.5, true); }

Test(fused_optim, non_finite_norm_or_guard_skips_on_the_device) {
  static flat f, orig;
  flat_make(&orig, 0.1f);
  double stats[DF_NORM_STATS];
  f = orig;
  f.g[10] = NAN;
  fused(&f, 1.0f, 1.0, NULL, stats);
  cr_expect(isnan(stats[DF_NORM_VALUE]));
  cr_expect_eq(stats[DF_NORM_OK], 0.0);
  cr_expect(!memcmp(f.p, orig.p, sizeof f.p) && !memcmp(f.m, orig.m, sizeof f.m), "a skipped step changed state");
  f = orig;
  const double guard[2] = {1.0, INFINITY}; // a non-finite loss sum
  fused(&f, 1.0f, 1.0, guard, stats);
  cr_expect(isfinite(stats[DF_NORM_VALUE]));
  cr_expect_eq(stats[DF_NORM_OK], 0.0);
  cr_expect(!memcmp(f.p, orig.p, sizeof f.p));
}

// The updated masters can be written out in another buffer (the bf16 copy on a GPU; f32 here).
Test(fused_optim, params_copy_and_argument_errors) {
  static flat f;
  flat_make(&f, 0.1f);
  static float copy[N];
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor p = df_f32(f.p, N), g = df_f32(f.g, N), m = df_f32(f.m, N), v = df_f32(f.v, N), mk = df_u8(f.mask, N);
  df_tensor c = df_f32(copy, N);
  df_adamw_fused_desc ad = {.hp = HP, .grad_scale = 1.0f};
  DF_ASSERT_OK(df_adamw_fused(ctx, &ad, &p, &g, &m, &v, &mk, NULL, &c, &err), &err);
  for (int64_t i = 0; i < N; i++) cr_assert(!f.mask[i] || copy[i] == f.p[i]);
  cr_expect_eq(df_adamw_fused(ctx, &ad, &p, &g, &m, &v, &mk, NULL, &p, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "params");
  df_tensor short_mask = df_u8(f.mask, N - 1);
  cr_expect_eq(df_adamw_fused(ctx, &ad, &p, &g, &m, &v, &short_mask, NULL, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "mask");
  ad.hp.step = 0;
  cr_expect_eq(df_adamw_fused(ctx, &ad, &p, &g, &m, &v, &mk, NULL, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "hp.step");
  double st[2];
  df_tensor small = df_view(st, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(2));
  df_grad_norm_desc nd = {.grad_scale = 1.0f, .max_norm = 1.0};
  cr_expect_eq(df_grad_norm_clip(ctx, &nd, &g, &mk, NULL, &small, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "out");
  df_ctx_destroy(ctx);
}
