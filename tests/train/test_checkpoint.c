// Checkpoints: state.h5 round trip (bit-exact buffers, progress, contract, RNG), the draft as an HF directory,
// contract mismatches naming the field, layout mismatches, rotation / latest / best links, rewind on an
// earlier step, resume-path resolution, and damaged or missing checkpoints.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/draft_config.h"
#include "modeling/draft_model.h"
#include "tests/common/fixture.h"
#include "train/run/ckpt.h"

#define TINY DF_FIXTURE_DIR "/dflash_step/tiny-dflash.json"

typedef struct {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_draft_model *model;
  const df_params *table;
  int64_t numel;
  float *m, *v;
  df_ckpt_contract contract;
  df_ckpt_progress prog;
  char dir[256];
} fx;

static void fx_open(fx *f, const char *name) {
  memset(f, 0, sizeof *f);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(TINY, &f->cfg, &err), &err);
  f->ctx = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_draft_model_create(f->cfg, f->ctx, &f->model, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(f->model, 7, &err), &err);
  f->table = df_draft_model_params(f->model);
  f->numel = df_params_numel(f->table);
  f->m = calloc((size_t)f->numel, sizeof(float));
  f->v = calloc((size_t)f->numel, sizeof(float));
  df_test_fill_uniform(f->m, f->numel, 1, -1, 1);
  df_test_fill_uniform(f->v, f->numel, 2, 0, 1);
  snprintf(f->contract.strategy, sizeof f->contract.strategy, "dflash");
  df_ckpt_config_hash(f->cfg->json, f->contract.draft_config_hash);
  f->contract.nkeys = 2; // the strategy's own keys, by name
  f->contract.keys[0] = (df_ckpt_value){.key = "loss_type", .is_text = true, .text = "dflash"};
  f->contract.keys[1] = (df_ckpt_value){.key = "dpace_alpha", .number = 0.5};
  snprintf(f->contract.lr_scheduler, sizeof f->contract.lr_scheduler, "cosine");
  f->contract.data_size = 6, f->contract.batch_size = 2, f->contract.accumulation_steps = 2;
  f->contract.world_size = 1, f->contract.block_size = 4, f->contract.num_anchors = 4, f->contract.max_length = 64;
  f->contract.mask_token_id = 255, f->contract.seed = 42, f->contract.horizon = 12;
  f->contract.loss_decay_gamma = 7.0, f->contract.learning_rate = 1e-3;
  f->contract.warmup_ratio = 0.25, f->contract.max_grad_norm = 1.0, f->contract.adam_beta1 = 0.9;
  f->contract.adam_beta2 = 0.999, f->contract.adam_eps = 1e-8;
  f->prog = (df_ckpt_progress){.step = 3,
                               .adam_step = 2,
                               .epoch = 1,
                               .cursor = 2,
                               .consecutive_skips = 0,
                               .skipped_steps = 1,
                               .tokens_seen = 777,
                               .last_lr = 9.5e-4,
                               .has_best = true,
                               .best_eval_tau = 1.25,
                               .best_step = 2};
  df_rng_init(&f->prog.anchor_rng, 42, DF_RNG_STREAM_ANCHORS);
  df_rng_next_u64(&f->prog.anchor_rng);
  snprintf(f->dir, sizeof f->dir, "/tmp/df_test_ckpt_%s_%ld", name, (long)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  cr_assert_eq(system(cmd), 0);
}

static void fx_close(fx *f) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  cr_expect_eq(system(cmd), 0);
  free(f->m), free(f->v);
  df_draft_model_free(f->model);
  df_ctx_destroy(f->ctx);
  df_draft_config_free(f->cfg);
}

static df_ckpt_state fx_state(fx *f) {
  return (df_ckpt_state){.table = f->table,
                         .params = df_draft_model_weights(f->model),
                         .exp_avg = f->m,
                         .exp_avg_sq = f->v,
                         .contract = &f->contract,
                         .progress = &f->prog,
                         .draft_config = f->cfg->json,
                         .recipe_yaml = "model: {}\n"};
}

