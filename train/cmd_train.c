// `draftforge train RECIPE.yaml [--set section.key=value ...] [--resume PATH] [--threads N] [--no-prefetch]`:
// argument parsing, the process's place in the job (train/dist: launcher, deployment.trainer, communicator,
// the same recipe on every rank) and the closing message around df_train. Exit codes: 0 done (or stopped by a
// signal with a checkpoint), 1 the run failed (on any rank: the whole job ends), 2 bad arguments.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/commands.h"
#include "train/device.h"
#include "train/dist/dist.h"
#include "train/progress.h"
#include "train/recipe.h"
#include "train/trainer.h"

static const char *train_usage =
    "usage: draftforge train RECIPE.yaml [--set section.key=value ...] [--resume PATH] [--threads N]\n"
    "                        [--no-prefetch] [--device auto|cpu|cuda]\n"
    "\n"
    "Trains the draft the recipe describes (docs/training.md). Checkpoints go to\n"
    "<output_dir>/checkpoints/step-<N>/, metrics to <output_dir>/metrics.jsonl, and the resolved\n"
    "recipe to <output_dir>/recipe.resolved.yaml.\n"
    "  --set K=V      override a recipe key: --set training.max_steps=100, --set output_dir=runs/x\n"
    "  --resume PATH  continue a run: PATH is its output_dir (latest checkpoint) or one checkpoint\n"
    "                 directory (same as training.resume_from)\n"
    "  --threads N    CPU threads (default: OpenMP's)\n"
    "  --no-prefetch  read batches on the training thread\n"
    "  --device D     auto, cpu or cuda (default: training.device, itself auto)\n"
    "SIGINT/SIGTERM finish the current optimizer step, write a checkpoint and exit 0; a second one\n"
    "stops at once.\n";

typedef struct {
  const char *recipe, *resume;
  const char **sets;
  int n_sets, threads;
  bool no_prefetch, has_device;
  df_device_choice device;
} train_args;

// argv holds the arguments after "train". Returns 0 on success, 1 for --help (printed), 2 on a usage error.
static int parse_train_args(int argc, char **argv, train_args *a) {
  memset(a, 0, sizeof *a);
  a->sets = calloc((size_t)argc + 1, sizeof *a->sets);
  if (!a->sets) return fputs("draftforge train: out of memory\n", stderr), 2;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(train_usage, stdout), 1;
    if (!strcmp(s, "--set") && i + 1 < argc)
      a->sets[a->n_sets++] = argv[++i];
    else if (!strncmp(s, "--set=", 6))
      a->sets[a->n_sets++] = s + 6;
    else if (!strcmp(s, "--resume") && i + 1 < argc)
      a->resume = argv[++i];
    else if (!strcmp(s, "--no-prefetch"))
      a->no_prefetch = true;
    else if (!strcmp(s, "--device") && i + 1 < argc) {
      df_error e = {0};
      if (df_device_choice_parse(argv[++i], &a->device, &e) != DF_OK)
        return fprintf(stderr, "draftforge train: %s\n  HINT: %s\n", e.msg, e.hint), 2;
      a->has_device = true;
    } else if (!strcmp(s, "--threads") && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (!*argv[i] || *end || v < 0 || v > 4096)
        return fprintf(stderr, "draftforge train: --threads wants a count, got '%s'\n", argv[i]), 2;
      a->threads = (int)v;
    } else if (s[0] != '-' && !a->recipe)
      a->recipe = s;
    else
      return fprintf(stderr, "draftforge train: unexpected argument '%s'\n%s", s, train_usage), 2;
  }
  if (!a->recipe) return fprintf(stderr, "draftforge train: RECIPE.yaml is required\n%s", train_usage), 2;
  return 0;
}

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static df_deploy_trainer deploy_of(const df_recipe *rc) {
  df_deploy_trainer d = {.nnodes = rc->deployment.trainer.nnodes,
                         .nproc_per_node = rc->deployment.trainer.nproc_per_node,
                         .node_rank = rc->deployment.trainer.node_rank,
                         .master_port = rc->deployment.trainer.master_port,
                         .master_addr = rc->deployment.trainer.master_addr,
                         .nnodes_set = rc->deployment.trainer.nnodes_set,
                         .nproc_per_node_set = rc->deployment.trainer.nproc_per_node_set,
                         .node_rank_set = rc->deployment.trainer.node_rank_set,
                         .master_port_set = rc->deployment.trainer.master_port_set};
  return d;
}

