// The trainer on a Domino draft (tests/fixtures/domino_step): the window's gradient is the mean of the micro-steps'
// gradients of their own ratio losses (SpecForge's loss / accumulation_steps, strategies/domino/strategy.c), λ follows
// the optimizer step over the horizon in the logged lines (and in an eval line), the Domino keys are in the resume
// contract, a resume is bit exact, and training.global_step (draftforge step's key) is refused by train.
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/draft_model.h"
#include "modeling/target_pieces.h"
#include "strategies/domino/domino.h"
#include "tests/common/fixture.h"
#include "train/data/data_feed.h"
#include "train/step/step.h"
#include "train/trainer/trainer.h"

#define FX DF_FIXTURE_DIR "/domino_step"

// 6 samples, batch 2 → 3 micro-batches per epoch; accumulation 2.
static const char *RECIPE = "model:\n"
                            "  target_model_path: " FX "/target\n"
                            "  draft_model_config: " FX "/domino-shift.json\n"
                            "data:\n"
                            "  hidden_states_path: " FX "/data\n"
                            "  eval_hidden_states_path: " FX "/data\n"
                            "  max_length: 64\n"
                            "training:\n"
                            "  strategy: domino\n"
                            "  batch_size: 2\n"
                            "  accumulation_steps: 2\n"
                            "  num_anchors: 3\n"
                            "  loss_decay_gamma: 4.0\n"
                            "  objective_chunk_blocks: 2\n"
                            "  num_epochs: 8\n"
                            "  total_steps: 12\n"
                            "  lambda_base_start: 1.0\n"
                            "  lambda_base_decay_ratio: 0.5\n"
                            "  learning_rate: 1e-3\n"
                            "  warmup_ratio: 0.25\n"
                            "  max_grad_norm: 1.0\n"
                            "  log_interval: 1\n"
                            "  seed: 7\n"
                            "run_id: t\n";

typedef struct {
  char root[256], recipe[300];
} tdir;

static void tdir_open(tdir *d, const char *name) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_domino_%s_%ld", name, (long)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  fputs(RECIPE, fp);
  fclose(fp);
}

static void tdir_close(tdir *d) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

static df_status train(const tdir *d, const char *run, const char *const *sets, bool resume,
                       const df_train_hooks *hooks, df_train_summary *s, df_error *err) {
  const char *all[16];
  char out[400], res[400];
  snprintf(out, sizeof out, "output_dir=%s/%s", d->root, run);
  snprintf(res, sizeof res, "%s/%s", d->root, run);
  int n = 0;
  all[n++] = out;
  for (int i = 0; sets && sets[i]; i++) all[n++] = sets[i];
  df_train_options o = {.recipe_path = d->recipe,
                        .overrides = all,
                        .n_overrides = n,
                        .resume = resume ? res : NULL,
                        .threads = 1,
                        .hooks = hooks};
  omp_set_num_threads(1);
  return df_train(&o, s, err);
}

static void train_ok(const tdir *d, const char *run, const char *const *sets, bool resume, const df_train_hooks *h) {
  df_train_summary s;
  df_error err = {0};
  DF_ASSERT_OK(train(d, run, sets, resume, h, &s, &err), &err);
}

// ---- the window's gradient ---------------------------------------------------------------------------------------

typedef struct {
  float *grads;
  int64_t n;
} capture;

static void capture_update(void *ctx, int64_t step, const float *grads, int64_t n, double norm, double coef) {
  capture *c = ctx;
  (void)norm, (void)coef;
  if (step != 1) return;
  c->grads = malloc((size_t)n * sizeof(float));
  memcpy(c->grads, grads, (size_t)n * sizeof(float));
  c->n = n;
}

