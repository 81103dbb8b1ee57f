// Hidden-state data reader: opens a shard or a directory of shards, validates all of them up front, then
// serves one sample at a time with hyperslab reads (bf16 expanded to fp32 in the caller's buffer).
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/data/hs.h"
#include "train/data/hs_h5.h"

typedef struct {
  char *path;
  hid_t file, d_ids, d_mask, d_hidden, d_last;
  int64_t n, t;     // samples, rows
  int64_t first;    // global number of this shard's sample 0
  int64_t *offsets; // (n + 1)
} hs_shard;

struct df_hs_dataset {
  df_hs_info info;
  hs_shard *shards;
  int nshards;
};

// Everything one shard declares, before it is compared with the others.
typedef struct {
  df_hs_attrs a;
  char format[128], dtype_str[64], convention[64];
  int64_t ids[DF_HS_MAX_LAYERS];
  df_dtype dtype;
} shard_attrs;

static void shard_close(hs_shard *s) {
  hid_t *ds[] = {&s->d_ids, &s->d_mask, &s->d_hidden, &s->d_last};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
    if (*ds[i] > 0) H5Dclose(*ds[i]);
  if (s->file > 0) H5Fclose(s->file);
  free(s->offsets);
  free(s->path);
  memset(s, 0, sizeof *s);
}

void df_hs_close(df_hs_dataset *ds) {
  if (!ds) return;
  hs_quiet q;
  hs_quiet_begin(&q);
  for (int i = 0; i < ds->nshards; i++) shard_close(&ds->shards[i]);
  hs_quiet_end(&q);
  free(ds->shards);
  free(ds);
}

const df_hs_info *df_hs_get_info(const df_hs_dataset *ds) { return &ds->info; }

static df_status read_attrs(hid_t f, const char *path, shard_attrs *sa, df_error *err) {
  memset(sa, 0, sizeof *sa);
  bool present;
  DF_TRY(hs_attr_str(f, path, DF_HS_ATTR_FORMAT, sa->format, sizeof sa->format, &present, err));
  sa->a.format = present ? sa->format : NULL;
  DF_TRY(hs_attr_i64(f, path, DF_HS_ATTR_VERSION, &sa->a.version, &sa->a.has_version, err));
  DF_TRY(hs_attr_i64(f, path, DF_HS_ATTR_HIDDEN_SIZE, &sa->a.hidden_size, &sa->a.has_hidden_size, err));
  DF_TRY(hs_attr_i64_array(f, path, DF_HS_ATTR_LAYER_IDS, sa->ids, DF_HS_MAX_LAYERS, &sa->a.num_layers, &present, err));
  sa->a.layer_ids = present ? sa->ids : NULL;
  DF_TRY(hs_attr_str(f, path, DF_HS_ATTR_DTYPE, sa->dtype_str, sizeof sa->dtype_str, &present, err));
  sa->a.dtype = present ? sa->dtype_str : NULL;
  DF_TRY(hs_attr_str(f, path, DF_HS_ATTR_CONVENTION, sa->convention, sizeof sa->convention, &present, err));
  sa->a.convention = present ? sa->convention : NULL;
  return df_hs_check_attrs(&sa->a, path, &sa->dtype, err);
}

static df_status read_layout(hs_shard *s, const shard_attrs *sa, bool *has_last, df_error *err) {
  df_hs_layout l;
  DF_TRY(hs_describe(s->file, s->path, DF_HS_DS_OFFSETS, &l.offsets, err));
  DF_TRY(hs_describe(s->file, s->path, DF_HS_DS_INPUT_IDS, &l.input_ids, err));
  DF_TRY(hs_describe(s->file, s->path, DF_HS_DS_LOSS_MASK, &l.loss_mask, err));
  DF_TRY(hs_describe(s->file, s->path, DF_HS_DS_HIDDEN, &l.hidden, err));
  DF_TRY(hs_describe(s->file, s->path, DF_HS_DS_LAST_HIDDEN, &l.last_hidden, err));
  DF_TRY(df_hs_check_layout(&l, sa->a.num_layers, sa->a.hidden_size, sa->dtype, s->path, &s->n, &s->t, err));
  *has_last = l.last_hidden.present;
  return DF_OK;
}

