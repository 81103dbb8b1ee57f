// safetensors: writer → reader round trips, files written by the reference Python package, every class of
// malformed file (each error names the file and the tensor), sharded checkpoints, the atomic writer.
#define _GNU_SOURCE // nftw
#include <criterion/criterion.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/safetensors.h"
#include "tests/common/fixture.h"

// ---- helpers ------------------------------------------------------------------------------------------

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

static void tmp_dir(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/df_st_test_XXXXXX");
  cr_assert_not_null(mkdtemp(buf));
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static void write_bytes(const char *path, const void *buf, size_t n) {
  FILE *fp = fopen(path, "wb");
  cr_assert_not_null(fp, "cannot write %s", path);
  cr_assert_eq(fwrite(buf, 1, n, fp), n);
  fclose(fp);
}

static int count_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// 8-byte length + header + data; hlen overrides the stored length when non-zero.
static size_t build_file(unsigned char *out, const char *header, const void *data, size_t ndata, uint64_t hlen) {
  size_t h = strlen(header);
  uint64_t n = hlen ? hlen : h;
  memcpy(out, &n, 8);
  memcpy(out + 8, header, h);
  if (ndata) memcpy(out + 8 + h, data, ndata);
  return 8 + h + ndata;
}

// Writes the bytes to a file and opens it; expects status want and an error naming the file and tensor.
static df_error expect_bad(const char *header, size_t ndata, uint64_t hlen, df_status want, const char *tensor) {
  unsigned char buf[4096], data[512];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;
  size_t n = build_file(buf, header, data, ndata, hlen);
  char dir[64], path[128];
  tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/bad.safetensors", dir);
  write_bytes(path, buf, n);
  df_st_file *f = (df_st_file *)1;
  df_error err = {0};
  df_status st = df_st_open(path, &f, &err);
  cr_expect_eq(st, want, "status %s, want %s: %s", df_status_name(st), df_status_name(want), err.msg);
  if (want == DF_OK) {
    df_st_close(st == DF_OK ? f : NULL);
    rm_tree(dir);
    return err;
  }
  cr_expect_null(f, "no file handed out on error");
  cr_expect(strstr(err.where, path) != NULL, "where '%s' names the file", err.where);
  if (tensor)
    cr_expect(strstr(err.where, tensor) && strstr(err.msg, tensor), "where '%s' / msg '%s' name tensor '%s'", err.where,
              err.msg, tensor);
  cr_expect(err.hint[0] != 0, "a hint is given");
  // The in-memory entry point gives the same verdict.
  df_error err2 = {0};
  cr_expect_eq(df_st_open_memory(buf, n, "mem.safetensors", &f, &err2), want, "memory: %s", err2.msg);
  cr_expect_null(f);
  cr_expect(strstr(err2.where, "mem.safetensors") != NULL);
  rm_tree(dir);
  return err;
}

static bool same_bits_or_nan(float a, float b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, 4); }

// ---- round trips --------------------------------------------------------------------------------------

