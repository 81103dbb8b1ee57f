// Device residency of a training step, proved on the fake device (kernels/fake/: the CPU kernels behind a table
// whose memory counts as device memory, every host↔device copy counted by kernels/context.c). For DFlash, D-PACE,
// DSpark, Domino and MoE drafts, every optimizer step of a 2-micro-batch window moves exactly one upload per
// micro-batch (the packed batch, strategies/dflash/stage.c) and one read (the window's sums and {norm, coef, ok}) —
// nothing else; and the run is bit for bit the CPU run (same kernels, staged instead of read in place): metrics.jsonl
// and the final weights agree exactly. DFlash, D-PACE, DSpark (vanilla, gated and rnn heads), Domino and MoE drafts run
// on the strict variant, whose memory faults on any host access.
#include <criterion/criterion.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/ops_domino.h"
#include "modeling/draft_config.h"
#include "moe/config.h"
#include "strategies/eagle3/eagle3.h"
#include "tests/common/fixture.h"
#include "train/observe/metrics_log.h"
#include "train/trainer/trainer.h"

#define DFX DF_FIXTURE_DIR "/dflash_step"
#define SFX DF_FIXTURE_DIR "/dspark_step"
#define EFX DF_FIXTURE_DIR "/eagle3_step"

enum { STEPS = 3, ACCUM = 2 };

typedef struct {
  df_transfer_stats per_step[STEPS + 1];
  int seen;
} transfers;

static void on_step(void *ctx, int64_t step, df_transfer_stats s) {
  transfers *t = ctx;
  if (step >= 1 && step <= STEPS) t->per_step[step] = s, t->seen++;
}

typedef struct {
  const char *name, *draft, *data, *strategy, *extra;
  bool eval;          // also evaluate (on the training data) at the last step: eval's lines must match too
  const char *target; // the fixture folder of the target (NULL: dflash_step's)
} rcase;

static void write_recipe(const char *path, const rcase *c) {
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  fprintf(fp,
          "model:\n  target_model_path: %s/target\n  draft_model_config: %s\n"
          "data:\n  hidden_states_path: %s\n%s%s%s  max_length: 64\n"
          "training:\n  strategy: %s\n  batch_size: 2\n  accumulation_steps: %d\n  num_anchors: 4\n"
          "  objective_chunk_blocks: 2\n  num_epochs: 4\n  total_steps: %d\n  learning_rate: 1e-3\n"
          "  warmup_ratio: 0.0\n  max_grad_norm: 1.0\n  weight_decay: 0.1\n  log_interval: 1\n  seed: 7\n"
          "  eval_interval: %d\n%s"
          "run_id: residency\n",
          c->target ? c->target : DFX, c->draft, c->data, c->eval ? "  eval_hidden_states_path: " : "",
          c->eval ? c->data : "", c->eval ? "\n" : "", c->strategy, ACCUM, STEPS, c->eval ? STEPS : 0,
          c->extra ? c->extra : "");
  fclose(fp);
}

