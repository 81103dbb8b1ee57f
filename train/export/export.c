// HF export of a trained draft (train/export/export.h): checkpoint resolution, SpecForge's config normaliser, a strict
// reload through the draft's parameter table, and an atomic directory write (temp sibling + rename).
#include "train/export/export.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json_write.h"
#include "modeling/draft_model.h"
#include "modeling/strict_load.h"
#include "strategies/strategy.h"
#include "train/recipe/device.h"
#include "train/run/run_dir.h"

// ---- checkpoint directories ------------------------------------------------------------------------------

static bool is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

// dir/name into buf; false when it does not fit.
static bool path_join(char *buf, size_t n, const char *dir, const char *name) {
  int k = snprintf(buf, n, "%s/%s", dir, name);
  return k >= 0 && (size_t)k < n;
}

// ---- config normaliser -----------------------------------------------------------------------------------

static df_status norm_block_size(json_t *cfg, json_t *method, int64_t expect, const char *where, df_error *err) {
  json_t *top = json_object_get(cfg, "block_size"), *nested = json_object_get(method, "block_size");
  if (json_is_null(top)) top = NULL;
  if (json_is_null(nested)) nested = NULL;
  if (top && nested && !json_equal(top, nested))
    return DF_FAIL(err, DF_ERR_INVALID, where, "keep one block_size (top level) or make the two equal",
                   "block_size conflict: top level %lld != dflash_config.block_size %lld",
                   (long long)json_integer_value(top), (long long)json_integer_value(nested));
  json_t *bs = top ? top : nested;
  if (!bs || !json_is_integer(bs) || json_integer_value(bs) < 2)
    return DF_FAIL(err, DF_ERR_INVALID, where, "a DFlash-family draft predicts blocks of >= 2 tokens",
                   "block_size must be an integer >= 2");
  if (expect > 0 && json_integer_value(bs) != expect)
    return DF_FAIL(err, DF_ERR_INVALID, where, "export with the block size the server will use (--block-size)",
                   "block_size %lld, expected %lld", (long long)json_integer_value(bs), (long long)expect);
  return DF_OK;
}

// dflash_config.projector_type names the strategy whose drafts these are (strategies/registry.c).
static df_status norm_method_choices(json_t *method, const df_strategy **s, const char *where, df_error *err) {
  json_t *pt = json_object_get(method, "projector_type"), *am = json_object_get(method, "attention_mode");
  const char *projector = pt ? (json_is_string(pt) ? json_string_value(pt) : "") : "dflash";
  if (!(*s = df_strategy_for_projector(projector)) || !(*s)->blocks)
    return DF_FAIL(err, DF_ERR_INVALID, where, "export a draft of a strategy draftforge trains (draftforge schema)",
                   "dflash_config.projector_type '%s' is not a projector of any strategy draftforge trains", projector);
  const char *mode = am ? (json_is_string(am) ? json_string_value(am) : "") : "gqa";
  if (strcasecmp(mode, "gqa") && strcasecmp(mode, "mha"))
    return DF_FAIL(err, DF_ERR_INVALID, where, "SGLang serves DFlash-family drafts with GQA or MHA attention",
                   "dflash_config.attention_mode must be gqa or mha");
  return DF_OK;
}

// The non-block strategy whose serving class the config names (EAGLE-3: LlamaForCausalLMEagle3, which its resolved
// config always writes); NULL for block drafts, which carry dflash_config.
static const df_strategy *own_class(const json_t *cfg) {
  const char *arch = json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0));
  for (int i = 0; arch && df_strategies[i]; i++) {
    const df_strategy *s = df_strategies[i];
    if (s->blocks || !s->serving_class_ffn) continue;
    if (!strcmp(arch, s->serving_class_ffn)) return s;
  }
  return NULL;
}

static df_status normalize(json_t *cfg, const char *torch_dtype, int64_t expect_bs, const char *where, df_error *err) {
  const df_strategy *own = own_class(cfg);
  if (own) { // no dflash_config: the strategy's serving names only
    DF_TRY(own->export_normalize(cfg, where, err));
    json_object_del(cfg, "auto_map");
    json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype));
    if (json_object_get(cfg, "dtype")) json_object_set_new(cfg, "dtype", json_string(torch_dtype));
    return DF_OK;
  }
  json_t *method = json_object_get(cfg, "dflash_config");
  if (method && !json_is_null(method) && !json_is_object(method))
    return DF_FAIL(err, DF_ERR_INVALID, where, "dflash_config must be an object", "dflash_config is not an object");
  if (!json_is_object(method)) {
    method = json_object();
    json_object_set_new(cfg, "dflash_config", method);
  }
  DF_TRY(norm_block_size(cfg, method, expect_bs, where, err));
  const df_strategy *s;
  DF_TRY(norm_method_choices(method, &s, where, err));
  DF_TRY(s->export_normalize(cfg, where, err)); // the strategy's serving names and keys
  json_object_del(cfg, "auto_map");
  json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype));
  if (json_object_get(cfg, "dtype")) json_object_set_new(cfg, "dtype", json_string(torch_dtype));
  return DF_OK;
}

