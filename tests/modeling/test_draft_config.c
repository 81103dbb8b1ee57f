// Draft config: shipped configs, defaults (target layer ids, head_dim, ...), one failing case per rule,
// MoE resolution, JSON syntax / duplicate-key errors, kept unknown keys, print.
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "moe/config.h"
#include "tests/common/json_edit.h"

#define CONFIGS_DIR DF_FIXTURE_DIR "/../../configs"
#define BAD_DIR     DF_FIXTURE_DIR "/configs/bad"

static const df_draft_config *load_ok(const char *path) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  df_status st = df_draft_config_from_file(path, &cfg, &err);
  cr_assert_eq(st, DF_OK, "%s: %s [%s]", path, err.msg, err.where);
  cr_assert_not_null(cfg);
  return cfg;
}

// Parses d (consumed) from its serialised text under the name "mut.json".
static df_status parse_doc(json_t *d, const df_draft_config **cfg, df_error *err) {
  char *text = json_dumps(d, JSON_COMPACT);
  json_decref(d);
  df_status st = df_draft_config_from_json(text, strlen(text), "mut.json", cfg, err);
  free(text);
  return st;
}

static const df_draft_config *parse_doc_ok(json_t *d) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  df_status st = parse_doc(d, &cfg, &err);
  cr_assert_eq(st, DF_OK, "%s [%s]", err.msg, err.where);
  return cfg;
}

// The document must fail with want, and key must appear in err.where or err.msg, and so must the file name.
static void expect_fail(json_t *d, df_status want, const char *key) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  df_status st = parse_doc(d, &cfg, &err);
  cr_expect_eq(st, want, "key %s: want %s, got %s: %s", key, df_status_name(want), df_status_name(st), err.msg);
  cr_expect_null(cfg);
  cr_expect(strstr(err.where, key) || strstr(err.msg, key), "key %s not named: msg \"%s\" where \"%s\"", key, err.msg,
            err.where);
  cr_expect(strstr(err.msg, "mut.json"), "file not named: %s", err.msg);
  cr_expect(err.hint[0], "no hint for %s: %s", key, err.msg);
  df_draft_config_free(cfg);
}

// One mutation of a shipped config.
static void expect_fail_set(const char *file, const char *path, const char *value, df_status want, const char *key) {
  json_t *d = df_test_config_doc(file);
  df_test_json_set(d, path, value ? df_test_json(value) : NULL);
  expect_fail(d, want, key);
}

Test(draft_config, every_shipped_config_parses) {
  DIR *dir = opendir(CONFIGS_DIR);
  cr_assert_not_null(dir, "cannot open %s", CONFIGS_DIR);
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));) {
    size_t len = strlen(e->d_name);
    if (len < 5 || strcmp(e->d_name + len - 5, ".json")) continue;
    char path[768];
    snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, e->d_name);
    const df_draft_config *cfg = load_ok(path);
    FILE *null = fopen("/dev/null", "w");
    df_draft_config_print(cfg, null);
    fclose(null);
    df_draft_config_free(cfg);
    n++;
  }
  closedir(dir);
  cr_assert_geq(n, 4, "expected the four shipped configs, found %d", n);
}

Test(draft_config, qwen3_8b_dflash_values) {
  const df_draft_config *c = load_ok(CONFIGS_DIR "/qwen3-8b-dflash.json");
  cr_expect_eq(c->kind, DF_DRAFT_DFLASH);
  cr_expect_str_eq(c->architecture, "DFlashDraftModel");
  cr_expect_eq(c->block_size, 16);
  cr_expect_eq(c->dflash.mask_token_id, 151669);
  const int want[] = {1, 9, 17, 25, 33};
  cr_assert_eq(c->dflash.num_target_layer_ids, 5);
  for (int i = 0; i < 5; i++) cr_expect_eq(c->dflash.target_layer_ids[i], want[i]);
  cr_expect_not(c->dflash.target_layer_ids_defaulted);
  cr_expect_eq(c->num_target_layers, 36);
  cr_expect_eq(c->num_hidden_layers, 5);
  for (int i = 0; i < 5; i++) cr_expect_eq(c->layer_types[i], DF_LAYER_FULL_ATTENTION);
  cr_expect_eq(c->sliding_window, 0);
  cr_expect_eq(c->hidden_size, 4096);
  cr_expect_eq(c->intermediate_size, 12288);
  cr_expect_eq(c->num_attention_heads, 32);
  cr_expect_eq(c->num_key_value_heads, 8);
  cr_expect_eq(c->head_dim, 128);
  cr_expect_eq(c->vocab_size, 151936);
  cr_expect_eq(c->max_position_embeddings, 40960);
  cr_expect_float_eq(c->rms_norm_eps, 1e-6, 1e-12);
  cr_expect_eq(c->rope.type, DF_ROPE_DEFAULT);
  cr_expect_float_eq(c->rope.theta, 1e6, 1e-6);
  cr_expect_eq(c->rope.head_dim, 128);
  cr_expect_not(c->attention_bias);
  cr_expect_not(c->tie_word_embeddings);
  cr_expect_float_eq(c->initializer_range, 0.02, 1e-12);
  cr_expect_str_eq(c->torch_dtype, "bfloat16");
  cr_expect_str_eq(c->hidden_act, "silu");
  cr_expect_eq(c->dflash.projector_type, DF_PROJECTOR_DFLASH);
  df_draft_config_free(c);
}

