// Test helpers for runs of the trainer: a scratch directory with a recipe, a run with --set overrides (and a resume),
// and the run's metrics.jsonl read back without its timing keys.
#ifndef DF_TESTS_TRAIN_RUN_H
#define DF_TESTS_TRAIN_RUN_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "train/trainer/trainer.h"

typedef struct {
  char root[256], recipe[300];
} df_test_dir;

// A fresh /tmp/df_test_<tag>_<pid> and the path of its recipe.yaml, opened for writing (the caller closes it).
FILE *df_test_dir_open(df_test_dir *d, const char *tag);
void df_test_dir_close(df_test_dir *d);
// df_train on the directory's recipe into run (its output_dir), with sets (NULL-terminated) and, when resume is not
// NULL, resuming from that path under the directory; one thread. Fails the test on an error.
void df_test_train_ok(const df_test_dir *d, const char *run, const char *const *sets, const char *resume,
                      df_train_summary *s);
// run's metrics.jsonl rows (timing keys stripped); the caller frees it.
json_t *df_test_metrics(const df_test_dir *d, const char *run);
// Runs "straight" to step last and "split" to half, then resumes "split" to last (checkpoints every half steps): the
// final weights are byte-identical and the metrics lines equal. Returns the straight run's lines (caller frees).
json_t *df_test_resume_is_bit_exact(const df_test_dir *d, int64_t half, int64_t last);
// `draftforge export` of run (its latest checkpoint) into <root>/export in bf16, naming class arch, then inspect:
// the report into log (n bytes), the problems it counts returned.
int df_test_export_bf16(const df_test_dir *d, const char *run, const char *arch, char *log, size_t n);
// `draftforge inspect` of an export directory into log; the problems it counts.
int df_test_inspect(const char *dir, char *log, size_t n);
// Resuming "split" from its checkpoint at step with the override set is refused, the error naming key.
void df_test_resume_refuses(const df_test_dir *d, int64_t step, int64_t last, const char *set, const char *key);

#endif
