// Checkpoint layouts: file names per layout, exact round trips native ↔ qwen ↔ deepseek through files, strict
// loading (missing expert, unexpected expert index, unexpected tensor, native names under a renaming layout),
// optional centering buffers on warm start, fp32 buffers and the int64 step counter in files.
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/config.h"
#include "moe/layout.h"
#include "moe/params.h"
#include "tests/common/fixture.h"

#define CONFIGS_DIR DF_SOURCE_DIR "/configs"
#define H           64

static df_moe_config resolve_file(const char *name, const char *layout, bool router_bias) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, name);
  json_error_t jerr;
  json_t *d = json_load_file(path, 0, &jerr);
  cr_assert_not_null(d, "%s: %s", path, jerr.text);
  if (layout) json_object_set_new(d, "moe_layout", json_string(layout));
  if (router_bias) json_object_set_new(d, "moe_router_bias", json_true());
  df_moe_config m;
  bool is_moe = false;
  df_error err = {0};
  df_status st = df_moe_config_resolve(d, name, &is_moe, &m, &err);
  json_decref(d);
  DF_ASSERT_OK(st, &err);
  cr_assert(is_moe);
  return m;
}

// A table like a draft's: a dense-named tensor, two MoE layers, a final norm; filled with distinct values.
typedef struct {
  df_params *p;
  float *flat;
} table;

static table make_table(const df_moe_config *m, uint64_t seed) {
  table t;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&t.p, &err), &err);
  const df_param_spec fc = {
      .name = "fc.weight", .role = DF_ROLE_WEIGHT, .ndim = 2, .shape = DF_SHAPE(H, 2 * H), .trainable = true};
  DF_ASSERT_OK(df_params_add(t.p, &fc, &err), &err);
  for (int64_t i = 0; i < 2; i++) DF_ASSERT_OK(df_moe_params_add(m, H, i, t.p, &err), &err);
  const df_param_spec norm = {.name = "norm.weight", .role = DF_ROLE_NORM, .ndim = 1, .shape = DF_SHAPE(H)};
  DF_ASSERT_OK(df_params_add(t.p, &norm, &err), &err);
  DF_ASSERT_OK(df_params_finalize(t.p, &err), &err);
  t.flat = calloc((size_t)df_params_numel(t.p), sizeof(float));
  cr_assert_not_null(t.flat);
  if (seed) df_test_fill_uniform(t.flat, df_params_numel(t.p), seed, -1.0f, 1.0f);
  // The step counter holds a whole number (int64 in files).
  for (int i = 0; seed && i < df_params_count(t.p); i++)
    if (df_params_at(t.p, i)->dtype == DF_I64) t.flat[df_params_at(t.p, i)->offset] = (float)(1000 + i);
  return t;
}

static void free_table(table *t) {
  df_params_free(t->p);
  free(t->flat);
}

static void tmp_path(char *buf, size_t n, const char *tag) {
  snprintf(buf, n, "/tmp/df_test_layout_%d_%s.safetensors", (int)getpid(), tag);
}

static void save(const df_moe_config *m, const table *t, const char *path) {
  df_error err = {0};
  DF_ASSERT_OK(df_moe_layout_save(m, t->p, t->flat, path, NULL, &err), &err);
}

static df_status load(const df_moe_config *m, table *t, const char *path, bool centering_optional, df_error *err) {
  df_st_model *f = NULL;
  df_status st = df_st_model_open(path, &f, err);
  if (st != DF_OK) return st;
  const df_moe_load_options opt = {.centering_optional = centering_optional};
  st = df_moe_layout_load(m, t->p, t->flat, f, &opt, NULL, err);
  df_st_model_close(f);
  return st;
}

// Every parameter entry equal, bit for bit (padding is zero on both sides).
static void expect_equal_tables(const table *a, const table *b) {
  cr_assert_eq(df_params_numel(a->p), df_params_numel(b->p));
  for (int i = 0; i < df_params_count(a->p); i++) {
    const df_param *e = df_params_at(a->p, i);
    cr_expect_eq(memcmp(a->flat + e->offset, b->flat + e->offset, (size_t)e->numel * sizeof(float)), 0, "%s differs",
                 e->name);
  }
}

static bool has(const df_st_model *f, const char *name) { return df_st_model_find(f, name, NULL) != NULL; }