Test(draft_config, qwen3_8b_dspark_values) {
  const df_draft_config *c = load_ok(CONFIGS_DIR "/qwen3-8b-dspark.json");
  cr_expect_eq(c->kind, DF_DRAFT_DSPARK);
  cr_expect_eq(c->block_size, 7);
  cr_expect_eq(c->dflash.attention_mode, DF_ATTENTION_GQA);
  cr_expect_eq(c->dflash.projector_type, DF_PROJECTOR_DSPARK);
  cr_expect_eq(c->dflash.markov_rank, 256);
  cr_expect_eq(c->dflash.markov_head_type, DF_MARKOV_VANILLA);
  cr_expect(c->dflash.enable_confidence_head);
  cr_expect(c->dflash.confidence_head_with_markov);
  cr_expect_float_eq(c->dflash.confidence_head_alpha, 1.0, 1e-12);
  cr_expect_eq(c->dflash.mask_token_id, 151669);
  cr_expect_eq(c->dflash.target_layer_ids[4], 33);
  df_draft_config_free(c);
}

Test(draft_config, tiny_configs_values) {
  const df_draft_config *c = load_ok(CONFIGS_DIR "/tiny-dflash.json");
  cr_expect_eq(c->hidden_size, 64);
  cr_expect_eq(c->num_attention_heads, 4);
  cr_expect_eq(c->num_key_value_heads, 2);
  cr_expect_eq(c->head_dim, 16);
  cr_expect_eq(c->intermediate_size, 128);
  cr_expect_eq(c->vocab_size, 256);
  cr_expect_eq(c->block_size, 4);
  cr_expect_eq(c->dflash.mask_token_id, 255);
  cr_expect_eq(c->dflash.num_target_layer_ids, 2);
  cr_expect_eq(c->num_target_layers, 4);
  cr_expect(df_draft_config_layer_is_sliding(c, 0));
  cr_expect_not(df_draft_config_layer_is_sliding(c, 1));
  cr_expect_not(df_draft_config_layer_is_sliding(c, 2));
  cr_expect_eq(c->sliding_window, 8);
  df_draft_config_free(c);
  c = load_ok(CONFIGS_DIR "/tiny-dspark.json");
  cr_expect_eq(c->kind, DF_DRAFT_DSPARK);
  cr_expect_eq(c->dflash.markov_rank, 8);
  cr_expect(c->dflash.enable_confidence_head);
  cr_expect_eq(c->sliding_window, 8);
  df_draft_config_free(c);
}

// SpecForge's Qwen3-8B Domino config, the tiny one, and SpecForge's export form (DFlashDraftModel + projector_type
// domino), which reads back as the same Domino draft; SpecForge's code defaults (pure_draft_prefix_len 0,
// shift_label false) when the keys are absent.
Test(draft_config, domino_configs_values) {
  const df_draft_config *c = load_ok(CONFIGS_DIR "/qwen3-8b-domino.json");
  cr_expect_eq(c->kind, DF_DRAFT_DOMINO);
  cr_expect_str_eq(df_draft_kind_name(c->kind), "domino");
  cr_expect_eq(c->dflash.projector_type, DF_PROJECTOR_DOMINO);
  cr_expect_eq(c->dflash.emb_dim, 256);
  cr_expect_eq(c->dflash.gru_hidden_dim, 1024);
  cr_expect_eq(c->dflash.pure_draft_prefix_len, 1);
  cr_expect(c->dflash.shift_label);
  cr_expect_eq(c->block_size, 16);
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  df_draft_config_print(c, mem);
  fclose(mem);
  cr_expect(strstr(text, "dflash.gru_hidden_dim") && strstr(text, "1024"), "%s", text);
  cr_expect(strstr(text, "kind") && strstr(text, "domino (DominoDraftModel)"), "%s", text);
  free(text);
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(c, &total, &active);
  const int64_t head = 3 * 1024 * (4096 + 1024) + 256 * (4096 + 1024) + 151936LL * 256; // ≈ 55.9M
  df_draft_config_free(c);
  c = load_ok(CONFIGS_DIR "/qwen3-8b-dflash.json");
  int64_t dflash_total = 0;
  df_draft_config_param_counts(c, &dflash_total, &active);
  cr_expect_eq(total - dflash_total, head, "the Domino head adds %lld parameters, expected %lld",
               (long long)(total - dflash_total), (long long)head);
  df_draft_config_free(c);

  json_t *d = df_test_config_doc("tiny-domino.json");
  df_test_json_set(d, "architectures", df_test_json("[\"DFlashDraftModel\"]"));
  df_test_json_set(d, "dflash_config.pure_draft_prefix_len", NULL);
  df_test_json_set(d, "dflash_config.shift_label", NULL);
  c = parse_doc_ok(d);
  cr_expect_eq(c->kind, DF_DRAFT_DOMINO);
  cr_expect_eq(c->dflash.pure_draft_prefix_len, 0);
  cr_expect_not(c->dflash.shift_label);
  cr_expect_eq(c->dflash.emb_dim, 16);
  df_draft_config_free(c);
  d = df_test_config_doc("tiny-domino.json");
  df_test_json_set(d, "dflash_config.projector_type", NULL); // DominoDraftModel: absent resolves to domino
  c = parse_doc_ok(d);
  cr_expect_eq(c->dflash.projector_type, DF_PROJECTOR_DOMINO);
  df_draft_config_free(c);
}

