// Export and the JSON draftforge writes (issue 16): export says which checkpoint of a run it takes and takes the
// best one with --best; every real number in config.json, metrics.jsonl, eval.json and best.json is written in
// the shortest text that reads back to the same double (rms_norm_eps is 1e-06, as Python writes it).
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/cli_run.h"

#define FX DF_FIXTURE_DIR "/dflash_step"

static char out[1 << 16];

static void run_ok(df_cli_dir *d, const char *args) {
  cr_assert_eq(df_cli_run(d, args, out, sizeof out), 0, "%s: %s", args, out);
}

Test(export_cli, export_says_which_checkpoint_and_takes_the_best_with_best) {
  df_cli_dir d;
  df_cli_dir_open(&d, "best", NULL);
  run_ok(&d, "train recipe.yaml --set output_dir=r --set training.max_steps=6 --set training.save_interval=2");
  // the best eval was at step 2 (as an eval run would record it)
  char cmd[2000];
  snprintf(cmd, sizeof cmd,
           "cd %s/r/checkpoints && ln -s step-00000002 best && "
           "printf '{\"step\": 2, \"metric\": \"eval/tau\", \"value\": 2.5}\\n' > best.json",
           d.root);
  cr_assert_eq(system(cmd), 0);
  run_ok(&d, "export r --out e_latest --dtype float32");
  cr_expect(strstr(out, "r/checkpoints/step-00000006 (latest checkpoint, step 6; the run's best is step 2 "
                        "(eval/tau 2.5000): --best takes it)"),
            "%s", out);
  run_ok(&d, "export r --best --out e_best --dtype float32");
  cr_expect(strstr(out, "r/checkpoints/step-00000002 (best checkpoint, step 2"), "%s", out);
  // the tensors are step 2's: a float32 export of a float32 checkpoint holds the same bytes per tensor
  char a[800], b[800];
  snprintf(a, sizeof a, "%s/e_best/model.safetensors", d.root);
  snprintf(b, sizeof b, "%s/r/checkpoints/step-00000002/model.safetensors", d.root);
  snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
  cr_expect_eq(system(cmd), 0, "the --best export is not step 2's weights");
  snprintf(b, sizeof b, "%s/r/checkpoints/step-00000006/model.safetensors", d.root);
  snprintf(cmd, sizeof cmd, "cmp -s %s/e_latest/model.safetensors %s", d.root, b);
  cr_expect_eq(system(cmd), 0, "the default export is not the latest weights");
  // a run without a best checkpoint says so
  run_ok(&d, "train recipe.yaml --set output_dir=nobest --set training.max_steps=1");
  cr_expect_eq(df_cli_run(&d, "export nobest --best --out x", out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "no best checkpoint"), "%s", out);
  df_cli_dir_close(&d);
}

// Every real-number token of a JSON text (outside strings): it reads back, and no decimal with one significant
// digit fewer does.
static int expect_shortest_reals(const char *what, const char *text) {
  int reals = 0;
  bool in_str = false;
  for (const char *c = text; *c; c++) {
    if (*c == '"' && (c == text || c[-1] != '\\')) in_str = !in_str;
    if (in_str || !(isdigit((unsigned char)*c) || *c == '-') ||
        (c > text && (isalnum((unsigned char)c[-1]) || c[-1] == '.')))
      continue;
    size_t n = strspn(c, "0123456789+-.eE");
    char tok[64];
    snprintf(tok, sizeof tok, "%.*s", (int)(n < 63 ? n : 63), c);
    c += n - 1;
    if (!strpbrk(tok, ".eE")) continue; // an integer
    reals++;
    double x = strtod(tok, NULL);
    int digits = 0;
    bool lead = true;
    for (const char *t = tok; *t && *t != 'e' && *t != 'E'; t++)
      if (isdigit((unsigned char)*t) && !(lead && *t == '0')) digits++, lead = false;
    // positional ("123456.0", "1000000.0"): trailing zeros, before the point or after it, only place the point
    for (const char *t = tok + strlen(tok) - 1;
         t > tok && strchr(tok, '.') && !strpbrk(tok, "eE") && (*t == '0' || *t == '.') && digits > 1; t--)
      if (*t == '0') digits--;
    if (digits <= 1 || x == 0) continue;
    char shorter[64];
    snprintf(shorter, sizeof shorter, "%.*e", digits - 2, x);
    cr_expect(strtod(shorter, NULL) != x, "%s: %s is not the shortest form (%s reads back too)", what, tok, shorter);
  }
  return reals;
}

Test(export_cli, json_reals_are_the_shortest_text_that_reads_back) {
  df_cli_dir d;
  df_cli_dir_open(&d, "floats", NULL);
  char args[600];
  snprintf(args, sizeof args, "export %s/draft_ckpt --out e --dtype float32", FX);
  run_ok(&d, args);
  char *cfg = df_cli_slurp(&d, "e/config.json");
  cr_assert(cfg);
  cr_expect(strstr(cfg, "\"rms_norm_eps\": 1e-06,"), "%s", cfg);
  cr_expect_null(strstr(cfg, "9.9999999999999995"), "%s", cfg);
  // the resolved RoPE keys (export's serving config) are reals: Python's repr of 1e6, at the top and nested
  cr_expect(strstr(cfg, "\"rope_theta\": 1000000.0,"), "%s", cfg);
  cr_expect(strstr(cfg, "\"rope_theta\": 1000000.0\n"), "%s", cfg);
  expect_shortest_reals("config.json", cfg);
  free(cfg);
  char ev[400];
  snprintf(ev, sizeof ev, "data.eval_hidden_states_path=%s/data", FX);
  snprintf(args, sizeof args,
           "train recipe.yaml --set output_dir=r --set training.max_steps=4 --set training.eval_interval=2 --set %s",
           ev);
  run_ok(&d, args);
  static const char *const files[] = {"r/metrics.jsonl", "r/checkpoints/best.json",
                                      "r/checkpoints/step-00000004/config.json"};
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char *t = df_cli_slurp(&d, files[i]);
    cr_assert(t, "%s", files[i]);
    int n = expect_shortest_reals(files[i], t);
    cr_expect(i == 2 || n > 0, "%s holds reals", files[i]);
    free(t);
  }
  snprintf(args, sizeof args, "eval r --recipe recipe.yaml --data %s/data --out eval.json", FX);
  run_ok(&d, args);
  char *t = df_cli_slurp(&d, "eval.json");
  cr_expect_gt(expect_shortest_reals("eval.json", t), 3);
  free(t);
  df_cli_dir_close(&d);
}
