// Captured hidden-state training data in HDF5 (docs/data-format.md): the shard reader and writer,
// up-front validation of every shard, random access to one sample, and the checks against the draft config.
#ifndef DF_TRAIN_DATA_HS_H
#define DF_TRAIN_DATA_HS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_HS_FORMAT     "draftforge-hidden-states"
#define DF_HS_VERSION    1
#define DF_HS_MAX_LAYERS 256 // K bound; real drafts use 1..8 target layers

// Dataset and attribute names of the schema.
#define DF_HS_ATTR_FORMAT      "format"
#define DF_HS_ATTR_VERSION     "version"
#define DF_HS_ATTR_HIDDEN_SIZE "hidden_size"
#define DF_HS_ATTR_LAYER_IDS   "target_layer_ids"
#define DF_HS_ATTR_DTYPE       "dtype"
#define DF_HS_ATTR_CONVENTION  "layer_id_convention"
// The only layer-id convention draftforge reads (docs/data-format.md): id L holds the output of decoder layer
// L, transformers' hidden_states[L + 1], SGLang's layers_to_capture L + 1 (SpecForge's captures).
#define DF_HS_CONVENTION "hidden_states[L+1]"
// The shifted one some capture scripts produce: id L holding hidden_states[L], the input of layer L.
#define DF_HS_CONVENTION_SHIFTED "hidden_states[L]"
#define DF_HS_DS_OFFSETS         "sample_offsets"
#define DF_HS_DS_INPUT_IDS       "input_ids"
#define DF_HS_DS_LOSS_MASK       "loss_mask"
#define DF_HS_DS_HIDDEN          "hidden_states"
#define DF_HS_DS_LAST_HIDDEN     "target_last_hidden_states"

// ---- reader --------------------------------------------------------------------------------------------

typedef struct df_hs_dataset df_hs_dataset;

typedef struct {
  int64_t num_samples; // N over all shards
  int64_t num_tokens;  // T over all shards
  int num_layers;      // K
  int64_t hidden_size; // H; a hidden row is K·H wide
  int target_layer_ids[DF_HS_MAX_LAYERS];
  df_dtype dtype; // storage: DF_BF16 (uint16 bits) or DF_F32; reads always return fp32
  bool has_last_hidden;
  bool has_convention; // layer_id_convention present (it then equals DF_HS_CONVENTION); absent: legacy shard
  int num_shards;
} df_hs_info;

// Opens one .h5 shard or a directory of shards (every *.h5, sorted by name) and validates every shard's
// attributes, datasets and index before returning. Not thread-safe: one handle per reader thread.
df_status df_hs_open(const char *path, df_hs_dataset **out, df_error *err);
void df_hs_close(df_hs_dataset *ds);
const df_hs_info *df_hs_get_info(const df_hs_dataset *ds);

// Shard k (0 <= k < num_shards): its path, the global number of its first sample, and its sample count.
void df_hs_shard(const df_hs_dataset *ds, int k, const char **path, int64_t *first, int64_t *count);
// The shard holding global sample i (in range) and i's number inside it.
int df_hs_shard_of(const df_hs_dataset *ds, int64_t i, int64_t *local);

// Rows in sample i (before any truncation).
df_status df_hs_sample_length(const df_hs_dataset *ds, int64_t i, int64_t *len, df_error *err);

// Caller buffers for one sample; each must hold min(length, max_len) rows. A NULL field is not read;
// last_hidden must be NULL when the data has no target_last_hidden_states.
typedef struct {
  int32_t *input_ids; // (L)
  uint8_t *loss_mask; // (L)
  float *hidden;      // (L, K·H)
  float *last_hidden; // (L, H)
} df_hs_sample_bufs;

// Reads the first min(length, max_len) rows of sample i (max_len <= 0: all rows) into bufs, converting
// bf16 to fp32; *out_len receives the row count.
df_status df_hs_read_sample(df_hs_dataset *ds, int64_t i, int64_t max_len, const df_hs_sample_bufs *bufs,
                            int64_t *out_len, df_error *err);

// The data must have been captured for this draft: K, the layer id list and H must match exactly.
df_status df_hs_check_target(const df_hs_dataset *ds, int expected_k, const int *expected_layer_ids, int64_t expected_h,
                             df_error *err);

