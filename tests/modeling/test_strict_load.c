// Parameter table layout and views; strict loading (exact match, every class of mismatch listed in full,
// destination untouched on error, ignore suffixes, renames); saving the flat buffer as F32 / BF16.
#define _GNU_SOURCE // nftw
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/param_table.h"
#include "modeling/strict_load.h"
#include "tests/common/fixture.h"

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}
static void rm_tree(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static char g_dir[64]; // per-test temporary directory (each Criterion test runs in its own process)
static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/df_sl_test_XXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}
static void teardown(void) { rm_tree(g_dir); }

// The table every test loads into: three trainable tensors and a frozen buffer.
static df_params *make_table(void) {
  df_params *p;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  const df_param_spec specs[] = {
      {"fc.weight", DF_ROLE_WEIGHT, 2, (int64_t[]){4, 6}, DF_F32, true, true},
      {"hidden_norm.weight", DF_ROLE_NORM, 1, (int64_t[]){6}, DF_BF16, true, false},
      {"layers.0.self_attn.q_proj.weight", DF_ROLE_WEIGHT, 2, (int64_t[]){3, 6}, DF_BF16, true, true},
      {"layers.0.scale", DF_ROLE_BUFFER, 0, NULL, DF_F32, false, false},
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) DF_ASSERT_OK(df_params_add(p, &specs[i], &err), &err);
  DF_ASSERT_OK(df_params_finalize(p, &err), &err);
  return p;
}

static float value_of(int tensor, int64_t i) { return (float)(tensor * 100 + i) * 0.25f; }

typedef struct {
  const char *name;
  df_st_dtype dt;
  int ndim;
  int64_t shape[4];
} tspec;

// Writes the listed tensors (value_of(k, i) in each) into g_dir/name and opens it as a model.
static df_st_model *write_model(const char *fname, const tspec *ts, int n) {
  static float vals[16][64];
  df_error err = {0};
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  for (int k = 0; k < n; k++) {
    for (int64_t i = 0; i < 64; i++) vals[k][i] = value_of(k, i);
    if (df_st_dtype_is_float(ts[k].dt))
      DF_ASSERT_OK(df_st_writer_add_f32_as(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape, vals[k], &err), &err);
    else
      DF_ASSERT_OK(df_st_writer_add(w, ts[k].name, ts[k].dt, ts[k].ndim, ts[k].shape, vals[k], &err), &err);
  }
  char path[160];
  snprintf(path, sizeof path, "%s/%s", g_dir, fname);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  df_st_writer_free(w);
  df_st_model *m;
  DF_ASSERT_OK(df_st_model_open(path, &m, &err), &err);
  return m;
}

#define T_FC                                                                                                           \
  {                                                                                                                    \
    "fc.weight", DF_ST_F32, 2, { 4, 6 }                                                                                \
  }
#define T_NORM                                                                                                         \
  {                                                                                                                    \
    "hidden_norm.weight", DF_ST_BF16, 1, { 6 }                                                                         \
  }
#define T_Q                                                                                                            \
  {                                                                                                                    \
    "layers.0.self_attn.q_proj.weight", DF_ST_BF16, 2, { 3, 6 }                                                        \
  }
#define T_SCALE                                                                                                        \
  {                                                                                                                    \
    "layers.0.scale", DF_ST_F64, 0, { 0 }                                                                              \
  }

static float *sentinel_buffer(const df_params *p) {
  float *flat = malloc(sizeof(float) * (size_t)df_params_numel(p));
  for (int64_t i = 0; i < df_params_numel(p); i++) flat[i] = -7.0f;
  return flat;
}

static void expect_untouched(const df_params *p, const float *flat) {
  for (int64_t i = 0; i < df_params_numel(p); i++)
    if (flat[i] != -7.0f) cr_assert_fail("flat[%lld] was modified by a failing load", (long long)i);
}

