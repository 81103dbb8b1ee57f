// Target config.json: Qwen3 and text_config-nested targets, HF defaults (tie_word_embeddings false, head_dim),
// logits_mup_width_multiplier, failing keys; and the draft-vs-target consistency check.
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "modeling/target_config.h"

#define TARGETS_DIR DF_FIXTURE_DIR "/configs"
#define CONFIGS_DIR DF_FIXTURE_DIR "/../../configs"

static const df_target_config *target_ok(const char *dir) {
  const df_target_config *t = NULL;
  df_error err = {0};
  df_status st = df_target_config_from_dir(dir, &t, &err);
  cr_assert_eq(st, DF_OK, "%s: %s [%s]", dir, err.msg, err.where);
  return t;
}

static const df_target_config *target_json_ok(const char *text) {
  const df_target_config *t = NULL;
  df_error err = {0};
  df_status st = df_target_config_from_json(text, strlen(text), "t.json", &t, &err);
  cr_assert_eq(st, DF_OK, "%s [%s]", err.msg, err.where);
  return t;
}

static void target_json_fails(const char *text, df_status want, const char *key) {
  const df_target_config *t = NULL;
  df_error err = {0};
  df_status st = df_target_config_from_json(text, strlen(text), "t.json", &t, &err);
  cr_expect_eq(st, want, "%s: want %s, got %s: %s", key, df_status_name(want), df_status_name(st), err.msg);
  cr_expect_null(t);
  cr_expect(strstr(err.where, key) || strstr(err.msg, key), "key %s not named: %s [%s]", key, err.msg, err.where);
  cr_expect(strstr(err.msg, "t.json"), "%s", err.msg);
}

static const df_draft_config *draft_ok(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, name);
  const df_draft_config *c = NULL;
  df_error err = {0};
  cr_assert_eq(df_draft_config_from_file(path, &c, &err), DF_OK, "%s [%s]", err.msg, err.where);
  return c;
}

Test(target_config, qwen3_8b) {
  const df_target_config *t = target_ok(TARGETS_DIR "/qwen3-8b");
  cr_expect_str_eq(t->model_type, "qwen3");
  cr_expect_not(t->text_config);
  cr_expect_eq(t->hidden_size, 4096);
  cr_expect_eq(t->num_hidden_layers, 36);
  cr_expect_eq(t->vocab_size, 151936);
  cr_expect_eq(t->num_attention_heads, 32);
  cr_expect_eq(t->num_key_value_heads, 8);
  cr_expect_eq(t->head_dim, 128);
  cr_expect_eq(t->intermediate_size, 12288);
  cr_expect_float_eq(t->rms_norm_eps, 1e-6, 1e-12);
  cr_expect_float_eq(t->rope_theta, 1e6, 1e-6);
  cr_expect_eq(t->max_position_embeddings, 40960);
  cr_expect_not(t->tie_word_embeddings);
  cr_expect_not(t->has_logits_mup);
  cr_expect(strstr(t->source, "qwen3-8b/config.json"), "%s", t->source);
  FILE *null = fopen("/dev/null", "w");
  df_target_config_print(t, null);
  fclose(null);
  df_target_config_free(t);
}

Test(target_config, text_config_nesting) {
  const df_target_config *t = target_ok(TARGETS_DIR "/tiny-target-vlm/"); // trailing slash accepted
  cr_expect(t->text_config);
  cr_expect_str_eq(t->model_type, "qwen3_5");
  cr_expect_eq(t->hidden_size, 64);
  cr_expect_eq(t->num_hidden_layers, 4);
  cr_expect_eq(t->vocab_size, 256);
  cr_expect_eq(t->head_dim, 16);
  cr_expect_float_eq(t->rope_theta, 1e7, 1e-3); // from text_config.rope_parameters
  cr_expect_not(t->tie_word_embeddings);
  df_target_config_free(t);
}

Test(target_config, hf_defaults) {
  // No tie_word_embeddings: Qwen3Config's default false (PretrainedConfig alone would say true).
  const df_target_config *t = target_json_ok("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": "
                                             "2, \"vocab_size\": 100, \"num_attention_heads\": 4}");
  cr_expect_not(t->tie_word_embeddings);
  cr_expect_eq(t->num_key_value_heads, 4);
  cr_expect_eq(t->head_dim, 128, "Qwen3Config default head_dim");
  cr_expect_float_eq(t->rope_theta, 10000.0, 1e-9);
  cr_expect_eq(t->intermediate_size, 0);
  df_target_config_free(t);
  // A non-Qwen3 model falls back to hidden / heads, as HF's attention does.
  t = target_json_ok("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, "
                     "\"num_attention_heads\": 4, \"tie_word_embeddings\": true}");
  cr_expect_eq(t->head_dim, 16);
  cr_expect(t->tie_word_embeddings);
  df_target_config_free(t);
}

