// Recipe paths as SpecForge resolves them (train/recipe/recipe_paths.c): relative to the current directory, file://
// and ~ handled, inputs checked with the directory named, hub ids found offline in the Hugging Face cache
// (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, ~/.cache; model.cache_dir first) through refs/main; the feature
// gates (train/recipe/recipe_features.c) and the inert-key line; paths as messages show them (train/run/run_dir.h).
// Each test runs in its own process, in a sandbox.
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/path.h"
#include "tests/common/fixture.h"
#include "train/recipe/recipe.h"
#include "train/run/run_dir.h"

static char sandbox[PATH_MAX];

static void mkdirs(const char *rel) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "mkdir -p '%s/%s'", sandbox, rel);
  cr_assert_eq(system(p), 0, "%s", p);
}

static void touch(const char *rel, const char *text) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof p, "%s/%s", sandbox, rel);
  FILE *fp = fopen(p, "w");
  cr_assert_not_null(fp, "%s", p);
  fputs(text, fp);
  fclose(fp);
}

// A cached hub model under root (relative to the sandbox): refs/main -> snapshots/<rev>/config.json.
static void cache_model(const char *root, const char *folder, const char *rev, bool with_ref) {
  char d[PATH_MAX];
  snprintf(d, sizeof d, "%s/%s/snapshots/%s", root, folder, rev);
  mkdirs(d);
  snprintf(d, sizeof d, "%s/%s/snapshots/%s/config.json", root, folder, rev);
  touch(d, "{}\n");
  if (!with_ref) return;
  snprintf(d, sizeof d, "%s/%s/refs", root, folder);
  mkdirs(d);
  snprintf(d, sizeof d, "%s/%s/refs/main", root, folder);
  touch(d, rev); // the hub writes the hash without a newline
}

static void enter_sandbox(void) {
  snprintf(sandbox, sizeof sandbox, "/tmp/df_recipe_paths_XXXXXX");
  cr_assert_not_null(mkdtemp(sandbox));
  cr_assert_eq(chdir(sandbox), 0);
  static const char *const vars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
  char home[PATH_MAX + 8];
  snprintf(home, sizeof home, "%s/home", sandbox);
  setenv("HOME", home, 1);
  mkdirs("home");
  mkdirs("data/hs");
  mkdirs("configs");
  touch("configs/draft.json", "{}\n");
}

static void leave_sandbox(void) {
  char cmd[PATH_MAX + 16];
  if (chdir("/") != 0) return;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", sandbox);
  cr_expect_eq(system(cmd), 0);
}

TestSuite(recipe_paths, .init = enter_sandbox, .fini = leave_sandbox);

static df_status parse(const char *text, const char *const *sets, int n, FILE *log, const df_recipe **r,
                       df_error *err) {
  df_recipe_options o = {.overrides = sets, .n_overrides = n, .log = log};
  return df_recipe_parse(text, strlen(text), "r.yaml", NULL, &o, r, err);
}

#define RECIPE(target)                                                                                                 \
  "model:\n  target_model_path: " target "\n  draft_model_config: configs/draft.json\n"                                \
  "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n"

static const df_recipe *parse_ok(const char *text) {
  const df_recipe *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(parse(text, NULL, 0, NULL, &r, &err), &err);
  return r;
}