df_status df_export_normalize_config(const json_t *src, const char *torch_dtype, int64_t expect_block_size,
                                     const char *where, json_t **out, df_error *err) {
  *out = NULL;
  if (!json_is_object(src)) return DF_FAIL(err, DF_ERR_INVALID, where, NULL, "the draft config is not a JSON object");
  json_t *cfg = json_deep_copy(src);
  if (!cfg) return DF_FAIL(err, DF_ERR_NOMEM, where, NULL, "out of memory copying the config");
  df_status st = normalize(cfg, torch_dtype, expect_block_size, where, err);
  if (st != DF_OK) {
    json_decref(cfg);
    return st;
  }
  *out = cfg;
  return DF_OK;
}

// ---- writing ---------------------------------------------------------------------------------------------

// Removes the regular files of dir (one level) and dir itself.
static void remove_flat_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    char p[PATH_MAX];
    for (struct dirent *e; (e = readdir(d));)
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
        if (path_join(p, sizeof p, dir, e->d_name)) remove(p);
      }
    closedir(d);
  }
  rmdir(dir);
}

// An existing out_dir is replaced only when it holds nothing but regular files and config.json among them
// (a previous export), or nothing at all: never a directory of the user's.
static df_status check_replaceable(const char *out_dir, bool *exists, df_error *err) {
  static const char hint[] = "choose a new --out directory, or remove this one";
  struct stat sb;
  *exists = stat(out_dir, &sb) == 0;
  if (!*exists) return DF_OK;
  if (!S_ISDIR(sb.st_mode))
    return DF_FAIL(err, DF_ERR_INVALID, out_dir, hint, "the export path exists and is not a directory");
  DIR *d = opendir(out_dir);
  if (!d) return DF_FAIL(err, DF_ERR_IO, out_dir, hint, "cannot read the export directory: %s", strerror(errno));
  bool files_only = true, has_config = false, empty = true;
  char p[PATH_MAX];
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    empty = false;
    files_only = files_only && path_join(p, sizeof p, out_dir, e->d_name) && is_file(p);
    has_config = has_config || !strcmp(e->d_name, "config.json");
  }
  closedir(d);
  if (empty || (files_only && has_config)) return DF_OK;
  return DF_FAIL(err, DF_ERR_INVALID, out_dir, hint, "the directory exists and does not look like an export");
}

static df_status write_config(const json_t *cfg, const char *dir, df_error *err) {
  char path[PATH_MAX];
  if (!path_join(path, sizeof path, dir, "config.json"))
    return DF_FAIL(err, DF_ERR_INVALID, dir, "use a shorter --out path", "path too long");
  FILE *fp = fopen(path, "w");
  bool ok = fp && df_json_dumpf(cfg, fp, JSON_INDENT(2)) == 0 && fputc('\n', fp) != EOF;
  ok = fp && fflush(fp) == 0 && fsync(fileno(fp)) == 0 && ok;
  if (fp) ok = fclose(fp) == 0 && ok;
  if (ok) return DF_OK;
  return DF_FAIL(err, DF_ERR_IO, path, "check the --out directory", "cannot write config.json: %s", strerror(errno));
}

