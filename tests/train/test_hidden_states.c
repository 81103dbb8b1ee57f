// Hidden-state shards: writer → reader round trips (bf16, f32, gzip), multi-shard directories, truncation,
// random access, draft-config checks, one test per class of bad shard, and an h5py-written fixture.
#include <criterion/criterion.h>
#include <dirent.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/data/hs.h"

// ---- scratch directories and sample content ---------------------------------------------------------------

static void tmpdir_make(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/df_hs_test_XXXXXX");
  cr_assert_not_null(mkdtemp(buf), "mkdtemp");
}

// Removes a scratch directory and what the tests put in it (files only, one level).
static void tmpdir_remove(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      remove(p);
    }
  closedir(d);
  rmdir(dir);
}

enum { K = 2, H = 3, W = K * H };
static const int LAYER_IDS[K] = {1, 4};

// Sample content is a function of (seed, row) so a test can recognise which sample it read.
typedef struct {
  int64_t len;
  int32_t *ids;
  uint8_t *mask;
  float *hidden, *last;
} sample;

static sample sample_make(uint64_t seed, int64_t len) {
  sample s = {len, malloc((size_t)len * 4), malloc((size_t)len), malloc((size_t)(len * W) * 4),
              malloc((size_t)(len * H) * 4)};
  for (int64_t r = 0; r < len; r++) {
    s.ids[r] = (int32_t)(seed * 1000 + (uint64_t)r);
    s.mask[r] = (uint8_t)(r % 3 != 0);
  }
  df_test_fill_uniform(s.hidden, len * W, seed, -4.0f, 4.0f);
  df_test_fill_uniform(s.last, len * H, seed + 7777, -2.0f, 2.0f);
  return s;
}

static void sample_free(sample *s) { free(s->ids), free(s->mask), free(s->hidden), free(s->last); }

// bf16 rounding computed independently of the writer: pick the nearer of the two bf16 neighbours in double,
// ties to the even mantissa.
static float ref_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u; // hi is one bf16 ulp further from zero
  float flo, fhi;
  memcpy(&flo, &lo, 4);
  memcpy(&fhi, &hi, 4);
  double dlo = fabs((double)x - flo), dhi = fabs((double)fhi - x);
  if (dlo < dhi) return flo;
  if (dhi < dlo) return fhi;
  return ((lo >> 16) & 1u) ? fhi : flo;
}

static df_hs_writer_options opts(df_dtype dt, bool last) {
  return (df_hs_writer_options){
      .hidden_size = H, .num_layers = K, .target_layer_ids = LAYER_IDS, .dtype = dt, .has_last_hidden = last};
}

// Writes samples seed0, seed0+1, ... with the given lengths.
static void write_shard_opts(const char *path, const df_hs_writer_options *o, uint64_t seed0, const int64_t *lens,
                             int n) {
  df_error err = {0};
  df_hs_writer *w;
  DF_ASSERT_OK(df_hs_writer_create(path, o, &w, &err), &err);
  for (int i = 0; i < n; i++) {
    sample s = sample_make(seed0 + (uint64_t)i, lens[i]);
    DF_ASSERT_OK(df_hs_writer_append(w, s.len, s.ids, s.mask, s.hidden, o->has_last_hidden ? s.last : NULL, &err),
                 &err);
    sample_free(&s);
  }
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
}

static void write_shard(const char *path, df_dtype dt, bool last, uint64_t seed0, const int64_t *lens, int n) {
  df_hs_writer_options o = opts(dt, last);
  write_shard_opts(path, &o, seed0, lens, n);
}

