// HF export: SpecForge's config normaliser (kinds, checks, kept keys), float32 exports that reload into
// bit-identical forwards, bfloat16 values equal to the RNE rounding of the weights, strict refusal of a
// checkpoint with a missing or extra tensor, run-directory resolution and the CLI.
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/dflash_model.h"
#include "modeling/strict_load.h"
#include "tests/common/fixture.h"
#include "train/batch.h"
#include "train/export.h"

#define STEP_DIR  DF_FIXTURE_DIR "/dflash_step"
#define CKPT_DIR  STEP_DIR "/draft_ckpt"
#define TINY_JSON STEP_DIR "/tiny-dflash.json"

// ---- scratch directories ------------------------------------------------------------------------------------

static void tmp_make(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/df_export_test_XXXXXX");
  cr_assert_not_null(mkdtemp(buf), "mkdtemp");
}

// Removes dir and everything under it (files, links, subdirectories).
static void tmp_remove(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    char p[1024];
    for (struct dirent *e; (e = readdir(d));) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      struct stat sb;
      if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
        tmp_remove(p);
      else
        remove(p);
    }
    closedir(d);
  }
  rmdir(dir);
}

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  cr_assert(a && b, "copy %s -> %s", from, to);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0) cr_assert_eq(fwrite(buf, 1, n, b), n);
  fclose(a), fclose(b);
}

// A checkpoint directory with the fixture's config and, optionally, its tensors minus `drop` plus `extra`.
static void make_ckpt(const char *dir, const char *drop, const char *extra) {
  char p[1024];
  cr_assert_eq(mkdir(dir, 0777), 0, "mkdir %s", dir);
  snprintf(p, sizeof p, "%s/config.json", dir);
  copy_file(CKPT_DIR "/config.json", p);
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  if (!drop && !extra) {
    copy_file(CKPT_DIR "/model.safetensors", p);
    return;
  }
  df_error err = {0};
  df_st_file *f;
  DF_ASSERT_OK(df_st_open(CKPT_DIR "/model.safetensors", &f, &err), &err);
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  for (int i = 0; i < df_st_count(f); i++) {
    const df_st_tensor *t = df_st_at(f, i);
    if (drop && !strcmp(t->name, drop)) continue;
    DF_ASSERT_OK(df_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, df_st_data(f, t), &err), &err);
  }
  static const float four[4] = {1, 2, 3, 4};
  const int64_t shape[1] = {4};
  if (extra) DF_ASSERT_OK(df_st_writer_add(w, extra, DF_ST_F32, 1, shape, four, &err), &err);
  DF_ASSERT_OK(df_st_writer_write(w, p, &err), &err);
  df_st_writer_free(w);
  df_st_close(f);
}

// ---- the model and one forward ------------------------------------------------------------------------------

typedef struct {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_dflash_model *m;
} loaded;

static loaded load(const char *dir) {
  loaded l = {0};
  char p[1024];
  snprintf(p, sizeof p, "%s/config.json", dir);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(p, &l.cfg, &err), &err);
  l.ctx = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_dflash_model_create(l.cfg, l.ctx, &l.m, &err), &err);
  DF_ASSERT_OK(df_dflash_model_load(l.m, dir, &err), &err);
  return l;
}

static void unload(loaded *l) {
  df_dflash_model_free(l->m);
  df_ctx_destroy(l->ctx);
  df_draft_config_free(l->cfg);
}

