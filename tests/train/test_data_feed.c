// The prefetching data feed: per-epoch order, data-parallel striding with drop_last, wrap into the next
// epoch, seek/position round trips, prefetch on vs off, truncation/padding, and the failing inputs.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/data/data_feed.h"

#define STEP_DATA DF_FIXTURE_DIR "/dflash_step/data"
#define HS_F32    DF_FIXTURE_DIR "/hidden_states/h5py_f32.h5"

// ---- a scratch shard whose samples say who they are: input_ids[r] = 1000·i + r -------------------------

enum { K = 2, H = 3, W = K * H };
static const int LAYER_IDS[K] = {1, 2};

typedef struct {
  char dir[64], path[128];
} scratch;

static int64_t sample_len(int64_t i) { return 3 + (i * 5) % 7; }

static void scratch_shard(scratch *s, int64_t n, bool last_hidden) {
  snprintf(s->dir, sizeof s->dir, "/tmp/df_feed_test_XXXXXX");
  cr_assert_not_null(mkdtemp(s->dir), "mkdtemp");
  snprintf(s->path, sizeof s->path, "%s/shard.h5", s->dir);
  df_hs_writer_options o = {.hidden_size = H,
                            .num_layers = K,
                            .target_layer_ids = LAYER_IDS,
                            .dtype = DF_F32,
                            .has_last_hidden = last_hidden};
  df_error err = {0};
  df_hs_writer *w;
  DF_ASSERT_OK(df_hs_writer_create(s->path, &o, &w, &err), &err);
  for (int64_t i = 0; i < n; i++) {
    int64_t len = sample_len(i);
    int32_t ids[16];
    uint8_t mask[16];
    float hid[16 * W], last[16 * H];
    for (int64_t r = 0; r < len; r++) ids[r] = (int32_t)(1000 * i + r), mask[r] = (uint8_t)(r % 2);
    df_test_fill_uniform(hid, len * W, (uint64_t)i + 1, -1.0f, 1.0f);
    df_test_fill_uniform(last, len * H, (uint64_t)i + 100, -1.0f, 1.0f);
    DF_ASSERT_OK(df_hs_writer_append(w, len, ids, mask, hid, last_hidden ? last : NULL, &err), &err);
  }
  DF_ASSERT_OK(df_hs_writer_close(w, &err), &err);
}

static void scratch_remove(scratch *s) {
  remove(s->path);
  rmdir(s->dir);
}

static df_feed *feed_open(const char *path, int64_t batch, int64_t max_len, uint64_t seed, int rank, int world,
                          bool prefetch) {
  df_feed_options o = {.path = path,
                       .batch_size = batch,
                       .max_length = max_len,
                       .seed = seed,
                       .rank = rank,
                       .world_size = world,
                       .prefetch = prefetch};
  df_feed *f = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_feed_open(&o, &f, &err), &err);
  return f;
}

static const df_batch *feed_next(df_feed *f) {
  const df_batch *b = NULL;
  df_error err = {0};
  double wait = -1;
  DF_ASSERT_OK(df_feed_next(f, &b, &wait, &err), &err);
  cr_assert(wait >= 0, "wait_s is set");
  return b;
}

static void expect_batches_equal(const df_batch *a, const df_batch *b, const char *what) {
  cr_assert_eq(a->B, b->B, "%s: B", what);
  cr_assert_eq(a->S, b->S, "%s: S", what);
  cr_assert_eq(a->width, b->width, "%s: width", what);
  size_t rows = (size_t)(a->B * a->S);
  cr_expect_arr_eq(a->index, b->index, (size_t)a->B * sizeof *a->index, "%s: index", what);
  cr_expect_arr_eq(a->length, b->length, (size_t)a->B * sizeof *a->length, "%s: length", what);
  cr_expect_arr_eq(a->input_ids, b->input_ids, rows * sizeof *a->input_ids, "%s: input_ids", what);
  cr_expect_arr_eq(a->loss_mask, b->loss_mask, rows, "%s: loss_mask", what);
  cr_expect_arr_eq(a->hidden, b->hidden, rows * (size_t)a->width * sizeof *a->hidden, "%s: hidden", what);
}