Test(moe_layout, file_names) {
  char buf[DF_MOE_NAME_MAX];
  const df_moe_layout *q = df_moe_layout_find("qwen"), *d = df_moe_layout_find("deepseek"),
                      *n = df_moe_layout_find("native");
  cr_assert(q && d && n);
  cr_expect_str_eq(df_moe_layout_file_name(q, 4, DF_MOE_T_EXPERTS_W1, 511, buf, sizeof buf),
                   "layers.4.mlp.experts.511.gate_proj.weight");
  cr_expect_str_eq(df_moe_layout_file_name(q, 4, DF_MOE_T_EXPERTS_W3, 0, buf, sizeof buf),
                   "layers.4.mlp.experts.0.up_proj.weight");
  cr_expect_str_eq(df_moe_layout_file_name(q, 4, DF_MOE_T_EXPERTS_W2, 2, buf, sizeof buf),
                   "layers.4.mlp.experts.2.down_proj.weight");
  cr_expect_str_eq(df_moe_layout_file_name(q, 4, DF_MOE_T_SHARED_GATE, 0, buf, sizeof buf),
                   "layers.4.mlp.shared_expert_gate.weight");
  cr_expect_str_eq(df_moe_layout_file_name(q, 4, DF_MOE_T_SHARED_W2, 0, buf, sizeof buf),
                   "layers.4.mlp.shared_expert.down_proj.weight");
  cr_expect_str_eq(df_moe_layout_file_name(q, 0, DF_MOE_T_ROUTER_BIAS, 0, buf, sizeof buf), "layers.0.mlp.gate.bias");
  cr_expect_str_eq(df_moe_layout_file_name(d, 1, DF_MOE_T_EXPERTS_W2, 7, buf, sizeof buf),
                   "layers.1.mlp.experts.7.w2.weight");
  cr_expect_str_eq(df_moe_layout_file_name(d, 1, DF_MOE_T_SELECTION_BIAS, 0, buf, sizeof buf),
                   "layers.1.mlp.gate.bias");
  cr_expect_str_eq(df_moe_layout_file_name(d, 1, DF_MOE_T_SHARED_W1, 0, buf, sizeof buf),
                   "layers.1.mlp.shared_experts.w1.weight");
  cr_expect_str_eq(df_moe_layout_file_name(n, 1, DF_MOE_T_EXPERTS_W1, 7, buf, sizeof buf), "layers.1.mlp.experts.w1");
  cr_expect_str_eq(df_moe_layout_file_name(n, 1, DF_MOE_T_SELECTION_BIAS, 0, buf, sizeof buf),
                   "layers.1.mlp.gate.balance.bias");
  int64_t layer, e;
  df_moe_tensor t;
  cr_expect(df_moe_layout_parse(q, NULL, "layers.12.mlp.experts.99.up_proj.weight", &layer, &t, &e));
  cr_expect(layer == 12 && t == DF_MOE_T_EXPERTS_W3 && e == 99);
  cr_expect_not(
      df_moe_layout_parse(q, NULL, "layers.12.mlp.experts.07.up_proj.weight", &layer, &t, &e)); // not canonical
  cr_expect_not(df_moe_layout_parse(q, NULL, "layers.12.mlp.experts.w3", &layer, &t, &e));
  cr_expect_not(df_moe_layout_parse(q, NULL, "layers.12.mlp.gate_proj.weight", &layer, &t, &e)); // the dense MLP
  cr_expect(df_moe_layout_parse(n, NULL, "layers.2.mlp.experts.w3", &layer, &t, &e));
  cr_expect(t == DF_MOE_T_EXPERTS_W3 && e == -1);
}

