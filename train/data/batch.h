// The data feed's batch assembly (docs/dflash-step.md §1): the epoch order drawn from the DATA stream, and
// micro-batches read from the hidden-state data, truncated to max_length and right-padded with zeros.
#ifndef DF_TRAIN_DATA_BATCH_H
#define DF_TRAIN_DATA_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "modeling/draft_config.h"
#include "strategies/batch.h"
#include "train/data/hs.h"

#ifdef __cplusplus
extern "C" {
#endif

// perm = [0 .. n−1] shuffled by Fisher–Yates with df_rng_init(seed + epoch, DF_RNG_STREAM_DATA):
// for i = n−1 down to 1, j = df_rng_below(i + 1), swap perm[i], perm[j].
void df_data_epoch_order(int64_t n, uint64_t seed, int64_t epoch, int64_t *perm);

// Reads samples index[0 .. B−1] (in that order), each truncated to max_length rows (<= 0: no limit).
df_status df_batch_read(df_hs_dataset *ds, const int64_t *index, int64_t B, int64_t max_length, df_batch *out,
                        df_error *err);
// The same, plus target_last_hidden_states into out->last_hidden when last_hidden is set (DSpark); data without
// them is then an error naming the path and the dataset.
df_status df_batch_read_ex(df_hs_dataset *ds, const int64_t *index, int64_t B, int64_t max_length, bool last_hidden,
                           df_batch *out, df_error *err);

// World size 1, epoch 0: the first micro-batch, perm[0 .. batch_size−1]. Fewer than batch_size samples is an
// error (drop_last). When cfg is not NULL the data must have been captured for it (K, target_layer_ids, H); a
// DSpark cfg also reads target_last_hidden_states when the data has them (out->last_hidden stays NULL otherwise:
// the DSpark objective says whether it needs them).
df_status df_batch_first(const char *data_path, uint64_t seed, int64_t batch_size, int64_t max_length,
                         const df_draft_config *cfg, df_batch *out, df_error *err);

// An all-zero batch of B samples padded to S rows (index and length zero too), with last_hidden when
// hidden_size > 0: what a batch source fills. On failure nothing stays allocated.
df_status df_batch_alloc(df_batch *b, int64_t B, int64_t S, int64_t width, int64_t hidden_size, df_error *err);

void df_batch_free(df_batch *b);

#ifdef __cplusplus
}
#endif

#endif
