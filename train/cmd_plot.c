// `draftforge plot RUN_DIR [--out DIR]`: PNG charts of a run's metrics.jsonl, drawn by tools/plot_run.py
// (matplotlib) in a child process. Exit codes: 0 written, 1 failed, 2 bad arguments.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "train/commands.h"
#include "train/pytools.h"

static const char *plot_usage =
    "usage: draftforge plot RUN_DIR [--out DIR]\n"
    "\n"
    "Draws PNG charts of a run from RUN_DIR/metrics.jsonl (tools/plot_run.py, matplotlib):\n"
    "loss.png, accuracy.png, tau.png (simulated, and real where logged), lr_grad_norm.png,\n"
    "per_position_acc.png (last eval) and, for MoE drafts, moe_expert_load.png.\n"
    "  --out DIR   where to write them (default: RUN_DIR/plots)\n"
    "The interpreter is $DRAFTFORGE_PYTHON, else the first of python3 and /usr/bin/python3 with matplotlib.\n";

int df_cmd_plot(int argc, char **argv) {
  const char *run = NULL, *out = NULL;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return fputs(plot_usage, stdout), 0;
    if (!strcmp(argv[i], "--out") && i + 1 < argc)
      out = argv[++i];
    else if (argv[i][0] != '-' && !run)
      run = argv[i];
    else
      return fprintf(stderr, "draftforge plot: unexpected argument '%s'\n%s", argv[i], plot_usage), 2;
  }
  if (!run) return fprintf(stderr, "draftforge plot: RUN_DIR is required\n%s", plot_usage), 2;
  df_error err = {0};
  struct stat st;
  if (stat(run, &st) != 0 || !S_ISDIR(st.st_mode)) {
    DF_FAIL(&err, DF_ERR_IO, run, "pass a run directory (the recipe's output_dir)", "cannot open run directory '%s'",
            run);
    df_error_print(&err);
    return 1;
  }
  char python[4096], script[4096];
  if (df_pytools_python("matplotlib", "matplotlib", "draftforge plot", "plot", python, sizeof python, &err) != DF_OK ||
      df_pytools_script("plot_run.py", script, sizeof script, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  char *args[] = {python, script, (char *)run, out ? "--out" : NULL, (char *)out, NULL};
  pid_t pid;
  if (df_pytools_spawn(args, -1, NULL, NULL, &pid, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  int rc = 1;
  df_pytools_wait(pid, -1, &rc);
  return rc == 0 ? 0 : 1;
}
