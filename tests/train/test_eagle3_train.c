// EAGLE-3 through the trainer on the eagle3_step fixtures: the first step's loss is the step-parity loss (a warm
// start whose stale mapping the data's replaces), the mapping is cached at model.vocab_mapping_path and read back by
// the next run, resume is bit exact (accumulation, LK lambda), and the export is the layout SGLang and vLLM load
// (draftforge inspect finds no problem; the weights are the checkpoint's).
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/safetensors.h"
#include "tests/common/fixture.h"
#include "tests/common/train_run.h"
#include "train/export/export.h"
#include "train/export/inspect_export.h"

#define EFX DF_FIXTURE_DIR "/eagle3_step"

typedef df_test_dir tdir;

static void tdir_open(tdir *d, const char *name, const char *training) {
  char tag[64];
  snprintf(tag, sizeof tag, "eagle3_train_%s", name);
  FILE *fp = df_test_dir_open(d, tag);
  fprintf(fp,
          "model:\n  target_model_path: " EFX "/target\n  draft_model_config: " EFX "/eagle3.json\n"
          "  vocab_mapping_path: %s/vocab.safetensors\n"
          "data:\n  hidden_states_path: " EFX "/data\n  max_length: 64\n"
          "training:\n  strategy: eagle3\n  learning_rate: 1e-3\n  max_grad_norm: 1.0\n  log_interval: 1\n%s"
          "run_id: t\n",
          d->root, training);
  fclose(fp);
}

Test(eagle3_train, first_step_is_the_step_parity_loss_and_the_mapping_is_cached) {
  tdir d;
  tdir_open(&d, "first", "  batch_size: 4\n  ttt_length: 1\n  seed: 42\n  max_steps: 1\n");
  df_train_summary s;
  const char *warm[] = {"model.draft_checkpoint_path=" EFX "/draft_ckpt", NULL};
  df_test_train_ok(&d, "a", warm, NULL, &s);
  json_t *m = df_test_metrics(&d, "a");
  const double loss = json_number_value(json_object_get(json_array_get(m, 0), "loss"));
  cr_expect(fabs(loss - 2.170304501) < 1e-6 * 2.17, "step 1 loss %.9f, the ttt1_kl_warm case's 2.170304501", loss);
  json_decref(m);
  // the cached mapping is SpecForge's (the fixture's vocab.safetensors) and the next run reads it
  char p[400];
  snprintf(p, sizeof p, "%s/vocab.safetensors", d.root);
  df_st_file *got = NULL, *want = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open(p, &got, &err), &err);
  DF_ASSERT_OK(df_st_open(EFX "/ttt1_kl_warm/expected/vocab.safetensors", &want, &err), &err);
  float a[256], b[256];
  DF_ASSERT_OK(df_st_read_f32(got, df_st_find(got, "d2t"), a, 64, &err), &err);
  DF_ASSERT_OK(df_st_read_f32(want, df_st_find(want, "d2t"), b, 64, &err), &err);
  cr_expect_eq(memcmp(a, b, sizeof(float) * 64), 0, "the cached d2t is SpecForge's");
  df_st_close(got), df_st_close(want);
  // a mapping file that is not one: refused naming the key, before the first step
  FILE *fp = fopen(p, "w");
  fputs("not safetensors", fp);
  fclose(fp);
  const char *all[] = {"output_dir=/tmp/df_test_eagle3_never", "model.draft_checkpoint_path=" EFX "/draft_ckpt"};
  df_train_options o = {.recipe_path = d.recipe, .overrides = all, .n_overrides = 2, .threads = 1};
  cr_expect_neq(df_train(&o, &s, &err), DF_OK, "a broken mapping file fails the run");
  cr_expect(strstr(err.where, "vocab.safetensors") != NULL, "%s [%s]", err.msg, err.where);
  // a safetensors mapping that is not one mapping: a target id out of order, then t2d selecting one id too many
  int64_t d2t[64];
  uint8_t t2d[256] = {0};
  for (int64_t i = 0; i < 64; i++) d2t[i] = i, t2d[2 * i] = 1; // draft id i is target id 2i
  for (int bad = 0; bad < 2; bad++) {
    if (bad == 0) d2t[5] = 2; // target id 7, after 8
    if (bad == 1) d2t[5] = 5, t2d[1] = 1;
    df_st_writer *w;
    DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
    const int64_t dn = 64, vn = 256;
    DF_ASSERT_OK(df_st_writer_add(w, "d2t", DF_ST_I64, 1, &dn, d2t, &err), &err);
    DF_ASSERT_OK(df_st_writer_add(w, "t2d", DF_ST_BOOL, 1, &vn, t2d, &err), &err);
    DF_ASSERT_OK(df_st_writer_write(w, p, &err), &err);
    df_st_writer_free(w);
    err = (df_error){0};
    cr_expect_eq(df_train(&o, &s, &err), DF_ERR_INVALID, "bad mapping %d", bad);
    cr_expect(strstr(err.where, "vocab.safetensors") != NULL, "%s [%s]", err.msg, err.where);
    cr_expect(strstr(err.msg, "draft id 5") != NULL || bad == 1, "%s", err.msg);
  }
  df_test_dir_close(&d);
}

