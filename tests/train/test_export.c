// HF export: SpecForge's config normaliser (kinds, checks, kept keys), float32 exports that reload into
// bit-identical forwards (DSpark: backbone and heads), bfloat16 values equal to the RNE rounding of the weights,
// strict refusal of a checkpoint with a missing or extra tensor or a conflicting DSpark key, run-directory
// resolution and the CLI (DSpark: the demo recipe's run, exported and evaluated).
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/draft_model.h"
#include "modeling/dspark_heads.h"
#include "modeling/strict_load.h"
#include "tests/common/fixture.h"
#include "train/data/batch.h"
#include "train/export/export.h"
#include "train/export/inspect_export.h"
#include "train/run/run_dir.h"

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
  df_draft_model *m;
} loaded;

static loaded load(const char *dir) {
  loaded l = {0};
  char p[1024];
  snprintf(p, sizeof p, "%s/config.json", dir);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(p, &l.cfg, &err), &err);
  l.ctx = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_draft_model_create(l.cfg, l.ctx, &l.m, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(l.m, dir, &err), &err);
  return l;
}

static void unload(loaded *l) {
  df_draft_model_free(l->m);
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
  df_draft_batch mb = {
      .B = b.B, .S = b.S, .N = N, .target_hidden = b.hidden, .block_embed = embed, .anchors = anchors, .keep = keep};
  const float *h;
  DF_ASSERT_OK(df_draft_model_forward(l->m, &mb, &h, &err), &err);
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
  const df_params *p = df_draft_model_params(a.m);
  cr_expect_arr_eq(df_draft_model_weights(a.m), df_draft_model_weights(b.m), (size_t)df_params_numel(p) * sizeof(float),
                   "weights are bit-identical");

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
  const df_params *p = df_draft_model_params(a.m);
  const float *w = df_draft_model_weights(a.m);
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

// ---- DSpark drafts ----------------------------------------------------------------------------------------------

#define DSPARK_DIR DF_FIXTURE_DIR "/dspark_step"

// The heads' forward on the backbone's output y (R = n / H rows in blocks of bs) with fixed previous tokens:
// latent [R, r] followed by the confidence logits [R] (each part only when the head exists). *count: floats.
static float *heads_forward(loaded *l, const float *y, int64_t n, int64_t *count) {
  df_dspark_heads *h = df_draft_model_dspark_heads(l->m);
  cr_assert_not_null(h, "a DSpark model has heads");
  int64_t H = l->cfg->hidden_size, bs = l->cfg->block_size, R = n / H, r = df_dspark_heads_markov_rank(h);
  int32_t *prev = malloc((size_t)R * sizeof *prev);
  for (int64_t i = 0; i < R; i++) prev[i] = (int32_t)((i * 37 + 5) % l->cfg->vocab_size);
  const float *latent = NULL, *conf = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_dspark_heads_forward(h, R / bs, bs, y, prev, &latent, &conf, &err), &err);
  int64_t nl = latent ? R * r : 0, nc = conf ? R : 0;
  float *out = malloc((size_t)(nl + nc + 1) * sizeof *out);
  if (nl) memcpy(out, latent, (size_t)nl * sizeof *out);
  if (nc) memcpy(out + nl, conf, (size_t)nc * sizeof *out);
  *count = nl + nc;
  free(prev);
  return out;
}