static void write_step(fx *f, int64_t step, int64_t keep) {
  f->prog.step = step;
  df_ckpt_state s = fx_state(f);
  df_error err = {0};
  DF_ASSERT_OK(df_ckpt_write(f->dir, &s, keep, NULL, 0, &err), &err);
}

static bool exists(const char *dir, const char *rel) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  struct stat sb;
  return lstat(p, &sb) == 0;
}

static void expect_link(const char *dir, const char *name, const char *target) {
  char p[512], t[128] = {0};
  snprintf(p, sizeof p, "%s/checkpoints/%s", dir, name);
  ssize_t n = readlink(p, t, sizeof t - 1);
  cr_assert(n > 0, "%s is not a link", p);
  cr_expect_str_eq(t, target);
}

Test(checkpoint, round_trip_is_bit_exact) {
  fx f;
  fx_open(&f, "rt");
  f.prog.step = 3;
  df_ckpt_state s = fx_state(&f);
  df_error err = {0};
  char out[512];
  DF_ASSERT_OK(df_ckpt_write(f.dir, &s, 0, out, sizeof out, &err), &err);
  char want[512];
  snprintf(want, sizeof want, "%s/checkpoints/step-00000003", f.dir);
  cr_expect_str_eq(out, want);
  cr_expect(exists(f.dir, "checkpoints/step-00000003/config.json"));
  cr_expect(exists(f.dir, "checkpoints/step-00000003/model.safetensors"));
  cr_expect(exists(f.dir, "checkpoints/step-00000003/state.h5"));
  expect_link(f.dir, "latest", "step-00000003");

  float *p = malloc((size_t)f.numel * sizeof(float)), *m = malloc((size_t)f.numel * sizeof(float));
  float *v = malloc((size_t)f.numel * sizeof(float));
  df_ckpt_contract c;
  df_ckpt_progress g;
  DF_ASSERT_OK(df_ckpt_read(out, f.table, p, m, v, &c, &g, &err), &err);
  cr_expect_eq(memcmp(p, df_draft_model_weights(f.model), (size_t)f.numel * sizeof(float)), 0);
  cr_expect_eq(memcmp(m, f.m, (size_t)f.numel * sizeof(float)), 0);
  cr_expect_eq(memcmp(v, f.v, (size_t)f.numel * sizeof(float)), 0);
  cr_expect_eq(memcmp(&g.anchor_rng, &f.prog.anchor_rng, sizeof g.anchor_rng), 0);
  cr_expect_eq(g.step, 3);
  cr_expect_eq(g.adam_step, 2);
  cr_expect_eq(g.epoch, 1);
  cr_expect_eq(g.cursor, 2);
  cr_expect_eq(g.skipped_steps, 1);
  cr_expect_eq(g.tokens_seen, 777);
  cr_expect_eq(g.last_lr, 9.5e-4);
  cr_expect(g.has_best);
  cr_expect_eq(g.best_eval_tau, 1.25);
  cr_expect_eq(g.best_step, 2);
  DF_ASSERT_OK(df_ckpt_check_contract(&f.contract, &c, out, &err), &err);

  // the draft half is an HF directory: a strict warm start reads it back exactly
  df_draft_model *m2;
  DF_ASSERT_OK(df_draft_model_create(f.cfg, f.ctx, &m2, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(m2, out, &err), &err);
  cr_expect_eq(memcmp(df_draft_model_weights(m2), p, (size_t)f.numel * sizeof(float)), 0);
  df_draft_model_free(m2);
  const df_draft_config *back;
  char cfgpath[600];
  snprintf(cfgpath, sizeof cfgpath, "%s/config.json", out);
  DF_ASSERT_OK(df_draft_config_from_file(cfgpath, &back, &err), &err);
  cr_expect(json_equal(back->json, f.cfg->json));
  df_draft_config_free(back);
  free(p), free(m), free(v);
  fx_close(&f);
}

Test(checkpoint, contract_mismatch_names_the_field) {
  fx f;
  fx_open(&f, "contract");
  df_ckpt_contract c = f.contract;
  df_error err = {0};
  c.accumulation_steps = 4;
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.accumulation_steps");
  cr_expect(strstr(err.msg, "the checkpoint has 2, this run has 4"), "%s", err.msg);
  c = f.contract;
  c.loss_decay_gamma = 4.0;
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.loss_decay_gamma");
  c = f.contract;
  snprintf(c.draft_config_hash, sizeof c.draft_config_hash, "0123456789abcdef");
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "model.draft_model_config"), "%s", err.where);
  c = f.contract;
  c.world_size = 2; // another number of ranks resumes (the global batch is what must agree)
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_OK);
  c.batch_size = f.contract.batch_size * 2;
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "global batch"), "%s", err.where);
  c = f.contract;
  c.horizon = 13;
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "horizon"), "%s", err.where);
  // the strategy's own keys: a value, its kind, or a key the checkpoint does not record
  c = f.contract;
  c.keys[1].number = 0.25;
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.dpace_alpha");
  cr_expect(strstr(err.msg, "the checkpoint has 0.5, this run has 0.25"), "%s", err.msg);
  c = f.contract;
  snprintf(c.keys[0].text, sizeof c.keys[0].text, "dpace");
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "the checkpoint has 'dflash', this run has 'dpace'"), "%s", err.msg);
  c = f.contract;
  c.keys[c.nkeys++] = (df_ckpt_value){.key = "dspark_l1_loss_alpha", .number = 0.9};
  cr_expect_eq(df_ckpt_check_contract(&c, &f.contract, "CK", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "the checkpoint has no value"), "%s", err.msg);
  fx_close(&f);
}

