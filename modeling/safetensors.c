// The validating safetensors reader. A file is accepted only if it passes every rule HF's reference
// implementation enforces; the checks run before any tensor is handed out:
//   - at least 8 bytes; header length N ≤ 100 MB and 8 + N ≤ file size; header starts with '{';
//   - header is UTF-8 JSON (jansson), an object, without duplicate keys;
//   - __metadata__ (optional) maps strings to strings; every other entry has exactly dtype, shape and
//     data_offsets; dtype known; shape a list of ≤ DF_ST_MAX_DIMS non-negative integers (overflow-checked);
//     numel × dtype size == end − begin; 0 ≤ begin ≤ end ≤ data region size;
//   - sorted by offset, the tensors tile the data region exactly: no overlap, no gap, no trailing bytes
//     (HF's InvalidOffset / MetadataIncompleteBuffer).
#include "modeling/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian; so must the host be");

struct df_st_file {
  char *path; // path or label, for errors
  const unsigned char *base;
  size_t size;
  bool mapped;
  const unsigned char *data; // data region: base + 8 + N
  uint64_t data_size;
  df_st_tensor *t; // ascending data offset
  int n;
  const df_st_tensor **by_name; // into t, sorted by name
  char **meta;                  // key, value, key, value, ...
  int n_meta;
};

const char *df_st_where(char *buf, size_t n, const char *file, const char *tensor) {
  if (tensor)
    snprintf(buf, n, "%s: %s", file ? file : "", tensor);
  else
    snprintf(buf, n, "%s", file ? file : "");
  return buf;
}

// Fills err with where = "<file>: <tensor>".
__attribute__((format(printf, 7, 8))) static df_status st_fail(df_error *err, df_status st, int line, const char *file,
                                                               const char *tensor, const char *hint, const char *fmt,
                                                               ...) {
  char msg[sizeof err->msg], where[sizeof err->where];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return df_fail(err, st, __FILE__, line, df_st_where(where, sizeof where, file, tensor), hint, "%s", msg);
}
#define ST_FAIL(err, st, file, tensor, hint, ...) st_fail((err), (st), __LINE__, (file), (tensor), (hint), __VA_ARGS__)

static const char *const HINT_REWRITE = "the file is not a valid safetensors file; re-export it with the "
                                        "`safetensors` package (save_file) or draftforge";

// ---- one header entry -------------------------------------------------------------------------------------

static df_status parse_dtype(const df_st_file *f, const char *name, json_t *v, df_st_tensor *t, df_error *err) {
  if (!json_is_string(v))
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE, "tensor '%s': \"dtype\" must be a string", name);
  const char *s = json_string_value(v);
  if (df_st_dtype_from_name(s, &t->dtype)) return DF_OK;
  if (!strcmp(s, "F4") || !strncmp(s, "F6_", 3) || !strcmp(s, "C64"))
    return ST_FAIL(err, DF_ERR_UNSUPPORTED, f->path, name, "convert the tensor to BF16, F16 or F32 before loading",
                   "tensor '%s': dtype %s is not supported by draftforge", name, s);
  return ST_FAIL(err, DF_ERR_FORMAT, f->path, name,
                 "known dtypes: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 F8_E8M0 I64 I32 I16 I8 U64 U32 U16 U8 BOOL",
                 "tensor '%s': unknown dtype \"%.64s\"", name, s);
}

static df_status parse_shape(const df_st_file *f, const char *name, json_t *v, df_st_tensor *t, df_error *err) {
  if (!json_is_array(v))
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE, "tensor '%s': \"shape\" must be a list", name);
  size_t nd = json_array_size(v);
  if (nd > DF_ST_MAX_DIMS)
    return ST_FAIL(err, DF_ERR_UNSUPPORTED, f->path, name, "reshape the tensor to at most 8 dimensions",
                   "tensor '%s': %zu dimensions (draftforge reads at most %d)", name, nd, DF_ST_MAX_DIMS);
  t->ndim = (int)nd;
  t->numel = 1;
  for (size_t i = 0; i < nd; i++) {
    json_t *d = json_array_get(v, i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE,
                     "tensor '%s': shape[%zu] must be a non-negative integer", name, i);
    t->shape[i] = (int64_t)json_integer_value(d);
    if (t->shape[i] != 0 && t->numel > INT64_MAX / t->shape[i])
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE, "tensor '%s': element count overflows", name);
    t->numel *= t->shape[i];
  }
  return DF_OK;
}

