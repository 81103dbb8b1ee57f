// `draftforge capture`: token JSONL → HDF5 hidden-state shards from the target's own forward (docs/target.md).
// Optional greedy regeneration of each response; shard k holds the samples of input lines
// [k·samples_per_shard, (k+1)·samples_per_shard), so a rerun skips the shards that exist (each is renamed into
// place only when complete) and redoes a partial one. capture.json records the settings; a rerun with others
// is refused, so no capture is mixed into another one's directory. The target runs on the chosen device; each
// sample's features are computed there and read back once for the shard writer.
#ifndef DF_TRAIN_DATA_CAPTURE_H
#define DF_TRAIN_DATA_CAPTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/tensor.h"
#include "modeling/target/target_model.h"
#include "train/recipe/device.h"

typedef struct {
  const char *target_dir, *data_path, *draft_config_path, *out_dir;
  bool regenerate;                   // replace every response by the target's greedy continuation of its prompt
  int64_t max_new_tokens;            // with regenerate (default 256)
  int64_t max_length;                // truncate samples to this many tokens (default 2048)
  int64_t samples_per_shard;         // default 1000
  df_dtype dtype;                    // DF_BF16 (default) or DF_F32
  int last_hidden;                   // target_last_hidden_states: -1 auto (DSpark drafts), 0 no, 1 yes
  FILE *log;                         // progress and summary (NULL: quiet)
  df_device_choice device;           // where the target runs (--device; auto: CUDA when built and visible)
  int threads;                       // CPU threads (0: OpenMP's)
  const df_ctx_options *ctx_options; // when not NULL, the exact context to run on (tests: the fake device)
} df_capture_options;

typedef struct {
  int64_t lines, written, dropped, skipped_shards, shards;
  int64_t tokens, generated_tokens;
  double seconds;
} df_capture_report;

df_status df_capture_run(const df_capture_options *o, df_capture_report *rep, df_error *err);

// One sample's features, as capture stores them and an online feed would hand them to the trainer: a fresh
// prefill of ids (len tokens; the cache is reset) returning hidden (len, K·H) for layer_ids and, when last is
// not NULL, the final post-norm state (len, H). Buffers are on the target context's device.
df_status df_capture_sample(df_target *t, df_target_cache *c, const int32_t *ids, int64_t len, int k,
                            const int *layer_ids, float *hidden, float *last, df_error *err);

// The prompt of a prepared sample: the tokens before its first supervised one (the assistant header ends
// there). 0 when the sample starts supervised; len when nothing is supervised.
int64_t df_capture_prompt_len(const uint8_t *mask, int64_t len);

// Layer ids the capture accepts for a target of n layers: 0 <= L <= n − 2. The last layer is refused: transformers'
// hidden_states[n] is post-norm there and SGLang cannot capture it, so id n − 1 would mean two different things.
df_status df_capture_check_layer_ids(const int *ids, int k, int64_t num_layers, df_error *err);

#endif