Test(safetensors, roundtrip_every_dtype_bitwise) {
  char dir[64], path[128];
  tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/rt.safetensors", dir);
  df_error err = {0};
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  unsigned char bytes[DF_ST_NUM_DTYPES][3 * 5 * 8];
  const int64_t shape[3] = {3, 5, 1};
  for (int d = 0; d < DF_ST_NUM_DTYPES; d++) {
    for (size_t i = 0; i < sizeof bytes[d]; i++) bytes[d][i] = (unsigned char)(i * 37 + d * 11 + 1);
    if (d == DF_ST_BOOL)
      for (size_t i = 0; i < sizeof bytes[d]; i++) bytes[d][i] &= 1;
    char name[32];
    snprintf(name, sizeof name, "t.%s", df_st_dtype_name((df_st_dtype)d));
    DF_ASSERT_OK(df_st_writer_add(w, name, (df_st_dtype)d, 1 + d % 3, shape, bytes[d], &err), &err);
  }
  float scalar = 2.5f;
  DF_ASSERT_OK(df_st_writer_add(w, "scalar", DF_ST_F32, 0, NULL, &scalar, &err), &err);
  DF_ASSERT_OK(df_st_writer_add(w, "empty", DF_ST_BF16, 2, (int64_t[]){0, 7}, NULL, &err), &err);
  DF_ASSERT_OK(df_st_writer_set_metadata(w, "format", "pt", &err), &err);
  DF_ASSERT_OK(df_st_writer_set_metadata(w, "note", "ünïcode ✓", &err), &err);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  df_st_writer_free(w);

  df_st_file *f;
  DF_ASSERT_OK(df_st_open(path, &f, &err), &err);
  cr_assert_eq(df_st_count(f), DF_ST_NUM_DTYPES + 2);
  for (int d = 0; d < DF_ST_NUM_DTYPES; d++) {
    char name[32];
    snprintf(name, sizeof name, "t.%s", df_st_dtype_name((df_st_dtype)d));
    const df_st_tensor *t = df_st_find(f, name);
    cr_assert_not_null(t, "%s present", name);
    cr_expect_eq(t->dtype, (df_st_dtype)d);
    cr_expect_eq(t->ndim, 1 + d % 3);
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
      cr_expect_eq(t->shape[i], shape[i]);
      numel *= shape[i];
    }
    cr_expect_eq(t->numel, numel);
    size_t nb = (size_t)numel * df_st_dtype_size((df_st_dtype)d);
    cr_expect_eq(memcmp(df_st_data(f, t), bytes[d], nb), 0, "%s bytes round-trip", name);
    cr_expect_eq(t->begin % df_st_dtype_size(t->dtype), 0, "%s naturally aligned", name);
    cr_expect_eq((uintptr_t)df_st_data(f, t) % df_st_dtype_size(t->dtype), 0, "%s aligned in memory", name);
  }
  const df_st_tensor *s = df_st_find(f, "scalar"), *e = df_st_find(f, "empty");
  cr_assert(s && e);
  cr_expect_eq(s->ndim, 0);
  float got;
  DF_ASSERT_OK(df_st_read_f32(f, s, &got, 1, &err), &err);
  cr_expect_eq(got, 2.5f);
  cr_expect_eq(e->numel, 0);
  cr_expect_eq(e->shape[1], 7);
  cr_expect_str_eq(df_st_metadata_get(f, "note"), "ünïcode ✓");
  cr_expect_str_eq(df_st_metadata_get(f, "format"), "pt");
  cr_expect_null(df_st_metadata_get(f, "absent"));
  cr_expect_null(df_st_find(f, "absent"));
  cr_expect_null(df_st_at(f, df_st_count(f)));
  for (int i = 1; i < df_st_count(f); i++) cr_expect_leq(df_st_at(f, i - 1)->end, df_st_at(f, i)->begin);
  df_st_close(f);
  rm_tree(dir);
}

Test(safetensors, writer_converts_f32_to_bf16_f16_rne) {
  char dir[64], path[128];
  tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/conv.safetensors", dir);
  float src[64];
  df_test_fill_uniform(src, 64, 7, -100, 100);
  src[0] = NAN, src[1] = INFINITY, src[2] = 1e-9f, src[3] = 70000.0f;
  df_error err = {0};
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  DF_ASSERT_OK(df_st_writer_add_f32_as(w, "b", DF_ST_BF16, 2, (int64_t[]){8, 8}, src, &err), &err);
  DF_ASSERT_OK(df_st_writer_add_f32_as(w, "h", DF_ST_F16, 1, (int64_t[]){64}, src, &err), &err);
  DF_ASSERT_OK(df_st_writer_add_f32_as(w, "f", DF_ST_F32, 1, (int64_t[]){64}, src, &err), &err);
  cr_expect_eq(df_st_writer_add_f32_as(w, "i", DF_ST_I32, 1, (int64_t[]){64}, src, &err), DF_ERR_INVALID);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  df_st_writer_free(w);
  df_st_file *f;
  DF_ASSERT_OK(df_st_open(path, &f, &err), &err);
  const uint16_t *b = df_st_data(f, df_st_find(f, "b")), *h = df_st_data(f, df_st_find(f, "h"));
  float back[64];
  DF_ASSERT_OK(df_st_read_f32(f, df_st_find(f, "f"), back, 64, &err), &err);
  for (int i = 0; i < 64; i++) {
    cr_expect_eq(b[i], df_st_f32_to_bf16(src[i]), "bf16[%d]", i);
    cr_expect_eq(h[i], df_st_f32_to_f16(src[i]), "f16[%d]", i);
    cr_expect(same_bits_or_nan(back[i], src[i]));
  }
  cr_expect_eq(h[3], 0x7C00, "70000 overflows f16 to +inf");
  df_st_close(f);
  rm_tree(dir);
}

