// The trainer on the tiny DFlash fixture (tests/fixtures/dflash_step): bit-exact resume (max_steps stop and
// SIGTERM mid-window), accumulation = the gradient of the window ratio, clipping, the AdamW update with
// weight-decay flags, NaN skips and the consecutive-skip stop, no non-finite checkpoint, rotation / latest,
// the resolved recipe, contract and --set errors, warm-start parity, eval lines and the best link, the CLI.
// Metrics lines are compared with their timing fields removed (df_metrics_strip_timing).
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "modeling/draft_model.h"
#include "modeling/target_pieces.h"
#include "tests/common/fixture.h"
#include "train/data/data_feed.h"
#include "train/observe/metrics_log.h"
#include "train/recipe/recipe.h"
#include "train/run/ckpt.h"
#include "train/step/step.h"
#include "train/trainer/trainer.h"

#define FX DF_FIXTURE_DIR "/dflash_step"

// 6 samples, batch 2 → 3 micro-batches per epoch; accumulation 2 → windows cross epoch boundaries.
static const char *RECIPE = "model:\n"
                            "  target_model_path: " FX "/target\n"
                            "  draft_model_config: " FX "/tiny-dflash.json\n"
                            "data:\n"
                            "  hidden_states_path: " FX "/data\n"
                            "  max_length: 64\n"
                            "training:\n"
                            "  strategy: dflash\n"
                            "  batch_size: 2\n"
                            "  accumulation_steps: 2\n"
                            "  num_anchors: 4\n"
                            "  loss_decay_gamma: 7.0\n"
                            "  objective_chunk_blocks: 2\n"
                            "  num_epochs: 8\n"
                            "  total_steps: 12\n"
                            "  learning_rate: 1e-3\n"
                            "  warmup_ratio: 0.25\n"
                            "  max_grad_norm: 1.0\n"
                            "  log_interval: 1\n"
                            "  seed: 42\n"
                            "run_id: t\n";

typedef struct {
  char root[256], recipe[300];
} tdir;

static void tdir_open(tdir *d, const char *name) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_trainer_%s_%ld", name, (long)getpid());
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

// Trains d's recipe into <root>/<run> with the given overrides (NULL-terminated).
static df_status train(const tdir *d, const char *run, const char *const *sets, const char *resume,
                       const df_train_hooks *hooks, df_train_summary *s, df_error *err) {
  const char *all[24];
  char out[400];
  snprintf(out, sizeof out, "output_dir=%s/%s", d->root, run);
  int n = 0;
  all[n++] = out;
  for (int i = 0; sets && sets[i]; i++) all[n++] = sets[i];
  char res[400];
  if (resume) snprintf(res, sizeof res, "%s/%s", d->root, resume);
  df_train_options o = {.recipe_path = d->recipe,
                        .overrides = all,
                        .n_overrides = n,
                        .resume = resume ? res : NULL,
                        .threads = 1, // fast on a shared 2-core CI box; the bits compared come from one setting
                        .handle_signals = true,
                        .hooks = hooks};
  omp_set_num_threads(1);
  return df_train(&o, s, err);
}

static void train_ok(const tdir *d, const char *run, const char *const *sets, const char *resume,
                     const df_train_hooks *hooks, df_train_summary *s) {
  df_error err = {0};
  DF_ASSERT_OK(train(d, run, sets, resume, hooks, s, &err), &err);
}

static char *slurp(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  cr_assert(fp, "cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
  buf[n] = 0;
  fclose(fp);
  if (len) *len = (size_t)n;
  return buf;
}

static void expect_same_file(const char *a, const char *b) {
  size_t na, nb;
  char *x = slurp(a, &na), *y = slurp(b, &nb);
  cr_expect(na == nb && !memcmp(x, y, na), "%s and %s differ", a, b);
  free(x), free(y);
}

// metrics.jsonl with the timing fields removed, one canonical line per row.
static json_t *metrics(const tdir *d, const char *run) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", d->root, run);
  FILE *fp = fopen(p, "r");
  cr_assert(fp, "no %s", p);
  json_t *rows = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    cr_assert(o, "bad line in %s: %s", p, je.text);
    df_metrics_strip_timing(o);
    json_array_append_new(rows, o);
  }
  free(line);
  fclose(fp);
  return rows;
}

