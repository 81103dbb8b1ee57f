// The trainer when things go wrong after training started (issue 16): an error after the first step writes a
// checkpoint of the last complete step first (and a resume from it is bit-exact), and the temporaries a dead
// checkpoint writer left are removed at rotation too. Written against df_train and its test hooks only.
#include <criterion/criterion.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/cli_run.h"
#include "tests/common/fixture.h"
#include "train/trainer/trainer.h"

#define FX DF_FIXTURE_DIR "/dflash_step"

static df_status train(const df_cli_dir *d, const char *const *sets, const char *resume, const df_train_hooks *hooks,
                       df_train_summary *s, df_error *err) {
  const char *all[16];
  int n = 0;
  for (int i = 0; sets && sets[i]; i++) all[n++] = sets[i];
  df_train_options o = {.recipe_path = d->recipe,
                        .overrides = all,
                        .n_overrides = n,
                        .resume = resume,
                        .threads = 1,
                        .handle_signals = true,
                        .hooks = hooks};
  omp_set_num_threads(1);
  return df_train(&o, s, err);
}

typedef struct {
  char from[400], to[400];
  int64_t at;
} rename_at;

// The eval data is damaged during step `at` (a network mount dropped, a copy overwritten): its shard is cut short
// in place, so the eval source, opened at start-up, fails when it reads. r->to keeps a copy to put back.
static void move_eval_data(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  rename_at *r = ctx;
  (void)grads, (void)n;
  char cmd[1000];
  snprintf(cmd, sizeof cmd, "truncate -s 4096 %s/shard_000.h5", r->from);
  if (step == r->at && micro == 0) cr_assert_eq(system(cmd), 0);
}

Test(trainer_failures, an_error_after_training_started_writes_a_checkpoint_first) {
  df_cli_dir d;
  df_cli_dir_open(&d, "late_error", NULL);
  char cmd[900];
  snprintf(cmd, sizeof cmd, "cp -r %s/data %s/evaldata", FX, d.root);
  cr_assert_eq(system(cmd), 0);
  char out_a[400], out_b[400], ev[400];
  snprintf(out_a, sizeof out_a, "output_dir=%s/a", d.root);
  snprintf(out_b, sizeof out_b, "output_dir=%s/straight", d.root);
  snprintf(ev, sizeof ev, "data.eval_hidden_states_path=%s/evaldata", d.root);
  rename_at r = {.at = 3};
  snprintf(r.from, sizeof r.from, "%s/evaldata", d.root);
  snprintf(r.to, sizeof r.to, "%s/evaldata.orig", d.root);
  snprintf(cmd, sizeof cmd, "cp -r %s %s", r.from, r.to);
  cr_assert_eq(system(cmd), 0);
  df_train_hooks h = {.ctx = &r, .after_micro = move_eval_data};
  const char *sets[] = {out_a, ev, "training.eval_interval=4", "training.max_steps=6", NULL};
  df_train_summary s;
  df_error err = {0};
  // the eval at step 4 cannot read its data: the run fails, but step 4 (complete) is saved first
  cr_expect_neq(train(&d, sets, NULL, &h, &s, &err), DF_OK);
  cr_expect(strstr(err.msg, "evaldata"), "%s", err.msg);
  cr_expect(df_cli_exists(&d, "a/checkpoints/step-00000004/state.h5"), "no checkpoint after the failure: %s", err.msg);
  cr_expect_eq(s.last_step, 4);
  cr_expect(strstr(s.last_checkpoint, "a/checkpoints/step-00000004"), "%s", s.last_checkpoint);
  // with the data back, the run resumes from it and reaches the bits of a straight run
  snprintf(cmd, sizeof cmd, "cp %s/shard_000.h5 %s/shard_000.h5", r.to, r.from);
  cr_assert_eq(system(cmd), 0);
  char res[400];
  snprintf(res, sizeof res, "%s/a", d.root);
  DF_ASSERT_OK(train(&d, sets, res, NULL, &s, &err), &err);
  cr_expect_eq(s.start_step, 4);
  const char *straight[] = {out_b, ev, "training.eval_interval=4", "training.max_steps=6", NULL};
  DF_ASSERT_OK(train(&d, straight, NULL, NULL, &s, &err), &err);
  snprintf(cmd, sizeof cmd,
           "cmp -s %s/a/checkpoints/step-00000006/model.safetensors "
           "%s/straight/checkpoints/step-00000006/model.safetensors",
           d.root, d.root);
  cr_expect_eq(system(cmd), 0, "the resumed run differs from the straight one");
  df_cli_dir_close(&d);
}

typedef struct {
  const df_cli_dir *d;
  pid_t dead;
} stale_ctx;

static void leave_stale_temporary(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  const stale_ctx *c = ctx;
  if (step != 3 || micro != 0) return;
  char cmd[900];
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s/r/checkpoints/.tmp-step-00000099.%d && touch %s/r/checkpoints/"
           ".tmp-step-00000099.%d/model.safetensors",
           c->d->root, (int)c->dead, c->d->root, (int)c->dead);
  cr_assert_eq(system(cmd), 0);
}

Test(trainer_failures, rotation_removes_temporaries_of_dead_writers) {
  df_cli_dir d;
  df_cli_dir_open(&d, "rotation_stale", NULL);
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  stale_ctx c = {&d, dead};
  df_train_hooks h = {.ctx = &c, .after_micro = leave_stale_temporary};
  char out_r[400];
  snprintf(out_r, sizeof out_r, "output_dir=%s/r", d.root);
  const char *sets[] = {out_r, "training.max_steps=5", "training.save_interval=2", "training.max_checkpoints=1", NULL};
  df_train_summary s;
  df_error err = {0};
  DF_ASSERT_OK(train(&d, sets, NULL, &h, &s, &err), &err);
  char rel[128];
  snprintf(rel, sizeof rel, "r/checkpoints/.tmp-step-00000099.%d", (int)dead);
  cr_expect_not(df_cli_exists(&d, rel), "the dead writer's temporary survived rotation");
  cr_expect(df_cli_exists(&d, "r/checkpoints/step-00000005"));
  df_cli_dir_close(&d);
}