// Final hidden states of a fixed batch (the fixture data's first batch, fixed anchors, random block rows).
static float *forward(loaded *l, int64_t *n) {
  df_batch b;
  df_error err = {0};
  DF_ASSERT_OK(df_batch_first(STEP_DIR "/data", 3, 2, 0, l->cfg, &b, &err), &err);
  enum { N = 3 };
  int64_t bs = l->cfg->block_size, H = l->cfg->hidden_size, R = b.B * N * bs;
  int32_t anchors[2 * N] = {0, 4, 9, 2, 7, 11};
  uint8_t keep[2 * N] = {1, 1, 1, 1, 1, 0};
  float *embed = malloc((size_t)(R * H) * sizeof *embed);
  df_test_fill_uniform(embed, R * H, 17, -0.5f, 0.5f);
  df_dflash_batch mb = {b.B, b.S, N, b.hidden, embed, anchors, keep};
  const float *h;
  DF_ASSERT_OK(df_dflash_model_forward(l->m, &mb, &h, &err), &err);
  float *out = malloc((size_t)(R * H) * sizeof *out);
  memcpy(out, h, (size_t)(R * H) * sizeof *out);
  *n = R * H;
  free(embed);
  df_batch_free(&b);
  return out;
}

static void export_ok(const char *ckpt, const char *out, df_st_dtype dt) {
  df_export_options o = {.dtype = dt};
  df_export_info info;
  df_error err = {0};
  DF_ASSERT_OK(df_export(ckpt, out, &o, &info, &err), &err);
  cr_expect_gt(info.num_tensors, 0);
}

// ---- float32 and bfloat16 exports ---------------------------------------------------------------------------

Test(export, f32_export_reloads_to_a_bit_identical_forward) {
  char dir[64], out[128];
  tmp_make(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/export", dir);
  export_ok(CKPT_DIR, out, DF_ST_F32);

  // Exactly config.json and model.safetensors, nothing left behind next to it.
  DIR *d = opendir(out);
  int files = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') {
      files++;
      cr_expect(!strcmp(e->d_name, "config.json") || !strcmp(e->d_name, "model.safetensors"), "%s", e->d_name);
    }
  closedir(d);
  cr_expect_eq(files, 2);
  d = opendir(dir);
  int siblings = 0;
  for (struct dirent *e; (e = readdir(d));) siblings += e->d_name[0] != '.';
  closedir(d);
  cr_expect_eq(siblings, 1, "no temporary directory left beside the export");

  loaded a = load(CKPT_DIR), b = load(out);
  int64_t na, nb;
  float *ya = forward(&a, &na), *yb = forward(&b, &nb);
  cr_assert_eq(na, nb);
  cr_expect_arr_eq(ya, yb, (size_t)na * sizeof *ya, "forward outputs are bit-identical");
  const df_params *p = df_dflash_model_params(a.m);
  cr_expect_arr_eq(df_dflash_model_weights(a.m), df_dflash_model_weights(b.m),
                   (size_t)df_params_numel(p) * sizeof(float), "weights are bit-identical");

  // The file holds exactly the draft's tensors.
  df_st_file *f;
  df_error err = {0};
  char st_path[256];
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", out);
  DF_ASSERT_OK(df_st_open(st_path, &f, &err), &err);
  cr_expect_eq(df_st_count(f), df_params_count(p));
  for (int i = 0; i < df_params_count(p); i++) {
    const df_st_tensor *t = df_st_find(f, df_params_at(p, i)->name);
    cr_expect_not_null(t, "%s in the export", df_params_at(p, i)->name);
    if (t) cr_expect_eq(t->dtype, DF_ST_F32);
  }
  df_st_close(f);

  // Exporting again over it replaces it (an export directory may be overwritten).
  export_ok(out, out, DF_ST_F32);
  free(ya), free(yb);
  unload(&a), unload(&b);
  tmp_remove(dir);
}