Test(checkpoint, layout_mismatch_and_damaged_files) {
  fx f;
  fx_open(&f, "layout");
  write_step(&f, 1, 0);
  char ck[512];
  snprintf(ck, sizeof ck, "%s/checkpoints/step-00000001", f.dir);
  // a table with other names
  df_params *t;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&t, &err), &err);
  for (int i = 0; i < df_params_count(f.table); i++) {
    const df_param *e = df_params_at(f.table, i);
    char name[200];
    snprintf(name, sizeof name, "%s%s", i == 3 ? "other." : "", e->name);
    df_param_spec sp = {name, e->role, e->ndim, e->shape, e->dtype, e->trainable, e->weight_decay};
    DF_ASSERT_OK(df_params_add(t, &sp, &err), &err);
  }
  DF_ASSERT_OK(df_params_finalize(t, &err), &err);
  float *p = malloc((size_t)f.numel * sizeof(float)), *m = malloc((size_t)f.numel * sizeof(float));
  float *v = malloc((size_t)f.numel * sizeof(float));
  df_ckpt_contract c;
  df_ckpt_progress g;
  cr_expect_eq(df_ckpt_read(ck, t, p, m, v, &c, &g, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "other."), "%s", err.msg);
  df_params_free(t);
  // not a checkpoint / a damaged state file
  cr_expect_eq(df_ckpt_read("/nonexistent", f.table, p, m, v, &c, &g, &err), DF_ERR_IO);
  char st[600];
  snprintf(st, sizeof st, "%s/state.h5", ck);
  FILE *fp = fopen(st, "w");
  fputs("not hdf5", fp);
  fclose(fp);
  // a damaged state.h5 is called damaged (not "pass a checkpoint directory": it is one) and points at the
  // earlier checkpoints
  cr_expect_eq(df_ckpt_read(ck, f.table, p, m, v, &c, &g, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "is damaged"), "%s", err.msg);
  cr_expect(strstr(err.hint, "--resume auto") && !strstr(err.hint, "pass a checkpoint directory"), "%s", err.hint);
  free(p), free(m), free(v);
  fx_close(&f);
}