// Writes the temporary sibling directory and renames it into place (the old export, if any, is moved aside
// first and removed after).
static df_status write_export(const df_draft_config *dcfg, const df_params *p, const float *w, const json_t *cfg,
                              const char *out_dir, df_st_dtype dt, df_error *err) {
  bool exists;
  DF_TRY(check_replaceable(out_dir, &exists, err));
  char tmp[PATH_MAX], old[PATH_MAX], st_path[PATH_MAX];
  int kt = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out_dir, (long)getpid());
  int ko = snprintf(old, sizeof old, "%s.old.%ld", out_dir, (long)getpid());
  if (kt < 0 || ko < 0 || (size_t)kt + sizeof DF_ST_SINGLE_NAME + 1 >= sizeof tmp || (size_t)ko >= sizeof old)
    return DF_FAIL(err, DF_ERR_INVALID, out_dir, "use a shorter --out path", "path too long");
  remove_flat_dir(tmp);
  if (mkdir(tmp, 0777) != 0)
    return DF_FAIL(err, DF_ERR_IO, tmp, "check that the parent of --out exists and is writable",
                   "cannot create the export directory: %s", strerror(errno));
  if (!path_join(st_path, sizeof st_path, tmp, DF_ST_SINGLE_NAME))
    return DF_FAIL(err, DF_ERR_INVALID, out_dir, "use a shorter --out path", "path too long");
  // What SGLang keeps in fp32 (the strategy's and the FFN kind's: DSpark's confidence head, the MoE router).
  const df_strategy *s = df_strategy_of(dcfg);
  const char *keep_f32[8];
  int nk = 0;
  for (int i = 0; s && s->keep_f32 && s->keep_f32[i] && nk < 4; i++) keep_f32[nk++] = s->keep_f32[i];
  for (int i = 0; dcfg->ffn_kind && dcfg->ffn_kind->keep_f32 && dcfg->ffn_kind->keep_f32[i] && nk < 8; i++)
    keep_f32[nk++] = dcfg->ffn_kind->keep_f32[i];
  df_save_options so = {.dtype = dt, .f32_names = keep_f32, .n_f32_names = nk};
  df_status st = write_config(cfg, tmp, err);
  if (st == DF_OK) st = df_ffn_config_save(dcfg, p, w, st_path, &so, err); // through the FFN kind's layout
  if (st == DF_OK && exists && rename(out_dir, old) != 0)
    st = DF_FAIL(err, DF_ERR_IO, out_dir, NULL, "cannot move the old export aside: %s", strerror(errno));
  if (st == DF_OK && rename(tmp, out_dir) != 0) {
    st = DF_FAIL(err, DF_ERR_IO, out_dir, NULL, "cannot rename the export into place: %s", strerror(errno));
    if (exists) rename(old, out_dir);
  }
  if (st != DF_OK) {
    remove_flat_dir(tmp);
    return st;
  }
  if (exists) remove_flat_dir(old);
  return DF_OK;
}

static df_status load_model(const char *ckpt, const df_draft_config *cfg, int threads, df_ctx **ctx, df_draft_model **m,
                            df_error *err) {
  // DSpark drafts export too: the model carries their Markov / confidence heads under SpecForge's names. An export
  // converts files and folds a few tensors on the host: it runs where the weights are read, the CPU, by design.
  DF_TRY(df_device_open(DF_DEVICE_CPU, NULL, threads, NULL, ctx, err));
  DF_TRY(df_draft_model_create(cfg, *ctx, m, err));
  return df_draft_model_load(*m, ckpt, err);
}

// An FFN kind with an export transform (MoE: router centering folded into gate.bias) gets an export draft of its own
// config and model; *ecfg / *em stay NULL otherwise (the trained model is exported as it is).
static df_status ffn_export_model(const df_draft_config *cfg, df_ctx *ctx, df_draft_model *m,
                                  const df_draft_config **ecfg, df_draft_model **em, df_error *err) {
  *ecfg = NULL, *em = NULL;
  json_t *ej = NULL;
  DF_TRY(df_ffn_export_draft_json(cfg, &ej, err));
  if (!ej) return DF_OK;
  char *text = df_json_dumps(ej, JSON_COMPACT);
  json_decref(ej);
  if (!text) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  df_status st = df_draft_config_from_json(text, strlen(text), cfg->source, ecfg, err);
  free(text);
  if (st == DF_OK) st = df_draft_model_create(*ecfg, ctx, em, err);
  if (st == DF_OK)
    st = df_ffn_export_weights(cfg, df_draft_model_params(m), df_draft_model_weights(m), df_draft_model_params(*em),
                               df_draft_model_weights(*em), err);
  return st;
}

