// `draftforge inspect EXPORT`: the SGLang 0.5.23 report on real exports (clean: exit 0, the class and the
// launch line), and on exports edited to carry each flaw SGLang trips on (exit 1, the key or tensor named).
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char out[1 << 16];

static int run(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", DF_SOURCE_DIR, DF_DRAFTFORGE_BIN, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Exports fixture checkpoint `ckpt` (bfloat16) into a fresh temporary directory; dir receives it.
static void export_fixture(const char *ckpt, char *dir, size_t n) {
  char tmpl[] = "/tmp/df_inspect_export_XXXXXX";
  cr_assert_not_null(mkdtemp(tmpl));
  snprintf(dir, n, "%s/export", tmpl);
  char args[2048];
  snprintf(args, sizeof args, "export %s --out %s", ckpt, dir);
  cr_assert_eq(run(args), 0, "%s", out);
}

// Removes the temporary directory export_fixture made (the parent of dir).
static void remove_export(const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(strrchr(dir, '/') - dir), dir);
  cr_assert_eq(system(cmd), 0);
}

// Loads dir/config.json, lets edit change it, writes it back.
static void edit_config(const char *dir, void (*edit)(json_t *)) {
  char p[2048];
  snprintf(p, sizeof p, "%s/config.json", dir);
  json_t *c = json_load_file(p, 0, NULL);
  cr_assert_not_null(c);
  edit(c);
  cr_assert_eq(json_dump_file(c, p, JSON_INDENT(2)), 0);
  json_decref(c);
}

static void expect_problem(const char *dir, void (*edit)(json_t *), const char *named) {
  char args[2048];
  edit_config(dir, edit);
  snprintf(args, sizeof args, "inspect %s", dir);
  cr_expect_eq(run(args), 1, "%s", out);
  char line[256];
  snprintf(line, sizeof line, "PROBLEM  %s", named);
  cr_expect_not_null(strstr(out, line), "expected a PROBLEM line for %s:\n%s", named, out);
}

Test(inspect_export, clean_dspark_export_reports_the_class_keys_and_launch_line) {
  char dir[1024], args[2048];
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  snprintf(args, sizeof args, "inspect %s", dir);
  cr_assert_eq(run(args), 0, "%s", out);
  cr_expect_not_null(strstr(out, "Qwen3DSparkModel: stock SGLang"), "%s", out);
  cr_expect_not_null(strstr(out, "--speculative-algorithm DSPARK"), "%s", out);
  cr_expect_not_null(strstr(out, "--speculative-num-draft-tokens 5"), "DSpark verifies block_size + 1: %s", out);
  cr_expect_not_null(strstr(out, "confidence_head_with_markov    false        top level"), "%s", out);
  cr_expect_not_null(strstr(out, "serving: 0 problem(s)"), "%s", out);
  remove_export(dir);
}

Test(inspect_export, clean_dflash_export) {
  char dir[1024], args[2048];
  export_fixture("tests/fixtures/dflash_step/draft_ckpt", dir, sizeof dir);
  snprintf(args, sizeof args, "inspect %s", dir);
  cr_assert_eq(run(args), 0, "%s", out);
  cr_expect_not_null(strstr(out, "--speculative-algorithm DFLASH"), "%s", out);
  cr_expect_not_null(strstr(out, "--speculative-num-draft-tokens 4"), "%s", out);
  remove_export(dir);
}

static void drop_top_markov_rank(json_t *c) { json_object_del(c, "markov_rank"); }
static void drop_conf_with_markov(json_t *c) { json_object_del(c, "confidence_head_with_markov"); }
static void drop_mask(json_t *c) { json_object_del(json_object_get(c, "dflash_config"), "mask_token_id"); }
static void drop_layers(json_t *c) { json_object_del(json_object_get(c, "dflash_config"), "target_layer_ids"); }
static void gated_on_top(json_t *c) { json_object_set_new(c, "markov_head_type", json_string("gated")); }
static void yarn_params_only(json_t *c) {
  json_object_set_new(c, "rope_parameters",
                      json_pack("{s:s, s:f, s:i, s:f}", "rope_type", "yarn", "factor", 4.0,
                                "original_max_position_embeddings", 1024, "rope_theta", 1e6));
  json_object_set_new(c, "rope_scaling", json_null());
}
static void drop_head_dim(json_t *c) { json_object_del(c, "head_dim"); }
static void gemma_norm_and_no_anchor(json_t *c) {
  json_object_set_new(c, "use_gemma_norm", json_true());
  json_object_set_new(c, "sample_from_anchor", json_false());
  json_object_set_new(json_object_get(c, "dflash_config"), "conv_kernel_size", json_integer(3));
}