static void expect_ids(int64_t L, int64_t n, const int *want) {
  int got[16];
  df_draft_config_build_target_layer_ids(L, n, got);
  for (int64_t i = 0; i < n; i++)
    cr_expect_eq(got[i], want[i], "L=%lld n=%lld: id[%lld] = %d, want %d", (long long)L, (long long)n, (long long)i,
                 got[i], want[i]);
}

// Expected values are Python's int(round(...)), i.e. round half to even.
Test(draft_config, default_target_layer_ids_match_specforge) {
  expect_ids(36, 5, (int[]){1, 9, 17, 25, 33});  // Qwen3-8B
  expect_ids(24, 5, (int[]){1, 6, 11, 16, 21});  // Qwen2.5-0.5B
  expect_ids(64, 5, (int[]){1, 16, 31, 46, 61}); // Qwen3.6-27B DFlash
  expect_ids(36, 1, (int[]){18});                // one draft layer: L // 2
  expect_ids(7, 3, (int[]){1, 2, 4});            // 2.5 -> 2 (half to even)
  expect_ids(11, 3, (int[]){1, 4, 8});           // 4.5 -> 4
  expect_ids(13, 5, (int[]){1, 3, 6, 8, 10});    // 5.5 -> 6
  expect_ids(40, 8, (int[]){1, 6, 11, 16, 22, 27, 32, 37});
}

Test(draft_config, absent_target_layer_ids_take_the_default) {
  json_t *d = df_test_config_doc("qwen3-8b-dflash.json");
  df_test_json_set(d, "dflash_config.target_layer_ids", NULL);
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect(c->dflash.target_layer_ids_defaulted);
  cr_assert_eq(c->dflash.num_target_layer_ids, 5);
  const int want[] = {1, 9, 17, 25, 33};
  for (int i = 0; i < 5; i++) cr_expect_eq(c->dflash.target_layer_ids[i], want[i]);
  df_draft_config_free(c);

  d = df_test_config_doc("qwen3-8b-dflash.json");
  df_test_json_set(d, "dflash_config", NULL);
  df_test_json_set(d, "num_hidden_layers", df_test_json("1"));
  df_test_json_set(d, "layer_types", NULL);
  c = parse_doc_ok(d);
  cr_assert_eq(c->dflash.num_target_layer_ids, 1);
  cr_expect_eq(c->dflash.target_layer_ids[0], 18);
  cr_expect_eq(c->dflash.mask_token_id, -1, "absent mask token is unset (-1)");
  df_draft_config_free(c);
}

Test(draft_config, defaults_follow_qwen3config) {
  json_t *d = df_test_config_doc("tiny-dflash.json");
  const char *drop[] = {"head_dim",
                        "initializer_range",
                        "num_key_value_heads",
                        "rms_norm_eps",
                        "rope_theta",
                        "max_position_embeddings",
                        "hidden_act",
                        "model_type",
                        "attention_bias",
                        "tie_word_embeddings",
                        "dtype"};
  for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) df_test_json_set(d, drop[i], NULL);
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect_eq(c->head_dim, 128, "Qwen3Config default head_dim is 128, not hidden/heads");
  cr_expect_float_eq(c->initializer_range, 0.02, 1e-12);
  cr_expect_eq(c->num_key_value_heads, c->num_attention_heads);
  cr_expect_float_eq(c->rms_norm_eps, 1e-6, 1e-12);
  cr_expect_float_eq(c->rope.theta, 10000.0, 1e-9);
  cr_expect_eq(c->max_position_embeddings, 32768);
  cr_expect_str_eq(c->hidden_act, "silu");
  cr_expect_str_eq(c->model_type, "qwen3");
  cr_expect_null(c->torch_dtype);
  df_draft_config_free(c);
}

Test(draft_config, layer_types_default_from_max_window_layers) {
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "layer_types", NULL);
  df_test_json_set(d, "max_window_layers", df_test_json("1"));
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect_eq(c->layer_types[0], DF_LAYER_FULL_ATTENTION);
  cr_expect_eq(c->layer_types[1], DF_LAYER_SLIDING_ATTENTION);
  cr_expect_eq(c->sliding_window, 8);
  df_draft_config_free(c);

  d = df_test_config_doc("tiny-dflash.json"); // no window in force: every layer is full
  df_test_json_set(d, "layer_types", NULL);
  df_test_json_set(d, "use_sliding_window", df_test_json("false"));
  df_test_json_set(d, "max_window_layers", df_test_json("0"));
  c = parse_doc_ok(d);
  cr_expect_eq(c->layer_types[0], DF_LAYER_FULL_ATTENTION);
  cr_expect_eq(c->layer_types[1], DF_LAYER_FULL_ATTENTION);
  cr_expect_eq(c->sliding_window, 0);
  df_draft_config_free(c);

  d = df_test_config_doc("tiny-dflash.json"); // absent sliding_window takes Qwen3Config's 4096
  df_test_json_set(d, "layer_types", NULL);
  df_test_json_set(d, "sliding_window", NULL);
  df_test_json_set(d, "max_window_layers", df_test_json("0"));
  c = parse_doc_ok(d);
  cr_expect_eq(c->layer_types[0], DF_LAYER_SLIDING_ATTENTION);
  cr_expect_eq(c->sliding_window, 4096);
  df_draft_config_free(c);
}

