// Every error ends with a HINT line (issue 13), scanned over every subcommand of train/cli/main.c: each option each
// --help lists, given without its value, with a value of the wrong kind, or (a flag) with a value, is a usage
// error (exit 2); and a table of failures per subcommand (bad files, missing data, a draft for another target,
// an unwritable output) exits 1. In every case the error comes before the last line, the last line is a HINT
// with advice in it, and (Release) no source location shows.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/cli_run.h"

#define FX         DF_FIXTURE_DIR "/dflash_step"
#define TINY       DF_SOURCE_DIR "/recipes/tiny-target"
#define TINY_DRAFT DF_SOURCE_DIR "/configs/tiny-target-dflash.json"

static char out[1 << 16];

// Every subcommand main.c dispatches, as its --help names it.
static const char *const COMMANDS[] = {"train",   "step",    "export", "eval",  "eval --spec-decode",
                                       "capture", "inspect", "plot",   "schema"};

// Runs args and checks the error's shape: the exit code, an error line, then a HINT with text on the last line.
static void expect_error_with_hint(const df_cli_dir *d, const char *args, int rc) {
  int got = df_cli_run(d, args, out, sizeof out);
  cr_expect_eq(got, rc, "%s: exit %d, expected %d: %s", args, got, rc, out);
  char last[2048];
  df_cli_last_line(out, last, sizeof last);
  cr_expect(!strncmp(last, "  HINT: ", 8) && strlen(last) > 16, "%s: the last line is not a HINT: %s", args, out);
  cr_expect(strstr(out, "error") || strstr(out, "draftforge"), "%s: no error line before the HINT: %s", args, out);
  cr_expect_null(strstr(out, "Traceback"), "%s: %s", args, out);
#ifdef NDEBUG
  cr_expect_null(strstr(out, "raised at"), "%s: %s", args, out);
#endif
}

typedef struct {
  char name[64], metavar[64];
} help_opt;

// The options a --help text lists ("  --name METAVAR   help..."), without --help and --verbose.
static int help_options(const char *text, help_opt *o, int cap) {
  int n = 0;
  for (const char *p = strstr(text, "\n  --"); p && n < cap; p = strstr(p + 1, "\n  --")) {
    const char *s = p + 3;
    size_t len = strcspn(s, " \n");
    snprintf(o[n].name, sizeof o[n].name, "%.*s", (int)len, s);
    o[n].metavar[0] = 0;
    if (s[len] == ' ' && s[len + 1] != ' ') { // one space: a metavar follows
      const char *m = s + len + 1;
      snprintf(o[n].metavar, sizeof o[n].metavar, "%.*s", (int)strcspn(m, " \n"), m);
    }
    if (strcmp(o[n].name, "--help") && strcmp(o[n].name, "--verbose")) n++;
  }
  return n;
}

Test(cli_errors, every_option_misused_is_a_usage_error_with_a_hint) {
  df_cli_dir d;
  df_cli_dir_open(&d, "misuse", NULL);
  int checked = 0;
  for (size_t c = 0; c < sizeof COMMANDS / sizeof *COMMANDS; c++) {
    char args[512];
    snprintf(args, sizeof args, "%s --help", COMMANDS[c]);
    cr_assert_eq(df_cli_run(&d, args, out, sizeof out), 0, "%s: %s", args, out);
    help_opt opts[32];
    int n = help_options(out, opts, 32);
    cr_expect_geq(n, 1, "%s --help lists no option: %s", COMMANDS[c], out);
    for (int i = 0; i < n; i++) {
      if (!strcmp(opts[i].name, "--spec-decode")) continue; // it names the command
      if (!opts[i].metavar[0]) {                            // a flag given a value
        snprintf(args, sizeof args, "%s %s=1", COMMANDS[c], opts[i].name);
        expect_error_with_hint(&d, args, 2), checked++;
        continue;
      }
      snprintf(args, sizeof args, "%s %s", COMMANDS[c], opts[i].name); // the value missing
      expect_error_with_hint(&d, args, 2), checked++;
      cr_expect(strstr(out, opts[i].name), "%s: the error names the option: %s", args, out);
      // a number or a choice given something else
      bool number = !strcmp(opts[i].metavar, "N"),
           choice = strchr(opts[i].metavar, '|') && strcmp(opts[i].name, "--resume");
      if (!number && !choice) continue;
      snprintf(args, sizeof args, "%s %s=not-a-value", COMMANDS[c], opts[i].name);
      expect_error_with_hint(&d, args, 2), checked++;
    }
    snprintf(args, sizeof args, "%s --no-such-option", COMMANDS[c]);
    expect_error_with_hint(&d, args, 2), checked++;
    cr_expect(strstr(out, "--no-such-option"), "%s: %s", args, out);
  }
  cr_expect_geq(checked, 50, "the scan covered only %d misuses", checked);
  expect_error_with_hint(&d, "frobnicate", 2);
  expect_error_with_hint(&d, "", 2);
  expect_error_with_hint(&d, "schema extra", 2);
  expect_error_with_hint(&d, "plot a b", 2);
  expect_error_with_hint(&d, "train recipe.yaml --set nonsense", 2);
  expect_error_with_hint(&d, "train recipe.yaml --set training.max_steps=-3", 2);
  // the memory plan's sizes and the options that only size a plan
  static const char *const plan_misuse[] = {
      "train recipe.yaml --plan --device-memory 12XB",
      "train recipe.yaml --plan --device-memory -5GB",
      "train recipe.yaml --plan --device-memory 0",
      "train recipe.yaml --plan --device-memory nan",
      "train recipe.yaml --plan --device-memory GB",
      "train recipe.yaml --plan --world-size 0",
      "train recipe.yaml --device-memory 80GB",
      "train recipe.yaml --world-size 2",
      "train --plan --resume recipe.yaml",
  };
  for (size_t i = 0; i < sizeof plan_misuse / sizeof *plan_misuse; i++) expect_error_with_hint(&d, plan_misuse[i], 2);
  expect_error_with_hint(&d, "train recipe.yaml --plan --device-memory 12XB", 2);
  cr_expect(strstr(out, "--device-memory") && strstr(out, "12XB"), "the error names the option and value: %s", out);
  df_cli_dir_close(&d);
}

