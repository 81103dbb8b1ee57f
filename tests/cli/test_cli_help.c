// The command line as a new user meets it (issue 16 "Command line", issue 13 "--help ... every error ends with a
// HINT"): every subcommand answers --help with its options and their defaults, exit codes 0 / 1 / 2, the
// unknown-key error before anything else, a HINT on the last line of every error, source locations only with
// --verbose (or in a Debug build), normalised paths, and the real last checkpoint of a finished run.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/cli_run.h"

static char out[1 << 16];

// Every "  --option" block of a --help text carries "(default: ...)".
static void expect_defaults_listed(const char *cmd, const char *text) {
  int options = 0;
  for (const char *p = strstr(text, "\n  --"); p; p = strstr(p + 1, "\n  --")) {
    const char *next = strstr(p + 1, "\n  --"), *end = next ? next : p + strlen(p);
    const char *def = strstr(p, "(default:");
    cr_expect(def && def < end, "%s --help: an option without its default: %.60s", cmd, p + 1);
    options++;
  }
  cr_expect_geq(options, 3, "%s --help lists its options: %s", cmd, text);
}

Test(cli_help, every_subcommand_answers_help_with_defaults) {
  df_cli_dir d;
  df_cli_dir_open(&d, "help", NULL);
  static const char *const cmds[] = {"train",   "step", "export", "eval",   "eval --spec-decode",
                                     "inspect", "plot", "schema", "capture"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char args[64];
    snprintf(args, sizeof args, "%s --help", cmds[i]);
    cr_expect_eq(df_cli_run(&d, args, out, sizeof out), 0, "%s: %s", args, out);
    char usage[64];
    snprintf(usage, sizeof usage, "usage: draftforge %s", cmds[i]);
    cr_expect(strstr(out, usage), "%s: %s", args, out);
    cr_expect(!strstr(out, "error (") && !strstr(out, "cannot open"),
              "%s must not fail (inspect once opened a file named --help): %s", args, out);
    expect_defaults_listed(cmds[i], out);
  }
  cr_expect_eq(df_cli_run(&d, "inspect -h", out, sizeof out), 0, "%s", out);
  // every command `draftforge --help` lists is one of those checked above
  cr_assert_eq(df_cli_run(&d, "--help", out, sizeof out), 0, "%s", out);
  const char *list = strstr(out, "commands:\n");
  cr_assert(list, "%s", out);
  int listed = 0;
  for (const char *p = strstr(list, "\n  "); p && p[3] != ' '; p = strstr(p + 1, "\n  ")) {
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(p + 3, " \n"), p + 3);
    if (!strcmp(name, "--version")) continue;
    bool covered = false;
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) covered |= !strcmp(cmds[i], name);
    cr_expect(covered, "draftforge --help lists '%s', whose --help is not checked", name);
    listed++;
  }
  cr_expect_geq(listed, 8, "%s", out);
  df_cli_dir_close(&d);
}

Test(cli_help, exit_codes_are_0_1_2) {
  df_cli_dir d;
  df_cli_dir_open(&d, "exit", NULL);
  // 2: bad usage or bad arguments
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set training.bogus=1", out, sizeof out), 2, "bad --set: %s", out);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set training.seed=abc", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --frobnicate", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "train no-such-recipe.yaml", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --threads x", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "export no/such/run --out e", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "eval no/such/run", out, sizeof out), 2, "%s", out);
  cr_expect_eq(df_cli_run(&d, "inspect", out, sizeof out), 2, "%s", out);
  // 1: the run itself fails (eval needs an eval set: the recipe's fault, found when it loads)
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set training.eval_interval=2", out, sizeof out), 1, "%s", out);
  // 0
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set training.max_steps=1 --set output_dir=ok", out, sizeof out), 0,
               "%s", out);
  df_cli_dir_close(&d);
}