static void expect_same_run(const tdir *d, const char *a, const char *b, int64_t step) {
  char pa[400], pb[400];
  snprintf(pa, sizeof pa, "%s/%s/checkpoints/step-%08lld/model.safetensors", d->root, a, (long long)step);
  snprintf(pb, sizeof pb, "%s/%s/checkpoints/step-%08lld/model.safetensors", d->root, b, (long long)step);
  expect_same_file(pa, pb);
  json_t *ma = metrics(d, a), *mb = metrics(d, b);
  cr_expect_eq(json_array_size(ma), (size_t)step);
  char *ta = json_dumps(ma, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  char *tb = json_dumps(mb, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  cr_expect_str_eq(ta, tb, "metrics of %s and %s differ", a, b);
  free(ta), free(tb);
  json_decref(ma), json_decref(mb);
}

static bool exists(const tdir *d, const char *rel) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", d->root, rel);
  struct stat sb;
  return lstat(p, &sb) == 0;
}

// ---- bit-exact resume --------------------------------------------------------------------------------------------

static void sigterm_at(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  const int64_t *at = ctx;
  if (step == at[0] && micro == at[1]) raise(SIGTERM);
}

Test(trainer, resume_is_bit_exact) {
  tdir d;
  tdir_open(&d, "resume");
  df_train_summary s;
  const char *every4[] = {"training.save_interval=4", NULL};
  train_ok(&d, "straight", every4, NULL, NULL, &s);
  cr_expect_eq(s.last_step, 12);
  cr_expect_eq(s.horizon, 12);

  // max_steps 6 of a 12-step horizon, then resume to 12 (max_steps may change; total_steps fixes the schedule)
  const char *half[] = {"training.save_interval=4", "training.max_steps=6", NULL};
  train_ok(&d, "split", half, NULL, NULL, &s);
  cr_expect_eq(s.last_step, 6);
  cr_expect(exists(&d, "split/checkpoints/step-00000006"));
  const char *rest[] = {"training.save_interval=4", "training.max_steps=12", NULL};
  train_ok(&d, "split", rest, "split", NULL, &s);
  cr_expect_eq(s.start_step, 6);
  cr_expect_eq(s.last_step, 12);
  expect_same_run(&d, "straight", "split", 12);

  // SIGTERM in the middle of step 5's window: the step completes, a checkpoint is written, the run stops;
  // resuming (from the checkpoint directory this time) continues bit for bit.
  int64_t at[2] = {5, 0};
  df_train_hooks h = {.ctx = at, .after_micro = sigterm_at};
  train_ok(&d, "sig", every4, NULL, &h, &s);
  cr_expect(s.stopped_by_signal);
  cr_expect_eq(s.last_step, 5);
  cr_expect(exists(&d, "sig/checkpoints/step-00000005"));
  train_ok(&d, "sig", every4, "sig/checkpoints/step-00000005", NULL, &s);
  cr_expect_not(s.stopped_by_signal);
  expect_same_run(&d, "straight", "sig", 12);
  tdir_close(&d);
}

// ---- accumulation, clipping, AdamW --------------------------------------------------------------------------------

typedef struct {
  float *grads;
  int64_t n;
  double norm, coef;
} capture;

static void capture_update(void *ctx, int64_t step, const float *grads, int64_t n, double norm, double coef) {
  capture *c = ctx;
  if (step != 1) return;
  c->grads = malloc((size_t)n * sizeof(float));
  memcpy(c->grads, grads, (size_t)n * sizeof(float));
  c->n = n, c->norm = norm, c->coef = coef;
}

// The trainer's first-step gradient with the given overrides (max_steps 1).
static capture first_grads(const tdir *d, const char *run, const char *clip) {
  capture c = {0};
  df_train_hooks h = {.ctx = &c, .before_update = capture_update};
  const char *sets[] = {"training.max_steps=1", clip, NULL};
  df_train_summary s;
  train_ok(d, run, sets, NULL, &h, &s);
  cr_assert(c.grads);
  return c;
}

// The reference: the first two micro-batches run by hand, each d(loss_num) on its own, summed / Σ loss_den.
typedef struct {
  const df_draft_config *cfg;
  df_target_pieces pieces;
  df_ctx *ctx;
  df_draft_model *model;
  df_feed *feed;
  df_dflash_sampler sampler;
  df_strategy_run *run;
} manual;

static void manual_open(manual *m) {
  memset(m, 0, sizeof *m);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(FX "/tiny-dflash.json", &m->cfg, &err), &err);
  df_target_pieces_options po = {.embed_key = "model.embed_tokens.weight",
                                 .lm_head_key = "lm_head.weight",
                                 .expect_vocab = 256,
                                 .expect_hidden = 64};
  DF_ASSERT_OK(df_target_pieces_load(FX "/target", &po, &m->pieces, &err), &err);
  m->ctx = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_draft_model_create(m->cfg, m->ctx, &m->model, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m->model, 42, &err), &err);
  df_feed_options fo = {.path = FX "/data", .batch_size = 2, .max_length = 64, .seed = 42, .world_size = 1};
  DF_ASSERT_OK(df_feed_open(&fo, &m->feed, &err), &err);
  df_dflash_sampler_init(&m->sampler, 42);
  const df_frozen fz = {m->pieces.embed, m->pieces.lm_head, m->pieces.vocab, m->pieces.hidden, DF_F32};
  const df_step_settings set = {.num_anchors = 4, .loss_decay_gamma = 7.0, .mask_token_id = 255, .chunk_blocks = 2};
  DF_ASSERT_OK(df_step_open(m->ctx, m->model, m->cfg, &fz, &set, false, &m->run, &err), &err);
}

