// The trainer end to end on the demo shape (recipes/demo-dflash-synthetic.yaml): a fixed number of optimizer steps
// through df_train, with the data feed's reader thread on and off. Prints one table: steps/s, tokens/s, the
// share of step time spent waiting for data (from the per-step metrics.jsonl lines), and the peak RSS.
//
//   bench_train [--steps N] [--threads N] [--repo DIR]
#define _GNU_SOURCE // nftw
#include <ftw.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "train/trainer/trainer.h"

typedef struct {
  int steps, threads;
  const char *repo;
} bench_args;

typedef struct {
  int steps;
  double step_s, wait_s, wall_s;
  int64_t tokens;
} run_stats;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

// Sums step_time_s, data_wait_s and tokens over the step lines of metrics.jsonl (eval lines have no "tokens").
static bool read_metrics(const char *dir, run_stats *r) {
  char path[4200], line[8192];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *fp = fopen(path, "r");
  if (!fp) return false;
  while (fgets(line, sizeof line, fp)) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && json_object_get(o, "tokens")) {
      r->steps++;
      r->step_s += json_number_value(json_object_get(o, "step_time_s"));
      r->wait_s += json_number_value(json_object_get(o, "data_wait_s"));
      r->tokens += json_integer_value(json_object_get(o, "tokens"));
    }
    json_decref(o);
  }
  fclose(fp);
  return r->steps > 0;
}

static df_status run(const bench_args *a, bool prefetch, run_stats *r, df_error *err) {
  char dir[] = "/tmp/df_bench_train_XXXXXX", recipe[4096], set_out[4200], set_steps[64];
  if (!mkdtemp(dir)) return DF_FAIL(err, DF_ERR_IO, "/tmp", NULL, "mkdtemp failed");
  snprintf(recipe, sizeof recipe, "%s/recipes/demo-dflash-synthetic.yaml", a->repo);
  // the demo's paths are relative to the repository root, like every recipe's to the current directory
  if (chdir(a->repo) != 0) return DF_FAIL(err, DF_ERR_IO, a->repo, "pass --repo DIR", "cannot enter %s", a->repo);
  snprintf(set_out, sizeof set_out, "output_dir=%s", dir);
  snprintf(set_steps, sizeof set_steps, "training.max_steps=%d", a->steps);
  const char *sets[] = {set_out, set_steps, "training.log_interval=1", "training.eval_interval=0",
                        "training.save_interval=0"};
  df_train_options o = {
      .recipe_path = recipe, .overrides = sets, .n_overrides = 5, .threads = a->threads, .no_prefetch = !prefetch};
  df_train_summary sum;
  memset(r, 0, sizeof *r);
  double t0 = bench_now();
  df_status st = df_train(&o, &sum, err);
  r->wall_s = bench_now() - t0;
  if (st == DF_OK && !read_metrics(dir, r))
    st = DF_FAIL(err, DF_ERR_FORMAT, dir, NULL, "no step lines in metrics.jsonl");
  nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return st;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  *a = (bench_args){.steps = 200, .threads = 2, .repo = "."};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      a->steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      a->threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repo") && i + 1 < argc)
      a->repo = argv[++i];
    else
      return fprintf(stderr, "usage: %s [--steps N] [--threads N] [--repo DIR]\n", argv[0]), 2;
  }
  return a->steps < 1 ? 2 : 0;
}

int main(int argc, char **argv) {
  bench_args a;
  if (parse_args(argc, argv, &a)) return 2;
  printf("bench_train: recipes/demo-dflash-synthetic.yaml, %d optimizer steps, %d threads (step time includes the data "
         "wait and AdamW; wall includes setup and the final checkpoint)\n\n",
         a.steps, a.threads);
  printf("%-12s %8s %10s %12s %10s %9s\n", "feed", "steps", "steps/s", "tokens/s", "data wait", "wall s");
  for (int pass = 0; pass < 2; pass++) {
    bool prefetch = pass == 0;
    run_stats r;
    df_error err = {0};
    if (run(&a, prefetch, &r, &err) != DF_OK) {
      df_error_print(&err);
      return 1;
    }
    printf("%-12s %8d %10.1f %12.0f %9.2f%% %9.2f\n", prefetch ? "prefetch" : "synchronous", r.steps,
           r.steps / r.step_s, (double)r.tokens / r.step_s, 100.0 * r.wait_s / r.step_s, r.wall_s);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("\npeak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
  return 0;
}