// Reads sample i (truncated to max_len) and checks it against sample seed, first `want_len` rows.
static void expect_sample(df_hs_dataset *ds, int64_t i, int64_t max_len, uint64_t seed, int64_t full_len,
                          int64_t want_len) {
  const df_hs_info *in = df_hs_get_info(ds);
  sample s = sample_make(seed, full_len);
  int64_t cap = full_len + 2; // two sentinel rows past the end catch over-long reads
  int32_t *ids = malloc((size_t)cap * 4);
  uint8_t *mask = malloc((size_t)cap);
  float *hid = malloc((size_t)(cap * W) * 4), *last = malloc((size_t)(cap * H) * 4);
  for (int64_t j = 0; j < cap * W; j++) hid[j] = -999.0f;
  for (int64_t j = 0; j < cap; j++) ids[j] = -1;
  df_hs_sample_bufs b = {ids, mask, hid, in->has_last_hidden ? last : NULL};
  df_error err = {0};
  int64_t got = -1;
  DF_ASSERT_OK(df_hs_read_sample(ds, i, max_len, &b, &got, &err), &err);
  cr_assert_eq(got, want_len, "sample %lld: %lld rows, want %lld", (long long)i, (long long)got, (long long)want_len);
  for (int64_t r = 0; r < want_len; r++) {
    cr_expect_eq(ids[r], s.ids[r], "sample %lld input_ids[%lld]", (long long)i, (long long)r);
    cr_expect_eq(mask[r], s.mask[r], "sample %lld loss_mask[%lld]", (long long)i, (long long)r);
  }
  cr_expect_eq(ids[want_len], -1, "no row past the truncation is written");
  cr_expect_eq(hid[want_len * W], -999.0f, "no hidden row past the truncation is written");
  for (int64_t j = 0; j < want_len * W; j++) {
    float want = in->dtype == DF_BF16 ? ref_bf16(s.hidden[j]) : s.hidden[j];
    cr_expect_eq(hid[j], want, "sample %lld hidden[%lld]: got %.9g want %.9g", (long long)i, (long long)j, hid[j],
                 want);
  }
  if (in->has_last_hidden)
    for (int64_t j = 0; j < want_len * H; j++) {
      float want = in->dtype == DF_BF16 ? ref_bf16(s.last[j]) : s.last[j];
      cr_expect_eq(last[j], want, "sample %lld last_hidden[%lld]", (long long)i, (long long)j);
    }
  free(ids), free(mask), free(hid), free(last);
  sample_free(&s);
}

// ---- conversions -------------------------------------------------------------------------------------------

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

Test(hidden_states, bf16_round_to_nearest_even) {
  cr_expect_eq(df_hs_f32_to_bf16(1.0f), 0x3F80);
  cr_expect_eq(df_hs_f32_to_bf16(f_of(0x3F808000u)), 0x3F80, "tie, even below: stays");
  cr_expect_eq(df_hs_f32_to_bf16(f_of(0x3F818000u)), 0x3F82, "tie, odd below: rounds up to even");
  cr_expect_eq(df_hs_f32_to_bf16(f_of(0x3F808001u)), 0x3F81, "just above the tie: up");
  cr_expect_eq(df_hs_f32_to_bf16(f_of(0xBF807FFFu)), 0xBF80, "negative, below the tie: down in magnitude");
  cr_expect_eq(df_hs_f32_to_bf16(INFINITY), 0x7F80);
  cr_expect(isnan(df_hs_bf16_to_f32(df_hs_f32_to_bf16(NAN))), "NaN stays NaN");
  cr_expect_eq(df_hs_bf16_to_f32(0xC040), -3.0f);
  float x[4096];
  df_test_fill_uniform(x, 4096, 99, -1e4f, 1e4f);
  for (int i = 0; i < 4096; i++)
    cr_expect_eq(df_hs_bf16_to_f32(df_hs_f32_to_bf16(x[i])), ref_bf16(x[i]), "x = %.9g", x[i]);
}

// ---- round trips -------------------------------------------------------------------------------------------

static void roundtrip(df_dtype dt, bool last, int gzip, int64_t chunk_rows) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/one.h5", dir);
  const int64_t lens[] = {3, 1, 7, 5};
  df_hs_writer_options o = opts(dt, last);
  o.gzip_level = gzip, o.chunk_rows = chunk_rows;
  write_shard_opts(path, &o, 10, lens, 4);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  const df_hs_info *in = df_hs_get_info(ds);
  cr_expect_eq(in->num_samples, 4);
  cr_expect_eq(in->num_tokens, 16);
  cr_expect_eq(in->num_layers, K);
  cr_expect_eq(in->hidden_size, H);
  cr_expect_eq(in->target_layer_ids[0], 1);
  cr_expect_eq(in->target_layer_ids[1], 4);
  cr_expect_eq(in->dtype, dt);
  cr_expect_eq(in->has_last_hidden, last);
  cr_expect_eq(in->num_shards, 1);
  for (int i = 0; i < 4; i++) {
    int64_t len;
    DF_ASSERT_OK(df_hs_sample_length(ds, i, &len, &err), &err);
    cr_expect_eq(len, lens[i]);
    expect_sample(ds, i, 0, 10 + (uint64_t)i, lens[i], lens[i]);
  }
  df_hs_close(ds);
  tmpdir_remove(dir);
}