Test(draft_config, rope_yarn_and_llama3) {
  json_t *d =
      df_test_config_doc("qwen3-8b-dflash.json"); // Kimi-K3 DSpark spelling: rope_parameters with rope_theta inside
  df_test_json_set(d, "rope_theta", NULL);
  df_test_json_set(d, "rope_scaling", NULL);
  df_test_json_set(
      d, "rope_parameters",
      df_test_json("{\"factor\": 16.0, \"original_max_position_embeddings\": 4096, \"rope_theta\": 10000.0, "
                   "\"rope_type\": \"yarn\"}"));
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect_eq(c->rope.type, DF_ROPE_YARN);
  cr_expect_float_eq(c->rope.factor, 16.0, 1e-12);
  cr_expect_eq(c->rope.original_max_position_embeddings, 4096);
  cr_expect_float_eq(c->rope.theta, 10000.0, 1e-9);
  cr_expect_float_eq(c->rope.beta_fast, 32.0, 1e-12);
  cr_expect_float_eq(c->rope.beta_slow, 1.0, 1e-12);
  cr_expect(c->rope.truncate);
  cr_expect_not(c->rope.has_attention_factor);
  cr_expect_eq(c->rope.max_position_embeddings, 40960);
  df_draft_config_free(c);

  d = df_test_config_doc("qwen3-8b-dflash.json"); // both spellings, in sync, with the legacy "type" key
  df_test_json_set(d, "rope_scaling", df_test_json("{\"type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 1.2}"));
  df_test_json_set(d, "rope_parameters",
                   df_test_json("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 1.2, "
                                "\"rope_theta\": 1000000}"));
  c = parse_doc_ok(d);
  cr_expect_eq(c->rope.type, DF_ROPE_YARN);
  cr_expect(c->rope.has_attention_factor);
  cr_expect_float_eq(c->rope.attention_factor, 1.2, 1e-12);
  df_draft_config_free(c);

  d = df_test_config_doc("qwen3-8b-dflash.json");
  df_test_json_set(d, "rope_scaling",
                   df_test_json("{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                                "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}"));
  c = parse_doc_ok(d);
  cr_expect_eq(c->rope.type, DF_ROPE_LLAMA3);
  cr_expect_float_eq(c->rope.high_freq_factor, 4.0, 1e-12);
  df_draft_config_free(c);

  d = df_test_config_doc("qwen3-8b-dflash.json"); // the two spellings must describe one rotation
  df_test_json_set(d, "rope_scaling", df_test_json("{\"rope_type\": \"linear\", \"factor\": 2.0}"));
  df_test_json_set(d, "rope_parameters", df_test_json("{\"rope_type\": \"linear\", \"factor\": 3.0}"));
  expect_fail(d, DF_ERR_INVALID, "rope_parameters");
}

Test(draft_config, exported_qwen3_dspark_form) {
  json_t *d = df_test_config_doc("qwen3-8b-dspark.json"); // what SpecForge's export normalizer writes for SGLang
  df_test_json_set(d, "architectures", df_test_json("[\"Qwen3DSparkModel\"]"));
  df_test_json_set(d, "auto_map", NULL);
  df_test_json_set(d, "markov_rank", df_test_json("256"));
  df_test_json_set(d, "markov_head_type", df_test_json("\"vanilla\""));
  df_test_json_set(d, "enable_confidence_head", df_test_json("true"));
  df_test_json_set(d, "confidence_head_with_markov", df_test_json("true"));
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect_eq(c->kind, DF_DRAFT_DSPARK);
  cr_expect_eq(c->dflash.markov_rank, 256);
  df_draft_config_free(c);

  d = df_test_config_doc("qwen3-8b-dspark.json");
  df_test_json_set(d, "markov_rank", df_test_json("128"));
  expect_fail(d, DF_ERR_INVALID, "markov_rank");
}

Test(draft_config, mha_opt_in) {
  json_t *d = df_test_config_doc("tiny-dspark.json");
  df_test_json_set(d, "num_key_value_heads", df_test_json("4"));
  df_test_json_set(d, "dflash_config.attention_mode", df_test_json("\"MHA\""));
  const df_draft_config *c = parse_doc_ok(d);
  cr_expect_eq(c->dflash.attention_mode, DF_ATTENTION_MHA);
  df_draft_config_free(c);
}

typedef struct {
  const char *file, *path, *value; // value NULL deletes the key
  df_status want;
  const char *key; // must appear in err.where or err.msg
} bad_case;

// One failing case per validation rule.
static const bad_case BAD[] = {
    {"tiny-dflash.json", "block_size", "1", DF_ERR_INVALID, "block_size"},
    {"tiny-dflash.json", "block_size", "\"16\"", DF_ERR_INVALID, "block_size"},
    {"tiny-dflash.json", "block_size", "16.0", DF_ERR_INVALID, "block_size"},
    {"tiny-dflash.json", "block_size", NULL, DF_ERR_INVALID, "block_size"},
    {"tiny-dflash.json", "dflash_config.mask_token_id", "256", DF_ERR_INVALID, "dflash_config.mask_token_id"},
    {"tiny-dflash.json", "dflash_config.mask_token_id", "-1", DF_ERR_INVALID, "dflash_config.mask_token_id"},
    {"tiny-dflash.json", "dflash_config.target_layer_ids", "[1, 4]", DF_ERR_INVALID,
     "dflash_config.target_layer_ids[1]"},
    {"tiny-dflash.json", "dflash_config.target_layer_ids", "[-1]", DF_ERR_INVALID, "dflash_config.target_layer_ids[0]"},
    {"tiny-dflash.json", "dflash_config.target_layer_ids", "[1, true]", DF_ERR_INVALID,
     "dflash_config.target_layer_ids[1]"},
    {"tiny-dflash.json", "dflash_config.target_layer_ids", "[]", DF_ERR_INVALID, "dflash_config.target_layer_ids"},
    {"tiny-dflash.json", "dflash_config.target_layer_ids", "\"1,2\"", DF_ERR_INVALID, "dflash_config.target_layer_ids"},
    {"tiny-dflash.json", "num_target_layers", "2", DF_ERR_INVALID, "dflash_config.target_layer_ids[1]"},
    {"tiny-dflash.json", "num_target_layers", "0", DF_ERR_INVALID, "num_target_layers"},
    {"tiny-dflash.json", "dflash_config", "[1]", DF_ERR_INVALID, "dflash_config"},
    {"tiny-dflash.json", "num_key_value_heads", "3", DF_ERR_INVALID, "num_key_value_heads"},
    {"tiny-dflash.json", "num_attention_heads", "0", DF_ERR_INVALID, "num_attention_heads"},
    {"tiny-dflash.json", "head_dim", "15", DF_ERR_INVALID, "head_dim"},
    {"tiny-dflash.json", "hidden_size", NULL, DF_ERR_INVALID, "hidden_size"},
    {"tiny-dflash.json", "hidden_size", "0", DF_ERR_INVALID, "hidden_size"},
    {"tiny-dflash.json", "intermediate_size", "-5", DF_ERR_INVALID, "intermediate_size"},
    {"tiny-dflash.json", "vocab_size", NULL, DF_ERR_INVALID, "vocab_size"},
    {"tiny-dflash.json", "num_hidden_layers", "5000", DF_ERR_INVALID, "num_hidden_layers"},
    {"tiny-dflash.json", "layer_types", "[\"full_attention\"]", DF_ERR_INVALID, "layer_types"},
    {"tiny-dflash.json", "layer_types", "[\"full_attention\", \"local\"]", DF_ERR_INVALID, "layer_types[1]"},
    {"tiny-dflash.json", "layer_types", "[\"full_attention\", 3]", DF_ERR_INVALID, "layer_types[1]"},
    {"tiny-dflash.json", "sliding_window", "null", DF_ERR_INVALID, "sliding_window"},
    {"tiny-dflash.json", "sliding_window", "0", DF_ERR_INVALID, "sliding_window"},
    {"tiny-dflash.json", "use_sliding_window", "false", DF_ERR_INVALID, "use_sliding_window"},
    {"tiny-dflash.json", "max_window_layers", "-1", DF_ERR_INVALID, "max_window_layers"},
    {"tiny-dflash.json", "architectures", NULL, DF_ERR_INVALID, "architectures"},
    {"tiny-dflash.json", "architectures", "[\"DFlashDraftModel\", \"DSparkDraftModel\"]", DF_ERR_INVALID,
     "architectures"},
    {"tiny-dflash.json", "architectures", "[\"LlamaForCausalLM\"]", DF_ERR_UNSUPPORTED, "architectures[0]"},
    {"tiny-dflash.json", "architectures", "[\"DominoDraftModel\"]", DF_ERR_INVALID, "dflash_config.emb_dim"},
    {"tiny-dflash.json", "architectures", "[\"Qwen3MoeDSparkModel\"]", DF_ERR_UNSUPPORTED, "architectures[0]"},
    {"tiny-dflash.json", "model_type", "\"llama\"", DF_ERR_UNSUPPORTED, "model_type"},
    {"tiny-dflash.json", "hidden_act", "\"gelu\"", DF_ERR_UNSUPPORTED, "hidden_act"},
    {"tiny-dflash.json", "attention_dropout", "0.1", DF_ERR_UNSUPPORTED, "attention_dropout"},
    {"tiny-dflash.json", "rms_norm_eps", "0", DF_ERR_INVALID, "rms_norm_eps"},
    {"tiny-dflash.json", "initializer_range", "-0.02", DF_ERR_INVALID, "initializer_range"},
    {"tiny-dflash.json", "attention_bias", "0", DF_ERR_INVALID, "attention_bias"},
    {"tiny-dflash.json", "tie_word_embeddings", "\"false\"", DF_ERR_INVALID, "tie_word_embeddings"},
    {"tiny-dflash.json", "max_position_embeddings", "0", DF_ERR_INVALID, "max_position_embeddings"},
    {"tiny-dflash.json", "torch_dtype", "\"float16\"", DF_ERR_INVALID, "torch_dtype"},
    {"tiny-dflash.json", "target_hidden_size", "128", DF_ERR_UNSUPPORTED, "target_hidden_size"},
    {"tiny-dflash.json", "rope_theta", "-1", DF_ERR_INVALID, "rope_theta"},
    {"tiny-dflash.json", "rope_scaling", "\"yarn\"", DF_ERR_INVALID, "rope_scaling"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}", DF_ERR_UNSUPPORTED,
     "rope_scaling.rope_type"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"yarn\"}", DF_ERR_INVALID, "rope_scaling.factor"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0.5}", DF_ERR_INVALID,
     "rope_scaling.factor"},
    {"tiny-dflash.json", "rope_scaling", "{\"factor\": 2.0}", DF_ERR_INVALID, "rope_scaling.rope_type"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"default\", \"mrope_section\": [2, 3, 3]}", DF_ERR_INVALID,
     "rope_scaling.mrope_section"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 0.5}",
     DF_ERR_INVALID, "rope_scaling.beta_fast"},
    {"tiny-dflash.json", "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}", DF_ERR_INVALID,
     "rope_scaling.original_max_position_embeddings"},
    {"tiny-dflash.json", "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0}", DF_ERR_INVALID,
     "rope_parameters.rope_theta"},
    {"tiny-dflash.json", "partial_rotary_factor", "0.5", DF_ERR_UNSUPPORTED, "partial_rotary_factor"},
    {"tiny-dflash.json", "dflash_config.projector_type", "\"domino\"", DF_ERR_INVALID, "dflash_config.emb_dim"},
    {"tiny-dflash.json", "dflash_config.projector_type", "\"dspark\"", DF_ERR_INVALID, "dflash_config.projector_type"},
    {"tiny-dflash.json", "dflash_config.markov_rank", "8", DF_ERR_INVALID, "dflash_config.markov_rank"},
    {"tiny-dflash.json", "dflash_config.confidence_head_alpha", "1.0", DF_ERR_INVALID,
     "dflash_config.confidence_head_alpha"},
    {"tiny-dflash.json", "dflash_config.shift_label", "true", DF_ERR_UNSUPPORTED, "dflash_config.shift_label"},
    {"tiny-dflash.json", "dflash_config.pure_draft_prefix_len", "1", DF_ERR_UNSUPPORTED,
     "dflash_config.pure_draft_prefix_len"},
    {"tiny-dspark.json", "dflash_config.attention_mode", "\"mha\"", DF_ERR_INVALID, "dflash_config.attention_mode"},
    {"tiny-dspark.json", "dflash_config.attention_mode", "\"mqa\"", DF_ERR_INVALID, "dflash_config.attention_mode"},
    {"tiny-dspark.json", "num_key_value_heads", "4", DF_ERR_INVALID, "dflash_config.attention_mode"},
    {"tiny-dspark.json", "dflash_config.markov_rank", "-1", DF_ERR_INVALID, "dflash_config.markov_rank"},
    {"tiny-dspark.json", "dflash_config.markov_head_type", "\"lstm\"", DF_ERR_INVALID,
     "dflash_config.markov_head_type"},
    {"tiny-dspark.json", "dflash_config.markov_rank", "0", DF_ERR_INVALID, "dflash_config.confidence_head_with_markov"},
    {"tiny-dspark.json", "dflash_config.enable_confidence_head", "1", DF_ERR_INVALID,
     "dflash_config.enable_confidence_head"},
    {"tiny-dspark.json", "dflash_config.confidence_head_alpha", "-1", DF_ERR_INVALID,
     "dflash_config.confidence_head_alpha"},
    {"tiny-dspark.json", "dflash_config.projector_type", "\"dflash\"", DF_ERR_INVALID, "dflash_config.projector_type"},
    {"tiny-dspark.json", "dflash_config.shift_label", "true", DF_ERR_UNSUPPORTED, "dflash_config.shift_label"},
    {"tiny-domino.json", "dflash_config.emb_dim", NULL, DF_ERR_INVALID, "emb_dim"}, // the top-level copy alone
    {"tiny-domino.json", "dflash_config.emb_dim", "0", DF_ERR_INVALID, "dflash_config.emb_dim"},
    {"tiny-domino.json", "dflash_config.emb_dim", "\"16\"", DF_ERR_INVALID, "dflash_config.emb_dim"},
    {"tiny-domino.json", "dflash_config.gru_hidden_dim", NULL, DF_ERR_INVALID, "dflash_config.gru_hidden_dim"},
    {"tiny-domino.json", "dflash_config.gru_hidden_dim", "-4", DF_ERR_INVALID, "dflash_config.gru_hidden_dim"},
    {"tiny-domino.json", "dflash_config.gru_hidden_dim", "16.5", DF_ERR_INVALID, "dflash_config.gru_hidden_dim"},
    {"tiny-domino.json", "dflash_config.pure_draft_prefix_len", "4", DF_ERR_INVALID,
     "dflash_config.pure_draft_prefix_len"},
    {"tiny-domino.json", "dflash_config.pure_draft_prefix_len", "-1", DF_ERR_INVALID,
     "dflash_config.pure_draft_prefix_len"},
    {"tiny-domino.json", "dflash_config.shift_label", "\"yes\"", DF_ERR_INVALID, "dflash_config.shift_label"},
    {"tiny-domino.json", "emb_dim", "32", DF_ERR_INVALID, "emb_dim"},
    {"tiny-domino.json", "gru_hidden_dim", "25", DF_ERR_INVALID, "gru_hidden_dim"},
    {"tiny-domino.json", "dflash_config.projector_type", "\"dspark\"", DF_ERR_INVALID, "dflash_config.projector_type"},
    {"tiny-domino.json", "dflash_config.markov_rank", "8", DF_ERR_INVALID, "dflash_config.markov_rank"},
    {"tiny-domino.json", "dflash_config.enable_confidence_head", "true", DF_ERR_INVALID,
     "dflash_config.enable_confidence_head"},
};

