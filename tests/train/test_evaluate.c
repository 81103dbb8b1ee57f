// Held-out evaluation: the report does not depend on the batch size, is deterministic, its counts agree with
// each other and with the data; the failing inputs; DSpark drafts (the DSpark objective, forward only: the
// α-weighted loss, equal to the step's forward on the same anchors, no gradient, the teacher read when needed);
// and `draftforge eval` on a checkpoint and on its export.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/target_pieces.h"
#include "tests/common/fixture.h"
#include "train/data/batch.h"
#include "train/data/hs.h"
#include "train/eval/evaluate.h"

#define STEP_DIR DF_FIXTURE_DIR "/dflash_step"
#define DATA     STEP_DIR "/data"

typedef struct {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_draft_model *m;
  df_target_pieces tp;
  df_frozen fz;
} setup;

static setup load(void) {
  setup s = {0};
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(STEP_DIR "/draft_ckpt/config.json", &s.cfg, &err), &err);
  s.ctx = df_test_cpu_ctx(2);
  DF_ASSERT_OK(df_draft_model_create(s.cfg, s.ctx, &s.m, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(s.m, STEP_DIR "/draft_ckpt", &err), &err);
  df_target_pieces_options o = {.expect_vocab = 256, .expect_hidden = 64};
  DF_ASSERT_OK(df_target_pieces_load(STEP_DIR "/target", &o, &s.tp, &err), &err);
  s.fz = (df_frozen){s.tp.embed, s.tp.lm_head, s.tp.vocab, s.tp.hidden, DF_F32};
  return s;
}

static void unload(setup *s) {
  df_draft_model_free(s->m);
  df_ctx_destroy(s->ctx);
  df_target_pieces_free(&s->tp);
  df_draft_config_free(s->cfg);
}

static df_eval_options opts(int64_t batch) {
  return (df_eval_options){.batch_size = batch,
                           .max_length = 40,
                           .seed = 11,
                           .set = {.num_anchors = 3, .loss_decay_gamma = 7.0, .mask_token_id = 255, .chunk_blocks = 2}};
}

