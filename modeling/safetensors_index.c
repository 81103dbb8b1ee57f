// Models on disk: one model.safetensors or the shards a model.safetensors.index.json names, checked for
// agreement both ways (every indexed tensor is in its shard; every shard tensor is indexed there).
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "modeling/safetensors.h"

typedef struct {
  const df_st_tensor *t;
  int shard;
} st_mentry;

struct df_st_model {
  char *path;
  df_st_file **shards;
  int n_shards;
  st_mentry *e; // shards in order, file order within each
  int n;
  st_mentry **by_name;
};

void df_st_model_close(df_st_model *m) {
  if (!m) return;
  for (int i = 0; i < m->n_shards; i++) df_st_close(m->shards[i]);
  free(m->shards);
  free(m->e);
  free(m->by_name);
  free(m->path);
  free(m);
}

static int cmp_entry_name(const void *pa, const void *pb) {
  return strcmp((*(st_mentry *const *)pa)->t->name, (*(st_mentry *const *)pb)->t->name);
}

// Lists every shard's tensors and sorts the name index; a name in two shards is an error.
static df_status model_index(df_st_model *m, df_error *err) {
  int total = 0;
  for (int s = 0; s < m->n_shards; s++) total += df_st_count(m->shards[s]);
  m->e = malloc(sizeof *m->e * (size_t)(total + 1));
  m->by_name = malloc(sizeof *m->by_name * (size_t)(total + 1));
  if (!m->e || !m->by_name) return DF_FAIL(err, DF_ERR_NOMEM, m->path, NULL, "out of memory");
  for (int s = 0; s < m->n_shards; s++)
    for (int i = 0; i < df_st_count(m->shards[s]); i++) m->e[m->n++] = (st_mentry){df_st_at(m->shards[s], i), s};
  for (int i = 0; i < m->n; i++) m->by_name[i] = &m->e[i];
  qsort(m->by_name, (size_t)m->n, sizeof *m->by_name, cmp_entry_name);
  char where[256];
  for (int i = 1; i < m->n; i++)
    if (!strcmp(m->by_name[i]->t->name, m->by_name[i - 1]->t->name))
      return DF_FAIL(
          err, DF_ERR_FORMAT,
          df_st_where(where, sizeof where, df_st_path(m->shards[m->by_name[i]->shard]), m->by_name[i]->t->name),
          "each tensor belongs to exactly one shard", "tensor '%s' is in two shards (%s and %s)",
          m->by_name[i]->t->name, df_st_path(m->shards[m->by_name[i - 1]->shard]),
          df_st_path(m->shards[m->by_name[i]->shard]));
  return DF_OK;
}

static df_status model_new(const char *path, int n_shards, df_st_model **out, df_error *err) {
  df_st_model *m = calloc(1, sizeof *m);
  if (m) m->path = strdup(path);
  if (m) m->shards = calloc((size_t)n_shards + 1, sizeof *m->shards);
  if (!m || !m->path || !m->shards) {
    df_st_model_close(m);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  }
  *out = m;
  return DF_OK;
}

