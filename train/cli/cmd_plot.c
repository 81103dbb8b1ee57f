// `draftforge plot RUN_DIR [--out DIR]`: PNG charts of a run's metrics.jsonl, drawn by tools/run/plot_run.py
// (matplotlib) in a child process. Exit codes: 0 written, 1 failed, 2 bad arguments (train/cli/cli.h).
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/pytools.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"

static const df_cli_opt PLOT_OPTS[] = {{"--out", "DIR", DF_CLI_VALUE, "RUN_DIR/plots", "where the PNG files go"},
                                       DF_CLI_END};

static const df_cli_spec PLOT_CLI = {
    "plot",
    "RUN_DIR",
    1,
    1,
    "Draws PNG charts of a run from RUN_DIR/metrics.jsonl (tools/run/plot_run.py, matplotlib): loss.png,\n"
    "accuracy.png, tau.png (simulated, and real where logged), lr_grad_norm.png, per_position_acc.png (last eval)\n"
    "and, for MoE drafts, moe_expert_load.png. The interpreter is $DRAFTFORGE_PYTHON, else the first of python3\n"
    "and /usr/bin/python3 with matplotlib.",
    PLOT_OPTS};

int df_cmd_plot(int argc, char **argv) {
  df_cli_args a;
  int prc = df_cli_parse(&PLOT_CLI, argc, argv, &a);
  const char *run = a.npos ? a.pos[0] : NULL, *out = df_cli_get(&a, "--out");
  bool verbose = a.verbose;
  df_cli_free(&a); // run and out point into argv
  if (prc) return prc == 1 ? DF_EXIT_OK : prc;
  if (access(run, F_OK) != 0) return df_cli_usage_error(&PLOT_CLI, "%s does not exist", run);
  df_error err = {0};
  struct stat st;
  if (stat(run, &st) != 0 || !S_ISDIR(st.st_mode)) {
    DF_FAIL(&err, DF_ERR_IO, run, "pass a run directory (the recipe's output_dir)", "cannot open run directory '%s'",
            run);
    df_error_print_verbose(&err, verbose);
    return DF_EXIT_FAILURE;
  }
  char python[4096], script[4096];
  if (df_pytools_python("matplotlib", "matplotlib", "draftforge plot", "plot", python, sizeof python, &err) != DF_OK ||
      df_pytools_script("plot_run.py", script, sizeof script, &err) != DF_OK) {
    df_error_print_verbose(&err, verbose);
    return DF_EXIT_FAILURE;
  }
  char *args[] = {python, script, (char *)run, out ? "--out" : NULL, (char *)out, NULL};
  pid_t pid;
  if (df_pytools_spawn(args, -1, NULL, NULL, &pid, &err) != DF_OK) {
    df_error_print_verbose(&err, verbose);
    return DF_EXIT_FAILURE;
  }
  int rc = 1;
  df_pytools_wait(pid, -1, &rc);
  return rc == 0 ? DF_EXIT_OK : DF_EXIT_FAILURE;
}