// ---- order -------------------------------------------------------------------------------------------------

Test(data_feed, order_equals_epoch_order_and_wraps) {
  df_feed *f = feed_open(STEP_DATA, 2, 0, 1234, 0, 1, true);
  cr_assert_eq(df_feed_num_samples(f), 6);
  cr_assert_eq(df_feed_batches_per_epoch(f), 3);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(STEP_DATA, &ds, &err), &err);
  for (int64_t e = 0; e < 3; e++) {
    int64_t perm[6];
    df_data_epoch_order(6, 1234, e, perm);
    for (int64_t c = 0; c < 3; c++) {
      int64_t pe, pc;
      df_feed_position(f, &pe, &pc);
      cr_expect_eq(pe, e, "epoch before batch %lld", (long long)c);
      cr_expect_eq(pc, c, "cursor before batch %lld", (long long)c);
      const df_batch *b = feed_next(f);
      cr_expect_eq(b->index[0], perm[2 * c], "epoch %lld batch %lld sample 0", (long long)e, (long long)c);
      cr_expect_eq(b->index[1], perm[2 * c + 1], "epoch %lld batch %lld sample 1", (long long)e, (long long)c);
      df_batch want;
      DF_ASSERT_OK(df_batch_read(ds, perm + 2 * c, 2, 0, &want, &err), &err);
      expect_batches_equal(b, &want, "feed vs df_batch_read");
      df_batch_free(&want);
    }
  }
  int64_t pe, pc;
  df_feed_position(f, &pe, &pc);
  cr_expect(pe == 3 && pc == 0, "after three epochs: (3, 0), got (%lld, %lld)", (long long)pe, (long long)pc);
  df_hs_close(ds);
  df_feed_close(f);
}

// Rank r's batch c is perm[r + (c·batch + j)·world], j < batch; an epoch has floor(n / (world·batch)) batches
// on every rank, and the ranks together visit perm[0 .. bpe·world·batch) exactly once (the rest is dropped).
static void check_striding(int64_t n, int world, int64_t batch) {
  scratch s;
  scratch_shard(&s, n, false);
  int64_t bpe = n / (world * batch);
  int64_t *perm = malloc((size_t)n * sizeof *perm);
  int64_t *seen = calloc((size_t)n, sizeof *seen);
  for (int64_t e = 0; e < 2; e++) {
    df_data_epoch_order(n, 77, e, perm);
    memset(seen, 0, (size_t)n * sizeof *seen);
    for (int r = 0; r < world; r++) {
      df_feed *f = feed_open(s.path, batch, 0, 77, r, world, r % 2 == 0);
      cr_assert_eq(df_feed_batches_per_epoch(f), bpe);
      df_error err = {0};
      DF_ASSERT_OK(df_feed_seek(f, e, 0, &err), &err);
      for (int64_t c = 0; c < bpe; c++) {
        const df_batch *b = feed_next(f);
        for (int64_t j = 0; j < batch; j++) {
          int64_t want = perm[r + (c * batch + j) * world];
          cr_expect_eq(b->index[j], want, "n %lld world %d rank %d epoch %lld batch %lld slot %lld", (long long)n,
                       world, r, (long long)e, (long long)c, (long long)j);
          cr_expect_eq(b->input_ids[j * b->S + 1], (int32_t)(1000 * want + 1), "content of sample %lld",
                       (long long)want);
          seen[want]++;
        }
      }
      df_feed_close(f);
    }
    for (int64_t k = 0; k < n; k++) // position k of the order: visited once when inside a whole global batch
      cr_expect_eq(seen[perm[k]], k < bpe * world * batch ? 1 : 0, "order position %lld (sample %lld) seen %lld times",
                   (long long)k, (long long)perm[k], (long long)seen[perm[k]]);
  }
  free(perm), free(seen);
  scratch_remove(&s);
}

Test(data_feed, striding_world2_drops_the_partial_global_batch) { check_striding(7, 2, 2); }
Test(data_feed, striding_world2_even) { check_striding(8, 2, 4); }
Test(data_feed, striding_world3) { check_striding(7, 3, 2); }
Test(data_feed, striding_world2_drop_last) { check_striding(7, 2, 3); }