static df_status read_offsets(hs_shard *s, df_error *err) {
  s->offsets = malloc((size_t)(s->n + 1) * sizeof *s->offsets);
  if (!s->offsets)
    return DF_FAIL(err, DF_ERR_NOMEM, s->path, NULL, "shard %s: out of memory for %lld sample offsets", s->path,
                   (long long)(s->n + 1));
  hid_t d = H5Dopen2(s->file, DF_HS_DS_OFFSETS, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s->offsets);
  if (d >= 0) H5Dclose(d);
  if (rc < 0) return hs_h5_fail(err, DF_ERR_IO, s->path, DF_HS_DS_OFFSETS, NULL, "cannot read the dataset");
  return df_hs_check_index(s->offsets, s->n + 1, s->t, s->path, err);
}

static df_status open_dset(hs_shard *s, const char *name, bool uncached, hid_t *out, df_error *err) {
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  // Samples are read once per epoch in random order: a chunk cache per open shard would only hold memory.
  if (uncached) H5Pset_chunk_cache(dapl, 0, 0, 1.0);
  *out = H5Dopen2(s->file, name, dapl);
  H5Pclose(dapl);
  if (*out < 0) return hs_h5_fail(err, DF_ERR_IO, s->path, name, NULL, "cannot open the dataset");
  return DF_OK;
}

// Opens and validates one shard; sa receives its attributes for the cross-shard comparison.
static df_status shard_open(hs_shard *s, shard_attrs *sa, bool *has_last, df_error *err) {
  s->file = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (s->file < 0)
    return hs_h5_fail(err, DF_ERR_IO, s->path, NULL, "check the path; every *.h5 in a data directory must be a shard",
                      "cannot open as HDF5");
  DF_TRY(read_attrs(s->file, s->path, sa, err));
  DF_TRY(read_layout(s, sa, has_last, err));
  DF_TRY(read_offsets(s, err));
  DF_TRY(open_dset(s, DF_HS_DS_INPUT_IDS, false, &s->d_ids, err));
  DF_TRY(open_dset(s, DF_HS_DS_LOSS_MASK, false, &s->d_mask, err));
  DF_TRY(open_dset(s, DF_HS_DS_HIDDEN, true, &s->d_hidden, err));
  if (*has_last) DF_TRY(open_dset(s, DF_HS_DS_LAST_HIDDEN, true, &s->d_last, err));
  return DF_OK;
}

static df_status disagree(df_error *err, const char *first, const char *other, const char *name, const char *a,
                          const char *b) {
  char where[256];
  snprintf(where, sizeof where, "%s:%s", other, name);
  return DF_FAIL(err, DF_ERR_FORMAT, where, "all shards of one data path must come from the same capture",
                 "shards disagree on '%s': %s has %s, %s has %s", name, first, a, other, b);
}

static void ids_str(char *buf, size_t n, const int64_t *ids, int64_t k) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int64_t j = 0; j < k && used < n; j++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", j ? ", " : "", (long long)ids[j]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

// Shard s (not the first) must match the first shard's hidden_size, layer ids, dtype and last-hidden presence.
static df_status compare_shards(const hs_shard *s0, const shard_attrs *a0, bool last0, const hs_shard *s,
                                const shard_attrs *a, bool last, df_error *err) {
  char x[512], y[512];
  if (a->a.hidden_size != a0->a.hidden_size) {
    snprintf(x, sizeof x, "%lld", (long long)a0->a.hidden_size);
    snprintf(y, sizeof y, "%lld", (long long)a->a.hidden_size);
    return disagree(err, s0->path, s->path, DF_HS_ATTR_HIDDEN_SIZE, x, y);
  }
  if (a->a.num_layers != a0->a.num_layers || memcmp(a->ids, a0->ids, (size_t)a->a.num_layers * sizeof a->ids[0]) != 0) {
    ids_str(x, sizeof x, a0->ids, a0->a.num_layers);
    ids_str(y, sizeof y, a->ids, a->a.num_layers);
    return disagree(err, s0->path, s->path, DF_HS_ATTR_LAYER_IDS, x, y);
  }
  if (a->dtype != a0->dtype) return disagree(err, s0->path, s->path, DF_HS_ATTR_DTYPE, a0->dtype_str, a->dtype_str);
  if (last != last0)
    return disagree(err, s0->path, s->path, DF_HS_DS_LAST_HIDDEN, last0 ? "the dataset" : "no such dataset",
                    last ? "the dataset" : "no such dataset");
  return DF_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool ends_with_h5(const char *name) {
  size_t n = strlen(name);
  return n > 3 && !strcmp(name + n - 3, ".h5");
}

static void free_list(char **v, int n) {
  for (int i = 0; i < n; i++) free(v[i]);
  free(v);
}

// The *.h5 regular files directly in dir, sorted by name (strcmp order).
static df_status list_shards(const char *dir, char ***out, int *count, df_error *err) {
  DIR *d = opendir(dir);
  if (!d) return DF_FAIL(err, DF_ERR_IO, dir, "check the data path", "cannot open data directory %s", dir);
  char **v = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!ends_with_h5(e->d_name)) continue;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    char *p = malloc(len);
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      char **nv = realloc(v, (size_t)cap * sizeof *v);
      if (!nv)
        free(p), p = NULL;
      else
        v = nv;
    }
    if (!p) {
      closedir(d);
      free_list(v, n);
      return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory listing %s", dir);
    }
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--; // "data/" and "data" name the same shards
    snprintf(p, len, "%.*s/%s", (int)dl, dir, e->d_name);
    struct stat st;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode))
      v[n++] = p;
    else
      free(p);
  }
  closedir(d);
  if (n == 0) {
    free(v);
    return DF_FAIL(err, DF_ERR_FORMAT, dir,
                   "a data directory holds shards named *.h5; SpecForge's capture (*.ckpt) converts with "
                   "tools/import_specforge.py DIR --out NEW_DIR, then --set data.hidden_states_path=NEW_DIR",
                   "data directory %s has no *.h5 shards", dir);
  }
  qsort(v, (size_t)n, sizeof *v, cmp_str);
  *out = v;
  *count = n;
  return DF_OK;
}

