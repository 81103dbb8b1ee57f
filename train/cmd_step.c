// `draftforge step RECIPE.yaml --dump DIR [--threads N]`: argument parsing and the summary line around
// df_step_run. Returns the exit code: 0 done, 1 the step failed, 2 bad arguments.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/device.h"
#include "train/recipe.h"
#include "train/step.h"

static const char *step_usage = "usage: draftforge step RECIPE.yaml --dump DIR [--threads N] [--device D]\n"
                                "       draftforge step --schema\n"
                                "\n"
                                "Runs one DFlash or DSpark micro-step (docs/dflash-step.md; the draft config decides\n"
                                "which, and training.strategy must agree) on the first batch of the recipe's data and\n"
                                "writes DIR/grads.safetensors (the F32 gradient of loss_num/loss_den for every\n"
                                "trainable parameter, DSpark heads included) and DIR/step.json (loss terms and\n"
                                "metrics; DSpark adds ce/l1/confidence terms and tau_probabilistic). No optimizer\n"
                                "step. --threads: CPU threads (default: OpenMP's). --device auto|cpu|cuda:\n"
                                "where it runs (default: training.device). --schema: every recipe key.\n";

typedef struct {
  const char *recipe, *dump;
  int threads;
  bool schema, has_device;
  df_device_choice device;
} step_args;

static bool parse_threads(const char *s, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < 0 || v > 4096) return false;
  *out = (int)v;
  return true;
}

// argv holds the arguments after "step". Returns 0 on success, 1 for --help (printed), 2 on a usage error (printed).
static int parse_step_args(int argc, char **argv, step_args *a) {
  memset(a, 0, sizeof *a);
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(step_usage, stdout), 1;
    if (!strcmp(s, "--schema"))
      a->schema = true;
    else if (!strcmp(s, "--dump") && i + 1 < argc)
      a->dump = argv[++i];
    else if (!strcmp(s, "--device") && i + 1 < argc) {
      df_error e = {0};
      if (df_device_choice_parse(argv[++i], &a->device, &e) != DF_OK)
        return fprintf(stderr, "draftforge step: %s\n  HINT: %s\n", e.msg, e.hint), 2;
      a->has_device = true;
    } else if (!strcmp(s, "--threads") && i + 1 < argc) {
      if (!parse_threads(argv[++i], &a->threads))
        return fprintf(stderr, "draftforge step: --threads wants a count, got '%s'\n", argv[i]), 2;
    } else if (s[0] != '-' && !a->recipe)
      a->recipe = s;
    else
      return fprintf(stderr, "draftforge step: unexpected argument '%s'\n%s", s, step_usage), 2;
  }
  if (a->schema) return 0;
  if (!a->recipe || !a->dump)
    return fprintf(stderr, "draftforge step: RECIPE.yaml and --dump DIR are required\n%s", step_usage), 2;
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
  if (rc) return rc == 1 ? 0 : rc;
  if (a.schema) {
    df_recipe_print_schema(stdout);
    return 0;
  }
  // The op context bounds the kernels' own regions; this bounds OpenBLAS calls made outside them.
  if (a.threads > 0) omp_set_num_threads(a.threads);
  df_step_result r;
  df_error err = {0};
  if (df_step_run(a.recipe, a.dump, a.threads, a.has_device ? &a.device : NULL, &r, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  print_summary(&r, a.dump);
  df_step_result_free(&r);
  return 0;
}