// Data parallel must see what one process sees: at world 2 with batch b, rank r's batch c is exactly the
// samples k ≡ r (mod 2) of the one-process batch c of size 2b — same epoch length, same batches, every epoch,
// whatever the prefetch setting (and the same bytes, not just the same indices).
Test(data_feed, world2_partitions_the_single_process_batch) {
  scratch s;
  scratch_shard(&s, 11, false); // 11 samples: 2 global batches of 4, 3 left over and dropped
  df_feed *one = feed_open(s.path, 4, 0, 99, 0, 1, true);
  df_feed *r0 = feed_open(s.path, 2, 0, 99, 0, 2, false), *r1 = feed_open(s.path, 2, 0, 99, 1, 2, true);
  cr_assert_eq(df_feed_batches_per_epoch(one), 2);
  cr_assert_eq(df_feed_batches_per_epoch(r0), 2);
  cr_assert_eq(df_feed_batches_per_epoch(r1), 2);
  df_hs_dataset *ds;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(s.path, &ds, &err), &err);
  for (int step = 0; step < 6; step++) { // three epochs
    const df_batch *g = feed_next(one);
    const df_batch *part[2] = {feed_next(r0), feed_next(r1)};
    for (int r = 0; r < 2; r++) {
      int64_t idx[2] = {g->index[r], g->index[r + 2]};
      cr_expect(part[r]->index[0] == idx[0] && part[r]->index[1] == idx[1],
                "step %d rank %d: samples %lld %lld, the global batch's are %lld %lld", step, r,
                (long long)part[r]->index[0], (long long)part[r]->index[1], (long long)idx[0], (long long)idx[1]);
      df_batch want;
      DF_ASSERT_OK(df_batch_read(ds, idx, 2, 0, &want, &err), &err);
      expect_batches_equal(part[r], &want, "rank's batch vs its slots of the global batch");
      df_batch_free(&want);
    }
    int64_t e1, c1, e0, c0;
    df_feed_position(one, &e1, &c1);
    df_feed_position(r1, &e0, &c0);
    cr_expect(e1 == e0 && c1 == c0, "the same position: (%lld, %lld) vs (%lld, %lld)", (long long)e1, (long long)c1,
              (long long)e0, (long long)c0);
  }
  df_hs_close(ds);
  df_feed_close(one), df_feed_close(r0), df_feed_close(r1);
  scratch_remove(&s);
}

// ---- position ----------------------------------------------------------------------------------------------

static void seek_roundtrip(bool prefetch) {
  scratch s;
  scratch_shard(&s, 9, false);
  df_feed *f = feed_open(s.path, 2, 0, 5, 0, 1, prefetch); // 4 batches per epoch
  for (int i = 0; i < 3; i++) feed_next(f);
  int64_t pe, pc;
  df_feed_position(f, &pe, &pc);
  cr_assert(pe == 0 && pc == 3);
  df_batch want[5];
  for (int i = 0; i < 5; i++) { // crosses into epoch 1
    const df_batch *b = feed_next(f);
    df_error err = {0};
    int64_t idx[2] = {b->index[0], b->index[1]};
    df_hs_dataset *ds;
    DF_ASSERT_OK(df_hs_open(s.path, &ds, &err), &err);
    DF_ASSERT_OK(df_batch_read(ds, idx, 2, 0, &want[i], &err), &err);
    df_hs_close(ds);
    expect_batches_equal(b, &want[i], "copy");
  }
  df_error err = {0};
  DF_ASSERT_OK(df_feed_seek(f, pe, pc, &err), &err); // discards the prefetched (1, 3)
  df_feed_position(f, &pe, &pc);
  cr_assert(pe == 0 && pc == 3, "position after seek");
  for (int i = 0; i < 5; i++) expect_batches_equal(feed_next(f), &want[i], "after seek");
  df_feed_close(f);

  // A fresh feed seeked to the same position gives the same batches.
  f = feed_open(s.path, 2, 0, 5, 0, 1, prefetch);
  DF_ASSERT_OK(df_feed_seek(f, 0, 3, &err), &err);
  for (int i = 0; i < 5; i++) {
    expect_batches_equal(feed_next(f), &want[i], "fresh feed");
    df_batch_free(&want[i]);
  }
  df_feed_position(f, &pe, &pc);
  cr_expect(pe == 2 && pc == 0, "(0, 3) + 5 batches of 4 per epoch = (2, 0), got (%lld, %lld)", (long long)pe,
            (long long)pc);
  df_feed_close(f);
  scratch_remove(&s);
}