static void train_on(const char *recipe, const char *out, df_device dev, const df_backend *be, transfers *tr) {
  char o[600];
  snprintf(o, sizeof o, "output_dir=%s", out);
  const char *sets[] = {o};
  df_ctx_options co = {.device = dev, .num_threads = 1, .backend = be};
  df_train_hooks h = {.ctx = tr, .after_step = on_step};
  df_train_options opt = {.recipe_path = recipe,
                          .overrides = sets,
                          .n_overrides = 1,
                          .threads = 1,
                          .no_prefetch = true,
                          .hooks = &h,
                          .ctx_options = &co};
  omp_set_num_threads(1);
  df_train_summary s;
  df_error err = {0};
  DF_ASSERT_OK(df_train(&opt, &s, &err), &err);
  cr_assert_eq(s.last_step, STEPS);
  cr_assert_eq(s.skipped_steps, 0);
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  cr_assert(fp, "cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = calloc((size_t)n + 1, 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
  fclose(fp);
  return buf;
}

// metrics.jsonl without its timing fields, as one string.
static char *metrics_text(const char *run) {
  char path[700];
  snprintf(path, sizeof path, "%s/metrics.jsonl", run);
  char *text = slurp(path), *out = calloc(strlen(text) * 2 + 1, 1), *line = strtok(text, "\n");
  for (; line; line = strtok(NULL, "\n")) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    cr_assert(o, "bad metrics line: %s", line);
    df_metrics_strip_timing(o);
    char *d = json_dumps(o, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    strcat(out, d), strcat(out, "\n");
    free(d), json_decref(o);
  }
  free(text);
  return out;
}

// be: the fake table to run on (df_fake_backend, or df_fake_strict_backend where no host loop may touch device data).
static void run_case(const rcase *c, const df_backend *be) {
  char root[256], recipe[300], cpu[300], fake[300];
  snprintf(root, sizeof root, "/tmp/df_test_residency_%s_%ld", c->name, (long)getpid());
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", root, root);
  cr_assert_eq(system(cmd), 0);
  snprintf(recipe, sizeof recipe, "%s/recipe.yaml", root);
  snprintf(cpu, sizeof cpu, "%s/cpu", root), snprintf(fake, sizeof fake, "%s/fake", root);
  write_recipe(recipe, c);
  transfers on_cpu = {0}, on_fake = {0};
  train_on(recipe, cpu, DF_DEV_CPU, NULL, &on_cpu);
  train_on(recipe, fake, DF_DEV_FAKE, be, &on_fake);

  const df_draft_config *cfg;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(c->draft, &cfg, &err), &err);
  const int64_t bs = cfg->block_size;
  int64_t nstats = cfg->kind == DF_DRAFT_DSPARK   ? DF_DSPARK_STATS(bs)
                   : cfg->kind == DF_DRAFT_DOMINO ? DF_DOMINO_STATS(bs)
                                                  : DF_BLOCK_STATS(bs);
  if (cfg->kind == DF_DRAFT_EAGLE3) nstats = DF_EAGLE3_STATS(3); // the case's ttt_length
  // MoE drafts (every layer MoE): each layer's statistics sums ride in the same block (kernels/ops_moe.h).
  if (cfg->moe) nstats += cfg->num_hidden_layers * DF_MOE_STATS(cfg->moe->n_routed_experts);
  df_draft_config_free(cfg);
  cr_assert_eq(on_fake.seen, STEPS);
  for (int s = 1; s <= STEPS; s++) {
    const df_transfer_stats *x = &on_fake.per_step[s];
    cr_expect_eq(x->h2d, ACCUM, "%s step %d: %lld uploads, want one per micro-batch", c->name, s, (long long)x->h2d);
    cr_expect_eq(x->d2h, 1, "%s step %d: %lld reads, want one", c->name, s, (long long)x->d2h);
    cr_expect_eq(x->d2h_bytes, (nstats + DF_NORM_STATS) * 8, "%s step %d: read %lld bytes", c->name, s,
                 (long long)x->d2h_bytes);
    cr_expect(x->h2d_bytes > 0);
    const df_transfer_stats *y = &on_cpu.per_step[s];
    cr_expect_eq(y->h2d + y->d2h, 0, "the CPU backend moves nothing");
  }
  char *a = metrics_text(cpu), *b = metrics_text(fake);
  cr_expect_str_eq(a, b, "%s: the fake-device run differs from the CPU run", c->name);
  cr_expect(!c->eval || strstr(a, "eval/loss"), "%s: no eval line", c->name);
  free(a), free(b);
  char wa[400], wb[400];
  snprintf(wa, sizeof wa, "%s/checkpoints/step-%08d/model.safetensors", cpu, STEPS);
  snprintf(wb, sizeof wb, "%s/checkpoints/step-%08d/model.safetensors", fake, STEPS);
  char cmp[1000];
  snprintf(cmp, sizeof cmp, "cmp -s %s %s", wa, wb);
  cr_expect_eq(system(cmp), 0, "%s: final weights differ between the fake device and the CPU", c->name);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  cr_expect_eq(system(cmd), 0);
}

