// The memory plan (train/trainer/mem_plan.h) against the memory a run takes: the same recipe trained for real with
// the accounting on (kernels/ops.h df_ctx_mem_stats, df_train_summary.mem) and planned on a measuring context give
// exactly the same device peak, the same split of it by category, the same peak per category and the same pinned
// host memory. The data is made so that every batch is the largest the plan assumes (samples of data.max_length
// tokens, every one supervised). plan_equals_run takes the context options, so the same check runs on any backend:
// the fake device here (the CPU kernels, device-resident memory), the emulated CUDA backend where it is built.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"
#include "train/data/hs.h"
#include "train/trainer/mem_plan.h"
#include "train/trainer/trainer.h"

#define DFX    DF_FIXTURE_DIR "/dflash_step"
#define SFX    DF_FIXTURE_DIR "/dspark_step"
#define TARGET DF_SOURCE_DIR "/recipes/tiny-target"

enum { MAX_LEN = 40, SAMPLES = 8 };

typedef struct {
  char root[200], data[300], recipe[300];
} pdir;

static void pdir_open(pdir *d, const char *name) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_mem_plan_%s_%ld", name, (long)getpid());
  char cmd[500];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/data", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->data, sizeof d->data, "%s/data", d->root);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
}

static void pdir_close(const pdir *d) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

// SAMPLES samples of len tokens (longer than data.max_length: every batch is cut to it), all supervised; K·H
// features (and the final hidden states with last) of small finite values.
static void write_shard(const pdir *d, int64_t len, int64_t H, int K, const int *layers, int64_t vocab, bool last) {
  char path[400];
  snprintf(path, sizeof path, "%s/shard_00000.h5", d->data);
  df_hs_writer_options o = {
      .hidden_size = H, .num_layers = K, .target_layer_ids = layers, .dtype = DF_F32, .has_last_hidden = last};
  df_hs_writer *w;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_writer_create(path, &o, &w, &err), &err);
  int32_t *ids = malloc(sizeof *ids * (size_t)len);
  uint8_t *mask = malloc((size_t)len);
  float *hid = malloc(sizeof *hid * (size_t)(len * K * H)), *fin = malloc(sizeof *fin * (size_t)(len * H));
  for (int s = 0; s < SAMPLES; s++) {
    for (int64_t i = 0; i < len; i++) ids[i] = (int32_t)((s * 31 + i * 7) % vocab), mask[i] = 1;
    for (int64_t i = 0; i < len * K * H; i++) hid[i] = (float)((i * 13 + s) % 17) / 17.0f - 0.5f;
    for (int64_t i = 0; i < len * H; i++) fin[i] = (float)((i * 5 + s) % 11) / 11.0f - 0.5f;
    DF_ASSERT_OK(df_hs_writer_append(w, len, ids, mask, hid, last ? fin : NULL, &err), &err);
  }
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
  free(ids), free(mask), free(hid), free(fin);
}

// Token samples for the online target (recipes/tiny-target, vocabulary 264).
static void write_tokens(pdir *d, int64_t len) {
  snprintf(d->data, sizeof d->data, "%s/tokens.jsonl", d->root);
  FILE *fp = fopen(d->data, "w");
  cr_assert(fp);
  for (int s = 0; s < SAMPLES; s++) {
    fprintf(fp, "{\"input_ids\": [");
    for (int64_t i = 0; i < len; i++) fprintf(fp, "%s%d", i ? ", " : "", (int)((s * 31 + i * 7) % 250));
    fprintf(fp, "], \"loss_mask\": [");
    for (int64_t i = 0; i < len; i++) fprintf(fp, "%s1", i ? ", " : "");
    fprintf(fp, "]}\n");
  }
  fclose(fp);
}

