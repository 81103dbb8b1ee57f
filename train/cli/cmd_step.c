// `draftforge step RECIPE.yaml --dump DIR [--threads N]`: argument parsing and the summary line around
// df_step_run. Returns the exit code: 0 done, 1 the step failed, 2 bad arguments.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/cli/cli.h"
#include "train/recipe/device.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

static const df_cli_opt STEP_OPTS[] = {
    {"--dump", "DIR", DF_CLI_VALUE, "required", "where grads.safetensors and step.json go"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads"},
    {"--device", "auto|cpu|cuda", DF_CLI_VALUE, "training.device (auto)",
     "where it runs; auto takes CUDA when a GPU is visible and its backend has every op of a step, else the CPU"},
    {"--set", "KEY=VALUE", DF_CLI_REPEAT, "none",
     "override a recipe key, as draftforge train does: --set model.torch_dtype=float32"},
    {"--schema", NULL, DF_CLI_FLAG, "off", "print every recipe key (type, default, support) and exit"},
    DF_CLI_END};

static const df_cli_spec STEP_CLI = {
    "step",
    "RECIPE.yaml",
    0,
    1,
    "Runs one DFlash or DSpark micro-step (docs/dflash-step.md; the draft config decides which, and\n"
    "training.strategy must agree) on the first batch of the recipe's data and writes DIR/grads.safetensors (the\n"
    "F32 gradient of loss_num/loss_den for every trainable parameter, DSpark heads included) and DIR/step.json\n"
    "(loss terms and metrics; DSpark adds ce/l1/confidence terms and tau_probabilistic). No optimizer step.",
    STEP_OPTS};

typedef struct {
  const char *recipe, *dump;
  const char **sets; // --set values (pointers into argv; the array is this struct's)
  int n_sets;
  int threads;
  bool schema, verbose, has_device;
  df_device_choice device;
} step_args;

// argv holds the arguments after "step". Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_step_args(int argc, char **argv, step_args *s) {
  memset(s, 0, sizeof *s);
  df_cli_args a;
  int rc = df_cli_parse(&STEP_CLI, argc, argv, &a);
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order
  long long threads = 0;
  int device = 0;
  if (!rc && !(df_cli_int(&a, "--threads", 0, 4096, 0, &threads) && df_cli_choice(&a, "--device", devices, 0, &device)))
    rc = DF_EXIT_USAGE;
  s->has_device = !rc && df_cli_has(&a, "--device"), s->device = (df_device_choice)device;
  s->recipe = a.npos ? a.pos[0] : NULL, s->dump = df_cli_get(&a, "--dump"), s->threads = (int)threads;
  s->schema = df_cli_has(&a, "--schema"), s->verbose = a.verbose;
  int n = 0;
  const char *const *sets = rc ? NULL : df_cli_list(&a, "--set", &n);
  if (n > 0 && (s->sets = calloc((size_t)n, sizeof *s->sets)))
    for (int i = 0; i < n; i++) s->sets[s->n_sets++] = sets[i];
  df_cli_free(&a);
  if (rc || s->schema) return rc;
  if (!s->recipe || !s->dump) return df_cli_usage_error(&STEP_CLI, "RECIPE.yaml and --dump DIR are required");
  if (access(s->recipe, F_OK) != 0) return df_cli_usage_error(&STEP_CLI, "recipe %s does not exist", s->recipe);
  return 0;
}

static void print_summary(const df_step_result *r, const char *dump) {
  printf("step: loss %.6f (%.6g / %.6g)  acc %.0f/%.0f  blocks %lld (B %lld, S %lld, N %lld, bs %lld)  "
         "mean accept length %.3f\n",
         r->loss, r->loss_num, r->loss_den, r->acc_num, r->acc_den, (long long)r->num_blocks, (long long)r->B,
         (long long)r->S, (long long)r->N, (long long)r->bs, r->mean_accept_len);
  printf("wrote %s/grads.safetensors and %s/step.json\n", dump, dump);
}

int df_cmd_step(int argc, char **argv) {
  step_args a;
  int rc = parse_step_args(argc, argv, &a);
  if (rc || a.schema) free(a.sets);
  if (rc) return rc == 1 ? 0 : rc;
  if (a.schema) {
    df_recipe_print_schema(stdout);
    return 0;
  }
  // The op context bounds the kernels' own regions; this bounds OpenBLAS calls made outside them.
  if (a.threads > 0) omp_set_num_threads(a.threads);
  df_step_result r;
  df_error err = {0};
  rc = 0;
  if (df_step_run_ex(a.recipe, a.sets, a.n_sets, a.dump, a.threads, a.has_device ? &a.device : NULL, &r, &err) !=
      DF_OK) {
    df_error_print_verbose(&err, a.verbose);
    rc = DF_EXIT_FAILURE;
  } else {
    print_summary(&r, a.dump);
    df_step_result_free(&r);
  }
  free(a.sets);
  return rc;
}
