// AdamW step, global norm, clip by norm: PyTorch golden data, determinism across thread counts,
// non-finite norms and argument errors.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

static float *copy_of(const float *x, int64_t n) {
  float *c = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  memcpy(c, x, sizeof(float) * (size_t)n);
  return c;
}

static const float *fx_data(const fx_file *f, const char *fmt, int i) {
  char name[32];
  snprintf(name, sizeof name, fmt, i);
  return fx_get(f, name)->data;
}

static df_adamw_hparams hparams_of(const fx_file *f) {
  return (df_adamw_hparams){.lr = (float)fx_meta(f, "lr"),
                            .beta1 = (float)fx_meta(f, "beta1"),
                            .beta2 = (float)fx_meta(f, "beta2"),
                            .eps = (float)fx_meta(f, "eps"),
                            .weight_decay = (float)fx_meta(f, "weight_decay")};
}

// |got − want| <= rtol · terms_i, element by element, where terms_i is the sum of the magnitudes of the
// terms that produced want_i: rounding is relative to those, and they may cancel (m = β1·m + (1−β1)·g).
static void expect_close_to_terms(const char *what, const float *got, const float *want, const double *terms, int64_t n,
                                  double rtol) {
  int64_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]), ratio = d / (rtol * terms[i]);
    if (!(d <= rtol * terms[i])) bad++;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  cr_expect_eq(bad, 0, "%s: %lld of %lld elements off; worst [%lld]: got %.9g want %.9g, |diff| / (rtol·terms) = %.3g",
               what, (long long)bad, (long long)n, (long long)worst, got[worst], want[worst], worst_ratio);
}

typedef struct {
  const float *p, *m, *v;    // torch's state after step s − 1 (m, v NULL at s = 1: zeros)
  const float *g;            // step s's gradient
  const float *p1, *m1, *v1; // torch's state after step s
} adamw_ref_step;

// One step from torch's state, checked against torch's next state with term-scaled tolerances: we do
// torch's fp32 operations in its order with the same fp32-rounded scalars, so only FMA contraction
// differs (ours and torch's kernels fuse different pairs): ~1 ulp per op over ≤ 6 ops; 1e-6 is ~8 ulps.
static void check_adamw_step(df_ctx *ctx, const adamw_ref_step *r, int64_t n, df_adamw_hparams hp, const char *what) {
  df_error err = {0};
  float *p = copy_of(r->p, n), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
  if (r->m) memcpy(m, r->m, sizeof(float) * (size_t)n), memcpy(v, r->v, sizeof(float) * (size_t)n);
  df_tensor tp = df_f32(p, n), tg = df_f32((void *)r->g, n), tm = df_f32(m, n), tv = df_f32(v, n);
  DF_ASSERT_OK(df_adamw_step(ctx, &tp, &tg, &tm, &tv, &hp, &err), &err);
  double *tm_terms = malloc(sizeof(double) * (size_t)n), *tv_terms = malloc(sizeof(double) * (size_t)n),
         *tp_terms = malloc(sizeof(double) * (size_t)n);
  const double b1 = hp.beta1, b2 = hp.beta2, t = (double)hp.step;
  const double step_size = hp.lr / (1 - pow(b1, t)), bc2_sqrt = sqrt(1 - pow(b2, t));
  for (int64_t i = 0; i < n; i++) {
    double g = r->g[i], m0 = r->m ? r->m[i] : 0, v0 = r->v ? r->v[i] : 0;
    tm_terms[i] = b1 * fabs(m0) + (1 - b1) * fabs(g);
    tv_terms[i] = b2 * v0 + (1 - b2) * g * g;
    double update = step_size * fabs((double)r->m1[i]) / (sqrt((double)r->v1[i]) / bc2_sqrt + hp.eps);
    tp_terms[i] = fabs((double)r->p[i]) * (1 - (double)hp.lr * hp.weight_decay) + update;
  }
  char name[200];
  snprintf(name, sizeof name, "%.160s m", what);
  expect_close_to_terms(name, m, r->m1, tm_terms, n, 1e-6);
  snprintf(name, sizeof name, "%.160s v", what);
  expect_close_to_terms(name, v, r->v1, tv_terms, n, 1e-6);
  snprintf(name, sizeof name, "%.160s p", what);
  expect_close_to_terms(name, p, r->p1, tp_terms, n, 1e-6);
  free(p), free(m), free(v), free(tm_terms), free(tv_terms), free(tp_terms);
}

