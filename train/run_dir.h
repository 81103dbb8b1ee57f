// A run directory (<output_dir>/: recipe.resolved.yaml, metrics.jsonl, checkpoints/) as the commands see it:
// paths as messages show them (normalised, relative to the working directory when under it), which checkpoint a resume
// / export / eval takes (latest, best, or the newest complete one when latest is damaged; manifests verified), and
// removal of temporaries left by dead processes.
#ifndef DF_TRAIN_RUN_DIR_H
#define DF_TRAIN_RUN_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// Lexical normalisation, as os.path.normpath: "recipes/../runs/x/" -> "runs/x", "./a//b" -> "a/b"; a relative
// path stays relative (leading ".." kept), "" -> ".". Symbolic links are not followed.
void df_path_normalize(const char *in, char *out, size_t n);
// The absolute normalised path (a relative one is taken from the working directory).
void df_path_absolute(const char *in, char *out, size_t n);
// A path as messages show it: normalised and relative to the working directory when it lies under it
// ("/cwd/sub/../runs/x" and "sub/../runs/x" -> "runs/x", the directory itself -> "."), else absolute
// ("../x" -> "/parent/x"). The result still names the same place from the working directory.
void df_path_shown(const char *in, char *out, size_t n);
// Whether a and b name the same place once both are absolute and normalised.
bool df_path_same(const char *a, const char *b);

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

// The checkpoint `export` / `eval` read from PATH: df_ckpt_choose without state.h5 (best with --best), and for
// a directory draftforge did not write, export.h's df_checkpoint_dir_resolve (SpecForge-style *latest /
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

// The program's path as the user can paste it: relative to the working directory when inside it ("./build/
// draftforge"), else absolute; "draftforge" when unknown.
void df_self_path(char *out, size_t n);

// Appends s to out (capacity n), single-quoted for a POSIX shell when it holds anything but [A-Za-z0-9_./=:,+-].
void df_shell_quote_append(char *out, size_t n, const char *s);

#ifdef __cplusplus
}
#endif

#endif
