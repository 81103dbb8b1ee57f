// The training data feed: per-epoch order (docs/dflash-step.md §1), data-parallel striding by rank,
// drop_last, truncation and padding (train/data/batch.h), with a reader thread that prefetches the next
// micro-batch while the current one trains. Its position (epoch, cursor) is checkpointable. Batches come from a
// batch source (train/data/batch_source.h): captured shards, or the target run online (train/data/online_source.h).
#ifndef DF_TRAIN_DATA_DATA_FEED_H
#define DF_TRAIN_DATA_DATA_FEED_H

#include <stdint.h>

#include "base/error.h"
#include "modeling/draft_config.h"
#include "train/data/batch.h"
#include "train/data/batch_source.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_feed df_feed;

typedef struct {
  const char *path;   // data.hidden_states_path (file or shard directory), read when source is NULL
  int64_t batch_size; // per-rank micro-batch
  int64_t max_length; // <= 0: no truncation
  uint64_t seed;      // training.seed; epoch e uses seed + e (DATA stream)
  int rank, world_size;
  bool prefetch;              // start the reader thread
  const df_draft_config *cfg; // data must match (K, target_layer_ids, H); may be NULL
  bool need_last_hidden;      // DSpark: the shards must carry target_last_hidden_states
  // Another source (the online target; cfg is then not checked here: the source was opened for it). The feed
  // owns it from df_feed_open on, whether that succeeds or not.
  df_batch_source *source;
} df_feed_options;

// The epoch order is perm(seed + epoch), cut into global batches of world · batch_size samples (the last
// partial one dropped); rank r takes slots r, r + world, ... of each, i.e. perm[r], perm[r + world], ... So an
// epoch has the same batches for every world size at the same global batch: rank r's batch c at world W is
// exactly the samples k ≡ r (mod W) of the one-process batch c of size W · batch_size.
df_status df_feed_open(const df_feed_options *opt, df_feed **out, df_error *err);
void df_feed_close(df_feed *f);

int64_t df_feed_num_samples(const df_feed *f);
int64_t df_feed_batches_per_epoch(const df_feed *f); // per rank, drop_last

// Position: the next batch is batch `cursor` (0-based) of epoch `epoch`. Seeking discards any prefetch.
df_status df_feed_seek(df_feed *f, int64_t epoch, int64_t cursor, df_error *err);
void df_feed_position(const df_feed *f, int64_t *epoch, int64_t *cursor);

// The next micro-batch (blocking on the reader thread when prefetching); the position advances, wrapping
// into the next epoch after the last batch. *out stays valid until the next call. *wait_s (may be NULL)
// receives the seconds spent waiting for data.
df_status df_feed_next(df_feed *f, const df_batch **out, double *wait_s, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