static df_status parse_offsets(const df_st_file *f, const char *name, json_t *v, df_st_tensor *t, df_error *err) {
  if (!json_is_array(v) || json_array_size(v) != 2)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE,
                   "tensor '%s': \"data_offsets\" must be a list [begin, end]", name);
  json_t *b = json_array_get(v, 0), *e = json_array_get(v, 1);
  if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 || json_integer_value(e) < 0)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE,
                   "tensor '%s': data_offsets must be non-negative integers", name);
  t->begin = (uint64_t)json_integer_value(b);
  t->end = (uint64_t)json_integer_value(e);
  if (t->begin > t->end || t->end > f->data_size)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, "the file may be truncated; re-download or re-export it",
                   "tensor '%s': data_offsets [%llu, %llu] lie outside the data region (%llu bytes)", name,
                   (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)f->data_size);
  uint64_t esz = df_st_dtype_size(t->dtype);
  if ((uint64_t)t->numel > UINT64_MAX / esz || (uint64_t)t->numel * esz != t->end - t->begin)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE,
                   "tensor '%s': %s with %lld elements needs %llu bytes but data_offsets span %llu", name,
                   df_st_dtype_name(t->dtype), (long long)t->numel, (unsigned long long)((uint64_t)t->numel * esz),
                   (unsigned long long)(t->end - t->begin));
  return DF_OK;
}

static df_status parse_entry(const df_st_file *f, const char *name, json_t *v, df_st_tensor *t, df_error *err) {
  if (!json_is_object(v))
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE, "tensor '%s': entry must be an object", name);
  const char *key;
  json_t *val;
  json_object_foreach(v, key, val) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, "an entry has exactly dtype, shape and data_offsets",
                     "tensor '%s': unknown field \"%.64s\"", name, key);
  }
  static const char *const fields[] = {"dtype", "shape", "data_offsets"};
  for (int i = 0; i < 3; i++)
    if (!json_object_get(v, fields[i]))
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, name, HINT_REWRITE, "tensor '%s': missing field \"%s\"", name,
                     fields[i]);
  DF_TRY(parse_dtype(f, name, json_object_get(v, "dtype"), t, err));
  DF_TRY(parse_shape(f, name, json_object_get(v, "shape"), t, err));
  return parse_offsets(f, name, json_object_get(v, "data_offsets"), t, err);
}

static df_status parse_metadata(df_st_file *f, json_t *v, df_error *err) {
  if (json_is_null(v)) return DF_OK;
  if (!json_is_object(v))
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, "__metadata__", HINT_REWRITE, "__metadata__ must be an object");
  f->meta = calloc(2 * json_object_size(v) + 1, sizeof *f->meta);
  if (!f->meta) return ST_FAIL(err, DF_ERR_NOMEM, f->path, "__metadata__", NULL, "out of memory");
  const char *key;
  json_t *val;
  json_object_foreach(v, key, val) {
    if (!json_is_string(val))
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, "__metadata__", "metadata values are strings",
                     "__metadata__ value of \"%.64s\" must be a string", key);
    f->meta[2 * f->n_meta] = strdup(key);
    f->meta[2 * f->n_meta + 1] = strdup(json_string_value(val));
    f->n_meta++;
    if (!f->meta[2 * f->n_meta - 2] || !f->meta[2 * f->n_meta - 1])
      return ST_FAIL(err, DF_ERR_NOMEM, f->path, "__metadata__", NULL, "out of memory");
  }
  return DF_OK;
}

// ---- whole-file rules -----------------------------------------------------------------------------------

static int cmp_offsets(const void *pa, const void *pb) {
  const df_st_tensor *a = pa, *b = pb;
  if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
  if (a->end != b->end) return a->end < b->end ? -1 : 1;
  return strcmp(a->name, b->name);
}

// Sorted by offset, tensors must tile [0, data_size) exactly (HF rejects gaps as InvalidOffset).
static df_status check_tiling(df_st_file *f, df_error *err) {
  qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_offsets);
  uint64_t expect = 0;
  for (int i = 0; i < f->n; i++) {
    const df_st_tensor *t = &f->t[i];
    if (t->begin < expect)
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, t->name, HINT_REWRITE,
                     "tensor '%s' [%llu, %llu) overlaps tensor '%s' (which ends at byte %llu)", t->name,
                     (unsigned long long)t->begin, (unsigned long long)t->end, f->t[i - 1].name,
                     (unsigned long long)expect);
    if (t->begin > expect)
      return ST_FAIL(err, DF_ERR_FORMAT, f->path, t->name, "safetensors files have no gaps between tensors",
                     "gap: data bytes [%llu, %llu) before tensor '%s' belong to no tensor", (unsigned long long)expect,
                     (unsigned long long)t->begin, t->name);
    expect = t->end;
  }
  if (expect != f->data_size)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, f->n ? f->t[f->n - 1].name : NULL,
                   "the file has trailing bytes or was written incompletely",
                   "the data region has %llu bytes but the tensors cover only %llu (last tensor '%s')",
                   (unsigned long long)f->data_size, (unsigned long long)expect, f->n ? f->t[f->n - 1].name : "");
  return DF_OK;
}

