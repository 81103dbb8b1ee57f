// Hidden-state shard writer: extendible chunked datasets grown one sample at a time in <path>.tmp,
// sample_offsets written at close, then an atomic rename to the final name.
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/data/hs.h"
#include "train/data/hs_h5.h"

#define HS_DEFAULT_CHUNK_ROWS 64   // (64, K·H) bf16 ≈ 2.6 MB for Qwen3-8B's 5 × 4096: one large read per chunk
#define HS_TOKEN_CHUNK        4096 // input_ids / loss_mask are 1-5 bytes a row: larger chunks

struct df_hs_writer {
  char *path, *tmp;
  hid_t file, d_ids, d_mask, d_hidden, d_last;
  int64_t k, h, w; // w = K·H
  df_dtype dtype;
  bool has_last, failed;
  int64_t rows;     // T so far
  int64_t *offsets; // (n + 1)
  int64_t n, cap;
  uint16_t *bits; // bf16 staging buffer
  size_t bits_cap;
};

static df_status check_options(const char *path, const df_hs_writer_options *o, df_error *err) {
  const char *hint = "pass the target's hidden size, the K captured layer ids, dtype DF_BF16 or DF_F32";
  if (o->hidden_size < 1 || o->hidden_size > (INT64_C(1) << 24))
    return DF_FAIL(err, DF_ERR_INVALID, "hidden_size", hint, "shard %s: hidden_size %lld is out of range", path,
                   (long long)o->hidden_size);
  if (o->num_layers < 1 || o->num_layers > DF_HS_MAX_LAYERS || !o->target_layer_ids)
    return DF_FAIL(err, DF_ERR_INVALID, "target_layer_ids", hint, "shard %s: %d target layers, expected 1..%d", path,
                   o->num_layers, DF_HS_MAX_LAYERS);
  for (int j = 0; j < o->num_layers; j++)
    if (o->target_layer_ids[j] < 0)
      return DF_FAIL(err, DF_ERR_INVALID, "target_layer_ids", hint, "shard %s: target layer id %d is negative", path,
                     o->target_layer_ids[j]);
  if (o->dtype != DF_BF16 && o->dtype != DF_F32)
    return DF_FAIL(err, DF_ERR_INVALID, "dtype", hint, "shard %s: dtype %s is not bf16 or f32", path,
                   df_dtype_name(o->dtype));
  if (o->chunk_rows < 0 || o->gzip_level < 0 || o->gzip_level > 9)
    return DF_FAIL(err, DF_ERR_INVALID, "chunk_rows", "chunk_rows >= 0 (0 = default), gzip_level 0..9",
                   "shard %s: chunk_rows %lld / gzip_level %d out of range", path, (long long)o->chunk_rows,
                   o->gzip_level);
  return DF_OK;
}

// An extendible dataset of 0 rows (1-D when w == 0, else [0, w]), chunked along rows.
static df_status create_dset(df_hs_writer *wr, const char *name, hid_t ft, int64_t w, int64_t chunk_rows, int gzip,
                             hid_t *out, df_error *err) {
  int rank = w > 0 ? 2 : 1;
  hsize_t dims[2] = {0, (hsize_t)w}, maxd[2] = {H5S_UNLIMITED, (hsize_t)w},
          chunk[2] = {(hsize_t)chunk_rows, (hsize_t)w};
  hid_t sp = H5Screate_simple(rank, dims, maxd), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, rank, chunk);
  if (gzip > 0) {
    H5Pset_shuffle(dcpl); // byte-shuffle first: it groups the bf16 exponent bytes, which is all gzip can find
    H5Pset_deflate(dcpl, (unsigned)gzip);
  }
  *out = H5Dcreate2(wr->file, name, ft, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  H5Sclose(sp);
  if (*out < 0) return hs_h5_fail(err, DF_ERR_IO, wr->tmp, name, NULL, "cannot create the dataset");
  return DF_OK;
}