static df_status shard_paths(const char *path, char ***out, int *count, df_error *err) {
  struct stat st;
  if (stat(path, &st) != 0)
    return DF_FAIL(err, DF_ERR_IO, path, "check the data path", "data path %s does not exist", path);
  if (S_ISDIR(st.st_mode)) return list_shards(path, out, count, err);
  *out = malloc(sizeof **out);
  if (*out) (*out)[0] = strdup(path);
  if (!*out || !(*out)[0]) {
    free(*out);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  }
  *count = 1;
  return DF_OK;
}

static void fill_info(df_hs_info *info, const shard_attrs *a, bool has_last, int nshards) {
  info->num_layers = (int)a->a.num_layers;
  info->hidden_size = a->a.hidden_size;
  for (int j = 0; j < info->num_layers; j++) info->target_layer_ids[j] = (int)a->ids[j];
  info->dtype = a->dtype;
  info->has_last_hidden = has_last;
  info->has_convention = a->a.convention != NULL;
  info->num_shards = nshards;
}

static df_status open_all(df_hs_dataset *ds, const char *path, df_error *err) {
  shard_attrs a0, a;
  bool last0 = false, last = false;
  for (int i = 0; i < ds->nshards; i++) {
    hs_shard *s = &ds->shards[i];
    DF_TRY(shard_open(s, i ? &a : &a0, i ? &last : &last0, err));
    if (i) DF_TRY(compare_shards(&ds->shards[0], &a0, last0, s, &a, last, err));
    s->first = ds->info.num_samples;
    ds->info.num_samples += s->n;
    ds->info.num_tokens += s->t;
  }
  fill_info(&ds->info, &a0, last0, ds->nshards);
  if (ds->info.num_samples == 0)
    return DF_FAIL(err, DF_ERR_FORMAT, path, "capture or import some samples first", "data path %s holds no samples",
                   path);
  return DF_OK;
}

df_status df_hs_open(const char *path, df_hs_dataset **out, df_error *err) {
  *out = NULL;
  char **paths = NULL;
  int n = 0;
  DF_TRY(shard_paths(path, &paths, &n, err));
  df_hs_dataset *ds = calloc(1, sizeof *ds);
  hs_shard *shards = ds ? calloc((size_t)n, sizeof *shards) : NULL;
  if (!shards) {
    free(ds);
    free_list(paths, n);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory opening %s", path);
  }
  ds->shards = shards;
  ds->nshards = n;
  for (int i = 0; i < n; i++) shards[i].path = paths[i]; // the shards own the strings now
  free(paths);
  hs_quiet q;
  hs_quiet_begin(&q);
  df_status st = open_all(ds, path, err);
  hs_quiet_end(&q);
  if (st != DF_OK) {
    df_hs_close(ds);
    return st;
  }
  *out = ds;
  return DF_OK;
}

