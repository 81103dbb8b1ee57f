// Experiment trackers (`tracking.report_to: wandb | swanlab | mlflow`): tools/run/track.py runs beside the trainer
// as a child process, follows <output_dir>/metrics.jsonl and forwards every line to the tracker. Its stdin is
// a pipe the trainer holds: when the trainer ends (or dies) the pipe closes, and the script drains the file
// and finishes the tracker's run. Its output goes to <output_dir>/tracking/<backend>.log.
#ifndef DF_TRAIN_OBSERVE_TRACKER_H
#define DF_TRAIN_OBSERVE_TRACKER_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "train/recipe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_tracker df_tracker;

// The pip package report_to needs ("wandb", "swanlab", "mlflow"); NULL for none and tensorboard.
const char *df_tracker_package(df_report_to report_to);

// Checks, before anything else of the run, that r->tracking.report_to's package is importable (base/pytools.h
// picks the interpreter; the error names the package) and finds tools/run/track.py. *out = NULL when report_to
// names no such tracker.
df_status df_tracker_prepare(const df_recipe *r, df_tracker **out, df_error *err);

// Starts the script. Lines with a step at or below from_step (a resumed run's checkpoint) were forwarded by
// the run that wrote them and are skipped. On failure t is freed.
df_status df_tracker_start(df_tracker *t, int64_t from_step, FILE *log, df_error *err);

// Closes the pipe and waits (at most timeout_s) for the script to forward the rest and finish; a script still
// running then is stopped with SIGTERM. A non-zero exit is reported on log (the run itself is not failed: its
// metrics are in metrics.jsonl). NULL is a no-op.
void df_tracker_finish(df_tracker *t, double timeout_s, FILE *log);

#ifdef __cplusplus
}
#endif

#endif
