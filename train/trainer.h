// The trainer core (`draftforge train`, docs/training.md): micro-batches accumulated over a window and
// normalised by the window's Σ loss weight, clipping, AdamW on the fp32 masters, the LR schedule, metrics,
// NaN skips, SIGINT/SIGTERM, checkpoints and a bit-exact resume.
#ifndef DF_TRAIN_TRAINER_H
#define DF_TRAIN_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "train/dist/comm.h"
#include "train/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

// Test hooks (all optional). grads are the model's flat fp32 gradient buffer (n elements).
typedef struct {
  void *ctx;
  // After micro-step `micro` (0-based) of optimizer step `step` (1-based) added its gradient. A test may poison
  // the gradient (NaN skip) or raise(SIGTERM) here (the step still completes, then the run checkpoints).
  void (*after_micro)(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n);
  // At the boundary, after the global normalisation and clipping, right before AdamW.
  void (*before_update)(void *ctx, int64_t step, const float *grads, int64_t n, double grad_norm, double clip_coef);
  // After AdamW updated the fp32 master weights (n elements) of step `step` (tests simulate an overflow here).
  void (*after_update)(void *ctx, int64_t step, float *params, int64_t n);
  // After optimizer step `step` (its window and update, before eval and checkpoints): the host↔device traffic of
  // that step alone (kernels/ops.h df_transfer_stats; the trainer resets the counters as each step begins).
  void (*after_step)(void *ctx, int64_t step, df_transfer_stats transfers);
} df_train_hooks;

typedef struct {
  const char *recipe_path;
  const char *const *overrides; // --set section.key=value (train/recipe.h)
  int n_overrides;
  const char *resume; // --resume PATH: a run directory or a checkpoint directory (wins over training.resume_from)
  int threads;        // CPU threads (0: OpenMP's default)
  FILE *log;          // progress lines and notes (NULL: quiet)
  // A terminal (train/progress.h): the progress line is redrawn there every step, and log should be its log
  // stream. NULL: a plain progress line on log at each log step.
  struct df_progress_term *progress;
  bool handle_signals; // SIGINT/SIGTERM finish the current optimizer step, checkpoint and stop
  bool no_prefetch;    // read batches on the training thread (the batches are the same)
  const df_train_hooks *hooks;
  bool has_device;                   // --device given: it wins over training.device
  df_device_choice device;           // auto | cpu | cuda (train/device.h)
  const df_ctx_options *ctx_options; // when not NULL, the exact context to run on (tests: the fake device)
  df_comm *comm;                     // the job's communicator (train/dist); NULL: one process
} df_train_options;

typedef struct {
  int64_t start_step;     // optimizer steps done before this invocation (the resumed step, else 0)
  int64_t last_step;      // steps done when it returned
  int64_t stop_step;      // where the run stops: max_steps (else the horizon) capped by the data
  int64_t horizon;        // the LR schedule's T
  int64_t skipped_steps;  // NaN/Inf skips, whole run
  bool stopped_by_signal; // SIGINT/SIGTERM: stopped early with a checkpoint
  char output_dir[4096];
  char last_checkpoint[4200]; // "" when none was written
  double last_loss;           // of the last step that updated (NaN if none)
} df_train_summary;

// Runs (or resumes) the recipe's training to its stop step. A stop by signal returns DF_OK with
// stopped_by_signal set; N consecutive NaN/Inf skips return DF_ERR_NUMERIC (no checkpoint is written for them).
df_status df_train(const df_train_options *opt, df_train_summary *sum, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
