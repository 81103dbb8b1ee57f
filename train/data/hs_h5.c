// HDF5 plumbing for hidden-state shards: quiet error stacks, typed attribute I/O, dataset descriptions.
#include "train/data/hs_h5.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hs_quiet_begin(hs_quiet *q) {
  q->func = NULL;
  q->data = NULL;
  H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void hs_quiet_end(const hs_quiet *q) { H5Eset_auto2(H5E_DEFAULT, q->func, q->data); }

typedef struct {
  char *buf;
  size_t n;
} detail_ctx;

static herr_t detail_walk(unsigned n, const H5E_error2_t *e, void *p) {
  detail_ctx *c = p;
  if (n == 0 && e && e->desc) snprintf(c->buf, c->n, "%s", e->desc);
  return 0;
}

void hs_h5_detail(char *buf, size_t n) {
  if (!n) return;
  buf[0] = 0;
  detail_ctx c = {buf, n};
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, detail_walk, &c); // upward: n == 0 is the innermost cause
}

df_status hs_h5_fail(df_error *err, df_status st, const char *file, const char *name, const char *hint,
                     const char *what) {
  char detail[200], where[256];
  hs_h5_detail(detail, sizeof detail);
  snprintf(where, sizeof where, "%s:%s", file, name ? name : "");
  if (name)
    return DF_FAIL(err, st, where, hint, "shard %s: '%s': %s%s%s%s", file, name, what, detail[0] ? " (HDF5: " : "",
                   detail, detail[0] ? ")" : "");
  return DF_FAIL(err, st, file, hint, "shard %s: %s%s%s%s", file, what, detail[0] ? " (HDF5: " : "", detail,
                 detail[0] ? ")" : "");
}

static df_status attr_type_fail(df_error *err, const char *file, const char *name, const char *what) {
  char where[256];
  snprintf(where, sizeof where, "%s:%s", file, name);
  return DF_FAIL(err, DF_ERR_FORMAT, where, "see docs/data-format.md for the attribute types",
                 "shard %s: attribute '%s' %s", file, name, what);
}

// Opens attribute name if it exists; *a < 0 and *present = false when it does not.
static df_status attr_open(hid_t loc, const char *file, const char *name, hid_t *a, bool *present, df_error *err) {
  *a = H5I_INVALID_HID;
  htri_t ex = H5Aexists(loc, name);
  if (ex < 0) return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot look up the attribute");
  *present = ex > 0;
  if (!*present) return DF_OK;
  *a = H5Aopen(loc, name, H5P_DEFAULT);
  if (*a < 0) return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot open the attribute");
  return DF_OK;
}

static hssize_t attr_npoints(hid_t a) {
  hid_t sp = H5Aget_space(a);
  hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
  if (sp >= 0) H5Sclose(sp);
  return np;
}

static df_status read_str(hid_t a, hid_t t, const char *file, const char *name, char *buf, size_t n, df_error *err) {
  hid_t mt = H5Tcopy(H5T_C_S1);
  H5Tset_cset(mt, H5Tget_cset(t));
  herr_t rc;
  if (H5Tis_variable_str(t) > 0) {
    char *s = NULL;
    H5Tset_size(mt, H5T_VARIABLE);
    rc = H5Aread(a, mt, &s);
    if (rc >= 0) snprintf(buf, n, "%s", s ? s : "");
    if (s) H5free_memory(s);
  } else {
    size_t sz = H5Tget_size(t);
    char *tmp = calloc(sz + 1, 1);
    if (!tmp) {
      H5Tclose(mt);
      return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "shard %s: out of memory reading attribute '%s'", file, name);
    }
    H5Tset_size(mt, sz + 1);
    H5Tset_strpad(mt, H5T_STR_NULLTERM);
    rc = H5Aread(a, mt, tmp);
    if (rc >= 0) snprintf(buf, n, "%s", tmp);
    free(tmp);
  }
  H5Tclose(mt);
  if (rc < 0) return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot read the string attribute");
  return DF_OK;
}

df_status hs_attr_str(hid_t loc, const char *file, const char *name, char *buf, size_t n, bool *present,
                      df_error *err) {
  hid_t a;
  DF_TRY(attr_open(loc, file, name, &a, present, err));
  if (!*present) return DF_OK;
  hid_t t = H5Aget_type(a);
  df_status st = DF_OK;
  if (H5Tget_class(t) != H5T_STRING)
    st = attr_type_fail(err, file, name, "is not a string");
  else if (attr_npoints(a) != 1)
    st = attr_type_fail(err, file, name, "must hold one string");
  else
    st = read_str(a, t, file, name, buf, n, err);
  H5Tclose(t);
  H5Aclose(a);
  return st;
}

df_status hs_attr_i64(hid_t loc, const char *file, const char *name, int64_t *v, bool *present, df_error *err) {
  hid_t a;
  DF_TRY(attr_open(loc, file, name, &a, present, err));
  if (!*present) return DF_OK;
  hid_t t = H5Aget_type(a);
  df_status st = DF_OK;
  if (H5Tget_class(t) != H5T_INTEGER)
    st = attr_type_fail(err, file, name, "is not an integer");
  else if (attr_npoints(a) != 1)
    st = attr_type_fail(err, file, name, "must hold one integer");
  else if (H5Aread(a, H5T_NATIVE_INT64, v) < 0)
    st = hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot read the integer attribute");
  H5Tclose(t);
  H5Aclose(a);
  return st;
}