Test(inspect_export, flags_each_key_sglang_would_read_wrongly) {
  char dir[1024];
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  expect_problem(dir, drop_top_markov_rank, "markov_rank");
  remove_export(dir);
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  // the file's head is [1, H] (with_markov false); SGLang's default (rank > 0) wants [1, H + r]
  expect_problem(dir, drop_conf_with_markov, "confidence_head_with_markov");
  cr_expect_not_null(strstr(out, "PROBLEM  confidence_head.proj.weight"), "the shape is flagged too: %s", out);
  remove_export(dir);
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  expect_problem(dir, drop_mask, "mask_token_id");
  cr_expect_not_null(strstr(out, "DSpark refuses to load"), "%s", out);
  remove_export(dir);
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  // a top-level head type that disagrees with dflash_config: SGLang builds one head and parses the other;
  // draftforge's own reading already refuses it, naming the key
  char args[2048];
  edit_config(dir, gated_on_top);
  snprintf(args, sizeof args, "inspect %s", dir);
  cr_expect_eq(run(args), 1, "%s", out);
  cr_expect_not_null(strstr(out, "markov_head_type: conflicts with dflash_config"), "%s", out);
  remove_export(dir);
  export_fixture("tests/fixtures/dflash_step/draft_ckpt", dir, sizeof dir);
  expect_problem(dir, drop_layers, "target_layer_ids");
  remove_export(dir);
  export_fixture("tests/fixtures/dflash_step/draft_ckpt", dir, sizeof dir);
  // without head_dim SGLang (and draftforge) take Qwen3Config's 128: the tensors no longer fit
  expect_problem(dir, drop_head_dim, "layers.0.self_attn.q_norm.weight");
  cr_expect_not_null(strstr(out, "head_dim                       128          Qwen3Config default"), "%s", out);
  remove_export(dir);
  // keys that make SGLang build another model from the same tensors: each one flagged
  export_fixture("tests/fixtures/dspark_step/ckpt_rnn", dir, sizeof dir);
  expect_problem(dir, gemma_norm_and_no_anchor, "use_gemma_norm");
  cr_expect_not_null(strstr(out, "PROBLEM  sample_from_anchor"), "%s", out);
  cr_expect_not_null(strstr(out, "PROBLEM  dflash_config.conv_kernel_size"), "%s", out);
  remove_export(dir);
}

Test(inspect_export, flags_rope_that_only_transformers_5_sees) {
  char dir[1024];
  export_fixture("tests/fixtures/dflash_step/draft_ckpt", dir, sizeof dir);
  expect_problem(dir, yarn_params_only, "rope");
  cr_expect_not_null(strstr(out, "mirror rope_parameters into rope_scaling"), "%s", out);
  remove_export(dir);
}

// One more layer than the file has: every layers.<n>.* tensor is missing.
static void one_more_layer(json_t *cfg) {
  json_int_t n = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
  json_object_set_new(cfg, "num_hidden_layers", json_integer(n + 1));
  json_t *lt = json_object_get(cfg, "layer_types");
  if (json_is_array(lt)) json_array_append_new(lt, json_string("full_attention"));
}

Test(inspect_export, a_missing_tensor_is_a_problem_naming_it) {
  char dir[1024], args[2048];
  export_fixture("tests/fixtures/dflash_step/draft_ckpt", dir, sizeof dir);
  snprintf(args, sizeof args, "%s/config.json", dir);
  json_t *c = json_load_file(args, 0, NULL);
  cr_assert_not_null(c);
  char name[64];
  snprintf(name, sizeof name, "layers.%lld.self_attn.k_proj.weight",
           (long long)json_integer_value(json_object_get(c, "num_hidden_layers")));
  json_decref(c);
  expect_problem(dir, one_more_layer, name);
  cr_expect_not_null(strstr(out, "uninitialised"), "%s", out);
  remove_export(dir);
}

static void center_again(json_t *c) {
  json_object_set_new(json_object_get(c, "dflash_config"), "moe_router_center", json_string("sample"));
}

Test(inspect_export, moe_export_names_the_external_class_and_flags_a_second_centering) {
  char dir[1024], args[2048];
  export_fixture("tests/fixtures/moe_step/moe_ckpt_qwen", dir, sizeof dir);
  snprintf(args, sizeof args, "inspect %s", dir);
  cr_assert_eq(run(args), 0, "%s", out);
  cr_expect_not_null(strstr(out, "DFlashMoEDraftModel: NOT in stock SGLang 0.5.23"), "%s", out);
  cr_expect_not_null(strstr(out, "SGLANG_EXTERNAL_MODEL_PACKAGE=YOUR_PACKAGE python -m sglang.launch_server"), "%s",
                     out);
  expect_problem(dir, center_again, "moe_router_center");
  remove_export(dir);
}