// native → layout file → native table, exact, for each layout and both tiny configs; the file holds the
// layout's names and only those.
static void round_trip(const char *config, const char *layout, bool router_bias) {
  df_moe_config m = resolve_file(config, layout, router_bias);
  table a = make_table(&m, 7), b = make_table(&m, 0);
  char path[256];
  tmp_path(path, sizeof path, layout ? layout : "default");
  save(&m, &a, path);
  df_error err = {0};
  DF_ASSERT_OK(load(&m, &b, path, false, &err), &err);
  expect_equal_tables(&a, &b);
  // Count: every expert split where the layout splits, one tensor per other entry.
  df_st_model *f;
  DF_ASSERT_OK(df_st_model_open(path, &f, &err), &err);
  const df_moe_layout *l = df_moe_layout_of(&m);
  int want = 0;
  for (int i = 0; i < df_params_count(a.p); i++) {
    int64_t layer;
    df_moe_tensor t;
    const df_param *e = df_params_at(a.p, i);
    want += df_moe_param_parse(e->name, &layer, &t) && df_moe_layout_splits(l, t) ? (int)e->shape[0] : 1;
    if (!df_moe_param_parse(e->name, &layer, &t)) continue;
    char fname[DF_MOE_NAME_MAX];
    df_moe_layout_file_name(l, layer, t, 0, fname, sizeof fname);
    const df_st_tensor *ft = df_st_model_find(f, fname, NULL);
    cr_expect_not_null(ft, "%s: %s missing", l->name, fname);
    // Buffers stay F32; the step counter is I64.
    if (ft && e->role == DF_ROLE_BUFFER)
      cr_expect_eq(ft->dtype, e->dtype == DF_I64 ? DF_ST_I64 : DF_ST_F32, "%s", fname);
  }
  cr_expect_eq(df_st_model_count(f), want, "%s: %d tensors, want %d", l->name, df_st_model_count(f), want);
  df_st_model_close(f);
  // Saving the reloaded table gives the same bytes (idempotent).
  char path2[256];
  tmp_path(path2, sizeof path2, "again");
  save(&m, &b, path2);
  FILE *x = fopen(path, "rb"), *y = fopen(path2, "rb");
  cr_assert(x && y);
  int cx, cy;
  long pos = 0;
  do {
    cx = fgetc(x), cy = fgetc(y), pos++;
  } while (cx == cy && cx != EOF);
  cr_expect_eq(cx, cy, "%s: files differ at byte %ld", l->name, pos);
  fclose(x), fclose(y);
  unlink(path), unlink(path2);
  free_table(&a), free_table(&b);
}

Test(moe_layout, round_trips_are_exact) {
  round_trip("tiny-dflash-moe.json", NULL, false); // qwen (preset default)
  round_trip("tiny-dflash-moe.json", "native", false);
  round_trip("tiny-dflash-moe.json", "deepseek", true);
  round_trip("tiny-dflash-moe-deepseek.json", NULL, false); // deepseek (preset default)
  round_trip("tiny-dflash-moe-deepseek.json", "native", false);
  round_trip("tiny-dflash-moe-deepseek.json", "qwen", false);
}

// native → qwen → native and native → deepseek → native as files: reading a layout file, then writing it
// natively, gives the native file of the original table.
Test(moe_layout, cross_layout_round_trip) {
  df_moe_config nat = resolve_file("tiny-dflash-moe-deepseek.json", "native", false);
  df_moe_config dsk = resolve_file("tiny-dflash-moe-deepseek.json", "deepseek", false);
  df_moe_config qwn = resolve_file("tiny-dflash-moe-deepseek.json", "qwen", false);
  table a = make_table(&nat, 11), b = make_table(&nat, 0), c = make_table(&nat, 0);
  char pd[256], pq[256];
  tmp_path(pd, sizeof pd, "dsk");
  tmp_path(pq, sizeof pq, "qwn");
  save(&dsk, &a, pd);
  df_error err = {0};
  DF_ASSERT_OK(load(&dsk, &b, pd, false, &err), &err);
  save(&qwn, &b, pq);
  DF_ASSERT_OK(load(&qwn, &c, pq, false, &err), &err);
  expect_equal_tables(&a, &c);
  // A layout file does not load through another layout.
  cr_expect_eq(load(&nat, &b, pq, false, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "experts.0.gate_proj.weight"), "%s", err.msg);
  unlink(pd), unlink(pq);
  free_table(&a), free_table(&b), free_table(&c);
}

// Writes table t through m's layout, dropping the tensors named in drop and adding one extra tensor.
static void save_edited(const df_moe_config *m, const table *t, const char *path, const char *const *drop, int ndrop,
                        const char *extra, int extra_ndim, const int64_t *extra_shape) {
  char full[256];
  tmp_path(full, sizeof full, "full");
  save(m, t, full);
  df_st_model *f;
  df_error err = {0};
  DF_ASSERT_OK(df_st_model_open(full, &f, &err), &err);
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  static float zeros[1 << 16];
  for (int i = 0; i < df_st_model_count(f); i++) {
    const df_st_file *sf;
    const df_st_tensor *ft = df_st_model_at(f, i, &sf);
    bool skip = false;
    for (int k = 0; k < ndrop; k++) skip |= !strcmp(ft->name, drop[k]);
    if (!skip)
      DF_ASSERT_OK(df_st_writer_add(w, ft->name, ft->dtype, ft->ndim, ft->shape, df_st_data(sf, ft), &err), &err);
  }
  if (extra) DF_ASSERT_OK(df_st_writer_add_f32_as(w, extra, DF_ST_F32, extra_ndim, extra_shape, zeros, &err), &err);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  df_st_writer_free(w);
  df_st_model_close(f);
  unlink(full);
}

