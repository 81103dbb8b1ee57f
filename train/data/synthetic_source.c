// The memory plan's captured data (train/data/batch_source.h: df_synthetic_source_open): samples of the longest
// length a run reads, every token supervised, token 0 and zero features. It reads nothing; its batches have the
// shapes of the largest micro-batch the run can see.
#include <stdlib.h>
#include <string.h>

#include "train/data/batch.h"
#include "train/data/batch_source.h"

typedef struct {
  df_batch_source base;
  int64_t length, width, last;
} synthetic_source;

static df_status synthetic_read(df_batch_source *src, const int64_t *index, int64_t B, int64_t max_length,
                                bool last_hidden, df_batch *out, df_error *err) {
  synthetic_source *s = (synthetic_source *)src;
  const int64_t S = max_length > 0 && s->length > max_length ? max_length : s->length;
  // calloc'd: the features are zero pages nobody writes (a plan of a large batch costs no memory for them)
  DF_TRY(df_batch_alloc(out, B, S, s->width, last_hidden ? s->last : 0, err));
  memset(out->loss_mask, 1, (size_t)(B * S));
  for (int64_t i = 0; i < B; i++) out->index[i] = index[i], out->length[i] = S;
  return DF_OK;
}

static void synthetic_close(df_batch_source *src) { free(src); }

// No tokens: a plan derives no data-dependent state (EAGLE-3's vocabulary mapping is not read on a measuring context).
static const df_batch_source_vt SYNTHETIC_VT = {synthetic_read, synthetic_close, NULL};

df_status df_synthetic_source_open(int64_t n, int64_t length, int64_t width, int64_t last_hidden_size,
                                   df_batch_source **out, df_error *err) {
  *out = NULL;
  if (n < 1 || length < 1 || width < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "data.max_length", "a memory plan needs data.max_length > 0",
                   "synthetic data of %lld samples x %lld tokens x %lld features", (long long)n, (long long)length,
                   (long long)width);
  synthetic_source *s = calloc(1, sizeof *s);
  if (!s) return DF_FAIL(err, DF_ERR_NOMEM, "synthetic data", NULL, "out of memory");
  s->length = length, s->width = width, s->last = last_hidden_size;
  s->base = (df_batch_source){.vt = &SYNTHETIC_VT,
                              .label = "synthetic data (memory plan)",
                              .num_samples = n,
                              .has_last_hidden = last_hidden_size > 0};
  *out = &s->base;
  return DF_OK;
}