df_status df_st_model_wrap(df_st_file *f, df_st_model **out, df_error *err) {
  *out = NULL;
  df_st_model *m = NULL;
  df_status st = model_new(df_st_path(f), 1, &m, err);
  if (st != DF_OK) {
    df_st_close(f);
    return st;
  }
  m->shards[m->n_shards++] = f;
  if ((st = model_index(m, err)) != DF_OK) {
    df_st_model_close(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

static df_status open_single(const char *path, df_st_model **out, df_error *err) {
  df_st_file *f;
  DF_TRY(df_st_open(path, &f, err));
  return df_st_model_wrap(f, out, err);
}

// ---- the index ----------------------------------------------------------------------------------------

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// Shard names are plain relative paths next to the index: nothing absolute, no "..".
static bool shard_name_ok(const char *s) {
  if (!s[0] || s[0] == '/') return false;
  for (const char *p = s; *p;) {
    size_t n = strcspn(p, "/");
    if (n == 2 && p[0] == '.' && p[1] == '.') return false;
    p += n + (p[n] == '/');
  }
  return true;
}

// The distinct shard names of weight_map, sorted.
static df_status index_shard_names(const char *ipath, json_t *wmap, const char ***names, int *n, df_error *err) {
  const char **v = malloc(sizeof *v * (json_object_size(wmap) + 1));
  if (!v) return DF_FAIL(err, DF_ERR_NOMEM, ipath, NULL, "out of memory");
  int k = 0;
  const char *key;
  json_t *val;
  char where[256];
  json_object_foreach(wmap, key, val) {
    if (!json_is_string(val) || !shard_name_ok(json_string_value(val))) {
      free(v);
      return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, ipath, key),
                     "weight_map values are shard file names beside the index",
                     "weight_map entry '%s' must name a shard file (a relative path without \"..\")", key);
    }
    v[k++] = json_string_value(val);
  }
  qsort(v, (size_t)k, sizeof *v, cmp_str);
  int u = 0;
  for (int i = 0; i < k; i++)
    if (!u || strcmp(v[u - 1], v[i])) v[u++] = v[i];
  *names = v;
  *n = u;
  return DF_OK;
}

static const char *first_tensor_of(json_t *wmap, const char *shard) {
  const char *key;
  json_t *val;
  json_object_foreach(wmap, key, val) if (!strcmp(json_string_value(val), shard)) return key;
  return "";
}

static df_status open_shard(df_st_model *m, json_t *wmap, const char *dir, const char *shard, df_error *err) {
  size_t n = strlen(dir) + strlen(shard) + 2;
  char *p = malloc(n), where[256];
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, m->path, NULL, "out of memory");
  snprintf(p, n, "%s/%s", dir, shard);
  struct stat sb;
  df_status st = DF_OK;
  if (stat(p, &sb) != 0)
    st = DF_FAIL(err, DF_ERR_IO, df_st_where(where, sizeof where, m->path, first_tensor_of(wmap, shard)),
                 "the checkpoint is incomplete: download every shard the index names",
                 "weight_map names shard '%s' (for tensor '%s'), which cannot be opened: %s", p,
                 first_tensor_of(wmap, shard), strerror(errno));
  else
    st = df_st_open(p, &m->shards[m->n_shards], err);
  if (st == DF_OK) m->n_shards++;
  free(p);
  return st;
}

// Every weight_map entry is in its shard, every shard tensor is listed under that shard.
static df_status check_index_agrees(df_st_model *m, json_t *wmap, const char **names, df_error *err) {
  const char *key, *first = NULL;
  json_t *val;
  int missing = 0, first_shard = 0;
  char where[256];
  json_object_foreach(wmap, key, val) {
    const char **hit =
        bsearch(&(const char *){json_string_value(val)}, names, (size_t)m->n_shards, sizeof *names, cmp_str);
    if (!df_st_find(m->shards[hit - names], key) && !missing++) first = key, first_shard = (int)(hit - names);
  }
  if (missing)
    return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, df_st_path(m->shards[first_shard]), first),
                   "the index and its shards disagree: re-save the checkpoint",
                   "tensor '%s' (and %d more) is listed in %s under shard '%s' but is not in that shard", first,
                   missing - 1, m->path, names[first_shard]);
  for (int s = 0; s < m->n_shards; s++)
    for (int i = 0; i < df_st_count(m->shards[s]); i++) {
      const char *name = df_st_at(m->shards[s], i)->name;
      json_t *v = json_object_get(wmap, name);
      if (!v || strcmp(json_string_value(v), names[s]))
        return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, df_st_path(m->shards[s]), name),
                       "the index and its shards disagree: re-save the checkpoint",
                       "shard '%s' holds tensor '%s', which %s lists %s%s", names[s], name, m->path,
                       v ? "under shard " : "nowhere", v ? json_string_value(v) : "");
    }
  return DF_OK;
}

static df_status open_index_shards(df_st_model *m, json_t *wmap, const char **names, int n, df_error *err) {
  char *copy = strdup(m->path);
  if (!copy) return DF_FAIL(err, DF_ERR_NOMEM, m->path, NULL, "out of memory");
  const char *dir = dirname(copy);
  df_status st = DF_OK;
  for (int i = 0; i < n && st == DF_OK; i++) st = open_shard(m, wmap, dir, names[i], err);
  free(copy);
  if (st == DF_OK) st = check_index_agrees(m, wmap, names, err);
  return st;
}