static df_status write_root_attrs(df_hs_writer *wr, const df_hs_writer_options *o, df_error *err) {
  int64_t ids[DF_HS_MAX_LAYERS];
  for (int j = 0; j < o->num_layers; j++) ids[j] = o->target_layer_ids[j];
  DF_TRY(hs_write_attr_str(wr->file, wr->tmp, DF_HS_ATTR_FORMAT, DF_HS_FORMAT, err));
  DF_TRY(hs_write_attr_i64(wr->file, wr->tmp, DF_HS_ATTR_VERSION, DF_HS_VERSION, err));
  DF_TRY(hs_write_attr_i64(wr->file, wr->tmp, DF_HS_ATTR_HIDDEN_SIZE, o->hidden_size, err));
  DF_TRY(hs_write_attr_i64_array(wr->file, wr->tmp, DF_HS_ATTR_LAYER_IDS, ids, o->num_layers, err));
  DF_TRY(hs_write_attr_str(wr->file, wr->tmp, DF_HS_ATTR_CONVENTION, DF_HS_CONVENTION, err));
  return hs_write_attr_str(wr->file, wr->tmp, DF_HS_ATTR_DTYPE, o->dtype == DF_BF16 ? "bfloat16" : "float32", err);
}

static df_status create_file(df_hs_writer *wr, const df_hs_writer_options *o, df_error *err) {
  wr->file = H5Fcreate(wr->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (wr->file < 0)
    return hs_h5_fail(err, DF_ERR_IO, wr->tmp, NULL, "check that the directory exists and is writable",
                      "cannot create the shard");
  DF_TRY(write_root_attrs(wr, o, err));
  int64_t cr = o->chunk_rows ? o->chunk_rows : HS_DEFAULT_CHUNK_ROWS;
  int64_t max_rows = (INT64_C(1) << 31) / (wr->w * 4); // HDF5 chunks must stay under 4 GiB
  cr = cr < max_rows ? cr : (max_rows > 0 ? max_rows : 1);
  hid_t hft = o->dtype == DF_BF16 ? H5T_STD_U16LE : H5T_IEEE_F32LE;
  DF_TRY(create_dset(wr, DF_HS_DS_INPUT_IDS, H5T_STD_I32LE, 0, HS_TOKEN_CHUNK, o->gzip_level, &wr->d_ids, err));
  DF_TRY(create_dset(wr, DF_HS_DS_LOSS_MASK, H5T_STD_U8LE, 0, HS_TOKEN_CHUNK, o->gzip_level, &wr->d_mask, err));
  DF_TRY(create_dset(wr, DF_HS_DS_HIDDEN, hft, wr->w, cr, o->gzip_level, &wr->d_hidden, err));
  if (wr->has_last) DF_TRY(create_dset(wr, DF_HS_DS_LAST_HIDDEN, hft, wr->h, cr, o->gzip_level, &wr->d_last, err));
  return DF_OK;
}

// Closes the datasets and the file; false when HDF5 could not flush something.
static bool release(df_hs_writer *wr) {
  bool ok = true;
  hid_t *ds[] = {&wr->d_ids, &wr->d_mask, &wr->d_hidden, &wr->d_last};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
    if (*ds[i] > 0) ok &= H5Dclose(*ds[i]) >= 0, *ds[i] = 0;
  if (wr->file > 0) ok &= H5Fclose(wr->file) >= 0, wr->file = 0;
  return ok;
}

static void writer_free(df_hs_writer *wr) {
  free(wr->path);
  free(wr->tmp);
  free(wr->offsets);
  free(wr->bits);
  free(wr);
}

void df_hs_writer_abort(df_hs_writer *wr) {
  if (!wr) return;
  hs_quiet q;
  hs_quiet_begin(&q);
  release(wr);
  hs_quiet_end(&q);
  remove(wr->tmp);
  writer_free(wr);
}

df_status df_hs_writer_create(const char *path, const df_hs_writer_options *o, df_hs_writer **out, df_error *err) {
  *out = NULL;
  DF_TRY(check_options(path, o, err));
  df_hs_writer *wr = calloc(1, sizeof *wr);
  size_t plen = strlen(path);
  if (wr) wr->path = strdup(path), wr->tmp = malloc(plen + 5), wr->offsets = calloc(64, sizeof *wr->offsets);
  if (!wr || !wr->path || !wr->tmp || !wr->offsets) {
    if (wr) writer_free(wr);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory creating shard %s", path);
  }
  snprintf(wr->tmp, plen + 5, "%s.tmp", path);
  wr->cap = 64;
  wr->k = o->num_layers, wr->h = o->hidden_size, wr->w = wr->k * wr->h;
  wr->dtype = o->dtype, wr->has_last = o->has_last_hidden;
  hs_quiet q;
  hs_quiet_begin(&q);
  df_status st = create_file(wr, o, err);
  hs_quiet_end(&q);
  if (st != DF_OK) {
    df_hs_writer_abort(wr);
    return st;
  }
  *out = wr;
  return DF_OK;
}

#define HS_BF16_OVERFLOW 3.3961514e38f // 0x7F7F8000: the smallest fp32 magnitude that rounds to a bf16 Inf

// Finds the first value of x (n values, rows of width w) that is or would be stored non-finite; false and its
// row/col when there is one.
static bool all_finite(const float *x, int64_t n, int64_t w, df_dtype dt, int64_t *row, int64_t *col) {
  float limit = dt == DF_BF16 ? HS_BF16_OVERFLOW : INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (!(fabsf(x[i]) < limit)) {
      *row = i / w, *col = i % w;
      return false;
    }
  return true;
}

static df_status check_sample(const df_hs_writer *wr, int64_t len, const int32_t *ids, const uint8_t *mask,
                              const float *hidden, const float *last, df_error *err) {
  int64_t idx = wr->n, r, c;
  if (wr->failed)
    return DF_FAIL(err, DF_ERR_INVALID, wr->path, "abort the writer and start the shard again",
                   "shard %s: an earlier write failed; the shard cannot be continued", wr->path);
  if (len < 1 || !ids || !mask || !hidden || (wr->has_last != (last != NULL)))
    return DF_FAIL(err, DF_ERR_INVALID, wr->path,
                   "every sample has >= 1 row, ids, mask and hidden rows, and last "
                   "hidden rows exactly when the shard was created with has_last_hidden",
                   "shard %s: sample %lld: bad arguments (len %lld, last_hidden %s)", wr->path, (long long)idx,
                   (long long)len, last ? "given" : "absent");
  for (int64_t i = 0; i < len; i++)
    if (mask[i] > 1)
      return DF_FAIL(err, DF_ERR_INVALID, DF_HS_DS_LOSS_MASK, "loss_mask values are 0 or 1",
                     "shard %s: sample %lld: loss_mask[%lld] is %u", wr->path, (long long)idx, (long long)i, mask[i]);
  if (!all_finite(hidden, len * wr->w, wr->w, wr->dtype, &r, &c))
    return DF_FAIL(err, DF_ERR_NUMERIC, DF_HS_DS_HIDDEN, "skip samples whose capture produced NaN/Inf",
                   "shard %s: sample %lld: hidden_states[%lld, %lld] is not finite in the stored dtype", wr->path,
                   (long long)idx, (long long)r, (long long)c);
  if (last && !all_finite(last, len * wr->h, wr->h, wr->dtype, &r, &c))
    return DF_FAIL(err, DF_ERR_NUMERIC, DF_HS_DS_LAST_HIDDEN, "skip samples whose capture produced NaN/Inf",
                   "shard %s: sample %lld: target_last_hidden_states[%lld, %lld] is not finite", wr->path,
                   (long long)idx, (long long)r, (long long)c);
  return DF_OK;
}

// Grows dataset d to rows + len rows and writes buf (memory type mt) into the new rows.
static herr_t append_rows(hid_t d, int64_t rows, int64_t len, int64_t w, hid_t mt, const void *buf) {
  int rank = w > 0 ? 2 : 1;
  hsize_t size[2] = {(hsize_t)(rows + len), (hsize_t)w}, start[2] = {(hsize_t)rows, 0},
          count[2] = {(hsize_t)len, (hsize_t)w};
  if (H5Dset_extent(d, size) < 0) return -1;
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(rank, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (rc >= 0) rc = H5Dwrite(d, mt, ms, fs, H5P_DEFAULT, buf);
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  return rc;
}

static herr_t append_float_rows(df_hs_writer *wr, hid_t d, int64_t len, int64_t w, const float *x) {
  if (wr->dtype == DF_F32) return append_rows(d, wr->rows, len, w, H5T_NATIVE_FLOAT, x);
  size_t n = (size_t)(len * w);
  if (n > wr->bits_cap) {
    uint16_t *b = realloc(wr->bits, n * sizeof *b);
    if (!b) return -1;
    wr->bits = b, wr->bits_cap = n;
  }
  for (size_t i = 0; i < n; i++) wr->bits[i] = df_hs_f32_to_bf16(x[i]);
  return append_rows(d, wr->rows, len, w, H5T_NATIVE_UINT16, wr->bits);
}

static df_status append_all(df_hs_writer *wr, int64_t len, const int32_t *ids, const uint8_t *mask, const float *hidden,
                            const float *last, df_error *err) {
  const char *failed = NULL;
  if (append_rows(wr->d_ids, wr->rows, len, 0, H5T_NATIVE_INT32, ids) < 0)
    failed = DF_HS_DS_INPUT_IDS;
  else if (append_rows(wr->d_mask, wr->rows, len, 0, H5T_NATIVE_UINT8, mask) < 0)
    failed = DF_HS_DS_LOSS_MASK;
  else if (append_float_rows(wr, wr->d_hidden, len, wr->w, hidden) < 0)
    failed = DF_HS_DS_HIDDEN;
  else if (last && append_float_rows(wr, wr->d_last, len, wr->h, last) < 0)
    failed = DF_HS_DS_LAST_HIDDEN;
  if (!failed) return DF_OK;
  wr->failed = true;
  char what[96];
  snprintf(what, sizeof what, "cannot append sample %lld", (long long)wr->n);
  return hs_h5_fail(err, DF_ERR_IO, wr->tmp, failed, "check free disk space", what);
}

df_status df_hs_writer_append(df_hs_writer *wr, int64_t len, const int32_t *ids, const uint8_t *mask,
                              const float *hidden, const float *last, df_error *err) {
  DF_TRY(check_sample(wr, len, ids, mask, hidden, last, err));
  if (wr->n + 2 > wr->cap) {
    int64_t *o = realloc(wr->offsets, (size_t)wr->cap * 2 * sizeof *o);
    if (!o) return DF_FAIL(err, DF_ERR_NOMEM, wr->path, NULL, "shard %s: out of memory for offsets", wr->path);
    wr->offsets = o, wr->cap *= 2;
  }
  hs_quiet q;
  hs_quiet_begin(&q);
  df_status st = append_all(wr, len, ids, mask, hidden, last, err);
  hs_quiet_end(&q);
  DF_TRY(st);
  wr->rows += len;
  wr->offsets[++wr->n] = wr->rows;
  return DF_OK;
}

static df_status write_offsets(df_hs_writer *wr, df_error *err) {
  hsize_t dims[1] = {(hsize_t)(wr->n + 1)};
  hid_t sp = H5Screate_simple(1, dims, NULL);
  hid_t d = H5Dcreate2(wr->file, DF_HS_DS_OFFSETS, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, wr->offsets);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  if (rc < 0) return hs_h5_fail(err, DF_ERR_IO, wr->tmp, DF_HS_DS_OFFSETS, "check free disk space", "cannot write");
  return DF_OK;
}

// Flushes the finished file to disk before the rename makes it visible under its final name.
static df_status sync_and_rename(df_hs_writer *wr, df_error *err) {
  int fd = open(wr->tmp, O_RDONLY);
  bool ok = fd >= 0 && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  if (!ok || rename(wr->tmp, wr->path) != 0)
    return DF_FAIL(err, DF_ERR_IO, wr->path, "check the directory is writable and on one filesystem",
                   "cannot sync/rename %s to %s", wr->tmp, wr->path);
  return DF_OK;
}

static df_status finish(df_hs_writer *wr, df_error *err) {
  if (wr->failed)
    return DF_FAIL(err, DF_ERR_INVALID, wr->path, "start the shard again",
                   "shard %s: an earlier write failed; not publishing it", wr->path);
  DF_TRY(write_offsets(wr, err));
  if (!release(wr)) return hs_h5_fail(err, DF_ERR_IO, wr->tmp, NULL, "check free disk space", "cannot close the shard");
  return sync_and_rename(wr, err);
}

df_status df_hs_writer_close(df_hs_writer *wr, df_error *err) {
  hs_quiet q;
  hs_quiet_begin(&q);
  df_status st = finish(wr, err);
  hs_quiet_end(&q);
  if (st != DF_OK) {
    df_hs_writer_abort(wr);
    return st;
  }
  writer_free(wr);
  return DF_OK;
}