// A float32 export of a DSpark checkpoint holds exactly its tensors (heads under markov_head.* /
// confidence_head.*, whatever names the checkpoint used) and reloads into bit-identical backbone and head outputs.
static void expect_dspark_roundtrip(const char *ckpt, const char *head_type) {
  char dir[64], out[128], p[256];
  tmp_make(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/export", dir);
  export_ok(ckpt, out, DF_ST_F32);
  loaded a = load(ckpt), b = load(out);
  cr_assert_eq(b.cfg->kind, DF_DRAFT_DSPARK, "the export reloads as a DSpark draft");
  const df_params *pa = df_draft_model_params(a.m);
  const df_params *pb = df_draft_model_params(b.m);
  cr_assert_eq(df_params_count(pa), df_params_count(pb));
  for (int i = 0; i < df_params_count(pa); i++) { // entry by entry: the alignment padding between them is not data
    const df_param *ea = df_params_at(pa, i), *eb = df_params_find(pb, ea->name);
    cr_assert_not_null(eb, "%s in the reloaded export", ea->name);
    cr_assert_eq(ea->numel, eb->numel, "%s", ea->name);
    cr_expect_arr_eq(df_draft_model_weights(a.m) + ea->offset, df_draft_model_weights(b.m) + eb->offset,
                     (size_t)ea->numel * sizeof(float), "%s: %s is bit-identical", ckpt, ea->name);
  }
  int64_t na, nb, ha, hb;
  float *ya = forward(&a, &na), *yb = forward(&b, &nb);
  cr_assert_eq(na, nb);
  cr_expect_arr_eq(ya, yb, (size_t)na * sizeof *ya, "%s: backbone outputs are bit-identical", ckpt);
  float *za = heads_forward(&a, ya, na, &ha), *zb = heads_forward(&b, yb, nb, &hb);
  cr_assert_eq(ha, hb);
  cr_expect_gt(ha, 0);
  cr_expect_arr_eq(za, zb, (size_t)ha * sizeof *za, "%s: Markov latent and confidence logits are bit-identical", ckpt);

  // Exactly the draft's tensors, the heads among them under SpecForge's names.
  df_st_file *f;
  df_error err = {0};
  snprintf(p, sizeof p, "%s/model.safetensors", out);
  DF_ASSERT_OK(df_st_open(p, &f, &err), &err);
  cr_expect_eq(df_st_count(f), df_params_count(pa));
  int heads = 0;
  for (int i = 0; i < df_st_count(f); i++) {
    const char *name = df_st_at(f, i)->name;
    cr_expect_not_null(df_params_find(pa, name), "%s is a draft tensor", name);
    cr_expect_eq(df_st_at(f, i)->dtype, DF_ST_F32);
    heads += !strncmp(name, "markov_head.", 12) || !strncmp(name, "confidence_head.", 16);
    cr_expect(strncmp(name, "logit_head.", 11), "no legacy name in an export: %s", name);
  }
  cr_expect_not_null(df_st_find(f, "markov_head.markov_w1.weight"));
  cr_expect_not_null(df_st_find(f, "markov_head.markov_w2.weight"));
  cr_expect_not_null(df_st_find(f, "confidence_head.proj.weight"));
  cr_expect_not_null(df_st_find(f, "confidence_head.proj.bias"));
  cr_expect_geq(heads, 4);
  df_st_close(f);

  // config.json: the serving class, the head settings at the top level, no auto_map.
  snprintf(p, sizeof p, "%s/config.json", out);
  json_t *cfg = json_load_file(p, 0, NULL), *dc = json_object_get(cfg, "dflash_config");
  cr_assert_not_null(cfg);
  json_t *arch = json_object_get(cfg, "architectures");
  cr_expect_eq(json_array_size(arch), 1);
  cr_expect_str_eq(json_string_value(json_array_get(arch, 0)), "Qwen3DSparkModel");
  cr_expect_str_eq(json_string_value(json_object_get(cfg, "model_type")), "qwen3");
  cr_expect_null(json_object_get(cfg, "auto_map"));
  cr_expect_str_eq(json_string_value(json_object_get(cfg, "torch_dtype")), "float32");
  cr_expect_str_eq(json_string_value(json_object_get(cfg, "markov_head_type")), head_type);
  static const char *const lifted[] = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                       "confidence_head_with_markov"};
  for (size_t i = 0; i < sizeof lifted / sizeof *lifted; i++) {
    cr_expect_not_null(json_object_get(cfg, lifted[i]), "%s copied to the top level", lifted[i]);
    cr_expect(json_equal(json_object_get(cfg, lifted[i]), json_object_get(dc, lifted[i])), "%s", lifted[i]);
  }
  json_decref(cfg);
  free(ya), free(yb), free(za), free(zb);
  unload(&a), unload(&b);
  tmp_remove(dir);
}

