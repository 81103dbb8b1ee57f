// Recipe YAML: defaults, path resolution, inert and default-only keys, and one test per class of bad recipe
// (unknown key with line/column and the valid keys, wrong type, range, unsupported value, missing key, ...).
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "tests/common/fixture.h"
#include "train/recipe/recipe.h"
#include "train/recipe/recipe_schema.h"

#define HEAD                                                                                                           \
  "model:\n"                                                                                                           \
  "  target_model_path: /models/target\n"                                                                              \
  "data:\n"                                                                                                            \
  "  hidden_states_path: /data/hs\n"

static df_status parse(const char *text, const df_recipe **out, df_error *err) {
  return df_recipe_parse(text, strlen(text), "t.yaml", "/base", NULL, out, err);
}

// Parses text expecting failure with status st; returns the error.
static df_error parse_fail(const char *text, df_status st) {
  const df_recipe *r = NULL;
  df_error err = {0};
  df_status got = parse(text, &r, &err);
  cr_assert_eq(got, st, "expected %s, got %s: %s", df_status_name(st), df_status_name(got), err.msg);
  cr_assert_null(r);
  return err;
}

static const df_recipe *parse_ok(const char *text) {
  const df_recipe *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(parse(text, &r, &err), &err);
  return r;
}

Test(recipe, minimal_takes_the_defaults) {
  const df_recipe *r = parse_ok(HEAD "training:\n  strategy: dflash\n");
  cr_expect_str_eq(r->model.target_model_path, "/models/target");
  cr_expect_null(r->model.draft_model_config);
  cr_expect_null(r->model.draft_checkpoint_path);
  cr_expect_str_eq(r->model.embedding_key, "model.embed_tokens.weight");
  cr_expect_str_eq(r->model.lm_head_key, "lm_head.weight");
  cr_expect_not(r->model.has_mask_token_id);
  cr_expect_eq(r->data.max_length, 2048);
  cr_expect_eq(r->training.batch_size, 1);
  cr_expect_eq(r->training.num_anchors, 512);
  cr_expect_eq(r->training.loss_decay_gamma, 0.0);
  cr_expect_eq(r->training.objective_chunk_blocks, 128);
  df_strategy_values v = df_recipe_strategy_values(r); // the strategy's own keys, read by name
  cr_expect_str_eq(df_strategy_text(&v, "loss_type", NULL), "dflash");
  cr_expect_eq(df_strategy_number(&v, "dpace_alpha", -1), 0.5);
  cr_expect(df_recipe_is_default(r, "training", "dpace_alpha"));
  cr_expect_eq(r->training.seed, 42);
  cr_expect_str_eq(r->run_id, "specforge-run");
  cr_expect_str_eq(r->output_dir, "/base/output"); // relative paths, defaults too, from the base (the cwd)
  df_recipe_free(r);
}

Test(recipe, full_file_with_inert_and_default_keys) {
  const df_recipe *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_load(DF_FIXTURE_DIR "/recipes/good-full.yaml", NULL, &r, &err), &err);
  // relative paths are taken from the current directory (the tests run from the source root), as SpecForge's
  cr_expect_str_eq(r->model.target_model_path, DF_SOURCE_DIR "/tests/fixtures/configs/tiny-target");
  cr_expect_str_eq(r->model.draft_model_config, DF_SOURCE_DIR "/configs/tiny-dflash.json");
  cr_expect_str_eq(r->data.hidden_states_path, "/data/hs"); // absolute: unchanged
  cr_expect_str_eq(r->output_dir, DF_SOURCE_DIR "/out");
  cr_expect_str_eq(r->run_id, "tiny");
  cr_expect(r->model.has_mask_token_id);
  cr_expect_eq(r->model.mask_token_id, 7);
  cr_expect_eq(r->data.max_length, 3072);
  cr_expect_eq(r->training.batch_size, 4);
  cr_expect_eq(r->training.num_anchors, 256);
  cr_expect_eq(r->training.loss_decay_gamma, 7.0);
  cr_expect_eq(r->training.objective_chunk_blocks, 0);
  df_strategy_values v = df_recipe_strategy_values(r);
  cr_expect_str_eq(df_strategy_text(&v, "loss_type", NULL), "dpace-continuation-value-only");
  cr_expect_eq(df_strategy_number(&v, "dpace_alpha", -1), 0.25);
  cr_expect_not(df_recipe_is_default(r, "training", "dpace_alpha"));
  cr_expect_null(df_strategy_text(&v, "no_such_key", NULL), "a key the schema lacks has no value");
  cr_expect_eq(r->training.seed, 7);
  df_recipe_free(r);
}

