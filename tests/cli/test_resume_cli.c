// Resume and run directories through the command line (issue 16 "Data loss and overwrites"): the printed resume
// command pastes as is and continues in its own run, a resume never writes into another run, overrides given
// again must agree, a fresh run never writes into a directory holding checkpoints (unless --overwrite),
// --resume auto, time-based saving, stale temporaries, checkpoint manifests and damaged checkpoints.
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/cli_run.h"

static char out[1 << 16];

static void run_ok(df_cli_dir *d, const char *args) {
  cr_assert_eq(df_cli_run(d, args, out, sizeof out), 0, "%s: %s", args, out);
}

// Byte for byte.
static bool same_file(const df_cli_dir *d, const char *a, const char *b) {
  char cmd[1700];
  snprintf(cmd, sizeof cmd, "cmp -s '%s/%s' '%s/%s'", d->root, a, d->root, b);
  return system(cmd) == 0;
}

// A long run (100000 steps) that stops only by SIGTERM once `wait_for` exists.
#define LONG_RUN "--set training.total_steps=100000 --set training.max_steps=100000 --set training.num_epochs=100000 "

Test(resume_cli, printed_resume_command_pastes_and_continues_in_its_run) {
  df_cli_dir d;
  df_cli_dir_open(&d, "paste", NULL);
  int rc =
      df_cli_run_until(&d, "train recipe.yaml " LONG_RUN "--set output_dir=runs/other --set training.save_interval=3",
                       NULL, "log1", "runs/other/checkpoints/step-00000003");
  cr_assert_eq(rc, 0, "a stop by SIGTERM exits 0");
  char *log = df_cli_slurp(&d, "log1");
  cr_assert(log);
  const char *line = strstr(log, "resume with: ");
  cr_assert(line, "%s", log);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%.*s", (int)strcspn(line + 13, "\n"), line + 13);
  cr_expect_null(strstr(cmd, "(and"), "the command is only a command: %s", cmd);
  free(log);
  // paste it: it runs (no --set needed), resumes in runs/other and nowhere else
  rc = df_cli_run_until(&d, NULL, cmd, "log2", "runs/other/checkpoints/step-00000009");
  log = df_cli_slurp(&d, "log2");
  cr_assert(log);
  cr_expect_eq(rc, 0, "%s: %s", cmd, log);
  cr_expect(strstr(log, "resuming from runs/other/checkpoints/step-0000"), "%s", log);
  cr_expect(strstr(log, "-> runs/other\n"), "%s", log);
  free(log);
  cr_expect(df_cli_exists(&d, "runs/other/checkpoints/step-00000009"));
  cr_expect_not(df_cli_exists(&d, "output"), "the recipe's default output_dir is untouched");
  df_cli_dir_close(&d);
}

Test(resume_cli, a_resume_never_writes_into_another_run) {
  df_cli_dir d;
  df_cli_dir_open(&d, "other", NULL);
  // run "a" stops at 4; another run (the recipe's default output_dir, ./output) goes to 6
  run_ok(&d, "train recipe.yaml --set output_dir=a --set training.max_steps=4 --set training.save_interval=2");
  run_ok(&d, "train recipe.yaml --set training.max_steps=6 --set training.save_interval=2");
  run_ok(&d, "train recipe.yaml --set output_dir=straight --set training.max_steps=8");
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp -a %s/output %s/output.before", d.root, d.root);
  cr_assert_eq(system(cmd), 0);
  // resuming "a" with the recipe but without its --set output_dir: refused, naming the key; nothing written
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --resume a --set training.max_steps=8", out, sizeof out), 2, "%s",
               out);
  cr_expect(strstr(out, "output_dir"), "%s", out);
  // resuming "a" by itself: continues in a, to the same bits as a straight run
  run_ok(&d, "train --resume a --set training.max_steps=8");
  cr_expect(strstr(out, "-> a\n"), "%s", out);
  cr_expect(same_file(&d, "a/checkpoints/step-00000008/model.safetensors",
                      "straight/checkpoints/step-00000008/model.safetensors"));
  // the other run is exactly as it was
  snprintf(cmd, sizeof cmd, "diff -r %s/output %s/output.before > /dev/null", d.root, d.root);
  cr_expect_eq(system(cmd), 0, "the other run's directory changed");
  df_cli_dir_close(&d);
}

