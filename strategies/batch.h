// The micro-batch a strategy trains on, as the data feed (train/data/) assembles it: padded token ids, loss mask and
// the target's features, host memory.
#ifndef DF_STRATEGIES_BATCH_H
#define DF_STRATEGIES_BATCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One padded micro-batch. Rows past a sample's length are zero (ids 0, loss mask 0, hidden 0).
typedef struct {
  int64_t B, S;        // samples, padded length (the longest truncated sample)
  int64_t width;       // K·H: one hidden row
  int64_t *index;      // (B) dataset sample indices, in batch order
  int64_t *length;     // (B) rows of each sample after truncation
  int32_t *input_ids;  // (B, S)
  uint8_t *loss_mask;  // (B, S)
  float *hidden;       // (B, S, K·H)
  float *last_hidden;  // (B, S, H) target_last_hidden_states (DSpark's teacher), or NULL when not read
  int64_t hidden_size; // H of last_hidden (0 when it is NULL)
} df_batch;

#ifdef __cplusplus
}
#endif

#endif