// The mask id the export writes: the checkpoint's (config.json carries the resolved one), else --mask-token-id;
// the two must agree. SGLang's DSpark refuses a config without one and its DFlash silently takes the target
// tokenizer's <|MASK|> id instead, so an export always carries it.
static df_status export_mask_id(const df_draft_config *cfg, const df_export_options *opt, int64_t *out, df_error *err) {
  int64_t have = cfg->dflash.mask_token_id;
  if (have >= 0 && opt->has_mask_token_id && opt->mask_token_id != have)
    return DF_FAIL(err, DF_ERR_INVALID, "--mask-token-id", "drop --mask-token-id: the checkpoint records its own",
                   "%s: --mask-token-id %lld disagrees with the checkpoint's dflash_config.mask_token_id %lld",
                   cfg->source, (long long)opt->mask_token_id, (long long)have);
  *out = have >= 0 ? have : opt->has_mask_token_id ? opt->mask_token_id : -1;
  if (*out >= 0) return DF_OK;
  return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.mask_token_id",
                 "pass --mask-token-id N with the recipe's model.mask_token_id (checkpoints written by this version "
                 "record it in config.json)",
                 "%s has no mask token id: SGLang's DSpark would refuse the export and its DFlash would use the "
                 "tokenizer's <|MASK|> id instead of the one the draft was trained with",
                 cfg->source);
}

static void fill_info(const char *dir, const json_t *norm, const df_draft_config *cfg, const df_params *p, int64_t mask,
                      df_export_info *info) {
  snprintf(info->checkpoint, sizeof info->checkpoint, "%s", dir);
  info->num_tensors = df_params_count(p);
  info->num_params = df_params_param_numel(p);
  const char *arch = json_string_value(json_array_get(json_object_get(norm, "architectures"), 0));
  snprintf(info->architecture, sizeof info->architecture, "%s", arch ? arch : "?");
  info->mask_token_id = mask;
  const df_strategy *s = df_strategy_of(cfg);
  info->confidence_head = s && s->has_confidence_head(cfg);
  info->needs_external = cfg->ffn_kind != NULL; // an FFN kind's serving class is not in stock SGLang
}

df_status df_export(const char *checkpoint, const char *out_dir, const df_export_options *opt, df_export_info *info,
                    df_error *err) {
  if (opt->dtype != DF_ST_BF16 && opt->dtype != DF_ST_F32)
    return DF_FAIL(err, DF_ERR_INVALID, "--dtype", "use bfloat16 or float32", "cannot export as %s",
                   df_st_dtype_name(opt->dtype));
  char dir[PATH_MAX], cfg_path[PATH_MAX + 16];
  DF_TRY(df_checkpoint_dir_resolve(checkpoint, dir, sizeof dir, err));
  if (!path_join(cfg_path, sizeof cfg_path, dir, "config.json"))
    return DF_FAIL(err, DF_ERR_INVALID, dir, "use a shorter checkpoint path", "path too long");
  const df_draft_config *cfg = NULL;
  DF_TRY(df_draft_config_from_file(cfg_path, &cfg, err));
  df_ctx *ctx = NULL;
  df_draft_model *m = NULL;
  json_t *resolved = NULL, *norm = NULL;
  const df_draft_config *ecfg = NULL; // MoE: the export draft (folded centering)
  df_draft_model *em = NULL;
  int64_t mask = -1;
  const df_strategy *strategy = df_strategy_of(cfg);
  df_status st = strategy && !strategy->blocks ? DF_OK : export_mask_id(cfg, opt, &mask, err);
  if (st == DF_OK && !strategy)
    st = DF_FAIL(err, DF_ERR_UNSUPPORTED, cfg->source, NULL, "no strategy trains this draft (%s)",
                 df_draft_kind_name(cfg->kind));
  if (st == DF_OK) st = df_ffn_export_check(cfg, err);
  if (st == DF_OK) st = load_model(dir, cfg, opt->threads, &ctx, &m, err);
  if (st == DF_OK) st = ffn_export_model(cfg, ctx, m, &ecfg, &em, err);
  const char *torch_dtype = opt->dtype == DF_ST_BF16 ? "bfloat16" : "float32";
  if (st == DF_OK) st = df_draft_config_resolved_json(cfg, mask, &resolved, err);
  if (st == DF_OK) st = df_export_normalize_config(resolved, torch_dtype, opt->expect_block_size, cfg_path, &norm, err);
  if (st == DF_OK) st = df_ffn_export_config(cfg, norm, strategy->serving_class_ffn, err);
  df_draft_model *out_m = em ? em : m;
  if (st == DF_OK)
    st = write_export(ecfg ? ecfg : cfg, df_draft_model_params(out_m), df_draft_model_weights(out_m), norm, out_dir,
                      opt->dtype, err);
  if (st == DF_OK && info) fill_info(dir, norm, cfg, df_draft_model_params(out_m), mask, info);
  json_decref(norm);
  json_decref(resolved);
  df_draft_model_free(em);
  df_draft_config_free(ecfg);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
  return st;
}