Test(export, dspark_f32_export_reloads_backbone_and_heads_bit_identically) {
  expect_dspark_roundtrip(DSPARK_DIR "/ckpt_rnn", "rnn");                // rnn head, confidence head on h
  expect_dspark_roundtrip(DSPARK_DIR "/ckpt_vanilla_legacy", "vanilla"); // legacy logit_head.* names
}

// A top-level head key that disagrees with dflash_config's fails the export, naming the key; nothing is written.
Test(export, dspark_conflicting_top_level_value_fails_naming_the_key) {
  char dir[64], ckpt[128], out[128], p[256];
  tmp_make(dir, sizeof dir);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(out, sizeof out, "%s/export", dir);
  cr_assert_eq(mkdir(ckpt, 0777), 0);
  snprintf(p, sizeof p, "%s/model.safetensors", ckpt);
  copy_file(DSPARK_DIR "/ckpt_rnn/model.safetensors", p);
  static const char *const keys[] = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                     "confidence_head_with_markov"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    json_t *cfg = json_load_file(DSPARK_DIR "/ckpt_rnn/config.json", 0, NULL);
    cr_assert_not_null(cfg);
    json_t *nested = json_object_get(json_object_get(cfg, "dflash_config"), keys[i]);
    json_t *other = json_is_integer(nested)   ? json_integer(json_integer_value(nested) * 2)
                    : json_is_boolean(nested) ? json_boolean(!json_is_true(nested))
                                              : json_string("gated");
    json_object_set_new(cfg, keys[i], other);
    snprintf(p, sizeof p, "%s/config.json", ckpt);
    cr_assert_eq(json_dump_file(cfg, p, JSON_INDENT(2)), 0);
    json_decref(cfg);
    df_export_options o = {.dtype = DF_ST_F32};
    df_error err = {0};
    cr_expect_eq(df_export(ckpt, out, &o, NULL, &err), DF_ERR_INVALID, "%s conflict", keys[i]);
    cr_expect(strstr(err.where, keys[i]) != NULL, "the error names %s: where %s, %s", keys[i], err.where, err.msg);
    struct stat sb;
    cr_expect_neq(stat(out, &sb), 0, "nothing is written");
  }
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

// Domino: SpecForge's export normaliser names it DFlashDraftModel and keeps projector_type domino (and the head's
// keys), so the export reads back as the same Domino draft; the GRU head's tensors are written under their canonical
// names even from a checkpoint in SpecForge's legacy logit_head.* container, and the forward is bit-identical.
Test(export, domino_export_keeps_the_head_and_reads_back) {
  static const char *const ckpts[] = {DF_FIXTURE_DIR "/domino_step/ckpt_shift_full",
                                      DF_FIXTURE_DIR "/domino_step/ckpt_noshift_legacy"};
  for (int c = 0; c < 2; c++) {
    char dir[64], out[128], p[256];
    tmp_make(dir, sizeof dir);
    snprintf(out, sizeof out, "%s/export", dir);
    export_ok(ckpts[c], out, DF_ST_F32);
    snprintf(p, sizeof p, "%s/config.json", out);
    json_t *cfg = json_load_file(p, 0, NULL);
    cr_assert_not_null(cfg);
    cr_expect_str_eq(json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)), "DFlashDraftModel");
    cr_expect_null(json_object_get(cfg, "auto_map"));
    json_t *dc = json_object_get(cfg, "dflash_config");
    cr_expect_str_eq(json_string_value(json_object_get(dc, "projector_type")), "domino");
    cr_expect_eq(json_integer_value(json_object_get(dc, "gru_hidden_dim")), 24);
    json_decref(cfg);
    loaded a = load(ckpts[c]), b = load(out);
    cr_expect_eq(b.cfg->kind, DF_DRAFT_DOMINO, "the export is a Domino draft again");
    const df_params *t = df_draft_model_params(b.m);
    cr_expect_not_null(df_params_find(t, "prefix_gru.weight_ih_l0"));
    const int64_t n = df_params_numel(t);
    cr_assert_eq(n, df_params_numel(df_draft_model_params(a.m)));
    cr_expect_eq(memcmp(df_draft_model_weights(a.m), df_draft_model_weights(b.m), sizeof(float) * (size_t)n), 0,
                 "f32 export: the same weights, head included");
    unload(&a), unload(&b);
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    int problems = -1;
    df_error err = {0};
    DF_ASSERT_OK(df_inspect_export(out, mem, &problems, &err), &err);
    fclose(mem);
    cr_expect_eq(problems, 0, "%s", text);
    cr_expect(strstr(text, "gru_hidden_dim") && strstr(text, "sglang#36899"), "%s", text);
    free(text);
    tmp_remove(dir);
  }
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
  cr_expect_str_eq(err.where, "markov_rank", "the conflict names the key");
  cr_expect(strstr(err.msg, "test") != NULL, "and the document: %s", err.msg);
  json_object_set_new(src, "markov_rank", json_integer(32));
  json_object_set_new(src, "enable_confidence_head", json_false());
  cr_expect_eq(normalize_err(src, 0, &err), DF_ERR_INVALID, "top-level enable_confidence_head false vs nested true");
  cr_expect_str_eq(err.where, "enable_confidence_head");
  json_object_del(src, "enable_confidence_head");
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