// The shard holding global sample i (the last shard starting at or before i, which skips empty shards).
static const hs_shard *locate(const df_hs_dataset *ds, int64_t i, int64_t *local) {
  int lo = 0, hi = ds->nshards - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (ds->shards[mid].first <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  *local = i - ds->shards[lo].first;
  return &ds->shards[lo];
}

void df_hs_shard(const df_hs_dataset *ds, int k, const char **path, int64_t *first, int64_t *count) {
  const hs_shard *s = &ds->shards[k];
  if (path) *path = s->path;
  if (first) *first = s->first;
  if (count) *count = s->n;
}

int df_hs_shard_of(const df_hs_dataset *ds, int64_t i, int64_t *local) {
  const hs_shard *s = locate(ds, i, local);
  return (int)(s - ds->shards);
}

static df_status check_index_arg(const df_hs_dataset *ds, int64_t i, df_error *err) {
  if (i < 0 || i >= ds->info.num_samples)
    return DF_FAIL(err, DF_ERR_INVALID, "sample", "sample numbers run from 0 to N - 1 across all shards",
                   "sample %lld is out of range: the data has %lld samples", (long long)i,
                   (long long)ds->info.num_samples);
  return DF_OK;
}

df_status df_hs_sample_length(const df_hs_dataset *ds, int64_t i, int64_t *len, df_error *err) {
  DF_TRY(check_index_arg(ds, i, err));
  int64_t j;
  const hs_shard *s = locate(ds, i, &j);
  *len = s->offsets[j + 1] - s->offsets[j];
  return DF_OK;
}

// Reads rows [r0, r0 + n) of dataset d (1-D, or 2-D of width w) into buf as memory type mt.
static herr_t read_rows(hid_t d, int64_t r0, int64_t n, int64_t w, hid_t mt, void *buf) {
  int rank = w > 0 ? 2 : 1;
  hsize_t start[2] = {(hsize_t)r0, 0}, count[2] = {(hsize_t)n, (hsize_t)w};
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(rank, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (rc >= 0) rc = H5Dread(d, mt, ms, fs, H5P_DEFAULT, buf);
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  return rc;
}

// The bf16 bits were read into the first half of buf; widen back to front so nothing is overwritten unread.
static void bf16_widen_in_place(void *buf, int64_t n) {
  unsigned char *b = buf;
  for (int64_t i = n - 1; i >= 0; i--) {
    uint16_t h;
    memcpy(&h, b + 2 * i, sizeof h);
    float f = df_hs_bf16_to_f32(h);
    memcpy(b + 4 * i, &f, sizeof f);
  }
}

static herr_t read_float_rows(hid_t d, df_dtype dt, int64_t r0, int64_t n, int64_t w, float *buf) {
  if (dt == DF_F32) return read_rows(d, r0, n, w, H5T_NATIVE_FLOAT, buf);
  herr_t rc = read_rows(d, r0, n, w, H5T_NATIVE_UINT16, buf);
  if (rc >= 0) bf16_widen_in_place(buf, n * w);
  return rc;
}

static df_status read_parts(const df_hs_dataset *ds, const hs_shard *s, int64_t j, int64_t r0, int64_t n,
                            const df_hs_sample_bufs *b, df_error *err) {
  const df_hs_info *in = &ds->info;
  const char *failed = NULL;
  if (b->input_ids && read_rows(s->d_ids, r0, n, 0, H5T_NATIVE_INT32, b->input_ids) < 0)
    failed = DF_HS_DS_INPUT_IDS;
  else if (b->loss_mask && read_rows(s->d_mask, r0, n, 0, H5T_NATIVE_UINT8, b->loss_mask) < 0)
    failed = DF_HS_DS_LOSS_MASK;
  else if (b->hidden && read_float_rows(s->d_hidden, in->dtype, r0, n, in->num_layers * in->hidden_size, b->hidden) < 0)
    failed = DF_HS_DS_HIDDEN;
  else if (b->last_hidden && read_float_rows(s->d_last, in->dtype, r0, n, in->hidden_size, b->last_hidden) < 0)
    failed = DF_HS_DS_LAST_HIDDEN;
  if (!failed) return DF_OK;
  char what[128];
  snprintf(what, sizeof what, "cannot read sample %lld (rows %lld..%lld of this shard)", (long long)j, (long long)r0,
           (long long)(r0 + n));
  return hs_h5_fail(err, DF_ERR_IO, s->path, failed, "the file may be truncated or corrupt", what);
}

df_status df_hs_read_sample(df_hs_dataset *ds, int64_t i, int64_t max_len, const df_hs_sample_bufs *bufs,
                            int64_t *out_len, df_error *err) {
  DF_TRY(check_index_arg(ds, i, err));
  if (bufs->last_hidden && !ds->info.has_last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, DF_HS_DS_LAST_HIDDEN,
                   "DSpark needs data captured with the target's final hidden state; recapture or import it",
                   "the data has no target_last_hidden_states, but the caller asked for them");
  int64_t j;
  const hs_shard *s = locate(ds, i, &j);
  int64_t r0 = s->offsets[j], n = s->offsets[j + 1] - r0;
  if (max_len > 0 && n > max_len) n = max_len;
  hs_quiet q;
  hs_quiet_begin(&q);
  df_status st = read_parts(ds, s, j, r0, n, bufs, err);
  hs_quiet_end(&q);
  if (st == DF_OK && out_len) *out_len = n;
  return st;
}

static void int_ids_str(char *buf, size_t n, const int *ids, int k) {
  int64_t tmp[DF_HS_MAX_LAYERS];
  for (int j = 0; j < k && j < DF_HS_MAX_LAYERS; j++) tmp[j] = ids[j];
  ids_str(buf, n, tmp, k < DF_HS_MAX_LAYERS ? k : DF_HS_MAX_LAYERS);
}

df_status df_hs_check_target(const df_hs_dataset *ds, int expected_k, const int *expected_layer_ids, int64_t expected_h,
                             df_error *err) {
  const df_hs_info *in = &ds->info;
  const char *hint = "the data was captured for another draft config; recapture with this config's target_layer_ids "
                     "or train the config the data was made for";
  const char *f = ds->shards[0].path;
  if (expected_k != in->num_layers)
    return DF_FAIL(err, DF_ERR_INVALID, DF_HS_ATTR_LAYER_IDS, hint,
                   "number of target layers K differs: draft config has %d, data %s has %d", expected_k, f,
                   in->num_layers);
  for (int j = 0; j < expected_k; j++)
    if (expected_layer_ids[j] != in->target_layer_ids[j]) {
      char x[512], y[512];
      int_ids_str(x, sizeof x, expected_layer_ids, expected_k);
      int_ids_str(y, sizeof y, in->target_layer_ids, in->num_layers);
      return DF_FAIL(err, DF_ERR_INVALID, DF_HS_ATTR_LAYER_IDS, hint,
                     "target_layer_ids differ at entry %d: draft config has %s, data %s has %s", j, x, f, y);
    }
  if (expected_h != in->hidden_size)
    return DF_FAIL(err, DF_ERR_INVALID, DF_HS_ATTR_HIDDEN_SIZE, hint,
                   "hidden_size H differs: draft config has %lld, data %s has %lld", (long long)expected_h, f,
                   (long long)in->hidden_size);
  return DF_OK;
}

static void print_lengths(FILE *out, const hs_shard *s) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t j = 0; j < s->n; j++) {
    int64_t l = s->offsets[j + 1] - s->offsets[j];
    lo = l < lo ? l : lo;
    hi = l > hi ? l : hi;
  }
  if (s->n) fprintf(out, "  lengths %lld..%lld", (long long)lo, (long long)hi);
}