// Loads and expects DF_ERR_INVALID whose message names every string in names (NULL-terminated).
static df_error expect_load_fails(const df_params *p, const df_st_model *m, const df_load_options *o,
                                  const char *const *names) {
  float *flat = sentinel_buffer(p);
  df_error err = {0};
  cr_expect_eq(df_params_load_strict(p, flat, m, o, NULL, &err), DF_ERR_INVALID);
  for (int i = 0; names[i]; i++) cr_expect(strstr(err.msg, names[i]) != NULL, "msg names '%s': %s", names[i], err.msg);
  cr_expect(strstr(err.where, df_st_model_path(m)) != NULL, "where names the file: %s", err.where);
  cr_expect(err.hint[0]);
  expect_untouched(p, flat);
  free(flat);
  return err;
}

// ---- parameter table ---------------------------------------------------------------------------------------

Test(param_table, layout_is_aligned_and_views_share_it) {
  df_params *p = make_table();
  cr_expect_eq(df_params_count(p), 4);
  cr_expect_eq(df_params_param_numel(p), 24 + 6 + 18 + 1);
  int64_t want_off[] = {0, 32, 48, 80};
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(df_params_at(p, i)->offset, want_off[i], "offset of %s", df_params_at(p, i)->name);
    cr_expect_eq(df_params_at(p, i)->offset % DF_PARAMS_ALIGN_ELEMS, 0);
  }
  cr_expect_eq(df_params_numel(p), 96);
  const df_param *q = df_params_find(p, "layers.0.self_attn.q_proj.weight");
  cr_assert_not_null(q);
  cr_expect_eq(q->role, DF_ROLE_WEIGHT);
  cr_expect(q->trainable && q->weight_decay);
  cr_expect_eq(q->dtype, DF_BF16);
  cr_expect_str_eq(df_param_role_name(df_params_find(p, "layers.0.scale")->role), "buffer");
  cr_expect_null(df_params_find(p, "nope"));
  float *params = aligned_alloc(64, sizeof(float) * 96), *grads = aligned_alloc(64, sizeof(float) * 96);
  df_tensor tp = df_params_view(q, params), tg = df_params_view(q, grads);
  cr_expect_eq(tp.data, params + 48);
  cr_expect_eq(tg.data, grads + 48);
  cr_expect_eq((uintptr_t)tp.data % 64, 0);
  cr_expect(tp.ndim == 2 && tp.shape[0] == 3 && tp.shape[1] == 6 && tp.stride[0] == 6);
  df_error err = {0};
  df_tensor t;
  DF_ASSERT_OK(df_params_view_named(p, "fc.weight", params, &t, &err), &err);
  cr_expect_eq(t.data, params);
  cr_expect_eq(df_params_view_named(p, "missing.weight", params, &t, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "missing.weight");
  free(params), free(grads);
  df_params_free(p);
}