static void manual_close(manual *m) {
  df_strategy_close(m->run);
  df_feed_close(m->feed);
  df_draft_model_free(m->model);
  df_ctx_destroy(m->ctx);
  df_target_pieces_free(&m->pieces);
  df_draft_config_free(m->cfg);
}

// One micro-step on the next batch with the trainer's gradient scale (1: d(loss_num)) or the step command's (0:
// d(loss_num / loss_den)); returns loss_den, the gradient in out.
static double manual_micro(manual *m, df_dflash_sampler *s, double grad_scale, float *out, int64_t n) {
  df_error err = {0};
  const df_batch *b;
  DF_ASSERT_OK(df_feed_next(m->feed, &b, NULL, &err), &err);
  df_step_result met;
  DF_ASSERT_OK(df_step_micro_scaled(m->run, b, s, grad_scale, false, &met, &err), &err);
  memcpy(out, df_draft_model_grads(m->model), (size_t)n * sizeof(float));
  double den = met.loss_den;
  df_step_result_free(&met);
  return den;
}

Test(trainer, accumulation_is_the_gradient_of_the_window_ratio) {
  tdir d;
  tdir_open(&d, "accum");
  capture c = first_grads(&d, "run", "training.max_grad_norm=1e9"); // no clipping
  manual m;
  manual_open(&m);
  int64_t n = df_params_numel(df_draft_model_params(m.model));
  cr_assert_eq(n, c.n);
  float *g0 = malloc((size_t)n * sizeof(float)), *g1 = malloc((size_t)n * sizeof(float));
  float *want = malloc((size_t)n * sizeof(float)), *ratio = malloc((size_t)n * sizeof(float));
  df_dflash_sampler s = m.sampler;
  double den0 = manual_micro(&m, &s, 1.0, g0, n);
  double den1 = manual_micro(&m, &s, 1.0, g1, n);
  for (int64_t i = 0; i < n; i++) want[i] = (float)(((double)g0[i] + g1[i]) / (den0 + den1));
  // tolerance: the trainer adds micro-step 1 into micro-step 0's buffer inside the backward (other rounding)
  df_expect_close("window gradient", c.grads, want, n, 1e-5, 1e-8);
  cr_expect(c.coef == 1.0, "no clipping expected, coef %g", c.coef);

  // grad_scale 0 keeps `draftforge step`'s gradient d(num/den): den · it = d(num)
  df_error err = {0};
  DF_ASSERT_OK(df_feed_seek(m.feed, 0, 0, &err), &err);
  df_dflash_sampler s2 = m.sampler;
  double den = manual_micro(&m, &s2, 0.0, ratio, n);
  cr_expect_eq(den, den0);
  for (int64_t i = 0; i < n; i++) ratio[i] *= (float)den;
  df_expect_close("numerator gradient", g0, ratio, n, 1e-5, 1e-8);
  free(g0), free(g1), free(want), free(ratio), free(c.grads);
  manual_close(&m);
  tdir_close(&d);
}

