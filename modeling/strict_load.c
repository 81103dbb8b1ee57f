// Strict loading validates the whole mapping (file tensors ↔ parameters) first and copies only when it is
// clean, so a bad checkpoint never leaves a half-loaded model; saving is the writer over the flat buffer.
#include "modeling/strict_load.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void df_load_problem(df_load_problems *pb, const char *name, const char *fmt, ...) {
  char item[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(item, sizeof item, fmt, ap);
  va_end(ap);
  if (pb->log) fprintf(pb->log, "strict load: %s\n", item);
  if (!pb->total++) snprintf(pb->first, sizeof pb->first, "%s", name);
  size_t k = strlen(item), sep = pb->shown ? 2 : 0;
  if (pb->len + sep + k + 1 > sizeof pb->list) return; // counted in "and N more"
  memcpy(pb->list + pb->len, "; ", sep);
  memcpy(pb->list + pb->len + sep, item, k + 1);
  pb->len += sep + k;
  pb->shown++;
}

df_status df_load_problems_report(const df_st_model *m, const df_load_problems *pb, const char *hint, df_error *err) {
  char where[256];
  char more[40] = "";
  if (pb->total > pb->shown) snprintf(more, sizeof more, "; and %d more", pb->total - pb->shown);
  return DF_FAIL(err, DF_ERR_INVALID, df_st_where(where, sizeof where, df_st_model_path(m), pb->first), hint,
                 "%d problem%s: %s%s", pb->total, pb->total == 1 ? "" : "s", pb->list, more);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

const char *df_load_map_name(const df_load_options *o, const char *name, char *buf, size_t n) {
  char renamed[512];
  const char *cur = name;
  for (int i = 0; i < o->n_renames; i++) {
    size_t k = strlen(o->renames[i].from);
    if (!strncmp(name, o->renames[i].from, k)) {
      snprintf(renamed, sizeof renamed, "%s%s", o->renames[i].to, name + k);
      cur = renamed;
      break;
    }
  }
  const char *r = o->map ? o->map(o->map_ctx, cur, buf, n) : NULL;
  if (r == buf) return buf;
  if (!r && cur == name) return name;
  snprintf(buf, n, "%s", r ? r : cur);
  return buf;
}

void df_load_unmatched(const df_load_options *o, const char *file_name, const char *pname, int *ignored,
                       df_load_problems *pb) {
  for (int i = 0; i < o->n_ignore; i++)
    if (ends_with(file_name, o->ignore_suffixes[i])) {
      (*ignored)++;
      return;
    }
  if (!strcmp(pname, file_name))
    df_load_problem(pb, file_name, "unexpected tensor '%s'", file_name);
  else
    df_load_problem(pb, file_name, "unexpected tensor '%s' (as '%s')", file_name, pname);
}

bool df_load_dtype_fits(df_st_dtype file_dt, df_dtype param_dt) {
  bool param_float = param_dt == DF_F32 || param_dt == DF_F64 || param_dt == DF_F16 || param_dt == DF_BF16;
  return df_st_dtype_is_float(file_dt) == param_float;
}

static bool shape_equal(const df_st_tensor *t, const df_param *e) {
  if (t->ndim != e->ndim) return false;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != e->shape[i]) return false;
  return true;
}

static const char *param_shape_str(const df_param *e, char *buf, size_t n) {
  df_st_tensor t = {.ndim = e->ndim};
  memcpy(t.shape, e->shape, sizeof e->shape);
  return df_st_shape_str(&t, buf, n);
}

// Checks one file tensor against its parameter; claims the parameter (src[index] = tensor index + 1).
static void check_tensor(const df_params *p, const df_st_model *m, const df_load_options *o, int ti, int *src,
                         int *ignored, df_load_problems *pb) {
  const df_st_tensor *t = df_st_model_at(m, ti, NULL);
  char buf[512], fs[96], ps[96];
  const char *pname = df_load_map_name(o, t->name, buf, sizeof buf);
  const df_param *e = df_params_find(p, pname);
  if (!e) {
    df_load_unmatched(o, t->name, pname, ignored, pb);
    return;
  }
  int pi = (int)(e - df_params_at(p, 0));
  if (src[pi]) {
    df_load_problem(pb, t->name, "tensors '%s' and '%s' both map to parameter '%s'",
                    df_st_model_at(m, src[pi] - 1, NULL)->name, t->name, e->name);
    return;
  }
  src[pi] = ti + 1;
  if (!shape_equal(t, e))
    df_load_problem(pb, t->name, "shape mismatch '%s': file %s, parameter %s", t->name,
                    df_st_shape_str(t, fs, sizeof fs), param_shape_str(e, ps, sizeof ps));
  else if (!df_load_dtype_fits(t->dtype, e->dtype))
    df_load_problem(pb, t->name, "dtype '%s': file %s cannot load into a %s parameter", t->name,
                    df_st_dtype_name(t->dtype), df_dtype_name(e->dtype));
}

