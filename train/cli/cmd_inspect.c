// `draftforge inspect FILE`: prints what a file holds — a safetensors file's tensors, a draft or target
// config's resolved values, a checkpoint (train/export/inspect_ckpt.h), or an HDF5 hidden-state shard's (or shard
// directory's) attributes and samples, with a NaN/Inf scan (sampled, or every sample with --full).
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "modeling/draft_config.h"
#include "modeling/safetensors.h"
#include "modeling/target_config.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/data/hs.h"
#include "train/data/hs_scan.h"
#include "train/export/inspect_ckpt.h"
#include "train/export/inspect_export.h"

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static bool dir_has_suffix(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));) found = ends_with(e->d_name, suffix);
  closedir(d);
  return found;
}

// A draft config carries dflash_config or block_size; anything else is read as a target config.
static df_status inspect_json(const char *path, df_error *err) {
  json_error_t jerr;
  json_t *doc = json_load_file(path, 0, &jerr);
  bool draft = doc && (json_object_get(doc, "dflash_config") || json_object_get(doc, "block_size"));
  json_decref(doc);
  if (draft) {
    const df_draft_config *cfg = NULL;
    DF_TRY(df_draft_config_from_file(path, &cfg, err));
    df_draft_config_print(cfg, stdout);
    df_draft_config_free(cfg);
    return DF_OK;
  }
  const df_target_config *cfg = NULL;
  DF_TRY(df_target_config_from_file(path, &cfg, err));
  df_target_config_print(cfg, stdout);
  df_target_config_free(cfg);
  return DF_OK;
}

static const df_cli_opt INSPECT_OPTS[] = {{"--full", NULL, DF_CLI_FLAG, "off: up to 16 samples per shard, spread",
                                           "hidden-state data: scan every sample for NaN/Inf, not a sample of them"},
                                          DF_CLI_END};

static const df_cli_spec INSPECT_CLI = {
    "inspect",
    "FILE...",
    1,
    DF_CLI_MAX_POS,
    "Prints what each FILE holds: a safetensors file's tensors (or a sharded directory's), a draft or target\n"
    "config's resolved values, a checkpoint (or a run directory's latest one: state, tensor table, moments), or\n"
    "hidden-state shards (a .h5 file or a directory of them): attributes, sample and token counts, and any NaN/Inf\n"
    "hidden state by shard, sample and token. A problem found (a NaN, a table mismatch) fails, exit 1.",
    INSPECT_OPTS};

// A DFlash-family serving directory also gets the SGLang 0.5.23 report (train/export/inspect_export.h); its problems
// make the command fail.
static df_status inspect_serving(const char *dir, df_error *err) {
  int problems = 0;
  DF_TRY(df_inspect_export(dir, stdout, &problems, err));
  if (problems == 0) return DF_OK;
  return DF_FAIL(err, DF_ERR_INVALID, dir, "see the PROBLEM lines above (docs/export-and-eval.md)",
                 "%d problem(s) serving this directory with SGLang 0.5.23", problems);
}

static df_status inspect_path(const char *path, df_hs_scan_mode scan, df_error *err) {
  struct stat st;
  if (stat(path, &st) != 0) return DF_FAIL(err, DF_ERR_IO, path, "check the path", "cannot open '%s'", path);
  if (S_ISDIR(st.st_mode)) {
    char ckpt[4300]; // a checkpoint, or a run directory's latest one (train/export/inspect_ckpt.c)
    if (df_inspect_checkpoint_dir(path, ckpt, sizeof ckpt)) return df_inspect_checkpoint(ckpt, stdout, err);
    if (dir_has_suffix(path, ".h5")) return df_hs_inspect(path, scan, stdout, err);
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/config.json", path);
    if (stat(sub, &st) == 0) DF_TRY(inspect_json(sub, err));
    if (dir_has_suffix(path, ".safetensors") || dir_has_suffix(path, ".index.json")) {
      df_st_model *m = NULL;
      DF_TRY(df_st_model_open(path, &m, err));
      for (int i = 0; i < df_st_model_num_shards(m); i++)
        DF_TRY(df_st_print(df_st_path(df_st_model_shard(m, i)), stdout, err));
      df_st_model_close(m);
    }
    if (df_inspect_is_draft_dir(path)) return inspect_serving(path, err);
    return DF_OK;
  }
  if (ends_with(path, ".safetensors")) return df_st_print(path, stdout, err);
  if (ends_with(path, ".h5")) return df_hs_inspect(path, scan, stdout, err);
  if (ends_with(path, ".json")) return inspect_json(path, err);
  return DF_FAIL(err, DF_ERR_INVALID, path, "give a .safetensors, .json or .h5 file, or a directory of them",
                 "cannot tell what kind of file '%s' is", path);
}

int df_cmd_inspect(int argc, char **argv) {
  df_cli_args a;
  int rc = df_cli_parse(&INSPECT_CLI, argc, argv, &a);
  if (rc) return df_cli_free(&a), rc == 1 ? DF_EXIT_OK : rc;
  df_hs_scan_mode scan = df_cli_has(&a, "--full") ? DF_HS_SCAN_FULL : DF_HS_SCAN_SAMPLED;
  for (int i = 0; i < a.npos; i++) {
    struct stat sb;
    if (stat(a.pos[i], &sb) != 0) {
      rc = df_cli_usage_error(&INSPECT_CLI, "%s does not exist", a.pos[i]);
      continue;
    }
    df_error err = {0};
    if (a.npos > 1) printf("== %s\n", a.pos[i]);
    if (inspect_path(a.pos[i], scan, &err) != DF_OK) {
      fflush(stdout);
      df_error_print_verbose(&err, a.verbose);
      rc = rc ? rc : DF_EXIT_FAILURE;
    }
  }
  df_cli_free(&a);
  return rc;
}