// Each step from torch's previous state (tight, per step), then the whole sequence from torch's initial
// params and zero moments (our own state carried): params, O(0.5), within 1e-6 relative, plus 1e-9
// absolute for params near 0 (updates are lr·O(1) = 1e-3, computed to ~1e-6 of themselves).
static void check_adamw_case(const char *file) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  const int64_t n = fx_numel(fx_get(f, "p0"));
  const int steps = (int)fx_meta(f, "steps");
  df_adamw_hparams hp = hparams_of(f);
  char what[160];
  for (int s = 1; s <= steps; s++) {
    adamw_ref_step r = {fx_data(f, "p%d", s - 1),
                        s > 1 ? fx_data(f, "m%d", s - 1) : NULL,
                        s > 1 ? fx_data(f, "v%d", s - 1) : NULL,
                        fx_data(f, "g%d", s),
                        fx_data(f, "p%d", s),
                        fx_data(f, "m%d", s),
                        fx_data(f, "v%d", s)};
    hp.step = s;
    snprintf(what, sizeof what, "%s step %d", file, s);
    check_adamw_step(ctx, &r, n, hp, what);
  }
  float *p = copy_of(fx_get(f, "p0")->data, n), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
  df_tensor tp = df_f32(p, n), tm = df_f32(m, n), tv = df_f32(v, n);
  for (int s = 1; s <= steps; s++) {
    df_tensor tg = df_f32((void *)fx_data(f, "g%d", s), n);
    hp.step = s;
    DF_ASSERT_OK(df_adamw_step(ctx, &tp, &tg, &tm, &tv, &hp, &err), &err);
  }
  snprintf(what, sizeof what, "%s: params after %d steps", file, steps);
  df_expect_close_elementwise(what, p, fx_data(f, "p%d", steps), n, 1e-6, 1e-9);
  free(p), free(m), free(v);
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(optim, adamw_golden_lr1e3_wd0) { check_adamw_case("kernels/optim_adamw_lr1e-3_wd0.safetensors"); }
Test(optim, adamw_golden_lr1e3_wd001) { check_adamw_case("kernels/optim_adamw_lr1e-3_wd0.01.safetensors"); }
Test(optim, adamw_golden_lr6e4_wd0) { check_adamw_case("kernels/optim_adamw_lr6e-4_wd0.safetensors"); }
Test(optim, adamw_golden_lr6e4_wd001_betas) {
  check_adamw_case("kernels/optim_adamw_lr6e-4_wd0.01_b0.8_0.95.safetensors");
}

// Three steps on a buffer large enough to run in parallel; p, m, v after them for a thread count.
static void adamw_run(int threads, int64_t n, float *p, float *m, float *v) {
  df_ctx *ctx = df_test_cpu_ctx(threads);
  df_error err = {0};
  float *g = malloc(sizeof(float) * (size_t)n);
  df_test_fill_uniform(p, n, 20, -1, 1);
  memset(m, 0, sizeof(float) * (size_t)n);
  memset(v, 0, sizeof(float) * (size_t)n);
  df_tensor tp = df_f32(p, n), tg = df_f32(g, n), tm = df_f32(m, n), tv = df_f32(v, n);
  for (int s = 1; s <= 3; s++) {
    df_test_fill_uniform(g, n, 30 + (uint64_t)s, -0.1f, 0.1f);
    df_adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .step = s};
    DF_ASSERT_OK(df_adamw_step(ctx, &tp, &tg, &tm, &tv, &hp, &err), &err);
  }
  free(g);
  df_ctx_destroy(ctx);
}