static double norm_of(const float *x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return sqrt(s);
}

Test(trainer, clipping_scales_to_max_grad_norm) {
  tdir d;
  tdir_open(&d, "clip");
  capture big = first_grads(&d, "a", "training.max_grad_norm=1e9");
  capture c = first_grads(&d, "b", "training.max_grad_norm=0.1");
  cr_expect_float_eq(c.norm, big.norm, 1e-12 * big.norm, "grad_norm is the pre-clip norm");
  cr_assert(big.norm > 0.1, "the fixture's gradient norm %g should exceed 0.1", big.norm);
  cr_expect_float_eq(c.coef, 0.1 / (big.norm + 1e-6), 1e-12);
  cr_expect_float_eq(norm_of(c.grads, c.n), 0.1, 1e-6);
  for (int64_t i = 0; i < c.n; i++) big.grads[i] *= (float)c.coef;
  df_expect_close("clipped", c.grads, big.grads, c.n, 1e-6, 0);
  free(big.grads), free(c.grads);
  tdir_close(&d);
}

// First AdamW step from zero moments: p ← p·(1 − lr·wd·flag) − lr·g/(|g| + eps) with the clipped gradient.
Test(trainer, adamw_update_and_weight_decay_flags) {
  tdir d;
  tdir_open(&d, "adamw");
  capture c = {0};
  df_train_hooks h = {.ctx = &c, .before_update = capture_update};
  const char *sets[] = {"training.max_steps=1", "training.warmup_ratio=0", "training.weight_decay=0.1", NULL};
  df_train_summary s;
  train_ok(&d, "run", sets, NULL, &h, &s);
  manual m;
  manual_open(&m); // the same init (seed 42)
  const df_params *t = df_draft_model_params(m.model);
  int64_t n = df_params_numel(t);
  const float *p0 = df_draft_model_weights(m.model);
  float *p1 = malloc((size_t)n * sizeof(float)), *mm = malloc((size_t)n * sizeof(float));
  float *vv = malloc((size_t)n * sizeof(float));
  df_ckpt_contract ct;
  df_ckpt_progress pg;
  df_error err = {0};
  char ck[400];
  snprintf(ck, sizeof ck, "%s/run/checkpoints/step-00000001", d.root);
  DF_ASSERT_OK(df_ckpt_read(ck, t, p1, mm, vv, &ct, &pg, &err), &err);
  cr_expect_eq(pg.adam_step, 1);
  const double lr = 1e-3, wd = 0.1;
  int decayed = 0, plain = 0;
  for (int i = 0; i < df_params_count(t); i++) {
    const df_param *e = df_params_at(t, i);
    if (e->weight_decay)
      decayed++;
    else
      plain++;
    for (int64_t j = e->offset; j < e->offset + e->numel; j++) {
      double g = c.grads[j];
      double want = p0[j] * (1 - lr * (e->weight_decay ? wd : 0)) - lr * g / (fabs(g) + 1e-8);
      cr_assert(fabs(p1[j] - want) <= 1e-6 * lr + 1e-7, "%s[%lld]: %.9g, want %.9g", e->name,
                (long long)(j - e->offset), p1[j], want);
      cr_assert(fabs(mm[j] - 0.1 * g) <= 1e-6 * fabs(g) + 1e-12);
    }
  }
  cr_expect(decayed > 0 && plain > 0, "both decayed (%d) and undecayed (%d) entries", decayed, plain);
  free(p1), free(mm), free(vv), free(c.grads);
  manual_close(&m);
  tdir_close(&d);
}