Test(resume_cli, overrides_given_again_must_agree) {
  df_cli_dir d;
  df_cli_dir_open(&d, "agree", NULL);
  run_ok(&d, "train recipe.yaml --set output_dir=a --set training.max_steps=2 --set data.max_length=48");
  cr_expect_eq(df_cli_run(&d, "train --resume a --set data.max_length=32", out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "data.max_length is 32") && strstr(out, "the run has 48"), "%s", out);
  cr_expect_eq(df_cli_run(&d, "train --resume a --set output_dir=b", out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "output_dir"), "%s", out);
  cr_expect_not(df_cli_exists(&d, "b"));
  // the run's own values given again agree; the stop may change
  run_ok(&d, "train --resume a --set data.max_length=48 --set training.max_steps=3 --set output_dir=a");
  cr_expect(strstr(out, "done: step 3 of 3"), "%s", out);
  df_cli_dir_close(&d);
}

Test(resume_cli, a_fresh_run_never_writes_into_a_directory_with_checkpoints) {
  df_cli_dir d;
  df_cli_dir_open(&d, "fresh", NULL);
  // an earlier run left an incomplete checkpoint (no state.h5): still another run's
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s/b/checkpoints/step-00000004 && echo '{}' > %s/b/checkpoints/step-00000004/config.json", d.root,
           d.root);
  cr_assert_eq(system(cmd), 0);
  cr_expect_eq(df_cli_run(&d, "train recipe.yaml --set output_dir=b --set training.max_steps=6", out, sizeof out), 1,
               "%s", out);
  cr_expect(strstr(out, "already holds 1 checkpoint") && strstr(out, "--overwrite"), "%s", out);
  cr_expect_not(df_cli_exists(&d, "b/checkpoints/step-00000006"));
  run_ok(&d, "train recipe.yaml --set output_dir=b --set training.max_steps=6 --overwrite");
  cr_expect_not(df_cli_exists(&d, "b/checkpoints/step-00000004"), "--overwrite removed the earlier run");
  cr_expect(df_cli_exists(&d, "b/checkpoints/step-00000006"));
  df_cli_dir_close(&d);
}

Test(resume_cli, resume_auto_starts_or_continues) {
  df_cli_dir d;
  df_cli_dir_open(&d, "auto", NULL);
  run_ok(&d, "train recipe.yaml --set output_dir=c --set training.max_steps=2 --resume auto");
  cr_expect(strstr(out, "no checkpoint yet; starting the run"), "%s", out);
  run_ok(&d, "train recipe.yaml --set output_dir=c --set training.max_steps=4 --resume auto");
  cr_expect(strstr(out, "resuming from c/checkpoints/step-00000002"), "%s", out);
  cr_expect(strstr(out, "done: step 4 of 4"), "%s", out);
  df_cli_dir_close(&d);
}

Test(resume_cli, time_based_saving) {
  df_cli_dir d;
  df_cli_dir_open(&d, "minutes", NULL);
  // every step takes far more than 60 µs: each one is due
  run_ok(&d,
         "train recipe.yaml --set output_dir=t --set training.max_steps=3 --set training.save_interval_minutes=1e-6");
  for (int s = 1; s <= 3; s++) {
    char rel[64];
    snprintf(rel, sizeof rel, "t/checkpoints/step-%08d", s);
    cr_expect(df_cli_exists(&d, rel), "%s: %s", rel, out);
  }
  // the schema calls it an extension, and it has a default
  cr_expect_eq(df_cli_run(&d, "schema", out, sizeof out), 0);
  const char *row = strstr(out, "training.save_interval_minutes");
  cr_assert(row, "%s", out);
  cr_expect(strstr(row, "draftforge extension") && strstr(row, " 15 "), "%.300s", row);
  df_cli_dir_close(&d);
}

