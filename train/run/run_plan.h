// What `draftforge train` runs (docs/training.md "Resume"): a fresh run of the recipe, or the continuation of a
// run in its own directory with its own recipe.resolved.yaml. Overrides given again must agree with the run except
// the keys a resume may change (df_run_plan_may_change); a fresh run never writes into a directory that holds
// another run's checkpoints unless told to overwrite them.
#ifndef DF_TRAIN_RUN_RUN_PLAN_H
#define DF_TRAIN_RUN_RUN_PLAN_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"
#include "train/recipe/recipe.h"
#include "train/run/run_dir.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *recipe_path;      // RECIPE.yaml; may be NULL when resuming a run directory
  const char *const *overrides; // --set
  int n_overrides;
  const char *resume; // --resume PATH or "auto"; NULL: training.resume_from, else a fresh run
  bool overwrite;     // --overwrite: a fresh run may replace an earlier run's outputs in output_dir
  FILE *log;          // notes (NULL: quiet)
} df_run_plan_options;

typedef struct {
  bool resume;         // continue the run in from.run_dir from the checkpoint from.ckpt
  df_ckpt_choice from; // resume: the checkpoint taken (from.note says how it was chosen)
  bool overwrite;      // a fresh run replaces an earlier run's outputs (df_run_plan_apply removes them)
  bool bad_arguments;  // the failure is the command line's: RECIPE.yaml or a --set disagrees with the run
} df_run_plan;

// Decides fresh or resume and loads the recipe the run uses (*recipe, the caller frees it). A disagreeing
// override or recipe key is an error naming the key; so is a fresh run into a directory holding checkpoints,
// unless opt->overwrite.
df_status df_run_plan_make(const df_run_plan_options *opt, const df_recipe **recipe, df_run_plan *plan, df_error *err);
// With plan->overwrite: removes the earlier run's checkpoints/, metrics.jsonl, recipe.resolved.yaml and
// tensorboard/ from output_dir (nothing else). Called once the new run has passed its start-up checks.
df_status df_run_plan_apply(const df_run_plan *plan, const df_recipe *recipe, FILE *log, df_error *err);

// The recipe the run will use, cheaply (no checkpoint is read or verified), for what must be known before the
// trainer starts (the launch checks of train/dist and the same-recipe check across ranks): RECIPE.yaml with its
// --set, or for `--resume PATH` alone the run's recipe.resolved.yaml with output_dir pinned and the --set
// applied. Falls back to df_run_plan_make when the run has no recipe.resolved.yaml.
df_status df_run_plan_peek_recipe(const df_run_plan_options *opt, const df_recipe **recipe, df_error *err);

// Whether a resume may change `key` ("section.key"): the stop (max_steps, num_epochs), the save / eval / log
// cadence, max_checkpoints, max_consecutive_skips, resume_from, tracking and profiling, and batch_size (a resume
// on another world size; the checkpoint's contract compares the global batch, ranks x batch_size). Everything else must
// agree with the run; the checkpoint's contract (train/run/ckpt.h) checks the values that decide the bits.
bool df_run_plan_may_change(const char *key);

#ifdef __cplusplus
}
#endif

#endif