Test(draft_config, each_rule_names_its_key) {
  for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++)
    expect_fail_set(BAD[i].file, BAD[i].path, BAD[i].value, BAD[i].want, BAD[i].key);
}

// A draft is MoE iff it names moe_preset (moe/config.h resolves it; tests/moe/test_moe_config.c covers the
// rules). Without a preset every MoE key is an error: never a silent dense FFN.
Test(draft_config, moe_keys_need_a_preset) {
  const char *keys[][2] = {{"num_experts", "8"},
                           {"n_routed_experts", "8"},
                           {"num_experts_per_tok", "2"},
                           {"moe_intermediate_size", "512"},
                           {"n_shared_experts", "1"},
                           {"shared_expert_intermediate_size", "2048"},
                           {"dflash_config.moe_aux_loss_coeff", "0.001"},
                           {"dflash_config.moe_dispatch", "\"grouped_mm\""}};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    json_t *d = df_test_config_doc("tiny-dflash.json");
    df_test_json_set(d, keys[i][0], df_test_json(keys[i][1]));
    const df_draft_config *cfg = NULL;
    df_error err = {0};
    cr_expect_eq(parse_doc(d, &cfg, &err), DF_ERR_INVALID, "%s accepted", keys[i][0]);
    cr_expect_str_eq(err.where, keys[i][0]);
    cr_expect(strstr(err.msg, "moe_preset"), "%s", err.msg);
    cr_expect(strstr(err.hint, "moe_preset"), "%s", err.hint);
  }
  // null means "not set" (SpecForge resolves only non-null keys): a dense draft.
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "num_experts", df_test_json("null"));
  const df_draft_config *dense = parse_doc_ok(d);
  cr_expect_null(dense->moe);
  df_draft_config_free(dense);
  // A preset without the per-run sizes names the first missing one.
  d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "moe_preset", df_test_json("\"qwen3_5_moe\""));
  expect_fail(d, DF_ERR_INVALID, "n_routed_experts");
  // The file form: a preset and the sizes make an MoE draft.
  const df_draft_config *cfg = load_ok(BAD_DIR "/moe-draft.json");
  cr_assert_not_null(cfg->moe);
  cr_expect_str_eq(cfg->moe->preset, "qwen3_5_moe");
  cr_expect_eq(cfg->moe->n_routed_experts, 8);
  df_draft_config_free(cfg);
}