// Attributes, sample/token counts and per-shard counts, for `draftforge inspect`.
df_status df_hs_print(const char *path, FILE *out, df_error *err);

// ---- writer --------------------------------------------------------------------------------------------

typedef struct df_hs_writer df_hs_writer;

typedef struct {
  int64_t hidden_size;         // H
  int num_layers;              // K
  const int *target_layer_ids; // K entries
  df_dtype dtype;              // DF_BF16 (stored as uint16 bits, round-to-nearest-even) or DF_F32
  bool has_last_hidden;        // every sample then carries target_last_hidden_states
  int64_t chunk_rows;          // rows per chunk of the hidden datasets; 0 = 64
  int gzip_level;              // 0 = no filter (the default: bf16 activations barely compress), 1..9 = shuffle+gzip
} df_hs_writer_options;

// Creates <path>.tmp (with layer_id_convention = DF_HS_CONVENTION); df_hs_writer_close renames it to path, so a crash
// never leaves a half-written shard.
df_status df_hs_writer_create(const char *path, const df_hs_writer_options *opt, df_hs_writer **out, df_error *err);

// Appends one sample of len >= 1 rows: input_ids (len), loss_mask (len, 0/1), hidden (len, K·H) fp32,
// last_hidden (len, H) fp32 (NULL unless has_last_hidden). Non-finite hidden values are rejected.
df_status df_hs_writer_append(df_hs_writer *w, int64_t len, const int32_t *input_ids, const uint8_t *loss_mask,
                              const float *hidden, const float *last_hidden, df_error *err);

// Writes sample_offsets, closes and renames; frees w whatever the outcome (on failure the .tmp is removed).
df_status df_hs_writer_close(df_hs_writer *w, df_error *err);

// Drops the shard: closes, removes <path>.tmp, frees w.
void df_hs_writer_abort(df_hs_writer *w);

// ---- pure validation (no I/O; fuzzed by tests/fuzz/fuzz_hs_index.c) -------------------------------------

// Root attribute values as read from one shard; absent ones are flagged.
typedef struct {
  const char *format; // NULL: absent
  bool has_version;
  int64_t version;
  bool has_hidden_size;
  int64_t hidden_size;
  const int64_t *layer_ids; // NULL: absent
  int64_t num_layers;
  const char *dtype;      // NULL: absent
  const char *convention; // layer_id_convention; NULL: absent (shards written before it existed)
} df_hs_attrs;

// Checks the attribute values; on success sets *dtype to DF_BF16 or DF_F32. file names the shard in errors. A
// layer_id_convention other than DF_HS_CONVENTION (a shifted capture, or an unknown one) is an error.
df_status df_hs_check_attrs(const df_hs_attrs *a, const char *file, df_dtype *dtype, df_error *err);

// What a shard's datasets look like: presence, element type and shape.
typedef enum { DF_HS_T_OTHER, DF_HS_T_I64, DF_HS_T_I32, DF_HS_T_U8, DF_HS_T_U16, DF_HS_T_F32 } df_hs_elem;

typedef struct {
  bool present;
  df_hs_elem elem;
  int ndim;
  int64_t dims[2];
} df_hs_dset_shape;

typedef struct {
  df_hs_dset_shape offsets, input_ids, loss_mask, hidden, last_hidden;
} df_hs_layout;

// Checks dataset presence, element types and shapes against K, H and dtype; on success sets *num_samples
// (N = len(sample_offsets) − 1) and *num_tokens (T = len(input_ids)).
df_status df_hs_check_layout(const df_hs_layout *l, int64_t k, int64_t h, df_dtype dtype, const char *file,
                             int64_t *num_samples, int64_t *num_tokens, df_error *err);

// Checks sample_offsets (n_offsets = N + 1 entries) against T rows: offsets[0] = 0, strictly increasing
// (no empty samples), offsets[N] = T.
df_status df_hs_check_index(const int64_t *offsets, int64_t n_offsets, int64_t num_tokens, const char *file,
                            df_error *err);

// bf16 <-> fp32. The writer rounds to nearest even; NaN stays a quiet NaN.
uint16_t df_hs_f32_to_bf16(float x);
float df_hs_bf16_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif

#endif