Test(hidden_states, roundtrip_bf16_with_last_hidden) { roundtrip(DF_BF16, true, 0, 0); }
Test(hidden_states, roundtrip_f32_exact) { roundtrip(DF_F32, false, 0, 0); }
Test(hidden_states, roundtrip_gzip_small_chunks) { roundtrip(DF_BF16, true, 4, 2); }

Test(hidden_states, truncation_reads_only_max_len_rows) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/t.h5", dir);
  const int64_t lens[] = {7, 4};
  write_shard(path, DF_BF16, true, 20, lens, 2);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  expect_sample(ds, 0, 2, 20, 7, 2);
  expect_sample(ds, 0, 7, 20, 7, 7);
  expect_sample(ds, 1, 100, 21, 4, 4);
  expect_sample(ds, 1, 3, 21, 4, 3);
  df_hs_close(ds);
  tmpdir_remove(dir);
}

Test(hidden_states, random_access_middle_sample) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/many.h5", dir);
  int64_t lens[50];
  for (int i = 0; i < 50; i++) lens[i] = 1 + (i * 7) % 11;
  write_shard(path, DF_F32, false, 100, lens, 50);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  expect_sample(ds, 27, 0, 127, lens[27], lens[27]);
  expect_sample(ds, 49, 0, 149, lens[49], lens[49]);
  expect_sample(ds, 0, 0, 100, lens[0], lens[0]);
  int64_t len;
  cr_expect_eq(df_hs_sample_length(ds, 50, &len, &err), DF_ERR_INVALID, "sample 50 of 50 is out of range");
  cr_expect(strstr(err.msg, "50"), "%s", err.msg);
  float last[64];
  df_hs_sample_bufs b = {.last_hidden = last};
  cr_expect_eq(df_hs_read_sample(ds, 3, 0, &b, NULL, &err), DF_ERR_INVALID, "no target_last_hidden_states here");
  cr_expect(strstr(err.msg, "target_last_hidden_states"), "%s", err.msg);
  df_hs_close(ds);
  tmpdir_remove(dir);
}

Test(hidden_states, directory_of_shards_in_sorted_order) {
  char dir[64], p[160];
  tmpdir_make(dir, sizeof dir);
  const int64_t la[] = {3, 2, 4}, lb[] = {5, 1}, lc[] = {2};
  // Written out of order; read back in name order: a (3 samples), b (2), bb (empty), c (1).
  snprintf(p, sizeof p, "%s/shard_c.h5", dir);
  write_shard(p, DF_BF16, false, 300, lc, 1);
  snprintf(p, sizeof p, "%s/shard_a.h5", dir);
  write_shard(p, DF_BF16, false, 100, la, 3);
  snprintf(p, sizeof p, "%s/shard_bb.h5", dir);
  write_shard(p, DF_BF16, false, 0, NULL, 0);
  snprintf(p, sizeof p, "%s/shard_b.h5", dir);
  write_shard(p, DF_BF16, false, 200, lb, 2);
  snprintf(p, sizeof p, "%s/notes.txt", dir); // not *.h5: ignored
  FILE *f = fopen(p, "w");
  fputs("not a shard\n", f);
  fclose(f);
  snprintf(p, sizeof p, "%s/shard_d.h5.tmp", dir); // an unfinished shard: ignored
  f = fopen(p, "w");
  fclose(f);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(dir, &ds, &err), &err);
  const df_hs_info *in = df_hs_get_info(ds);
  cr_expect_eq(in->num_samples, 6);
  cr_expect_eq(in->num_shards, 4);
  cr_expect_eq(in->num_tokens, 3 + 2 + 4 + 5 + 1 + 2);
  const uint64_t seeds[6] = {100, 101, 102, 200, 201, 300};
  const int64_t lens[6] = {3, 2, 4, 5, 1, 2};
  for (int i = 5; i >= 0; i--) expect_sample(ds, i, 0, seeds[i], lens[i], lens[i]);
  df_hs_close(ds);
  tmpdir_remove(dir);
}

