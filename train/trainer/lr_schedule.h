// The learning-rate schedule and the run's step horizon (shared/reference/dflash-dspark.md §5.2): linear warmup
// over W = int(warmup_ratio · T) optimizer steps, then cosine to 0 at T, or flat. A pure function of the step.
#ifndef DF_TRAIN_TRAINER_LR_SCHEDULE_H
#define DF_TRAIN_TRAINER_LR_SCHEDULE_H

#include <stdint.h>

#include "base/error.h"
#include "train/recipe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  df_lr_kind kind;
  double base_lr;
  int64_t warmup;  // W
  int64_t horizon; // T
} df_lr_schedule;

// W = int(warmup_ratio · T) (truncation, as Python's int()). T must be >= 1, 0 <= ratio <= 1, base_lr > 0.
df_status df_lr_schedule_init(df_lr_schedule *s, df_lr_kind kind, double base_lr, double warmup_ratio, int64_t horizon,
                              df_error *err);

// The rate optimizer step `step` (1-based) uses: base·step/W for step <= W; then cosine:
// base·½·(1 + cos(π·(step−W−1)/(T−W))) (torch's CosineAnnealingLR with T_max = T−W, eta_min 0), 0 past T;
// constant: base. Steps < 1 are treated as 1.
double df_lr_at(const df_lr_schedule *s, int64_t step);

// Micro-batches per rank per epoch (drop_last) and the run's shape as the recipe states it.
typedef struct {
  int64_t total_steps;        // 0: unset
  int64_t max_steps;          // 0: unset
  int64_t num_epochs;         // >= 1
  int64_t batches_per_epoch;  // per rank, drop_last
  int64_t accumulation_steps; // >= 1
} df_train_plan;

// The schedule horizon T: total_steps, else max_steps, else (batches_per_epoch · num_epochs) / accumulation.
// *stop receives the last optimizer step the run takes: max_steps, else total_steps, capped by the data's
// complete windows (epochs × batches / accumulation). Fails, naming the key, when the data gives no optimizer
// step, or when the run would end with the data and leave a partial accumulation window (SpecForge's
// validate_fixed_accumulation_plan; an explicit max_steps or total_steps at or below the complete windows is fine).
df_status df_train_horizon(const df_train_plan *p, int64_t *horizon, int64_t *stop, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