static void expect_load_error(const df_moe_config *m, const char *path, const char *const *want, int nwant) {
  table t = make_table(m, 0);
  df_error err = {0};
  cr_expect_eq(load(m, &t, path, false, &err), DF_ERR_INVALID);
  for (int k = 0; k < nwant; k++) cr_expect(strstr(err.msg, want[k]), "'%s' not in: %s", want[k], err.msg);
  cr_expect(err.hint[0]);
  for (int64_t i = 0; i < df_params_numel(t.p); i++) cr_assert_eq(t.flat[i], 0.0f, "flat written despite the error");
  free_table(&t);
}

Test(moe_layout, strict_loading_names_the_tensor) {
  df_moe_config m = resolve_file("tiny-dflash-moe-deepseek.json", NULL, false); // E 8, deepseek layout
  table t = make_table(&m, 3);
  char path[256];
  tmp_path(path, sizeof path, "edited");
  // A missing expert.
  save_edited(&m, &t, path, (const char *const[]){"layers.1.mlp.experts.3.w1.weight"}, 1, NULL, 0, NULL);
  expect_load_error(&m, path,
                    (const char *const[]){"missing tensor 'layers.1.mlp.experts.3.w1.weight' (expert 3 of 8)"}, 1);
  // An expert index past n_routed_experts.
  save_edited(&m, &t, path, NULL, 0, "layers.0.mlp.experts.99.w2.weight", 2, DF_SHAPE(H, 32));
  expect_load_error(&m, path,
                    (const char *const[]){"unexpected tensor 'layers.0.mlp.experts.99.w2.weight' (expert 99, but "
                                          "n_routed_experts is 8)"},
                    1);
  // An unexpected tensor, plus a missing one: both listed.
  save_edited(&m, &t, path, (const char *const[]){"layers.0.mlp.gate.weight"}, 1, "layers.0.mlp.foo.weight", 1,
              DF_SHAPE(4));
  expect_load_error(&m, path,
                    (const char *const[]){"2 problems", "unexpected tensor 'layers.0.mlp.foo.weight'",
                                          "missing tensor 'layers.0.mlp.gate.weight'"},
                    3);
  // A native (stacked) name under the deepseek layout.
  save_edited(&m, &t, path, NULL, 0, "layers.0.mlp.experts.w1", 3, DF_SHAPE(8, 32, H));
  expect_load_error(&m, path,
                    (const char *const[]){"unexpected tensor 'layers.0.mlp.experts.w1' (the 'deepseek' layout writes "
                                          "it as 'layers.0.mlp.experts.0.w1.weight')"},
                    1);
  // A wrong expert shape.
  save_edited(&m, &t, path, (const char *const[]){"layers.0.mlp.experts.5.w3.weight"}, 1,
              "layers.0.mlp.experts.5.w3.weight", 2, DF_SHAPE(H, 32));
  expect_load_error(&m, path, (const char *const[]){"shape mismatch 'layers.0.mlp.experts.5.w3.weight'"}, 1);
  // A tensor for a layer the draft does not have.
  save_edited(&m, &t, path, NULL, 0, "layers.2.mlp.gate.weight", 2, DF_SHAPE(8, H));
  expect_load_error(&m, path, (const char *const[]){"unexpected tensor 'layers.2.mlp.gate.weight'"}, 1);
  unlink(path);
  free_table(&t);
}

// A router logit bias in the file (an export folds centering into gate.bias) while the config has none: the
// error names gate.bias and says to set moe_router_bias.
Test(moe_layout, unexpected_router_bias_says_set_moe_router_bias) {
  df_moe_config m = resolve_file("tiny-dflash-moe.json", NULL, false); // qwen layout, sample centering, no bias
  cr_assert_not(m.moe_router_bias);
  table t = make_table(&m, 4);
  char path[256];
  tmp_path(path, sizeof path, "gatebias");
  save_edited(&m, &t, path, NULL, 0, "layers.0.mlp.gate.bias", 1, DF_SHAPE(m.n_routed_experts));
  expect_load_error(
      &m, path,
      (const char *const[]){"unexpected tensor 'layers.0.mlp.gate.bias'", "router logit bias", "moe_router_bias: true"},
      3);
  unlink(path);
  free_table(&t);
}

