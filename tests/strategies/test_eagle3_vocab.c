// EAGLE-3's draft vocabulary (strategies/eagle3/vocab.h) equal to SpecForge's on every case of
// tests/fixtures/eagle3_step/vocab/cases.json (checked there against SpecForge's own count_effective_feature_tokens and
// process_token_dict_to_mappings): the Counter in insertion order, the padding tokens in CPython's set order, d2t;
// plus the set-order emulation on cases worked out by hand, and the failing inputs.
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/eagle3/vocab.h"
#include "tests/common/fixture.h"
#include "train/data/hs.h"

#define CASES DF_FIXTURE_DIR "/eagle3_step/vocab/cases.json"

static void count_samples(const json_t *samples, df_eagle3_counter *c) {
  df_error err = {0};
  for (size_t s = 0; s < json_array_size(samples); s++) {
    const json_t *ids = json_object_get(json_array_get(samples, s), "input_ids");
    const json_t *mask = json_object_get(json_array_get(samples, s), "loss_mask");
    const size_t n = json_array_size(ids);
    int32_t *i32 = malloc(sizeof *i32 * n);
    uint8_t *m = malloc(n);
    for (size_t k = 0; k < n; k++)
      i32[k] = (int32_t)json_integer_value(json_array_get(ids, k)),
      m[k] = (uint8_t)json_integer_value(json_array_get(mask, k));
    DF_ASSERT_OK(df_eagle3_counter_add(c, i32, m, (int64_t)n, (int64_t)s, &err), &err);
    free(i32), free(m);
  }
}

// The step fixtures' shards, in sample order, truncated to max_length (as the trainer's data view reads them).
static void count_data(const char *rel, int64_t max_length, df_eagle3_counter *c) {
  char path[1024];
  snprintf(path, sizeof path, "%s/../../%s", DF_FIXTURE_DIR, rel);
  df_hs_dataset *ds = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(path, &ds, &err), &err);
  const int64_t n = df_hs_get_info(ds)->num_samples;
  for (int64_t i = 0; i < n; i++) {
    int64_t len = 0;
    DF_ASSERT_OK(df_hs_sample_length(ds, i, &len, &err), &err);
    int32_t *ids = malloc(sizeof *ids * (size_t)len);
    uint8_t *mask = malloc((size_t)len);
    const df_hs_sample_bufs bufs = {.input_ids = ids, .loss_mask = mask};
    DF_ASSERT_OK(df_hs_read_sample(ds, i, max_length, &bufs, &len, &err), &err);
    DF_ASSERT_OK(df_eagle3_counter_add(c, ids, mask, len, i, &err), &err);
    free(ids), free(mask);
  }
  df_hs_close(ds);
}

Test(eagle3_vocab, every_fixture_case_equals_specforge) {
  json_error_t je;
  json_t *cases = json_load_file(CASES, 0, &je);
  cr_assert_not_null(cases, "%s: %s", CASES, je.text);
  cr_assert(json_array_size(cases) >= 6);
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *k = json_array_get(cases, i);
    const char *name = json_string_value(json_object_get(k, "name"));
    const int64_t D = json_integer_value(json_object_get(k, "draft_vocab_size"));
    const int64_t V = json_integer_value(json_object_get(k, "target_vocab_size"));
    df_eagle3_counter c;
    df_error err = {0};
    DF_ASSERT_OK(df_eagle3_counter_init(&c, V, &err), &err);
    if (json_object_get(k, "samples"))
      count_samples(json_object_get(k, "samples"), &c);
    else
      count_data(json_string_value(json_object_get(k, "data")), json_integer_value(json_object_get(k, "max_length")),
                 &c);
    const json_t *counts = json_object_get(k, "counts");
    cr_expect_eq(c.n, (int64_t)json_array_size(counts), "%s: %lld counted tokens", name, (long long)c.n);
    for (int64_t j = 0; j < c.n && j < (int64_t)json_array_size(counts); j++) {
      const json_t *e = json_array_get(counts, (size_t)j);
      cr_expect_eq(c.order[j], json_integer_value(json_array_get(e, 0)), "%s: Counter entry %lld", name, (long long)j);
      cr_expect_eq(c.count[c.order[j]], json_integer_value(json_array_get(e, 1)), "%s: count of %lld", name,
                   (long long)c.order[j]);
    }
    int64_t *d2t = malloc(sizeof *d2t * (size_t)D), *pad = malloc(sizeof *pad * (size_t)D), npad = 0;
    uint8_t *t2d = malloc((size_t)V);
    DF_ASSERT_OK(df_eagle3_vocab_from_counts(&c, D, d2t, t2d, pad, &npad, &err), &err);
    const json_t *padding = json_object_get(k, "padding_added"), *want = json_object_get(k, "d2t");
    cr_expect_eq(npad, (int64_t)json_array_size(padding), "%s: padding", name);
    for (int64_t j = 0; j < npad && j < (int64_t)json_array_size(padding); j++)
      cr_expect_eq(pad[j], json_integer_value(json_array_get(padding, (size_t)j)), "%s: padding %lld", name,
                   (long long)j);
    int64_t selected = 0;
    for (int64_t j = 0; j < D; j++) {
      cr_expect_eq(d2t[j], json_integer_value(json_array_get(want, (size_t)j)), "%s: d2t[%lld]", name, (long long)j);
      cr_expect(t2d[j + d2t[j]], "%s: t2d selects draft id %lld's target id", name, (long long)j);
    }
    for (int64_t v = 0; v < V; v++) selected += t2d[v];
    cr_expect_eq(selected, D, "%s: t2d selects exactly the draft vocabulary", name);
    free(d2t), free(pad), free(t2d);
    df_eagle3_counter_free(&c);
  }
  json_decref(cases);
}

