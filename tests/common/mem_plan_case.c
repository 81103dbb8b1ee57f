// The memory plan's check shared by the CPU and GPU suites (tests/common/mem_plan_case.h).
#include "tests/common/mem_plan_case.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/data/hs.h"
#include "train/trainer/trainer.h"

void plan_case_open(plan_case *d, const char *name) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_mem_plan_%s_%ld", name, (long)getpid());
  char cmd[500];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s/data", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->data, sizeof d->data, "%s/data", d->root);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
}

void plan_case_close(const plan_case *d) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

void plan_case_write_shard(const plan_case *d, int64_t len, int64_t H, int K, const int *layers, int64_t vocab,
                           bool last) {
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
  for (int s = 0; s < PLAN_CASE_SAMPLES; s++) {
    for (int64_t i = 0; i < len; i++) ids[i] = (int32_t)((s * 31 + i * 7) % vocab), mask[i] = 1;
    for (int64_t i = 0; i < len * K * H; i++) hid[i] = (float)((i * 13 + s) % 17) / 17.0f - 0.5f;
    for (int64_t i = 0; i < len * H; i++) fin[i] = (float)((i * 5 + s) % 11) / 11.0f - 0.5f;
    DF_ASSERT_OK(df_hs_writer_append(w, len, ids, mask, hid, last ? fin : NULL, &err), &err);
  }
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
  free(ids), free(mask), free(hid), free(fin);
}

void plan_case_write_tokens(plan_case *d, int64_t len) {
  snprintf(d->data, sizeof d->data, "%s/tokens.jsonl", d->root);
  FILE *fp = fopen(d->data, "w");
  cr_assert(fp);
  for (int s = 0; s < PLAN_CASE_SAMPLES; s++) {
    fprintf(fp, "{\"input_ids\": [");
    for (int64_t i = 0; i < len; i++) fprintf(fp, "%s%d", i ? ", " : "", (int)((s * 31 + i * 7) % 250));
    fprintf(fp, "], \"loss_mask\": [");
    for (int64_t i = 0; i < len; i++) fprintf(fp, "%s1", i ? ", " : "");
    fprintf(fp, "]}\n");
  }
  fclose(fp);
}

void plan_case_write_recipe(const plan_case *d, const char *target, const char *draft, const char *strategy,
                            bool online, bool eval, const char *extra) {
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  const char *key = online ? "train_data_path" : "hidden_states_path";
  fprintf(fp,
          "run_id: mem_plan\noutput_dir: %s/run\nmodel:\n  target_model_path: %s\n  draft_model_config: %s\n"
          "data:\n  %s: %s\n  max_length: %d\n",
          d->root, target, draft, key, d->data, PLAN_CASE_MAX_LEN);
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

df_mem_plan plan_case_equals_run(const plan_case *d, const df_ctx_options *real, int64_t anchors, const char *what) {
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
  cr_expect(p.batch == 2 && p.S == PLAN_CASE_MAX_LEN && (anchors < 0 || p.N == anchors),
            "%s: planned %lld x %lld, %lld anchors", what, (long long)p.batch, (long long)p.S, (long long)p.N);
  const df_mem_tag present[] = {DF_MEM_WEIGHTS, DF_MEM_GRADS,     DF_MEM_OPTIMIZER, DF_MEM_ACTIVATIONS,
                                DF_MEM_STAGE,   DF_MEM_WORKSPACE, DF_MEM_STATS,     DF_MEM_FROZEN};
  for (size_t i = 0; i < sizeof present / sizeof *present; i++)
    cr_expect_gt(p.mem.tag[present[i]].peak, 0, "%s: no %s", what, df_mem_tag_name(present[i]));
  return p;
}

df_mem_plan plan_case_offline(plan_case *d, const char *name, const char *target, const char *draft,
                              const char *strategy, bool last, bool eval, const char *extra,
                              const df_ctx_options *real) {
  plan_case_open(d, name);
  const int layers[] = {1, 2};
  plan_case_write_shard(d, PLAN_CASE_MAX_LEN + 9, 64, 2, layers, 256, last);
  plan_case_write_recipe(d, target, draft, strategy, false, eval, extra);
  return plan_case_equals_run(d, real, 4, name);
}