// ---- NaN / Inf ------------------------------------------------------------------------------------------------

typedef struct {
  int64_t from, to; // poison steps [from, to]
} poison;

static void poison_grads(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  const poison *p = ctx;
  if (step >= p->from && step <= p->to && micro == 1) grads[0] = NAN;
}

Test(trainer, nan_step_is_skipped_and_logged) {
  tdir d;
  tdir_open(&d, "nan");
  poison p = {2, 2};
  df_train_hooks h = {.ctx = &p, .after_micro = poison_grads};
  const char *sets[] = {"training.max_steps=3", "training.save_interval=1", NULL};
  df_train_summary s;
  train_ok(&d, "run", sets, NULL, &h, &s);
  cr_expect_eq(s.last_step, 3);
  cr_expect_eq(s.skipped_steps, 1);
  json_t *rows = metrics(&d, "run");
  cr_assert_eq(json_array_size(rows), 3);
  json_t *r2 = json_array_get(rows, 1);
  cr_expect(json_is_true(json_object_get(r2, "skipped")));
  cr_expect_str_eq(json_string_value(json_object_get(r2, "skip_reason")), "non-finite gradient norm");
  cr_expect(json_is_null(json_object_get(r2, "grad_norm")));
  cr_expect(json_is_false(json_object_get(json_array_get(rows, 2), "skipped")));
  json_decref(rows);
  // the skipped step changed nothing: its checkpoint holds step 1's weights
  char a[400], b[400];
  snprintf(a, sizeof a, "%s/run/checkpoints/step-00000001/model.safetensors", d.root);
  snprintf(b, sizeof b, "%s/run/checkpoints/step-00000002/model.safetensors", d.root);
  expect_same_file(a, b);
  tdir_close(&d);
}

Test(trainer, consecutive_skips_stop_the_run) {
  tdir d;
  tdir_open(&d, "nanstop");
  poison p = {2, 100};
  df_train_hooks h = {.ctx = &p, .after_micro = poison_grads};
  const char *sets[] = {"training.max_consecutive_skips=3", NULL};
  df_train_summary s;
  df_error err = {0};
  cr_assert_eq(train(&d, "run", sets, NULL, &h, &s, &err), DF_ERR_NUMERIC);
  cr_expect_str_eq(err.where, "training.max_consecutive_skips");
  cr_expect(strstr(err.msg, "3 optimizer steps in a row"), "%s", err.msg);
  cr_expect_eq(s.last_step, 4);
  cr_expect(!exists(&d, "run/checkpoints"), "no checkpoint for a stopped run without save_interval");
  tdir_close(&d);
}

static void overflow_weights(void *ctx, int64_t step, float *params, int64_t n) { params[n / 2] = INFINITY; }