df_status df_params_load_strict(const df_params *p, float *flat, const df_st_model *m, const df_load_options *opt,
                                df_load_stats *stats, df_error *err) {
  if (!df_params_is_final(p))
    return DF_FAIL(err, DF_ERR_INVALID, df_st_model_path(m), "call df_params_finalize first",
                   "parameter table not finalized");
  df_load_options none = {0};
  const df_load_options *o = opt ? opt : &none;
  int np = df_params_count(p), ignored = 0;
  int *src = calloc((size_t)np + 1, sizeof *src);
  if (!src) return DF_FAIL(err, DF_ERR_NOMEM, df_st_model_path(m), NULL, "out of memory");
  df_load_problems pb = {.log = o->log};
  for (int ti = 0; ti < df_st_model_count(m); ti++) check_tensor(p, m, o, ti, src, &ignored, &pb);
  for (int i = 0; i < np; i++)
    if (!src[i]) df_load_problem(&pb, df_params_at(p, i)->name, "missing parameter '%s'", df_params_at(p, i)->name);
  if (pb.total) {
    free(src);
    return df_load_problems_report(m, &pb,
                                   "the checkpoint does not match the model config; declare renames or ignore "
                                   "suffixes only for known layout differences",
                                   err);
  }
  df_status st = DF_OK;
  for (int i = 0; i < np && st == DF_OK; i++) {
    const df_param *e = df_params_at(p, i);
    const df_st_file *f;
    const df_st_tensor *t = df_st_model_at(m, src[i] - 1, &f);
    st = df_st_read_f32(f, t, flat + e->offset, e->numel, err);
  }
  free(src);
  if (stats) *stats = (df_load_stats){.loaded = np, .ignored = ignored};
  return st;
}

df_st_dtype df_save_dtype(const df_save_options *o, const char *name) {
  for (int i = 0; i < o->n_f32_names; i++)
    if (strstr(name, o->f32_names[i])) return DF_ST_F32;
  return o->dtype;
}

static bool is_int_dtype(df_dtype dt) { return dt == DF_I64 || dt == DF_I32 || dt == DF_U8 || dt == DF_BOOL; }

// An integer or bool buffer (EAGLE-3's d2t / t2d) is held as exact fp32 values in the flat buffer and stored in its
// own dtype, as the checkpoints it was loaded from.
static df_status add_int_tensor(df_st_writer *w, const df_param *e, const float *src, void **owned, df_error *err) {
  const df_st_dtype dt = df_st_dtype_from_df(e->dtype);
  const size_t es = df_st_dtype_size(dt);
  unsigned char *buf = malloc(es * (size_t)(e->numel > 0 ? e->numel : 1));
  if (!buf) return DF_FAIL(err, DF_ERR_NOMEM, e->name, NULL, "out of memory");
  *owned = buf;
  for (int64_t i = 0; i < e->numel; i++) {
    const long long v = llrintf(src[i]);
    switch (e->dtype) {
    case DF_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DF_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DF_BOOL: buf[i] = src[i] != 0.0f; break;
    default: buf[i] = (unsigned char)v; break;
    }
  }
  return df_st_writer_add(w, e->name, dt, e->ndim, e->shape, buf, err);
}

df_status df_params_save(const df_params *p, const float *flat, const char *path, const df_save_options *opt,
                         df_error *err) {
  df_save_options none = {.dtype = DF_ST_F32};
  const df_save_options *o = opt ? opt : &none;
  if (!df_params_is_final(p))
    return DF_FAIL(err, DF_ERR_INVALID, path, "call df_params_finalize first", "parameter table not finalized");
  df_st_writer *w;
  DF_TRY(df_st_writer_new(&w, err));
  const int n = df_params_count(p);
  void **ints = calloc((size_t)n + 1, sizeof *ints); // integer buffers' converted bytes, alive until the write
  df_status st = ints ? df_st_writer_set_metadata(w, "format", "pt", err)
                      : DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  for (int i = 0; i < o->n_metadata && st == DF_OK; i++)
    st = df_st_writer_set_metadata(w, o->metadata[2 * i], o->metadata[2 * i + 1], err);
  for (int i = 0; i < n && st == DF_OK; i++) {
    const df_param *e = df_params_at(p, i);
    if ((o->trainable_only && !e->trainable) || (o->integer_only && !is_int_dtype(e->dtype))) continue;
    if (is_int_dtype(e->dtype))
      st = add_int_tensor(w, e, flat + e->offset, &ints[i], err);
    else
      st = df_st_writer_add_f32_as(w, e->name, df_save_dtype(o, e->name), e->ndim, e->shape, flat + e->offset, err);
  }
  if (st == DF_OK) st = df_st_writer_write(w, path, err);
  df_st_writer_free(w);
  for (int i = 0; ints && i < n; i++) free(ints[i]);
  free(ints);
  return st;
}