Test(recipe, null_gamma_and_yaml_forms) {
  const df_recipe *r = parse_ok(HEAD "training:\n  strategy: \"dflash\"\n  loss_decay_gamma: ~\n  seed: 3.0\n"
                                     "  dpace_alpha: 1\n  loss_type: 'dpace'\n"
                                     "profiling: {enabled: off, start_step: 3}\n");
  cr_expect_eq(r->training.loss_decay_gamma, 0.0);
  cr_expect_eq(r->training.seed, 3);
  df_strategy_values v = df_recipe_strategy_values(r);
  cr_expect_eq(df_strategy_number(&v, "dpace_alpha", -1), 1.0, "an integer reads as a number");
  cr_expect_str_eq(df_strategy_text(&v, "loss_type", NULL), "dpace");
  df_recipe_free(r);
}

Test(recipe, unknown_key_names_line_column_and_valid_keys) {
  const df_recipe *r = NULL;
  df_error err = {0};
  char logbuf[8192] = {0};
  FILE *log = fmemopen(logbuf, sizeof logbuf - 1, "w");
  df_recipe_options opt = {.log = log};
  df_status st = df_recipe_load(DF_FIXTURE_DIR "/recipes/bad-unknown-key.yaml", &opt, &r, &err);
  fclose(log);
  cr_assert_eq(st, DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.num_anchor");
  cr_expect(strstr(err.msg, "bad-unknown-key.yaml:7:3: unknown key 'num_anchor' in section 'training'"), "%s", err.msg);
  cr_expect(strstr(err.hint, "did you mean 'num_anchors'?"), "%s", err.hint);
  cr_expect(strstr(err.hint, "valid keys: strategy, num_epochs, max_steps"), "%s", err.hint);
  cr_expect(strstr(err.hint, "more (`draftforge schema` lists every key)"), "%s", err.hint);
  // the error comes first, with the suggestion in its message: nothing is printed ahead of it (the whole key
  // list used to go to the log before the error)
  cr_expect(strstr(err.msg, "(did you mean 'num_anchors'?)"), "%s", err.msg);
  cr_expect_str_eq(logbuf, "");
}

Test(recipe, unknown_top_level_and_nested_keys) {
  df_error e = parse_fail(HEAD "trainig:\n  strategy: dflash\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "t.yaml:5:1: unknown key 'trainig' in the top level"), "%s", e.msg);
  cr_expect(strstr(e.hint, "did you mean 'training'?"), "%s", e.hint);
  e = parse_fail(HEAD "training:\n  strategy: dflash\ndeployment:\n  trainer:\n    nodes: 1\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "deployment.trainer.nodes");
  cr_expect(strstr(e.msg, "t.yaml:9:5:"), "%s", e.msg);
  cr_expect(strstr(e.hint, "nnodes"), "%s", e.hint);
}

Test(recipe, wrong_type_names_key_and_line) {
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_assert_eq(df_recipe_load(DF_FIXTURE_DIR "/recipes/bad-wrong-type.yaml", NULL, &r, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.batch_size");
  cr_expect(strstr(err.msg, "bad-wrong-type.yaml:7:15: training.batch_size: expected an integer, got a string 'four'"),
            "%s", err.msg);
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  num_anchors: \"64\"\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "expected an integer, got a string '64'"), "%s", e.msg);
  cr_expect(strstr(e.hint, "without quotes"), "%s", e.hint);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  num_anchors: 1.5\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "training.num_anchors: expected an integer"), "%s", e.msg);
  e = parse_fail(HEAD "run_id: 2024\ntraining:\n  strategy: dflash\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "run_id: expected a string, got an integer '2024'"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  seed: [1, 2]\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "training.seed: expected integer, got a list"), "%s", e.msg);
  e = parse_fail(HEAD "training: 3\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "training: expected a mapping"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "training: expected a mapping, got null"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n  strategy: dflash\nprofiling:\n  enabled: 1\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "profiling.enabled: expected true or false"), "%s", e.msg);
}

Test(recipe, out_of_range_and_bad_choice) {
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  dpace_alpha: 1.5\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "t.yaml:7:16: training.dpace_alpha: 1.5 is out of range (must be >= 0 and <= 1)"), "%s",
            e.msg);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  num_anchors: 0\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "0 is out of range (must be > 0)"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  objective_chunk_blocks: -1\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.objective_chunk_blocks");
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  loss_type: dpace_p\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "'dpace_p' is not a valid choice"), "%s", e.msg);
  cr_expect(strstr(e.hint, "dpace-cumulative-confidence-only"), "%s", e.hint);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  loss_decay_gamma: -1\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.loss_decay_gamma");
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  learning_rate: .inf\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "not finite"), "%s", e.msg);
  // Domino's keys and draftforge step's schedule position
  e = parse_fail(HEAD "training:\n  strategy: domino\n  lambda_base_decay_ratio: -0.5\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.lambda_base_decay_ratio");
  e = parse_fail(HEAD "training:\n  strategy: domino\n  lambda_base_start: one\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.lambda_base_start");
  e = parse_fail(HEAD "training:\n  strategy: domino\n  global_step: -3\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.global_step");
  e = parse_fail(HEAD "training:\n  strategy: domino\n  global_step: 2.5\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.global_step");
}

