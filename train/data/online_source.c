// The online batch source (train/data/online_source.h): a shared, locked target; a token JSONL scanned once into an
// index of kept samples; per batch, one fresh prefill per sample written straight into the batch rows, then the
// rounding a stored shard would have applied.
#include "train/data/online_source.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "modeling/target/target_model.h"
#include "modeling/target_config.h"
#include "train/data/capture.h"
#include "train/data/hs.h"
#include "train/data/token_jsonl.h"

struct df_online_target {
  df_ctx *ctx; // the target's own context: its forward may run on the feed's reader thread
  df_target *target;
  int k;
  int layer_ids[DF_HS_MAX_LAYERS];
  int64_t hidden, vocab;
  df_dtype dtype;
  int threads;        // the context's thread count, also OpenBLAS's for every forward (on whichever thread)
  bool overlap;       // its sources are concurrent
  pthread_mutex_t mu; // one forward at a time (the target's scratch is shared); guards stats too
  df_online_stats stats;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- the target ------------------------------------------------------------------------------------------------

// The checks capture makes: the draft fits the target's config, and its layer ids can be captured.
static df_status check_draft(const df_online_target_options *o, df_error *err) {
  const df_target_config *tc = NULL;
  DF_TRY(df_target_config_from_dir(o->target_dir, &tc, err));
  df_status st = df_draft_config_check_target(o->cfg, tc, err);
  const df_dflash_config *dc = &o->cfg->dflash;
  if (st == DF_OK)
    st = df_capture_check_layer_ids(dc->target_layer_ids, dc->num_target_layer_ids, tc->num_hidden_layers, err);
  df_target_config_free(tc);
  return st;
}

df_status df_online_target_open(const df_online_target_options *o, df_online_target **out, df_error *err) {
  *out = NULL;
  if (o->feature_dtype != DF_BF16 && o->feature_dtype != DF_F32)
    return DF_FAIL(err, DF_ERR_INVALID, "data.online_feature_dtype", "bfloat16 or float32",
                   "online features are rounded to bfloat16 or kept float32");
  if (o->cfg->dflash.num_target_layer_ids > DF_HS_MAX_LAYERS)
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.target_layer_ids", NULL, "more than %d target layers",
                   DF_HS_MAX_LAYERS);
  DF_TRY(check_draft(o, err));
  df_online_target *t = calloc(1, sizeof *t);
  if (!t) return DF_FAIL(err, DF_ERR_NOMEM, o->target_dir, NULL, "out of memory");
  pthread_mutex_init(&t->mu, NULL);
  t->k = o->cfg->dflash.num_target_layer_ids;
  memcpy(t->layer_ids, o->cfg->dflash.target_layer_ids, sizeof(int) * (size_t)t->k);
  t->dtype = o->feature_dtype, t->overlap = o->overlap;
  // The target's own context, on the trainer's device: the forward writes its outputs there and each sample's
  // rows are read back into the host batch, which the trainer's stage uploads like any other.
  df_ctx_options co = o->ctx_options ? *o->ctx_options : (df_ctx_options){.device = DF_DEV_CPU};
  if (co.num_threads == 0) co.num_threads = o->threads;
  df_status st = df_ctx_create(&co, &t->ctx, err);
  if (st == DF_OK)
    st = o->shapes_only ? df_target_create(o->target_dir, t->ctx, &t->target, err)
                        : df_target_load(o->target_dir, t->ctx, &t->target, err);
  if (st != DF_OK) {
    df_online_target_free(t);
    return st;
  }
  const df_target_spec *sp = df_target_get_spec(t->target);
  t->hidden = sp->hidden, t->vocab = sp->vocab;
  t->threads = df_ctx_num_threads(t->ctx);
  *out = t;
  return DF_OK;
}

