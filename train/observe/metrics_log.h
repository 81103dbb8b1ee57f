// The run's metrics: <output_dir>/metrics.jsonl, one JSON object per logged optimizer step or eval, appended
// and flushed as it happens (rewound to the resumed step on resume), and the human progress line.
#ifndef DF_TRAIN_OBSERVE_METRICS_LOG_H
#define DF_TRAIN_OBSERVE_METRICS_LOG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char path[4200];
  FILE *fp;
  struct df_tb_writer *tb; // tracking.report_to: tensorboard: every line is mirrored there (owned; NULL: off)
} df_metrics_log;

// Opens <output_dir>/metrics.jsonl for appending after dropping every line whose "step" is greater than
// keep_through (0: a fresh run keeps nothing). The rewrite is atomic (temporary file + rename).
df_status df_metrics_open(df_metrics_log *l, const char *output_dir, int64_t keep_through, df_error *err);
// Appends obj as one compact line (doubles in the shortest text that reads back, base/json_write.h, so equal
// bits print equal) and flushes; with l->tb set, also writes it to the TensorBoard event file
// (train/observe/tb_writer.h).
df_status df_metrics_append(df_metrics_log *l, const json_t *obj, df_error *err);
void df_metrics_close(df_metrics_log *l); // closes l->tb too

// Wall-clock fields (they differ between otherwise identical runs): every line keeps them under these keys,
// and df_metrics_strip_timing removes them before comparing lines.
bool df_metrics_is_timing_key(const char *key);
void df_metrics_strip_timing(json_t *line);

// A number, or null when it is not finite (JSON has no NaN).
json_t *df_metrics_real(double x);

typedef struct {
  int64_t step, stop, epoch;
  double loss, acc, tau, lr, grad_norm; // tau: the window's simulated acceptance length
  double tokens_per_s, eta_s;
  bool skipped;
} df_progress;

// "step 12/100 | ep 0 | loss 5.4321 | acc 0.1234 | tau 1.92 | lr 6.00e-04 | gnorm 1.234 | 12.3k tok/s | ETA 0:01:05"
void df_progress_format(const df_progress *p, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