Test(moe_layout, centering_buffers_optional_on_warm_start_only) {
  df_moe_config m = resolve_file("tiny-dflash-moe.json", NULL, false); // qwen layout, sample centering
  table t = make_table(&m, 5);
  char path[256];
  tmp_path(path, sizeof path, "nocenter");
  save_edited(&m, &t, path,
              (const char *const[]){"layers.0.mlp.gate.input_mean", "layers.0.mlp.gate.input_mean_steps",
                                    "layers.1.mlp.gate.input_mean", "layers.1.mlp.gate.input_mean_steps"},
              4, NULL, 0, NULL);
  // Resume: required.
  expect_load_error(&m, path, (const char *const[]){"missing tensor 'layers.0.mlp.gate.input_mean'"}, 1);
  // Warm start: absent buffers keep their values, everything else loads.
  table w = make_table(&m, 0);
  df_error err = {0};
  DF_ASSERT_OK(load(&m, &w, path, true, &err), &err);
  const df_param *mean = df_params_find(w.p, "layers.0.mlp.gate.input_mean");
  const df_param *gate = df_params_find(w.p, "layers.0.mlp.gate.weight");
  cr_expect_eq(w.flat[mean->offset], 0.0f);
  cr_expect_eq(memcmp(w.flat + gate->offset, t.flat + gate->offset, (size_t)gate->numel * sizeof(float)), 0);
  unlink(path);
  free_table(&t), free_table(&w);
}

Test(moe_layout, gradient_dump_and_bf16_keep_buffers_out_and_fp32) {
  df_moe_config m = resolve_file("tiny-dflash-moe.json", NULL, true); // centering + logit bias
  table t = make_table(&m, 9);
  char path[256];
  tmp_path(path, sizeof path, "grads");
  df_error err = {0};
  df_save_options opt = {.dtype = DF_ST_BF16, .trainable_only = true};
  DF_ASSERT_OK(df_moe_layout_save(&m, t.p, t.flat, path, &opt, &err), &err);
  df_st_model *f;
  DF_ASSERT_OK(df_st_model_open(path, &f, &err), &err);
  cr_expect_not(has(f, "layers.0.mlp.gate.bias"));
  cr_expect_not(has(f, "layers.0.mlp.gate.input_mean"));
  cr_expect_not(has(f, "layers.0.mlp.gate.input_mean_steps"));
  cr_expect(has(f, "layers.0.mlp.experts.3.down_proj.weight"));
  cr_expect(has(f, "layers.1.mlp.shared_expert_gate.weight"));
  df_st_model_close(f);
  opt.trainable_only = false;
  DF_ASSERT_OK(df_moe_layout_save(&m, t.p, t.flat, path, &opt, &err), &err);
  DF_ASSERT_OK(df_st_model_open(path, &f, &err), &err);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.bias", NULL)->dtype, DF_ST_F32);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.input_mean", NULL)->dtype, DF_ST_F32);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.input_mean_steps", NULL)->dtype, DF_ST_I64);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.input_mean_steps", NULL)->ndim, 0);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.weight", NULL)->dtype, DF_ST_BF16);
  df_st_model_close(f);
  unlink(path);
  free_table(&t);
}

Test(moe_layout, dense_drafts_pass_through) {
  table t = {0};
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&t.p, &err), &err);
  const df_param_spec s = {.name = "layers.0.mlp.gate_proj.weight",
                           .role = DF_ROLE_WEIGHT,
                           .ndim = 2,
                           .shape = DF_SHAPE(8, 4),
                           .trainable = true};
  DF_ASSERT_OK(df_params_add(t.p, &s, &err), &err);
  DF_ASSERT_OK(df_params_finalize(t.p, &err), &err);
  t.flat = calloc((size_t)df_params_numel(t.p), sizeof(float));
  df_test_fill_uniform(t.flat, 32, 1, -1, 1);
  char path[256];
  tmp_path(path, sizeof path, "dense");
  DF_ASSERT_OK(df_moe_layout_save(NULL, t.p, t.flat, path, NULL, &err), &err);
  table u = t;
  u.flat = calloc((size_t)df_params_numel(t.p), sizeof(float));
  DF_ASSERT_OK(load(NULL, &u, path, false, &err), &err);
  cr_expect_eq(memcmp(t.flat, u.flat, 32 * sizeof(float)), 0);
  unlink(path);
  free(u.flat);
  free_table(&t);
}

Test(moe_layout, layout_check) {
  df_moe_config m = resolve_file("tiny-dflash-moe-deepseek.json", NULL, false);
  df_error err = {0};
  DF_ASSERT_OK(df_moe_layout_check(df_moe_layout_find("deepseek"), &m, "moe_layout", &err), &err);
  m.moe_router_bias = true; // gate.bias twice
  cr_expect_eq(df_moe_layout_check(df_moe_layout_find("deepseek"), &m, "moe_layout", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "'gate.bias'"), "%s", err.msg);
  DF_ASSERT_OK(df_moe_layout_check(df_moe_layout_find("qwen"), &m, "moe_layout", &err), &err);
}