void df_online_target_free(df_online_target *t) {
  if (!t) return;
  df_target_free(t->target);
  df_ctx_destroy(t->ctx);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

df_ctx *df_online_target_ctx(df_online_target *t) { return t->ctx; }

df_online_stats df_online_target_stats(df_online_target *t) {
  pthread_mutex_lock(&t->mu);
  df_online_stats s = t->stats;
  pthread_mutex_unlock(&t->mu);
  return s;
}

// ---- the source ------------------------------------------------------------------------------------------------

typedef struct {
  df_batch_source base;
  df_online_target *t;
  char *path;
  df_token_jsonl in;               // read by offset; one reader at a time (the feed's thread, or the caller)
  df_target_cache *cache;          // this source's KV cache, as long as its longest sample
  int64_t n, *offset, *line, *len; // (n) the kept samples: line offset, line number, length after truncation
  int64_t longest;
  float *full_hidden, *full_last; // a whole sample's features when a read wants fewer rows (allocated then)
  float *dev_hidden, *dev_last;   // a device target's outputs (longest rows; NULL on the CPU): read back per sample
  int32_t *zeros;                 // a memory plan's tokens (longest of them; NULL: the JSONL's)
} online_source;

static bool has_adjacent(const uint8_t *mask, int64_t len) {
  for (int64_t i = 0; i + 1 < len; i++)
    if (mask[i] && mask[i + 1]) return true;
  return false;
}

// Every line once: checked, truncated, kept or dropped. *longest: the longest kept sample.
static df_status scan(online_source *s, int64_t max_length, int64_t max_samples, int64_t *longest, int64_t *dropped,
                      df_error *err) {
  int64_t cap = 0;
  *longest = 0, *dropped = 0;
  while (max_samples <= 0 || s->n < max_samples) {
    bool done = false;
    DF_TRY(df_token_jsonl_next(&s->in, &done, err));
    if (done) break;
    const int64_t len = max_length > 0 && s->in.len > max_length ? max_length : s->in.len;
    if (!has_adjacent(s->in.mask, len)) {
      (*dropped)++;
      continue;
    }
    if (s->n == cap) {
      cap = cap ? 2 * cap : 1024;
      int64_t *o = realloc(s->offset, sizeof *o * (size_t)cap);
      if (o) s->offset = o;
      int64_t *l = realloc(s->line, sizeof *l * (size_t)cap);
      if (l) s->line = l;
      int64_t *n = realloc(s->len, sizeof *n * (size_t)cap);
      if (n) s->len = n;
      if (!o || !l || !n) return DF_FAIL(err, DF_ERR_NOMEM, s->path, NULL, "out of memory for the sample index");
    }
    s->offset[s->n] = s->in.offset, s->line[s->n] = s->in.line, s->len[s->n] = len;
    s->n++;
    if (len > *longest) *longest = len;
  }
  if (s->n == 0)
    return DF_FAIL(err, DF_ERR_INVALID, s->path, "supervise at least two adjacent tokens (loss_mask = 1) per sample",
                   "%s: no sample has two adjacent supervised tokens within data.max_length; nothing to train on",
                   s->path);
  return DF_OK;
}

// The rounding of a stored shard (hs_writer.c): bf16 round-to-nearest-even and back, refusing what it would refuse
// (a value that is or rounds to a non-finite one). f32 keeps the bits and refuses only non-finite values.
static df_status round_rows(const online_source *s, float *x, int64_t rows, int64_t w, int64_t sample, const char *what,
                            df_error *err) {
  const bool bf16 = s->t->dtype == DF_BF16;
  const float limit = bf16 ? 3.3961514e38f : INFINITY; // 0x7F7F8000: the smallest fp32 that rounds to a bf16 Inf
  for (int64_t i = 0; i < rows * w; i++) {
    if (!(fabsf(x[i]) < limit))
      return DF_FAIL(err, DF_ERR_NUMERIC, s->path, "check the target checkpoint; drop the sample from the data",
                     "%s:%lld: the target's %s[%lld, %lld] is not finite%s", s->path, (long long)s->line[sample], what,
                     (long long)(i / w), (long long)(i % w), bf16 ? " in bfloat16" : "");
    if (bf16) x[i] = df_hs_bf16_to_f32(df_hs_f32_to_bf16(x[i]));
  }
  return DF_OK;
}

// A read that truncates below the scan's length still gets the rows of the whole sample's prefill, as a shard
// captured at that length holds them (the target's GEMMs are not bitwise the same for another row count).
static df_status full_buffers(online_source *s, bool last, df_error *err) {
  const int64_t rows = s->longest, H = s->t->hidden;
  if (!s->full_hidden) s->full_hidden = malloc(sizeof(float) * (size_t)(rows * s->t->k * H));
  if (last && !s->full_last) s->full_last = malloc(sizeof(float) * (size_t)(rows * H));
  if (!s->full_hidden || (last && !s->full_last))
    return DF_FAIL(err, DF_ERR_NOMEM, s->path, "lower data.max_length", "out of memory for a sample's features");
  return DF_OK;
}

// Sample idx into row block i of b: tokens, mask, then the target's features (straight into the batch rows when
// the read keeps the whole sample) and the rounding of a stored shard.
static df_status one_sample(online_source *s, df_batch *b, int64_t i, int64_t idx, bool last, df_error *err) {
  df_online_target *t = s->t;
  const int64_t L = b->length[i], full = s->len[idx], W = b->width, H = t->hidden;
  const int32_t *ids = s->zeros;
  if (ids) { // a memory plan: token 0, every one supervised
    memset(b->loss_mask + i * b->S, 1, (size_t)L);
  } else {
    DF_TRY(df_token_jsonl_read_at(&s->in, s->offset[idx], s->line[idx], err));
    memcpy(b->input_ids + i * b->S, s->in.ids, sizeof(int32_t) * (size_t)L);
    memcpy(b->loss_mask + i * b->S, s->in.mask, (size_t)L);
    ids = s->in.ids;
  }
  float *hidden = b->hidden + i * b->S * W;
  float *final = last ? b->last_hidden + i * b->S * H : NULL;
  if (s->dev_hidden) {
    hidden = s->dev_hidden, final = last ? s->dev_last : NULL;
  } else if (full > L) {
    DF_TRY(full_buffers(s, last, err));
    hidden = s->full_hidden, final = last ? s->full_last : NULL;
  }
  pthread_mutex_lock(&t->mu);
  // OpenBLAS splits an sgemm by the calling thread's OpenMP thread count, and the bits follow the split: the feed's
  // reader thread starts with OpenMP's default, the caller may have set another. Every forward runs with the
  // context's count, so prefetch on or off and eval on the caller's thread give the same features, and they equal a
  // `draftforge capture --threads N` of the same data when the run has --threads N.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(t->threads);
  double t0 = now_s();
  df_status st = df_capture_sample(t->target, s->cache, ids, full, t->k, t->layer_ids, hidden, final, err);
  if (st == DF_OK && s->dev_hidden) { // the batch's L rows, read back from the device
    const df_device dev = df_ctx_device(t->ctx);
    float *hb = b->hidden + i * b->S * W, *fb = last ? b->last_hidden + i * b->S * H : NULL;
    st = df_copy(t->ctx, hb, DF_DEV_CPU, hidden, dev, sizeof(float) * (size_t)(L * W), err);
    if (st == DF_OK && fb) st = df_copy(t->ctx, fb, DF_DEV_CPU, final, dev, sizeof(float) * (size_t)(L * H), err);
    hidden = hb, final = fb;
  }
  t->stats.forward_s += now_s() - t0;
  omp_set_num_threads(saved);
  t->stats.samples++, t->stats.tokens += full;
  pthread_mutex_unlock(&t->mu);
  DF_TRY(st);
  if (full > L && !s->dev_hidden) {
    memcpy(b->hidden + i * b->S * W, hidden, sizeof(float) * (size_t)(L * W));
    if (last) memcpy(b->last_hidden + i * b->S * H, final, sizeof(float) * (size_t)(L * H));
    hidden = b->hidden + i * b->S * W, final = last ? b->last_hidden + i * b->S * H : NULL;
  }
  DF_TRY(round_rows(s, hidden, L, W, idx, DF_HS_DS_HIDDEN, err));
  return final ? round_rows(s, final, L, H, idx, DF_HS_DS_LAST_HIDDEN, err) : DF_OK;
}

static df_status online_read(df_batch_source *src, const int64_t *index, int64_t B, int64_t max_length,
                             bool last_hidden, df_batch *out, df_error *err) {
  online_source *s = (online_source *)src;
  int64_t S = 0;
  for (int64_t i = 0; i < B; i++) {
    if (index[i] < 0 || index[i] >= s->n)
      return DF_FAIL(err, DF_ERR_INVALID, s->path, NULL, "sample %lld of %lld requested", (long long)index[i],
                     (long long)s->n);
    int64_t L = max_length > 0 && s->len[index[i]] > max_length ? max_length : s->len[index[i]];
    if (L > S) S = L;
  }
  const int64_t H = s->t->hidden;
  DF_TRY(df_batch_alloc(out, B, S, (int64_t)s->t->k * H, last_hidden ? H : 0, err));
  df_status st = DF_OK;
  for (int64_t i = 0; i < B && st == DF_OK; i++) {
    out->index[i] = index[i];
    out->length[i] = max_length > 0 && s->len[index[i]] > max_length ? max_length : s->len[index[i]];
    st = one_sample(s, out, i, index[i], last_hidden, err);
  }
  if (st != DF_OK) df_batch_free(out);
  return st;
}

static void online_close(df_batch_source *src) {
  online_source *s = (online_source *)src;
  df_target_cache_free(s->cache);
  df_token_jsonl_close(&s->in);
  free(s->offset), free(s->line), free(s->len), free(s->path), free(s->full_hidden), free(s->full_last), free(s->zeros);
  df_buffer_free(s->t->ctx, s->dev_hidden), df_buffer_free(s->t->ctx, s->dev_last);
  free(s);
}

// The kept sample's tokens from its line (the target does not run).
static df_status online_tokens(df_batch_source *bs, int64_t i, int64_t max_length, const int32_t **ids,
                               const uint8_t **mask, int64_t *len, df_error *err) {
  online_source *s = (online_source *)bs;
  DF_TRY(df_token_jsonl_read_at(&s->in, s->offset[i], s->line[i], err));
  *len = max_length > 0 && s->len[i] > max_length ? max_length : s->len[i];
  *ids = s->in.ids, *mask = s->in.mask;
  return DF_OK;
}

static const df_batch_source_vt ONLINE_VT = {online_read, online_close, online_tokens};

static online_source *source_new(df_online_target *t, const char *label) {
  online_source *s = calloc(1, sizeof *s);
  if (s) s->path = strdup(label);
  if (s && !s->path) free(s), s = NULL;
  if (s) s->t = t;
  return s;
}

// What every sample shares: a KV cache as long as the longest, and on a device the rows each prefill is read from.
static df_status source_buffers(online_source *s, int64_t longest, df_error *err) {
  df_online_target *t = s->t;
  s->longest = longest;
  DF_TRY(df_target_cache_create(t->target, longest, &s->cache, err));
  if (df_ctx_host_addressable(t->ctx)) return DF_OK;
  const size_t row = sizeof(float) * (size_t)t->hidden;
  DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_ACTIVATIONS, row * (size_t)(longest * t->k), (void **)&s->dev_hidden,
                            err));
  return df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_ACTIVATIONS, row * (size_t)longest, (void **)&s->dev_last, err);
}

