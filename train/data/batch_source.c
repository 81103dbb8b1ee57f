// The HDF5 batch source (train/data/batch_source.h): captured shards read with df_batch_read_ex.
#include "train/data/batch_source.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/strategy.h"
#include "train/data/hs.h"

typedef struct {
  df_batch_source base;
  df_hs_dataset *ds;
  char *path;
  int32_t *ids; // (cap) hs_tokens' sample
  uint8_t *mask;
  int64_t cap;
} hs_source;

static df_status hs_read(df_batch_source *s, const int64_t *index, int64_t B, int64_t max_length, bool last_hidden,
                         df_batch *out, df_error *err) {
  return df_batch_read_ex(((hs_source *)s)->ds, index, B, max_length, last_hidden, out, err);
}

static void hs_close(df_batch_source *s) {
  hs_source *h = (hs_source *)s;
  df_hs_close(h->ds);
  free(h->path), free(h->ids), free(h->mask);
  free(h);
}

static df_status hs_tokens(df_batch_source *s, int64_t i, int64_t max_length, const int32_t **ids, const uint8_t **mask,
                           int64_t *len, df_error *err) {
  hs_source *h = (hs_source *)s;
  int64_t L = 0;
  DF_TRY(df_hs_sample_length(h->ds, i, &L, err));
  if (max_length > 0 && L > max_length) L = max_length;
  if (L > h->cap) {
    free(h->ids), free(h->mask);
    h->ids = malloc(sizeof(int32_t) * (size_t)L), h->mask = malloc((size_t)L);
    h->cap = h->ids && h->mask ? L : 0;
    if (!h->cap) return DF_FAIL(err, DF_ERR_NOMEM, h->path, NULL, "out of memory for sample %lld", (long long)i);
  }
  const df_hs_sample_bufs bufs = {.input_ids = h->ids, .loss_mask = h->mask};
  DF_TRY(df_hs_read_sample(h->ds, i, L, &bufs, len, err));
  *ids = h->ids, *mask = h->mask;
  return DF_OK;
}

static const df_batch_source_vt HS_VT = {hs_read, hs_close, hs_tokens};

const df_hs_dataset *df_batch_source_dataset(const df_batch_source *s) {
  return s && s->vt == &HS_VT ? ((const hs_source *)s)->ds : NULL;
}

static df_status hs_check(const hs_source *h, const df_draft_config *cfg, bool need_last_hidden, df_error *err) {
  const df_hs_info *info = df_hs_get_info(h->ds);
  if (cfg)
    DF_TRY(df_hs_check_target(h->ds, cfg->dflash.num_target_layer_ids, cfg->dflash.target_layer_ids, cfg->hidden_size,
                              err));
  if (need_last_hidden && !info->has_last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, h->path,
                   "recapture the data with target_last_hidden_states (draftforge capture --last-hidden yes)",
                   "the data has no %s dataset, which this draft needs", DF_HS_DS_LAST_HIDDEN);
  return DF_OK;
}

df_status df_hs_source_open(const char *path, const df_draft_config *cfg, bool need_last_hidden, df_batch_source **out,
                            df_error *err) {
  *out = NULL;
  hs_source *h = calloc(1, sizeof *h);
  if (h) h->path = strdup(path);
  if (!h || !h->path) {
    free(h);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  }
  df_status st = df_hs_open(path, &h->ds, err);
  if (st == DF_OK) st = hs_check(h, cfg, need_last_hidden, err);
  if (st != DF_OK) {
    hs_close(&h->base);
    return st;
  }
  const df_hs_info *info = df_hs_get_info(h->ds);
  hbool_t threadsafe = 0;
  H5is_library_threadsafe(&threadsafe);
  h->base = (df_batch_source){.vt = &HS_VT,
                              .label = h->path,
                              .num_samples = info->num_samples,
                              .has_last_hidden = info->has_last_hidden,
                              .concurrent = threadsafe != 0};
  *out = &h->base;
  return DF_OK;
}

// ---- a strategy's reading of any source ------------------------------------------------------------------------

typedef struct {
  df_batch_source *src;
  int64_t max_length;
} data_view;

static df_status view_sample(void *self, int64_t i, const int32_t **ids, const uint8_t **mask, int64_t *len,
                             df_error *err) {
  data_view *v = self;
  return v->src->vt->tokens(v->src, i, v->max_length, ids, mask, len, err);
}

df_status df_batch_source_prepare_strategy(df_batch_source *src, int64_t max_length, df_strategy_run *run,
                                           const char *vocab_mapping_path, bool write_files, FILE *log, df_error *err) {
  if (!run->table->prepare) return DF_OK;
  if (!src->vt->tokens)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, src->label, NULL, "this data source cannot list its tokens");
  data_view v = {.src = src, .max_length = max_length};
  const df_strategy_data data = {.self = &v,
                                 .count = src->num_samples,
                                 .sample = view_sample,
                                 .vocab_mapping_path = vocab_mapping_path,
                                 .write_files = write_files,
                                 .log = log};
  return run->table->prepare(run, &data, err);
}
