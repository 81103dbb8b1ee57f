// The LR schedule and the step horizon: closed forms, so a resumed run recomputes exactly the rate a straight
// run used at the same step (nothing but the step is carried from one update to the next).
#include "train/trainer/lr_schedule.h"

#include <float.h>
#include <math.h>

df_status df_lr_schedule_init(df_lr_schedule *s, df_lr_kind kind, double base_lr, double warmup_ratio, int64_t horizon,
                              df_error *err) {
  if (horizon < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.total_steps", "the run needs at least one optimizer step",
                   "the LR schedule horizon is %lld steps", (long long)horizon);
  if (!(warmup_ratio >= 0 && warmup_ratio <= 1))
    return DF_FAIL(err, DF_ERR_INVALID, "training.warmup_ratio", "use a value in [0, 1]", "warmup_ratio = %g",
                   warmup_ratio);
  if (!(base_lr > 0) || !(base_lr <= FLT_MAX))
    return DF_FAIL(err, DF_ERR_INVALID, "training.learning_rate", "use a positive rate that fits fp32",
                   "learning_rate = %g", base_lr);
  if (kind != DF_LR_COSINE && kind != DF_LR_CONSTANT)
    return DF_FAIL(err, DF_ERR_INVALID, "training.lr_scheduler", "cosine or constant", "unknown scheduler %d",
                   (int)kind);
  s->kind = kind;
  s->base_lr = base_lr;
  s->horizon = horizon;
  s->warmup = (int64_t)(warmup_ratio * (double)horizon);
  return DF_OK;
}

double df_lr_at(const df_lr_schedule *s, int64_t step) {
  if (step < 1) step = 1;
  int64_t W = s->warmup, T = s->horizon;
  if (step <= W) return s->base_lr * (double)step / (double)W;
  if (s->kind == DF_LR_CONSTANT) return s->base_lr;
  if (step > T || T <= W) return 0.0;
  return s->base_lr * 0.5 * (1.0 + cos(M_PI * (double)(step - W - 1) / (double)(T - W)));
}

df_status df_train_horizon(const df_train_plan *p, int64_t *horizon, int64_t *stop, df_error *err) {
  if (p->accumulation_steps < 1 || p->num_epochs < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.accumulation_steps", NULL,
                   "accumulation_steps and num_epochs must be >= 1");
  int64_t micro = p->batches_per_epoch * p->num_epochs;
  int64_t complete = micro / p->accumulation_steps, rem = micro % p->accumulation_steps;
  if (complete < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.batch_size",
                   "use more data, a smaller batch_size or accumulation_steps, or more num_epochs",
                   "the data gives no optimizer step: %lld micro-batches per epoch x %lld epochs < accumulation_steps "
                   "%lld",
                   (long long)p->batches_per_epoch, (long long)p->num_epochs, (long long)p->accumulation_steps);
  int64_t T = p->total_steps > 0 ? p->total_steps : p->max_steps > 0 ? p->max_steps : complete;
  int64_t want = p->max_steps > 0 ? p->max_steps : p->total_steps; // 0: until the data ends
  if (rem && (want == 0 || want > complete))
    return DF_FAIL(err, DF_ERR_INVALID, "training.accumulation_steps",
                   "adjust batch_size / accumulation_steps / num_epochs, or set training.max_steps to stop earlier",
                   "the data ends with an incomplete accumulation window: %lld micro-batches across %lld epoch(s) is "
                   "not a multiple of accumulation_steps %lld (set max_steps <= %lld)",
                   (long long)micro, (long long)p->num_epochs, (long long)p->accumulation_steps, (long long)complete);
  *horizon = T;
  *stop = want > 0 && want < complete ? want : complete;
  return DF_OK;
}
