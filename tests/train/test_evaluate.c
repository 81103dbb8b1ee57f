// Held-out evaluation: the report does not depend on the batch size, is deterministic, its counts agree with
// each other and with the data; the failing inputs; and `draftforge eval` on a checkpoint and on its export.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/target_pieces.h"
#include "tests/common/fixture.h"
#include "train/evaluate.h"
#include "train/hidden_states.h"

#define STEP_DIR DF_FIXTURE_DIR "/dflash_step"
#define DATA     STEP_DIR "/data"

typedef struct {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_dflash_model *m;
  df_target_pieces tp;
  df_step_frozen fz;
} setup;

static setup load(void) {
  setup s = {0};
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(STEP_DIR "/draft_ckpt/config.json", &s.cfg, &err), &err);
  s.ctx = df_test_cpu_ctx(2);
  DF_ASSERT_OK(df_dflash_model_create(s.cfg, s.ctx, &s.m, &err), &err);
  DF_ASSERT_OK(df_dflash_model_load(s.m, STEP_DIR "/draft_ckpt", &err), &err);
  df_target_pieces_options o = {.expect_vocab = 256, .expect_hidden = 64};
  DF_ASSERT_OK(df_target_pieces_load(STEP_DIR "/target", &o, &s.tp, &err), &err);
  s.fz = (df_step_frozen){s.tp.embed, s.tp.lm_head, s.tp.vocab, s.tp.hidden};
  return s;
}

static void unload(setup *s) {
  df_dflash_model_free(s->m);
  df_ctx_destroy(s->ctx);
  df_target_pieces_free(&s->tp);
  df_draft_config_free(s->cfg);
}

static df_eval_options opts(int64_t batch) {
  return (df_eval_options){.batch_size = batch,
                           .max_length = 40,
                           .num_anchors = 3,
                           .loss_decay_gamma = 7.0,
                           .mask_token_id = 255,
                           .chunk_blocks = 2,
                           .seed = 11};
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
    want_blocks += c < o.num_anchors ? c : o.num_anchors;
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
  o.mask_token_id = 256;
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DATA, &o, &r, &err), DF_ERR_INVALID, "mask token >= V");
  o = opts(0);
  cr_expect_eq(df_evaluate(s.ctx, s.m, s.cfg, &s.fz, DATA, &o, &r, &err), DF_ERR_INVALID, "batch size 0");
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
