// Moving a parameter table's flat buffer to and from safetensors: the strict loader (every tensor maps to a
// parameter, every parameter is filled, shapes agree; all checked before anything is written) and the saver.
#ifndef DF_MODELING_STRICT_LOAD_H
#define DF_MODELING_STRICT_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base/error.h"
#include "modeling/param_table.h"
#include "modeling/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

// A prefix rename at the file boundary: a file tensor "<from>rest" loads into parameter "<to>rest".
typedef struct {
  const char *from;
  const char *to;
} df_rename;

// A custom rename: returns the parameter name for file_name (it may write it into buf), or NULL to keep it.
typedef const char *(*df_load_map_fn)(void *ctx, const char *file_name, char *buf, size_t bufsize);

typedef struct {
  // A file tensor that maps to no parameter but whose name ends with one of these is skipped
  // (e.g. "rotary_emb.inv_freq"); any other unmatched tensor is an error.
  const char *const *ignore_suffixes;
  int n_ignore;
  const df_rename *renames; // tried in order, first matching prefix wins; applied before map
  int n_renames;
  df_load_map_fn map;
  void *map_ctx;
  FILE *log; // when set, every problem is also written here, one per line (the error message is capped)
} df_load_options;

typedef struct {
  int loaded;  // tensors copied into parameters
  int ignored; // tensors skipped by an ignore suffix
} df_load_stats;

// Loads m's tensors into flat (laid out by the finalized table p), converting each to fp32. Unmatched
// tensors, unfilled parameters, shape mismatches, dtypes of another kind (float ↔ int) and two tensors for one
// parameter are all collected and reported in one error ("… and N more" past the message size); flat is not
// touched unless everything checks. opt and stats may be NULL.
df_status df_params_load_strict(const df_params *p, float *flat, const df_st_model *m, const df_load_options *opt,
                                df_load_stats *stats, df_error *err);

// Problems gathered while validating a load; the list is capped to what fits in df_error.msg. Shared with
// the layout-aware MoE loader so both report in one format.
typedef struct {
  char list[468];
  size_t len;
  int total, shown;
  char first[192]; // the first offending name, for err.where
  FILE *log;       // when set, every problem is also written here
} df_load_problems;

void df_load_problem(df_load_problems *pb, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Fails with "N problems: …" (and "; and N more" past the cap), err.where at the first offending name.
df_status df_load_problems_report(const df_st_model *m, const df_load_problems *pb, const char *hint, df_error *err);

// The parameter name a file tensor loads into: prefix renames first, then the custom hook.
const char *df_load_map_name(const df_load_options *o, const char *name, char *buf, size_t n);

// A file tensor that maps to no parameter (mapped to pname): skipped when an ignore suffix matches (counted in
// *ignored), otherwise reported as unexpected.
void df_load_unmatched(const df_load_options *o, const char *file_name, const char *pname, int *ignored,
                       df_load_problems *pb);

// Float parameters take float tensors, integer/bool parameters integer/bool ones; crossing kinds is a bug.
bool df_load_dtype_fits(df_st_dtype file_dt, df_dtype param_dt);

typedef struct {
  df_st_dtype dtype;           // DF_ST_F32 (default), DF_ST_BF16 or DF_ST_F16 (round to nearest even)
  bool trainable_only;         // skip frozen entries (gradient dumps)
  bool integer_only;           // only the integer / bool buffers (EAGLE-3's vocabulary mapping in a step dump)
  const char *const *metadata; // key, value, key, value, … added to __metadata__ ("format": "pt" always is)
  int n_metadata;              // number of pairs
  // Tensors whose file name contains one of these stay F32 whatever dtype says (the DSpark confidence head and
  // the MoE router, which SGLang keeps in fp32: a bf16 copy would be upcast after the precision is lost).
  const char *const *f32_names;
  int n_f32_names;
} df_save_options;

// The dtype o writes the tensor `name` in.
df_st_dtype df_save_dtype(const df_save_options *o, const char *name);

// Writes every entry of p from flat under its checkpoint name, atomically. opt may be NULL.
df_status df_params_save(const df_params *p, const float *flat, const char *path, const df_save_options *opt,
                         df_error *err);

#ifdef __cplusplus
}
#endif

#endif