Test(param_table, rejects_duplicates_and_late_adds) {
  df_params *p;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  df_param_spec s = {"a.weight", DF_ROLE_WEIGHT, 1, (int64_t[]){3}, DF_F32, true, true};
  DF_ASSERT_OK(df_params_add(p, &s, &err), &err);
  DF_ASSERT_OK(df_params_add(p, &s, &err), &err);
  cr_expect_eq(df_params_finalize(p, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "a.weight");
  df_params_free(p);
  p = make_table();
  cr_expect_eq(df_params_add(p, &s, &err), DF_ERR_INVALID);
  df_param_spec bad = {"b", DF_ROLE_WEIGHT, 1, (int64_t[]){-1}, DF_F32, true, true};
  df_params_free(p);
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  cr_expect_eq(df_params_add(p, &bad, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "b");
  df_params_free(p);
}

// ---- strict loading ------------------------------------------------------------------------------------

Test(strict_load, exact_match_loads_values, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {T_FC, T_NORM, T_Q, T_SCALE};
  df_st_model *m = write_model("model.safetensors", ts, 4);
  float *flat = sentinel_buffer(p);
  df_error err = {0};
  df_load_stats stats;
  DF_ASSERT_OK(df_params_load_strict(p, flat, m, NULL, &stats, &err), &err);
  cr_expect_eq(stats.loaded, 4);
  for (int k = 0; k < 4; k++) {
    const df_param *e = df_params_find(p, ts[k].name);
    for (int64_t i = 0; i < e->numel; i++) {
      float want = value_of(k, i);
      if (ts[k].dt == DF_ST_BF16) want = df_st_bf16_to_f32(df_st_f32_to_bf16(want));
      cr_expect_eq(flat[e->offset + i], want, "%s[%lld]", e->name, (long long)i);
    }
    for (int64_t i = e->offset + e->numel; i < e->offset + (e->numel + 15) / 16 * 16; i++)
      cr_expect_eq(flat[i], -7.0f, "padding after %s untouched", e->name);
  }
  free(flat);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, extra_tensors_are_all_listed, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {T_FC, {"extra.one", DF_ST_F32, 1, {2}}, T_NORM, T_Q, T_SCALE, {"extra.two", DF_ST_F32, 1, {2}}};
  df_st_model *m = write_model("model.safetensors", ts, 6);
  df_error e = expect_load_fails(p, m, NULL, (const char *[]){"extra.one", "extra.two", "2 problems", NULL});
  cr_expect(strstr(e.msg, "unexpected tensor") != NULL, "%s", e.msg);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, missing_params_are_all_listed, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {T_FC, T_Q};
  df_st_model *m = write_model("model.safetensors", ts, 2);
  df_error e = expect_load_fails(p, m, NULL, (const char *[]){"hidden_norm.weight", "layers.0.scale", NULL});
  cr_expect(strstr(e.msg, "missing parameter") != NULL, "%s", e.msg);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, shape_mismatches_are_all_listed, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {
      {"fc.weight", DF_ST_F32, 2, {6, 4}}, T_NORM, {"layers.0.self_attn.q_proj.weight", DF_ST_BF16, 1, {18}}, T_SCALE};
  df_st_model *m = write_model("model.safetensors", ts, 4);
  df_error e = expect_load_fails(p, m, NULL, (const char *[]){"fc.weight", "q_proj.weight", "[6, 4]", "[4, 6]", NULL});
  cr_expect(strstr(e.msg, "shape mismatch") && strstr(e.msg, "[18]"), "%s", e.msg);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, every_kind_of_problem_in_one_report, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {
      {"fc.weight", DF_ST_F32, 1, {24}}, {"stray", DF_ST_F32, 1, {1}}, T_NORM, {"layers.0.scale", DF_ST_I32, 0, {0}}};
  df_st_model *m = write_model("model.safetensors", ts, 4);
  df_error e = expect_load_fails(
      p, m, NULL, (const char *[]){"fc.weight", "stray", "q_proj.weight", "layers.0.scale", "4 problems", NULL});
  cr_expect(strstr(e.msg, "I32") != NULL, "dtype problem reported: %s", e.msg);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, long_reports_are_capped_and_logged, .init = setup, .fini = teardown) {
  df_params *p;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  char name[64];
  for (int i = 0; i < 100; i++) {
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", i / 8, i % 8);
    df_param_spec s = {.name = name, .role = DF_ROLE_WEIGHT, .ndim = 1, .shape = (int64_t[]){2}};
    DF_ASSERT_OK(df_params_add(p, &s, &err), &err);
  }
  DF_ASSERT_OK(df_params_finalize(p, &err), &err);
  const tspec ts[] = {T_FC};
  df_st_model *m = write_model("model.safetensors", ts, 1);
  char *log = NULL;
  size_t loglen = 0;
  FILE *lf = open_memstream(&log, &loglen);
  df_load_options o = {.log = lf};
  df_error e = expect_load_fails(p, m, &o, (const char *[]){"101 problems", "more", "fc.weight", NULL});
  fclose(lf);
  cr_expect_lt(strlen(e.msg), sizeof e.msg - 1, "message fits: %s", e.msg);
  int lines = 0;
  for (char *c = log; *c; c++) lines += *c == '\n';
  cr_expect_eq(lines, 101, "every problem is logged");
  cr_expect(strstr(log, "model.layers.12.mlp.experts.3.down_proj.weight") != NULL);
  free(log);
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, ignore_suffix_only_for_declared, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {T_FC, T_NORM, T_Q, T_SCALE, {"layers.0.self_attn.rotary_emb.inv_freq", DF_ST_F32, 1, {3}}};
  df_st_model *m = write_model("model.safetensors", ts, 5);
  const char *const ign[] = {"rotary_emb.inv_freq"};
  df_load_options o = {.ignore_suffixes = ign, .n_ignore = 1};
  float *flat = sentinel_buffer(p);
  df_error err = {0};
  df_load_stats stats;
  DF_ASSERT_OK(df_params_load_strict(p, flat, m, &o, &stats, &err), &err);
  cr_expect(stats.loaded == 4 && stats.ignored == 1);
  free(flat);
  df_st_model_close(m);
  // An undeclared suffix still fails.
  const char *const other[] = {"attn.bias"};
  df_load_options o2 = {.ignore_suffixes = other, .n_ignore = 1};
  m = write_model("model2.safetensors", ts, 5);
  expect_load_fails(p, m, &o2, (const char *[]){"rotary_emb.inv_freq", "1 problem", NULL});
  df_st_model_close(m);
  df_params_free(p);
}

static const char *strip_draft_prefix(void *ctx, const char *name, char *buf, size_t n) {
  (void)ctx;
  if (strncmp(name, "draft.", 6)) return NULL;
  snprintf(buf, n, "%s", name + 6);
  return buf;
}

Test(strict_load, renames_at_the_file_boundary, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  const tspec ts[] = {
      {"legacy_fc.weight", DF_ST_F32, 2, {4, 6}}, {"draft.hidden_norm.weight", DF_ST_BF16, 1, {6}}, T_Q, T_SCALE};
  df_st_model *m = write_model("model.safetensors", ts, 4);
  expect_load_fails(p, m, NULL, (const char *[]){"legacy_fc.weight", "draft.hidden_norm.weight", "fc.weight", NULL});
  const df_rename ren[] = {{"legacy_fc.", "fc."}};
  df_load_options o = {.renames = ren, .n_renames = 1, .map = strip_draft_prefix};
  float *flat = sentinel_buffer(p);
  df_error err = {0};
  DF_ASSERT_OK(df_params_load_strict(p, flat, m, &o, NULL, &err), &err);
  cr_expect_eq(flat[df_params_find(p, "fc.weight")->offset + 5], value_of(0, 5));
  free(flat);
  // Two file tensors landing on one parameter is an error naming both.
  const tspec dup[] = {T_FC, {"legacy_fc.weight", DF_ST_F32, 2, {4, 6}}, T_NORM, T_Q, T_SCALE};
  df_st_model_close(m);
  m = write_model("dup.safetensors", dup, 5);
  df_error e = expect_load_fails(p, m, &o, (const char *[]){"legacy_fc.weight", "fc.weight", "both map", NULL});
  (void)e;
  df_st_model_close(m);
  df_params_free(p);
}

Test(strict_load, loads_from_a_sharded_checkpoint) {
  df_params *p;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  const df_param_spec specs[] = {
      {"model.embed_tokens.weight", DF_ROLE_EMBED, 2, (int64_t[]){6, 4}, DF_BF16, false, false},
      {"model.layers.0.mlp.up_proj.weight", DF_ROLE_WEIGHT, 2, (int64_t[]){8, 4}, DF_F32, true, true},
      {"model.norm.weight", DF_ROLE_NORM, 1, (int64_t[]){4}, DF_F32, true, false},
      {"lm_head.weight", DF_ROLE_WEIGHT, 2, (int64_t[]){6, 4}, DF_BF16, false, false},
  };
  for (int i = 0; i < 4; i++) DF_ASSERT_OK(df_params_add(p, &specs[i], &err), &err);
  DF_ASSERT_OK(df_params_finalize(p, &err), &err);
  df_st_model *m;
  DF_ASSERT_OK(df_st_model_open(DF_FIXTURE_DIR "/safetensors/sharded", &m, &err), &err);
  float *flat = sentinel_buffer(p);
  DF_ASSERT_OK(df_params_load_strict(p, flat, m, NULL, NULL, &err), &err);
  df_st_file *want;
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/sharded_expected.safetensors", &want, &err), &err);
  for (int i = 0; i < 4; i++) {
    const df_param *e = df_params_at(p, i);
    float ref[64];
    DF_ASSERT_OK(df_st_read_f32(want, df_st_find(want, e->name), ref, e->numel, &err), &err);
    df_expect_close_elementwise(e->name, flat + e->offset, ref, e->numel, 0, 0);
  }
  df_st_close(want);
  free(flat);
  df_st_model_close(m);
  df_params_free(p);
}

// ---- saving ----------------------------------------------------------------------------------------------

Test(strict_load, save_then_load_round_trips, .init = setup, .fini = teardown) {
  df_params *p = make_table();
  float *flat = calloc((size_t)df_params_numel(p), sizeof(float));
  df_test_fill_uniform(flat, df_params_numel(p), 3, -2, 2);
  char path[160];
  snprintf(path, sizeof path, "%s/ckpt.safetensors", g_dir);
  df_error err = {0};
  const char *const meta[] = {"step", "42"};
  df_save_options o = {.dtype = DF_ST_F32, .metadata = meta, .n_metadata = 1};
  DF_ASSERT_OK(df_params_save(p, flat, path, &o, &err), &err);
  df_st_model *m;
  DF_ASSERT_OK(df_st_model_open(path, &m, &err), &err);
  const df_st_file *f = df_st_model_shard(m, 0);
  cr_expect_str_eq(df_st_metadata_get(f, "format"), "pt");
  cr_expect_str_eq(df_st_metadata_get(f, "step"), "42");
  float *back = sentinel_buffer(p);
  DF_ASSERT_OK(df_params_load_strict(p, back, m, NULL, NULL, &err), &err);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    cr_expect_eq(memcmp(back + e->offset, flat + e->offset, sizeof(float) * (size_t)e->numel), 0, "%s bitwise",
                 e->name);
  }
  df_st_model_close(m);
  // BF16: round to nearest even, as df_st_f32_to_bf16.
  o.dtype = DF_ST_BF16;
  DF_ASSERT_OK(df_params_save(p, flat, path, &o, &err), &err);
  DF_ASSERT_OK(df_st_model_open(path, &m, &err), &err);
  DF_ASSERT_OK(df_params_load_strict(p, back, m, NULL, NULL, &err), &err);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    cr_expect_eq(df_st_model_find(m, e->name, NULL)->dtype, DF_ST_BF16);
    for (int64_t k = 0; k < e->numel; k++)
      cr_expect_eq(back[e->offset + k], df_st_bf16_to_f32(df_st_f32_to_bf16(flat[e->offset + k])));
  }
  df_st_model_close(m);
  // Gradient dumps: trainable entries only.
  df_save_options g = {.dtype = DF_ST_F32, .trainable_only = true};
  DF_ASSERT_OK(df_params_save(p, flat, path, &g, &err), &err);
  DF_ASSERT_OK(df_st_model_open(path, &m, &err), &err);
  cr_expect_eq(df_st_model_count(m), 3);
  cr_expect_null(df_st_model_find(m, "layers.0.scale", NULL));
  df_st_model_close(m);
  free(back);
  free(flat);
  df_params_free(p);
}