// The job as the launcher started it, checked against the recipe; then every rank must hold the same resolved
// recipe (same file, --set options and paths), or the ranks would train different things.
static df_status start_dist(const train_args *a, df_dist *d, df_error *err) {
  memset(d, 0, sizeof *d);
  df_recipe_options ro = {.log = stderr, .overrides = a->sets, .n_overrides = a->n_sets};
  const df_recipe *rc = NULL;
  DF_TRY(df_recipe_load(a->recipe, &ro, &rc, err));
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  df_status st = mem ? df_recipe_write_resolved(rc, mem, err) : DF_FAIL(err, DF_ERR_NOMEM, "recipe", NULL, "no memory");
  if (mem) fclose(mem);
  uint64_t hash = text ? fnv1a(text, len) : 0;
  free(text);
  df_dist_options o = {.gpu = false, // host buffers: the trainer refuses world > 1 (either device) for now
                       .cuda_device = -1,
                       .timeout_s = rc->training.dist_timeout * 60.0,
                       .deploy = deploy_of(rc),
                       .job_key = fnv1a(rc->output_dir, strlen(rc->output_dir)),
                       .log = stdout};
  if (st == DF_OK) st = df_dist_init(&o, d, err);
  if (st == DF_OK) st = df_dist_check_same(d->comm, "resolved recipe", hash, err);
  df_recipe_free(rc);
  return st;
}

// Prints this rank's error, then ends the job everywhere (the other ranks are stopped, not left waiting).
static int fail_job(df_dist *d, const df_error *err) {
  fflush(stdout);
  df_error_print(err);
  fflush(stderr);
  df_dist_abort(d, 1);
  return 1;
}

int df_cmd_train(int argc, char **argv) {
  train_args a;
  int rc = parse_train_args(argc, argv, &a);
  if (rc) {
    free(a.sets);
    return rc == 1 ? 0 : rc;
  }
  if (a.threads > 0) omp_set_num_threads(a.threads);
  df_dist d;
  df_error err = {0};
  if (start_dist(&a, &d, &err) != DF_OK) {
    free(a.sets);
    return fail_job(&d, &err);
  }
  df_progress_term *term = NULL; // a terminal gets the refreshing progress line (train/progress.h)
  if (df_progress_is_terminal(stdout) && df_progress_term_open(stdout, 0, &term, &err) != DF_OK) term = NULL;
  df_train_options o = {.recipe_path = a.recipe,
                        .overrides = a.sets,
                        .n_overrides = a.n_sets,
                        .resume = a.resume,
                        .threads = a.threads,
                        .log = term ? df_progress_term_log(term) : stdout,
                        .progress = term,
                        .handle_signals = true,
                        .no_prefetch = a.no_prefetch,
                        .has_device = a.has_device,
                        .device = a.device,
                        .comm = d.comm};
  df_train_summary s;
  const int rank = d.comm ? df_comm_rank(d.comm) : 0;
  df_status st = df_train(&o, &s, &err);
  df_progress_term_close(term);
  free(a.sets);
  if (st == DF_OK) st = df_dist_finish(&d, &err);
  if (st != DF_OK) return fail_job(&d, &err);
  if (rank != 0) return 0; // rank 0 speaks for the job
  if (s.stopped_by_signal)
    printf(
        "stopped by a signal after step %lld of %lld; checkpoint %s\nresume with: draftforge train %s --resume %s%s\n",
        (long long)s.last_step, (long long)s.stop_step, s.last_checkpoint, a.recipe, s.output_dir,
        a.n_sets ? "  (and the same --set options)" : "");
  else
    printf("done: step %lld of %lld (%lld skipped); last checkpoint %s\n", (long long)s.last_step,
           (long long)s.stop_step, (long long)s.skipped_steps, s.last_checkpoint[0] ? s.last_checkpoint : "(none)");
  return 0;
}
