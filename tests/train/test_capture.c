// draftforge capture on the golden target (tests/fixtures/target/qwen3_gqa_untied_f32): the stored features of
// layer ids [1, 0] equal transformers' hidden_states[L + 1]; shards follow input lines; a rerun skips finished
// shards and redoes a partial one; other settings are refused; regeneration continues with the target's
// greedy token; the last layer and a shifted convention attribute are refused.
#include <criterion/criterion.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/fixture.h"
#include "../common/json_edit.h"
#include "kernels/backend.h"
#include "train/data/capture.h"
#include "train/data/hs.h"

#define TARGET  DF_FIXTURE_DIR "/target/qwen3_gqa_untied_f32"
#define DIR_TMP "/tmp/df_test_capture"
#define PROMPT  5

static void write_draft_config(const char *path, const char *ids) {
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "hidden_size", df_test_json("32"));
  df_test_json_set(d, "vocab_size", df_test_json("96"));
  df_test_json_set(d, "num_target_layers", df_test_json("3"));
  df_test_json_set(d, "head_dim", df_test_json("8"));
  df_test_json_set(d, "intermediate_size", df_test_json("64"));
  df_test_json_set(d, "dflash_config.target_layer_ids", df_test_json(ids));
  df_test_json_set(d, "dflash_config.mask_token_id", df_test_json("95"));
  cr_assert_eq(json_dump_file(d, path, 0), 0);
  json_decref(d);
}

// Line 0: the fixture's input ids (prompt of PROMPT tokens, the rest supervised); lines 1..4: shorter variations.
static void write_data(const char *path, const int32_t *ids, int64_t T) {
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  for (int line = 0; line < 5; line++) {
    int64_t n = T - 2 * line;
    fprintf(fp, "{\"input_ids\": [");
    for (int64_t i = 0; i < n; i++) fprintf(fp, "%s%d", i ? ", " : "", (ids[i] + 7 * line) % 96);
    fprintf(fp, "], \"loss_mask\": [");
    for (int64_t i = 0; i < n; i++) fprintf(fp, "%s%d", i ? ", " : "", i >= PROMPT);
    fprintf(fp, "]}\n%s", line == 2 ? "\n" : ""); // a blank line is skipped
  }
  fclose(fp);
}

static df_capture_options opts(void) {
  return (df_capture_options){.target_dir = TARGET,
                              .data_path = DIR_TMP "/data.jsonl",
                              .draft_config_path = DIR_TMP "/draft.json",
                              .out_dir = DIR_TMP "/out",
                              .max_new_tokens = 4,
                              .max_length = 64,
                              .samples_per_shard = 2,
                              .dtype = DF_F32,
                              .last_hidden = 1};
}

static fx_file *setup_dir(void) {
  cr_assert_eq(system("rm -rf " DIR_TMP " && mkdir -p " DIR_TMP), 0);
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  const fx_tensor *ids = fx_get(e, "input_ids");
  write_data(DIR_TMP "/data.jsonl", ids->data, ids->shape[0]);
  write_draft_config(DIR_TMP "/draft.json", "[1, 0]");
  return e;
}

// Both shards hold the same samples, bit for bit.
static void expect_same_samples(const char *a, const char *b) {
  df_error err = {0};
  df_hs_dataset *x = NULL, *y = NULL;
  DF_ASSERT_OK(df_hs_open(a, &x, &err), &err);
  DF_ASSERT_OK(df_hs_open(b, &y, &err), &err);
  const df_hs_info *ix = df_hs_get_info(x), *iy = df_hs_get_info(y);
  cr_assert_eq(ix->num_samples, iy->num_samples);
  const int64_t W = ix->num_layers * ix->hidden_size;
  for (int64_t i = 0; i < ix->num_samples; i++) {
    int32_t id1[64], id2[64];
    uint8_t m1[64], m2[64];
    float *h1 = calloc(64 * W, sizeof(float)), *h2 = calloc(64 * W, sizeof(float));
    float *l1 = calloc(64 * ix->hidden_size, sizeof(float)), *l2 = calloc(64 * ix->hidden_size, sizeof(float));
    const bool last = ix->has_last_hidden && iy->has_last_hidden;
    df_hs_sample_bufs b1 = {.input_ids = id1, .loss_mask = m1, .hidden = h1, .last_hidden = last ? l1 : NULL};
    df_hs_sample_bufs b2 = {.input_ids = id2, .loss_mask = m2, .hidden = h2, .last_hidden = last ? l2 : NULL};
    int64_t n1, n2;
    DF_ASSERT_OK(df_hs_read_sample(x, i, 64, &b1, &n1, &err), &err);
    DF_ASSERT_OK(df_hs_read_sample(y, i, 64, &b2, &n2, &err), &err);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(id1, id2, sizeof(int32_t) * n1), 0);
    cr_assert_eq(memcmp(m1, m2, n1), 0);
    cr_assert_eq(memcmp(h1, h2, sizeof(float) * n1 * W), 0, "sample %lld differs", (long long)i);
    cr_assert_eq(memcmp(l1, l2, sizeof(float) * n1 * ix->hidden_size), 0, "sample %lld: final states differ",
                 (long long)i);
    free(h1), free(h2), free(l1), free(l2);
  }
  df_hs_close(x);
  df_hs_close(y);
}