// ---- files written by the reference implementation -------------------------------------------------------

Test(safetensors, reads_python_safetensors_file) {
  df_error err = {0};
  df_st_file *f, *want;
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/hf_dtypes.safetensors", &f, &err), &err);
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/hf_dtypes_expected.safetensors", &want, &err), &err);
  cr_expect_str_eq(df_st_metadata_get(f, "producer"), "make_safetensors_fixtures.py");
  static const struct {
    const char *name;
    df_st_dtype dt;
  } dts[] = {{"f32", DF_ST_F32}, {"f16", DF_ST_F16}, {"bf16", DF_ST_BF16}, {"f64", DF_ST_F64},
             {"i64", DF_ST_I64}, {"i32", DF_ST_I32}, {"u8", DF_ST_U8},     {"bool", DF_ST_BOOL}};
  for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
    const df_st_tensor *t = df_st_find(f, dts[i].name);
    cr_assert_not_null(t, "%s present", dts[i].name);
    cr_expect_eq(t->dtype, dts[i].dt, "%s dtype", dts[i].name);
  }
  cr_assert_eq(df_st_count(f), df_st_count(want));
  for (int i = 0; i < df_st_count(want); i++) {
    const df_st_tensor *e = df_st_at(want, i), *t = df_st_find(f, e->name);
    cr_assert_not_null(t, "%s present", e->name);
    cr_assert_eq(t->numel, e->numel, "%s numel", e->name);
    cr_assert_eq(t->ndim, e->ndim);
    float *got = malloc(sizeof(float) * (size_t)(t->numel + 1)), *ref = malloc(sizeof(float) * (size_t)(t->numel + 1));
    DF_ASSERT_OK(df_st_read_f32(f, t, got, t->numel, &err), &err);
    DF_ASSERT_OK(df_st_read_f32(want, e, ref, e->numel, &err), &err);
    // Conversions to fp32 are exact (or round like torch does): compare bits, NaN with NaN.
    for (int64_t k = 0; k < t->numel; k++)
      cr_expect(same_bits_or_nan(got[k], ref[k]), "%s[%lld]: got %.9g want %.9g", e->name, (long long)k, got[k],
                ref[k]);
    free(got), free(ref);
  }
  // File order is the data order; the Python writer puts 8-byte dtypes first.
  cr_expect_eq(df_st_at(f, 0)->begin, 0);
  cr_expect_eq(df_st_dtype_size(df_st_at(f, 0)->dtype), 8);
  df_st_close(f);
  df_st_close(want);
}

Test(safetensors, f32_to_bf16_and_f16_match_torch) {
  df_error err = {0};
  df_st_file *f;
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/rounding.safetensors", &f, &err), &err);
  const df_st_tensor *s = df_st_find(f, "src"), *b = df_st_find(f, "bf16"), *h = df_st_find(f, "f16");
  cr_assert(s && b && h && b->dtype == DF_ST_BF16 && h->dtype == DF_ST_F16);
  float *src = malloc(sizeof(float) * (size_t)s->numel);
  DF_ASSERT_OK(df_st_read_f32(f, s, src, s->numel, &err), &err);
  const unsigned char *bb = df_st_data(f, b), *hb = df_st_data(f, h);
  for (int64_t i = 0; i < s->numel; i++) {
    uint16_t wb, wh;
    memcpy(&wb, bb + 2 * i, 2);
    memcpy(&wh, hb + 2 * i, 2);
    if (isnan(src[i])) {
      cr_expect(isnan(df_st_bf16_to_f32(df_st_f32_to_bf16(src[i]))));
      cr_expect(isnan(df_st_f16_to_f32(df_st_f32_to_f16(src[i]))));
      continue;
    }
    cr_expect_eq(df_st_f32_to_bf16(src[i]), wb, "bf16(%.9g): got %04x want %04x", src[i], df_st_f32_to_bf16(src[i]),
                 wb);
    cr_expect_eq(df_st_f32_to_f16(src[i]), wh, "f16(%.9g): got %04x want %04x", src[i], df_st_f32_to_f16(src[i]), wh);
  }
  free(src);
  df_st_close(f);
}