Test(data_feed, seek_position_roundtrip_prefetch) { seek_roundtrip(true); }
Test(data_feed, seek_position_roundtrip_sync) { seek_roundtrip(false); }

Test(data_feed, seek_rejects_positions_outside_the_epoch) {
  df_feed *f = feed_open(STEP_DATA, 2, 0, 1, 0, 1, true);
  df_error err = {0};
  cr_expect_eq(df_feed_seek(f, 0, 3, &err), DF_ERR_INVALID, "cursor == batches per epoch");
  cr_expect(strstr(err.msg, "3 batches") != NULL, "message: %s", err.msg);
  cr_expect_eq(df_feed_seek(f, -1, 0, &err), DF_ERR_INVALID, "negative epoch");
  cr_expect_eq(df_feed_seek(f, 0, -1, &err), DF_ERR_INVALID, "negative cursor");
  const df_batch *b = feed_next(f); // still usable at (0, 0)
  int64_t perm[6];
  df_data_epoch_order(6, 1, 0, perm);
  cr_expect_eq(b->index[0], perm[0]);
  df_feed_close(f);
}

// ---- prefetch on vs off, truncation and padding ------------------------------------------------------------

Test(data_feed, prefetch_on_and_off_give_identical_batches) {
  df_feed *on = feed_open(STEP_DATA, 4, 30, 99, 0, 1, true);
  df_feed *off = feed_open(STEP_DATA, 4, 30, 99, 0, 1, false);
  for (int i = 0; i < 5; i++) {
    const df_batch *a = feed_next(on), *b = feed_next(off);
    expect_batches_equal(a, b, "prefetch on vs off");
    cr_expect(a->S <= 30, "truncated to max_length");
  }
  df_feed_close(on);
  df_feed_close(off);
}

Test(data_feed, truncates_and_zero_pads_to_the_longest_sample) {
  scratch s;
  scratch_shard(&s, 6, false); // lengths 3, 8, 6, 4, 9, 7
  df_feed *f = feed_open(s.path, 6, 7, 3, 0, 1, true);
  const df_batch *b = feed_next(f);
  cr_assert_eq(b->S, 7, "longest sample after truncation to 7");
  for (int64_t j = 0; j < b->B; j++) {
    int64_t i = b->index[j], len = sample_len(i) < 7 ? sample_len(i) : 7;
    cr_expect_eq(b->length[j], len, "sample %lld length", (long long)i);
    for (int64_t r = 0; r < b->S; r++) {
      int32_t want = r < len ? (int32_t)(1000 * i + r) : 0;
      cr_expect_eq(b->input_ids[j * b->S + r], want, "sample %lld row %lld", (long long)i, (long long)r);
      if (r >= len) {
        cr_expect_eq(b->loss_mask[j * b->S + r], 0, "padding mask");
        for (int64_t k = 0; k < W; k++) cr_expect_eq(b->hidden[(j * b->S + r) * W + k], 0.0f, "padding hidden");
      }
    }
  }
  df_feed_close(f);
  scratch_remove(&s);
}