Test(eagle3_train, resume_is_bit_exact) {
  tdir d;
  tdir_open(&d, "resume",
            "  batch_size: 2\n  accumulation_steps: 2\n  ttt_length: 3\n  lk_loss_type: lambda\n  kl_decay: 2.0\n"
            "  num_epochs: 8\n  total_steps: 8\n  warmup_ratio: 0.25\n  seed: 7\n");
  json_t *ma = df_test_resume_is_bit_exact(&d, 4, 8);
  const json_t *last = json_array_get(ma, 7);
  cr_expect_eq(json_array_size(json_object_get(last, "step_loss")), 3, "per TTT step");
  cr_expect_eq(json_array_size(json_object_get(last, "per_position_acc")), 3);
  json_decref(ma);
  // the contract records the strategy's keys: another ttt_length is refused on resume
  df_test_resume_refuses(&d, 4, 8, "training.ttt_length=4", "ttt_length");
  df_test_dir_close(&d);
}

Test(eagle3_train, export_is_what_sglang_and_vllm_load) {
  tdir d;
  tdir_open(&d, "export", "  batch_size: 3\n  ttt_length: 2\n  max_steps: 2\n  seed: 3\n");
  df_train_summary s;
  df_test_train_ok(&d, "run", NULL, NULL, &s);
  char out[400], log[8192];
  snprintf(out, sizeof out, "%s/export", d.root);
  int problems = df_test_export_bf16(&d, "run", "LlamaForCausalLMEagle3", log, sizeof log);
  df_error err = {0};
  cr_expect_eq(problems, 0, "%s", log);
  cr_expect(strstr(log, "--speculative-algorithm EAGLE3") != NULL, "%s", log);
  char p[500];
  snprintf(p, sizeof p, "%s/model.safetensors", out);
  df_st_file *f = NULL;
  DF_ASSERT_OK(df_st_open(p, &f, &err), &err);
  cr_expect_eq(df_st_find(f, "fc.weight")->dtype, DF_ST_BF16);
  cr_expect_eq(df_st_find(f, "d2t")->dtype, DF_ST_I64, "the mapping keeps its integer dtype");
  cr_expect_eq(df_st_find(f, "t2d")->dtype, DF_ST_BOOL);
  cr_expect_eq(df_st_count(f), 15);
  df_st_close(f);
  // a broken export is reported: a float d2t and a missing lm_head
  snprintf(p, sizeof p, "%s/config.json", out);
  json_t *cfg = json_load_file(p, 0, NULL);
  json_object_set_new(cfg, "tie_word_embeddings", json_true());
  json_object_del(cfg, "draft_vocab_size");
  cr_assert_eq(json_dump_file(cfg, p, 0), 0);
  json_decref(cfg);
  problems = df_test_inspect(out, log, sizeof log);
  cr_expect_geq(problems, 2, "%s", log);
  cr_expect(strstr(log, "tie_word_embeddings") != NULL && strstr(log, "draft_vocab_size") != NULL, "%s", log);
  df_test_dir_close(&d);
}