// A recipe of two optimizer steps of two micro-batches (both upload slots used), evaluating when eval is set.
static void write_recipe(const pdir *d, const char *target, const char *draft, const char *strategy, bool online,
                         bool eval, const char *extra) {
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  const char *key = online ? "train_data_path" : "hidden_states_path";
  fprintf(fp,
          "run_id: mem_plan\noutput_dir: %s/run\nmodel:\n  target_model_path: %s\n  draft_model_config: %s\n"
          "data:\n  %s: %s\n  max_length: %d\n",
          d->root, target, draft, key, d->data, MAX_LEN);
  if (eval) fprintf(fp, "  eval_%s: %s\n", key, d->data);
  fprintf(fp,
          "training:\n  strategy: %s\n  batch_size: 2\n  accumulation_steps: 2\n  num_anchors: 4\n"
          "  objective_chunk_blocks: 2\n  num_epochs: 4\n  total_steps: 2\n  learning_rate: 1e-3\n"
          "  warmup_ratio: 0.0\n  log_interval: 1\n  seed: 3\n  eval_interval: %d\n%s",
          strategy, eval ? 2 : 0, extra ? extra : "");
  fclose(fp);
}

static void expect_same(const df_mem_stats *run, const df_mem_stats *plan, const char *what) {
  cr_expect_eq(plan->device.peak, run->device.peak, "%s: plan peak %lld, run peak %lld", what,
               (long long)plan->device.peak, (long long)run->device.peak);
  for (int i = 0; i < DF_MEM_TAGS; i++) {
    cr_expect_eq(plan->tag[i].peak, run->tag[i].peak, "%s: %s peaks at %lld in the plan, %lld in the run", what,
                 df_mem_tag_name((df_mem_tag)i), (long long)plan->tag[i].peak, (long long)run->tag[i].peak);
    cr_expect_eq(plan->at_peak[i], run->at_peak[i], "%s: %s at the peak %lld in the plan, %lld in the run", what,
                 df_mem_tag_name((df_mem_tag)i), (long long)plan->at_peak[i], (long long)run->at_peak[i]);
  }
  cr_expect_eq(plan->host.peak, run->host.peak, "%s: pinned host %lld in the plan, %lld in the run", what,
               (long long)plan->host.peak, (long long)run->host.peak);
}

// Trains d->recipe on `real` (two steps), then plans it for the same backend: the plan must equal the tracked run.
// Returns the plan (for the callers' own checks).
static df_mem_plan plan_equals_run(const pdir *d, const df_ctx_options *real, const char *what) {
  df_ctx_options co = *real;
  df_train_options opt = {.recipe_path = d->recipe, .threads = co.num_threads, .no_prefetch = true, .ctx_options = &co};
  df_train_summary s;
  df_error err = {0};
  DF_ASSERT_OK(df_train(&opt, &s, &err), &err);
  cr_assert_eq(s.last_step, 2);
  df_mem_plan_options po = {.recipe_path = d->recipe, .ctx = *real};
  df_mem_plan p;
  DF_ASSERT_OK(df_mem_plan_run(&po, &p, &err), &err);
  expect_same(&s.mem, &p.mem, what);
  cr_expect(p.batch == 2 && p.S == MAX_LEN && p.N == 4, "%s: planned %lld x %lld, %lld anchors", what,
            (long long)p.batch, (long long)p.S, (long long)p.N);
  const df_mem_tag present[] = {DF_MEM_WEIGHTS, DF_MEM_GRADS,     DF_MEM_OPTIMIZER, DF_MEM_ACTIVATIONS,
                                DF_MEM_STAGE,   DF_MEM_WORKSPACE, DF_MEM_STATS,     DF_MEM_FROZEN};
  for (size_t i = 0; i < sizeof present / sizeof *present; i++)
    cr_expect_gt(p.mem.tag[present[i]].peak, 0, "%s: no %s", what, df_mem_tag_name(present[i]));
  return p;
}

// The fake device: the CPU kernels (and their workspace) behind device-resident memory, as a GPU's.
static df_ctx_options fake(void) { return (df_ctx_options){.num_threads = 2, .backend = df_fake_backend()}; }

