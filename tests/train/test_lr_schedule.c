// LR schedule and horizon: warmup, cosine to 0, constant, W = int(ratio·T), and the horizon rules
// (total_steps, else max_steps, else epochs × batches / accumulation; partial windows at the end of the data).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/common/fixture.h"
#include "train/trainer/lr_schedule.h"

static df_lr_schedule sched(df_lr_kind kind, double lr, double ratio, int64_t T) {
  df_lr_schedule s;
  df_error err = {0};
  DF_ASSERT_OK(df_lr_schedule_init(&s, kind, lr, ratio, T, &err), &err);
  return s;
}

Test(lr_schedule, warmup_then_cosine_to_zero) {
  df_lr_schedule s = sched(DF_LR_COSINE, 6e-4, 0.04, 10000); // the recipe example: W = 400
  cr_assert_eq(s.warmup, 400);
  cr_expect_float_eq(df_lr_at(&s, 1), 6e-4 / 400, 1e-18);
  cr_expect_float_eq(df_lr_at(&s, 200), 6e-4 * 200 / 400, 1e-18);
  cr_expect_eq(df_lr_at(&s, 400), 6e-4);
  cr_expect_eq(df_lr_at(&s, 401), 6e-4); // cosine starts at base (torch CosineAnnealingLR epoch 0)
  // midpoint of the cosine: step W + 1 + (T − W)/2
  cr_expect_float_eq(df_lr_at(&s, 401 + 4800), 3e-4, 1e-15);
  double last = df_lr_at(&s, 10000);
  cr_expect(last > 0 && last < 1e-10, "lr at T = %g", last);
  cr_expect_eq(df_lr_at(&s, 10001), 0.0);
  for (int64_t k = 401; k < 10000; k++)
    cr_assert(df_lr_at(&s, k + 1) <= df_lr_at(&s, k), "not decreasing at %lld", (long long)k);
}

Test(lr_schedule, exact_values_small_horizon) {
  // T = 12, ratio 0.25 → W = 3; steps 4..12 follow ½(1 + cos(π(s−4)/9)).
  df_lr_schedule s = sched(DF_LR_COSINE, 1.0, 0.25, 12);
  cr_assert_eq(s.warmup, 3);
  double want[13] = {0, 1.0 / 3, 2.0 / 3, 1.0};
  for (int k = 4; k <= 12; k++) want[k] = 0.5 * (1 + cos(M_PI * (k - 4) / 9.0));
  for (int k = 1; k <= 12; k++) cr_expect_float_eq(df_lr_at(&s, k), want[k], 1e-15, "step %d", k);
  // W = int(ratio·T) truncates: 0.015 · 100 = 1.5 → 1
  cr_expect_eq(sched(DF_LR_COSINE, 1, 0.015, 100).warmup, 1);
  cr_expect_eq(sched(DF_LR_COSINE, 1, 0.0, 100).warmup, 0);
}

Test(lr_schedule, no_warmup_and_constant) {
  df_lr_schedule s = sched(DF_LR_COSINE, 2.0, 0.0, 4);
  cr_expect_eq(df_lr_at(&s, 1), 2.0);
  cr_expect_float_eq(df_lr_at(&s, 2), 2.0 * 0.5 * (1 + cos(M_PI / 4)), 1e-15);
  cr_expect_float_eq(df_lr_at(&s, 3), 1.0, 1e-15);
  df_lr_schedule c = sched(DF_LR_CONSTANT, 5e-5, 0.5, 10);
  cr_expect_float_eq(df_lr_at(&c, 1), 1e-5, 1e-20);
  cr_expect_eq(df_lr_at(&c, 5), 5e-5);
  cr_expect_eq(df_lr_at(&c, 6), 5e-5);
  cr_expect_eq(df_lr_at(&c, 10), 5e-5);
  // warmup over the whole horizon: no cosine part
  df_lr_schedule w = sched(DF_LR_COSINE, 1.0, 1.0, 4);
  cr_expect_eq(df_lr_at(&w, 4), 1.0);
  cr_expect_eq(df_lr_at(&w, 5), 0.0);
}

Test(lr_schedule, bad_inputs_name_the_key) {
  df_lr_schedule s;
  df_error err = {0};
  cr_expect_eq(df_lr_schedule_init(&s, DF_LR_COSINE, 1e-4, 0.1, 0, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.total_steps");
  cr_expect_eq(df_lr_schedule_init(&s, DF_LR_COSINE, 0, 0.1, 10, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.learning_rate");
  cr_expect_eq(df_lr_schedule_init(&s, DF_LR_COSINE, 1e-4, 1.5, 10, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.warmup_ratio");
}

static void horizon(int64_t total, int64_t max, int64_t epochs, int64_t bpe, int64_t accum, int64_t want_T,
                    int64_t want_stop) {
  df_train_plan p = {total, max, epochs, bpe, accum};
  int64_t T = -1, stop = -1;
  df_error err = {0};
  DF_ASSERT_OK(df_train_horizon(&p, &T, &stop, &err), &err);
  cr_expect_eq(T, want_T, "T: got %lld want %lld", (long long)T, (long long)want_T);
  cr_expect_eq(stop, want_stop, "stop: got %lld want %lld", (long long)stop, (long long)want_stop);
}

Test(lr_schedule, horizon_rules) {
  horizon(0, 0, 6, 100, 1, 600, 600);       // epochs × batches
  horizon(0, 50, 6, 100, 1, 50, 50);        // max_steps sets both
  horizon(100, 50, 6, 100, 1, 100, 50);     // total_steps fixes T, max_steps stops early
  horizon(12, 6, 4, 3, 2, 12, 6);           // the resume-test shape
  horizon(0, 10000, 6, 100, 1, 10000, 600); // the data ends first (SpecForge stops at the last epoch)
}

Test(lr_schedule, partial_window_at_the_end_of_data) {
  df_train_plan p = {0, 0, 3, 10, 4};
  int64_t T, stop;
  df_error err = {0};
  cr_expect_eq(df_train_horizon(&p, &T, &stop, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.accumulation_steps");
  cr_expect(strstr(err.msg, "max_steps <= 7"), "%s", err.msg);
  // a max_steps that stops before the partial window is fine
  p.max_steps = 7;
  DF_ASSERT_OK(df_train_horizon(&p, &T, &stop, &err), &err);
  cr_expect_eq(stop, 7);
  // no optimizer step at all
  df_train_plan q = {0, 0, 1, 3, 4};
  cr_expect_eq(df_train_horizon(&q, &T, &stop, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.batch_size");
}
