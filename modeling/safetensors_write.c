// The safetensors writer: collects borrowed tensors and metadata, then writes the file atomically
// (temporary name, fsync, rename, fsync of the directory), so no reader ever sees half a file.
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "modeling/safetensors.h"

typedef struct {
  char *name;
  df_st_dtype dtype;
  int ndim;
  int64_t shape[DF_ST_MAX_DIMS];
  int64_t numel;
  const void *data;
  bool from_f32; // data is fp32, converted to dtype while writing
  int order;     // insertion order, the tie-break of the layout sort
  uint64_t begin;
} st_wentry;

struct df_st_writer {
  st_wentry *e;
  int n, cap;
  json_t *meta; // string → string, insertion-ordered
};

df_status df_st_writer_new(df_st_writer **out, df_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out || !((*out)->meta = json_object())) {
    free(*out);
    *out = NULL;
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "out of memory");
  }
  return DF_OK;
}

void df_st_writer_free(df_st_writer *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) free(w->e[i].name);
  free(w->e);
  json_decref(w->meta);
  free(w);
}

static df_status add_entry(df_st_writer *w, const char *name, df_st_dtype dt, int ndim, const int64_t *shape,
                           const void *data, bool from_f32, df_error *err) {
  if (!name || !name[0] || !strcmp(name, "__metadata__"))
    return DF_FAIL(err, DF_ERR_INVALID, name ? name : "", "give every tensor a non-empty name",
                   "invalid tensor name \"%s\"", name ? name : "(null)");
  json_t *probe = json_string(name); // jansson refuses what the header could not hold (invalid UTF-8)
  if (!probe) return DF_FAIL(err, DF_ERR_INVALID, NULL, "tensor names are UTF-8 text", "tensor name is not UTF-8");
  json_decref(probe);
  if ((unsigned)dt >= DF_ST_NUM_DTYPES)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s': invalid dtype %d", name, (int)dt);
  if (ndim < 0 || ndim > DF_ST_MAX_DIMS)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s': %d dimensions (0..%d allowed)", name, ndim,
                   DF_ST_MAX_DIMS);
  st_wentry e = {.dtype = dt, .ndim = ndim, .numel = 1, .data = data, .from_f32 = from_f32, .order = w->n};
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && e.numel > INT64_MAX / 8 / shape[i]))
      return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s': bad dimension %d = %lld", name, i,
                     (long long)shape[i]);
    e.shape[i] = shape[i];
    e.numel *= shape[i];
  }
  if (!data && e.numel)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s': NULL data for %lld elements", name,
                   (long long)e.numel);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    st_wentry *p = realloc(w->e, sizeof *p * (size_t)cap);
    if (!p) return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "out of memory");
    w->e = p;
    w->cap = cap;
  }
  if (!(e.name = strdup(name))) return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "out of memory");
  w->e[w->n++] = e;
  return DF_OK;
}

df_status df_st_writer_add(df_st_writer *w, const char *name, df_st_dtype dt, int ndim, const int64_t *shape,
                           const void *data, df_error *err) {
  return add_entry(w, name, dt, ndim, shape, data, false, err);
}

df_status df_st_writer_add_f32_as(df_st_writer *w, const char *name, df_st_dtype dt, int ndim, const int64_t *shape,
                                  const float *src, df_error *err) {
  if (dt != DF_ST_F32 && dt != DF_ST_F16 && dt != DF_ST_BF16 && dt != DF_ST_F64)
    return DF_FAIL(err, DF_ERR_INVALID, name, "store fp32 values as F32, F16, BF16 or F64",
                   "tensor '%s': cannot store fp32 values as %s", name, df_st_dtype_name(dt));
  return add_entry(w, name, dt, ndim, shape, src, true, err);
}

df_status df_st_writer_set_metadata(df_st_writer *w, const char *key, const char *value, df_error *err) {
  json_t *v = json_string(value);
  if (!v || json_object_set_new(w->meta, key, v) != 0)
    return DF_FAIL(err, DF_ERR_INVALID, key, "metadata keys and values are UTF-8 strings", "cannot set metadata \"%s\"",
                   key);
  return DF_OK;
}

// ---- layout and header ------------------------------------------------------------------------------------

static int cmp_layout(const void *pa, const void *pb) {
  const st_wentry *a = *(st_wentry *const *)pa, *b = *(st_wentry *const *)pb;
  size_t sa = df_st_dtype_size(a->dtype), sb = df_st_dtype_size(b->dtype);
  if (sa != sb) return sa > sb ? -1 : 1;
  return a->order - b->order;
}

static int cmp_name(const void *pa, const void *pb) {
  return strcmp((*(st_wentry *const *)pa)->name, (*(st_wentry *const *)pb)->name);
}

// Orders entries by element size (largest first, stable) and assigns offsets; rejects duplicate names.
static df_status plan_layout(const df_st_writer *w, st_wentry **order, const char *path, df_error *err) {
  for (int i = 0; i < w->n; i++) order[i] = &w->e[i];
  qsort(order, (size_t)w->n, sizeof *order, cmp_name);
  char where[256];
  for (int i = 1; i < w->n; i++)
    if (!strcmp(order[i]->name, order[i - 1]->name))
      return DF_FAIL(err, DF_ERR_INVALID, df_st_where(where, sizeof where, path, order[i]->name),
                     "tensor names must be unique", "tensor '%s' was added twice", order[i]->name);
  qsort(order, (size_t)w->n, sizeof *order, cmp_layout);
  uint64_t off = 0;
  for (int i = 0; i < w->n; i++) {
    order[i]->begin = off;
    off += (uint64_t)order[i]->numel * df_st_dtype_size(order[i]->dtype);
  }
  return DF_OK;
}