// Where a thread's chunk starts decides which elements take the vector body and which the scalar
// peel/tail; both must give the same bits.
Test(optim, adamw_same_bits_for_any_thread_count) {
  const int64_t n = 100003;
  float *p1 = malloc(4 * n), *m1 = malloc(4 * n), *v1 = malloc(4 * n);
  float *p = malloc(4 * n), *m = malloc(4 * n), *v = malloc(4 * n);
  adamw_run(1, n, p1, m1, v1);
  for (int threads = 2; threads <= 3; threads++) {
    adamw_run(threads, n, p, m, v);
    cr_expect(!memcmp(p, p1, 4 * n), "param differs between 1 and %d threads", threads);
    cr_expect(!memcmp(m, m1, 4 * n), "m differs between 1 and %d threads", threads);
    cr_expect(!memcmp(v, v1, 4 * n), "v differs between 1 and %d threads", threads);
  }
  free(p1), free(m1), free(v1), free(p), free(m), free(v);
}

// One bad AdamW call: it must fail as `want`, name `where`, and leave every buffer untouched.
static void expect_adamw_rejects(df_tensor *p, const df_tensor *g, df_tensor *m, df_tensor *v,
                                 const df_adamw_hparams *hp, const char *where) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  float before[3][8];
  memcpy(before[0], p->data, sizeof before[0]);
  memcpy(before[1], m->data, sizeof before[1]);
  memcpy(before[2], v->data, sizeof before[2]);
  cr_expect_eq(df_adamw_step(ctx, p, g, m, v, hp, &err), DF_ERR_INVALID, "a bad %s is accepted", where);
  cr_expect_str_eq(err.where, where, "the error names %s, not '%s'", where, err.where);
  cr_expect(!memcmp(before[0], p->data, sizeof before[0]) && !memcmp(before[1], m->data, sizeof before[1]) &&
                !memcmp(before[2], v->data, sizeof before[2]),
            "a rejected call (%s) wrote a buffer", where);
  df_ctx_destroy(ctx);
}

Test(optim, adamw_rejects_bad_arguments) {
  float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, m[8] = {0}, v[8] = {0};
  int32_t gi[8] = {0};
  df_tensor tp = df_f32(p, 8), tg = df_f32(g, 8), tm = df_f32(m, 8), tv = df_f32(v, 8);
  df_tensor tm7 = df_f32(m, 7), tgi = df_i32(gi, 8), tv_alias = df_f32(m, 8);
  const df_adamw_hparams ok = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 1};
  df_adamw_hparams hp;
  expect_adamw_rejects(&tp, &tgi, &tm, &tv, &ok, "grad");
  expect_adamw_rejects(&tp, &tg, &tm7, &tv, &ok, "m");
  expect_adamw_rejects(&tp, &tg, &tm, &tv_alias, &ok, "v");
  expect_adamw_rejects(&tp, &tg, &tm, &tv, NULL, "hp");
  hp = ok, hp.lr = -1e-3f;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.lr");
  hp = ok, hp.lr = NAN;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.lr");
  hp = ok, hp.beta1 = 1.0f;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.beta1");
  hp = ok, hp.beta2 = -0.1f;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.beta2");
  hp = ok, hp.eps = 0.0f;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.eps");
  hp = ok, hp.weight_decay = -0.01f;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.weight_decay");
  hp = ok, hp.step = 0;
  expect_adamw_rejects(&tp, &tg, &tm, &tv, &hp, "hp.step");
}

