// P-EAGLE through the trainer on the P-EAGLE step fixtures' configs (tests/fixtures/peagle_step) and the EAGLE-3
// fixtures' data: the first step's loss is the step-parity loss (warm start, batch 1; a batch of two, the mean of its
// samples' own losses, is a step-parity case of its own); resume is bit exact with the contract's keys; the export is
// what vLLM's parallel drafting loads (inspect finds no problem) and reads back as the same P-EAGLE draft.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/draft_config.h"
#include "modeling/safetensors.h"
#include "tests/common/fixture.h"
#include "tests/common/train_run.h"
#include "train/export/export.h"
#include "train/export/inspect_export.h"

#define EFX DF_FIXTURE_DIR "/eagle3_step"
#define PFX DF_FIXTURE_DIR "/peagle_step"

typedef df_test_dir tdir;

static void tdir_open(tdir *d, const char *name, const char *training) {
  char tag[64];
  snprintf(tag, sizeof tag, "peagle_train_%s", name);
  FILE *fp = df_test_dir_open(d, tag);
  fprintf(fp,
          "model:\n  target_model_path: " EFX "/target\n  draft_model_config: " PFX "/peagle.json\n"
          "  mask_token_id: 250\n  vocab_mapping_path: %s/vocab.safetensors\n"
          "data:\n  hidden_states_path: " EFX "/data\n  eval_hidden_states_path: " EFX "/data\n  max_length: 64\n"
          "training:\n  strategy: peagle\n  learning_rate: 1e-3\n  max_grad_norm: 1.0\n  log_interval: 1\n%s"
          "run_id: t\n",
          d->root, training);
  fclose(fp);
}

Test(peagle_train, first_step_is_the_step_parity_loss) {
  tdir d;
  tdir_open(&d, "first", "  batch_size: 1\n  num_depths: 4\n  seed: 2\n  max_steps: 1\n");
  df_train_summary s;
  const char *warm[] = {"model.draft_checkpoint_path=" PFX "/draft_ckpt", NULL};
  df_test_train_ok(&d, "a", warm, NULL, &s);
  json_t *m = df_test_metrics(&d, "a");
  const double loss = json_number_value(json_object_get(json_array_get(m, 0), "loss"));
  cr_expect(fabs(loss - 5.802472226) < 1e-6 * 5.80, "step 1 loss %.9f, the d4_warm_2layers case's 5.802472226", loss);
  json_decref(m);
  df_test_dir_close(&d);
}

Test(peagle_train, resume_is_bit_exact_and_the_contract_keeps_the_depths) {
  tdir d;
  tdir_open(&d, "resume",
            "  batch_size: 2\n  accumulation_steps: 2\n  num_depths: 3\n  down_sample_ratio: 0.7\n"
            "  num_epochs: 8\n  total_steps: 6\n  warmup_ratio: 0.25\n  seed: 7\n");
  json_t *ma = df_test_resume_is_bit_exact(&d, 3, 6);
  const json_t *last = json_array_get(ma, 5);
  cr_expect_eq(json_array_size(json_object_get(last, "per_position_acc")), 3, "per depth");
  cr_expect_eq(json_array_size(json_object_get(last, "depth_loss")), 3);
  const double first = json_number_value(json_object_get(json_array_get(ma, 0), "loss"));
  const double end = json_number_value(json_object_get(last, "loss"));
  cr_expect(end < first, "six steps lower the loss: %.4f -> %.4f", first, end);
  json_decref(ma);
  // the contract records the strategy's keys: other depths are refused on resume
  df_test_resume_refuses(&d, 3, 6, "training.num_depths=4", "num_depths");
  df_test_dir_close(&d);
}

Test(peagle_train, export_is_what_vllm_parallel_drafting_loads) {
  tdir d;
  tdir_open(&d, "export", "  batch_size: 3\n  num_depths: 3\n  max_steps: 2\n  seed: 3\n");
  df_train_summary s;
  df_test_train_ok(&d, "run", NULL, NULL, &s);
  char out[400], log[8192];
  snprintf(out, sizeof out, "%s/export", d.root);
  int problems = df_test_export_bf16(&d, "run", "Eagle3LlamaForCausalLM", log, sizeof log);
  df_error err = {0};
  cr_expect_eq(problems, 0, "%s", log);
  cr_expect(strstr(log, "\"parallel_drafting\": true") != NULL, "%s", log);
  char p[500];
  snprintf(p, sizeof p, "%s/model.safetensors", out);
  df_st_file *f = NULL;
  DF_ASSERT_OK(df_st_open(p, &f, &err), &err);
  cr_expect_eq(df_st_find(f, "fc.weight")->dtype, DF_ST_BF16);
  cr_expect_eq(df_st_find(f, "d2t")->dtype, DF_ST_I64, "the mapping keeps its integer dtype");
  const df_st_tensor *mh = df_st_find(f, "mask_hidden");
  cr_assert_not_null(mh);
  cr_expect(mh->ndim == 3 && mh->shape[2] == 192, "mask_hidden [1, 1, 3H] as SpecForge saves it");
  cr_expect_not_null(df_st_find(f, "embed_tokens.weight"), "the trained embedding");
  cr_expect_not_null(df_st_find(f, "layers.1.self_attn.q_proj.weight"));
  df_st_close(f);
  // the export reads back as the same P-EAGLE draft
  snprintf(p, sizeof p, "%s/config.json", out);
  const df_draft_config *cfg = NULL;
  DF_ASSERT_OK(df_draft_config_from_file(p, &cfg, &err), &err);
  cr_expect_eq(cfg->kind, DF_DRAFT_PEAGLE);
  cr_expect_eq(cfg->num_hidden_layers, 2);
  cr_expect_eq(cfg->dflash.mask_token_id, 250, "the run's mask token, where vLLM reads it");
  df_draft_config_free(cfg);
  // a broken export is reported: no mask token, parallel drafting of a one-layer claim
  json_t *c = json_load_file(p, 0, NULL);
  json_object_del(c, "mask_token_id");
  json_object_set_new(c, "num_hidden_layers", json_integer(1));
  cr_assert_eq(json_dump_file(c, p, 0), 0);
  json_decref(c);
  problems = df_test_inspect(out, log, sizeof log);
  cr_expect_geq(problems, 1, "%s", log);
  cr_expect(strstr(log, "mask_token_id") != NULL, "%s", log);
  df_test_dir_close(&d);
}
