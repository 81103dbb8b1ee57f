// `draftforge train`: the command line around df_train (docs/training.md): options, the checks that make a bad
// argument exit 2 before anything runs, the process's place in the job (train/dist: launcher,
// deployment.trainer, communicator, the same recipe on every rank), and the closing message with a resume command
// that pastes as is. Exit codes: 0 done (or stopped by a signal with a checkpoint), 1 the run failed (on any rank:
// the whole job ends), 2 bad arguments.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/path.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/dist/dist.h"
#include "train/observe/progress.h"
#include "train/recipe/device.h"
#include "train/recipe/recipe.h"
#include "train/run/run_dir.h"
#include "train/run/run_plan.h"
#include "train/trainer/mem_plan.h"
#include "train/trainer/trainer.h"

static const df_cli_opt TRAIN_OPTS[] = {
    {"--set", "KEY=VALUE", DF_CLI_REPEAT, "none",
     "override a recipe key: --set training.max_steps=100, --set output_dir=runs/x"},
    {"--resume", "PATH|auto", DF_CLI_VALUE, "training.resume_from, else a new run",
     "continue a run: its output_dir, checkpoints/ or one checkpoint directory; the run's own recipe.resolved.yaml "
     "is used (RECIPE.yaml optional). auto: resume output_dir when it has a checkpoint, else start"},
    {"--overwrite", NULL, DF_CLI_FLAG, "off",
     "a new run may replace an earlier run's checkpoints and metrics in output_dir"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads (resume bit-exact with the same count)"},
    {"--no-prefetch", NULL, DF_CLI_FLAG, "off", "read batches on the training thread (the batches are the same)"},
    {"--device", "auto|cpu|cuda", DF_CLI_VALUE, "training.device (auto)",
     "where it runs; auto takes CUDA when a GPU is visible and its backend has every op of a step, else the CPU"},
    {"--data-scan", "sampled|full|none", DF_CLI_VALUE, "sampled",
     "NaN/Inf check of the data at start-up: up to 16 samples per shard spread over the data (at most ~256 "
     "MiB read), every sample, or none"},
    {"--plan", NULL, DF_CLI_FLAG, "off",
     "print the device memory the run needs, by category, and exit: measured on the run's own code with nothing "
     "computed and no weight or data read (docs/gpu-training.md \"Memory plan\"). --device picks the backend "
     "planned for (auto: CUDA when this build has it, GPU or not)"},
    {"--device-memory", "SIZE", DF_CLI_VALUE, "none",
     "with --plan: also find the largest training.batch_size whose peak fits SIZE (141GB, 80GiB, 81920MiB, bytes)"},
    {"--world-size", "N", DF_CLI_VALUE, "deployment.trainer nnodes x nproc_per_node",
     "with --plan: the ranks to plan for (ZeRO-1, training.fsdp_sharding, shards the AdamW moments)"},
    DF_CLI_END};

static const df_cli_spec TRAIN_CLI = {
    "train",
    "RECIPE.yaml",
    0,
    1,
    "Trains the draft the recipe describes (docs/training.md). Checkpoints go to <output_dir>/checkpoints/step-<N>/,\n"
    "metrics to <output_dir>/metrics.jsonl, the resolved recipe to <output_dir>/recipe.resolved.yaml. RECIPE.yaml\n"
    "is required except with --resume PATH. SIGINT/SIGTERM finish the current optimizer step, write a checkpoint\n"
    "and exit 0 (a second one stops at once); a failure after training started writes a checkpoint first.",
    TRAIN_OPTS};

static bool exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

// The command that continues the run, ready to paste: the run's own recipe makes --set unnecessary.
static void resume_command(const df_train_summary *s, long long threads, char *out, size_t n) {
  char self[4096], dir[4096];
  df_self_path(self, sizeof self);
  df_path_shown(s->output_dir, dir, sizeof dir);
  out[0] = 0;
  df_shell_quote_append(out, n, self);
  snprintf(out + strlen(out), n - strlen(out), " train --resume ");
  df_shell_quote_append(out, n, dir);
  if (threads > 0) snprintf(out + strlen(out), n - strlen(out), " --threads %lld", threads);
}

// Arguments a run cannot start with are usage errors (exit 2), found before the recipe is read.
static int check_arguments(const df_cli_args *a, const char *recipe, const char *resume, const char *const *sets,
                           int n_sets) {
  if (!recipe && (!resume || !strcmp(resume, "auto")))
    return df_cli_usage_error(&TRAIN_CLI, "RECIPE.yaml is required%s", resume ? " with --resume auto" : "");
  if (recipe && !exists(recipe)) return df_cli_usage_error(&TRAIN_CLI, "recipe %s does not exist", recipe);
  if (resume && strcmp(resume, "auto") && !exists(resume))
    return df_cli_usage_error(&TRAIN_CLI, "--resume %s does not exist (pass a run directory or a checkpoint)", resume);
  df_error err = {0};
  if (df_recipe_check_overrides(sets, n_sets, &err) != DF_OK) {
    df_error_print_verbose(&err, a->verbose);
    return DF_EXIT_USAGE;
  }
  return 0;
}

// --plan: the memory plan of the recipe's micro-batch and, with --device-memory, the largest that fits.
static int run_plan(const df_cli_args *a, const char *recipe, const char *const *sets, int n_sets, int device,
                    long long threads, long long world, int64_t memory) {
  if (a->npos == 0 || df_cli_has(a, "--resume"))
    return df_cli_usage_error(&TRAIN_CLI, "--plan plans a new run of RECIPE.yaml: give the recipe, without --resume");
  const char *note = NULL;
  df_mem_plan_options o = {.recipe_path = recipe, .overrides = sets, .n_overrides = n_sets, .world_size = (int)world};
  o.ctx = device == DF_DEVICE_AUTO ? df_mem_plan_default_ctx(&note)
                                   : (df_ctx_options){.device = device == DF_DEVICE_CUDA ? DF_DEV_CUDA : DF_DEV_CPU};
  o.ctx.num_threads = (int)threads;
  if (device == DF_DEVICE_CUDA && !df_cuda_built())
    return df_cli_usage_error(&TRAIN_CLI, "--plan --device cuda: this build has no CUDA backend (rebuild with nvcc on "
                                          "PATH, or plan with --device cpu)");
  df_error err = {0};
  df_mem_plan p;
  if (df_mem_plan_run(&o, &p, &err) != DF_OK) return df_error_print_verbose(&err, a->verbose), DF_EXIT_FAILURE;
  if (note) printf("note: %s\n", note);
  df_mem_plan_print(&p, stdout);
  if (!memory) return DF_EXIT_OK;
  int64_t best;
  df_mem_plan fit, over;
  if (df_mem_plan_fit(&o, memory, 4096, &best, &fit, &over, &err) != DF_OK)
    return df_error_print_verbose(&err, a->verbose), DF_EXIT_FAILURE;
  char m[32], f[32], n[32];
  df_mem_bytes_text(memory, m, sizeof m);
  printf("device memory %s (%lld bytes): batch %lld %s\n", m, (long long)memory, (long long)p.batch,
         p.mem.device.peak <= memory ? "fits" : "does NOT fit");
  if (best == 0)
    printf("largest batch_size that fits: none (batch 1 needs %s)\n",
           df_mem_bytes_text(over.mem.device.peak, n, sizeof n));
  else if (over.batch == 0)
    printf("largest batch_size that fits: %lld or more (the search stops at 4096: peak %s)\n", (long long)best,
           df_mem_bytes_text(fit.mem.device.peak, f, sizeof f));
  else
    printf("largest batch_size that fits: %lld (peak %s); batch %lld needs %s\n", (long long)best,
           df_mem_bytes_text(fit.mem.device.peak, f, sizeof f), (long long)over.batch,
           df_mem_bytes_text(over.mem.device.peak, n, sizeof n));
  return DF_EXIT_OK;
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

// The job as the launcher started it, checked against the recipe the run will use (RECIPE.yaml, or a resumed
// run's own recipe.resolved.yaml); then every rank must hold the same resolved recipe (same file, --set options
// and paths), or the ranks would train different things.
static df_status start_dist(const df_run_plan_options *po, const df_device_choice *device, df_dist *d, df_error *err) {
  memset(d, 0, sizeof *d);
  const df_recipe *rc = NULL;
  DF_TRY(df_run_plan_peek_recipe(po, &rc, err));
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  df_status st = mem ? df_recipe_write_resolved(rc, mem, err) : DF_FAIL(err, DF_ERR_NOMEM, "recipe", NULL, "no memory");
  if (mem) fclose(mem);
  uint64_t hash = text ? fnv1a(text, len) : 0;
  free(text);
  char out[4096];
  df_path_absolute(rc->output_dir, out, sizeof out); // the same job key whichever way the path is spelled
  // GPU ranks (NCCL) when the run's device resolves to CUDA, else CPU ranks (MPI)
  df_dist_options o = {.gpu = df_device_picks_cuda(device ? *device : rc->training.device),
                       .cuda_device = -1,
                       .timeout_s = rc->training.dist_timeout * 60.0,
                       .deploy = deploy_of(rc),
                       .job_key = fnv1a(out, strlen(out)),
                       .log = stdout};
  if (st == DF_OK) st = df_dist_init(&o, d, err);
  if (st == DF_OK) st = df_dist_check_same(d->comm, "resolved recipe", hash, err);
  df_recipe_free(rc);
  return st;
}

// Prints this rank's error (a saved-state note first, so the HINT stays the last line), then ends the job
// everywhere (the other ranks are stopped, not left waiting).
static int fail_job(df_dist *d, const df_error *err, bool verbose, const char *note, int code) {
  fflush(stdout);
  if (note && note[0]) fputs(note, stderr);
  df_error_print_verbose(err, verbose);
  fflush(stderr);
  df_dist_abort(d, code);
  return code;
}

int df_cmd_train(int argc, char **argv) {
  df_cli_args a;
  int rc = df_cli_parse(&TRAIN_CLI, argc, argv, &a);
  if (rc) return df_cli_free(&a), rc == 1 ? DF_EXIT_OK : rc;
  static const char *const scans[] = {"sampled", "full", "none", NULL};
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order
  long long threads, world;
  int scan, n_sets, device;
  int64_t memory;
  const char *const *sets = df_cli_list(&a, "--set", &n_sets);
  const char *recipe = a.npos ? a.pos[0] : NULL, *resume = df_cli_get(&a, "--resume");
  if (!df_cli_int(&a, "--threads", 0, 4096, 0, &threads) || !df_cli_choice(&a, "--data-scan", scans, 0, &scan) ||
      !df_cli_choice(&a, "--device", devices, 0, &device) || !df_cli_int(&a, "--world-size", 1, 65536, 0, &world) ||
      !df_cli_bytes(&a, "--device-memory", &memory))
    return df_cli_free(&a), DF_EXIT_USAGE;
  const bool plan = df_cli_has(&a, "--plan");
  if (!plan && (memory || world))
    return df_cli_free(&a), df_cli_usage_error(&TRAIN_CLI, "%s goes with --plan (it sizes a plan, not a run)",
                                               memory ? "--device-memory" : "--world-size");
  if ((rc = check_arguments(&a, recipe, resume, sets, n_sets))) return df_cli_free(&a), rc;
  if (threads > 0) omp_set_num_threads((int)threads);
  if (plan) {
    rc = run_plan(&a, recipe, sets, n_sets, device, threads, world, memory);
    return df_cli_free(&a), rc;
  }
  df_run_plan_options po = {.recipe_path = recipe, .overrides = sets, .n_overrides = n_sets, .resume = resume};
  df_dist d;
  df_error err = {0};
  const df_device_choice dev_choice = (df_device_choice)device;
  if (start_dist(&po, df_cli_has(&a, "--device") ? &dev_choice : NULL, &d, &err) != DF_OK) {
    df_cli_free(&a);
    return fail_job(&d, &err, a.verbose, NULL, DF_EXIT_FAILURE);
  }
  df_progress_term *term = NULL; // a terminal gets the refreshing progress line (train/observe/progress.h)
  if (df_progress_is_terminal(stdout) && df_progress_term_open(stdout, 0, &term, &err) != DF_OK) term = NULL;
  df_train_options o = {.recipe_path = recipe,
                        .overrides = sets,
                        .n_overrides = n_sets,
                        .resume = resume,
                        .overwrite = df_cli_has(&a, "--overwrite"),
                        .data_scan = (df_data_scan)scan,
                        .threads = (int)threads,
                        .log = term ? df_progress_term_log(term) : stdout,
                        .progress = term,
                        .handle_signals = true,
                        .no_prefetch = df_cli_has(&a, "--no-prefetch"),
                        .has_device = df_cli_has(&a, "--device"),
                        .device = (df_device_choice)device,
                        .comm = d.comm};
  df_train_summary s;
  const int rank = d.comm ? df_comm_rank(d.comm) : 0;
  df_status st = df_train(&o, &s, &err);
  df_progress_term_close(term);
  char cmd[8400], note[8400 + 4000 + 200] = ""; // room for the longest command and checkpoint path
  char last[4096] = "(none)";
  resume_command(&s, threads, cmd, sizeof cmd);
  if (s.last_checkpoint[0]) df_path_shown(s.last_checkpoint, last, sizeof last);
  if (st != DF_OK && s.saved_after_error)
    snprintf(note, sizeof note, "the run failed after step %lld; its state was saved first: %.4000s\nresume with: %s\n",
             (long long)s.last_step, last, cmd);
  if (st == DF_OK) st = df_dist_finish(&d, &err);
  if (st != DF_OK) {
    bool verbose = a.verbose;
    df_cli_free(&a);
    return fail_job(&d, &err, verbose, note, s.bad_arguments ? DF_EXIT_USAGE : DF_EXIT_FAILURE);
  }
  if (rank != 0) return df_cli_free(&a), DF_EXIT_OK; // rank 0 speaks for the job
  if (s.stopped_by_signal)
    printf("stopped by a signal after step %lld of %lld; checkpoint %s\nresume with: %s\n", (long long)s.last_step,
           (long long)s.stop_step, last, cmd);
  else
    printf("done: step %lld of %lld (%lld skipped); last checkpoint %s\n", (long long)s.last_step,
           (long long)s.stop_step, (long long)s.skipped_steps, last);
  df_cli_free(&a);
  return DF_EXIT_OK;
}