static char *at(const char *rel) {
  static char buf[4][PATH_MAX * 2];
  static int k;
  char *b = buf[k++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", sandbox, rel);
  return b;
}

Test(recipe_paths, relative_paths_are_taken_from_the_current_directory_and_made_absolute) {
  mkdirs("models/target");
  const df_recipe *r = parse_ok("output_dir: ./out/../runs/x\n" RECIPE("./models/target"));
  cr_expect_str_eq(r->model.target_model_path, at("models/target"));
  cr_expect_str_eq(r->model.draft_model_config, at("configs/draft.json"));
  cr_expect_str_eq(r->data.hidden_states_path, at("data/hs"));
  cr_expect_str_eq(r->output_dir, at("runs/x"), "normalised like os.path.abspath");
  df_recipe_free(r);
  r = parse_ok("output_dir: ~/runs\n" RECIPE("file://models/target"));
  cr_expect_str_eq(r->model.target_model_path, at("models/target"), "file:// is dropped");
  cr_expect_str_eq(r->output_dir, at("home/runs"), "~ is $HOME");
  df_recipe_free(r);
}

// A resolved (absolute) path is shown as the user would type it from the current directory when it lies under it.
Test(recipe_paths, messages_show_paths_relative_to_the_current_directory_when_under_it) {
  char shown[PATH_MAX], want[PATH_MAX * 2];
  df_path_shown(at("runs/x"), shown, sizeof shown);
  cr_expect_str_eq(shown, "runs/x");
  df_path_shown("sub/../runs/./x/", shown, sizeof shown);
  cr_expect_str_eq(shown, "runs/x");
  df_path_shown(sandbox, shown, sizeof shown);
  cr_expect_str_eq(shown, ".");
  df_path_shown("../other/./y", shown, sizeof shown); // outside: absolute (the sandbox sits in /tmp)
  cr_expect_str_eq(shown, "/tmp/other/y");
  snprintf(want, sizeof want, "%sz/y", sandbox); // a sibling whose name starts with the sandbox's is outside
  df_path_shown(want, shown, sizeof shown);
  cr_expect_str_eq(shown, want);
  df_path_shown("/usr/../etc", shown, sizeof shown);
  cr_expect_str_eq(shown, "/etc");
}

Test(recipe_paths, a_missing_relative_input_names_the_directory_it_was_resolved_against) {
  const df_recipe *r = NULL;
  df_error err = {0};
  const char *text = "model:\n  target_model_path: ./nowhere/target\n  draft_model_config: configs/draft.json\n"
                     "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n";
  cr_assert_eq(parse(text, NULL, 0, NULL, &r, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "model.target_model_path");
  cr_expect(strstr(err.msg, "r.yaml:2:22: model.target_model_path: './nowhere/target' does not exist"), "%s", err.msg);
  cr_expect(strstr(err.msg, sandbox), "the directory is named: %s", err.msg);
  cr_expect(strstr(err.hint, "run draftforge from the directory"), "%s", err.hint);
  // a .json path is a local path to SpecForge too: never a hub id
  const char *json = "model:\n  target_model_path: data\n  draft_model_config: configs/other.json\n"
                     "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n";
  cr_assert_eq(parse(json, NULL, 0, NULL, &r, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "'configs/other.json' does not exist"), "%s", err.msg);
  // --set values are resolved the same way
  const char *sets[] = {"data.hidden_states_path=missing/hs"};
  cr_assert_eq(parse(RECIPE("data"), sets, 1, NULL, &r, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "--set: data.hidden_states_path: 'missing/hs' does not exist"), "%s", err.msg);
}

Test(recipe_paths, hub_ids_resolve_from_the_cache_transformers_uses) {
  // default: ~/.cache/huggingface/hub
  cache_model("home/.cache/huggingface/hub", "models--Qwen--Qwen3-8B", "abc123", true);
  const df_recipe *r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  cr_expect_str_eq(r->model.target_model_path,
                   at("home/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/abc123"));
  df_recipe_free(r);
  // XDG_CACHE_HOME, then HF_HOME, then HF_HUB_CACHE take precedence in turn
  cache_model("xdg/huggingface/hub", "models--Qwen--Qwen3-8B", "x1", true);
  setenv("XDG_CACHE_HOME", at("xdg"), 1);
  r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  cr_expect_str_eq(r->model.target_model_path, at("xdg/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/x1"));
  df_recipe_free(r);
  cache_model("hfhome/hub", "models--Qwen--Qwen3-8B", "h1", true);
  setenv("HF_HOME", at("hfhome"), 1);
  r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  cr_expect_str_eq(r->model.target_model_path, at("hfhome/hub/models--Qwen--Qwen3-8B/snapshots/h1"));
  df_recipe_free(r);
  cache_model("hubcache", "models--Qwen--Qwen3-8B", "c1", true);
  setenv("HF_HUB_CACHE", at("hubcache"), 1);
  r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  cr_expect_str_eq(r->model.target_model_path, at("hubcache/models--Qwen--Qwen3-8B/snapshots/c1"));
  df_recipe_free(r);
  // model.cache_dir (from_pretrained's cache_dir) wins over the environment
  cache_model("own", "models--Qwen--Qwen3-8B", "o1", true);
  char text[1024];
  snprintf(text, sizeof text,
           "model:\n  cache_dir: %s\n  target_model_path: Qwen/Qwen3-8B\n"
           "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n",
           at("own"));
  r = parse_ok(text);
  cr_expect_str_eq(r->model.target_model_path, at("own/models--Qwen--Qwen3-8B/snapshots/o1"));
  df_recipe_free(r);
  // a relative model.cache_dir is taken from the current directory
  cache_model("rel/cache", "models--Qwen--Qwen3-8B", "r1", true);
  r = parse_ok("model:\n  cache_dir: ./rel/cache\n  target_model_path: Qwen/Qwen3-8B\n"
               "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n");
  cr_expect_str_eq(r->model.target_model_path, at("rel/cache/models--Qwen--Qwen3-8B/snapshots/r1"));
  df_recipe_free(r);
  // a local directory of that name comes first, as in transformers
  mkdirs("Qwen/Qwen3-8B");
  r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  cr_expect_str_eq(r->model.target_model_path, at("Qwen/Qwen3-8B"));
  df_recipe_free(r);
}

Test(recipe_paths, an_uncached_hub_id_fails_naming_the_id_the_cache_and_the_download_command) {
  setenv("HF_HUB_CACHE", at("hub"), 1);
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_assert_eq(parse(RECIPE("Qwen/Qwen3-8B"), NULL, 0, NULL, &r, &err), DF_ERR_IO);
  cr_expect_str_eq(err.where, "model.target_model_path");
  char want[PATH_MAX * 2];
  snprintf(want, sizeof want, "searched %s/hub/models--Qwen--Qwen3-8B", sandbox);
  cr_expect(strstr(err.msg, "'Qwen/Qwen3-8B' is not a path under"), "%s", err.msg);
  cr_expect(strstr(err.msg, want), "%s", err.msg);
  cr_expect(strstr(err.hint, "hf download Qwen/Qwen3-8B"), "%s", err.hint);
  // a snapshot without refs/main is not found either (huggingface_hub resolves revision "main" through the ref)
  cache_model("hub", "models--Qwen--Qwen3-8B", "abc", false);
  cr_expect_eq(parse(RECIPE("Qwen/Qwen3-8B"), NULL, 0, NULL, &r, &err), DF_ERR_IO);
  // nor one whose snapshot lacks config.json
  cache_model("hub", "models--Qwen--Qwen3-4B", "r4", true);
  char cfg[PATH_MAX * 2];
  snprintf(cfg, sizeof cfg, "%s/hub/models--Qwen--Qwen3-4B/snapshots/r4/config.json", sandbox);
  cr_assert_eq(remove(cfg), 0);
  cr_expect_eq(parse(RECIPE("Qwen/Qwen3-4B"), NULL, 0, NULL, &r, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "has no config.json"), "%s", err.msg);
}

Test(recipe_paths, the_resolved_recipe_records_absolute_paths_and_loads_from_anywhere) {
  setenv("HF_HUB_CACHE", at("hub"), 1);
  cache_model("hub", "models--Qwen--Qwen3-8B", "abc", true);
  const df_recipe *r = parse_ok(RECIPE("Qwen/Qwen3-8B"));
  char *text = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&text, &len);
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_write_resolved(r, fp, &err), &err);
  fclose(fp);
  char want[PATH_MAX * 2];
  snprintf(want, sizeof want, "  hidden_states_path: \"%s/data/hs\"\n", sandbox);
  cr_expect(strstr(text, want), "%s", text);
  cr_assert_eq(chdir("/"), 0);
  const df_recipe *r2 = NULL;
  DF_ASSERT_OK(df_recipe_parse(text, len, "resolved.yaml", NULL, NULL, &r2, &err), &err);
  cr_expect_str_eq(r2->model.target_model_path, r->model.target_model_path);
  cr_expect_str_eq(r2->output_dir, r->output_dir);
  free(text);
  df_recipe_free(r), df_recipe_free(r2);
}