static int cmp_by_name(const void *pa, const void *pb) {
  return strcmp((*(const df_st_tensor *const *)pa)->name, (*(const df_st_tensor *const *)pb)->name);
}

static df_status build_name_index(df_st_file *f, df_error *err) {
  f->by_name = malloc(sizeof *f->by_name * (size_t)(f->n + 1));
  if (!f->by_name) return ST_FAIL(err, DF_ERR_NOMEM, f->path, NULL, NULL, "out of memory");
  for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
  qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
  return DF_OK;
}

// A JSON error with its line and column; a duplicate key also names the tensor.
static df_status json_fail(const df_st_file *f, const json_error_t *jerr, df_error *err) {
  char key[160] = "";
  const char *q = strchr(jerr->text, '"'), *r = strrchr(jerr->text, '"');
  if (json_error_code(jerr) == json_error_duplicate_key && q && r > q)
    snprintf(key, sizeof key, "%.*s", (int)(r - q - 1), q + 1);
  return ST_FAIL(err, DF_ERR_FORMAT, f->path, key[0] ? key : NULL, HINT_REWRITE,
                 "bad header JSON at line %d, column %d: %s", jerr->line, jerr->column, jerr->text);
}

static df_status parse_header(df_st_file *f, const char *hdr, size_t hlen, df_error *err) {
  json_error_t jerr;
  json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) return json_fail(f, &jerr, err);
  df_status st = DF_OK;
  if (!json_is_object(root)) {
    st = ST_FAIL(err, DF_ERR_FORMAT, f->path, NULL, HINT_REWRITE, "the header must be a JSON object");
    goto done;
  }
  f->t = calloc(json_object_size(root) + 1, sizeof *f->t);
  if (!f->t) {
    st = ST_FAIL(err, DF_ERR_NOMEM, f->path, NULL, NULL, "out of memory");
    goto done;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) {
      if ((st = parse_metadata(f, val, err)) != DF_OK) goto done;
      continue;
    }
    df_st_tensor *t = &f->t[f->n];
    if ((st = parse_entry(f, key, val, t, err)) != DF_OK) goto done;
    if (!(t->name = strdup(key))) {
      st = ST_FAIL(err, DF_ERR_NOMEM, f->path, key, NULL, "out of memory");
      goto done;
    }
    f->n++;
  }
  if ((st = check_tiling(f, err)) == DF_OK) st = build_name_index(f, err);
done:
  json_decref(root);
  return st;
}

static df_status parse_file(df_st_file *f, df_error *err) {
  if (f->size < 8)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, NULL, "the file is truncated or not a safetensors file",
                   "file is %zu bytes, shorter than the 8-byte header length", f->size);
  uint64_t hlen = 0;
  memcpy(&hlen, f->base, 8);
  if (hlen > DF_ST_MAX_HEADER_BYTES)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, NULL, "the file is corrupt or not a safetensors file",
                   "header length %llu exceeds the 100 MB limit", (unsigned long long)hlen);
  if (hlen > f->size - 8)
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, NULL, "the file is truncated; re-download or re-export it",
                   "header length %llu goes beyond the end of the file (%zu bytes)", (unsigned long long)hlen, f->size);
  const char *hdr = (const char *)f->base + 8;
  if (hlen == 0 || hdr[0] != '{')
    return ST_FAIL(err, DF_ERR_FORMAT, f->path, NULL, HINT_REWRITE, "the header does not start with '{'");
  f->data = f->base + 8 + hlen;
  f->data_size = f->size - 8 - hlen;
  return parse_header(f, hdr, (size_t)hlen, err);
}

// ---- open / close -----------------------------------------------------------------------------------------

static df_st_file *file_new(const char *label) {
  df_st_file *f = calloc(1, sizeof *f);
  if (f && !(f->path = strdup(label ? label : "<memory>"))) {
    free(f);
    f = NULL;
  }
  return f;
}