Test(hidden_states, print_lists_attributes_and_shards) {
  char dir[64], p[160];
  tmpdir_make(dir, sizeof dir);
  const int64_t la[] = {3, 2}, lb[] = {4};
  snprintf(p, sizeof p, "%s/s0.h5", dir);
  write_shard(p, DF_BF16, true, 1, la, 2);
  snprintf(p, sizeof p, "%s/s1.h5", dir);
  write_shard(p, DF_BF16, true, 5, lb, 1);
  char *text = NULL;
  size_t n = 0;
  FILE *out = open_memstream(&text, &n);
  df_error err = {0};
  DF_ASSERT_OK(df_hs_print(dir, out, &err), &err);
  fclose(out);
  const char *want[] = {"dtype: bfloat16",
                        "hidden_size (H): 3",
                        "(K = 2): [1, 4]",
                        "samples: 3",
                        "tokens: 9",
                        "shards: 2",
                        "s0.h5: samples 2",
                        "s1.h5: samples 1 (from #2)",
                        "target_last_hidden_states: yes"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    cr_expect(strstr(text, want[i]), "print output lacks \"%s\":\n%s", want[i], text);
  free(text);
  tmpdir_remove(dir);
}

// ---- validation against the draft config -------------------------------------------------------------------

Test(hidden_states, check_target_names_each_mismatch) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/x.h5", dir);
  const int64_t lens[] = {2};
  write_shard(path, DF_BF16, false, 1, lens, 1);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  DF_ASSERT_OK(df_hs_check_target(ds, K, LAYER_IDS, H, &err), &err);
  const int three[3] = {1, 4, 7}, other[2] = {1, 5};
  cr_expect_eq(df_hs_check_target(ds, 3, three, H, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "K differs") && strstr(err.msg, "has 3") && strstr(err.msg, "has 2"), "%s", err.msg);
  cr_expect_eq(df_hs_check_target(ds, K, other, H, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "target_layer_ids") && strstr(err.msg, "[1, 5]") && strstr(err.msg, "[1, 4]"), "%s",
            err.msg);
  cr_expect_eq(df_hs_check_target(ds, K, LAYER_IDS, 4096, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "hidden_size") && strstr(err.msg, "4096") && strstr(err.msg, "has 3"), "%s", err.msg);
  cr_expect(strstr(err.msg, path), "the message names the data: %s", err.msg);
  df_hs_close(ds);
  tmpdir_remove(dir);
}

// ---- the writer --------------------------------------------------------------------------------------------

Test(hidden_states, writer_publishes_only_on_close) {
  char dir[64], path[128], tmp[160];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/w.h5", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  df_hs_writer_options o = opts(DF_BF16, false);
  df_hs_writer *w;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_writer_create(path, &o, &w, &err), &err);
  sample s = sample_make(1, 4);
  DF_ASSERT_OK(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, NULL, &err), &err);
  cr_expect_neq(access(path, F_OK), 0, "nothing at the final name before close");
  cr_expect_eq(access(tmp, F_OK), 0, "the shard grows at <name>.tmp");
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
  cr_expect_eq(access(path, F_OK), 0);
  cr_expect_neq(access(tmp, F_OK), 0);
  DF_ASSERT_OK(df_hs_writer_create(path, &o, &w, &err), &err);
  df_hs_writer_abort(w);
  cr_expect_neq(access(tmp, F_OK), 0, "abort removes the .tmp");
  sample_free(&s);
  tmpdir_remove(dir);
}