// torch.nn.utils.clip_grad_norm_ on five tensors. Our norm sums in double, so it matches the float64
// reference to 1e-12; torch's own norm is fp32 arithmetic, within 1e-6 of it. torch scales by its fp32
// coefficient, ours is the double one rounded to fp32: at most 1 ulp apart, so grads agree to 1e-6.
static void check_clip_case(const char *file, bool clips) {
  fx_file *f = fx_load(file);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  const int nbufs = (int)fx_meta(f, "nbufs");
  df_tensor bufs[8];
  char name[16];
  for (int i = 0; i < nbufs; i++) {
    snprintf(name, sizeof name, "g%d", i);
    bufs[i] = fx_view(f, name);
  }
  double norm = -1, coef = -1;
  DF_ASSERT_OK(df_global_norm(ctx, bufs, nbufs, &norm, &err), &err);
  const double norm64 = *(const double *)fx_get(f, "norm64")->data;
  const float norm_torch = *(const float *)fx_get(f, "norm_torch")->data;
  cr_expect_leq(fabs(norm - norm64), 1e-12 * norm64, "norm %.17g vs float64 reference %.17g", norm, norm64);
  cr_expect_leq(fabs(norm - norm_torch), 1e-6 * norm64, "norm %.9g vs torch %.9g", norm, (double)norm_torch);
  DF_ASSERT_OK(df_clip_by_norm(ctx, bufs, nbufs, norm, fx_meta(f, "max_norm"), &coef, &err), &err);
  const float coef_torch = *(const float *)fx_get(f, "coef_torch")->data;
  cr_expect_leq(fabs(coef - coef_torch), 1e-6 * coef_torch, "coef %.9g vs torch %.9g", coef, (double)coef_torch);
  cr_expect_eq(coef < 1.0, clips, "coef %.9g: this case %s", coef, clips ? "clips" : "does not clip");
  for (int i = 0; i < nbufs; i++) {
    snprintf(name, sizeof name, "c%d", i);
    // Without clipping the buffers must be left exactly as they were (torch's ×1.0 is exact too).
    df_expect_close_elementwise(name, bufs[i].data, fx_get(f, name)->data, df_numel(&bufs[i]), clips ? 1e-6 : 0, 0);
  }
  df_ctx_destroy(ctx);
  fx_free(f);
}

Test(optim, clip_golden_clipping) { check_clip_case("kernels/optim_clip_clipping.safetensors", true); }
Test(optim, clip_golden_not_clipping) { check_clip_case("kernels/optim_clip_noclip.safetensors", false); }

// Buffers of awkward sizes (not multiples of any block or vector width), some large enough to split.
enum { NB = 4 };
static const int64_t big_sizes[NB] = {1000003, 17, 2500001, 65536};

Test(optim, global_norm_same_bits_for_any_thread_count) {
  df_tensor bufs[NB];
  long double ref = 0; // an independent, more precise sum
  for (int b = 0; b < NB; b++) {
    float *x = malloc(sizeof(float) * (size_t)big_sizes[b]);
    df_test_fill_uniform(x, big_sizes[b], 50 + (uint64_t)b, -1.0f, 1.0f);
    for (int64_t i = 0; i < big_sizes[b]; i++) ref += (long double)x[i] * x[i];
    bufs[b] = df_f32(x, big_sizes[b]);
  }
  double norm1 = 0, norm = 0;
  df_error err = {0};
  df_ctx *ctx1 = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_global_norm(ctx1, bufs, NB, &norm1, &err), &err);
  const double want = (double)sqrtl(ref);
  cr_expect_leq(fabs(norm1 - want), 1e-12 * want, "norm %.17g vs long double %.17g", norm1, want);
  for (int threads = 2; threads <= 4; threads++) {
    df_ctx *ctx = df_test_cpu_ctx(threads);
    DF_ASSERT_OK(df_global_norm(ctx, bufs, NB, &norm, &err), &err);
    cr_expect(!memcmp(&norm, &norm1, sizeof norm), "%d threads: %.17g, 1 thread: %.17g", threads, norm, norm1);
    df_ctx_destroy(ctx);
  }
  df_ctx_destroy(ctx1);
  for (int b = 0; b < NB; b++) free(bufs[b].data);
}