static void offline_case_on(const df_ctx_options *o, const char *name, const char *draft, const char *strategy,
                            bool last, bool eval, const char *extra) {
  pdir d;
  pdir_open(&d, name);
  const int layers[] = {1, 2};
  write_shard(&d, MAX_LEN + 9, 64, 2, layers, 256, last);
  write_recipe(&d, DFX "/target", draft, strategy, false, eval, extra);
  df_mem_plan p = plan_equals_run(&d, o, name);
  cr_expect_eq(p.eval, eval);
  cr_expect_eq(p.mem.tag[DF_MEM_TARGET_WEIGHTS].peak, 0, "offline: no target on the device");
  pdir_close(&d);
}

static void offline_case(const char *name, const char *draft, const char *strategy, bool last, bool eval,
                         const char *extra) {
  const df_ctx_options o = fake();
  offline_case_on(&o, name, draft, strategy, last, eval, extra);
}

Test(mem_plan, dflash_plan_equals_the_run_with_eval) {
  offline_case("dflash", DFX "/tiny-dflash.json", "dflash", false, true, "  loss_decay_gamma: 7.0\n");
}

Test(mem_plan, dspark_plan_equals_the_run) {
  offline_case("dspark", SFX "/tiny-dspark.json", "dspark", true, true, NULL);
}

Test(mem_plan, domino_plan_equals_the_run) {
  offline_case("domino", DF_FIXTURE_DIR "/domino_step/domino-shift.json", "domino", false, false,
               "  loss_decay_gamma: 4.0\n");
}

Test(mem_plan, moe_plan_equals_the_run) {
  pdir d;
  pdir_open(&d, "moe");
  const int layers[] = {1, 2};
  write_shard(&d, MAX_LEN, 64, 2, layers, 256, false);
  write_recipe(&d, DFX "/target", DF_SOURCE_DIR "/configs/tiny-dflash-moe.json", "dflash", false, true, NULL);
  const df_ctx_options o = fake();
  df_mem_plan p = plan_equals_run(&d, &o, "moe");
  cr_expect_gt(p.mem.tag[DF_MEM_FFN_STATE].peak, 0, "the MoE layers' statistics and stashes");
  pdir_close(&d);
}

// The CUDA kernels' workspace (their measure paths): on a GPU, or on the emulated CUDA backend where it is built.
Test(mem_plan, cuda_plan_equals_the_run) {
  if (!df_cuda_available()) cr_skip_test("no CUDA device visible");
  const df_ctx_options o = {.device = DF_DEV_CUDA};
  offline_case_on(&o, "cuda_dflash", DFX "/tiny-dflash.json", "dflash", false, true, "  loss_decay_gamma: 7.0\n");
  offline_case_on(&o, "cuda_dspark", SFX "/tiny-dspark.json", "dspark", true, true, NULL);
}

// Online: the target's weights, KV cache and prefill rows sit on its own context; run and plan add both contexts.
Test(mem_plan, online_plan_equals_the_run) {
  pdir d;
  pdir_open(&d, "online");
  write_tokens(&d, MAX_LEN + 5);
  write_recipe(&d, TARGET, DF_SOURCE_DIR "/configs/tiny-target-dflash.json", "dflash", true, false, NULL);
  const df_ctx_options o = fake();
  df_mem_plan p = plan_equals_run(&d, &o, "online");
  cr_expect(p.online);
  cr_expect_gt(p.mem.tag[DF_MEM_TARGET_WEIGHTS].peak, 0);
  cr_expect_gt(p.mem.tag[DF_MEM_KV_CACHE].peak, 0);
  cr_expect_gt(p.mem.tag[DF_MEM_TARGET_ACTIVATIONS].peak, 0);
  pdir_close(&d);
}

// ---- the plan's own behaviour -------------------------------------------------------------------------------------