Test(trainer, never_a_non_finite_checkpoint) {
  tdir d;
  tdir_open(&d, "inf");
  // an update that overflowed (simulated): the final checkpoint is refused
  df_train_hooks h = {.after_update = overflow_weights};
  const char *sets[] = {"training.max_steps=1", NULL};
  df_train_summary s;
  df_error err = {0};
  cr_assert_eq(train(&d, "run", sets, NULL, &h, &s, &err), DF_ERR_NUMERIC);
  cr_expect(strstr(err.msg, "refusing to checkpoint step 1"), "%s", err.msg);
  cr_expect(!exists(&d, "run/checkpoints/step-00000001"));
  // a rate fp32 cannot hold is refused up front
  const char *huge[] = {"training.learning_rate=1e300", NULL};
  cr_assert_eq(train(&d, "run2", huge, NULL, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.learning_rate");
  tdir_close(&d);
}

// ---- run directory: rotation, resolved recipe, refusals --------------------------------------------------------

Test(trainer, rotation_latest_and_resolved_recipe) {
  tdir d;
  tdir_open(&d, "rot");
  const char *sets[] = {"training.max_steps=6", "training.save_interval=2", "training.max_checkpoints=2", NULL};
  df_train_summary s;
  train_ok(&d, "run", sets, NULL, NULL, &s);
  cr_expect(!exists(&d, "run/checkpoints/step-00000002"));
  cr_expect(exists(&d, "run/checkpoints/step-00000004"));
  cr_expect(exists(&d, "run/checkpoints/step-00000006"));
  char p[400], t[64] = {0};
  snprintf(p, sizeof p, "%s/run/checkpoints/latest", d.root);
  cr_assert(readlink(p, t, sizeof t - 1) > 0);
  cr_expect_str_eq(t, "step-00000006");

  // recipe.resolved.yaml: every key, overrides applied; it loads back to the same values
  snprintf(p, sizeof p, "%s/run/recipe.resolved.yaml", d.root);
  const df_recipe *r;
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_load(p, NULL, &r, &err), &err);
  cr_expect_eq(r->training.max_steps, 6);
  cr_expect_eq(r->training.max_checkpoints, 2);
  cr_expect_eq(r->training.total_steps, 12);
  cr_expect_eq(r->training.learning_rate, 1e-3);
  cr_expect_str_eq(r->model.target_model_path, FX "/target");
  char want[400];
  snprintf(want, sizeof want, "%s/run", d.root);
  cr_expect_str_eq(r->output_dir, want);
  df_recipe_free(r);

  // a fresh run into a directory that holds checkpoints is refused
  cr_expect_eq(train(&d, "run", sets, NULL, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "output_dir");
  cr_expect(strstr(err.hint, "--resume"), "%s", err.hint);
  // nothing to do past the stop: resume at 6 with max_steps 6 returns at once
  train_ok(&d, "run", sets, "run", NULL, &s);
  cr_expect_eq(s.last_step, 6);
  tdir_close(&d);
}

Test(trainer, resume_and_override_errors_name_the_field) {
  tdir d;
  tdir_open(&d, "errors");
  const char *two[] = {"training.max_steps=2", NULL};
  df_train_summary s;
  train_ok(&d, "run", two, NULL, NULL, &s);
  df_error err = {0};
  const char *accum[] = {"training.accumulation_steps=1", "training.max_steps=4", NULL};
  cr_expect_eq(train(&d, "run", accum, "run", NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.accumulation_steps");
  cr_expect(strstr(err.msg, "the run has 2"), "%s", err.msg);
  const char *lr[] = {"training.learning_rate=2e-3", "training.max_steps=4", NULL};
  cr_expect_eq(train(&d, "run", lr, "run", NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.learning_rate");
  // without total_steps the horizon follows max_steps: changing it on resume changes the schedule (the contract)
  const char *h2[] = {"training.total_steps=", "training.max_steps=2", NULL};
  train_ok(&d, "h", h2, NULL, NULL, &s);
  const char *horizon[] = {"training.total_steps=", "training.max_steps=4", NULL};
  cr_expect_eq(train(&d, "h", horizon, "h", NULL, &s, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "horizon"), "%s", err.where);
  const char *bad[] = {"training.max_step=4", NULL};
  cr_expect_eq(train(&d, "x", bad, NULL, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.max_step");
  cr_expect(strstr(err.hint, "did you mean 'max_steps'?"), "%s", err.hint);
  const char *past[] = {"training.max_steps=13", NULL};
  cr_expect_eq(train(&d, "x", past, NULL, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.max_steps");
  cr_expect_eq(train(&d, "x", NULL, "nonexistent", NULL, &s, &err), DF_ERR_IO);
  // training.resume_from works like --resume
  char from[400];
  snprintf(from, sizeof from, "training.resume_from=%s/run", d.root);
  const char *rf[] = {from, "training.max_steps=3", NULL};
  train_ok(&d, "run", rf, NULL, NULL, &s);
  cr_expect_eq(s.start_step, 2);
  cr_expect_eq(s.last_step, 3);
  tdir_close(&d);
}

// ---- warm start, eval ---------------------------------------------------------------------------------------------

// The first step of a warm-started run with the dflash_warm_bs2 parity case's settings sees the same batch,
// anchors and weights as `draftforge step`, so its loss is the fixture's.
Test(trainer, warm_start_first_loss_matches_step_parity) {
  tdir d;
  tdir_open(&d, "warm");
  const char *sets[] = {"model.draft_checkpoint_path=" FX "/draft_ckpt",
                        "training.accumulation_steps=1",
                        "training.num_anchors=5",
                        "training.seed=3",
                        "training.max_steps=1",
                        NULL};
  df_train_summary s;
  train_ok(&d, "run", sets, NULL, NULL, &s);
  cr_expect(fabs(s.last_loss - 8.592004989861268) <= 1e-5 * 8.592004989861268, "loss %.9f", s.last_loss);
  // strict: a directory holding other tensors is refused
  const char *bad[] = {"model.draft_checkpoint_path=" FX "/target", NULL};
  df_error err = {0};
  cr_expect_neq(train(&d, "bad", bad, NULL, NULL, &s, &err), DF_OK);
  tdir_close(&d);
}

Test(trainer, eval_lines_and_best_link) {
  tdir d;
  tdir_open(&d, "eval");
  const char *sets[] = {"training.max_steps=4", "training.eval_interval=2", "data.eval_hidden_states_path=" FX "/data",
                        NULL};
  df_train_summary s;
  train_ok(&d, "run", sets, NULL, NULL, &s);
  json_t *rows = metrics(&d, "run");
  int evals = 0;
  for (size_t i = 0; i < json_array_size(rows); i++) {
    json_t *o = json_array_get(rows, i);
    if (!json_object_get(o, "eval/tau")) continue;
    evals++;
    cr_expect(json_is_number(json_object_get(o, "eval/loss")));
    cr_expect(json_is_number(json_object_get(o, "eval/acc")));
    cr_expect(json_number_value(json_object_get(o, "eval/tau")) >= 1.0);
  }
  cr_expect_eq(evals, 2);
  json_decref(rows);
  cr_expect(exists(&d, "run/checkpoints/best"));
  cr_expect(exists(&d, "run/checkpoints/best.json"));
  // eval needs an eval set
  const char *noset[] = {"training.eval_interval=2", NULL};
  df_error err = {0};
  cr_expect_eq(train(&d, "x", noset, NULL, NULL, &s, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.eval_interval");
  tdir_close(&d);
}

// ---- the command line -----------------------------------------------------------------------------------------

static int run_cli(const char *args, char *out, size_t n) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s train %s --threads 1 2>&1", DF_DRAFTFORGE_BIN, args);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = 0;
  return WEXITSTATUS(pclose(p));
}

Test(trainer, command_line) {
  tdir d;
  tdir_open(&d, "cli");
  char out[16384], args[1000];
  cr_expect_eq(run_cli("", out, sizeof out), 2);
  cr_expect(strstr(out, "RECIPE.yaml is required"), "%s", out);
  cr_expect_eq(run_cli("--help", out, sizeof out), 0);
  cr_expect(strstr(out, "--resume PATH"), "%s", out);
  snprintf(args, sizeof args, "%s --set output_dir=%s/cli --set training.max_steps=2", d.recipe, d.root);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "step 2/2 | ep 1 | loss "), "%s", out);
  cr_expect(strstr(out, "tok/s | ETA "), "%s", out);
  snprintf(args, sizeof args, "%s --set output_dir=%s/cli2 --set training.bogus=1", d.recipe, d.root);
  cr_expect_eq(run_cli(args, out, sizeof out), 2, "a bad --set is a bad argument");
  cr_expect(strstr(out, "unknown key 'bogus' in section 'training'"), "%s", out);
  tdir_close(&d);
}
