// Where batches come from: a fixed set of samples addressed by index, each read as the padded df_batch of
// train/data/batch.h. Two sources exist: captured hidden states (HDF5 shards, below) and the target itself
// (train/data/online_source.h: token JSONL in, features computed per batch). The data feed and the evaluator read
// through this interface only, so both give the trainer the same batches from either source.
#ifndef DF_TRAIN_DATA_BATCH_SOURCE_H
#define DF_TRAIN_DATA_BATCH_SOURCE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "modeling/draft_config.h"
#include "train/data/batch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_batch_source df_batch_source;

typedef struct {
  // Samples index[0 .. B−1] in that order, each truncated to max_length rows (<= 0: no limit), zero padded to
  // the longest; with last_hidden also target_last_hidden_states (the source must have them). Nothing is left
  // allocated in *out on failure.
  df_status (*read)(df_batch_source *s, const int64_t *index, int64_t B, int64_t max_length, bool last_hidden,
                    df_batch *out, df_error *err);
  void (*close)(df_batch_source *s);
  // Sample i's token ids and loss mask alone (no features computed or read), truncated to max_length rows (<= 0: no
  // limit); *ids / *mask stay valid until the next call on s. NULL: the source cannot.
  df_status (*tokens)(df_batch_source *s, int64_t i, int64_t max_length, const int32_t **ids, const uint8_t **mask,
                      int64_t *len, df_error *err);
} df_batch_source_vt;

// The common head of every source (the implementation's struct starts with it).
struct df_batch_source {
  const df_batch_source_vt *vt;
  const char *label;    // the data path, for messages
  int64_t num_samples;  // indices are 0 .. num_samples − 1
  bool has_last_hidden; // can deliver target_last_hidden_states
  // The feed reads it on its reader thread while the caller trains (prefetch): safe, and worth it. The HDF5 source
  // when libhdf5 is thread-safe; the online source when asked (a CPU target shares the step's cores).
  bool concurrent;
};

static inline df_status df_batch_source_read(df_batch_source *s, const int64_t *index, int64_t B, int64_t max_length,
                                             bool last_hidden, df_batch *out, df_error *err) {
  return s->vt->read(s, index, B, max_length, last_hidden, out, err);
}

static inline void df_batch_source_close(df_batch_source *s) {
  if (s) s->vt->close(s);
}

// A strategy's reading of the training data before the first step of a fresh run (strategy.h `prepare`: EAGLE-3's
// vocabulary mapping), over src's samples with their tokens cut to max_length. DF_OK without reading when the
// strategy has no prepare; refused naming the source when it cannot list its tokens.
typedef struct df_strategy_run df_strategy_run;
df_status df_batch_source_prepare_strategy(df_batch_source *src, int64_t max_length, df_strategy_run *run,
                                           const char *vocab_mapping_path, bool write_files, FILE *log, df_error *err);

// Captured hidden states: one .h5 shard or a directory of them. When cfg is not NULL the data must have been
// captured for it (K, target_layer_ids, H); need_last_hidden requires target_last_hidden_states. concurrent
// when libhdf5 is thread-safe (the caller may read other HDF5 files while the feed's reader thread reads).
df_status df_hs_source_open(const char *path, const df_draft_config *cfg, bool need_last_hidden, df_batch_source **out,
                            df_error *err);

// A memory plan's stand-in for captured data (train/trainer/mem_plan.h): n samples of `length` tokens, every one
// supervised (loss_mask 1), token id 0, zero features of `width` (and last_hidden_size, when > 0, for the
// target_last_hidden_states). Nothing is read: the batches have the shapes of the run's largest micro-batch.
df_status df_synthetic_source_open(int64_t n, int64_t length, int64_t width, int64_t last_hidden_size,
                                   df_batch_source **out, df_error *err);

// The HDF5 dataset behind a source of df_hs_source_open (NULL for any other source): messages locate a sample
// in its shard through it.
typedef struct df_hs_dataset df_hs_dataset;
const df_hs_dataset *df_batch_source_dataset(const df_batch_source *s);

#ifdef __cplusplus
}
#endif

#endif