Test(draft_config, moe_configs_resolve) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, "qwen3.8-27b-dspark-moe.json");
  const df_draft_config *cfg = load_ok(path);
  cr_expect_eq(cfg->kind, DF_DRAFT_DSPARK);
  cr_assert_not_null(cfg->moe);
  cr_expect_str_eq(cfg->moe->preset, "qwen3_5_moe");
  cr_expect_eq(cfg->moe->n_routed_experts, 512);
  cr_expect_eq(cfg->moe->num_experts_per_tok, 10);
  cr_expect_eq(cfg->moe->moe_intermediate_size, 512);
  cr_expect_eq(cfg->moe->shared_expert_intermediate_size, 2048);
  cr_expect_eq(cfg->moe->router_center, DF_MOE_CENTER_SAMPLE);
  cr_expect_eq(cfg->moe->dispatch, DF_MOE_DISPATCH_GROUPED_MM);
  cr_expect_str_eq(cfg->moe->moe_layout, "qwen");
  cr_expect_eq(cfg->dflash.markov_rank, 256);
  df_draft_config_free(cfg);
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, "tiny-dflash-moe-deepseek.json");
  cfg = load_ok(path);
  cr_assert_not_null(cfg->moe);
  cr_expect_str_eq(cfg->moe->preset, "deepseek_v4");
  cr_expect_eq(cfg->moe->balance, DF_MOE_BALANCE_NOAUX_TC);
  df_draft_config_free(cfg);
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, "qwen3-8b-dflash.json");
  cfg = load_ok(path);
  cr_expect_null(cfg->moe);
  df_draft_config_free(cfg);
}