Test(safetensors, f8_and_integer_conversions) {
  const uint8_t e4m3[] = {0x38, 0x7F, 0x80, 0x01, 0x7E, 0xC0};
  const float w4[] = {1.0f, NAN, -0.0f, 0x1p-9f, 448.0f, -2.0f};
  const uint8_t e5m2[] = {0x3C, 0x7C, 0xFC, 0x01, 0x7B};
  const float w5[] = {1.0f, INFINITY, -INFINITY, 0x1p-16f, 57344.0f};
  const uint8_t e8m0[] = {127, 0xFF, 0, 130};
  const float w8[] = {1.0f, NAN, 0x1p-127f, 8.0f};
  const int8_t i8[] = {-128, 127};
  const uint64_t u64[] = {0, 1ull << 63};
  float got[8];
  df_st_convert_to_f32(DF_ST_F8_E4M3, e4m3, got, 6);
  for (int i = 0; i < 6; i++) cr_expect(same_bits_or_nan(got[i], w4[i]), "e4m3[%d] = %g", i, got[i]);
  df_st_convert_to_f32(DF_ST_F8_E5M2, e5m2, got, 5);
  for (int i = 0; i < 5; i++) cr_expect(same_bits_or_nan(got[i], w5[i]), "e5m2[%d] = %g", i, got[i]);
  df_st_convert_to_f32(DF_ST_F8_E8M0, e8m0, got, 4);
  for (int i = 0; i < 4; i++) cr_expect(same_bits_or_nan(got[i], w8[i]), "e8m0[%d] = %g", i, got[i]);
  df_st_convert_to_f32(DF_ST_I8, i8, got, 2);
  cr_expect(got[0] == -128.0f && got[1] == 127.0f);
  df_st_convert_to_f32(DF_ST_U64, u64, got, 2);
  cr_expect(got[0] == 0.0f && got[1] == 0x1p63f);
}

// ---- malformed files: one test per class ------------------------------------------------------------------

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

Test(safetensors_bad, shorter_than_8_bytes) {
  char dir[64], path[128];
  tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/tiny.safetensors", dir);
  write_bytes(path, "abc", 3);
  df_st_file *f;
  df_error err = {0};
  cr_expect_eq(df_st_open(path, &f, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, path) && strstr(err.msg, "shorter than"), "%s / %s", err.where, err.msg);
  write_bytes(path, "", 0);
  cr_expect_eq(df_st_open(path, &f, &err), DF_ERR_FORMAT);
  rm_tree(dir);
}

Test(safetensors_bad, truncated_data) {
  // A valid header whose data region was cut short: tensor 'b' points past the end.
  df_error e = expect_bad("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 12, 0,
                          DF_ERR_FORMAT, "b");
  cr_expect(strstr(e.msg, "outside the data region") != NULL, "%s", e.msg);
}

Test(safetensors_bad, header_length_beyond_file) {
  df_error e = expect_bad("{" T_A "}", 8, 5000, DF_ERR_FORMAT, NULL);
  cr_expect(strstr(e.msg, "beyond the end") != NULL, "%s", e.msg);
  e = expect_bad("{" T_A "}", 8, 200000000, DF_ERR_FORMAT, NULL);
  cr_expect(strstr(e.msg, "100 MB") != NULL, "%s", e.msg);
  e = expect_bad("{" T_A "}", 8, UINT64_MAX, DF_ERR_FORMAT, NULL);
}

Test(safetensors_bad, bad_json_reports_line_and_column) {
  df_error e = expect_bad("{\n  \"a\": {\"dtype\": \"F32\",,\n}}", 0, 0, DF_ERR_FORMAT, NULL);
  cr_expect(strstr(e.msg, "line 2, column") != NULL, "%s", e.msg);
  e = expect_bad("[1, 2]", 0, 0, DF_ERR_FORMAT, NULL);
  e = expect_bad("{\"a\":\xff}", 0, 0, DF_ERR_FORMAT, NULL); // not UTF-8
  cr_expect(strstr(e.msg, "line 1") != NULL, "%s", e.msg);
  e = expect_bad("{}x", 0, 0, DF_ERR_FORMAT, NULL); // trailing garbage
  e = expect_bad("{\"a\\u0000b\":{}}", 0, 0, DF_ERR_FORMAT, NULL);
  e = expect_bad("{}", 0, 0, DF_OK, NULL); // empty but valid
}