df_status hs_attr_i64_array(hid_t loc, const char *file, const char *name, int64_t *v, int64_t cap, int64_t *count,
                            bool *present, df_error *err) {
  hid_t a;
  DF_TRY(attr_open(loc, file, name, &a, present, err));
  if (!*present) return DF_OK;
  hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
  df_status st = DF_OK;
  if (H5Tget_class(t) != H5T_INTEGER) {
    st = attr_type_fail(err, file, name, "is not an integer array");
  } else if (H5Sget_simple_extent_ndims(sp) != 1) {
    st = attr_type_fail(err, file, name, "must be a one-dimensional integer array");
  } else {
    *count = (int64_t)H5Sget_simple_extent_npoints(sp);
    // Over capacity: report the count and let the caller's range check name the problem.
    if (*count <= cap && *count > 0 && H5Aread(a, H5T_NATIVE_INT64, v) < 0)
      st = hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot read the integer array attribute");
  }
  H5Sclose(sp);
  H5Tclose(t);
  H5Aclose(a);
  return st;
}

// Creates (replacing any existing) attribute name with file type ft and the given dataspace, then writes v.
static df_status write_attr(hid_t loc, const char *file, const char *name, hid_t ft, hid_t mt, hid_t sp, const void *v,
                            df_error *err) {
  if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0)
    return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot replace the attribute");
  hid_t a = H5Acreate2(loc, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot create the attribute");
  herr_t rc = H5Awrite(a, mt, v);
  H5Aclose(a);
  if (rc < 0) return hs_h5_fail(err, DF_ERR_IO, file, name, NULL, "cannot write the attribute");
  return DF_OK;
}

df_status hs_write_attr_str(hid_t loc, const char *file, const char *name, const char *value, df_error *err) {
  // Variable-length UTF-8, as h5py writes str attributes, so Python reads back a str.
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  df_status st = write_attr(loc, file, name, t, t, sp, &value, err);
  H5Sclose(sp);
  H5Tclose(t);
  return st;
}

df_status hs_write_attr_i64(hid_t loc, const char *file, const char *name, int64_t value, df_error *err) {
  hid_t sp = H5Screate(H5S_SCALAR);
  df_status st = write_attr(loc, file, name, H5T_STD_I64LE, H5T_NATIVE_INT64, sp, &value, err);
  H5Sclose(sp);
  return st;
}

df_status hs_write_attr_i64_array(hid_t loc, const char *file, const char *name, const int64_t *v, int64_t n,
                                  df_error *err) {
  hsize_t dims[1] = {(hsize_t)n};
  hid_t sp = H5Screate_simple(1, dims, NULL);
  df_status st = write_attr(loc, file, name, H5T_STD_I64LE, H5T_NATIVE_INT64, sp, v, err);
  H5Sclose(sp);
  return st;
}

static df_hs_elem elem_of(hid_t t) {
  size_t sz = H5Tget_size(t);
  switch (H5Tget_class(t)) {
  case H5T_INTEGER: {
    bool sgn = H5Tget_sign(t) == H5T_SGN_2;
    if (sgn && sz == 8) return DF_HS_T_I64;
    if (sgn && sz == 4) return DF_HS_T_I32;
    if (!sgn && sz == 2) return DF_HS_T_U16;
    if (!sgn && sz == 1) return DF_HS_T_U8;
    return DF_HS_T_OTHER;
  }
  case H5T_FLOAT:
    // IEEE binary32 only: a custom 4-byte float would convert silently and wrongly.
    return sz == 4 && H5Tget_precision(t) == 32 && H5Tget_ebias(t) == 127 ? DF_HS_T_F32 : DF_HS_T_OTHER;
  default: return DF_HS_T_OTHER;
  }
}

df_status hs_describe(hid_t file, const char *path, const char *name, df_hs_dset_shape *out, df_error *err) {
  memset(out, 0, sizeof *out);
  htri_t ex = H5Lexists(file, name, H5P_DEFAULT);
  if (ex < 0) return hs_h5_fail(err, DF_ERR_IO, path, name, NULL, "cannot look up the dataset");
  if (!ex) return DF_OK;
  hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
  if (d < 0)
    return hs_h5_fail(err, DF_ERR_FORMAT, path, name, "see docs/data-format.md", "exists but is not a dataset");
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  out->present = true;
  out->elem = elem_of(t);
  out->ndim = H5Sget_simple_extent_ndims(sp);
  hsize_t dims[H5S_MAX_RANK] = {0};
  if (out->ndim > 0) H5Sget_simple_extent_dims(sp, dims, NULL);
  for (int i = 0; i < 2 && i < out->ndim; i++) out->dims[i] = (int64_t)dims[i];
  H5Sclose(sp);
  H5Tclose(t);
  H5Dclose(d);
  return DF_OK;
}