Test(hidden_states, writer_rejects_bad_samples) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/w.h5", dir);
  df_hs_writer_options o = opts(DF_BF16, true);
  df_hs_writer *w;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_writer_create(path, &o, &w, &err), &err);
  sample s = sample_make(1, 4);
  DF_ASSERT_OK(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, s.last, &err), &err);
  s.hidden[2 * W + 1] = NAN;
  cr_expect_eq(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, s.last, &err), DF_ERR_NUMERIC);
  cr_expect(strstr(err.msg, "sample 1") && strstr(err.msg, "hidden_states[2, 1]"), "%s", err.msg);
  s.hidden[2 * W + 1] = 3.4e38f; // finite in fp32, Inf once rounded to bf16
  cr_expect_eq(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, s.last, &err), DF_ERR_NUMERIC);
  s.hidden[2 * W + 1] = 0.0f;
  cr_expect_eq(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, NULL, &err), DF_ERR_INVALID, "last hidden needed");
  cr_expect_eq(df_hs_writer_append(w, 0, s.ids, s.mask, s.hidden, s.last, &err), DF_ERR_INVALID, "empty sample");
  s.mask[1] = 2;
  cr_expect_eq(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, s.last, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "loss_mask[1]"), "%s", err.msg);
  s.mask[1] = 1;
  DF_ASSERT_OK(df_hs_writer_append(w, 4, s.ids, s.mask, s.hidden, s.last, &err), &err);
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
  df_hs_dataset *ds;
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  cr_expect_eq(df_hs_get_info(ds)->num_samples, 2, "rejected samples left no trace");
  df_hs_close(ds);
  int bad_ids[1] = {-1};
  o.target_layer_ids = bad_ids, o.num_layers = 1;
  cr_expect_eq(df_hs_writer_create(path, &o, &w, &err), DF_ERR_INVALID);
  sample_free(&s);
  tmpdir_remove(dir);
}

// ---- bad shards: each made from a good one with the plain HDF5 API ---------------------------------------

typedef struct {
  char dir[64], path[128];
  hid_t f;
} bad_shard;

// A good two-sample bf16 shard (lengths 3 and 2, T = 5), opened read-write for damage.
static void bad_begin(bad_shard *b, bool last) {
  tmpdir_make(b->dir, sizeof b->dir);
  snprintf(b->path, sizeof b->path, "%s/bad.h5", b->dir);
  const int64_t lens[] = {3, 2};
  write_shard(b->path, DF_BF16, last, 1, lens, 2);
  b->f = H5Fopen(b->path, H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert_gt(b->f, 0);
}

// Closes the damaged file and expects opening it to fail with st, naming the file and `name`.
static void bad_expect(bad_shard *b, df_status st, const char *name) {
  H5Fclose(b->f);
  df_hs_dataset *ds = NULL;
  df_error err = {0};
  cr_expect_eq(df_hs_open(b->path, &ds, &err), st, "status %s: %s", df_status_name(err.status), err.msg);
  cr_expect_null(ds);
  cr_expect(strstr(err.msg, b->path), "the message names the file: %s", err.msg);
  cr_expect(strstr(err.msg, name), "the message names '%s': %s", name, err.msg);
  cr_expect(strstr(err.where, name), "where names '%s': %s", name, err.where);
  cr_expect(err.hint[0], "a hint is given");
  tmpdir_remove(b->dir);
}

static void set_str_attr(hid_t f, const char *name, const char *v) {
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  H5Tset_size(t, strlen(v) + 1); // fixed-length this time: the reader takes both kinds
  hid_t a = H5Acreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, v);
  H5Aclose(a), H5Sclose(sp), H5Tclose(t);
}

static void set_i64_attr(hid_t f, const char *name, int64_t v) {
  if (H5Aexists(f, name) > 0) H5Adelete(f, name);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a), H5Sclose(sp);
}

static void set_offsets(hid_t f, const int64_t *v) {
  hid_t d = H5Dopen2(f, DF_HS_DS_OFFSETS, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d);
}