static df_status parse_index(const char *path, json_t **wmap_out, json_t **root_out, df_error *err) {
  json_error_t jerr;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return DF_FAIL(err, DF_ERR_FORMAT, path, "fix the JSON syntax at that position",
                   "bad index JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
  json_t *wmap = json_object_get(root, "weight_map"), *meta = json_object_get(root, "metadata");
  const char *bad = !json_is_object(root)           ? "the index must be a JSON object"
                    : !json_is_object(wmap)         ? "\"weight_map\" must be an object of name → shard file"
                    : meta && !json_is_object(meta) ? "\"metadata\" must be an object"
                                                    : NULL;
  if (bad) {
    json_decref(root);
    return DF_FAIL(err, DF_ERR_FORMAT, path, "an index is {\"metadata\": {...}, \"weight_map\": {...}}", "%s", bad);
  }
  *wmap_out = wmap;
  *root_out = root;
  return DF_OK;
}

static df_status open_index(const char *path, df_st_model **out, df_error *err) {
  json_t *root = NULL, *wmap = NULL;
  DF_TRY(parse_index(path, &wmap, &root, err));
  const char **names = NULL;
  int n = 0;
  df_st_model *m = NULL;
  df_status st = index_shard_names(path, wmap, &names, &n, err);
  if (st == DF_OK) st = model_new(path, n, &m, err);
  if (st == DF_OK) st = open_index_shards(m, wmap, names, n, err);
  if (st == DF_OK) st = model_index(m, err);
  free(names);
  json_decref(root);
  if (st != DF_OK) {
    df_st_model_close(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

// ---- opening any of the three forms -------------------------------------------------------------------

static bool is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

df_status df_st_model_open(const char *path, df_st_model **out, df_error *err) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0) return DF_FAIL(err, DF_ERR_IO, path, "check the path", "cannot open: %s", strerror(errno));
  if (!S_ISDIR(sb.st_mode)) return ends_with(path, ".json") ? open_index(path, out, err) : open_single(path, out, err);
  size_t n = strlen(path) + sizeof DF_ST_INDEX_NAME + 2;
  char *p = malloc(n);
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  df_status st;
  snprintf(p, n, "%s/%s", path, DF_ST_SINGLE_NAME);
  if (is_file(p)) {
    st = open_single(p, out, err);
  } else {
    snprintf(p, n, "%s/%s", path, DF_ST_INDEX_NAME);
    st = is_file(p) ? open_index(p, out, err)
                    : DF_FAIL(err, DF_ERR_IO, path, "point at an HF model directory, a .safetensors file or an index",
                              "neither %s nor %s in the directory", DF_ST_SINGLE_NAME, DF_ST_INDEX_NAME);
  }
  free(p);
  return st;
}

// ---- access -------------------------------------------------------------------------------------------

const char *df_st_model_path(const df_st_model *m) { return m->path; }
int df_st_model_num_shards(const df_st_model *m) { return m->n_shards; }
int df_st_model_count(const df_st_model *m) { return m->n; }

const df_st_file *df_st_model_shard(const df_st_model *m, int i) {
  return i >= 0 && i < m->n_shards ? m->shards[i] : NULL;
}

const df_st_tensor *df_st_model_at(const df_st_model *m, int i, const df_st_file **file) {
  if (i < 0 || i >= m->n) return NULL;
  if (file) *file = m->shards[m->e[i].shard];
  return m->e[i].t;
}

const df_st_tensor *df_st_model_find(const df_st_model *m, const char *name, const df_st_file **file) {
  int lo = 0, hi = m->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(name, m->by_name[mid]->t->name);
    if (c == 0) {
      if (file) *file = m->shards[m->by_name[mid]->shard];
      return m->by_name[mid]->t;
    }
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

df_status df_st_print(const char *path, FILE *out, df_error *err) {
  df_st_model *m;
  DF_TRY(df_st_model_open(path, &m, err));
  int w = 4;
  for (int i = 0; i < m->n; i++) {
    int k = (int)strlen(m->e[i].t->name);
    w = k > w ? k : w;
  }
  fprintf(out, "%s: %d tensors in %d file(s)\n", m->path, m->n, m->n_shards);
  for (int s = 0; s < m->n_shards; s++) {
    const df_st_file *f = m->shards[s];
    fprintf(out, "%s: %d tensors, %llu data bytes\n", df_st_path(f), df_st_count(f),
            (unsigned long long)df_st_data_size(f));
    for (int i = 0; i < df_st_metadata_count(f); i++) {
      const char *k, *v;
      df_st_metadata_at(f, i, &k, &v);
      fprintf(out, "  metadata %s = %s\n", k, v);
    }
    char shape[256];
    for (int i = 0; i < df_st_count(f); i++) {
      const df_st_tensor *t = df_st_at(f, i);
      fprintf(out, "  %-*s  %-7s  %s\n", w, t->name, df_st_dtype_name(t->dtype),
              df_st_shape_str(t, shape, sizeof shape));
    }
  }
  df_st_model_close(m);
  return DF_OK;
}
