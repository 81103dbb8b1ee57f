// The micro-batch stage (train/step/stage.c): what it uploads equals what the host builders produce, in one copy per
// micro-batch; two slots alternate; ids outside the vocabulary are refused on the host, naming sample and row.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"
#include "train/recipe/device.h"
#include "train/step/stage.h"

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

static const df_stage_spec SPEC = {.kind = DF_DRAFT_DFLASH,
                                   .block_size = BS,
                                   .vocab = V,
                                   .hidden = H,
                                   .mask_token_id = MASK,
                                   .loss_decay_gamma = 2.0,
                                   .loss_type = DF_LOSS_DFLASH};

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
  df_staged sg;
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &sg, &err), &err);
  df_transfer_stats x = df_ctx_transfer_stats(ctx);
  cr_expect_eq(x.h2d, 1);
  cr_expect_eq(x.h2d_bytes, sg.upload_bytes);
  cr_expect(sg.upload_bytes >= (int64_t)sizeof f.hidden);
  df_dflash_blocks blk;
  DF_ASSERT_OK(df_dflash_build_blocks(f.ids, f.mask, S, &f.a, BS, MASK, 2.0, &blk, &err), &err);
  const int64_t R = B * 2 * BS;
  cr_assert_eq(sg.R, R);
  int32_t *ids = down(ctx, &sg.block_ids), *labels = down(ctx, &sg.dflash.labels);
  float *w = down(ctx, &sg.dflash.weights), *bf = down(ctx, &sg.dflash.binary_f);
  cr_expect(!memcmp(ids, blk.input_ids, sizeof(int32_t) * R));
  cr_expect(!memcmp(labels, blk.labels, sizeof(int32_t) * R));
  cr_expect(!memcmp(w, blk.weights, sizeof(float) * R));
  double den = 0;
  for (int64_t r = 0; r < R; r++) {
    cr_expect_eq(bf[r], (float)blk.binary[r]);
    den += blk.weights[r];
  }
  cr_expect_eq(sg.loss_den, den);
  cr_expect_eq(sg.num_blocks, 3);
  // the features arrived too (the model copies them device to device)
  df_tensor th = df_f32_on(DF_DEV_FAKE, sg.model.target_hidden, B * S * KH);
  float *hid = down(ctx, &th);
  cr_expect(!memcmp(hid, f.hidden, sizeof f.hidden));
  free(ids), free(labels), free(w), free(bf), free(hid);
  df_dflash_blocks_free(&blk);
  // two slots alternate: the next micro-batch lands elsewhere, the one after reuses the first
  df_staged s2, s3;
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &s2, &err), &err);
  DF_ASSERT_OK(df_stage_prepare(st, &f.b, &f.a, &s3, &err), &err);
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
  df_staged sg;
  cr_expect_eq(df_stage_prepare(st, &f.b, &f.a, &sg, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.where, "labels[sample 1, row 1]"), "%s", err.where);
  cr_expect(strstr(err.msg, "53") && strstr(err.hint, "vocab"), "%s / %s", err.msg, err.hint);
  cr_expect_eq(df_ctx_transfer_stats(ctx).h2d, 0, "nothing was uploaded");
  f.ids[1 * S + 4] = 0;
  f.anchors[0] = S; // a kept block outside the context
  cr_expect_eq(df_stage_prepare(st, &f.b, &f.a, &sg, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "anchors");
  df_stage_free(st);
  df_ctx_destroy(ctx);
}

Test(stage, device_choice) {
  df_device_choice c;
  df_error err = {0};
  DF_ASSERT_OK(df_device_choice_parse("cuda", &c, &err), &err);
  cr_expect_eq(c, DF_DEVICE_CUDA);
  cr_expect_eq(df_device_choice_parse("gpu", &c, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "--device");
  cr_expect(strstr(err.hint, "auto, cpu or cuda"), "%s", err.hint);
  df_ctx *ctx;
  DF_ASSERT_OK(df_device_open(DF_DEVICE_CPU, NULL, 1, NULL, &ctx, &err), &err);
  cr_expect_str_eq(df_ctx_backend_name(ctx), "cpu");
  df_ctx_destroy(ctx);
  // auto picks the CPU while the CUDA table is incomplete (or absent), and cuda without a GPU is an error
  DF_ASSERT_OK(df_device_open(DF_DEVICE_AUTO, NULL, 1, NULL, &ctx, &err), &err);
  const bool cuda_ready = df_cuda_available() && df_backend_complete(df_cuda_backend(), NULL);
  cr_expect_str_eq(df_ctx_backend_name(ctx), cuda_ready ? "cuda" : "cpu");
  df_ctx_destroy(ctx);
  // a draft that must stay on the CPU (DSpark heads, MoE FFN) keeps auto on the CPU whatever the GPU
  DF_ASSERT_OK(df_device_open(DF_DEVICE_AUTO, "a host-only draft", 1, NULL, &ctx, &err), &err);
  cr_expect_str_eq(df_ctx_backend_name(ctx), "cpu");
  df_ctx_destroy(ctx);
  if (df_cuda_available()) return;
  cr_expect_eq(df_device_open(DF_DEVICE_CUDA, NULL, 1, NULL, &ctx, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "device");
}

// Drafts whose heads or FFN still run host loops name the reason, so auto keeps them on the CPU.
Test(stage, cpu_only_drafts_are_named) {
  const char *names[3] = {"tiny-dflash.json", "tiny-dspark.json", "tiny-dflash-moe.json"};
  const bool cpu_only[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/configs/%s", DF_SOURCE_DIR, names[i]);
    const df_draft_config *cfg = NULL;
    df_error err = {0};
    DF_ASSERT_OK(df_draft_config_from_file(path, &cfg, &err), &err);
    cr_expect_eq(df_device_cpu_only_reason(cfg) != NULL, cpu_only[i], "%s", names[i]);
    df_draft_config_free(cfg);
  }
}
