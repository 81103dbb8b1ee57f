// The trainer core (`draftforge train`, docs/training.md): micro-batches accumulated over a window and
// normalised by the window's Σ loss weight, clipping, AdamW on the fp32 masters, the LR schedule, metrics,
// NaN skips, SIGINT/SIGTERM, checkpoints and a bit-exact resume.
#ifndef DF_TRAIN_TRAINER_TRAINER_H
#define DF_TRAIN_TRAINER_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "train/dist/comm.h"
#include "train/recipe/recipe.h"

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

// Start-up scan of the training and eval data for NaN/Inf hidden states (train/data/hs_scan.h).
typedef enum { DF_DATA_SCAN_SAMPLED = 0, DF_DATA_SCAN_FULL, DF_DATA_SCAN_NONE } df_data_scan;

typedef struct {
  const char *recipe_path;      // RECIPE.yaml; may be NULL when resuming a run directory (its recipe.resolved.yaml)
  const char *const *overrides; // --set section.key=value (train/recipe/recipe.h)
  int n_overrides;
  // --resume PATH (wins over training.resume_from): a run directory, its checkpoints/, a checkpoint directory, or
  // "auto" (resume when output_dir has a checkpoint, else start). A resume continues in the run it resumes, with
  // the run's own recipe (train/run/run_plan.h).
  const char *resume;
  bool overwrite;         // a fresh run may replace an earlier run's checkpoints and metrics in output_dir
  df_data_scan data_scan; // default: a sampled scan
  int threads;            // CPU threads (0: OpenMP's default)
  FILE *log;              // progress lines and notes (NULL: quiet)
  // A terminal (train/observe/progress.h): the progress line is redrawn there every step, and log should be its log
  // stream. NULL: a plain progress line on log at each log step.
  struct df_progress_term *progress;
  bool handle_signals; // SIGINT/SIGTERM finish the current optimizer step, checkpoint and stop
  bool no_prefetch;    // read batches on the training thread (the batches are the same)
  // Online data: prefill the next batch on the feed's reader thread while the step runs. Off by default: the CPU
  // target and the step then compete for the same cores, which measured slower than taking turns (docs/target.md
  // "Online training"); the batches are the same either way.
  bool online_overlap;
  const df_train_hooks *hooks;
  bool has_device;                   // --device given: it wins over training.device
  df_device_choice device;           // auto | cpu | cuda (train/recipe/device.h)
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
  char last_checkpoint[4200]; // the newest checkpoint of the run ("" when it has none): written, or resumed from
  bool saved_after_error;     // the run failed after training started and a checkpoint of its state was written
  bool bad_arguments;         // it failed because RECIPE.yaml or a --set disagrees with the run it resumes
  double last_loss;           // of the last step that updated (NaN if none)
  // Online data (train/data/online_source.h): what the target computed in this invocation (0 offline): samples and
  // tokens prefilled, seconds in its forward (training batches, prefetched ones and eval together).
  int64_t online_samples, online_tokens;
  double online_target_s;
  // The device memory the run took as tracked (kernels/ops.h df_ctx_mem_stats): its context's, plus the online
  // target's. What `draftforge train --plan` predicts (train/trainer/mem_plan.h).
  df_mem_stats mem;
} df_train_summary;

// Runs (or resumes) the recipe's training to its stop step. A stop by signal returns DF_OK with
// stopped_by_signal set; N consecutive NaN/Inf skips return DF_ERR_NUMERIC (no checkpoint is written for them).
// Any other error after training started first writes a checkpoint of the last complete step (saved_after_error),
// unless the state was mid-update or is not finite.
df_status df_train(const df_train_options *opt, df_train_summary *sum, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
