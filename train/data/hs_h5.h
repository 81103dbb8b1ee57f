// HDF5 plumbing shared by the hidden-state reader and writer (internal to train/hs_*.c and hidden_states.c):
// quiet error stacks turned into df_error messages, typed attribute reads and dataset descriptions.
#ifndef DF_TRAIN_DATA_HS_H5_H
#define DF_TRAIN_DATA_HS_H5_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/data/hs.h"

// Saves HDF5's automatic error printing and turns it off; hs_quiet_end restores it.
typedef struct {
  H5E_auto2_t func;
  void *data;
} hs_quiet;
void hs_quiet_begin(hs_quiet *q);
void hs_quiet_end(const hs_quiet *q);

// The innermost message on HDF5's error stack ("" when empty), for appending to a df_error message.
void hs_h5_detail(char *buf, size_t n);

// Fails with status st, where = "<file>:<name>", and HDF5's own detail appended to the message.
df_status hs_h5_fail(df_error *err, df_status st, const char *file, const char *name, const char *hint,
                     const char *what);

// Reads a string attribute (fixed-length or variable-length); *present = false when absent.
df_status hs_attr_str(hid_t loc, const char *file, const char *name, char *buf, size_t n, bool *present, df_error *err);
// Reads a scalar integer attribute; *present = false when absent.
df_status hs_attr_i64(hid_t loc, const char *file, const char *name, int64_t *v, bool *present, df_error *err);
// Reads a 1-D integer array attribute of at most cap entries; *present = false when absent.
df_status hs_attr_i64_array(hid_t loc, const char *file, const char *name, int64_t *v, int64_t cap, int64_t *count,
                            bool *present, df_error *err);

// Writes a variable-length UTF-8 string / int64 scalar / int64 array attribute on loc.
df_status hs_write_attr_str(hid_t loc, const char *file, const char *name, const char *value, df_error *err);
df_status hs_write_attr_i64(hid_t loc, const char *file, const char *name, int64_t value, df_error *err);
df_status hs_write_attr_i64_array(hid_t loc, const char *file, const char *name, const int64_t *v, int64_t n,
                                  df_error *err);

// Describes dataset name under file (present, element type, rank, first two dims).
df_status hs_describe(hid_t file, const char *path, const char *name, df_hs_dset_shape *out, df_error *err);

#endif