Test(safetensors_bad, unknown_dtype) {
  df_error e = expect_bad("{\"w\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  cr_expect(strstr(e.msg, "F17") != NULL, "%s", e.msg);
  expect_bad("{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, 0, DF_ERR_UNSUPPORTED, "w");
}

Test(safetensors_bad, size_mismatch) {
  df_error e = expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  cr_expect(strstr(e.msg, "12 bytes") != NULL, "%s", e.msg);
  expect_bad("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", 4, 0, DF_ERR_FORMAT, "w");
}

Test(safetensors_bad, offsets_outside_data) {
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", 8, 0, DF_ERR_FORMAT, "w");
}

Test(safetensors_bad, overlapping_tensors) {
  df_error e =
      expect_bad("{" T_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, DF_ERR_FORMAT, "b");
  cr_expect(strstr(e.msg, "overlaps") && strstr(e.msg, "'a'"), "%s", e.msg);
}

Test(safetensors_bad, gap_and_trailing_bytes) {
  // HF rejects holes in the data region (InvalidOffset) and bytes after the last tensor.
  df_error e = expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  cr_expect(strstr(e.msg, "gap") != NULL, "%s", e.msg);
  e = expect_bad("{" T_A "}", 12, 0, DF_ERR_FORMAT, "a");
  cr_expect(strstr(e.msg, "cover only 8") != NULL, "%s", e.msg);
}

Test(safetensors_bad, duplicate_names) {
  df_error e = expect_bad("{" T_A "," T_A "}", 8, 0, DF_ERR_FORMAT, "a");
  cr_expect(strstr(e.msg, "duplicate") && strstr(e.msg, "line 1"), "%s", e.msg);
}

Test(safetensors_bad, missing_and_unknown_fields) {
  df_error e = expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, 0, DF_ERR_FORMAT, "w");
  cr_expect(strstr(e.msg, "data_offsets") != NULL, "%s", e.msg);
  expect_bad("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  e = expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8, 0, DF_ERR_FORMAT,
                 "w");
  cr_expect(strstr(e.msg, "extra") != NULL, "%s", e.msg);
  expect_bad("{\"w\":[1,2]}", 0, 0, DF_ERR_FORMAT, "w");
}

Test(safetensors_bad, negative_or_bad_shape) {
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, 0, DF_ERR_FORMAT, "w");
  df_error e = expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}", 8, 0,
                          DF_ERR_FORMAT, "w");
  cr_expect(strstr(e.msg, "overflow") != NULL, "%s", e.msg);
  expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, 0,
             DF_ERR_UNSUPPORTED, "w");
}

Test(safetensors_bad, bad_metadata) {
  expect_bad("{\"__metadata__\":{\"k\":1}," T_A "}", 8, 0, DF_ERR_FORMAT, "__metadata__");
  expect_bad("{\"__metadata__\":[]," T_A "}", 8, 0, DF_ERR_FORMAT, "__metadata__");
  expect_bad("{\"__metadata__\":null," T_A "}", 8, 0, DF_OK, NULL);
}

Test(safetensors_bad, not_a_file) {
  df_st_file *f;
  df_error err = {0};
  cr_expect_eq(df_st_open("/nonexistent/x.safetensors", &f, &err), DF_ERR_IO);
  cr_expect(strstr(err.where, "/nonexistent/x.safetensors") != NULL);
  cr_expect_eq(df_st_open("/tmp", &f, &err), DF_ERR_IO);
}

Test(safetensors, read_checks_destination_size) {
  unsigned char buf[256];
  float data[2] = {1, 2}, out[3];
  size_t n = build_file(buf, "{" T_A "}", data, 8, 0);
  df_st_file *f;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open_memory(buf, n, "m.safetensors", &f, &err), &err);
  cr_expect_eq(df_st_read_f32(f, df_st_find(f, "a"), out, 3, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "m.safetensors: a") != NULL, "%s", err.where);
  cr_expect_eq(df_st_read_raw(f, df_st_find(f, "a"), out, 4, &err), DF_ERR_INVALID);
  DF_ASSERT_OK(df_st_read_raw(f, df_st_find(f, "a"), out, 8, &err), &err);
  cr_expect(out[0] == 1 && out[1] == 2);
  df_st_close(f);
}

// ---- sharded checkpoints ----------------------------------------------------------------------------------

static void copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb");
  cr_assert_not_null(a, "%s", from);
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf, a);
  fclose(a);
  write_bytes(to, buf, n);
}

#define SHARD_DIR DF_FIXTURE_DIR "/safetensors/sharded"
#define SHARD1    "model-00001-of-00002.safetensors"
#define SHARD2    "model-00002-of-00002.safetensors"

