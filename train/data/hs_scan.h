// NaN/Inf in hidden-state data (docs/data-format.md "Validation"): a scan of every sample or of a sample of them,
// reported by shard, sample and token, for `draftforge inspect`, the trainer's start-up check, the trainer's
// skipped steps and eval.
#ifndef DF_TRAIN_DATA_HS_SCAN_H
#define DF_TRAIN_DATA_HS_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "train/data/hs.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_HS_SCAN_SAMPLED, DF_HS_SCAN_FULL } df_hs_scan_mode;

// A sampled scan reads M samples evenly spaced over the whole data (the first and last included):
// M = min(N, 16 · shards, max(1, budget · N / (T · row bytes))) — 16 per shard, but never much more than 256 MiB
// of stored hidden states, so its cost at start-up stays bounded on data of any size.
#define DF_HS_SCAN_PER_SHARD    16
#define DF_HS_SCAN_BUDGET_BYTES (INT64_C(256) << 20)

enum { DF_HS_SCAN_MAX_REPORT = 16 };

// The first non-finite value of one sample.
typedef struct {
  int64_t sample;      // global number
  char shard[512];     // the shard's path
  int64_t local;       // number inside the shard
  int64_t token;       // row inside the sample
  int64_t column;      // column of that row
  const char *dataset; // DF_HS_DS_HIDDEN or DF_HS_DS_LAST_HIDDEN
  float value;         // NaN or ±Inf
} df_hs_bad_value;

typedef struct {
  bool full;
  int64_t scanned, total; // samples read / samples in the data
  int64_t bad_samples;    // samples with a non-finite value
  int nreported;          // the first DF_HS_SCAN_MAX_REPORT of them
  df_hs_bad_value bad[DF_HS_SCAN_MAX_REPORT];
} df_hs_scan_report;

// Scans every sample (full) or the sampled scan's M samples.
df_status df_hs_scan(df_hs_dataset *ds, df_hs_scan_mode mode, df_hs_scan_report *rep, df_error *err);
// Scans the given global samples (the samples of a skipped step).
df_status df_hs_scan_samples(df_hs_dataset *ds, const int64_t *samples, int64_t n, df_hs_scan_report *rep,
                             df_error *err);

// How many samples a sampled scan of ds reads (M above).
int64_t df_hs_scan_sampled_count(const df_hs_dataset *ds);

// One sample's rows in memory: hidden (L, W) and, when not NULL, last (L, H). True (and *bad's token, column,
// dataset, value filled) when a value is not finite.
bool df_hs_find_nonfinite(const float *hidden, int64_t L, int64_t W, const float *last, int64_t H,
                          df_hs_bad_value *bad);
// Fills bad's shard, local and sample for global sample i of ds.
void df_hs_bad_value_locate(const df_hs_dataset *ds, int64_t i, df_hs_bad_value *bad);
// Adds bad to rep (counted; kept while there is room).
void df_hs_scan_add(df_hs_scan_report *rep, const df_hs_bad_value *bad);

// "shard data/a.h5: sample 5 (#5), token 3: hidden_states column 7 is NaN"
void df_hs_bad_value_text(const df_hs_bad_value *b, char *buf, size_t n);
// "16 of 160 samples" (a sampled scan of a larger data set) or "160 samples".
void df_hs_scan_summary(const df_hs_scan_report *rep, char *buf, size_t n);
// `draftforge inspect` of a shard or shard directory: df_hs_print, then the scan's verdict, every reported sample
// on its own line. Found values fail with df_hs_scan_fail.
df_status df_hs_inspect(const char *path, df_hs_scan_mode mode, FILE *out, df_error *err);

// The error for a scan that found values (DF_ERR_FORMAT, where = the first bad shard): names the first sample.
df_status df_hs_scan_fail(const df_hs_scan_report *rep, const char *what, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
