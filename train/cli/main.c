// draftforge: the command-line entry point. Only main decides to exit; subcommands return a status.
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernels/ops.h"
#include "train/cli/commands.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

static const char *usage = "usage: draftforge <command> [args]\n"
                           "\n"
                           "commands:\n"
                           "  train RECIPE.yaml   train (or --resume) a draft from a recipe (see train --help)\n"
                           "  step RECIPE.yaml --dump DIR  one micro-step with a gradient dump (see step --help)\n"
                           "  export CKPT --out DIR  write the HF directory SGLang serves (see export --help)\n"
                           "  eval CKPT --recipe R   evaluate a checkpoint or export        (see eval --help)\n"
                           "  eval --spec-decode --target DIR --draft CKPT --data F  real speculative decoding, tau\n"
                           "  capture --target DIR --data F --draft-config J --out DIR  hidden states from the target\n"
                           "  inspect FILE...     print a safetensors file, a config, HDF5 shards, or a checkpoint\n"
                           "  plot RUN_DIR        PNG charts of a run's metrics.jsonl          (see plot --help)\n"
                           "  schema [--markdown] every recipe key: type, default, status (docs/recipe-reference.md)\n"
                           "  --version           print the version and the backends built in\n"
                           "\n"
                           "Every command answers --help with its options and their defaults. Exit codes: 0 success,\n"
                           "1 failure, 2 bad usage or bad arguments.\n";

static int print_version(void) {
  printf("draftforge %s\n", DF_VERSION);
#ifdef DF_HAVE_CUDA
  printf("backends: cpu (OpenBLAS + OpenMP), cuda (%s)\n",
         df_cuda_available() ? "device present" : "no device visible");
#else
  printf("backends: cpu (OpenBLAS + OpenMP); cuda not built\n");
#endif
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "%sdraftforge: no command given\n  HINT: draftforge <command> --help describes a command\n", usage);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) return fputs(usage, stdout), 0;
  if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) return print_version();
  if (!strcmp(argv[1], "inspect")) return df_cmd_inspect(argc - 2, argv + 2);
  if (!strcmp(argv[1], "train")) return df_cmd_train(argc - 2, argv + 2);
  if (!strcmp(argv[1], "step")) return df_cmd_step(argc - 2, argv + 2);
  if (!strcmp(argv[1], "export")) return df_cmd_export(argc - 2, argv + 2);
  if (!strcmp(argv[1], "eval")) return df_cmd_eval(argc - 2, argv + 2);
  if (!strcmp(argv[1], "plot")) return df_cmd_plot(argc - 2, argv + 2);
  if (!strcmp(argv[1], "schema")) return df_cmd_schema(argc - 2, argv + 2);
  if (!strcmp(argv[1], "capture")) return df_cmd_capture(argc - 2, argv + 2);
  fprintf(stderr, "draftforge: unknown command '%s'\n%s  HINT: draftforge --help lists the commands\n", argv[1], usage);
  return 2;
}
