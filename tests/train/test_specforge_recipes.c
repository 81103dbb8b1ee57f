// Every example recipe of SpecForge (examples/configs/ at the commit tests/fixtures/specforge_recipes/README.md
// names, copied there with SpecForge's licence) loaded as a SpecForge user runs it, from a checkout-like
// directory with the Hugging Face cache holding its hub ids: exactly the recipes
// tests/fixtures/specforge_recipes/expected.tsv calls accepted load, and their draft configs (SpecForge's own
// configs/*.json) build the draft the recipe's strategy trains; every other one is refused with one line naming
// the key and the missing feature. DF_SPECFORGE_RECIPES points the test at another examples/configs directory
// (a newer SpecForge checkout: the manifest must then be updated).
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/draft_config.h"
#include "tests/common/fixture.h"
#include "train/recipe/recipe.h"

#define SPECFORGE DF_FIXTURE_DIR "/specforge_recipes"
#define MANIFEST  SPECFORGE "/expected.tsv"

typedef struct {
  char file[128], verdict[16], key[64], fragment[128], needs[512];
} row;

static row rows[256];
static int nrows;
static char recipes[PATH_MAX], sandbox[PATH_MAX];

static void read_manifest(void) {
  FILE *fp = fopen(MANIFEST, "r");
  cr_assert_not_null(fp, "%s", MANIFEST);
  char line[1024];
  while (fgets(line, sizeof line, fp)) {
    if (line[0] == '#' || line[0] == '\n') continue;
    line[strcspn(line, "\n")] = 0;
    row *r = &rows[nrows++];
    char *save = NULL, *f[5] = {0};
    for (int i = 0; i < 5; i++) f[i] = strtok_r(i ? NULL : line, "\t", &save);
    cr_assert(f[4], "%s: a row has fewer than 5 fields", MANIFEST);
    snprintf(r->file, sizeof r->file, "%s", f[0]);
    snprintf(r->verdict, sizeof r->verdict, "%s", f[1]);
    snprintf(r->key, sizeof r->key, "%s", f[2]);
    snprintf(r->fragment, sizeof r->fragment, "%s", f[3]);
    snprintf(r->needs, sizeof r->needs, "%s", f[4]);
  }
  fclose(fp);
}