// ---- features draftforge lacks: one line each, before any key is checked -------------------------------------

static df_error refused(const char *text, const char *const *sets, int n) {
  const df_recipe *r = NULL;
  df_error err = {0};
  cr_assert_eq(parse(text, sets, n, NULL, &r, &err), DF_ERR_UNSUPPORTED, "%s", err.msg);
  cr_assert_null(r);
  cr_expect_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
  return err;
}

Test(recipe_paths, recipes_that_need_a_missing_feature_are_refused_naming_the_key) {
  // the deployment first, even though the recipe also sets a key of another strategy
  df_error e = refused("model:\n  target_model_path: data\n  vocab_mapping_path: x.pt\n"
                       "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: peagle\n  ttt_length: 3\n"
                       "deployment:\n  mode: disaggregated\n",
                       NULL, 0);
  cr_expect_str_eq(e.where, "deployment.mode");
  cr_expect(strstr(e.msg, "r.yaml:10:9: deployment.mode = disaggregated asks for a disaggregated"), "%s", e.msg);
  e = refused("model:\n  target_model_path: data\ndata:\n  train_data_path: chats.jsonl\n"
              "training:\n  strategy: dflash\ndeployment:\n  mode: disaggregated\n",
              NULL, 0);
  // online data is supported in-process: SpecForge's online recipes are refused for their deployment
  cr_expect_str_eq(e.where, "deployment.mode");
  cr_expect(strstr(e.msg, "disaggregated SGLang / Mooncake deployment"), "%s", e.msg);
  cr_expect(strstr(e.hint, "in-process (data.train_data_path)"), "%s", e.hint);
  e = refused("model:\n  target_model_path: data\ndata:\n  hidden_states_path: data/hs\n"
              "training:\n  strategy: dspark\ndeployment:\n  mode: disaggregated\n",
              NULL, 0);
  cr_expect_str_eq(e.where, "deployment.mode");
  cr_expect(strstr(e.msg, "disaggregated SGLang / Mooncake deployment"), "%s", e.msg);
  cr_expect(strstr(e.hint, "deployment.mode: local_colocated"), "%s", e.hint);
  e = refused(RECIPE("data") "  server_urls: [http://a:1]\n", NULL, 0);
  cr_expect_str_eq(e.where, "training.server_urls");
  e = refused(RECIPE("data") "  deployment_mode: disaggregated\n", NULL, 0);
  cr_expect_str_eq(e.where, "training.deployment_mode");
  const char *sets[] = {"deployment.mode=disaggregated"};
  e = refused(RECIPE("data"), sets, 1);
  cr_expect(strstr(e.msg, "--set deployment.mode: deployment.mode = disaggregated asks for"), "%s", e.msg);
}