Test(export, bf16_values_are_the_rne_rounding_of_the_weights) {
  char dir[64], out[128], st_path[256];
  tmp_make(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/export", dir);
  export_ok(CKPT_DIR, out, DF_ST_BF16);
  loaded a = load(CKPT_DIR);
  const df_params *p = df_dflash_model_params(a.m);
  const float *w = df_dflash_model_weights(a.m);
  df_st_file *f;
  df_error err = {0};
  snprintf(st_path, sizeof st_path, "%s/model.safetensors", out);
  DF_ASSERT_OK(df_st_open(st_path, &f, &err), &err);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    const df_st_tensor *t = df_st_find(f, e->name);
    cr_assert_not_null(t, "%s", e->name);
    cr_assert_eq(t->dtype, DF_ST_BF16, "%s", e->name);
    cr_assert_eq(t->numel, e->numel);
    uint16_t *bits = malloc((size_t)t->numel * 2);
    DF_ASSERT_OK(df_st_read_raw(f, t, bits, (size_t)t->numel * 2, &err), &err);
    for (int64_t j = 0; j < t->numel; j++)
      cr_expect_eq(bits[j], df_st_f32_to_bf16(w[e->offset + j]), "%s[%lld]", e->name, (long long)j);
    free(bits);
  }
  df_st_close(f);

  // The bf16 export reloads and its forward stays within bf16 weight rounding of the fp32 one.
  loaded b = load(out);
  int64_t na, nb;
  float *ya = forward(&a, &na), *yb = forward(&b, &nb);
  df_expect_close("bf16 export forward", yb, ya, na, 2e-2, 2e-2);
  char cfg_path[256];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out);
  json_t *cfg = json_load_file(cfg_path, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(cfg, "torch_dtype")), "bfloat16");
  json_decref(cfg);
  free(ya), free(yb);
  unload(&a), unload(&b);
  tmp_remove(dir);
}

// ---- strictness and resolution ------------------------------------------------------------------------------

