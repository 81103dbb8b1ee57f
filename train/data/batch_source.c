// The HDF5 batch source (train/data/batch_source.h): captured shards read with df_batch_read_ex.
#include "train/data/batch_source.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "train/data/hs.h"

typedef struct {
  df_batch_source base;
  df_hs_dataset *ds;
  char *path;
} hs_source;

static df_status hs_read(df_batch_source *s, const int64_t *index, int64_t B, int64_t max_length, bool last_hidden,
                         df_batch *out, df_error *err) {
  return df_batch_read_ex(((hs_source *)s)->ds, index, B, max_length, last_hidden, out, err);
}

static void hs_close(df_batch_source *s) {
  hs_source *h = (hs_source *)s;
  df_hs_close(h->ds);
  free(h->path);
  free(h);
}

static const df_batch_source_vt HS_VT = {hs_read, hs_close};

const df_hs_dataset *df_batch_source_dataset(const df_batch_source *s) {
  return s && s->vt == &HS_VT ? ((const hs_source *)s)->ds : NULL;
}

static df_status hs_check(const hs_source *h, const df_draft_config *cfg, bool need_last_hidden, df_error *err) {
  const df_hs_info *info = df_hs_get_info(h->ds);
  if (cfg)
    DF_TRY(df_hs_check_target(h->ds, cfg->dflash.num_target_layer_ids, cfg->dflash.target_layer_ids, cfg->hidden_size,
                              err));
  if (need_last_hidden && !info->has_last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, h->path, "recapture the data with target_last_hidden_states (DSpark)",
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