Test(capture, features_follow_the_layer_convention_and_shards_resume) {
  fx_file *e = setup_dir();
  const fx_tensor *hs = fx_get(e, "hidden_states");
  const int64_t T = hs->shape[1], H = hs->shape[2];
  df_capture_options o = opts();
  df_capture_report rep;
  df_error err = {0};
  DF_ASSERT_OK(df_capture_run(&o, &rep, &err), &err);
  cr_assert_eq(rep.lines, 5);
  cr_assert_eq(rep.written, 5);
  cr_assert_eq(rep.shards, 3);
  cr_assert_eq(rep.skipped_shards, 0);

  df_hs_dataset *ds = NULL;
  DF_ASSERT_OK(df_hs_open(DIR_TMP "/out", &ds, &err), &err);
  const df_hs_info *in = df_hs_get_info(ds);
  cr_assert_eq(in->num_samples, 5);
  cr_assert_eq(in->num_shards, 3);
  cr_assert_eq(in->num_layers, 2);
  cr_assert_eq(in->target_layer_ids[0], 1);
  cr_assert_eq(in->target_layer_ids[1], 0);
  cr_assert(in->has_convention && in->has_last_hidden);
  int32_t *ids = malloc(sizeof(int32_t) * T);
  uint8_t *mask = malloc(T);
  float *hid = malloc(sizeof(float) * T * 2 * H), *last = malloc(sizeof(float) * T * H);
  df_hs_sample_bufs b = {.input_ids = ids, .loss_mask = mask, .hidden = hid, .last_hidden = last};
  int64_t len = 0;
  DF_ASSERT_OK(df_hs_read_sample(ds, 0, 0, &b, &len, &err), &err);
  cr_assert_eq(len, T);
  const fx_tensor *want_ids = fx_get(e, "input_ids");
  for (int64_t r = 0; r < T; r++) {
    cr_assert_eq(ids[r], ((const int32_t *)want_ids->data)[r]);
    cr_assert_eq(mask[r], r >= PROMPT);
    // id L is transformers' hidden_states[L + 1]; the final state its last (post-norm) entry.
    const float *want = hs->data;
    df_expect_close_elementwise("layer 1", hid + (r * 2 + 0) * H, want + (2 * T + r) * H, H, 1e-4, 1e-4);
    df_expect_close_elementwise("layer 0", hid + (r * 2 + 1) * H, want + (1 * T + r) * H, H, 1e-4, 1e-4);
    df_expect_close_elementwise("final", last + r * H, want + (3 * T + r) * H, H, 1e-4, 1e-4);
  }
  df_hs_close(ds);

  // A rerun: shard 1 removed and a half-written temp left in its place → only shard 1 is redone.
  cr_assert_eq(system("mv " DIR_TMP "/out/shard_00001.h5 " DIR_TMP "/shard1.h5 && echo junk > " DIR_TMP
                      "/out/shard_00001.h5.tmp"),
               0);
  DF_ASSERT_OK(df_capture_run(&o, &rep, &err), &err);
  cr_assert_eq(rep.skipped_shards, 2);
  cr_assert_eq(rep.written, 2);
  cr_assert(access(DIR_TMP "/out/shard_00001.h5.tmp", F_OK) != 0, "the partial shard was redone");
  expect_same_samples(DIR_TMP "/shard1.h5", DIR_TMP "/out/shard_00001.h5");

  // Other settings into the same directory are refused, naming the key.
  o.dtype = DF_BF16;
  cr_assert_eq(df_capture_run(&o, &rep, &err), DF_ERR_INVALID);
  cr_assert(strstr(err.msg, "'dtype' differs"), "%s", err.msg);
  free(ids), free(mask), free(hid), free(last);
  fx_free(e);
}