// Replaces dataset name with a zero-filled one of type t and the given shape.
static void replace_dset(hid_t f, const char *name, hid_t t, int rank, hsize_t d0, hsize_t d1) {
  H5Ldelete(f, name, H5P_DEFAULT);
  hsize_t dims[2] = {d0, d1};
  hid_t sp = H5Screate_simple(rank, dims, NULL);
  hid_t d = H5Dcreate2(f, name, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(d), H5Sclose(sp);
}

Test(hidden_states, bad_missing_attribute) {
  bad_shard b;
  bad_begin(&b, false);
  H5Adelete(b.f, DF_HS_ATTR_HIDDEN_SIZE);
  bad_expect(&b, DF_ERR_FORMAT, "hidden_size");
}

Test(hidden_states, bad_format_string) {
  bad_shard b;
  bad_begin(&b, false);
  set_str_attr(b.f, DF_HS_ATTR_FORMAT, "specforge-ckpt");
  bad_expect(&b, DF_ERR_FORMAT, "format");
}

Test(hidden_states, bad_version) {
  bad_shard b;
  bad_begin(&b, false);
  set_i64_attr(b.f, DF_HS_ATTR_VERSION, 2);
  bad_expect(&b, DF_ERR_FORMAT, "version");
}

Test(hidden_states, bad_version_type) {
  bad_shard b;
  bad_begin(&b, false);
  set_str_attr(b.f, DF_HS_ATTR_VERSION, "1");
  bad_expect(&b, DF_ERR_FORMAT, "version");
}

Test(hidden_states, bad_dtype_string) {
  bad_shard b;
  bad_begin(&b, false);
  set_str_attr(b.f, DF_HS_ATTR_DTYPE, "float16");
  bad_expect(&b, DF_ERR_FORMAT, "dtype");
}

Test(hidden_states, bad_empty_layer_ids) {
  bad_shard b;
  bad_begin(&b, false);
  H5Adelete(b.f, DF_HS_ATTR_LAYER_IDS);
  hsize_t one = 1;
  hid_t sp = H5Screate_simple(1, &one, NULL);
  hid_t a = H5Acreate2(b.f, DF_HS_ATTR_LAYER_IDS, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  double v = 1.0;
  H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
  H5Aclose(a), H5Sclose(sp);
  bad_expect(&b, DF_ERR_FORMAT, "target_layer_ids");
}

Test(hidden_states, bad_offsets_not_monotonic) {
  bad_shard b;
  bad_begin(&b, false);
  const int64_t off[3] = {0, 3, 3}; // sample 1 empty, and offsets[N] != T
  set_offsets(b.f, off);
  H5Fclose(b.f);
  df_hs_dataset *ds = NULL;
  df_error err = {0};
  cr_expect_eq(df_hs_open(b.path, &ds, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, b.path) && strstr(err.msg, "sample_offsets") && strstr(err.msg, "sample 1"),
            "names the file, the dataset and the sample: %s", err.msg);
  b.f = H5Fopen(b.path, H5F_ACC_RDWR, H5P_DEFAULT);
  const int64_t down[3] = {0, 4, 2};
  set_offsets(b.f, down);
  bad_expect(&b, DF_ERR_FORMAT, "sample_offsets");
}

Test(hidden_states, bad_offsets_end_not_t) {
  bad_shard b;
  bad_begin(&b, false);
  const int64_t off[3] = {0, 3, 4}; // T is 5
  set_offsets(b.f, off);
  H5Fclose(b.f);
  df_hs_dataset *ds = NULL;
  df_error err = {0};
  cr_expect_eq(df_hs_open(b.path, &ds, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "expected T = 5"), "%s", err.msg);
  b.f = H5Fopen(b.path, H5F_ACC_RDWR, H5P_DEFAULT);
  const int64_t first[3] = {1, 3, 5};
  set_offsets(b.f, first);
  bad_expect(&b, DF_ERR_FORMAT, "sample_offsets");
}

Test(hidden_states, bad_hidden_width) {
  bad_shard b;
  bad_begin(&b, false);
  replace_dset(b.f, DF_HS_DS_HIDDEN, H5T_STD_U16LE, 2, 5, W + 1);
  bad_expect(&b, DF_ERR_FORMAT, "hidden_states");
}

Test(hidden_states, bad_last_hidden_rows) {
  bad_shard b;
  bad_begin(&b, true);
  replace_dset(b.f, DF_HS_DS_LAST_HIDDEN, H5T_STD_U16LE, 2, 4, H);
  bad_expect(&b, DF_ERR_FORMAT, "target_last_hidden_states");
}

Test(hidden_states, bad_missing_dataset) {
  bad_shard b;
  bad_begin(&b, false);
  H5Ldelete(b.f, DF_HS_DS_LOSS_MASK, H5P_DEFAULT);
  bad_expect(&b, DF_ERR_FORMAT, "loss_mask");
}

Test(hidden_states, bad_dataset_element_type) {
  bad_shard b;
  bad_begin(&b, false);
  replace_dset(b.f, DF_HS_DS_INPUT_IDS, H5T_STD_I64LE, 1, 5, 0);
  bad_expect(&b, DF_ERR_FORMAT, "input_ids");
}

Test(hidden_states, bad_hidden_type_for_dtype) {
  bad_shard b;
  bad_begin(&b, false);
  set_str_attr(b.f, DF_HS_ATTR_DTYPE, "float32"); // the data stays uint16
  bad_expect(&b, DF_ERR_FORMAT, "hidden_states");
}

Test(hidden_states, bad_not_hdf5) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/junk.h5", dir);
  FILE *f = fopen(path, "w");
  fputs("this is not HDF5\n", f);
  fclose(f);
  df_hs_dataset *ds = NULL;
  df_error err = {0};
  cr_expect_eq(df_hs_open(dir, &ds, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, path), "%s", err.msg);
  remove(path);
  cr_expect_eq(df_hs_open(dir, &ds, &err), DF_ERR_FORMAT, "a directory without shards");
  cr_expect(strstr(err.msg, "no *.h5"), "%s", err.msg);
  cr_expect_eq(df_hs_open("/nonexistent/df_hs", &ds, &err), DF_ERR_IO);
  tmpdir_remove(dir);
}

// Two shards that differ in one respect; opening the directory must name both files and the attribute.
static void disagree_case(df_dtype dt1, bool last1, const int *ids1, int64_t h1, const char *name) {
  char dir[64], p0[128], p1[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(p0, sizeof p0, "%s/a.h5", dir);
  snprintf(p1, sizeof p1, "%s/b.h5", dir);
  const int64_t lens[] = {2};
  write_shard(p0, DF_BF16, false, 1, lens, 1);
  df_hs_writer_options o = opts(dt1, last1);
  o.target_layer_ids = ids1, o.hidden_size = h1;
  df_hs_writer *w;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_writer_create(p1, &o, &w, &err), &err);
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
  df_hs_dataset *ds = NULL;
  cr_expect_eq(df_hs_open(dir, &ds, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, p0) && strstr(err.msg, p1), "names both shards: %s", err.msg);
  cr_expect(strstr(err.msg, name), "names '%s': %s", name, err.msg);
  tmpdir_remove(dir);
}

Test(hidden_states, bad_shards_disagree) {
  const int other[K] = {1, 5};
  disagree_case(DF_BF16, false, other, H, "target_layer_ids");
  disagree_case(DF_BF16, false, LAYER_IDS, H + 1, "hidden_size");
  disagree_case(DF_F32, false, LAYER_IDS, H, "dtype");
  disagree_case(DF_BF16, true, LAYER_IDS, H, "target_last_hidden_states");
}

Test(hidden_states, check_index_pure) {
  df_error err = {0};
  const int64_t good[4] = {0, 2, 3, 7}, empty_sample[3] = {0, 0, 2}, past[3] = {0, 9, 7};
  DF_ASSERT_OK(df_hs_check_index(good, 4, 7, "f.h5", &err), &err);
  const int64_t zero[1] = {0};
  DF_ASSERT_OK(df_hs_check_index(zero, 1, 0, "f.h5", &err), &err); // an empty shard
  cr_expect_eq(df_hs_check_index(empty_sample, 3, 2, "f.h5", &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "empty samples"), "%s", err.msg);
  cr_expect_eq(df_hs_check_index(past, 3, 7, "f.h5", &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "past T"), "%s", err.msg);
  cr_expect_eq(df_hs_check_index(good, 4, 8, "f.h5", &err), DF_ERR_FORMAT);
  cr_expect_eq(df_hs_check_index(good, 0, 0, "f.h5", &err), DF_ERR_FORMAT);
}

// ---- shards written by h5py (tools/gen_hs_fixtures.py) ----------------------------------------------------

// Reads shard file h5 (the fixture `name`, or a copy of it) and checks it against name's JSON; convention: whether
// the file carries layer_id_convention.
static void check_h5py_file(const char *h5, const char *name, bool convention) {
  char js[512];
  snprintf(js, sizeof js, "%s/hidden_states/%s.json", DF_FIXTURE_DIR, name);
  json_error_t jerr;
  json_t *want = json_load_file(js, 0, &jerr);
  cr_assert_not_null(want, "%s: %s (regenerate with tools/gen_hs_fixtures.py)", js, jerr.text);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(h5, &ds, &err), &err);
  const df_hs_info *in = df_hs_get_info(ds);
  cr_expect_eq(in->has_convention, convention, "%s", h5);
  json_t *jids = json_object_get(want, "target_layer_ids"), *joff = json_object_get(want, "sample_offsets");
  int k = (int)json_array_size(jids);
  int64_t h = json_integer_value(json_object_get(want, "hidden_size"));
  int ids[DF_HS_MAX_LAYERS];
  for (int j = 0; j < k; j++) ids[j] = (int)json_integer_value(json_array_get(jids, (size_t)j));
  DF_ASSERT_OK(df_hs_check_target(ds, k, ids, h, &err), &err);
  cr_expect_eq(in->dtype, strcmp(json_string_value(json_object_get(want, "dtype")), "bfloat16") ? DF_F32 : DF_BF16);
  cr_expect_eq(in->has_last_hidden, json_is_true(json_object_get(want, "has_last_hidden")));
  cr_assert_eq(in->num_samples, (int64_t)json_array_size(joff) - 1);
  json_t *jin = json_object_get(want, "input_ids"), *jm = json_object_get(want, "loss_mask"),
         *jh = json_object_get(want, "hidden_states"), *jl = json_object_get(want, "target_last_hidden_states");
  int64_t w = k * h;
  float *hid = malloc((size_t)(in->num_tokens * w) * 4), *last = malloc((size_t)(in->num_tokens * h) * 4);
  int32_t *tok = malloc((size_t)in->num_tokens * 4);
  uint8_t *mask = malloc((size_t)in->num_tokens);
  for (int64_t i = 0; i < in->num_samples; i++) {
    int64_t r0 = json_integer_value(json_array_get(joff, (size_t)i)), len;
    df_hs_sample_bufs b = {tok, mask, hid, in->has_last_hidden ? last : NULL};
    DF_ASSERT_OK(df_hs_read_sample(ds, i, 0, &b, &len, &err), &err);
    cr_expect_eq(r0 + len, json_integer_value(json_array_get(joff, (size_t)i + 1)));
    for (int64_t r = 0; r < len; r++) {
      cr_expect_eq(tok[r], json_integer_value(json_array_get(jin, (size_t)(r0 + r))));
      cr_expect_eq(mask[r], json_integer_value(json_array_get(jm, (size_t)(r0 + r))));
    }
    for (int64_t j = 0; j < len * w; j++)
      cr_expect_eq(hid[j], (float)json_number_value(json_array_get(jh, (size_t)(r0 * w + j))), "%s sample %lld [%lld]",
                   name, (long long)i, (long long)j);
    for (int64_t j = 0; in->has_last_hidden && j < len * h; j++)
      cr_expect_eq(last[j], (float)json_number_value(json_array_get(jl, (size_t)(r0 * h + j))));
  }
  free(hid), free(last), free(tok), free(mask);
  df_hs_close(ds);
  json_decref(want);
}