Test(target_config, padded_vocab_and_mup) {
  const df_target_config *t =
      target_json_ok("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, \"padded_vocab_size\": 128, "
                     "\"num_attention_heads\": 4, \"logits_mup_width_multiplier\": 4.0}");
  cr_expect_eq(t->vocab_size, 128);
  cr_expect(t->has_logits_mup);
  cr_expect_float_eq(t->logits_mup_width_multiplier, 4.0, 1e-12);
  df_target_config_free(t);
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4, "
                    "\"tie_word_embeddings\": true, \"logits_mup_width_multiplier\": 4.0}",
                    DF_ERR_UNSUPPORTED, "logits_mup_width_multiplier");
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4, "
                    "\"logits_mup_width_multiplier\": 0}",
                    DF_ERR_INVALID, "logits_mup_width_multiplier");
}

Test(target_config, failing_keys) {
  target_json_fails("{\"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4}", DF_ERR_INVALID,
                    "hidden_size");
  target_json_fails("{\"text_config\": {\"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4}}",
                    DF_ERR_INVALID, "text_config.hidden_size");
  target_json_fails("{\"text_config\": [1]}", DF_ERR_INVALID, "text_config");
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 0, \"vocab_size\": 100, \"num_attention_heads\": 4}",
                    DF_ERR_INVALID, "num_hidden_layers");
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": \"100\", "
                    "\"num_attention_heads\": 4}",
                    DF_ERR_INVALID, "vocab_size");
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4, "
                    "\"num_key_value_heads\": 3}",
                    DF_ERR_INVALID, "num_key_value_heads");
  target_json_fails("{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 100, \"num_attention_heads\": 4, "
                    "\"rope_theta\": 1000.0, \"rope_parameters\": {\"rope_theta\": 10.0}}",
                    DF_ERR_INVALID, "rope_parameters.rope_theta");
  target_json_fails("{\"hidden_size\": 64, \"hidden_size\": 32}", DF_ERR_FORMAT, "line 1");

  const df_target_config *t = NULL;
  df_error err = {0};
  cr_expect_eq(df_target_config_from_dir(TARGETS_DIR "/no-such-target", &t, &err), DF_ERR_IO);
  cr_expect(strstr(err.where, "no-such-target/config.json"), "%s", err.where);
}

Test(target_config, draft_matches_target) {
  const df_draft_config *d = draft_ok("qwen3-8b-dflash.json");
  const df_target_config *t = target_ok(TARGETS_DIR "/qwen3-8b");
  df_error err = {0};
  cr_expect_eq(df_draft_config_check_target(d, t, &err), DF_OK, "%s", err.msg);
  df_draft_config_free(d);
  d = draft_ok("qwen3-8b-dspark.json");
  cr_expect_eq(df_draft_config_check_target(d, t, &err), DF_OK, "%s", err.msg);
  df_target_config_free(t);
  t = target_ok(TARGETS_DIR "/tiny-target");
  cr_expect_eq(df_draft_config_check_target(d, t, &err), DF_ERR_INVALID); // an 8B draft on a tiny target
  cr_expect_str_eq(err.where, "hidden_size");
  cr_expect(strstr(err.msg, "qwen3-8b-dspark.json"), "%s", err.msg);
  cr_expect(strstr(err.msg, "tiny-target/config.json"), "%s", err.msg);
  df_draft_config_free(d);
  const char *tiny[] = {"tiny-dflash.json", "tiny-dspark.json"};
  for (int i = 0; i < 2; i++) {
    d = draft_ok(tiny[i]);
    cr_expect_eq(df_draft_config_check_target(d, t, &err), DF_OK, "%s: %s", tiny[i], err.msg);
    df_draft_config_free(d);
  }
  df_target_config_free(t);
}

Test(target_config, mismatches_name_the_key) {
  const df_draft_config *d = draft_ok("tiny-dflash.json");
  const char *vocab =
      "{\"hidden_size\": 64, \"num_hidden_layers\": 4, \"vocab_size\": 300, \"num_attention_heads\": 4}";
  const char *layers =
      "{\"hidden_size\": 64, \"num_hidden_layers\": 6, \"vocab_size\": 256, \"num_attention_heads\": 4}";
  const char *shallow = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"vocab_size\": 256, "
                        "\"num_attention_heads\": 4}";
  const char *text[] = {vocab, layers, shallow};
  const char *key[] = {"vocab_size", "num_target_layers", "num_target_layers"};
  for (int i = 0; i < 3; i++) {
    const df_target_config *t = target_json_ok(text[i]);
    df_error err = {0};
    cr_expect_eq(df_draft_config_check_target(d, t, &err), DF_ERR_INVALID);
    cr_expect_str_eq(err.where, key[i]);
    cr_expect(err.hint[0]);
    df_target_config_free(t);
  }
  df_draft_config_free(d);
}
