// HF safetensors files: a validating read-only reader (mmap or memory), an atomic writer, sharded
// checkpoints (model.safetensors.index.json) and the dtype conversions between file dtypes and fp32.
#ifndef DF_MODELING_SAFETENSORS_H
#define DF_MODELING_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- dtypes ---------------------------------------------------------------------------------------------
// Every byte-sized dtype HF defines; sub-byte ones (F4, F6_*) are rejected as unsupported.
typedef enum {
  DF_ST_F64,
  DF_ST_F32,
  DF_ST_F16,
  DF_ST_BF16,
  DF_ST_F8_E4M3, // float8_e4m3fn: no infinities, S.1111.111 is NaN
  DF_ST_F8_E5M2,
  DF_ST_F8_E8M0, // exponent only (MX scales): 2^(e-127), 0xFF is NaN
  DF_ST_I64,
  DF_ST_I32,
  DF_ST_I16,
  DF_ST_I8,
  DF_ST_U64,
  DF_ST_U32,
  DF_ST_U16,
  DF_ST_U8,
  DF_ST_BOOL,
  DF_ST_NUM_DTYPES
} df_st_dtype;

const char *df_st_dtype_name(df_st_dtype dt); // "BF16", as the file spells it
size_t df_st_dtype_size(df_st_dtype dt);
bool df_st_dtype_from_name(const char *name, df_st_dtype *out);
bool df_st_dtype_is_float(df_st_dtype dt);
// The matching df_dtype (false when df_dtype has none, e.g. I8 or F8_*).
bool df_st_dtype_to_df(df_st_dtype dt, df_dtype *out);
df_st_dtype df_st_dtype_from_df(df_dtype dt);

// Scalar conversions (bit patterns in uint16_t / uint8_t); f32 → 16-bit rounds to nearest even, NaN stays NaN.
float df_st_bf16_to_f32(uint16_t h);
uint16_t df_st_f32_to_bf16(float f);
float df_st_f16_to_f32(uint16_t h);
uint16_t df_st_f32_to_f16(float f);
// n elements of dtype dt at src (any alignment) to fp32. BOOL: any non-zero byte is 1.
void df_st_convert_to_f32(df_st_dtype dt, const void *src, float *dst, int64_t n);
// n fp32 values to dt ∈ {F32, F64, F16, BF16} (anything else returns false).
bool df_st_convert_from_f32(df_st_dtype dt, const float *src, void *dst, int64_t n);

// ---- reader -------------------------------------------------------------------------------------------
#define DF_ST_MAX_DIMS         8
#define DF_ST_MAX_HEADER_BYTES 100000000ull // HF's MAX_HEADER_SIZE

typedef struct {
  const char *name;
  df_st_dtype dtype;
  int ndim;
  int64_t shape[DF_ST_MAX_DIMS];
  int64_t numel;
  uint64_t begin, end; // byte offsets into the data region
} df_st_tensor;

typedef struct df_st_file df_st_file;

// Maps and validates path (see docs in safetensors.c: every HF rule, including that the tensors cover
// the data region exactly, without gaps). Nothing is returned for a file that fails any check.
df_status df_st_open(const char *path, df_st_file **out, df_error *err);
// The same on bytes the caller keeps alive until df_st_close; label names them in errors.
df_status df_st_open_memory(const void *buf, size_t len, const char *label, df_st_file **out, df_error *err);
void df_st_close(df_st_file *f);

const char *df_st_path(const df_st_file *f);
int df_st_count(const df_st_file *f);
// i-th tensor in file order (ascending data offset; the order the bytes lie on disk).
const df_st_tensor *df_st_at(const df_st_file *f, int i);
const df_st_tensor *df_st_find(const df_st_file *f, const char *name); // NULL when absent
// Raw little-endian bytes of t (read-only, no alignment promised).
const void *df_st_data(const df_st_file *f, const df_st_tensor *t);
uint64_t df_st_data_size(const df_st_file *f);

// __metadata__ (string → string), in header order.
int df_st_metadata_count(const df_st_file *f);
void df_st_metadata_at(const df_st_file *f, int i, const char **key, const char **value);
const char *df_st_metadata_get(const df_st_file *f, const char *key); // NULL when absent

// Converts t to fp32 into dst, which holds exactly n = t->numel floats.
df_status df_st_read_f32(const df_st_file *f, const df_st_tensor *t, float *dst, int64_t n, df_error *err);
// Copies t's raw bytes into dst (nbytes must equal end − begin).
df_status df_st_read_raw(const df_st_file *f, const df_st_tensor *t, void *dst, size_t nbytes, df_error *err);

// "f32[2,3]"-style "[2, 3]" shape text.
const char *df_st_shape_str(const df_st_tensor *t, char *buf, size_t n);
// "<file>: <tensor>" for df_error.where (tensor may be NULL).
const char *df_st_where(char *buf, size_t n, const char *file, const char *tensor);

// ---- sharded checkpoints --------------------------------------------------------------------------------
// A model is one file or the shards an index names; tensor names are unique across it.
typedef struct df_st_model df_st_model;

#define DF_ST_SINGLE_NAME "model.safetensors"
#define DF_ST_INDEX_NAME  "model.safetensors.index.json"

// path: a directory (model.safetensors preferred, as transformers does, else the index), a .safetensors file,
// or an index .json. Every weight_map entry must name an existing shard holding that tensor, and every shard
// tensor must be listed under that shard.
df_status df_st_model_open(const char *path, df_st_model **out, df_error *err);
// Wraps one open file as a model (takes ownership of f, also on failure).
df_status df_st_model_wrap(df_st_file *f, df_st_model **out, df_error *err);
void df_st_model_close(df_st_model *m);

const char *df_st_model_path(const df_st_model *m);
int df_st_model_num_shards(const df_st_model *m);
const df_st_file *df_st_model_shard(const df_st_model *m, int i);
int df_st_model_count(const df_st_model *m);
// i-th tensor: shards in index order (sorted file names), tensors in file order within each.
const df_st_tensor *df_st_model_at(const df_st_model *m, int i, const df_st_file **file);
const df_st_tensor *df_st_model_find(const df_st_model *m, const char *name, const df_st_file **file);

// Prints each shard's tensors (name, dtype, shape) and metadata, for `draftforge inspect`.
df_status df_st_print(const char *path, FILE *out, df_error *err);

// ---- writer -------------------------------------------------------------------------------------------
typedef struct df_st_writer df_st_writer;

df_status df_st_writer_new(df_st_writer **out, df_error *err);
void df_st_writer_free(df_st_writer *w);
// Adds a tensor whose bytes (dtype dt, little-endian, numel × size) stay borrowed until write returns.
df_status df_st_writer_add(df_st_writer *w, const char *name, df_st_dtype dt, int ndim, const int64_t *shape,
                           const void *data, df_error *err);
// Adds fp32 values stored as dt ∈ {F32, F16, BF16, F64}, converted while writing (RNE); src stays borrowed.
df_status df_st_writer_add_f32_as(df_st_writer *w, const char *name, df_st_dtype dt, int ndim, const int64_t *shape,
                                  const float *src, df_error *err);
df_status df_st_writer_set_metadata(df_st_writer *w, const char *key, const char *value, df_error *err);
// Writes <path>.tmp.<pid>, fsyncs it, renames it over path and fsyncs the directory: a reader sees the old
// file or the whole new one. Data starts 8-byte aligned (space padding) and tensors are laid out by element
// size, largest first (stable), so each is naturally aligned.
df_status df_st_writer_write(const df_st_writer *w, const char *path, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