Test(resume_cli, stale_temporaries_of_dead_processes_are_removed_at_start_up) {
  df_cli_dir d;
  df_cli_dir_open(&d, "stale", NULL);
  run_ok(&d, "train recipe.yaml --set output_dir=s --set training.max_steps=2");
  pid_t dead = fork(); // a process id that is gone
  if (dead == 0) _exit(0);
  cr_assert_gt(dead, 0);
  waitpid(dead, NULL, 0);
  char cmd[2000];
  snprintf(cmd, sizeof cmd,
           "cd %s/s/checkpoints && mkdir .tmp-step-00000003.%d && touch .tmp-step-00000003.%d/state.h5 && "
           "mkdir .tmp-step-00000004.%d && ln -s step-00000002 latest.tmp.%d && mkdir .tmp-keep",
           d.root, (int)dead, (int)dead, (int)getpid(), (int)dead);
  cr_assert_eq(system(cmd), 0);
  run_ok(&d, "train --resume s --set training.max_steps=3");
  char rel[128];
  snprintf(rel, sizeof rel, "s/checkpoints/.tmp-step-00000003.%d", (int)dead);
  cr_expect_not(df_cli_exists(&d, rel), "a dead writer's directory is removed: %s", out);
  snprintf(rel, sizeof rel, "s/checkpoints/latest.tmp.%d", (int)dead);
  cr_expect_not(df_cli_exists(&d, rel), "a dead writer's link is removed");
  snprintf(rel, sizeof rel, "s/checkpoints/.tmp-step-00000004.%d", (int)getpid());
  cr_expect(df_cli_exists(&d, rel), "a live process's temporary stays");
  cr_expect(df_cli_exists(&d, "s/checkpoints/.tmp-keep"), "names that are not temporaries stay");
  cr_expect(strstr(out, "which is gone"), "%s", out);
  df_cli_dir_close(&d);
}

// ---- integrity: manifests and damaged checkpoints --------------------------------------------------------------

// A run "m" with checkpoints at steps 2 and 4 (latest), made afresh.
static void two_checkpoints(df_cli_dir *d) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s/m", d->root);
  cr_assert_eq(system(cmd), 0);
  run_ok(d, "train recipe.yaml --set output_dir=m --set training.max_steps=4 --set training.save_interval=2");
}

#define RESUME_M "train recipe.yaml --set output_dir=m --set training.max_steps=6 --resume m"

Test(resume_cli, every_checkpoint_has_a_manifest) {
  df_cli_dir d;
  df_cli_dir_open(&d, "manifest", NULL);
  two_checkpoints(&d);
  char *text = df_cli_slurp(&d, "m/checkpoints/step-00000004/manifest.json");
  cr_assert(text);
  json_error_t je;
  json_t *m = json_loads(text, 0, &je);
  cr_assert(m, "%s", je.text);
  cr_expect_str_eq(json_string_value(json_object_get(m, "checksum")), "xxh3-64");
  json_t *files = json_object_get(m, "files");
  static const char *const names[] = {"config.json", "model.safetensors", "state.h5"};
  for (int i = 0; i < 3; i++) {
    json_t *e = json_object_get(files, names[i]);
    cr_assert(e, "%s not in the manifest: %s", names[i], text);
    char p[800];
    snprintf(p, sizeof p, "%s/m/checkpoints/step-00000004/%s", d.root, names[i]);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_expect_eq(json_integer_value(json_object_get(e, "size")), (json_int_t)sb.st_size, "%s", names[i]);
    cr_expect_eq(strlen(json_string_value(json_object_get(e, "xxh3_64"))), 16);
  }
  cr_expect_eq(json_object_size(files), 3);
  json_decref(m);
  free(text);
  cr_expect_eq(df_cli_run(&d, "inspect m", out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "manifest: every file has its recorded size and XXH3-64 checksum"), "%s", out);
  df_cli_dir_close(&d);
}

