// The block strategies' micro-batch stage (strategies/dflash/stage.c): what it uploads — the block inputs and a
// strategy's rows — equals what the host builders produce, in one copy per micro-batch; two slots alternate; ids
// outside the vocabulary are refused on the host, naming sample and row.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/dflash/stage.h"
#include "tests/common/fixture.h"

enum { B = 2, S = 12, KH = 6, H = 4, BS = 3, V = 50, MASK = 49 };

typedef struct {
  int64_t index[B], length[B];
  int32_t ids[B * S];
  uint8_t mask[B * S];
  float hidden[B * S * KH];
  df_batch b;
  int32_t anchors[B * 2];
  uint8_t keep[B * 2];
  df_dflash_anchors a;
} fixture;

static void make(fixture *f) {
  memset(f, 0, sizeof *f);
  for (int i = 0; i < B * S; i++) f->ids[i] = (i * 7) % 40, f->mask[i] = i % S > 1;
  df_test_fill_uniform(f->hidden, B * S * KH, 3, -1, 1);
  for (int i = 0; i < B; i++) f->index[i] = i, f->length[i] = S;
  f->b = (df_batch){.B = B,
                    .S = S,
                    .width = KH,
                    .index = f->index,
                    .length = f->length,
                    .input_ids = f->ids,
                    .loss_mask = f->mask,
                    .hidden = f->hidden};
  const int32_t an[B * 2] = {2, 6, 3, 0};
  const uint8_t kp[B * 2] = {1, 1, 1, 0};
  memcpy(f->anchors, an, sizeof an), memcpy(f->keep, kp, sizeof kp);
  f->a = (df_dflash_anchors){.B = B, .N = 2, .anchors = f->anchors, .keep = f->keep};
}

static const df_stage_spec SPEC = {.block_size = BS, .vocab = V, .hidden = H, .mask_token_id = MASK};

// A strategy's rows as the stage sees them: DFlash's labels and weights (decay 2), built from the anchors, uploaded
// with the batch, and a scratch buffer of one float per row.
typedef struct {
  df_dflash_blocks blk;
  df_tensor labels, weights, scratch;
  int builds, releases;
} test_rows;

static df_status rows_build(void *self, const df_batch *bt, const df_dflash_anchors *a, int64_t bs, int64_t vocab,
                            double *loss_den, df_error *err) {
  test_rows *r = self;
  r->builds++;
  DF_TRY(df_dflash_build_blocks(bt->input_ids, bt->loss_mask, bt->S, a, bs, MASK, 2.0, &r->blk, err));
  const int64_t per = a->N * bs;
  *loss_den = 0;
  for (int64_t i = 0; i < a->B * per; i++) *loss_den += r->blk.weights[i];
  return df_stage_check_ids("labels", r->blk.labels, a->B * per, per, vocab, err);
}

static void rows_layout(void *self, df_stage_pass pass, df_carver *up, df_carver *scratch, const df_stage_dims *d,
                        df_device dev, const df_tensor *keep) {
  test_rows *r = self;
  int32_t *labels = df_carve(up, d->R * 4);
  float *weights = df_carve(up, d->R * 4), *sc = df_carve(scratch, d->R * 4);
  if (pass == DF_STAGE_FILL) {
    memcpy(labels, r->blk.labels, sizeof(int32_t) * (size_t)d->R);
    memcpy(weights, r->blk.weights, sizeof(float) * (size_t)d->R);
  } else if (pass == DF_STAGE_BIND) {
    r->labels = df_i32_on(dev, labels, d->R), r->weights = df_f32_on(dev, weights, d->R);
    r->scratch = df_f32_on(dev, sc, d->R);
  }
}

static void rows_release(void *self) {
  test_rows *r = self;
  r->releases++;
  df_dflash_blocks_free(&r->blk);
}

static df_stage_rows rows_of(test_rows *r) {
  return (df_stage_rows){.self = r, .build = rows_build, .layout = rows_layout, .release = rows_release};
}

static df_ctx *fake_ctx(void) {
  df_ctx *ctx;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_FAKE, .num_threads = 1};
  DF_ASSERT_OK(df_ctx_create(&o, &ctx, &err), &err);
  return ctx;
}

static void *down(df_ctx *ctx, const df_tensor *t) {
  size_t n = (size_t)df_numel(t) * df_dtype_size(t->dtype);
  void *h = malloc(n);
  df_error err = {0};
  DF_ASSERT_OK(df_copy(ctx, h, DF_DEV_CPU, t->data, t->device, n, &err), &err);
  return h;
}