// DSpark: need_last_hidden reads target_last_hidden_states into the batch, padded like the rest.
Test(data_feed, reads_last_hidden_when_asked) {
  scratch s;
  scratch_shard(&s, 4, true);
  df_feed_options o = {
      .path = s.path, .batch_size = 2, .seed = 1, .world_size = 1, .prefetch = true, .need_last_hidden = true};
  df_feed *f;
  df_error err = {0};
  DF_ASSERT_OK(df_feed_open(&o, &f, &err), &err);
  const df_batch *b = feed_next(f);
  cr_assert_not_null(b->last_hidden);
  cr_assert_eq(b->hidden_size, H);
  for (int64_t j = 0; j < b->B; j++) {
    int64_t i = b->index[j], len = sample_len(i);
    float want[16 * H];
    df_test_fill_uniform(want, len * H, (uint64_t)i + 100, -1.0f, 1.0f);
    cr_expect_arr_eq(b->last_hidden + j * b->S * H, want, (size_t)(len * H) * sizeof(float), "sample %lld",
                     (long long)i);
    for (int64_t r = len; r < b->S; r++) cr_expect_eq(b->last_hidden[(j * b->S + r) * H], 0.0f, "padding");
  }
  df_feed_close(f);
  scratch_remove(&s);
}

// ---- failing inputs ----------------------------------------------------------------------------------------

static df_status open_err(const df_feed_options *o, df_error *err) {
  df_feed *f = (df_feed *)0x1;
  df_status st = df_feed_open(o, &f, err);
  cr_expect_null(f, "no feed on failure");
  return st;
}

Test(data_feed, bad_path_errors) {
  df_error err = {0};
  df_feed_options o = {.path = "/nonexistent/draftforge/data", .batch_size = 1, .world_size = 1, .prefetch = true};
  cr_expect_neq(open_err(&o, &err), DF_OK);
  cr_expect(strstr(err.where, "/nonexistent/draftforge/data") != NULL, "where names the path: %s", err.where);
}

Test(data_feed, too_few_samples_for_one_batch_errors) {
  df_error err = {0};
  df_feed_options o = {.path = STEP_DATA, .batch_size = 4, .rank = 1, .world_size = 2, .prefetch = true};
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "6 samples < one global batch of 2 x 4");
  cr_expect(strstr(err.msg, "cannot fill one global batch of 2 rank(s) x 4") != NULL, "%s", err.msg);
  cr_expect(strstr(err.hint, "batch_size") != NULL, "hint: %s", err.hint);
}

Test(data_feed, bad_options_error) {
  df_error err = {0};
  df_feed_options o = {.path = STEP_DATA, .batch_size = 0, .world_size = 1};
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "batch size 0");
  o.batch_size = 1, o.rank = 2, o.world_size = 2;
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "rank outside the world");
  o.rank = 0, o.path = NULL;
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "no path");
}

Test(data_feed, data_for_another_draft_errors) {
  const df_draft_config *cfg;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(DF_FIXTURE_DIR "/dflash_step/tiny-dflash.json", &cfg, &err), &err);
  df_feed_options o = {.path = HS_F32, .batch_size = 1, .world_size = 1, .cfg = cfg, .prefetch = true};
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "K = 3 layers of H = 4 against a K = 2, H = 64 draft");
  o.path = STEP_DATA; // the data the config was made for
  df_feed *f;
  DF_ASSERT_OK(df_feed_open(&o, &f, &err), &err);
  df_feed_close(f);
  o.need_last_hidden = true;
  cr_expect_eq(open_err(&o, &err), DF_ERR_INVALID, "no target_last_hidden_states");
  cr_expect(strstr(err.msg, "target_last_hidden_states") != NULL, "message: %s", err.msg);
  df_draft_config_free(cfg);
}

// A shard that goes bad after opening: the reader thread's error comes back from df_feed_next, and the
// feed stays at the failing position.
Test(data_feed, reader_error_is_propagated) {
  scratch s;
  scratch_shard(&s, 4, false);
  df_feed *f = feed_open(s.path, 1, 0, 8, 0, 1, true);
  const df_batch *b = NULL;
  df_error err = {0};
  df_status st = DF_OK;
  cr_assert_eq(truncate(s.path, 0), 0, "truncate");
  for (int i = 0; i < 8 && st == DF_OK; i++) st = df_feed_next(f, &b, NULL, &err);
  cr_expect_neq(st, DF_OK, "a read from the truncated shard fails");
  int64_t pe, pc;
  df_feed_position(f, &pe, &pc);
  cr_expect_eq(df_feed_next(f, &b, NULL, &err), st, "the position is retried and fails again");
  df_feed_close(f);
  scratch_remove(&s);
}