Test(recipe_paths, inert_keys_are_accepted_and_listed_once) {
  char buf[4096] = {0};
  FILE *log = fmemopen(buf, sizeof buf - 1, "w");
  const df_recipe *r = NULL;
  df_error err = {0};
  const char *text = "model:\n  target_model_path: data\n  target_backend: sglang\n  sglang_dp_size: 8\n"
                     "  sglang_moe_runner_backend: deep_gemm\n  sglang_swa_full_tokens_ratio: 0.5\n"
                     "  tokenizer_pad_token_id: 0\ndata:\n  hidden_states_path: data/hs\n  chat_template: qwen\n"
                     "training:\n  strategy: dflash\n  attention_backend: flex_attention\n"
                     "runtime:\n  producer_concurrency: 4\n";
  DF_ASSERT_OK(parse(text, NULL, 0, log, &r, &err), &err);
  fclose(log);
  cr_expect(strstr(buf, "recipe: accepted, no effect on this run: model.target_backend, model.tokenizer_pad_token_id, "
                        "model.sglang_dp_size, model.sglang_moe_runner_backend, model.sglang_swa_full_tokens_ratio, "
                        "training.attention_backend, runtime.producer_concurrency"),
            "%s", buf);
  cr_expect_eq(strchr(buf, '\n'), strrchr(buf, '\n'), "one line: %s", buf);
  df_recipe_free(r);
  // an SGLang engine setting out of SpecForge's range is still refused, naming it
  cr_expect_eq(parse("model:\n  target_model_path: data\n  sglang_swa_full_tokens_ratio: 2.0\n"
                     "data:\n  hidden_states_path: data/hs\ntraining:\n  strategy: dflash\n",
                     NULL, 0, NULL, &r, &err),
               DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "model.sglang_swa_full_tokens_ratio");
}