// DFlash and D-PACE run on the strict fake device: its buffers fault on any host load or store, so these runs also
// prove that no host code reads or writes device memory outside the backend table.
Test(residency, dflash_step_moves_only_the_batch_and_one_read) {
  rcase c = {"dflash", DFX "/tiny-dflash.json", DFX "/data", "dflash", "  loss_decay_gamma: 7.0\n", .eval = true};
  run_case(&c, df_fake_strict_backend());
}

Test(residency, dpace_step_moves_only_the_batch_and_one_read) {
  rcase c = {"dpace",      DFX "/tiny-dflash.json", DFX "/data", "dflash", "  loss_type: dpace\n  dpace_alpha: 0.5\n",
             .eval = false};
  run_case(&c, df_fake_strict_backend());
}

// DSpark's heads run as ops (kernels/cpu/markov.c, df_copy_2d), so all three Markov head types run on the strict
// device too: vanilla with a Markov-fed confidence head, gated likewise, rnn with a hidden-only confidence head.
Test(residency, dspark_step_moves_only_the_batch_and_one_read) {
  rcase c = {"dspark", SFX "/tiny-dspark.json", SFX "/data", "dspark", NULL, .eval = true};
  run_case(&c, df_fake_strict_backend());
}

Test(residency, dspark_gated_step_moves_only_the_batch_and_one_read) {
  rcase c = {"dspark_gated", SFX "/gated.json", SFX "/data", "dspark", NULL, .eval = true};
  run_case(&c, df_fake_strict_backend());
}

Test(residency, dspark_rnn_step_moves_only_the_batch_and_one_read) {
  rcase c = {"dspark_rnn", SFX "/rnn.json", SFX "/data", "dspark", NULL, .eval = true};
  run_case(&c, df_fake_strict_backend());
}

// MoE drafts run on the strict device too: routing, dispatch, experts, shared expert, aux loss, statistics and the
// deferred updates (EMA centering mean; noaux_tc bias) are ops. Qwen: sample centering, the switch aux loss, a
// gated shared expert; DeepSeek: sqrtsoftplus scores, noaux_tc balancing, group-limited routing.
// Domino: the GRU head reads the staged head tokens and corrected-row flags, λ is host-known: still one upload per
// micro-batch and one read per step, on the strict device.
Test(residency, domino_step_moves_only_the_batch_and_one_read) {
  rcase c = {"domino",
             DF_FIXTURE_DIR "/domino_step/domino-shift.json",
             DFX "/data",
             "domino",
             "  loss_decay_gamma: 4.0\n  lambda_base_decay_ratio: 1.0\n",
             .eval = true};
  run_case(&c, df_fake_strict_backend());
}

Test(residency, moe_step_moves_only_the_batch_and_one_read) {
  rcase c = {"moe", DF_SOURCE_DIR "/configs/tiny-dflash-moe.json", DFX "/data", "dflash", NULL, .eval = true};
  run_case(&c, df_fake_strict_backend());
}

Test(residency, moe_deepseek_step_moves_only_the_batch_and_one_read) {
  rcase c = {"moe_ds",     DF_SOURCE_DIR "/configs/tiny-dflash-moe-deepseek.json", DFX "/data", "dflash", NULL,
             .eval = false};
  run_case(&c, df_fake_strict_backend());
}

// EAGLE-3: the TTT attention, the compact teacher and the objective are ops; the vocabulary mapping derived from the
// data is written into the weights before the first step (its transfers are the run's setup, not a step's), so a
// step moves the batch and one read. Also on the strict device.
Test(residency, eagle3_step_moves_only_the_batch_and_one_read) {
  rcase c = {"eagle3",     EFX "/eagle3.json", EFX "/data", "eagle3", "  ttt_length: 3\n  lk_loss_type: lambda\n",
             .eval = true, .target = EFX};
  run_case(&c, df_fake_strict_backend());
}