// The target on the strict fake device (buffers fault on any host dereference): each sample's features are
// computed there and read back once; the shards equal the CPU capture's bit for bit (the fake device runs the
// CPU kernels), final states included, with and without regeneration.
Test(capture, on_the_strict_device_equals_cpu) {
  fx_file *e = setup_dir();
  fx_free(e);
  for (int regen = 0; regen < 2; regen++) {
    df_capture_options o = opts();
    o.regenerate = regen;
    df_ctx_options cpu = {.device = DF_DEV_CPU, .num_threads = 1};
    df_ctx_options fake = {.device = DF_DEV_FAKE, .num_threads = 1, .backend = df_fake_strict_backend()};
    df_capture_report rc, rf;
    df_error err = {0};
    o.out_dir = DIR_TMP "/cpu", o.ctx_options = &cpu;
    DF_ASSERT_OK(df_capture_run(&o, &rc, &err), &err);
    o.out_dir = DIR_TMP "/fake", o.ctx_options = &fake;
    DF_ASSERT_OK(df_capture_run(&o, &rf, &err), &err);
    cr_assert_eq(rc.written, 5);
    cr_assert_eq(rf.written, rc.written);
    cr_assert_eq(rf.generated_tokens, rc.generated_tokens);
    for (int k = 0; k < 3; k++) {
      char a[128], b[128];
      snprintf(a, sizeof a, DIR_TMP "/cpu/shard_%05d.h5", k), snprintf(b, sizeof b, DIR_TMP "/fake/shard_%05d.h5", k);
      expect_same_samples(a, b);
    }
    cr_assert_eq(system("rm -rf " DIR_TMP "/cpu " DIR_TMP "/fake"), 0);
  }
}

// --regenerate keeps the prompt and appends the target's greedy tokens: the first is transformers' argmax at the
// prompt's last position.
Test(capture, regenerate_continues_with_the_greedy_token) {
  fx_file *e = setup_dir();
  const fx_tensor *lg = fx_get(e, "logits");
  const int64_t V = lg->shape[1];
  const float *z = (const float *)lg->data + (PROMPT - 1) * V;
  int64_t best = 0, second = -1;
  for (int64_t v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  for (int64_t v = 0; v < V; v++)
    if (v != best && (second < 0 || z[v] > z[second])) second = v;
  cr_assert_gt(z[best] - z[second], 1e-3, "the fixture's top two logits are too close to decide");
  df_capture_options o = opts();
  o.regenerate = true;
  df_capture_report rep;
  df_error err = {0};
  DF_ASSERT_OK(df_capture_run(&o, &rep, &err), &err);
  cr_assert_eq(rep.generated_tokens, 5 * 4);
  df_hs_dataset *ds = NULL;
  DF_ASSERT_OK(df_hs_open(DIR_TMP "/out", &ds, &err), &err);
  int32_t ids[64];
  uint8_t mask[64];
  df_hs_sample_bufs b = {.input_ids = ids, .loss_mask = mask};
  int64_t len = 0;
  DF_ASSERT_OK(df_hs_read_sample(ds, 0, 0, &b, &len, &err), &err);
  cr_assert_eq(len, PROMPT + 4);
  cr_assert_eq(ids[PROMPT], best);
  for (int64_t i = 0; i < len; i++) cr_assert_eq(mask[i], i >= PROMPT);
  df_hs_close(ds);
  fx_free(e);
}

Test(capture, last_layer_and_unknown_target_are_refused) {
  fx_file *e = setup_dir();
  write_draft_config(DIR_TMP "/draft.json", "[2]");
  df_capture_options o = opts();
  df_capture_report rep;
  df_error err = {0};
  cr_assert_eq(df_capture_run(&o, &rep, &err), DF_ERR_INVALID);
  cr_assert(strstr(err.msg, "layer id 2"), "%s", err.msg);
  cr_assert(strstr(err.hint, "post-norm"), "%s", err.hint);
  write_draft_config(DIR_TMP "/draft.json", "[1]");
  FILE *fp = fopen(DIR_TMP "/data.jsonl", "a");
  fprintf(fp, "{\"input_ids\": [1, 200], \"loss_mask\": [0, 1]}\n");
  fclose(fp);
  cr_assert_eq(df_capture_run(&o, &rep, &err), DF_ERR_FORMAT);
  cr_assert(strstr(err.where, "data.jsonl:7"), "%s", err.where);
  cr_assert(strstr(err.msg, "input_ids[1]"), "%s", err.msg);
  fx_free(e);
}

// A shard that declares the shifted convention is refused by the reader, naming the attribute.
Test(capture, shifted_convention_attribute_is_an_error) {
  fx_file *e = setup_dir();
  df_capture_options o = opts();
  df_capture_report rep;
  df_error err = {0};
  DF_ASSERT_OK(df_capture_run(&o, &rep, &err), &err);
  hid_t f = H5Fopen(DIR_TMP "/out/shard_00000.h5", H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert(f >= 0);
  H5Adelete(f, DF_HS_ATTR_CONVENTION);
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  H5Tset_size(t, strlen(DF_HS_CONVENTION_SHIFTED) + 1);
  hid_t a = H5Acreate2(f, DF_HS_ATTR_CONVENTION, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, DF_HS_CONVENTION_SHIFTED);
  H5Aclose(a), H5Sclose(sp), H5Tclose(t), H5Fclose(f);
  df_hs_dataset *ds = NULL;
  cr_assert_eq(df_hs_open(DIR_TMP "/out", &ds, &err), DF_ERR_FORMAT);
  cr_assert(strstr(err.where, DF_HS_ATTR_CONVENTION), "%s", err.where);
  cr_assert(strstr(err.msg, "input of decoder layer L"), "%s", err.msg);
  fx_free(e);
}