static bool find_recipes(void) {
  const char *env = getenv("DF_SPECFORGE_RECIPES");
  snprintf(recipes, sizeof recipes, "%s", env && env[0] ? env : SPECFORGE "/examples/configs");
  struct stat sb;
  return stat(recipes, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void run(const char *fmt, const char *a, const char *b) {
  char cmd[PATH_MAX * 3];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

// What an accepted recipe reads, made real in the sandbox: "hub:NS/NAME" a cached model (refs/main and a snapshot
// with config.json), "copy:P" SpecForge's file P (committed beside the recipes), "dir:P" a directory.
static void make_needs(const char *needs) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", needs);
  for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    if (!strncmp(t, "hub:", 4)) {
      char folder[256];
      snprintf(folder, sizeof folder, "hub/models--%s", t + 4);
      char *slash = strchr(folder + 12, '/');
      cr_assert_not_null(slash, "%s", t);
      memmove(slash + 1, slash, strlen(slash) + 1), slash[0] = '-', slash[1] = '-';
      run("mkdir -p '%s/snapshots/0123abcd' '%s/refs'", folder, folder);
      run("printf 0123abcd > '%s/refs/main' && echo '{}' > '%s/snapshots/0123abcd/config.json'", folder, folder);
    } else if (!strncmp(t, "copy:", 5)) {
      char src[PATH_MAX];
      snprintf(src, sizeof src, "%s/%s", SPECFORGE, t + 5);
      run("mkdir -p \"$(dirname '%s')\"%s", t + 5, "");
      run("cp '%s' '%s'", src, t + 5);
    } else if (!strncmp(t, "dir:", 4)) {
      run("mkdir -p '%s'%s", t + 4, "");
    } else if (strcmp(t, "-"))
      cr_assert_fail("%s: unknown need '%s'", MANIFEST, t);
  }
}

static const row *manifest_row(const char *file) {
  for (int i = 0; i < nrows; i++)
    if (!strcmp(rows[i].file, file)) return &rows[i];
  return NULL;
}

// An accepted recipe's draft config (SpecForge's configs/*.json, unchanged) builds the draft its strategy
// trains, with the mask id and capture layers SpecForge's loader would use, resolved for serving.
// An EAGLE-3 recipe's draft (SpecForge's LlamaForCausalLMEagle3 config): one midlayer, a draft vocabulary, capture
// layers from its eagle_config or, for a 36-layer target, SpecForge's default [1, 17, 32]; served as SGLang's class.
static void check_eagle3_draft(const char *file, const df_draft_config *cfg) {
  df_error err = {0};
  cr_expect_eq(cfg->kind, DF_DRAFT_EAGLE3, "%s: the draft config is %s", file, df_draft_kind_name(cfg->kind));
  cr_expect_eq(cfg->num_hidden_layers, 1, "%s", file);
  cr_expect(cfg->eagle3.draft_vocab_size > 0 && cfg->eagle3.draft_vocab_size <= cfg->vocab_size, "%s", file);
  const bool own = cfg->dflash.num_target_layer_ids == 3;
  const int first = own ? cfg->dflash.target_layer_ids[1] : 17;
  const df_draft_config *resolved = NULL;
  cr_assert_eq(df_draft_config_resolve_capture(cfg, 100, NULL, 0, &resolved, &err), DF_OK, "%s: %s", file, err.msg);
  cr_assert_not_null(resolved);
  cr_expect_eq(resolved->dflash.num_target_layer_ids, 3, "%s", file);
  if (!own) {
    df_draft_config_free(resolved);
    cr_assert_eq(df_draft_config_resolve_capture(cfg, 36, NULL, 0, &resolved, &err), DF_OK, "%s", file);
  }
  cr_expect_eq(resolved->dflash.target_layer_ids[1], first, "%s", file);
  json_t *served = NULL;
  cr_assert_eq(df_draft_config_resolved_json(resolved, -1, &served, &err), DF_OK, "%s: %s", file, err.msg);
  const json_t *arch = json_array_get(json_object_get(served, "architectures"), 0);
  cr_expect_str_eq(json_string_value(arch), "LlamaForCausalLMEagle3", "%s", file);
  cr_expect_eq(json_integer_value(json_object_get(served, "draft_vocab_size")), cfg->eagle3.draft_vocab_size, "%s",
               file);
  cr_expect_eq(
      json_array_size(json_object_get(json_object_get(served, "eagle_config"), "eagle_aux_hidden_state_layer_ids")), 3,
      "%s", file);
  json_decref(served);
  df_draft_config_free(resolved);
}

static void check_draft(const char *file, const df_recipe *rc) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_assert_eq(df_draft_config_from_file(rc->model.draft_model_config, &cfg, &err), DF_OK, "%s: %s: %s [%s]", file,
               rc->model.draft_model_config, err.msg, err.where);
  cr_expect_eq(df_strategy_of(cfg), df_strategy_find(rc->training.strategy), "%s: the strategy trains the draft", file);
  if (!strcmp(rc->training.strategy, "eagle3")) {
    check_eagle3_draft(file, cfg);
    df_draft_config_free(cfg);
    return;
  }
  bool dspark = !strcmp(rc->training.strategy, "dspark"), domino = !strcmp(rc->training.strategy, "domino");
  cr_expect_eq(cfg->kind,
               dspark   ? DF_DRAFT_DSPARK
               : domino ? DF_DRAFT_DOMINO
                        : DF_DRAFT_DFLASH,
               "%s: the draft config is %s", file, df_draft_kind_name(cfg->kind));
  cr_expect_eq(cfg->block_size, dspark ? 7 : 16, "%s", file);
  cr_expect_eq(cfg->dflash.mask_token_id, 151669, "%s", file);
  cr_expect_eq(cfg->num_target_layers, 36, "%s", file);
  cr_assert_eq(cfg->dflash.num_target_layer_ids, 5, "%s", file);
  static const int layers[5] = {1, 9, 17, 25, 33};
  for (int i = 0; i < 5; i++) cr_expect_eq(cfg->dflash.target_layer_ids[i], layers[i], "%s: layer %d", file, i);
  json_t *served = NULL;
  cr_assert_eq(df_draft_config_resolved_json(cfg, cfg->dflash.mask_token_id, &served, &err), DF_OK, "%s: %s", file,
               err.msg);
  // SpecForge's DSpark configs keep the head keys in dflash_config only; SGLang builds the heads from the top level
  if (dspark) {
    cr_expect_eq(json_integer_value(json_object_get(served, "markov_rank")), 256, "%s", file);
    cr_expect(json_is_true(json_object_get(served, "confidence_head_with_markov")), "%s", file);
  }
  // Domino: the GRU head's keys from dflash_config, and the recipe's lambda_base schedule is read
  if (domino) {
    cr_expect_eq(cfg->dflash.emb_dim, 256, "%s", file);
    cr_expect_eq(cfg->dflash.gru_hidden_dim, 1024, "%s", file);
    cr_expect(cfg->dflash.shift_label, "%s", file);
    const df_strategy_values v = df_recipe_strategy_values(rc);
    cr_expect_eq(df_strategy_number(&v, "lambda_base_decay_ratio", -1), 1.0, "%s", file);
  }
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(served, "dflash_config"), "mask_token_id")), 151669,
               "%s", file);
  json_decref(served);
  df_draft_config_free(cfg);
}