Test(safetensors_sharded, opens_index_and_resolves_names) {
  df_error err = {0};
  df_st_model *m;
  DF_ASSERT_OK(df_st_model_open(SHARD_DIR, &m, &err), &err);
  df_st_file *want;
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/sharded_expected.safetensors", &want, &err), &err);
  cr_expect_eq(df_st_model_num_shards(m), 2);
  cr_assert_eq(df_st_model_count(m), 4);
  for (int i = 0; i < df_st_count(want); i++) {
    const df_st_tensor *e = df_st_at(want, i);
    const df_st_file *f = NULL;
    const df_st_tensor *t = df_st_model_find(m, e->name, &f);
    cr_assert_not_null(t, "%s resolved", e->name);
    float got[64], ref[64];
    DF_ASSERT_OK(df_st_read_f32(f, t, got, t->numel, &err), &err);
    DF_ASSERT_OK(df_st_read_f32(want, e, ref, e->numel, &err), &err);
    df_expect_close_elementwise(e->name, got, ref, t->numel, 0, 0);
  }
  const df_st_file *f = NULL;
  cr_expect_not_null(df_st_model_find(m, "lm_head.weight", &f));
  cr_expect(f && strstr(df_st_path(f), SHARD2) != NULL);
  cr_expect_null(df_st_model_find(m, "absent", NULL));
  df_st_model_close(m);
  // The index path and a single shard open the same way.
  DF_ASSERT_OK(df_st_model_open(SHARD_DIR "/" DF_ST_INDEX_NAME, &m, &err), &err);
  cr_expect_eq(df_st_model_count(m), 4);
  df_st_model_close(m);
  DF_ASSERT_OK(df_st_model_open(SHARD_DIR "/" SHARD1, &m, &err), &err);
  cr_expect_eq(df_st_model_count(m), 2);
  df_st_model_close(m);
  df_st_close(want);
}

Test(safetensors_sharded, missing_shard_file) {
  char dir[64], p[256];
  tmp_dir(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/" DF_ST_INDEX_NAME, dir);
  copy_file(SHARD_DIR "/" DF_ST_INDEX_NAME, p);
  snprintf(p, sizeof p, "%s/" SHARD1, dir);
  copy_file(SHARD_DIR "/" SHARD1, p);
  df_st_model *m;
  df_error err = {0};
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, SHARD2) && strstr(err.where, DF_ST_INDEX_NAME), "%s [%s]", err.msg, err.where);
  cr_expect(strstr(err.where, "lm_head.weight") != NULL, "names a tensor of the shard: %s", err.where);
  rm_tree(dir);
}

static void write_index(const char *dir, const char *json) {
  char p[256];
  snprintf(p, sizeof p, "%s/" DF_ST_INDEX_NAME, dir);
  write_bytes(p, json, strlen(json));
  snprintf(p, sizeof p, "%s/" SHARD1, dir);
  copy_file(SHARD_DIR "/" SHARD1, p);
}

Test(safetensors_sharded, tensor_missing_in_shard) {
  char dir[64];
  tmp_dir(dir, sizeof dir);
  write_index(dir,
              "{\"weight_map\":{\"model.embed_tokens.weight\":\"" SHARD1 "\",\"model.layers.0.mlp.up_proj.weight\":"
              "\"" SHARD1 "\",\"ghost.weight\":\"" SHARD1 "\"}}");
  df_st_model *m;
  df_error err = {0};
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "ghost.weight") && strstr(err.where, SHARD1), "%s", err.where);
  rm_tree(dir);
}

Test(safetensors_sharded, shard_tensor_not_indexed) {
  char dir[64];
  tmp_dir(dir, sizeof dir);
  write_index(dir, "{\"weight_map\":{\"model.embed_tokens.weight\":\"" SHARD1 "\"}}");
  df_st_model *m;
  df_error err = {0};
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "model.layers.0.mlp.up_proj.weight") != NULL, "%s", err.where);
  rm_tree(dir);
}

Test(safetensors_sharded, bad_index_documents) {
  char dir[64];
  tmp_dir(dir, sizeof dir);
  df_st_model *m;
  df_error err = {0};
  write_index(dir, "{\"weight_map\":\n{\"a\": }}");
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "line 2") != NULL, "%s", err.msg);
  write_index(dir, "{\"weight_map\":{\"a\":\"../etc/passwd\"}}");
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "a") != NULL);
  write_index(dir, "{\"weight_map\":[]}");
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  write_index(dir, "{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}");
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_FORMAT);
  rm_tree(dir);
  tmp_dir(dir, sizeof dir); // neither file
  cr_expect_eq(df_st_model_open(dir, &m, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, DF_ST_SINGLE_NAME) != NULL, "%s", err.msg);
  rm_tree(dir);
}