// The peak grows with the batch; the fit is the largest batch whose peak fits, and the next one does not.
Test(mem_plan, fit_finds_the_largest_batch) {
  pdir d;
  pdir_open(&d, "fit");
  write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  df_mem_plan_options o = {.recipe_path = d.recipe, .ctx = fake()};
  df_mem_plan p3, p4;
  df_error err = {0};
  o.batch_size = 3;
  DF_ASSERT_OK(df_mem_plan_run(&o, &p3, &err), &err);
  o.batch_size = 4;
  DF_ASSERT_OK(df_mem_plan_run(&o, &p4, &err), &err);
  cr_assert_gt(p4.mem.device.peak, p3.mem.device.peak);
  cr_expect_eq(p4.mem.tag[DF_MEM_WEIGHTS].peak, p3.mem.tag[DF_MEM_WEIGHTS].peak, "the weights do not grow");
  int64_t best;
  df_mem_plan fit, over;
  o.batch_size = 0;
  DF_ASSERT_OK(df_mem_plan_fit(&o, p4.mem.device.peak - 1, 64, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 3);
  cr_expect_eq(fit.mem.device.peak, p3.mem.device.peak);
  cr_expect_eq(over.batch, 4);
  DF_ASSERT_OK(df_mem_plan_fit(&o, 1000, 64, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 0, "nothing fits 1000 bytes");
  cr_expect_eq(over.batch, 1);
  DF_ASSERT_OK(df_mem_plan_fit(&o, (int64_t)1 << 40, 5, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 5, "the search stops at max_batch");
  cr_expect_eq(over.batch, 0);
  pdir_close(&d);
}

// Data parallel: replicated AdamW (NO_SHARD) keeps the whole moments on every rank; ZeRO-1 (SHARD_GRAD_OP, the
// default) keeps rank 0's shard.
Test(mem_plan, zero1_shards_the_moments) {
  pdir d;
  pdir_open(&d, "zero");
  write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  df_mem_plan_options o = {.recipe_path = d.recipe, .ctx = fake(), .world_size = 4};
  df_mem_plan rep, zero;
  df_error err = {0};
  DF_ASSERT_OK(df_mem_plan_run(&o, &zero, &err), &err);
  const char *sets[] = {"training.fsdp_sharding=NO_SHARD"};
  o.overrides = sets, o.n_overrides = 1;
  DF_ASSERT_OK(df_mem_plan_run(&o, &rep, &err), &err);
  cr_expect(!rep.zero && zero.zero && zero.world == 4 && rep.world == 4);
  const int64_t n = rep.params, shard = ((n + 3) / 4 + 15) / 16 * 16;
  cr_expect_eq(rep.mem.tag[DF_MEM_OPTIMIZER].peak, 2 * 4 * n + n, "fp32 m and v, a one-byte mask");
  cr_expect_eq(zero.mem.tag[DF_MEM_OPTIMIZER].peak, 2 * 4 * shard + n, "rank 0's shard of m and v, the whole mask");
  cr_expect_eq(zero.mem.tag[DF_MEM_WEIGHTS].peak, rep.mem.tag[DF_MEM_WEIGHTS].peak);
  pdir_close(&d);
}

// The command: a table with every category and the peak; the fit line with --device-memory.
Test(mem_plan, command_prints_the_table_and_the_fit) {
  pdir d;
  pdir_open(&d, "cli");
  write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  char cmd[900], out[8192];
  snprintf(cmd, sizeof cmd,
           "cd %s && OMP_NUM_THREADS=1 %s train recipe.yaml --plan --device cpu --device-memory 1MiB 2>&1", d.root,
           DF_DRAFTFORGE_BIN);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  out[fread(out, 1, sizeof out - 1, p)] = 0;
  cr_assert_eq(pclose(p), 0, "%s", out);
  const char *want[] = {"memory plan: cpu backend, micro-batch 2 x 40 tokens",
                        "weights",
                        "activations",
                        "stage",
                        "workspace",
                        "frozen",
                        "device peak",
                        "pinned host",
                        "device memory 1.00 MiB",
                        "largest batch_size that fits:"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(strstr(out, want[i]), "no '%s' in:\n%s", want[i], out);
  pdir_close(&d);
}