Test(specforge_recipes, every_example_is_accepted_or_refused_as_expected) {
  cr_assert(find_recipes(), "no SpecForge recipes at %s (tests/fixtures/specforge_recipes/README.md)", recipes);
  read_manifest();
  // the directory holds exactly the recipes the manifest lists (a newer SpecForge needs a new manifest)
  DIR *d = opendir(recipes);
  cr_assert_not_null(d);
  int seen = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
    cr_expect_not_null(manifest_row(e->d_name), "%s/%s is not in %s", recipes, e->d_name, MANIFEST);
    seen++;
  }
  closedir(d);
  cr_expect_eq(seen, nrows, "%d recipes in %s, %d in the manifest", seen, recipes, nrows);

  snprintf(sandbox, sizeof sandbox, "/tmp/df_specforge_recipes_XXXXXX");
  cr_assert_not_null(mkdtemp(sandbox));
  cr_assert_eq(chdir(sandbox), 0);
  char hub[PATH_MAX + 8];
  snprintf(hub, sizeof hub, "%s/hub", sandbox);
  setenv("HF_HUB_CACHE", hub, 1);
  for (int i = 0; i < nrows; i++) make_needs(rows[i].needs);

  int accepted = 0, refused = 0;
  for (int i = 0; i < nrows; i++) {
    const row *r = &rows[i];
    char path[PATH_MAX * 2];
    snprintf(path, sizeof path, "%.4095s/%.127s", recipes, r->file);
    const df_recipe *rc = NULL;
    df_error err = {0};
    df_status st = df_recipe_load(path, NULL, &rc, &err);
    if (!strcmp(r->verdict, "accepted")) {
      accepted++;
      cr_expect_eq(st, DF_OK, "%s should load: %s [%s]", r->file, err.msg, err.where);
      if (rc) {
        cr_expect(!strncmp(rc->model.target_model_path, hub, strlen(hub)), "%s: target %s is not the cached snapshot",
                  r->file, rc->model.target_model_path);
        cr_expect(!strncmp(rc->data.hidden_states_path, sandbox, strlen(sandbox)), "%s: %s", r->file,
                  rc->data.hidden_states_path);
        check_draft(r->file, rc);
      }
    } else {
      refused++;
      cr_expect_eq(st, DF_ERR_UNSUPPORTED, "%s should be refused: %s", r->file, err.msg);
      cr_expect_str_eq(err.where, r->key, "%s: refused for %s, expected %s (%s)", r->file, err.where, r->key, err.msg);
      cr_expect(strstr(err.msg, r->fragment), "%s: '%s' not in: %s", r->file, r->fragment, err.msg);
      cr_expect_null(strchr(err.msg, '\n'), "%s: one line: %s", r->file, err.msg);
      cr_expect(err.hint[0], "%s: the refusal says what to do instead", r->file);
    }
    df_recipe_free(rc);
  }
  cr_log_info("SpecForge example recipes: %d accepted, %d refused", accepted, refused);
  run("rm -rf '%s'%s", sandbox, "");
}
