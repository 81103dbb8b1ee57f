// The target forward against transformers (tests/fixtures/target, tools/golden/gen_target_fixtures.py): every
// layer's hidden states and the logits of Qwen3 (GQA untied fp32, MQA tied bf16, YaRN fp16 sharded), Llama 3
// RoPE and Qwen2 with q/k/v biases; KV-cache decoding equal to one prefill; layer capture = hidden_states[L+1];
// strict loading and config refusals.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fixture.h"
#include "../common/json_edit.h"
#include "modeling/target/target_model.h"

// Tolerances: fp32 on both sides, different summation orders; values are O(1) (logits up to ~10).
#define HS_RTOL 1e-4
#define HS_ATOL 1e-4

static void fixture_dir(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/target/%s", DF_FIXTURE_DIR, name);
}

typedef struct {
  fx_file *fx;
  const int32_t *ids;
  int64_t T, L, H, V;
  const float *hs, *logits;
} expected;

static expected load_expected(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "target/%s/expected.safetensors", name);
  expected e = {.fx = fx_load(rel)};
  const fx_tensor *hs = fx_get(e.fx, "hidden_states"), *lg = fx_get(e.fx, "logits"), *ids = fx_get(e.fx, "input_ids");
  e.ids = ids->data, e.T = ids->shape[0];
  e.L = hs->shape[0] - 1, e.H = hs->shape[2], e.V = lg->shape[1];
  e.hs = hs->data, e.logits = lg->data;
  return e;
}

// One prefill of the whole input: all hidden states and the logits of every row.
static void check_prefill(const char *name) {
  char dir[512];
  fixture_dir(name, dir, sizeof dir);
  expected e = load_expected(name);
  df_error err = {0};
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_target *t = NULL;
  DF_ASSERT_OK(df_target_load(dir, ctx, &t, &err), &err);
  const df_target_spec *s = df_target_get_spec(t);
  cr_assert_eq(s->num_layers, e.L);
  cr_assert_eq(s->hidden, e.H);
  df_target_cache *c = NULL;
  DF_ASSERT_OK(df_target_cache_create(t, e.T, &c, &err), &err);
  float *all = malloc(sizeof(float) * (size_t)((e.L + 1) * e.T * e.H)), *logits = malloc(sizeof(float) * e.T * e.V);
  df_target_outputs o = {.all_hidden = all, .logits = logits};
  DF_ASSERT_OK(df_target_forward(t, c, e.ids, e.T, &o, &err), &err);
  for (int64_t l = 0; l <= e.L; l++) {
    char what[96];
    snprintf(what, sizeof what, "%s hidden_states[%lld]", name, (long long)l);
    df_expect_close_elementwise(what, all + l * e.T * e.H, e.hs + l * e.T * e.H, e.T * e.H, HS_RTOL, HS_ATOL);
  }
  df_expect_close_elementwise(name, logits, e.logits, e.T * e.V, HS_RTOL, HS_ATOL);
  cr_assert_eq(df_target_cache_len(c), e.T);
  free(all), free(logits);
  df_target_cache_free(c);
  df_target_free(t);
  df_ctx_destroy(ctx);
  fx_free(e.fx);
}

Test(target_model, qwen3_gqa_untied_f32) { check_prefill("qwen3_gqa_untied_f32"); }
Test(target_model, qwen3_mqa_tied_bf16) { check_prefill("qwen3_mqa_tied_bf16"); }
Test(target_model, qwen3_yarn_f16_sharded) { check_prefill("qwen3_yarn_f16_sharded"); }
Test(target_model, llama3_rope) { check_prefill("llama3_rope"); }
Test(target_model, qwen2_bias_tied) { check_prefill("qwen2_bias_tied"); }

// Prefill of 7 tokens, then 1, 5 and the rest through the cache: the capture of layers [1, 0] and the logits of
// every decoded row equal transformers' (hidden_states[L + 1], logits), and the argmax is the logits' argmax.
Test(target_model, kv_cache_decode_and_capture_match_prefill) {
  const char *name = "qwen3_gqa_untied_f32";
  char dir[512];
  fixture_dir(name, dir, sizeof dir);
  expected e = load_expected(name);
  df_error err = {0};
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_target *t = NULL;
  DF_ASSERT_OK(df_target_load(dir, ctx, &t, &err), &err);
  df_target_cache *c = NULL;
  DF_ASSERT_OK(df_target_cache_create(t, e.T + 4, &c, &err), &err);
  const int ids[2] = {1, 0};
  const int64_t steps[] = {7, 1, 5, e.T - 13};
  int64_t at = 0;
  float *cap = malloc(sizeof(float) * e.T * 2 * e.H), *logits = malloc(sizeof(float) * e.T * e.V);
  int32_t *am = malloc(sizeof(int32_t) * e.T);
  for (size_t k = 0; k < sizeof steps / sizeof *steps; k++) {
    df_target_outputs o = {.num_capture = 2,
                           .capture_ids = ids,
                           .captured = cap + at * 2 * e.H,
                           .logits = logits + at * e.V,
                           .argmax = am + at};
    DF_ASSERT_OK(df_target_forward(t, c, e.ids + at, steps[k], &o, &err), &err);
    at += steps[k];
  }
  for (int64_t r = 0; r < e.T; r++)
    for (int j = 0; j < 2; j++) {
      char what[96];
      snprintf(what, sizeof what, "row %lld layer %d", (long long)r, ids[j]);
      df_expect_close_elementwise(what, cap + (r * 2 + j) * e.H, e.hs + ((ids[j] + 1) * e.T + r) * e.H, e.H, HS_RTOL,
                                  HS_ATOL);
    }
  df_expect_close_elementwise("decoded logits", logits, e.logits, e.T * e.V, HS_RTOL, HS_ATOL);
  for (int64_t r = 0; r < e.T; r++) {
    int64_t best = 0;
    for (int64_t v = 1; v < e.V; v++)
      if (logits[r * e.V + v] > logits[r * e.V + best]) best = v;
    cr_assert_eq(am[r], best, "row %lld: argmax %d, logits say %lld", (long long)r, am[r], (long long)best);
  }
  // Rolling back 3 positions and redoing them reproduces the same rows.
  DF_ASSERT_OK(df_target_cache_truncate(c, e.T - 3, &err), &err);
  df_target_outputs o2 = {.logits = logits, .logits_from = 0};
  DF_ASSERT_OK(df_target_forward(t, c, e.ids + e.T - 3, 3, &o2, &err), &err);
  df_expect_close_elementwise("after rollback", logits, e.logits + (e.T - 3) * e.V, 3 * e.V, HS_RTOL, HS_ATOL);
  // The cache refuses more than its capacity, and a truncate past its length.
  int32_t more[8] = {0};
  cr_assert_eq(df_target_forward(t, c, more, 8, NULL, &err), DF_ERR_INVALID);
  cr_assert(strstr(err.msg, "capacity"), "%s", err.msg);
  cr_assert_eq(df_target_cache_truncate(c, e.T + 1, &err), DF_ERR_INVALID);
  free(cap), free(logits), free(am);
  df_target_cache_free(c);
  df_target_free(t);
  df_ctx_destroy(ctx);
  fx_free(e.fx);
}