// A number of the strategy's report (NaN when null or absent).
static double rep_num(const df_eval_report *r, const char *key) {
  json_t *v = json_object_get(r->report, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static df_eval_report run(setup *s, const df_eval_options *o) {
  df_eval_report r;
  df_error err = {0};
  DF_ASSERT_OK(df_evaluate(s->ctx, s->m, s->cfg, &s->fz, DATA, o, &r, &err), &err);
  return r;
}

static void expect_same_counts(const df_eval_report *a, const df_eval_report *b, const char *what) {
  cr_expect_eq(a->num_samples, b->num_samples, "%s: samples", what);
  cr_expect_eq(a->num_blocks, b->num_blocks, "%s: blocks", what);
  cr_expect_eq(a->acc_num, b->acc_num, "%s: acc_num", what);
  cr_expect_eq(a->acc_den, b->acc_den, "%s: acc_den", what);
  cr_expect_eq(a->accept_len_sum, b->accept_len_sum, "%s: accept_len_sum", what);
  cr_expect_eq(a->loss_den, b->loss_den, "%s: loss_den", what);
  for (int64_t k = 0; k < a->block_size; k++) {
    cr_expect_eq(a->pos_acc_num[k], b->pos_acc_num[k], "%s: pos_acc_num[%lld]", what, (long long)k);
    cr_expect_eq(a->pos_acc_den[k], b->pos_acc_den[k], "%s: pos_acc_den[%lld]", what, (long long)k);
  }
}

Test(evaluate, report_does_not_depend_on_the_batch_size) {
  setup s = load();
  df_eval_options o1 = opts(1);
  df_eval_report ref = run(&s, &o1);
  cr_expect_eq(ref.num_samples, 6);
  cr_expect_eq(ref.num_batches, 6);
  for (int64_t B = 2; B <= 6; B += 2) { // 4 leaves a partial last batch: nothing is dropped
    df_eval_options o = opts(B);
    df_eval_report r = run(&s, &o);
    expect_same_counts(&ref, &r, "batch size");
    cr_expect_eq(r.num_batches, (6 + B - 1) / B);
    cr_expect(fabs(r.loss - ref.loss) <= 1e-5 * fabs(ref.loss), "loss %.9g vs %.9g at batch %lld", r.loss, ref.loss,
              (long long)B);
    df_eval_report_free(&r);
  }
  df_eval_report_free(&ref);
  unload(&s);
}

Test(evaluate, deterministic_and_seeded) {
  setup s = load();
  df_eval_options o = opts(3);
  df_eval_report a = run(&s, &o), b = run(&s, &o);
  expect_same_counts(&a, &b, "rerun");
  cr_expect_eq(a.loss, b.loss, "bit-identical loss on a rerun");
  o.seed = 12;
  df_eval_report c = run(&s, &o);
  cr_expect_neq(a.loss, c.loss, "another seed draws other anchors");
  df_eval_report_free(&a), df_eval_report_free(&b), df_eval_report_free(&c);
  unload(&s);
}

// Blocks per sample = min(num_anchors, candidates); per-position counts add up to acc; 1 <= τ <= bs.
Test(evaluate, counts_agree_with_the_data) {
  setup s = load();
  df_eval_options o = opts(4);
  df_eval_report r = run(&s, &o);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(DATA, &ds, &err), &err);
  int64_t want_blocks = 0;
  for (int64_t i = 0; i < 6; i++) {
    int64_t len;
    DF_ASSERT_OK(df_hs_sample_length(ds, i, &len, &err), &err);
    if (len > o.max_length) len = o.max_length;
    uint8_t mask[64];
    df_hs_sample_bufs bufs = {NULL, mask, NULL, NULL};
    int64_t got;
    DF_ASSERT_OK(df_hs_read_sample(ds, i, len, &bufs, &got, &err), &err);
    int64_t c = 0;
    for (int64_t p = 0; p + 1 < len; p++) c += mask[p] && mask[p + 1];
    want_blocks += c < o.set.num_anchors ? c : o.set.num_anchors;
  }
  df_hs_close(ds);
  cr_expect_eq(r.num_blocks, want_blocks);
  double num = 0, den = 0;
  for (int64_t k = 0; k < r.block_size; k++) num += r.pos_acc_num[k], den += r.pos_acc_den[k];
  cr_expect_eq(num, r.acc_num);
  cr_expect_eq(den, r.acc_den);
  cr_expect_eq(r.pos_acc_den[0], 0, "slot 0 is the anchor token: never supervised");
  cr_expect(r.accept_len >= 1 && r.accept_len <= (double)r.block_size, "τ = %g", r.accept_len);
  cr_expect(isfinite(r.loss) && r.loss > 0, "loss %g", r.loss);
  cr_expect_eq(r.acc, r.acc_num / r.acc_den);
  o.max_samples = 2;
  df_eval_report two = run(&s, &o);
  cr_expect_eq(two.num_samples, 2);
  df_eval_report_free(&two);
  df_eval_report_free(&r);
  unload(&s);
}

Test(evaluate, failing_inputs) {
  setup s = load();
  df_eval_report r;
  df_error err = {0};
  df_eval_options o = opts(2);
  cr_expect_neq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, "/nonexistent/eval.h5", &o, &r, &err), DF_OK);
  cr_expect(strstr(err.where, "/nonexistent/eval.h5") != NULL, "where: %s", err.where);
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DF_FIXTURE_DIR "/hidden_states/h5py_f32.h5", &o, &r, &err),
               DF_ERR_INVALID, "data captured for another draft");
  o.set.mask_token_id = 256;
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DATA, &o, &r, &err), DF_ERR_INVALID, "mask token >= V");
  o = opts(0);
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DATA, &o, &r, &err), DF_ERR_INVALID, "batch size 0");
  unload(&s);
}

// ---- DSpark drafts ----------------------------------------------------------------------------------------------

#define DSPARK_DIR  DF_FIXTURE_DIR "/dspark_step"
#define DSPARK_DATA DSPARK_DIR "/data" // with target_last_hidden_states

// ckpt_rnn: rnn Markov head (r = 8), confidence head on h, large head weights.
static setup load_dspark(void) {
  setup s = {0};
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(DSPARK_DIR "/ckpt_rnn/config.json", &s.cfg, &err), &err);
  cr_assert_eq(s.cfg->kind, DF_DRAFT_DSPARK);
  s.ctx = df_test_cpu_ctx(2);
  DF_ASSERT_OK(df_draft_model_create(s.cfg, s.ctx, &s.m, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(s.m, DSPARK_DIR "/ckpt_rnn", &err), &err);
  df_target_pieces_options o = {.expect_vocab = 256, .expect_hidden = 64};
  DF_ASSERT_OK(df_target_pieces_load(STEP_DIR "/target", &o, &s.tp, &err), &err);
  s.fz = (df_frozen){s.tp.embed, s.tp.lm_head, s.tp.vocab, s.tp.hidden, DF_F32};
  return s;
}

