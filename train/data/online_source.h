// Online data (docs/target.md "Online training"): the target runs in-process and computes each batch's features
// from a token JSONL, so nothing but the tokens is ever on disk. A batch source (train/data/batch_source.h) whose
// batches equal those of a capture of the same file read back by the HDF5 source: the same samples (truncated to
// max_length, the ones without two adjacent supervised tokens dropped, in file order), the same prefill per sample
// (df_capture_sample), and features rounded to the stored dtype exactly as a bf16 shard rounds them.
#ifndef DF_TRAIN_DATA_ONLINE_SOURCE_H
#define DF_TRAIN_DATA_ONLINE_SOURCE_H

#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "modeling/draft_config.h"
#include "train/data/batch_source.h"

#ifdef __cplusplus
extern "C" {
#endif

// The target shared by a run's online sources (training feed and eval): weights, its own op context, and a lock,
// so the feed's reader thread and an eval on the caller's thread take turns on it.
typedef struct df_online_target df_online_target;

typedef struct {
  const char *target_dir;     // model.target_model_path
  const df_draft_config *cfg; // K, target_layer_ids (0 <= L <= layers − 2), H and the vocabulary must fit the target
  df_dtype feature_dtype; // DF_BF16: every feature rounded to bf16 (what a bf16 capture stores); DF_F32: as computed
  int threads;            // the target context's CPU threads (0: OpenMP's default)
  bool overlap;           // its sources may be read on the feed's reader thread (df_batch_source.concurrent)
  // The target's context (device, backend); NULL: the CPU. num_threads 0 takes `threads`. A device target computes
  // each sample there and reads its rows back into the host batch.
  const df_ctx_options *ctx_options;
  bool shapes_only; // a memory plan: the target's buffers are allocated from config.json, no weight is read
} df_online_target_options;

df_status df_online_target_open(const df_online_target_options *o, df_online_target **out, df_error *err);
// After every source opened on it is closed.
void df_online_target_free(df_online_target *t);

// What the target has done so far, over all sources: prefilled samples and tokens, seconds in its forward.
typedef struct {
  int64_t samples, tokens;
  double forward_s;
} df_online_stats;
df_online_stats df_online_target_stats(df_online_target *t);
// The target's own context (its memory is accounted there: kernels/ops.h df_ctx_mem_stats).
df_ctx *df_online_target_ctx(df_online_target *t);

// A source over the samples of a token JSONL (tools/run/prepare_data.py's format), scanned once at open: every line is
// checked (ids inside the target's vocabulary), truncated to max_length rows (<= 0: none) and kept when two
// adjacent tokens are supervised, which is what `draftforge capture --max-length max_length` keeps. Sample i is
// the i-th kept line; max_samples > 0 keeps only the first that many. *dropped (may be NULL) counts the lines
// dropped. Batches read a sample again by offset, prefill it on the target and round the features.
df_status df_online_source_open(df_online_target *t, const char *tokens_path, int64_t max_length, int64_t max_samples,
                                int64_t *dropped, df_batch_source **out, df_error *err);

// A memory plan's online source: n samples of `length` tokens (token 0, every one supervised) prefilled like any
// other — the same KV cache, device rows and forward — with no file read.
df_status df_online_source_open_synthetic(df_online_target *t, int64_t length, int64_t n, df_batch_source **out,
                                          df_error *err);

#ifdef __cplusplus
}
#endif

#endif