df_status df_hs_print(const char *path, FILE *out, df_error *err) {
  df_hs_dataset *ds;
  DF_TRY(df_hs_open(path, &ds, err));
  const df_hs_info *in = &ds->info;
  char ids[1024];
  int_ids_str(ids, sizeof ids, in->target_layer_ids, in->num_layers);
  fprintf(out, "path: %s\nformat: %s version %d\ndtype: %s\nhidden_size (H): %lld\n", path, DF_HS_FORMAT, DF_HS_VERSION,
          in->dtype == DF_BF16 ? "bfloat16" : "float32", (long long)in->hidden_size);
  fprintf(out, "target_layer_ids (K = %d): %s\nhidden_states width (K*H): %lld\n", in->num_layers, ids,
          (long long)in->num_layers * in->hidden_size);
  fprintf(out, "layer_id_convention: %s\n",
          in->has_convention ? DF_HS_CONVENTION " (id L = output of decoder layer L)"
                             : "absent (a shard older than the attribute; read as " DF_HS_CONVENTION ")");
  fprintf(out, "target_last_hidden_states: %s\n", in->has_last_hidden ? "yes" : "no");
  fprintf(out, "samples: %lld\ntokens: %lld\nshards: %d\n", (long long)in->num_samples, (long long)in->num_tokens,
          in->num_shards);
  for (int i = 0; i < ds->nshards; i++) {
    const hs_shard *s = &ds->shards[i];
    fprintf(out, "  %s: samples %lld (from #%lld), tokens %lld", s->path, (long long)s->n, (long long)s->first,
            (long long)s->t);
    print_lengths(out, s);
    fputc('\n', out);
  }
  df_hs_close(ds);
  return DF_OK;
}