// The DSpark loss weights of these tests (the strategy's own keys).
static df_strategy_value DSPARK_ALPHAS[] = {{"dspark_ce_loss_alpha", 0.3, NULL},
                                            {"dspark_l1_loss_alpha", 0.7, NULL},
                                            {"dspark_confidence_head_alpha", 2.0, NULL}};
static df_strategy_value_list DSPARK_LIST = {DSPARK_ALPHAS, 3};
static df_strategy_values dspark_values;

static df_eval_options dspark_opts(int64_t batch) {
  df_eval_options o = opts(batch);
  o.set.loss_decay_gamma = 4.0;
  dspark_values = df_strategy_values_of_list(&DSPARK_LIST);
  o.set.values = &dspark_values;
  return o;
}

static df_eval_report run_on(setup *s, const char *data, const df_eval_options *o) {
  df_eval_report r;
  df_error err = {0};
  DF_ASSERT_OK(df_evaluate(s->ctx, s->m, s->cfg, &s->fz, data, o, &r, &err), &err);
  return r;
}

static void expect_same_dspark(const df_eval_report *a, const df_eval_report *b, double rel, const char *what) {
  expect_same_counts(a, b, what);
  const char *keys[] = {"ce_loss", "l1_loss", "confidence_loss", "tau_probabilistic"};
  const double x[] = {a->loss,      rep_num(a, keys[0]), rep_num(a, keys[1]), rep_num(a, keys[2]), rep_num(a, keys[3]),
                      a->accept_len};
  const double y[] = {b->loss,      rep_num(b, keys[0]), rep_num(b, keys[1]), rep_num(b, keys[2]), rep_num(b, keys[3]),
                      b->accept_len};
  for (size_t i = 0; i < sizeof x / sizeof *x; i++)
    cr_expect(fabs(x[i] - y[i]) <= rel * fabs(x[i]), "%s: metric %zu %.12g vs %.12g", what, i, x[i], y[i]);
}

Test(evaluate, dspark_is_deterministic_and_independent_of_the_batch_size) {
  setup s = load_dspark();
  df_eval_options o1 = dspark_opts(1);
  df_eval_report ref = run_on(&s, DSPARK_DATA, &o1), again = run_on(&s, DSPARK_DATA, &o1);
  cr_expect_str_eq(ref.strategy, "dspark");
  cr_expect(isfinite(rep_num(&ref, "tau_probabilistic")) && isfinite(rep_num(&ref, "confidence_loss")),
            "the teacher and the confidence head ran");
  expect_same_dspark(&ref, &again, 0.0, "rerun");
  cr_expect_eq(ref.loss, again.loss, "bit-identical on a rerun");
  cr_expect_eq(ref.num_samples, 6);
  cr_expect(ref.pos_acc_den[0] > 0, "DSpark slot 0 predicts the token after the anchor");
  for (int64_t B = 2; B <= 6; B += 2) {
    df_eval_options o = dspark_opts(B);
    df_eval_report r = run_on(&s, DSPARK_DATA, &o);
    expect_same_dspark(&ref, &r, 1e-5, "batch size");
    cr_expect_eq(r.num_batches, (6 + B - 1) / B);
    df_eval_report_free(&r);
  }
  df_eval_options o = dspark_opts(3);
  o.seed = 12;
  df_eval_report c = run_on(&s, DSPARK_DATA, &o);
  cr_expect_neq(c.loss, ref.loss, "another seed draws other anchors");
  df_eval_report_free(&c), df_eval_report_free(&again), df_eval_report_free(&ref);
  unload(&s);
}