Test(recipe, unsupported_non_default_value) {
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_assert_eq(df_recipe_load(DF_FIXTURE_DIR "/recipes/bad-unsupported.yaml", NULL, &r, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "training.tp_size");
  cr_expect(strstr(err.msg, "bad-unsupported.yaml:7:12: training.tp_size = 2 is not supported"), "%s", err.msg);
  cr_expect(strstr(err.hint, "default (1)"), "%s", err.hint);
  // the same key at its default is accepted, as are inert keys with any valid value
  df_recipe_free(parse_ok(HEAD "training:\n  strategy: dflash\n  tp_size: 1\n  dist_timeout: 99\n"
                               "  attention_backend: sdpa\n"));
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  attention_backend: usp\n", DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(e.where, "training.attention_backend");
  df_recipe_free(parse_ok(HEAD "training:\n  strategy: domino\n")); // listed by the registry: supported
  df_recipe_free(parse_ok(HEAD "training:\n  strategy: peagle\n  num_depths: 5\n"));
  e = parse_fail(HEAD "deployment:\n  disaggregated:\n    control_dir: /x\ntraining:\n  strategy: dflash\n",
                 DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(e.where, "deployment.disaggregated");
  e = parse_fail("model:\n  target_model_path: /t\n  draft_block_size: 8\ndata:\n  hidden_states_path: "
                 "/d\ntraining:\n  strategy: dflash\n",
                 DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(e.where, "model.draft_block_size");
}

// SpecForge's default strategy, and EAGLE-3's own keys (model.aux_hidden_state_layer_ids, vocab_mapping_path, the
// training keys of its strategy table).
Test(recipe, default_strategy_is_eagle3) {
  const df_recipe *r = parse_ok("model:\n  target_model_path: /t\n  aux_hidden_state_layer_ids: [2, 5, 9]\n"
                                "  vocab_mapping_path: cache/map.pt\ndata:\n  hidden_states_path: /d\n");
  cr_expect_str_eq(r->training.strategy, "eagle3");
  cr_expect_eq(r->model.num_aux_layer_ids, 3);
  cr_expect_eq(r->model.aux_layer_ids[2], 9);
  cr_expect_str_eq(r->model.vocab_mapping_path, "cache/map.pt");
  const df_strategy_values v = df_recipe_strategy_values(r);
  cr_expect_eq(df_strategy_number(&v, "ttt_length", 0), 7.0);
  cr_expect_null(df_strategy_text(&v, "lk_loss_type", NULL), "null: the forward KL");
  df_recipe_free(r);
  r = parse_ok(HEAD "training:\n  ttt_length: 3\n  lk_loss_type: lambda\n  kl_decay: 2\n  compact_teacher: true\n");
  const df_strategy_values w = df_recipe_strategy_values(r);
  cr_expect_eq(df_strategy_number(&w, "ttt_length", 0), 3.0);
  cr_expect_str_eq(df_strategy_text(&w, "lk_loss_type", NULL), "lambda");
  cr_expect_eq(df_strategy_number(&w, "kl_decay", 0), 2.0);
  cr_expect_eq(df_strategy_number(&w, "compact_teacher", 0), 1.0, "a bool reads as 0 / 1");
  df_recipe_free(r);
  df_error e = parse_fail(HEAD "training:\n  ttt_length: 0\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.ttt_length");
  e = parse_fail(HEAD "training:\n  lk_loss_type: beta\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.lk_loss_type");
}

Test(recipe, missing_required_key) {
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_assert_eq(df_recipe_load(DF_FIXTURE_DIR "/recipes/bad-missing-required.yaml", NULL, &r, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "model.target_model_path");
  cr_expect(strstr(err.msg, "missing required key model.target_model_path"), "%s", err.msg);
  df_error e = parse_fail("model:\n  target_model_path: /t\ntraining:\n  strategy: dflash\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data");
}

Test(recipe, duplicate_key_and_syntax_errors) {
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  seed: 1\n  seed: 2\n", DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "t.yaml:8:3: duplicate key 'seed' (first at line 7)"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n  strategy: [dflash\n", DF_ERR_FORMAT);
  cr_expect(strstr(e.msg, "t.yaml:"), "%s", e.msg);
  cr_expect(strstr(e.msg, "YAML error"), "%s", e.msg);
  e = parse_fail("", DF_ERR_FORMAT);
  cr_expect(strstr(e.msg, "empty recipe"), "%s", e.msg);
  e = parse_fail("- a\n- b\n", DF_ERR_FORMAT);
  cr_expect(strstr(e.msg, "not a mapping"), "%s", e.msg);
  e = parse_fail(HEAD "training:\n  strategy: dflash\n---\nmodel: {}\n", DF_ERR_FORMAT);
  cr_expect(strstr(e.msg, "more than one YAML document"), "%s", e.msg);
}

Test(recipe, file_errors) {
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_expect_eq(df_recipe_load("/nonexistent/recipe.yaml", NULL, &r, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "/nonexistent/recipe.yaml");
}

Test(recipe, schema_table_is_consistent) {
  const df_recipe_key *t = df_recipe_schema();
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    // every row's section exists, defaults parse and pass their own checks, no duplicates
    if (t[i].section[0]) {
      char parent[128];
      snprintf(parent, sizeof parent, "%s", t[i].section);
      char *dot = strrchr(parent, '.');
      char *key = dot ? dot + 1 : parent;
      if (dot) *dot = 0;
      size_t kl = strlen(key);
      bool items = kl > 2 && !strcmp(key + kl - 2, "[]"); // the item keys of a list of mappings
      if (items) key[kl - 2] = 0;
      int p = df_recipe_schema_find(dot ? parent : "", key);
      cr_expect(p >= 0 && t[p].type == (items ? DF_RT_MAPPING_LIST : DF_RT_SECTION), "%s.%s: no parent section",
                t[i].section, t[i].key);
    }
    cr_expect_eq(df_recipe_schema_find(t[i].section, t[i].key), i, "duplicate row %s.%s", t[i].section, t[i].key);
    cr_expect(t[i].support != DF_RS_DEFAULT_ONLY || t[i].note, "%s.%s: default-only without a note", t[i].section,
              t[i].key);
    cr_expect(t[i].type != DF_RT_ENUM || t[i].choices, "%s.%s: enum without choices", t[i].section, t[i].key);
  }
  char buf[32768] = {0};
  FILE *fp = fmemopen(buf, sizeof buf - 1, "w");
  df_recipe_print_schema(fp);
  fclose(fp);
  cr_expect(strstr(buf, "training.num_anchors"), "%s", buf);
}

// ---- the trainer's keys, --set overrides, the resolved recipe, SpecForge's example -----------------------------

static const df_recipe *parse_with(const char *text, const char *const *sets, int n, df_error *err, df_status *st) {
  const df_recipe *r = NULL;
  df_recipe_options o = {.overrides = sets, .n_overrides = n};
  *st = df_recipe_parse(text, strlen(text), "t.yaml", "/base", &o, &r, err);
  return r;
}

Test(recipe, trainer_keys_and_defaults) {
  const df_recipe *r = parse_ok(HEAD "training:\n  strategy: dflash\n");
  cr_expect_eq(r->training.num_epochs, 1);
  cr_expect_eq(r->training.max_steps, 0);
  cr_expect_eq(r->training.total_steps, 0);
  cr_expect_eq(r->training.accumulation_steps, 1);
  cr_expect_eq(r->training.learning_rate, 1e-4);
  cr_expect_eq(r->training.lr_scheduler, DF_LR_COSINE);
  cr_expect_eq(r->training.warmup_ratio, 0.015);
  cr_expect_eq(r->training.max_grad_norm, 0.5);
  cr_expect_eq(r->training.weight_decay, 0.0);
  cr_expect_eq(r->training.adam_beta1, 0.9);
  cr_expect_eq(r->training.adam_beta2, 0.999);
  cr_expect_eq(r->training.adam_eps, 1e-8);
  cr_expect_eq(r->training.log_interval, 50);
  cr_expect_eq(r->training.save_interval, 0);
  cr_expect_eq(r->training.max_checkpoints, 0);
  cr_expect_null(r->training.resume_from);
  cr_expect_null(r->data.eval_hidden_states_path);
  df_recipe_free(r);
  r = parse_ok(HEAD "training:\n  strategy: dflash\n  lr_scheduler: constant\n  accumulation_steps: 8\n"
                    "  resume_from: runs/a\n  adam_beta2: 0.95\n");
  cr_expect_eq(r->training.lr_scheduler, DF_LR_CONSTANT);
  cr_expect_eq(r->training.accumulation_steps, 8);
  cr_expect_str_eq(r->training.resume_from, "/base/runs/a");
  cr_expect_eq(r->training.adam_beta2, 0.95);
  df_recipe_free(r);
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  adam_beta1: 1.0\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.adam_beta1");
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  max_steps: 20\n  total_steps: 10\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.max_steps");
  e = parse_fail(HEAD "training:\n  strategy: dflash\n  eval_interval: 10\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.eval_interval");
}

Test(recipe, set_overrides) {
  const char *sets[] = {"training.batch_size=8",      "output_dir=runs/x",      "deployment.trainer.nnodes=1",
                        "training.loss_decay_gamma=", "training.max_steps=100", "data.hidden_states_path=/abs/hs",
                        "training.batch_size=16"};
  df_error err = {0};
  df_status st;
  const df_recipe *r =
      parse_with(HEAD "training:\n  strategy: dflash\n  batch_size: 2\n  loss_decay_gamma: 7\n", sets, 7, &err, &st);
  DF_ASSERT_OK(st, &err);
  cr_expect_eq(r->training.batch_size, 16, "the last --set of a key wins");
  cr_expect_str_eq(r->output_dir, "/base/runs/x", "--set paths are taken from the base (the cwd) like the file's");
  cr_expect_str_eq(r->data.hidden_states_path, "/abs/hs");
  cr_expect_eq(r->training.loss_decay_gamma, 0.0, "an empty value is null");
  cr_expect_eq(r->training.max_steps, 100);
  df_recipe_free(r);
}

Test(recipe, set_errors_name_the_key) {
  df_error err = {0};
  df_status st;
  const char *a[] = {"training.num_anchor=3"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", a, 1, &err, &st));
  cr_expect_eq(st, DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.num_anchor");
  cr_expect(strstr(err.msg, "--set 'training.num_anchor=3'"), "%s", err.msg);
  cr_expect(strstr(err.hint, "did you mean 'num_anchors'? valid keys: strategy"), "%s", err.hint);
  const char *b[] = {"traning.seed=1"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", b, 1, &err, &st));
  cr_expect_str_eq(err.where, "traning");
  cr_expect(strstr(err.hint, "did you mean 'training'?"), "%s", err.hint);
  const char *c[] = {"training.seed=abc"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", c, 1, &err, &st));
  cr_expect_str_eq(err.where, "training.seed");
  cr_expect(strstr(err.msg, "expected an integer, got a string 'abc'"), "%s", err.msg);
  const char *d[] = {"training.tp_size=2"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", d, 1, &err, &st));
  cr_expect_eq(st, DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "training.tp_size");
  const char *e[] = {"training=1"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", e, 1, &err, &st));
  cr_expect(strstr(err.msg, "is a section"), "%s", err.msg);
  const char *f[] = {"training.seed"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", f, 1, &err, &st));
  cr_expect(strstr(err.msg, "expected section.key=value"), "%s", err.msg);
  const char *g[] = {"training.seed=[1"};
  cr_expect_null(parse_with(HEAD "training:\n  strategy: dflash\n", g, 1, &err, &st));
  cr_expect(strstr(err.msg, "not valid YAML"), "%s", err.msg);
}

// Writes r's resolved YAML into a string (owned by the caller).
static char *resolved_text(const df_recipe *r) {
  char *text = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&text, &len);
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_write_resolved(r, fp, &err), &err);
  fclose(fp);
  return text;
}

Test(recipe, resolved_recipe_round_trips) {
  const df_recipe *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_load(DF_FIXTURE_DIR "/recipes/good-full.yaml", NULL, &r, &err), &err);
  char *a = resolved_text(r);
  cr_expect(strstr(a, "  loss_type: \"dpace-continuation-value-only\"\n"), "%s", a);
  cr_expect(strstr(a, "  adam_eps: 1e-08\n"), "%s", a);
  cr_expect(strstr(a, "    nnodes: 1\n"), "%s", a);
  cr_expect(strstr(a, "  disaggregated: null\n"), "%s", a);
  const df_recipe *r2 = NULL;
  DF_ASSERT_OK(df_recipe_parse(a, strlen(a), "resolved.yaml", "/elsewhere", NULL, &r2, &err), &err);
  char *b = resolved_text(r2);
  // identical but for the header line naming the source
  cr_expect_str_eq(strchr(a, '\n'), strchr(b, '\n'));
  cr_expect_str_eq(r2->model.target_model_path, r->model.target_model_path);
  const df_strategy_values v1 = df_recipe_strategy_values(r), v2 = df_recipe_strategy_values(r2);
  cr_expect_eq(df_strategy_number(&v2, "dpace_alpha", -1), df_strategy_number(&v1, "dpace_alpha", -2));
  free(a), free(b);
  df_recipe_free(r), df_recipe_free(r2);
}

// SpecForge's own example recipes (with their hub ids and checkout-relative paths) are tested in
// tests/train/test_specforge_recipes.c.

// deployment.trainer records which keys were written (an unwritten default demands nothing of the launcher);
// training.dist_timeout is minutes, fractions allowed.
Test(recipe, deployment_trainer_and_dist_timeout) {
  const df_recipe *r = parse_ok(HEAD "training:\n  strategy: dflash\n");
  cr_expect_eq(r->training.dist_timeout, 10.0);
  cr_expect(!r->deployment.trainer.nnodes_set && !r->deployment.trainer.nproc_per_node_set);
  cr_expect(!r->deployment.trainer.node_rank_set && !r->deployment.trainer.master_port_set);
  cr_expect(r->deployment.trainer.nnodes == 1 && r->deployment.trainer.nproc_per_node == 1);
  cr_expect(r->deployment.trainer.master_port == 29500 && r->deployment.trainer.master_addr == NULL);
  df_recipe_free(r);
  r = parse_ok(HEAD "training:\n  strategy: dflash\n  dist_timeout: 0.25\ndeployment:\n  trainer:\n"
                    "    nproc_per_node: 4\n    master_addr: n0\n    node_rank: 0\n");
  cr_expect_eq(r->training.dist_timeout, 0.25);
  cr_expect(r->deployment.trainer.nproc_per_node_set && r->deployment.trainer.nproc_per_node == 4);
  cr_expect(!r->deployment.trainer.nnodes_set);
  cr_expect(r->deployment.trainer.node_rank_set && r->deployment.trainer.node_rank == 0);
  cr_expect_str_eq(r->deployment.trainer.master_addr, "n0");
  df_recipe_free(r);
  const char *sets[] = {"deployment.trainer.master_port=29555", "training.dist_timeout=3"};
  df_error err = {0};
  df_status st;
  r = parse_with(HEAD "training:\n  strategy: dflash\n", sets, 2, &err, &st);
  DF_ASSERT_OK(st, &err);
  cr_expect(r->deployment.trainer.master_port_set && r->deployment.trainer.master_port == 29555, "--set counts");
  cr_expect_eq(r->training.dist_timeout, 3.0);
  df_recipe_free(r);
  df_error e = parse_fail(HEAD "training:\n  strategy: dflash\n  dist_timeout: 0\n", DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.dist_timeout");
}