// A NaN or Inf gradient gives a non-finite norm; clipping then refuses (DF_ERR_NUMERIC, naming the
// norm) and leaves the buffers and coef alone, so the trainer can skip the step.
static void check_nonfinite(float bad, bool want_nan) {
  float a[40], b[9];
  df_test_fill_uniform(a, 40, 60, -1, 1);
  df_test_fill_uniform(b, 9, 61, -1, 1);
  b[4] = bad;
  float *a0 = copy_of(a, 40), *b0 = copy_of(b, 9);
  df_tensor bufs[2] = {df_f32(a, 40), df_f32(b, 3, 3)};
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  double norm = 0, coef = 42;
  DF_ASSERT_OK(df_global_norm(ctx, bufs, 2, &norm, &err), &err);
  cr_expect(want_nan ? isnan(norm) : isinf(norm), "norm %g", norm);
  cr_expect_eq(df_clip_by_norm(ctx, bufs, 2, norm, 1.0, &coef, &err), DF_ERR_NUMERIC);
  cr_expect_str_eq(err.where, "norm");
  cr_expect(!memcmp(a, a0, sizeof a) && !memcmp(b, b0, sizeof b), "buffers changed");
  cr_expect_eq(coef, 42, "coef was written: %g", coef);
  free(a0), free(b0);
  df_ctx_destroy(ctx);
}

Test(optim, clip_refuses_nan_norm) { check_nonfinite(NAN, true); }
Test(optim, clip_refuses_inf_norm) { check_nonfinite(INFINITY, false); }

Test(optim, norm_and_clip_reject_bad_arguments) {
  float a[4] = {3, 4, 0, 0}, a0[4] = {3, 4, 0, 0};
  int32_t ai[4] = {0};
  df_tensor good[2] = {df_f32(a, 4), df_f32(a, 2)}, mixed[2] = {df_f32(a, 4), df_i32(ai, 4)};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  double norm = 0, coef = 0;
  cr_expect_eq(df_global_norm(ctx, good, -1, &norm, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "nbufs");
  cr_expect_eq(df_global_norm(ctx, NULL, 2, &norm, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "bufs");
  cr_expect_eq(df_global_norm(ctx, mixed, 2, &norm, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "bufs[1]");
  cr_expect_eq(df_global_norm(ctx, good, 2, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "norm");
  cr_expect_eq(df_clip_by_norm(ctx, good, 1, 5.0, 0.0, &coef, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "max_norm");
  cr_expect_eq(df_clip_by_norm(ctx, good, 1, 5.0, NAN, &coef, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "max_norm");
  cr_expect_eq(df_clip_by_norm(ctx, good, 1, -5.0, 1.0, &coef, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "norm");
  cr_expect_eq(df_clip_by_norm(ctx, good, 1, 5.0, 1.0, NULL, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "coef");
  cr_expect_eq(df_clip_by_norm(ctx, mixed, 2, 5.0, 1.0, &coef, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "bufs[1]");
  cr_expect(!memcmp(a, a0, sizeof a), "a rejected clip wrote a buffer");
  df_ctx_destroy(ctx);
}

Test(optim, norm_and_clip_small_exact_case) {
  // ‖(3, 4)‖ = 5 and ‖(0, 12)‖ = 12 → 13; max_norm 6.5 halves every element (up to the 1e-6 in coef).
  float a[2] = {3, 4}, b[2] = {0, 12};
  df_tensor bufs[2] = {df_f32(a, 2), df_f32(b, 2)};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  double norm = 0, coef = 0;
  DF_ASSERT_OK(df_global_norm(ctx, bufs, 2, &norm, &err), &err);
  cr_expect_eq(norm, 13.0);
  DF_ASSERT_OK(df_clip_by_norm(ctx, bufs, 2, norm, 6.5, &coef, &err), &err);
  cr_expect_eq(coef, 6.5 / (13.0 + 1e-6));
  const float want_a[2] = {1.5f, 2.0f}, want_b[2] = {0.0f, 6.0f};
  df_expect_close_elementwise("a", a, want_a, 2, 1e-6, 0);
  df_expect_close_elementwise("b", b, want_b, 2, 1e-6, 0);
  DF_ASSERT_OK(df_global_norm(ctx, bufs, 0, &norm, &err), &err);
  cr_expect_eq(norm, 0.0, "no buffers: norm 0");
  df_ctx_destroy(ctx);
}