static void expect_refused(const char *drop, const char *extra, const char *named) {
  char dir[64], ckpt[128], out[128];
  tmp_make(dir, sizeof dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(out, sizeof out, "%s/export", dir);
  make_ckpt(ckpt, drop, extra);
  df_export_options o = {.dtype = DF_ST_BF16};
  df_error err = {0};
  cr_expect_neq(df_export(ckpt, out, &o, NULL, &err), DF_OK);
  cr_expect(strstr(err.msg, named) || strstr(err.where, named), "the error names %s: %s [%s]", named, err.msg,
            err.where);
  struct stat sb;
  cr_expect_neq(stat(out, &sb), 0, "nothing is written");
  tmp_remove(dir);
}

Test(export, refuses_a_checkpoint_with_a_missing_tensor) {
  expect_refused("layers.1.mlp.down_proj.weight", NULL, "layers.1.mlp.down_proj.weight");
}

Test(export, refuses_a_checkpoint_with_an_extra_tensor) {
  expect_refused(NULL, "layers.7.extra.weight", "layers.7.extra.weight");
}

Test(export, resolves_a_run_directory_to_its_latest_checkpoint) {
  char dir[64], p[256], got[1024];
  tmp_make(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/checkpoints", dir);
  cr_assert_eq(mkdir(p, 0777), 0);
  const char *steps[] = {"step-00000002", "step-00000010", "step-00000009"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/checkpoints/%s", dir, steps[i]);
    make_ckpt(p, NULL, NULL);
  }
  df_error err = {0};
  DF_ASSERT_OK(df_checkpoint_dir_resolve(dir, got, sizeof got, &err), &err);
  cr_expect(strstr(got, "step-00000010") != NULL, "highest step without a link: %s", got);
  snprintf(p, sizeof p, "%s/checkpoints/latest", dir);
  cr_assert_eq(symlink("step-00000009", p), 0);
  DF_ASSERT_OK(df_checkpoint_dir_resolve(dir, got, sizeof got, &err), &err);
  cr_expect(strstr(got, "/checkpoints/step-00000009") != NULL, "the latest link wins, named by its target: %s", got);
  DF_ASSERT_OK(df_checkpoint_dir_resolve(CKPT_DIR, got, sizeof got, &err), &err);
  cr_expect_str_eq(got, CKPT_DIR);
  snprintf(p, sizeof p, "%s/checkpoints/step-00000002/model.safetensors", dir);
  cr_expect_eq(df_checkpoint_dir_resolve(p, got, sizeof got, &err), DF_ERR_IO, "a file is not a checkpoint");
  cr_expect_eq(df_checkpoint_dir_resolve(STEP_DIR, got, sizeof got, &err), DF_ERR_INVALID, "no checkpoint here");
  cr_expect(strstr(err.hint, "checkpoint directory") != NULL, "hint: %s", err.hint);
  tmp_remove(dir);
}

Test(export, refuses_to_replace_a_directory_that_is_not_an_export) {
  char dir[64], p[256];
  tmp_make(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/precious.txt", dir);
  FILE *fp = fopen(p, "w");
  fputs("keep me\n", fp);
  fclose(fp);
  df_export_options o = {.dtype = DF_ST_BF16};
  df_error err = {0};
  cr_expect_eq(df_export(CKPT_DIR, dir, &o, NULL, &err), DF_ERR_INVALID);
  cr_expect_eq(access(p, F_OK), 0, "the user's file is untouched");
  o.dtype = DF_ST_F16;
  cr_expect_eq(df_export(CKPT_DIR, "/tmp/never", &o, NULL, &err), DF_ERR_INVALID, "only bf16 / f32");
  tmp_remove(dir);
}

// ---- the config normaliser ----------------------------------------------------------------------------------

static json_t *normalize_ok(json_t *src, const char *dt, int64_t bs) {
  json_t *out = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_export_normalize_config(src, dt, bs, "test", &out, &err), &err);
  return out;
}

static df_status normalize_err(json_t *src, int64_t bs, df_error *err) {
  json_t *out = (json_t *)0x1;
  df_status st = df_export_normalize_config(src, "bfloat16", bs, "test", &out, err);
  cr_expect_null(out);
  return st;
}

Test(export, normalizer_dflash_keeps_every_other_key) {
  json_t *src = json_load_file(TINY_JSON, 0, NULL);
  cr_assert_not_null(src);
  cr_assert_not_null(json_object_get(src, "auto_map"), "the fixture has an auto_map to remove");
  json_t *out = normalize_ok(src, "float32", 4);
  json_t *arch = json_object_get(out, "architectures");
  cr_expect_eq(json_array_size(arch), 1);
  cr_expect_str_eq(json_string_value(json_array_get(arch, 0)), "DFlashDraftModel");
  cr_expect_null(json_object_get(out, "auto_map"));
  cr_expect_str_eq(json_string_value(json_object_get(out, "torch_dtype")), "float32");
  cr_expect_str_eq(json_string_value(json_object_get(out, "dtype")), "float32", "dtype follows when present");
  const char *key;
  json_t *v;
  json_object_foreach(src, key, v) {
    if (!strcmp(key, "auto_map") || !strcmp(key, "architectures") || !strcmp(key, "dtype")) continue;
    cr_expect(json_equal(v, json_object_get(out, key)), "key %s kept as it was", key);
  }
  cr_expect_eq(json_object_size(out), json_object_size(src), "- auto_map + torch_dtype");
  cr_expect_not_null(json_object_get(src, "auto_map"), "the source is not modified");
  json_decref(out);
  json_decref(src);
}

Test(export, normalizer_checks_block_size_and_kind) {
  json_t *src = json_load_file(TINY_JSON, 0, NULL);
  df_error err = {0};
  cr_expect_eq(normalize_err(src, 16, &err), DF_ERR_INVALID, "block_size 4, expected 16");
  cr_expect(strstr(err.msg, "expected 16") != NULL, "%s", err.msg);

  json_object_set_new(json_object_get(src, "dflash_config"), "block_size", json_integer(8));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "top-level 4 vs dflash_config 8");
  cr_expect(strstr(err.msg, "conflict") != NULL, "%s", err.msg);
  json_object_del(json_object_get(src, "dflash_config"), "block_size");

  json_object_set_new(src, "block_size", json_integer(1));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "block_size 1");
  json_object_del(src, "block_size");
  json_object_set_new(json_object_get(src, "dflash_config"), "block_size", json_integer(6));
  json_t *out = normalize_ok(src, "bfloat16", 6);
  json_decref(out);

  json_object_set_new(json_object_get(src, "dflash_config"), "projector_type", json_string("eagle3"));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "not DFlash-family");
  json_object_set_new(json_object_get(src, "dflash_config"), "projector_type", json_string("dflash"));
  json_object_set_new(json_object_get(src, "dflash_config"), "attention_mode", json_string("mla"));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "attention_mode mla");
  json_decref(src);
}