Test(draft_config, file_errors_name_file_and_key) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_assert_eq(df_draft_config_from_file(BAD_DIR "/mask-token-out-of-range.json", &cfg, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dflash_config.mask_token_id");
  cr_expect(strstr(err.msg, "mask-token-out-of-range.json"), "%s", err.msg);
  cr_expect(strstr(err.msg, "vocab_size"), "%s", err.msg);
  cr_expect_null(cfg);

  cr_assert_eq(df_draft_config_from_file(BAD_DIR "/no-such-file.json", &cfg, &err), DF_ERR_IO);
  cr_expect(strstr(err.where, "no-such-file.json"), "%s", err.where);
}

Test(draft_config, syntax_error_reports_line_and_column) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_assert_eq(df_draft_config_from_file(BAD_DIR "/syntax-error.json", &cfg, &err), DF_ERR_FORMAT);
  int line = 0, col = 0;
  cr_assert_eq(sscanf(err.where, "line %d, column %d", &line, &col), 2, "where: %s", err.where);
  cr_expect_eq(line, 5, "the missing comma is noticed at line 5: %s", err.msg);
  cr_expect_gt(col, 0);
  cr_expect(strstr(err.msg, "syntax-error.json:5:"), "%s", err.msg);

  const char text[] = "{\n  \"block_size\": 4,\n  \"hidden_size\": }\n";
  cr_assert_eq(df_draft_config_from_json(text, sizeof text - 1, "inline.json", &cfg, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "line 3"), "%s", err.where);
  cr_expect(strstr(err.msg, "inline.json:3:"), "%s", err.msg);
}

