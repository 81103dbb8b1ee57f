// Batch assembly over the hidden-state reader: the epoch-0 order and padded micro-batches (dflash-step.md §1).
#include "train/data/batch.h"

#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "strategies/strategy.h"

void df_data_epoch_order(int64_t n, uint64_t seed, int64_t epoch, int64_t *perm) {
  df_rng rng;
  df_rng_init(&rng, seed + (uint64_t)epoch, DF_RNG_STREAM_DATA);
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i >= 1; i--) {
    int64_t j = (int64_t)df_rng_below(&rng, (uint64_t)i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
}

void df_batch_free(df_batch *b) {
  if (!b) return;
  free(b->index), free(b->length), free(b->input_ids), free(b->loss_mask), free(b->hidden), free(b->last_hidden);
  memset(b, 0, sizeof *b);
}

// Lengths after truncation, and S = the longest.
static df_status batch_lengths(df_hs_dataset *ds, df_batch *b, int64_t max_length, df_error *err) {
  b->S = 0;
  for (int64_t i = 0; i < b->B; i++) {
    DF_TRY(df_hs_sample_length(ds, b->index[i], &b->length[i], err));
    if (max_length > 0 && b->length[i] > max_length) b->length[i] = max_length;
    if (b->length[i] > b->S) b->S = b->length[i];
  }
  return DF_OK;
}

static df_status batch_alloc(df_batch *b, df_error *err) {
  size_t rows = (size_t)(b->B * b->S);
  b->input_ids = calloc(rows, sizeof *b->input_ids);
  b->loss_mask = calloc(rows, 1);
  b->hidden = calloc(rows * (size_t)b->width, sizeof *b->hidden);
  if (b->hidden_size > 0) b->last_hidden = calloc(rows * (size_t)b->hidden_size, sizeof *b->last_hidden);
  if (b->input_ids && b->loss_mask && b->hidden && (b->hidden_size == 0 || b->last_hidden)) return DF_OK;
  return DF_FAIL(err, DF_ERR_NOMEM, "batch", "lower training.batch_size or data.max_length",
                 "out of memory for a batch of %lld × %lld rows of width %lld", (long long)b->B, (long long)b->S,
                 (long long)b->width);
}

df_status df_batch_alloc(df_batch *b, int64_t B, int64_t S, int64_t width, int64_t hidden_size, df_error *err) {
  memset(b, 0, sizeof *b);
  b->B = B, b->S = S, b->width = width, b->hidden_size = hidden_size;
  b->index = calloc((size_t)B, sizeof *b->index);
  b->length = calloc((size_t)B, sizeof *b->length);
  df_status st =
      b->index && b->length ? batch_alloc(b, err) : DF_FAIL(err, DF_ERR_NOMEM, "batch", NULL, "out of memory");
  if (st != DF_OK) df_batch_free(b);
  return st;
}

df_status df_batch_read(df_hs_dataset *ds, const int64_t *index, int64_t B, int64_t max_length, df_batch *out,
                        df_error *err) {
  return df_batch_read_ex(ds, index, B, max_length, false, out, err);
}

df_status df_batch_read_ex(df_hs_dataset *ds, const int64_t *index, int64_t B, int64_t max_length, bool last_hidden,
                           df_batch *out, df_error *err) {
  memset(out, 0, sizeof *out);
  const df_hs_info *info = df_hs_get_info(ds);
  if (last_hidden && !info->has_last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                   "capture the data with target_last_hidden_states (DSpark needs the target's final hidden states)",
                   "the hidden-state data has no target_last_hidden_states");
  out->B = B, out->width = (int64_t)info->num_layers * info->hidden_size;
  out->hidden_size = last_hidden ? info->hidden_size : 0;
  out->index = malloc((size_t)B * sizeof *out->index);
  out->length = malloc((size_t)B * sizeof *out->length);
  if (!out->index || !out->length) {
    df_batch_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "batch", NULL, "out of memory");
  }
  memcpy(out->index, index, (size_t)B * sizeof *index);
  df_status st = batch_lengths(ds, out, max_length, err);
  if (st == DF_OK) st = batch_alloc(out, err);
  for (int64_t i = 0; st == DF_OK && i < B; i++) {
    // A sample's rows are the first rows of its (S, ·) slice, so it reads in place; the rest stays zero.
    df_hs_sample_bufs bufs = {out->input_ids + i * out->S, out->loss_mask + i * out->S,
                              out->hidden + i * out->S * out->width,
                              out->last_hidden ? out->last_hidden + i * out->S * out->hidden_size : NULL};
    int64_t got = 0;
    st = df_hs_read_sample(ds, index[i], out->length[i], &bufs, &got, err);
  }
  if (st != DF_OK) df_batch_free(out);
  return st;
}

static df_status first_batch(df_hs_dataset *ds, uint64_t seed, int64_t batch_size, int64_t max_length, bool last,
                             const char *path, df_batch *out, df_error *err) {
  int64_t n = df_hs_get_info(ds)->num_samples;
  if (batch_size < 1 || n < batch_size)
    return DF_FAIL(err, DF_ERR_INVALID, path,
                   "lower training.batch_size or add data (the last partial batch is dropped)",
                   "%lld samples cannot fill one batch of %lld", (long long)n, (long long)batch_size);
  int64_t *perm = malloc((size_t)n * sizeof *perm);
  if (!perm) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory for %lld samples", (long long)n);
  df_data_epoch_order(n, seed, 0, perm);
  df_status st = df_batch_read_ex(ds, perm, batch_size, max_length, last, out, err);
  free(perm);
  return st;
}

df_status df_batch_first(const char *data_path, uint64_t seed, int64_t batch_size, int64_t max_length,
                         const df_draft_config *cfg, df_batch *out, df_error *err) {
  memset(out, 0, sizeof *out);
  df_hs_dataset *ds = NULL;
  DF_TRY(df_hs_open(data_path, &ds, err));
  df_status st = DF_OK;
  if (cfg)
    st = df_hs_check_target(ds, cfg->dflash.num_target_layer_ids, cfg->dflash.target_layer_ids, cfg->hidden_size, err);
  // A draft whose strategy reads the target's final hidden states (DSpark's teacher) gets them when the data has them.
  bool last = cfg && df_strategy_reads_last_hidden(cfg) && df_hs_get_info(ds)->has_last_hidden;
  if (st == DF_OK) st = first_batch(ds, seed, batch_size, max_length, last, data_path, out, err);
  df_hs_close(ds);
  return st;
}