// set(range(D)) - other in CPython 3.11, worked out with the reference (tools/reference/eagle3_vocab.py).
Test(eagle3_vocab, set_order_emulation) {
  int64_t out[16];
  const int64_t few[] = {3};
  cr_assert_eq(df_eagle3_missing_fill_order(few, 1, 8, out), 7); // the copy-and-discard path: table order
  const int64_t want_few[] = {0, 1, 2, 4, 5, 6, 7};
  for (int k = 0; k < 7; k++) cr_expect_eq(out[k], want_few[k]);
  const int64_t counted[] = {0, 1, 2, 4, 5, 7, 8, 10, 11, 12, 14, 15, 20, 40, 41};
  cr_assert_eq(df_eagle3_missing_fill_order(counted, 15, 16, out), 4); // {3, 6, 9, 13}, not ascending
  cr_expect_eq(out[0], 9, "the case of the fixtures: 9 comes first");
  const int64_t big[] = {100, 200, 300, 0, 1, 2, 3, 4, 5};
  cr_assert_eq(df_eagle3_missing_fill_order(big, 9, 10, out), 4);
  const int64_t want_big[] = {8, 9, 6, 7}; // docs/eagle3-step.md §2
  for (int k = 0; k < 4; k++) cr_expect_eq(out[k], want_big[k], "entry %d", k);
}

Test(eagle3_vocab, failing_inputs) {
  df_eagle3_counter c;
  df_error err = {0};
  DF_ASSERT_OK(df_eagle3_counter_init(&c, 8, &err), &err);
  const int32_t ids[3] = {1, 9, 2};
  const uint8_t mask[3] = {1, 1, 1};
  cr_expect_eq(df_eagle3_counter_add(&c, ids, mask, 3, 4, &err), DF_ERR_INVALID, "token 9 of a vocabulary of 8");
  cr_expect(strstr(err.msg, "sample 4") != NULL, "%s", err.msg);
  const int32_t ok[3] = {1, 1, 2};
  DF_ASSERT_OK(df_eagle3_counter_add(&c, ok, mask, 3, 5, &err), &err);
  cr_expect_eq(c.count[1], 2, "the refused sample left nothing behind");
  int64_t d2t[9];
  uint8_t t2d[8];
  cr_expect_eq(df_eagle3_vocab_from_counts(&c, 0, d2t, t2d, NULL, NULL, &err), DF_ERR_INVALID, "D 0");
  cr_expect_eq(df_eagle3_vocab_from_counts(&c, 9, d2t, t2d, NULL, NULL, &err), DF_ERR_INVALID,
               "a draft vocabulary larger than the target's");
  df_eagle3_counter_free(&c);
}

// Real CPython sets on random cases (tools/reference/make_eagle3_set_order_cases.py).
Test(eagle3_vocab, set_order_equals_cpython_on_random_cases) {
  json_error_t je;
  json_t *doc = json_load_file(DF_FIXTURE_DIR "/eagle3_set_order/cases.json", 0, &je);
  cr_assert_not_null(doc, "%s", je.text);
  const json_t *cases = json_object_get(doc, "cases");
  cr_assert(json_array_size(cases) >= 200);
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *k = json_array_get(cases, i), *counted = json_object_get(k, "counted");
    const json_t *order = json_object_get(k, "order");
    const int64_t D = json_integer_value(json_object_get(k, "D")), n = (int64_t)json_array_size(counted);
    int64_t *in = malloc(sizeof *in * (size_t)(n + 1)), *out = malloc(sizeof *out * (size_t)D);
    for (int64_t j = 0; j < n; j++) in[j] = json_integer_value(json_array_get(counted, (size_t)j));
    const int64_t got = df_eagle3_missing_fill_order(in, n, D, out);
    cr_expect_eq(got, (int64_t)json_array_size(order), "case %zu (D %lld)", i, (long long)D);
    bool same = got == (int64_t)json_array_size(order);
    for (int64_t j = 0; same && j < got; j++) same = out[j] == json_integer_value(json_array_get(order, (size_t)j));
    cr_expect(same, "case %zu (D %lld, %lld counted): another order than CPython's", i, (long long)D, (long long)n);
    free(in), free(out);
  }
  json_decref(doc);
}