static json_t *entry_json(const st_wentry *e) {
  json_t *shape = json_array(), *obj = json_object();
  for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
  uint64_t end = e->begin + (uint64_t)e->numel * df_st_dtype_size(e->dtype);
  json_object_set_new(obj, "dtype", json_string(df_st_dtype_name(e->dtype)));
  json_object_set_new(obj, "shape", shape);
  json_object_set_new(obj, "data_offsets", json_pack("[II]", (json_int_t)e->begin, (json_int_t)end));
  return obj;
}

// The header text padded with spaces so the data starts 8-byte aligned, as HF writes it.
static df_status build_header(const df_st_writer *w, st_wentry **order, char **out, size_t *len, df_error *err) {
  json_t *root = json_object();
  int bad = !root || (json_object_size(w->meta) && json_object_set(root, "__metadata__", w->meta));
  for (int i = 0; i < w->n && !bad; i++) bad = json_object_set_new(root, order[i]->name, entry_json(order[i]));
  char *s = bad ? NULL : json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!s) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot serialise the safetensors header");
  size_t n = strlen(s), padded = (n + 7) / 8 * 8;
  char *p = realloc(s, padded + 1);
  if (!p) {
    free(s);
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "out of memory");
  }
  memset(p + n, ' ', padded - n);
  p[padded] = 0;
  *out = p;
  *len = padded;
  return DF_OK;
}

// ---- the atomic write -------------------------------------------------------------------------------------

static df_status write_all(int fd, const void *buf, size_t n, const char *path, df_error *err) {
  const char *p = buf;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return DF_FAIL(err, DF_ERR_IO, path, "check free disk space and permissions", "write failed: %s",
                     strerror(k < 0 ? errno : EIO));
    p += k;
    n -= (size_t)k;
  }
  return DF_OK;
}

static df_status write_tensor(int fd, const st_wentry *e, const char *path, df_error *err) {
  size_t esz = df_st_dtype_size(e->dtype);
  if (!e->from_f32 || e->dtype == DF_ST_F32) return write_all(fd, e->data, (size_t)e->numel * esz, path, err);
  enum { CHUNK = 4096 };
  unsigned char buf[CHUNK * 8];
  const float *src = e->data;
  for (int64_t i = 0; i < e->numel; i += CHUNK) {
    int64_t k = e->numel - i < CHUNK ? e->numel - i : CHUNK;
    df_st_convert_from_f32(e->dtype, src + i, buf, k);
    DF_TRY(write_all(fd, buf, (size_t)k * esz, path, err));
  }
  return DF_OK;
}

static df_status write_body(int fd, const df_st_writer *w, st_wentry **order, const char *hdr, size_t hlen,
                            const char *path, df_error *err) {
  uint64_t n = hlen;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
  DF_TRY(write_all(fd, le, 8, path, err));
  DF_TRY(write_all(fd, hdr, hlen, path, err));
  for (int i = 0; i < w->n; i++) DF_TRY(write_tensor(fd, order[i], path, err));
  if (fsync(fd) != 0) return DF_FAIL(err, DF_ERR_IO, path, NULL, "fsync failed: %s", strerror(errno));
  return DF_OK;
}

// Makes the rename durable: fsync the directory that holds path.
static void fsync_parent(const char *path) {
  char *copy = strdup(path);
  if (!copy) return;
  int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  free(copy);
}

static df_status write_to_tmp_and_rename(const df_st_writer *w, st_wentry **order, const char *hdr, size_t hlen,
                                         const char *path, df_error *err) {
  size_t tn = strlen(path) + 32;
  char *tmp = malloc(tn);
  if (!tmp) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  snprintf(tmp, tn, "%s.tmp.%ld", path, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  df_status st = DF_OK;
  if (fd < 0) {
    st = DF_FAIL(err, DF_ERR_IO, tmp, "check that the directory exists and is writable", "cannot create: %s",
                 strerror(errno));
  } else {
    st = write_body(fd, w, order, hdr, hlen, tmp, err);
    if (close(fd) != 0 && st == DF_OK) st = DF_FAIL(err, DF_ERR_IO, tmp, NULL, "close failed: %s", strerror(errno));
    if (st == DF_OK && rename(tmp, path) != 0)
      st = DF_FAIL(err, DF_ERR_IO, path, NULL, "cannot rename %s over it: %s", tmp, strerror(errno));
    if (st != DF_OK)
      unlink(tmp);
    else
      fsync_parent(path);
  }
  free(tmp);
  return st;
}

df_status df_st_writer_write(const df_st_writer *w, const char *path, df_error *err) {
  st_wentry **order = malloc(sizeof *order * (size_t)(w->n + 1));
  if (!order) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  char *hdr = NULL;
  size_t hlen = 0;
  df_status st = plan_layout(w, order, path, err);
  if (st == DF_OK) st = build_header(w, order, &hdr, &hlen, err);
  if (st == DF_OK && hlen > DF_ST_MAX_HEADER_BYTES)
    st = DF_FAIL(err, DF_ERR_INVALID, path, "split the tensors over several shards",
                 "header of %zu bytes exceeds the 100 MB limit", hlen);
  if (st == DF_OK) st = write_to_tmp_and_rename(w, order, hdr, hlen, path, err);
  free(hdr);
  free(order);
  return st;
}