Test(cli_help, unknown_key_error_comes_first_with_did_you_mean) {
  df_cli_dir d;
  df_cli_dir_open(&d, "unknown", NULL);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set training.max_step=3", out, sizeof out), 2, "%s", out);
  char first[1024];
  snprintf(first, sizeof first, "%.*s", (int)strcspn(out, "\n"), out);
  cr_expect(strstr(first, "error") && strstr(first, "unknown key 'max_step'") &&
                strstr(first, "did you mean 'max_steps'"),
            "the first line is the error with its suggestion: %s", out);
  int lines = 0;
  for (const char *c = out; *c; c++) lines += *c == '\n';
  cr_expect_leq(lines, 4, "no page of valid keys: %s", out);
  // the key list is one command away
  cr_expect(strstr(out, "draftforge schema"), "%s", out);
  cr_expect_eq(df_cli_run(&d, "schema", out, sizeof out), 0);
  cr_expect(strstr(out, "training.max_steps"), "%s", out);
  df_cli_dir_close(&d);
}

// A failing command's last line is its HINT; the source location shows only with --verbose (or in builds without
// NDEBUG, where the test binary is built the same way).
static void expect_hint_last(df_cli_dir *d, const char *args, int rc) {
  cr_expect_eq(df_cli_run(d, args, out, sizeof out), rc, "%s: %s", args, out);
  char last[2048];
  df_cli_last_line(out, last, sizeof last);
  cr_expect(!strncmp(last, "  HINT: ", 8) && strlen(last) > 12, "%s: the last line is not a HINT: %s", args, out);
#ifdef NDEBUG
  cr_expect_null(strstr(out, "raised at"), "%s: %s", args, out);
#endif
}

Test(cli_help, every_error_ends_with_a_hint) {
  df_cli_dir d;
  df_cli_dir_open(&d, "hint", NULL);
  expect_hint_last(&d, "train recipe.yaml --set training.eval_interval=2", 1);
  expect_hint_last(&d, "train recipe.yaml --set runtime.in_flight_low_watermark=300", 1); // its error had no hint
  expect_hint_last(&d, "train recipe.yaml --set training.bogus=1", 2);
  expect_hint_last(&d, "train recipe.yaml --bogus", 2);
  expect_hint_last(&d, "inspect recipe.yaml", 1);
  expect_hint_last(&d, "inspect no/such.h5", 2);
  expect_hint_last(&d, "export recipe.yaml --out e", 1);
  expect_hint_last(&d, "eval . --recipe recipe.yaml", 1);
  expect_hint_last(&d, "frobnicate", 2);
  // --verbose adds the location, relative to the source tree
  cr_expect_eq(df_cli_run(&d, "inspect recipe.yaml --verbose", out, sizeof out), 1);
  cr_expect(strstr(out, "(raised at train/"), "%s", out);
  df_cli_dir_close(&d);
}

// A recipe's relative paths are taken from the current directory (as SpecForge takes them), not from the recipe's
// directory: sub/r.yaml's "sub/../runs/x" is ./runs/x, shown as the user would type it from here.
Test(cli_help, messages_show_normalised_paths) {
  df_cli_dir d;
  df_cli_dir_open(&d, "norm", NULL);
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s/sub && sed 's|^run_id: t|run_id: t\\noutput_dir: sub/../runs/x|' %s > %s/sub/r.yaml", d.root,
           d.recipe, d.root);
  cr_assert_eq(system(cmd), 0);
  cr_expect_eq(df_cli_run(&d, "train sub/r.yaml --set training.max_steps=1", out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "-> runs/x\n"), "%s", out);
  cr_expect(strstr(out, "checkpoint runs/x/checkpoints/step-00000001"), "%s", out);
  cr_expect_null(strstr(out, "/../"), "%s", out);
  cr_expect_null(strstr(out, "sub/.."), "%s", out);
  cr_expect_null(strstr(out, d.root), "paths under the current directory are shown relative: %s", out);
  cr_expect(df_cli_exists(&d, "runs/x/checkpoints/step-00000001"), "%s", out);
  df_cli_dir_close(&d);
}

Test(cli_help, a_finished_run_names_its_last_checkpoint) {
  df_cli_dir d;
  df_cli_dir_open(&d, "finished", NULL);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set output_dir=run --set training.max_steps=2", out, sizeof out), 0,
               "%s", out);
  cr_expect_eq(
      df_cli_run(&d, "train recipe.yaml --set output_dir=run --set training.max_steps=2 --resume run", out, sizeof out),
      0, "%s", out);
  cr_expect(strstr(out, "nothing to do"), "%s", out);
  cr_expect(strstr(out, "last checkpoint run/checkpoints/step-00000002"), "%s", out);
  cr_expect_null(strstr(out, "(none)"), "%s", out);
  df_cli_dir_close(&d);
}