static void check_h5py_fixture(const char *name) {
  char h5[512];
  snprintf(h5, sizeof h5, "%s/hidden_states/%s.h5", DF_FIXTURE_DIR, name);
  check_h5py_file(h5, name, true);
}

Test(hidden_states, h5py_fixture_bf16) { check_h5py_fixture("h5py_bf16"); }
Test(hidden_states, h5py_fixture_f32) { check_h5py_fixture("h5py_f32"); }

// A shard written before layer_id_convention existed (the attribute deleted from a copy of the h5py fixture)
// reads the same, as the convention draftforge writes.
Test(hidden_states, h5py_shard_without_the_convention_attribute) {
  char dir[] = "/tmp/df_hs_legacy_XXXXXX", h5[600], cmd[1400];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(h5, sizeof h5, "%s/legacy.h5", dir);
  snprintf(cmd, sizeof cmd, "cp '%s/hidden_states/h5py_bf16.h5' '%s'", DF_FIXTURE_DIR, h5);
  cr_assert_eq(system(cmd), 0);
  hid_t f = H5Fopen(h5, H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert_geq(f, 0);
  cr_assert_geq(H5Adelete(f, "layer_id_convention"), 0);
  H5Fclose(f);
  check_h5py_file(h5, "h5py_bf16", false);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
