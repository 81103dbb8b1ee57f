// The prefetching data feed (train/data/data_feed.h): which samples make batch (epoch, cursor) of a rank, and a
// reader thread that owns the HDF5 handle and reads batch c+1 into a second buffer while batch c trains.
#include "train/data/data_feed.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// The reader thread's one slot: IDLE → REQUESTED (caller) → READING → DONE (reader) → IDLE (caller takes it).
typedef enum { SLOT_IDLE, SLOT_REQUESTED, SLOT_READING, SLOT_DONE } feed_slot;

struct df_feed {
  char *path;
  int64_t batch_size, max_length;
  uint64_t seed;
  int rank, world;
  bool last_hidden;     // also read target_last_hidden_states (DSpark)
  df_batch_source *src; // owned by the reader thread while it runs, else by the caller
  int64_t n, batches_per_epoch;

  int64_t epoch, cursor; // the next batch handed out
  df_batch cur;          // the batch handed out last (valid until the next df_feed_next)

  // Index scratch of whichever thread reads: the epoch order (cached per epoch) and one batch's indices.
  int64_t *perm, perm_epoch, *index;

  bool threaded;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  feed_slot slot;
  int64_t req_epoch, req_cursor; // the requested batch: always the caller's position
  df_batch next;
  df_status next_st;
  df_error next_err;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Sample indices of batch (epoch, cursor) for this rank: global batch c is perm[c·world·B .. (c+1)·world·B),
// and rank r takes its slots r, r + world, ... (its i-th sample is perm[r + i·world]). Only whole global
// batches exist, so no index reaches n.
static void feed_batch_indices(df_feed *f, int64_t epoch, int64_t cursor) {
  if (f->perm_epoch != epoch) {
    df_data_epoch_order(f->n, f->seed, epoch, f->perm);
    f->perm_epoch = epoch;
  }
  for (int64_t b = 0; b < f->batch_size; b++) {
    int64_t i = cursor * f->batch_size + b;
    f->index[b] = f->perm[f->rank + i * f->world];
  }
}

static df_status feed_read(df_feed *f, int64_t epoch, int64_t cursor, df_batch *out, df_error *err) {
  feed_batch_indices(f, epoch, cursor);
  return df_batch_source_read(f->src, f->index, f->batch_size, f->max_length, f->last_hidden, out, err);
}

static void *feed_reader_main(void *arg) {
  df_feed *f = arg;
  pthread_mutex_lock(&f->mu);
  while (!f->stop) {
    if (f->slot != SLOT_REQUESTED) {
      pthread_cond_wait(&f->cv, &f->mu);
      continue;
    }
    int64_t e = f->req_epoch, c = f->req_cursor;
    f->slot = SLOT_READING;
    pthread_mutex_unlock(&f->mu);
    df_batch b;
    df_error e_local;
    df_error_clear(&e_local);
    df_status st = feed_read(f, e, c, &b, &e_local);
    pthread_mutex_lock(&f->mu);
    f->next = b, f->next_st = st, f->next_err = e_local;
    f->slot = SLOT_DONE;
    pthread_cond_broadcast(&f->cv);
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

// Caller side, mutex held: ask the reader for the batch at the current position.
static void feed_request_locked(df_feed *f) {
  f->req_epoch = f->epoch, f->req_cursor = f->cursor;
  f->slot = SLOT_REQUESTED;
  pthread_cond_broadcast(&f->cv);
}

// Caller side, mutex held: wait out a read in flight and drop its result.
static void feed_discard_locked(df_feed *f) {
  while (f->slot == SLOT_REQUESTED || f->slot == SLOT_READING) pthread_cond_wait(&f->cv, &f->mu);
  if (f->slot == SLOT_DONE && f->next_st == DF_OK) df_batch_free(&f->next);
  f->slot = SLOT_IDLE;
}

static df_status feed_check_data(df_feed *f, const df_feed_options *opt, df_error *err) {
  if (opt->need_last_hidden && !f->src->has_last_hidden)
    return DF_FAIL(err, DF_ERR_INVALID, f->path, "recapture the data with target_last_hidden_states (DSpark)",
                   "the data has no target_last_hidden_states, which this draft needs");
  f->n = f->src->num_samples;
  f->batches_per_epoch = f->n / ((int64_t)f->world * f->batch_size);
  if (f->batches_per_epoch < 1)
    return DF_FAIL(err, DF_ERR_INVALID, f->path,
                   "lower training.batch_size or add data (the last partial global batch is dropped)",
                   "%lld samples cannot fill one global batch of %d rank(s) x %lld", (long long)f->n, f->world,
                   (long long)f->batch_size);
  f->perm = malloc((size_t)f->n * sizeof *f->perm);
  f->index = malloc((size_t)f->batch_size * sizeof *f->index);
  if (!f->perm || !f->index)
    return DF_FAIL(err, DF_ERR_NOMEM, f->path, NULL, "out of memory for the order of %lld samples", (long long)f->n);
  f->perm_epoch = -1;
  return DF_OK;
}

static df_status feed_check_options(const df_feed_options *opt, df_error *err) {
  if (!opt->source && (!opt->path || !*opt->path))
    return DF_FAIL(err, DF_ERR_INVALID, "data.hidden_states_path", "set data.hidden_states_path in the recipe",
                   "no data path given");
  if (opt->batch_size < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.batch_size", "use a batch size >= 1", "batch size is %lld",
                   (long long)opt->batch_size);
  if (opt->world_size < 1 || opt->rank < 0 || opt->rank >= opt->world_size)
    return DF_FAIL(err, DF_ERR_INVALID, "data feed", "rank must be in [0, world_size)", "rank %d of world size %d",
                   opt->rank, opt->world_size);
  return DF_OK;
}

df_status df_feed_open(const df_feed_options *opt, df_feed **out, df_error *err) {
  *out = NULL;
  df_status st = feed_check_options(opt, err);
  df_feed *f = st == DF_OK ? calloc(1, sizeof *f) : NULL;
  const char *label = opt->source ? opt->source->label : opt->path;
  if (f) f->path = strdup(label ? label : "data");
  if (st == DF_OK && (!f || !f->path)) st = DF_FAIL(err, DF_ERR_NOMEM, label, NULL, "out of memory");
  if (st != DF_OK) { // the feed owns a given source from here on, also when it fails
    if (f) free(f->path), free(f);
    df_batch_source_close(opt->source);
    return st;
  }
  f->batch_size = opt->batch_size, f->max_length = opt->max_length, f->seed = opt->seed;
  f->rank = opt->rank, f->world = opt->world_size, f->last_hidden = opt->need_last_hidden;
  f->src = opt->source;
  if (!f->src) st = df_hs_source_open(opt->path, opt->cfg, opt->need_last_hidden, &f->src, err);
  if (st == DF_OK) st = feed_check_data(f, opt, err);
  // The reader thread reads while the caller may read other data too (eval, checkpoints): the source says
  // whether it allows that (HDF5 needs a thread-safe libhdf5, as Debian's is). Otherwise the feed reads on the
  // caller's thread; the batches are the same.
  if (st == DF_OK && opt->prefetch && f->src->concurrent) {
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->slot = SLOT_IDLE;
    if (pthread_create(&f->thread, NULL, feed_reader_main, f) != 0) {
      pthread_cond_destroy(&f->cv);
      pthread_mutex_destroy(&f->mu);
      st = DF_FAIL(err, DF_ERR_IO, f->path, "run with prefetch off", "cannot start the data reader thread");
    } else {
      f->threaded = true;
      pthread_mutex_lock(&f->mu);
      feed_request_locked(f); // the first batch reads while the caller builds the model
      pthread_mutex_unlock(&f->mu);
    }
  }
  if (st != DF_OK) {
    df_feed_close(f);
    return st;
  }
  *out = f;
  return DF_OK;
}

void df_feed_close(df_feed *f) {
  if (!f) return;
  if (f->threaded) {
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->thread, NULL);
    if (f->slot == SLOT_DONE && f->next_st == DF_OK) df_batch_free(&f->next);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
  }
  df_batch_free(&f->cur);
  df_batch_source_close(f->src);
  free(f->perm), free(f->index), free(f->path);
  free(f);
}

int64_t df_feed_num_samples(const df_feed *f) { return f->n; }
int64_t df_feed_batches_per_epoch(const df_feed *f) { return f->batches_per_epoch; }

df_status df_feed_seek(df_feed *f, int64_t epoch, int64_t cursor, df_error *err) {
  if (epoch < 0 || cursor < 0 || cursor >= f->batches_per_epoch)
    return DF_FAIL(err, DF_ERR_INVALID, f->path,
                   "the position must come from this data with the same batch size and world size",
                   "position epoch %lld, batch %lld is outside an epoch of %lld batches", (long long)epoch,
                   (long long)cursor, (long long)f->batches_per_epoch);
  if (!f->threaded) {
    f->epoch = epoch, f->cursor = cursor;
    return DF_OK;
  }
  pthread_mutex_lock(&f->mu);
  feed_discard_locked(f);
  f->epoch = epoch, f->cursor = cursor;
  feed_request_locked(f);
  pthread_mutex_unlock(&f->mu);
  return DF_OK;
}

void df_feed_position(const df_feed *f, int64_t *epoch, int64_t *cursor) {
  if (epoch) *epoch = f->epoch;
  if (cursor) *cursor = f->cursor;
}

static void feed_advance(df_feed *f) {
  if (++f->cursor == f->batches_per_epoch) f->epoch++, f->cursor = 0;
}

// Takes the reader's batch for the current position (requesting it if none is in flight), then asks for
// the following one.
static df_status feed_next_threaded(df_feed *f, df_batch *got, double *waited, df_error *err) {
  pthread_mutex_lock(&f->mu);
  if (f->slot == SLOT_IDLE) feed_request_locked(f); // after an error: retry this position
  double t0 = now_s();
  while (f->slot != SLOT_DONE) pthread_cond_wait(&f->cv, &f->mu);
  *waited = now_s() - t0;
  df_status st = f->next_st;
  if (st == DF_OK) {
    *got = f->next;
    memset(&f->next, 0, sizeof f->next);
    f->slot = SLOT_IDLE;
    feed_advance(f);
    feed_request_locked(f);
  } else {
    if (err) *err = f->next_err;
    f->slot = SLOT_IDLE;
  }
  pthread_mutex_unlock(&f->mu);
  return st;
}

df_status df_feed_next(df_feed *f, const df_batch **out, double *wait_s, df_error *err) {
  df_batch got;
  double waited = 0;
  df_status st;
  if (f->threaded) {
    st = feed_next_threaded(f, &got, &waited, err);
  } else {
    double t0 = now_s();
    st = feed_read(f, f->epoch, f->cursor, &got, err);
    waited = now_s() - t0;
    if (st == DF_OK) feed_advance(f);
  }
  if (wait_s) *wait_s = waited;
  if (st != DF_OK) return st;
  df_batch_free(&f->cur);
  f->cur = got;
  *out = &f->cur;
  return DF_OK;
}