Test(checkpoint, rotation_latest_best_and_rewind) {
  fx f;
  fx_open(&f, "rot");
  df_error err = {0};
  write_step(&f, 1, 2);
  write_step(&f, 2, 2);
  DF_ASSERT_OK(df_ckpt_mark_best(f.dir, 2, "eval/tau", 1.5, &err), &err);
  for (int s = 3; s <= 5; s++) write_step(&f, s, 2);
  cr_expect(!exists(f.dir, "checkpoints/step-00000001"));
  cr_expect(exists(f.dir, "checkpoints/step-00000002"), "the best checkpoint survives rotation");
  cr_expect(!exists(f.dir, "checkpoints/step-00000003"));
  cr_expect(exists(f.dir, "checkpoints/step-00000004"));
  cr_expect(exists(f.dir, "checkpoints/step-00000005"));
  expect_link(f.dir, "latest", "step-00000005");
  expect_link(f.dir, "best", "step-00000002");
  cr_expect(exists(f.dir, "checkpoints/best.json"));
  int64_t *steps;
  int n;
  DF_ASSERT_OK(df_ckpt_list(f.dir, &steps, &n, &err), &err);
  cr_assert_eq(n, 3);
  cr_expect(steps[0] == 2 && steps[1] == 4 && steps[2] == 5);
  free(steps);
  // a resumed run saving step 2 again drops the old run's steps >= 2 (and the best link to them)
  write_step(&f, 2, 0);
  cr_expect(exists(f.dir, "checkpoints/step-00000002"));
  cr_expect(!exists(f.dir, "checkpoints/step-00000004"));
  cr_expect(!exists(f.dir, "checkpoints/step-00000005"));
  cr_expect(!exists(f.dir, "checkpoints/best"));
  expect_link(f.dir, "latest", "step-00000002");
  fx_close(&f);
}

Test(checkpoint, resolve_resume_paths) {
  fx f;
  fx_open(&f, "resolve");
  df_error err = {0};
  char out[600], want[600];
  cr_expect_eq(df_ckpt_resolve(f.dir, out, sizeof out, &err), DF_ERR_IO); // no run yet
  write_step(&f, 4, 0);
  write_step(&f, 8, 0);
  snprintf(want, sizeof want, "%s/checkpoints/step-00000008", f.dir);
  DF_ASSERT_OK(df_ckpt_resolve(f.dir, out, sizeof out, &err), &err); // run directory → latest
  cr_expect_str_eq(out, want);
  char ckdir[600];
  snprintf(ckdir, sizeof ckdir, "%s/checkpoints", f.dir);
  DF_ASSERT_OK(df_ckpt_resolve(ckdir, out, sizeof out, &err), &err);
  cr_expect_str_eq(out, want);
  snprintf(want, sizeof want, "%s/checkpoints/step-00000004", f.dir);
  DF_ASSERT_OK(df_ckpt_resolve(want, out, sizeof out, &err), &err); // one checkpoint
  cr_expect_str_eq(out, want);
  char st[700];
  snprintf(st, sizeof st, "%s/state.h5", want);
  DF_ASSERT_OK(df_ckpt_resolve(st, out, sizeof out, &err), &err);
  cr_expect_str_eq(out, want);
  // without a latest link: the highest complete step; an incomplete directory and temporaries are ignored
  char p[700];
  snprintf(p, sizeof p, "%s/checkpoints/latest", f.dir);
  cr_assert_eq(remove(p), 0);
  snprintf(p, sizeof p, "%s/checkpoints/step-00000009", f.dir);
  cr_assert_eq(mkdir(p, 0777), 0);
  snprintf(p, sizeof p, "%s/checkpoints/.tmp-step-00000010.1", f.dir);
  cr_assert_eq(mkdir(p, 0777), 0);
  snprintf(want, sizeof want, "%s/checkpoints/step-00000008", f.dir);
  DF_ASSERT_OK(df_ckpt_resolve(f.dir, out, sizeof out, &err), &err);
  cr_expect_str_eq(out, want);
  cr_expect_eq(df_ckpt_resolve("/nonexistent/run", out, sizeof out, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "/nonexistent/run");
  fx_close(&f);
}