// The report's loss is the α-weighted ratio of the objective's terms (nothing else, e.g. no aux loss, added);
// ratios and counts agree; and the weights and gradients of the model are untouched.
Test(evaluate, dspark_loss_is_the_alpha_weighted_ratio_and_writes_no_gradient) {
  setup s = load_dspark();
  const df_params *p = df_draft_model_params(s.m);
  int64_t n = df_params_numel(p);
  float *g = df_draft_model_grads(s.m), *w0 = malloc((size_t)n * sizeof *w0);
  for (int64_t i = 0; i < n; i++) g[i] = 0.25f + (float)(i % 7);
  memcpy(w0, df_draft_model_weights(s.m), (size_t)n * sizeof *w0);
  df_eval_options o = dspark_opts(4);
  df_eval_report r = run_on(&s, DSPARK_DATA, &o);
  int64_t changed = 0;
  for (int64_t i = 0; i < n; i++) changed += g[i] != 0.25f + (float)(i % 7);
  cr_expect_eq(changed, 0, "eval writes no gradient (%lld changed)", (long long)changed);
  cr_expect_arr_eq(w0, df_draft_model_weights(s.m), (size_t)n * sizeof *w0, "weights untouched");
  double want = 0.3 * rep_num(&r, "ce_num") + 0.7 * rep_num(&r, "l1_num") + 2.0 * rep_num(&r, "confidence_num");
  cr_expect(fabs(r.loss_num - want) <= 1e-9 * fabs(want), "loss_num %.12g = Σ α·term %.12g", r.loss_num, want);
  cr_expect_eq(r.loss, r.loss_num / r.loss_den);
  cr_expect_eq(rep_num(&r, "ce_loss"), rep_num(&r, "ce_num") / r.loss_den);
  cr_expect_eq(rep_num(&r, "tau_probabilistic"), rep_num(&r, "tau_num") / rep_num(&r, "tau_den"));
  cr_expect_eq(r.acc, r.acc_num / r.acc_den);
  double num = 0, den = 0;
  for (int64_t k = 0; k < r.block_size; k++) num += r.pos_acc_num[k], den += r.pos_acc_den[k];
  cr_expect_eq(num, r.acc_num);
  cr_expect_eq(den, r.acc_den);
  cr_expect(r.accept_len >= 1 && r.accept_len <= (double)r.block_size + 1, "τ %g", r.accept_len);
  const double tp = rep_num(&r, "tau_probabilistic");
  cr_expect(tp >= 1 && tp <= (double)r.block_size + 1, "tau_prob %g", tp);
  df_eval_report_free(&r);
  free(w0);
  unload(&s);
}

// Eval with batch size 1 draws sample i's anchors from seed + i, so df_step_micro on the one-sample batch i with
// a sampler seeded seed + i sees the same blocks: its forward metrics, summed over the samples, are the report.
Test(evaluate, dspark_equals_the_step_forward_on_the_same_anchors) {
  setup s = load_dspark();
  df_eval_options o = dspark_opts(1);
  df_eval_report r = run_on(&s, DSPARK_DATA, &o);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(DSPARK_DATA, &ds, &err), &err);
  df_strategy_run *run;
  DF_ASSERT_OK(df_step_open(s.ctx, s.m, s.cfg, &s.fz, &o.set, false, &run, &err), &err);
  double loss_num = 0, loss_den = 0, acc_num = 0, acc_den = 0, greedy = 0, tau_num = 0, tau_den = 0, ce = 0;
  int64_t blocks = 0;
  for (int64_t i = 0; i < 6; i++) {
    df_batch bt;
    DF_ASSERT_OK(df_batch_read_ex(ds, &i, 1, o.max_length, true, &bt, &err), &err);
    int64_t c = 0;
    for (int64_t q = 0; q + 1 < bt.length[0]; q++) c += bt.loss_mask[q] && bt.loss_mask[q + 1];
    if (c > 0) {
      df_dflash_sampler smp;
      df_dflash_sampler_init(&smp, o.seed + (uint64_t)i);
      df_step_result met;
      DF_ASSERT_OK(df_step_micro(run, &bt, &smp, &met, &err), &err);
      json_t *j = met.report;
      loss_num += met.loss_num, loss_den += met.loss_den, acc_num += met.acc_num, acc_den += met.acc_den;
      greedy += met.metrics.accept_sum, blocks += met.num_blocks;
      tau_num += json_number_value(json_object_get(j, "tau_num"));
      tau_den += json_number_value(json_object_get(j, "tau_den"));
      ce += json_number_value(json_object_get(j, "ce_num"));
      cr_expect_eq(met.aux_loss, 0.0, "a dense draft has no aux loss");
      df_step_result_free(&met);
    }
    df_batch_free(&bt);
  }
  df_strategy_close(run);
  df_hs_close(ds);
  cr_expect_eq(r.num_blocks, blocks);
  cr_expect_eq(r.loss_den, loss_den);
  cr_expect_eq(r.acc_num, acc_num);
  cr_expect_eq(r.acc_den, acc_den);
  cr_expect_eq(r.accept_len_sum, greedy);
  cr_expect_eq(rep_num(&r, "tau_den"), tau_den);
  cr_expect(fabs(r.loss_num - loss_num) <= 1e-12 * fabs(loss_num), "loss_num %.15g vs step %.15g", r.loss_num,
            loss_num);
  cr_expect(fabs(rep_num(&r, "ce_num") - ce) <= 1e-12 * fabs(ce), "ce_num %.15g vs step %.15g", rep_num(&r, "ce_num"),
            ce);
  cr_expect(fabs(rep_num(&r, "tau_num") - tau_num) <= 1e-12 * fabs(tau_num), "tau_num %.15g vs step %.15g",
            rep_num(&r, "tau_num"), tau_num);
  cr_expect(fabs(r.loss - loss_num / loss_den) <= 1e-12 * r.loss, "loss %.15g", r.loss);
  df_eval_report_free(&r);
  unload(&s);
}

