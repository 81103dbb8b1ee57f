// What a run shows besides metrics.jsonl (tracking.report_to): the TensorBoard mirror of every metrics line,
// with the resolved recipe as text, or the tracker child process (train/observe/tracker.h).
#include <stdio.h>
#include <stdlib.h>

#include "base/path.h"
#include "train/observe/tb_writer.h"
#include "train/observe/tracker.h"
#include "train/trainer/trainer_internal.h"

// The recipe as a Markdown code block (four-space indent) for TensorBoard's Text tab.
static df_status tb_recipe_text(df_tb_writer *w, const char *yaml, df_error *err) {
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (!mem) return DF_FAIL(err, DF_ERR_NOMEM, "tensorboard", NULL, "out of memory");
  fputs("    ", mem);
  for (const char *p = yaml; *p; p++) {
    fputc(*p, mem);
    if (*p == '\n' && p[1]) fputs("    ", mem);
  }
  fclose(mem);
  df_status st = df_tb_text(w, "recipe", 0, text ? text : "", err);
  free(text);
  return st;
}

df_status df_trainer_observe_prepare(df_trainer *t, df_error *err) {
  return df_tracker_prepare(t->recipe, &t->rundir.tracker, err);
}

df_status df_trainer_observe_open(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  if (rc->tracking.report_to == DF_REPORT_TENSORBOARD) {
    char dir[4300];
    snprintf(dir, sizeof dir, "%.4200s/tensorboard", rc->output_dir);
    DF_TRY(df_tb_open(dir, t->prog.step, &t->rundir.metrics.tb, err));
    if (t->rundir.recipe_yaml) DF_TRY(tb_recipe_text(t->rundir.metrics.tb, t->rundir.recipe_yaml, err));
    char file[4300], logdir[4300];
    df_path_shown(df_tb_path(t->rundir.metrics.tb), file, sizeof file);
    df_path_shown(dir, logdir, sizeof logdir);
    if (t->log) fprintf(t->log, "tensorboard: %s (tensorboard --logdir %s)\n", file, logdir);
    return DF_OK;
  }
  if (!t->rundir.tracker) return DF_OK;
  df_status st = df_tracker_start(t->rundir.tracker, t->prog.step, t->log, err);
  if (st != DF_OK) t->rundir.tracker = NULL; // freed by the failed start
  return st;
}

void df_trainer_observe_close(df_trainer *t) {
  df_tracker_finish(t->rundir.tracker, 120.0, t->log);
  t->rundir.tracker = NULL;
}