// ---- the atomic writer and the inspector ---------------------------------------------------------------

Test(safetensors, atomic_writer_leaves_no_temp_file) {
  char dir[64], path[128];
  tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  float a[4] = {1, 2, 3, 4};
  df_error err = {0};
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  DF_ASSERT_OK(df_st_writer_add(w, "a", DF_ST_F32, 1, (int64_t[]){4}, a, &err), &err);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err); // replaces the file in place
  cr_expect_eq(count_dir_entries(dir), 1, "only the final file remains");
  // A failing write (duplicate names) leaves the old file intact and no temporary.
  DF_ASSERT_OK(df_st_writer_add(w, "a", DF_ST_F32, 1, (int64_t[]){4}, a, &err), &err);
  cr_expect_eq(df_st_writer_write(w, path, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "a") != NULL);
  cr_expect_eq(count_dir_entries(dir), 1);
  df_st_writer_free(w);
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  char bad[160];
  snprintf(bad, sizeof bad, "%s/missing/x.safetensors", dir);
  cr_expect_eq(df_st_writer_write(w, bad, &err), DF_ERR_IO);
  df_st_writer_free(w);
  df_st_file *f;
  DF_ASSERT_OK(df_st_open(path, &f, &err), &err);
  cr_expect_eq(df_st_count(f), 1);
  df_st_close(f);
  rm_tree(dir);
}

Test(safetensors, writer_rejects_bad_arguments) {
  df_error err = {0};
  df_st_writer *w;
  float x = 0;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  cr_expect_eq(df_st_writer_add(w, "", DF_ST_F32, 0, NULL, &x, &err), DF_ERR_INVALID);
  cr_expect_eq(df_st_writer_add(w, "__metadata__", DF_ST_F32, 0, NULL, &x, &err), DF_ERR_INVALID);
  cr_expect_eq(df_st_writer_add(w, "n", DF_ST_F32, 1, (int64_t[]){-1}, &x, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "n");
  cr_expect_eq(df_st_writer_add(w, "z", DF_ST_F32, 1, (int64_t[]){3}, NULL, &err), DF_ERR_INVALID);
  cr_expect_eq(df_st_writer_add(w, "bad\xff", DF_ST_F32, 0, NULL, &x, &err), DF_ERR_INVALID);
  cr_expect_eq(df_st_writer_set_metadata(w, "k\xfe", "v", &err), DF_ERR_INVALID);
  df_st_writer_free(w);
}

Test(safetensors, print_lists_tensors) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  df_error err = {0};
  DF_ASSERT_OK(df_st_print(SHARD_DIR, out, &err), &err);
  fclose(out);
  cr_expect(strstr(text, "4 tensors in 2 file(s)") != NULL, "%s", text);
  cr_expect(strstr(text, "model.embed_tokens.weight") && strstr(text, "BF16") && strstr(text, "[6, 4]"), "%s", text);
  cr_expect(strstr(text, "metadata format = pt") != NULL, "%s", text);
  free(text);
  cr_expect_eq(df_st_print("/nonexistent", stdout, &err), DF_ERR_IO);
}

Test(safetensors, memory_file_wraps_as_model) {
  unsigned char buf[256];
  float data[2] = {1, 2};
  size_t n = build_file(buf, "{\"__metadata__\":{\"format\":\"pt\"}," T_A "}", data, 8, 0);
  df_st_file *f;
  df_st_model *m;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open_memory(buf, n, "m.safetensors", &f, &err), &err);
  cr_expect_eq(df_st_metadata_count(f), 1);
  const char *k, *v;
  df_st_metadata_at(f, 0, &k, &v);
  cr_expect(!strcmp(k, "format") && !strcmp(v, "pt"));
  DF_ASSERT_OK(df_st_model_wrap(f, &m, &err), &err);
  const df_st_file *owner = NULL;
  cr_expect_not_null(df_st_model_find(m, "a", &owner));
  cr_expect_eq(owner, f);
  cr_expect_str_eq(df_st_model_path(m), "m.safetensors");
  df_st_model_close(m); // closes f too
}