Test(draft_config, duplicate_keys_and_non_objects_are_rejected) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_assert_eq(df_draft_config_from_file(BAD_DIR "/duplicate-key.json", &cfg, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "duplicate"), "%s", err.msg);
  cr_expect(strstr(err.where, "line 4"), "%s", err.where);
  const char arr[] = "[1, 2]";
  cr_expect_eq(df_draft_config_from_json(arr, sizeof arr - 1, "a.json", &cfg, &err), DF_ERR_FORMAT);
  cr_expect_eq(df_draft_config_from_json("", 0, "empty.json", &cfg, &err), DF_ERR_FORMAT);
}

Test(draft_config, unknown_keys_are_kept) {
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "my_experiment", df_test_json("{\"note\": \"kept\", \"n\": 3}"));
  df_test_json_set(d, "dflash_config.future_knob", df_test_json("7"));
  const df_draft_config *c = parse_doc_ok(d);
  const json_t *v = df_draft_config_get(c, "my_experiment");
  cr_assert_not_null(v);
  cr_expect_str_eq(json_string_value(json_object_get(v, "note")), "kept");
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(c->json, "dflash_config"), "future_knob")), 7);
  cr_expect_str_eq(json_string_value(json_object_get(df_draft_config_get(c, "auto_map"), "AutoModel")),
                   "dflash.DFlashDraftModel");
  cr_expect_null(df_draft_config_get(c, "absent_key"));
  df_draft_config_free(c);
}

// The printed row "  <key>   <value>" exists.
static bool row_is(const char *buf, const char *key, const char *value) {
  for (const char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    const char *p = line + strspn(line, " ");
    size_t k = strlen(key);
    if (strncmp(p, key, k) || p[k] != ' ') continue;
    p += k + strspn(p + k, " ");
    size_t v = strlen(value);
    if (!strncmp(p, value, v) && (p[v] == '\n' || p[v] == 0)) return true;
  }
  return false;
}

Test(draft_config, print_shows_resolved_values) {
  json_t *d = df_test_config_doc("qwen3-8b-dflash.json");
  df_test_json_set(d, "dflash_config.target_layer_ids", NULL);
  df_test_json_set(d, "initializer_range", NULL);
  const df_draft_config *c = parse_doc_ok(d);
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&buf, &len);
  df_draft_config_print(c, fp);
  fclose(fp);
  cr_expect(row_is(buf, "dflash.target_layer_ids", "[1, 9, 17, 25, 33]  (K = 5, default)"), "%s", buf);
  cr_expect(row_is(buf, "initializer_range", "0.02"), "%s", buf);
  cr_expect(row_is(buf, "block_size", "16"), "%s", buf);
  cr_expect(row_is(buf, "head_dim", "128"), "%s", buf);
  cr_expect(row_is(buf, "kind", "dflash (DFlashDraftModel)"), "%s", buf);
  cr_expect(row_is(buf, "dflash.mask_token_id", "151669"), "%s", buf);
  cr_expect(strstr(buf, "auto_map"), "kept keys listed: %s", buf);
  free(buf);
  df_draft_config_free(c);
}

Test(draft_config, print_shows_the_moe_ffn) {
  const df_draft_config *c = parse_doc_ok(df_test_config_doc("qwen3.8-27b-dspark-moe.json"));
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&buf, &len);
  df_draft_config_print(c, fp);
  fclose(fp);
  cr_expect(row_is(buf, "ffn", "moe (preset qwen3_5_moe, layout qwen)"), "%s", buf);
  cr_expect(row_is(buf, "moe.experts", "512, top-10, width 512"), "%s", buf);
  cr_expect(row_is(buf, "parameters", "20.82 B total, 1.084 B active"), "%s", buf);
  cr_expect_not(strstr(buf, "n_routed_experts"), "MoE keys are interpreted, not kept: %s", buf);
  cr_expect_not(strstr(buf, "dflash_config.moe_"), "MoE keys are interpreted, not kept: %s", buf);
  free(buf);
  df_draft_config_free(c);
}