// The teacher is read only when the objective needs it: without the L1 term and the confidence term, data
// without target_last_hidden_states evaluates (teacher metrics NaN); with them it fails naming the dataset.
Test(evaluate, dspark_reads_the_teacher_only_when_needed) {
  setup s = load_dspark();
  df_eval_options o = dspark_opts(2);
  df_eval_report r;
  df_error err = {0};
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DATA, &o, &r, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "target_last_hidden_states");
  df_strategy_value ce_only[] = {{"dspark_ce_loss_alpha", 0.3, NULL},
                                 {"dspark_l1_loss_alpha", 0, NULL},
                                 {"dspark_confidence_head_alpha", 0, NULL}};
  df_strategy_value_list l = {ce_only, 3};
  df_strategy_values v = df_strategy_values_of_list(&l);
  o.set.values = &v;
  r = run_on(&s, DATA, &o);
  cr_expect(isnan(rep_num(&r, "tau_probabilistic")) && isnan(rep_num(&r, "l1_loss")) &&
                isnan(rep_num(&r, "confidence_loss")),
            "no teacher, no confidence term");
  cr_expect(isfinite(r.loss) && isfinite(rep_num(&r, "ce_loss")) && r.loss > 0);
  cr_expect(fabs(r.loss - 0.3 * rep_num(&r, "ce_loss")) <= 1e-12 * r.loss, "CE alone: loss %.12g", r.loss);
  df_eval_report_free(&r);
  unload(&s);
}

// ---- the command line ---------------------------------------------------------------------------------------

static json_t *run_cli(const char *ckpt, const char *extra, const char *out, int want_rc) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s eval %s --recipe %s/recipes/tiny-step.yaml --out %s %s > %s.log 2>&1",
           DF_DRAFTFORGE_BIN, ckpt, DF_SOURCE_DIR, out, extra, out);
  int rc = system(cmd);
  cr_assert_eq(WEXITSTATUS(rc), want_rc, "%s", cmd);
  return want_rc ? NULL : json_load_file(out, 0, NULL);
}

Test(evaluate, cli_on_a_checkpoint_and_its_export) {
  char dir[] = "/tmp/df_eval_test_XXXXXX", out[128], exp[128], cmd[1024];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(out, sizeof out, "%s/ckpt.json", dir);
  json_t *a = run_cli(STEP_DIR "/draft_ckpt", "--data " DATA, out, 0);
  cr_assert_not_null(a, "report %s", out);
  cr_expect(json_is_real(json_object_get(a, "loss")));
  cr_expect(json_is_real(json_object_get(a, "acc")));
  cr_expect(json_is_real(json_object_get(a, "accept_len")));
  cr_expect_eq(json_array_size(json_object_get(a, "per_position_acc")), 4);
  cr_expect_eq(json_integer_value(json_object_get(a, "num_samples")), 6);

  snprintf(exp, sizeof exp, "%s/export", dir);
  snprintf(cmd, sizeof cmd, "%s export %s/draft_ckpt --out %s --dtype float32 > /dev/null", DF_DRAFTFORGE_BIN, STEP_DIR,
           exp);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  snprintf(out, sizeof out, "%s/export.json", dir);
  json_t *b = run_cli(exp, "--data " DATA, out, 0);
  cr_expect_eq(json_real_value(json_object_get(a, "loss")), json_real_value(json_object_get(b, "loss")),
               "a float32 export evaluates exactly like its checkpoint");
  cr_expect(json_equal(json_object_get(a, "per_position_acc"), json_object_get(b, "per_position_acc")));

  snprintf(out, sizeof out, "%s/bad.json", dir);
  run_cli(exp, "--data /nonexistent/eval.h5", out, 1);
  json_decref(a), json_decref(b);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_expect_eq(system(cmd), 0);
}