static df_status finish_open(df_st_file *f, df_st_file **out, df_error *err) {
  df_status st = parse_file(f, err);
  if (st != DF_OK) {
    df_st_close(f);
    return st;
  }
  *out = f;
  return DF_OK;
}

df_status df_st_open_memory(const void *buf, size_t len, const char *label, df_st_file **out, df_error *err) {
  *out = NULL;
  if (!buf && len) return ST_FAIL(err, DF_ERR_INVALID, label, NULL, NULL, "NULL buffer");
  df_st_file *f = file_new(label);
  if (!f) return ST_FAIL(err, DF_ERR_NOMEM, label, NULL, NULL, "out of memory");
  f->base = buf;
  f->size = len;
  return finish_open(f, out, err);
}

df_status df_st_open(const char *path, df_st_file **out, df_error *err) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ST_FAIL(err, DF_ERR_IO, path, NULL, "check the path and its permissions", "cannot open: %s",
                   strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return ST_FAIL(err, DF_ERR_IO, path, NULL, "pass a .safetensors file", "not a regular file");
  }
  df_st_file *f = file_new(path);
  if (!f) {
    close(fd);
    return ST_FAIL(err, DF_ERR_NOMEM, path, NULL, NULL, "out of memory");
  }
  f->size = (size_t)sb.st_size;
  if (f->size >= 8) {
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      df_st_close(f);
      return ST_FAIL(err, DF_ERR_IO, path, NULL, NULL, "mmap failed: %s", strerror(e));
    }
    f->base = p;
    f->mapped = true;
  }
  close(fd); // the mapping keeps the file alive
  return finish_open(f, out, err);
}

void df_st_close(df_st_file *f) {
  if (!f) return;
  if (f->mapped) munmap((void *)f->base, f->size);
  for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
  for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
  free(f->meta);
  free(f->t);
  free(f->by_name);
  free(f->path);
  free(f);
}

// ---- access -----------------------------------------------------------------------------------------------

const char *df_st_path(const df_st_file *f) { return f->path; }
int df_st_count(const df_st_file *f) { return f->n; }
uint64_t df_st_data_size(const df_st_file *f) { return f->data_size; }
const df_st_tensor *df_st_at(const df_st_file *f, int i) { return i >= 0 && i < f->n ? &f->t[i] : NULL; }
const void *df_st_data(const df_st_file *f, const df_st_tensor *t) { return f->data + t->begin; }
int df_st_metadata_count(const df_st_file *f) { return f->n_meta; }

const df_st_tensor *df_st_find(const df_st_file *f, const char *name) {
  int lo = 0, hi = f->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(name, f->by_name[mid]->name);
    if (c == 0) return f->by_name[mid];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

void df_st_metadata_at(const df_st_file *f, int i, const char **key, const char **value) {
  bool ok = i >= 0 && i < f->n_meta;
  if (key) *key = ok ? f->meta[2 * i] : NULL;
  if (value) *value = ok ? f->meta[2 * i + 1] : NULL;
}

const char *df_st_metadata_get(const df_st_file *f, const char *key) {
  for (int i = 0; i < f->n_meta; i++)
    if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
  return NULL;
}

df_status df_st_read_f32(const df_st_file *f, const df_st_tensor *t, float *dst, int64_t n, df_error *err) {
  if (n != t->numel)
    return ST_FAIL(err, DF_ERR_INVALID, f->path, t->name, "size the buffer from the tensor's shape",
                   "tensor '%s' has %lld elements, the destination %lld", t->name, (long long)t->numel, (long long)n);
  if (n) df_st_convert_to_f32(t->dtype, df_st_data(f, t), dst, n);
  return DF_OK;
}

df_status df_st_read_raw(const df_st_file *f, const df_st_tensor *t, void *dst, size_t nbytes, df_error *err) {
  if (nbytes != t->end - t->begin)
    return ST_FAIL(err, DF_ERR_INVALID, f->path, t->name, "size the buffer from the tensor's shape and dtype",
                   "tensor '%s' has %llu bytes, the destination %zu", t->name, (unsigned long long)(t->end - t->begin),
                   nbytes);
  if (nbytes) memcpy(dst, df_st_data(f, t), nbytes);
  return DF_OK;
}

const char *df_st_shape_str(const df_st_tensor *t, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  if (off < n) snprintf(buf + off, n - off, "]");
  return buf;
}