// recipes/demo-dspark.yaml through the CLI: a short run (with eval lines), its export, and eval of both.
Test(export, cli_dspark_demo_run_exports_and_evaluates) {
  char dir[64], cmd[2048], p[256];
  tmp_make(dir, sizeof dir);
  snprintf(cmd, sizeof cmd,
           "%s train %s/recipes/demo-dspark.yaml --set output_dir=%s/run --set training.max_steps=20 "
           "--set training.eval_interval=10 --threads 2 > %s/train.log 2>&1",
           DF_DRAFTFORGE_BIN, DF_SOURCE_DIR, dir, dir);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  snprintf(p, sizeof p, "%s/run/metrics.jsonl", dir);
  FILE *fp = fopen(p, "r");
  cr_assert_not_null(fp, "%s", p);
  char line[8192];
  int evals = 0;
  while (fgets(line, sizeof line, fp)) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && json_object_get(o, "eval/loss")) {
      evals++;
      cr_expect(json_is_real(json_object_get(o, "eval/tau")), "%s", line);
      cr_expect(json_is_real(json_object_get(o, "eval/tau_probabilistic")), "%s", line);
      cr_expect(json_is_real(json_object_get(o, "eval/ce_loss")), "%s", line);
    }
    json_decref(o);
  }
  fclose(fp);
  cr_expect_eq(evals, 2, "eval lines at steps 10 and 20");

  snprintf(cmd, sizeof cmd, "%s export %s/run --out %s/e --dtype float32 --block-size 4 > %s/export.log 2>&1",
           DF_DRAFTFORGE_BIN, dir, dir, dir);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  snprintf(p, sizeof p, "%s/e/config.json", dir);
  json_t *cfg = json_load_file(p, 0, NULL);
  cr_assert_not_null(cfg);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(cfg, "architectures"), 0)), "Qwen3DSparkModel");
  cr_expect_eq(json_integer_value(json_object_get(cfg, "markov_rank")), 16);
  json_decref(cfg);

  json_t *rep[2] = {NULL, NULL};
  const char *what[2] = {"run", "e"};
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd, "%s eval %s/%s --recipe %s/recipes/demo-dspark.yaml --out %s/%s.json > %s/eval.log 2>&1",
             DF_DRAFTFORGE_BIN, dir, what[i], DF_SOURCE_DIR, dir, what[i], dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(p, sizeof p, "%s/%s.json", dir, what[i]);
    cr_assert_not_null(rep[i] = json_load_file(p, 0, NULL), "%s", p);
  }
  cr_expect_str_eq(json_string_value(json_object_get(rep[1], "strategy")), "dspark");
  static const char *const keys[] = {"loss",    "acc",     "accept_len",     "tau_probabilistic",
                                     "ce_loss", "l1_loss", "confidence_loss"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    cr_expect(json_is_real(json_object_get(rep[1], keys[k])), "%s", keys[k]);
    cr_expect(json_equal(json_object_get(rep[0], keys[k]), json_object_get(rep[1], keys[k])),
              "%s: the float32 export evaluates exactly like its checkpoint", keys[k]);
  }
  json_decref(rep[0]), json_decref(rep[1]);
  tmp_remove(dir);
}

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