Test(stage, uploads_what_the_host_builds_in_one_copy) {
  fixture f;
  make(&f);
  df_ctx *ctx = fake_ctx();
  df_error err = {0};
  df_stage *st;
  DF_ASSERT_OK(df_stage_create(ctx, &SPEC, &st, &err), &err);
  df_ctx_reset_transfer_stats(ctx);
  test_rows tr = {0};
  const df_stage_rows rows = rows_of(&tr);
  df_staged sg;
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &rows, &sg, &err), &err);
  cr_expect(tr.builds == 1 && tr.releases == 1, "the strategy's build is made and released once");
  df_transfer_stats x = df_ctx_transfer_stats(ctx);
  cr_expect_eq(x.h2d, 1);
  cr_expect_eq(x.h2d_bytes, sg.upload_bytes);
  cr_expect(sg.upload_bytes >= (int64_t)sizeof f.hidden);
  df_dflash_blocks blk;
  DF_ASSERT_OK(df_dflash_build_blocks(f.ids, f.mask, S, &f.a, BS, MASK, 2.0, &blk, &err), &err);
  const int64_t R = B * 2 * BS;
  cr_assert_eq(sg.R, R);
  int32_t *ids = down(ctx, &sg.block_ids), *labels = down(ctx, &tr.labels);
  float *w = down(ctx, &tr.weights);
  cr_expect(!memcmp(ids, blk.input_ids, sizeof(int32_t) * R), "the stage's block ids are DFlash's block inputs");
  cr_expect(!memcmp(labels, blk.labels, sizeof(int32_t) * R));
  cr_expect(!memcmp(w, blk.weights, sizeof(float) * R));
  cr_expect_eq(tr.scratch.device, DF_DEV_FAKE);
  cr_expect(tr.scratch.data != sg.block_embed.data && tr.scratch.data != sg.dhidden.data, "its own scratch");
  double den = 0;
  for (int64_t r = 0; r < R; r++) den += blk.weights[r];
  cr_expect_eq(sg.loss_den, den);
  cr_expect_eq(sg.num_blocks, 3);
  // the features arrived too (the model copies them device to device)
  df_tensor th = df_f32_on(DF_DEV_FAKE, sg.model.target_hidden, B * S * KH);
  float *hid = down(ctx, &th);
  cr_expect(!memcmp(hid, f.hidden, sizeof f.hidden));
  free(ids), free(labels), free(w), free(hid);
  df_dflash_blocks_free(&blk);
  // two slots alternate: the next micro-batch lands elsewhere, the one after reuses the first
  df_staged s2, s3;
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &rows, &s2, &err), &err);
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &rows, &s3, &err), &err);
  cr_expect(s2.block_ids.data != sg.block_ids.data);
  cr_expect(s3.block_ids.data == sg.block_ids.data);
  cr_expect(s3.block_embed.data == sg.block_embed.data, "the device scratch is shared");
  df_stage_free(st);
  df_ctx_destroy(ctx);
}

Test(stage, ids_outside_the_vocabulary_are_refused_before_upload) {
  fixture f;
  make(&f);
  f.ids[1 * S + 4] = V + 3; // sample 1's anchor-3 block supervises position 4
  df_ctx *ctx = fake_ctx();
  df_error err = {0};
  df_stage *st;
  DF_ASSERT_OK(df_stage_create(ctx, &SPEC, &st, &err), &err);
  df_ctx_reset_transfer_stats(ctx);
  test_rows tr = {0};
  const df_stage_rows rows = rows_of(&tr);
  df_staged sg;
  cr_expect_eq(df_stage_prepare(st, &f.b, &f.a, &rows, &sg, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "labels[sample 1, row 1]"), "%s", err.where);
  cr_expect(strstr(err.msg, "53") && strstr(err.hint, "vocab"), "%s / %s", err.msg, err.hint);
  cr_expect_eq(df_ctx_transfer_stats(ctx).h2d, 0, "nothing was uploaded");
  cr_expect_eq(tr.releases, tr.builds, "a failed build is released too");
  f.ids[1 * S + 4] = 0;
  f.ids[0 * S + 2] = V; // the anchor token of sample 0's first block: a block input id
  cr_expect_eq(df_stage_prepare(st, &f.b, &f.a, &rows, &sg, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "block input_ids[sample 0, row 0]"), "%s", err.where);
  f.ids[0 * S + 2] = 0;
  f.anchors[0] = S; // a kept block outside the context
  cr_expect_eq(df_stage_prepare(st, &f.b, &f.a, &rows, &sg, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "anchors");
  df_stage_free(st);
  df_ctx_destroy(ctx);
}