Test(target_model, capture_id_out_of_range_is_an_error) {
  char dir[512];
  fixture_dir("qwen3_gqa_untied_f32", dir, sizeof dir);
  df_error err = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_target *t = NULL;
  DF_ASSERT_OK(df_target_load(dir, ctx, &t, &err), &err);
  df_target_cache *c = NULL;
  DF_ASSERT_OK(df_target_cache_create(t, 4, &c, &err), &err);
  float cap[4 * 32];
  const int bad[1] = {3};
  int32_t ids[1] = {5};
  df_target_outputs o = {.num_capture = 1, .capture_ids = bad, .captured = cap};
  cr_assert_eq(df_target_forward(t, c, ids, 1, &o, &err), DF_ERR_INVALID);
  cr_assert(strstr(err.msg, "layer id 3"), "%s", err.msg);
  cr_assert_eq(df_target_cache_len(c), 0);
  df_target_cache_free(c);
  df_target_free(t);
  df_ctx_destroy(ctx);
}

// Sets key (a JSON literal) in the config.json at path.
static void set_key(const char *path, const char *key, const char *value) {
  json_error_t je;
  json_t *d = json_load_file(path, 0, &je);
  cr_assert(d, "%s: %s", path, je.text);
  df_test_json_set(d, key, df_test_json(value));
  cr_assert_eq(json_dump_file(d, path, JSON_INDENT(2)), 0);
  json_decref(d);
}

// A copy of a fixture directory, to edit.
static void copy_case(const char *name, const char *tmp) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s/target/%s %s", tmp, DF_FIXTURE_DIR, name, tmp);
  cr_assert_eq(system(cmd), 0);
}

Test(target_model, config_refusals_name_the_key) {
  const char *tmp = "/tmp/df_test_target_cfg";
  struct {
    const char *key, *value, *expect;
  } cases[] = {{"model_type", "\"gpt2\"", "model_type"},
               {"use_sliding_window", "true", "use_sliding_window"},
               {"hidden_act", "\"gelu\"", "hidden_act"},
               {"num_experts", "8", "num_experts"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    copy_case("qwen3_gqa_untied_f32", tmp);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", tmp);
    set_key(path, cases[i].key, cases[i].value);
    df_error err = {0};
    df_target_spec s;
    cr_assert_neq(df_target_spec_from_dir(tmp, &s, &err), DF_OK, "%s accepted", cases[i].key);
    cr_assert(strstr(err.where, cases[i].expect), "%s: where = %s (%s)", cases[i].key, err.where, err.msg);
    cr_assert(err.hint[0], "%s: no hint", cases[i].key);
  }
}

// A checkpoint missing a tensor, or carrying an unknown one, is refused naming it.
Test(target_model, strict_load_names_missing_and_unexpected_tensors) {
  const char *tmp = "/tmp/df_test_target_strict";
  copy_case("qwen3_gqa_untied_f32", tmp);
  char path[256];
  snprintf(path, sizeof path, "%s/config.json", tmp);
  set_key(path, "tie_word_embeddings", "true"); // lm_head.weight is then ignored, but nothing else
  set_key(path, "num_hidden_layers", "2");      // layer 2 tensors are unexpected
  df_error err = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_target *t = NULL;
  cr_assert_neq(df_target_load(tmp, ctx, &t, &err), DF_OK);
  cr_assert(strstr(err.msg, "model.layers.2."), "%s", err.msg);
  set_key(path, "num_hidden_layers", "4"); // layer 3 tensors are missing
  cr_assert_neq(df_target_load(tmp, ctx, &t, &err), DF_OK);
  cr_assert(strstr(err.msg, "model.layers.3."), "%s", err.msg);
  df_ctx_destroy(ctx);
}
