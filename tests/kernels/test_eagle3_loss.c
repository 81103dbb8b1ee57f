// EAGLE-3's objective ops (kernels/eagle3.h) against their definitions written here in double: the chunked
// full-vocabulary lse / first argmax (several vocabulary blocks, ties), the teacher rows, the per-row KL / α / accuracy
// terms with the step shift and the padding past a sample's end, the step sums and losses of the three LK types, the
// gradient against central differences of the step loss (LK lambda with its weight held, as SpecForge detaches it),
// the acceptance lengths, and the argument checks.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/eagle3.h"
#include "tests/common/fixture.h"

static df_tensor vec(void *p, df_dtype dt, int64_t n) { return df_view(p, dt, DF_DEV_CPU, 1, (const int64_t[]){n}); }
static df_tensor mat(void *p, int64_t r, int64_t c) {
  return df_view(p, DF_F32, DF_DEV_CPU, 2, (const int64_t[]){r, c});
}

Test(eagle3_loss, lse_and_argmax_over_vocabulary_blocks) {
  const int64_t R = 7, H = 5, V = 4500; // three vocabulary blocks of the CPU kernel
  float *x = malloc(sizeof(float) * R * H), *w = malloc(sizeof(float) * V * H), lse[7];
  int32_t arg[7];
  df_test_fill_uniform(x, R * H, 1, -1, 1);
  df_test_fill_uniform(w, V * H, 2, -1, 1);
  memcpy(w + 4100 * H, w + 17 * H, sizeof(float) * H); // a tie across blocks: the first maximum wins
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor xt = mat(x, R, H), wt = mat(w, V, H), lt = vec(lse, DF_F32, R), at = vec(arg, DF_I32, R);
  DF_ASSERT_OK(df_lmhead_lse_argmax(ctx, 3, &xt, &wt, &lt, &at, &err), &err);
  for (int64_t r = 0; r < R; r++) {
    double mx = -INFINITY, s = 0;
    int best = 0;
    for (int64_t v = 0; v < V; v++) {
      float z = 0;
      for (int64_t h = 0; h < H; h++) z += x[r * H + h] * w[v * H + h];
      if (z > mx) mx = z, best = (int)v;
    }
    for (int64_t v = 0; v < V; v++) {
      double z = 0;
      for (int64_t h = 0; h < H; h++) z += (double)x[r * H + h] * w[v * H + h];
      s += exp(z - mx);
    }
    cr_expect(fabs(lse[r] - (mx + log(s))) < 1e-4, "lse[%lld] %g vs %g", (long long)r, lse[r], mx + log(s));
    cr_expect_eq(arg[r], best, "argmax[%lld]", (long long)r);
    cr_expect_neq(arg[r], 4100, "a tie goes to the earlier row");
  }
  df_tensor bad = vec(arg, DF_I32, R - 1);
  cr_expect_eq(df_lmhead_lse_argmax(ctx, 0, &xt, &wt, &lt, &bad, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "argmax");
  cr_expect_eq(df_lmhead_lse_argmax(ctx, -1, &xt, &wt, &lt, &at, &err), DF_ERR_INVALID);
  df_ctx_destroy(ctx);
  free(x), free(w);
}

// ---- one step's objective ---------------------------------------------------------------------------------------

enum { B = 2, S = 5, R = B * S, D = 6, V = 9 };

typedef struct {
  float z[R * D], tp[R * D], ratio[R], pm[R], lm[R];
  int32_t tok[R], d2t[D];
  float terms[6][R];
  double local[DF_EAGLE3_STEP_LOCAL], stats[3 + DF_EAGLE3_STEP_STATS];
  int64_t step;
  df_lk_loss lk;
  double kl_scale, kl_decay, w_held; // w_held >= 0: lambda's weight, held for the finite differences
  df_ctx *ctx;
} fixture;

static void setup_fixture(fixture *f, int64_t step, df_lk_loss lk, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->step = step, f->lk = lk, f->kl_scale = 0.7, f->kl_decay = 2.0, f->w_held = -1, f->ctx = df_test_cpu_ctx(2);
  df_test_fill_uniform(f->z, R * D, seed, -2, 2);
  for (int64_t r = 0; r < R; r++) { // a teacher row: a softmax, a ratio below 1, masks with holes
    float t[D], m = -INFINITY, s = 0;
    df_test_fill_uniform(t, D, seed + 10 + (uint64_t)r, -2, 2);
    for (int d = 0; d < D; d++) m = fmaxf(m, t[d]);
    for (int d = 0; d < D; d++) s += expf(t[d] - m);
    for (int d = 0; d < D; d++) f->tp[r * D + d] = expf(t[d] - m) / s;
    f->ratio[r] = 0.3f + 0.1f * (float)(r % 5);
    f->lm[r] = r % 4 != 3;
    f->pm[r] = f->lm[r] * (r % 3 != 1);
    f->tok[r] = (int32_t)((r * 5) % V);
  }
  for (int d = 0; d < D; d++) f->d2t[d] = d < 3 ? 0 : 3; // draft ids 0..5 → target ids 0, 1, 2, 6, 7, 8
}

typedef struct {
  df_tensor tp, ratio, pm, lm, tok, d2t;
  df_eagle3_teacher_rows rows;
} teacher_t;

static void teacher_views(fixture *f, teacher_t *t) {
  t->tp = mat(f->tp, R, D), t->ratio = vec(f->ratio, DF_F32, R), t->pm = vec(f->pm, DF_F32, R);
  t->lm = vec(f->lm, DF_F32, R), t->tok = vec(f->tok, DF_I32, R), t->d2t = vec(f->d2t, DF_I32, D);
  t->rows = (df_eagle3_teacher_rows){&t->tp, &t->ratio, &t->pm, &t->lm, &t->tok, &t->d2t};
}

static df_eagle3_loss_desc desc_of(const fixture *f, int64_t row0, double weight) {
  return (df_eagle3_loss_desc){.step = f->step,
                               .S = S,
                               .row0 = row0,
                               .positions = R,
                               .lk = f->lk,
                               .kl_scale = f->kl_scale,
                               .kl_decay = f->kl_decay,
                               .weight = weight};
}

// Forward in two chunks and the sums: returns loss_i (stats[0]).
static double step_loss(fixture *f) {
  teacher_t t;
  teacher_views(f, &t);
  df_error err = {0};
  df_tensor tv[6];
  for (int64_t r0 = 0; r0 < R; r0 += 6) {
    const int64_t c = R - r0 < 6 ? R - r0 : 6;
    df_tensor z = mat(f->z + r0 * D, c, D);
    for (int k = 0; k < 6; k++) tv[k] = vec(f->terms[k] + r0, DF_F32, c);
    const df_eagle3_row_terms o = {&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
    const df_eagle3_loss_desc d = desc_of(f, r0, 0);
    if (df_eagle3_loss_forward(f->ctx, &d, &z, &t.rows, &o, &err) != DF_OK) return NAN;
  }
  for (int k = 0; k < 6; k++) tv[k] = vec(f->terms[k], DF_F32, R);
  const df_eagle3_row_terms rows = {&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
  memset(f->stats, 0, sizeof f->stats);
  const df_eagle3_sums_desc sd = {.step = f->step,
                                  .positions = R,
                                  .lk = f->lk,
                                  .kl_scale = f->kl_scale,
                                  .kl_decay = f->kl_decay,
                                  .step_weight = 1.0,
                                  .loss_num = 0,
                                  .acc_num = 1,
                                  .acc_den = 2,
                                  .step_block = 3};
  df_tensor local = vec(f->local, DF_F64, DF_EAGLE3_STEP_LOCAL), st = vec(f->stats, DF_F64, 3 + DF_EAGLE3_STEP_STATS);
  if (df_eagle3_step_sums(f->ctx, &sd, &rows, &local, &st, &err) != DF_OK) return NAN;
  if (f->lk != DF_LK_LAMBDA || f->w_held < 0) return f->stats[0];
  const double den = fmax(f->local[DF_EAGLE3_SUM_PM], 1e-8), acc = f->local[DF_EAGLE3_SUM_ALPHA] / den;
  return f->w_held * f->local[DF_EAGLE3_SUM_KL] / R + (1 - f->w_held) * (1 - acc);
}

// The definitions in double, row by row.
static void expect_terms(const fixture *f) {
  double kl = 0, al = 0, la = 0, pm = 0, co = 0, mk = 0;
  for (int64_t r = 0; r < R; r++) {
    const int64_t p = r % S, tr = r + f->step;
    if (p + f->step >= S) {
      for (int k = 0; k < 6; k++) cr_expect_eq(f->terms[k][r], 0.0f, "padding row %lld", (long long)r);
      continue;
    }
    const float *z = f->z + r * D, *t = f->tp + tr * D;
    double mx = -INFINITY, s = 0, ce = 0, a = 0;
    int pred = 0;
    for (int d = 0; d < D; d++)
      if (z[d] > mx) mx = z[d], pred = d;
    for (int d = 0; d < D; d++) s += exp(z[d] - mx);
    for (int d = 0; d < D; d++) {
      const double lq = z[d] - mx - log(s);
      ce -= t[d] * lq;
      a += fmin(exp(lq), (double)t[d] * f->ratio[tr]);
    }
    kl += f->pm[tr] * ce, al += f->pm[tr] * a, la += f->pm[tr] * (a > 0 ? log(a) : 0), pm += f->pm[tr];
    co += f->lm[tr] * (pred + f->d2t[pred] == f->tok[tr]), mk += f->lm[tr];
    cr_expect(fabs(f->terms[0][r] - f->pm[tr] * ce) < 1e-5, "kl row %lld", (long long)r);
  }
  const double got[6] = {f->local[0], f->local[1], f->local[2], f->local[3], f->local[4], f->local[5]};
  const double want[6] = {kl, al, la, pm, co, mk};
  for (int k = 0; k < 6; k++) cr_expect(fabs(got[k] - want[k]) < 1e-5, "sum %d: %g vs %g", k, got[k], want[k]);
}

static double probe(void *self) { return step_loss(self); }

static void check_gradient(df_lk_loss lk, int64_t step) {
  fixture f;
  setup_fixture(&f, step, lk, 31 + (uint64_t)step);
  const double base = step_loss(&f);
  cr_assert(isfinite(base));
  expect_terms(&f);
  if (lk == DF_LK_LAMBDA) {
    const double den = fmax(f.local[DF_EAGLE3_SUM_PM], 1e-8);
    f.w_held = f.kl_scale * exp(-f.kl_decay * f.local[DF_EAGLE3_SUM_ALPHA] / den);
  }
  teacher_t t;
  teacher_views(&f, &t);
  float dz[R * D];
  df_error err = {0};
  df_tensor local = vec(f.local, DF_F64, DF_EAGLE3_STEP_LOCAL);
  for (int64_t r0 = 0; r0 < R; r0 += 4) {
    const int64_t c = R - r0 < 4 ? R - r0 : 4;
    df_tensor z = mat(f.z + r0 * D, c, D), g = mat(dz + r0 * D, c, D);
    const df_eagle3_loss_desc d = desc_of(&f, r0, 1.0);
    DF_ASSERT_OK(df_eagle3_loss_backward(f.ctx, &d, &z, &t.rows, &local, &g, &err), &err);
  }
  df_fd_check(lk == DF_LK_NONE    ? "dz (KL)"
              : lk == DF_LK_ALPHA ? "dz (LK alpha)"
                                  : "dz (LK lambda)",
              f.z, dz, R * D, probe, &f, 1e-3, 2e-3, 2e-5, R * D);
  df_ctx_destroy(f.ctx);
}

Test(eagle3_loss, kl_terms_and_gradient) { check_gradient(DF_LK_NONE, 0); }
Test(eagle3_loss, shifted_step_reads_later_teacher_rows) { check_gradient(DF_LK_NONE, 2); }
Test(eagle3_loss, lk_alpha_gradient) { check_gradient(DF_LK_ALPHA, 1); }
Test(eagle3_loss, lk_lambda_gradient_with_the_weight_detached) { check_gradient(DF_LK_LAMBDA, 1); }

Test(eagle3_loss, step_losses_of_the_three_types) {
  fixture f;
  setup_fixture(&f, 0, DF_LK_NONE, 5);
  const double kl = step_loss(&f);
  const double den = fmax(f.local[DF_EAGLE3_SUM_PM], 1e-8);
  const double acc = f.local[DF_EAGLE3_SUM_ALPHA] / den, la = f.local[DF_EAGLE3_SUM_LOG_ALPHA] / den;
  cr_expect(fabs(kl - f.local[DF_EAGLE3_SUM_KL] / R) < 1e-12, "the KL is a mean over every position");
  cr_expect(fabs(f.stats[3 + DF_EAGLE3_S_ACCEPT_RATE] - acc) < 1e-12);
  cr_expect_eq(f.stats[1], f.local[DF_EAGLE3_SUM_CORRECT]);
  cr_expect_eq(f.stats[2], f.local[DF_EAGLE3_SUM_MASK]);
  f.lk = DF_LK_ALPHA;
  cr_expect(fabs(step_loss(&f) + la) < 1e-12, "alpha: -mean log α");
  f.lk = DF_LK_LAMBDA;
  const double w = f.kl_scale * exp(-f.kl_decay * acc);
  cr_expect(fabs(step_loss(&f) - (w * kl + (1 - w) * (1 - acc))) < 1e-12, "lambda");
  df_ctx_destroy(f.ctx);
}

Test(eagle3_loss, teacher_rows) {
  enum { TR = 3, TD = 4, TV = 6 };
  float logits[TR * TD] = {1, 2, 3, 4, 0, 0, 0, 0, -1, 5, 2, 2}, lse_v[TR] = {6, 1, 7}, lm[TR] = {1, 1, 0};
  float ratio[TR], pm[TR];
  int32_t arg[TR] = {2, 5, 1};
  uint8_t t2d[TV] = {1, 1, 1, 0, 1, 0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor z = mat(logits, TR, TD), l = vec(lse_v, DF_F32, TR), a = vec(arg, DF_I32, TR), t = vec(t2d, DF_U8, TV);
  df_tensor m = vec(lm, DF_F32, TR), ro = vec(ratio, DF_F32, TR), po = vec(pm, DF_F32, TR);
  DF_ASSERT_OK(df_eagle3_teacher(ctx, &z, &l, &a, &t, &m, &ro, &po, &err), &err);
  const double lse0 = log(exp(1) + exp(2) + exp(3) + exp(4));
  cr_expect(fabs(logits[3] - exp(4 - lse0)) < 1e-6, "softmax in place");
  cr_expect(fabs(ratio[0] - exp(lse0 - 6)) < 1e-6);
  cr_expect_eq(pm[0], 1.0f, "argmax 2 is in the draft vocabulary");
  cr_expect_eq(pm[1], 0.0f, "argmax 5 is not");
  cr_expect_eq(pm[2], 0.0f, "the loss mask is 0");
  df_ctx_destroy(ctx);
}

Test(eagle3_loss, acceptance_lengths) {
  // 3 steps × 4 positions: runs 2, 0, 3 (masked out: position 3)
  float correct[12] = {1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1}, mask[4] = {1, 1, 1, 0};
  double stats[2] = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor c = mat(correct, 3, 4), m = vec(mask, DF_F32, 4), st = vec(stats, DF_F64, 2);
  DF_ASSERT_OK(df_eagle3_accept(ctx, &c, &m, 0, 1, &st, &err), &err);
  cr_expect_eq(stats[0], 3.0 + 1.0 + 4.0);
  cr_expect_eq(stats[1], 3.0);
  cr_expect_eq(df_eagle3_accept(ctx, &c, &m, 2, 1, &st, &err), DF_ERR_INVALID, "a slot outside the stats");
  df_ctx_destroy(ctx);
}

Test(eagle3_loss, bad_arguments_name_the_argument) {
  fixture f;
  setup_fixture(&f, 0, DF_LK_NONE, 1);
  teacher_t t;
  teacher_views(&f, &t);
  df_error err = {0};
  df_tensor tv[6];
  for (int k = 0; k < 6; k++) tv[k] = vec(f.terms[k], DF_F32, R);
  const df_eagle3_row_terms o = {&tv[0], &tv[1], &tv[2], &tv[3], &tv[4], &tv[5]};
  df_tensor z = mat(f.z, R, D);
  df_eagle3_loss_desc d = desc_of(&f, 0, 0);
  d.S = 3; // does not divide the rows
  cr_expect_eq(df_eagle3_loss_forward(f.ctx, &d, &z, &t.rows, &o, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc");
  d = desc_of(&f, 4, 0); // the chunk runs past the rows
  cr_expect_eq(df_eagle3_loss_forward(f.ctx, &d, &z, &t.rows, &o, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "desc.row0");
  df_tensor zw = mat(f.z, R / 2, 2 * D);
  d = desc_of(&f, 0, 0);
  cr_expect_eq(df_eagle3_loss_forward(f.ctx, &d, &zw, &t.rows, &o, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "z");
  df_ctx_destroy(f.ctx);
}
