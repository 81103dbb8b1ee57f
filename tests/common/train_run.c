// Test helpers for runs of the trainer (tests/common/train_run.h).
#include "tests/common/train_run.h"

#include <criterion/criterion.h>
#include <omp.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/observe/metrics_log.h"

FILE *df_test_dir_open(df_test_dir *d, const char *tag) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_%s_%ld", tag, (long)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp, "%s", d->recipe);
  return fp;
}

void df_test_dir_close(df_test_dir *d) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

void df_test_train_ok(const df_test_dir *d, const char *run, const char *const *sets, const char *resume,
                      df_train_summary *s) {
  const char *all[16];
  char out[400], res[400];
  snprintf(out, sizeof out, "output_dir=%s/%s", d->root, run);
  int n = 0;
  all[n++] = out;
  for (int i = 0; sets && sets[i] && n < 16; i++) all[n++] = sets[i];
  if (resume) snprintf(res, sizeof res, "%s/%s", d->root, resume);
  df_train_options o = {.recipe_path = d->recipe,
                        .overrides = all,
                        .n_overrides = n,
                        .resume = resume ? res : NULL,
                        .threads = 1,
                        .handle_signals = true};
  omp_set_num_threads(1);
  df_error err = {0};
  DF_ASSERT_OK(df_train(&o, s, &err), &err);
}

json_t *df_test_metrics(const df_test_dir *d, const char *run) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", d->root, run);
  FILE *fp = fopen(p, "r");
  cr_assert(fp, "no %s", p);
  json_t *rows = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    cr_assert(o);
    df_metrics_strip_timing(o);
    json_array_append_new(rows, o);
  }
  free(line);
  fclose(fp);
  return rows;
}