// The scratch files the failures below use.
static void write_bad_inputs(const df_cli_dir *d) {
  char cmd[3000];
  snprintf(cmd, sizeof cmd,
           "cd %s && mkdir -p empty && printf 'model: [\\n' > bad.yaml && printf '{\\n' > bad.json && "
           "echo 'not json' > bad.jsonl && echo '{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}' > ok.jsonl && "
           "head -c 100 %s/draft_ckpt/model.safetensors > trunc.safetensors && echo hello > notes.txt",
           d->root, FX);
  cr_assert_eq(system(cmd), 0);
}

Test(cli_errors, every_failure_ends_with_a_hint) {
  df_cli_dir d;
  df_cli_dir_open(&d, "fail", NULL);
  write_bad_inputs(&d);
  static const char *const fails[] = {
      // train
      "train bad.yaml",
      "train recipe.yaml --set data.hidden_states_path=missing",
      "train recipe.yaml --set training.eval_interval=2",
      "train recipe.yaml --set model.draft_model_config=bad.json",
      "train --resume empty",
      "train recipe.yaml --plan --set model.draft_model_config=bad.json",
      "train recipe.yaml --plan --set model.target_model_path=empty",
      // step
      "step bad.yaml --dump x",
      "step recipe.yaml --dump notes.txt/sub",
      // export
      "export empty --out e",
      "export " FX "/draft_ckpt --out e --block-size 3",
      "export " FX "/draft_ckpt --out notes.txt/e",
      // eval
      "eval empty --recipe recipe.yaml",
      "eval " FX "/draft_ckpt --recipe bad.yaml",
      "eval " FX "/draft_ckpt --recipe recipe.yaml --data empty",
      // eval --spec-decode
      "eval --spec-decode --target empty --draft " FX "/draft_ckpt --data ok.jsonl",
      "eval --spec-decode --target " TINY " --draft " FX "/draft_ckpt --data ok.jsonl",
      "eval --spec-decode --target " TINY " --draft empty --data ok.jsonl",
      // capture
      "capture --target empty --data ok.jsonl --draft-config " TINY_DRAFT " --out c1",
      "capture --target " TINY " --data ok.jsonl --draft-config bad.json --out c2",
      "capture --target " TINY " --data ok.jsonl --draft-config " FX "/tiny-dflash.json --out c3",
      "capture --target " TINY " --data bad.jsonl --draft-config " TINY_DRAFT " --out c4",
      // inspect
      "inspect trunc.safetensors",
      "inspect bad.json",
      "inspect notes.txt",
      "inspect recipe.yaml",
      // plot
      "plot empty",
      "plot recipe.yaml",
  };
  for (size_t i = 0; i < sizeof fails / sizeof *fails; i++) expect_error_with_hint(&d, fails[i], 1);
  // plot of a real run into a directory that cannot be made (tools/run/plot_run.py's own error)
  cr_assert_eq(df_cli_run(&d, "train recipe.yaml --set output_dir=r --set training.max_steps=2", out, sizeof out), 0,
               "%s", out);
  expect_error_with_hint(&d, "plot r --out notes.txt/plots", 1);
  cr_expect(strstr(out, "notes.txt/plots"), "%s", out);
  df_cli_dir_close(&d);
}