// SpecForge: each micro-step's loss is its own ratio, the trainer backpropagates loss / accumulation_steps. At step 1
// (λ = lambda_base_start 0.3) the window's gradient must be the mean of the two micro-steps' d(loss_i), each computed
// on its own.
Test(domino_train, window_gradient_is_the_mean_of_the_micro_step_gradients) {
  tdir d;
  tdir_open(&d, "accum");
  capture c = {0};
  df_train_hooks h = {.ctx = &c, .before_update = capture_update};
  const char *sets[] = {"training.max_steps=1", "training.max_grad_norm=1e9", "training.lambda_base_start=0.3", NULL};
  train_ok(&d, "run", sets, false, &h);
  cr_assert(c.grads);

  df_error err = {0};
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(FX "/domino-shift.json", &cfg, &err), &err);
  df_target_pieces tp;
  DF_ASSERT_OK(df_target_pieces_load(FX "/target", NULL, &tp, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, 7, &err), &err);
  df_feed *feed;
  df_feed_options fo = {.path = FX "/data", .batch_size = 2, .max_length = 64, .seed = 7, .world_size = 1};
  DF_ASSERT_OK(df_feed_open(&fo, &feed, &err), &err);
  const df_frozen fz = {tp.embed, tp.lm_head, tp.vocab, tp.hidden, DF_F32};
  // λ = lambda_base_start 0.3 at step 0 of the 12-step horizon: the micro-steps get the trainer's schedule position
  const df_strategy_value v[] = {{.key = "lambda_base_start", .number = 0.3},
                                 {.key = "lambda_base_decay_ratio", .number = 0.5}};
  const df_strategy_value_list l = {.v = v, .n = 2};
  const df_strategy_values vals = df_strategy_values_of_list(&l);
  const df_step_settings set = {
      .num_anchors = 3, .loss_decay_gamma = 4.0, .mask_token_id = 255, .chunk_blocks = 2, .values = &vals};
  df_strategy_run *run;
  DF_ASSERT_OK(df_step_open(ctx, m, cfg, &fz, &set, false, &run, &err), &err);
  const int64_t n = df_params_numel(df_draft_model_params(m));
  cr_assert_eq(n, c.n);
  float *want = calloc((size_t)n, sizeof(float));
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, 7);
  double *st = NULL;
  for (int k = 0; k < 2; k++) {
    const df_batch *b;
    DF_ASSERT_OK(df_feed_next(feed, &b, NULL, &err), &err);
    const int64_t ns = run->table->stats_len(run);
    st = calloc((size_t)ns, sizeof(double));
    df_tensor stats = df_f64_on(DF_DEV_CPU, st, ns);
    const df_micro_args a = {.batch = b, .anchor_rng = &s.rng, .world = 1, .stats = &stats, .step = 0, .horizon = 12};
    df_micro_info info;
    DF_ASSERT_OK(run->table->micro(run, &a, &info, &err), &err);
    cr_expect_eq(info.loss_den, 1.0, "a Domino micro-step weighs 1");
    const float *g = df_draft_model_grads(m);
    for (int64_t i = 0; i < n; i++) want[i] += 0.5f * g[i];
    free(st);
  }
  df_expect_close("window gradient = mean of the micro-steps'", c.grads, want, n, 1e-5, 1e-8);
  free(want), free(c.grads);
  df_strategy_close(run);
  df_feed_close(feed);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_target_pieces_free(&tp);
  df_draft_config_free(cfg);
  tdir_close(&d);
}

// ---- λ, eval, resume -------------------------------------------------------------------------------------------

static json_t *lines(const tdir *d, const char *run) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", d->root, run);
  FILE *fp = fopen(p, "r");
  cr_assert(fp, "no %s", p);
  json_t *rows = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, fp) > 0) json_array_append_new(rows, json_loads(line, 0, NULL));
  free(line);
  fclose(fp);
  return rows;
}

Test(domino_train, lambda_follows_the_step_and_resume_is_checked) {
  tdir d;
  tdir_open(&d, "lambda");
  const char *sets[] = {"training.max_steps=4", "training.eval_interval=4", "training.save_interval=2", NULL};
  train_ok(&d, "run", sets, false, NULL);
  json_t *rows = lines(&d, "run");
  int seen = 0, evals = 0;
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *o = json_array_get(rows, i);
    const int64_t step = json_integer_value(json_object_get(o, "step"));
    json_t *lam = json_object_get(o, "lambda_base"), *elam = json_object_get(o, "eval/lambda_base");
    if (lam) { // λ of step s uses the s − 1 optimizer steps taken: 1 − (s − 1)/6 over a 12-step horizon
      cr_expect_float_eq(json_real_value(lam), df_domino_lambda(step - 1, 12, 1.0, 0.5), 1e-12, "step %lld",
                         (long long)step);
      cr_expect_not_null(json_object_get(o, "final_loss"));
      cr_expect_not_null(json_object_get(o, "base_accept_len"));
      seen++;
    }
    if (elam) { // the evaluator uses the live step's λ
      cr_expect_float_eq(json_real_value(elam), df_domino_lambda(step, 12, 1.0, 0.5), 1e-12);
      evals++;
    }
  }
  cr_expect_eq(seen, 4);
  cr_expect_eq(evals, 1);
  json_decref(rows);
  // the Domino keys are in the contract: a resume may not change them
  df_train_summary s;
  df_error err = {0};
  const char *changed[] = {"training.max_steps=6", "training.lambda_base_start=0.5", NULL};
  cr_expect_eq(train(&d, "run", changed, true, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "lambda_base_start"), "%s: %s", err.where, err.msg);
  const char *more[] = {"training.max_steps=6", NULL};
  DF_ASSERT_OK(train(&d, "run", more, true, NULL, &s, &err), &err);
  cr_expect_eq(s.start_step, 4);
  cr_expect_eq(s.last_step, 6);
  // draftforge step's key is refused by train
  const char *gs[] = {"training.global_step=3", NULL};
  cr_expect_eq(train(&d, "gs", gs, false, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.global_step");
  tdir_close(&d);
}