static void source_done(online_source *s, df_batch_source **out) {
  s->base = (df_batch_source){
      .vt = &ONLINE_VT, .label = s->path, .num_samples = s->n, .has_last_hidden = true, .concurrent = s->t->overlap};
  *out = &s->base;
}

df_status df_online_source_open(df_online_target *t, const char *tokens_path, int64_t max_length, int64_t max_samples,
                                int64_t *dropped_out, df_batch_source **out, df_error *err) {
  *out = NULL;
  online_source *s = source_new(t, tokens_path);
  if (!s) return DF_FAIL(err, DF_ERR_NOMEM, tokens_path, NULL, "out of memory");
  int64_t longest = 0, dropped = 0;
  df_status st = df_token_jsonl_open(tokens_path, t->vocab, &s->in, err);
  if (st == DF_OK) st = scan(s, max_length, max_samples, &longest, &dropped, err);
  if (dropped_out) *dropped_out = dropped;
  if (st == DF_OK) st = source_buffers(s, longest, err);
  if (st != DF_OK) {
    online_close(&s->base);
    return st;
  }
  source_done(s, out);
  return DF_OK;
}

df_status df_online_source_open_synthetic(df_online_target *t, int64_t length, int64_t n, df_batch_source **out,
                                          df_error *err) {
  *out = NULL;
  if (length < 1 || n < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "data.max_length", "a memory plan needs data.max_length > 0",
                   "synthetic online data of %lld samples x %lld tokens", (long long)n, (long long)length);
  online_source *s = source_new(t, "synthetic tokens (memory plan)");
  if (!s) return DF_FAIL(err, DF_ERR_NOMEM, "online data", NULL, "out of memory");
  s->n = n;
  s->offset = calloc((size_t)n, sizeof *s->offset), s->line = calloc((size_t)n, sizeof *s->line);
  s->len = malloc(sizeof *s->len * (size_t)n), s->zeros = calloc((size_t)length, sizeof *s->zeros);
  df_status st = s->offset && s->line && s->len && s->zeros
                     ? DF_OK
                     : DF_FAIL(err, DF_ERR_NOMEM, "online data", NULL, "out of memory for %lld samples", (long long)n);
  for (int64_t i = 0; st == DF_OK && i < n; i++) s->len[i] = length;
  if (st == DF_OK) st = source_buffers(s, length, err);
  if (st != DF_OK) {
    online_close(&s->base);
    return st;
  }
  source_done(s, out);
  return DF_OK;
}
