// Test helpers for runs of the trainer (tests/common/train_run.h).
#include "tests/common/train_run.h"

#include <criterion/criterion.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/export/export.h"
#include "train/export/inspect_export.h"
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

json_t *df_test_resume_is_bit_exact(const df_test_dir *d, int64_t half, int64_t last) {
  char every[64], to_half[64], to_last[64];
  snprintf(every, sizeof every, "training.save_interval=%lld", (long long)half);
  snprintf(to_half, sizeof to_half, "training.max_steps=%lld", (long long)half);
  snprintf(to_last, sizeof to_last, "training.max_steps=%lld", (long long)last);
  df_train_summary s;
  const char *straight[] = {every, to_last, NULL}, *first[] = {every, to_half, NULL}, *rest[] = {every, to_last, NULL};
  df_test_train_ok(d, "straight", straight, NULL, &s);
  cr_expect_eq(s.last_step, last);
  df_test_train_ok(d, "split", first, NULL, &s);
  cr_expect_eq(s.last_step, half);
  df_test_train_ok(d, "split", rest, "split", &s);
  cr_expect_eq(s.start_step, half);
  char a[400], b[400], cmd[1000];
  snprintf(a, sizeof a, "%s/straight/checkpoints/step-%08lld/model.safetensors", d->root, (long long)last);
  snprintf(b, sizeof b, "%s/split/checkpoints/step-%08lld/model.safetensors", d->root, (long long)last);
  snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
  cr_expect_eq(system(cmd), 0, "the resumed run's weights differ");
  json_t *ma = df_test_metrics(d, "straight"), *mb = df_test_metrics(d, "split");
  char *ta = json_dumps(ma, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  char *tb = json_dumps(mb, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  cr_expect_str_eq(ta, tb);
  free(ta), free(tb);
  json_decref(mb);
  return ma;
}

void df_test_resume_refuses(const df_test_dir *d, int64_t step, int64_t last, const char *set, const char *key) {
  char out[400], res[400], to_last[64];
  snprintf(out, sizeof out, "output_dir=%s/split", d->root);
  snprintf(res, sizeof res, "%s/split/checkpoints/step-%08lld", d->root, (long long)step);
  snprintf(to_last, sizeof to_last, "training.max_steps=%lld", (long long)last);
  const char *all[] = {out, to_last, set};
  df_train_options o = {.recipe_path = d->recipe, .overrides = all, .n_overrides = 3, .resume = res, .threads = 1};
  df_train_summary s;
  df_error err = {0};
  cr_expect_neq(df_train(&o, &s, &err), DF_OK, "%s on resume", set);
  cr_expect(strstr(err.msg, key) != NULL, "%s", err.msg);
}

int df_test_export_bf16(const df_test_dir *d, const char *run, const char *arch, char *log, size_t n) {
  char from[400], out[400];
  snprintf(from, sizeof from, "%s/%s", d->root, run);
  snprintf(out, sizeof out, "%s/export", d->root);
  df_export_options eo = {.dtype = DF_ST_BF16, .threads = 1};
  df_export_info info;
  df_error err = {0};
  DF_ASSERT_OK(df_export(from, out, &eo, &info, &err), &err);
  cr_expect_str_eq(info.architecture, arch);
  return df_test_inspect(out, log, n);
}

int df_test_inspect(const char *dir, char *log, size_t n) {
  memset(log, 0, n);
  FILE *fp = fmemopen(log, n - 1, "w");
  int problems = -1;
  df_error err = {0};
  DF_ASSERT_OK(df_inspect_export(dir, fp, &problems, &err), &err);
  fclose(fp);
  return problems;
}