Test(export, normalizer_dspark_lifts_head_keys) {
  json_t *src = json_load_file(TINY_JSON, 0, NULL);
  json_t *m = json_object_get(src, "dflash_config");
  json_object_set_new(src, "architectures", json_pack("[s]", "DSparkDraftModel"));
  json_object_set_new(m, "projector_type", json_string("dspark"));
  json_object_set_new(m, "markov_rank", json_integer(32));
  json_object_set_new(m, "markov_head_type", json_string("Gated"));
  json_object_set_new(m, "enable_confidence_head", json_true());
  json_t *out = normalize_ok(src, "bfloat16", 0);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(out, "architectures"), 0)), "Qwen3DSparkModel");
  cr_expect_eq(json_integer_value(json_object_get(out, "markov_rank")), 32);
  cr_expect_str_eq(json_string_value(json_object_get(out, "markov_head_type")), "gated");
  cr_expect(json_is_true(json_object_get(out, "enable_confidence_head")));
  cr_expect_null(json_object_get(out, "confidence_head_with_markov"), "absent keys stay absent");
  cr_expect_null(json_object_get(out, "auto_map"));
  json_decref(out);

  df_error err = {0};
  json_object_set_new(src, "markov_rank", json_integer(16));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "top-level markov_rank 16 vs nested 32");
  cr_expect(strstr(err.msg, "markov_rank") != NULL, "%s", err.msg);
  json_object_del(src, "markov_rank");
  json_object_set_new(m, "markov_rank", json_integer(0));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "markov_rank 0");
  json_object_set_new(m, "markov_rank", json_integer(8));
  json_object_set_new(m, "markov_head_type", json_string("lstm"));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "markov_head_type lstm");
  json_object_set_new(m, "markov_head_type", json_string("rnn"));
  json_object_set_new(src, "model_type", json_string("llama"));
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "model_type llama");
  json_decref(src);
}

// ---- the command line ---------------------------------------------------------------------------------------

Test(export, cli_exports_and_reports_errors) {
  char dir[64], cmd[1024];
  tmp_make(dir, sizeof dir);
  snprintf(cmd, sizeof cmd, "%s export %s --out %s/e --dtype float32 --block-size 4 > %s/log 2>&1", DF_DRAFTFORGE_BIN,
           CKPT_DIR, dir, dir);
  cr_expect_eq(system(cmd), 0, "%s", cmd);
  snprintf(cmd, sizeof cmd, "%s/e/model.safetensors", dir);
  cr_expect_eq(access(cmd, F_OK), 0);
  snprintf(cmd, sizeof cmd, "%s export %s --out %s/f --block-size 16 > %s/log 2>&1", DF_DRAFTFORGE_BIN, CKPT_DIR, dir,
           dir);
  cr_expect_eq(WEXITSTATUS(system(cmd)), 1, "block size mismatch fails");
  snprintf(cmd, sizeof cmd, "%s export %s --dtype float16 --out %s/g > %s/log 2>&1", DF_DRAFTFORGE_BIN, CKPT_DIR, dir,
           dir);
  cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "bad --dtype is a usage error");
  tmp_remove(dir);
}