// Damaging one file of the latest checkpoint: resume names the file, says it is damaged and offers step 2;
// --resume auto takes step 2; export and inspect refuse it too.
static void expect_damage_caught(df_cli_dir *d, const char *file, long size) {
  two_checkpoints(d);
  char rel[200];
  snprintf(rel, sizeof rel, "m/checkpoints/step-00000004/%s", file);
  df_cli_truncate(d, rel, size);
  cr_expect_eq(df_cli_run(d, RESUME_M, out, sizeof out), 1, "%s: %s", file, out);
  cr_expect(strstr(out, "damaged") && strstr(out, file), "%s: %s", file, out);
  cr_expect(strstr(out, "HINT: the newest complete checkpoint is m/checkpoints/step-00000002"), "%s: %s", file, out);
  cr_expect_not(df_cli_exists(d, "m/checkpoints/step-00000006"), "%s: nothing resumed", file);
  cr_expect_eq(df_cli_run(d, "export m --out e", out, sizeof out), 1, "%s: %s", file, out);
  cr_expect(strstr(out, "damaged"), "%s: %s", file, out);
  cr_expect_eq(df_cli_run(d, "inspect m", out, sizeof out), 1, "inspect %s: %s", file, out);
  cr_expect(strstr(out, "damaged") && strstr(out, file), "inspect %s: %s", file, out);
  cr_expect(strstr(out, "HINT: the checkpoint changed after it was written"), "inspect %s: %s", file, out);
  cr_expect_eq(
      df_cli_run(d, "train recipe.yaml --set output_dir=m --set training.max_steps=6 --resume auto", out, sizeof out),
      0, "%s: %s", file, out);
  cr_expect(strstr(out, "is damaged") && strstr(out, "taking the newest complete checkpoint, step 2"), "%s: %s", file,
            out);
  cr_expect(strstr(out, "resuming from m/checkpoints/step-00000002"), "%s: %s", file, out);
  cr_expect(df_cli_exists(d, "m/checkpoints/step-00000006"));
}

Test(resume_cli, truncated_state_h5_is_caught_and_the_newest_complete_checkpoint_offered) {
  df_cli_dir d;
  df_cli_dir_open(&d, "trunc_state", NULL);
  expect_damage_caught(&d, "state.h5", 4096);
  df_cli_dir_close(&d);
}

Test(resume_cli, truncated_model_safetensors_is_caught) {
  df_cli_dir d;
  df_cli_dir_open(&d, "trunc_model", NULL);
  expect_damage_caught(&d, "model.safetensors", 1000);
  df_cli_dir_close(&d);
}

Test(resume_cli, truncated_config_json_is_caught) {
  df_cli_dir d;
  df_cli_dir_open(&d, "trunc_config", NULL);
  expect_damage_caught(&d, "config.json", 10);
  df_cli_dir_close(&d);
}

Test(resume_cli, changed_bytes_of_the_same_size_are_caught) {
  df_cli_dir d;
  df_cli_dir_open(&d, "flip", NULL);
  two_checkpoints(&d);
  char cmd[800];
  snprintf(cmd, sizeof cmd,
           "printf 'X' | dd of=%s/m/checkpoints/step-00000004/model.safetensors bs=1 seek=2000 "
           "conv=notrunc status=none",
           d.root);
  cr_assert_eq(system(cmd), 0);
  cr_expect_eq(df_cli_run(&d, RESUME_M, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "checksum") && strstr(out, "model.safetensors"), "%s", out);
  // inspect names it too (by the manifest: one changed byte of a weight)
  cr_expect_eq(df_cli_run(&d, "inspect m", out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "PROBLEM: checkpoint file m/checkpoints/latest/model.safetensors is damaged: checksum"), "%s",
            out);
  df_cli_dir_close(&d);
}

// ---- late failures ------------------------------------------------------------------------------------------

Test(resume_cli, a_missing_eval_path_fails_at_start_up) {
  df_cli_dir d;
  df_cli_dir_open(&d, "late", NULL);
  cr_expect_eq(df_cli_run(&d,
                          "train recipe.yaml --set output_dir=l --set data.eval_hidden_states_path=nope "
                          "--set training.eval_interval=2",
                          out, sizeof out),
               1, "%s", out);
  cr_expect(strstr(out, "data.eval_hidden_states_path") && strstr(out, "nope"), "%s", out);
  cr_expect_null(strstr(out, "step 1/"), "the run fails before its first step: %s", out);
  df_cli_dir_close(&d);
}
