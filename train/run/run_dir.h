// A run directory (<output_dir>/: recipe.resolved.yaml, metrics.jsonl, checkpoints/) as the commands see it:
// which checkpoint a resume / export / eval takes (latest, best, or the newest complete one when latest is damaged;
// manifests verified), and removal of temporaries left by dead processes.
#ifndef DF_TRAIN_RUN_RUN_DIR_H
#define DF_TRAIN_RUN_RUN_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DF_PICK_LATEST, // checkpoints/latest (else the highest step)
  DF_PICK_BEST,   // checkpoints/best: the best eval so far
} df_ckpt_pick;

typedef struct {
  char run_dir[4096]; // the run the checkpoint belongs to; "" when it does not sit in <run>/checkpoints/
  char ckpt[4200];    // the checkpoint directory chosen
  int64_t step;       // its step (-1 when the directory is not named step-<N>)
  bool verified;      // a manifest was checked (older checkpoints have none)
  char note[1024];    // how it was chosen ("latest, step 600", "latest is damaged (...); took step 400"), for logs
} df_ckpt_choice;

// The checkpoint PATH names: a checkpoint directory (or its state.h5) as it is, a run directory or its
// checkpoints/ directory by `pick`. need_state: the checkpoint must hold state.h5 (resume), else config.json +
// model.safetensors (export, eval). The manifest is verified. A damaged choice is an error that names the file and
// offers the newest complete checkpoint of the run — or, with fall_back, that checkpoint is taken (note says so).
// No checkpoint at all is DF_ERR_IO.
df_status df_ckpt_choose(const char *path, df_ckpt_pick pick, bool need_state, bool fall_back, df_ckpt_choice *out,
                         df_error *err);

// A checkpoint or export directory holds config.json and model.safetensors (or its sharded index). path may
// also be a run directory (its checkpoints/ subdirectory is searched) or a directory of checkpoints: its
// "*latest" link when there is one, else the "*step-<N>" / "*step<N>" subdirectory with the largest N.
// out receives the directory.
df_status df_checkpoint_dir_resolve(const char *path, char *out, size_t out_size, df_error *err);

// The checkpoint `export` / `eval` read from PATH: df_ckpt_choose without state.h5 (best with --best), and for
// a directory draftforge did not write, df_checkpoint_dir_resolve (SpecForge-style *latest /
// *step<N> names). note says which checkpoint was taken and, for a run's latest, where its best one is.
df_status df_ckpt_choose_model(const char *path, bool best, df_ckpt_choice *out, df_error *err);

// The run's best checkpoint (checkpoints/best and best.json): its step, metric and value; false when none.
bool df_run_best(const char *run_dir, int64_t *step, char *metric, size_t n, double *value);

// How many step-<N> directories (complete or not) <output_dir>/checkpoints holds.
int df_run_count_checkpoints(const char *output_dir);

// Removes the temporaries a checkpoint writer leaves when it dies mid-write — checkpoints/.tmp-step-<N>.<pid>/
// directories and latest.tmp.<pid> / best.tmp.<pid> links — whose process no longer runs (or that carry this
// process's own id: it writes none while this is called, so they come from an earlier process that had it).
// Nothing else is touched. Returns how many were removed; each is named on log (may be NULL).
int df_ckpt_remove_stale(const char *ckdir, FILE *log);

#ifdef __cplusplus
}
#endif

#endif
