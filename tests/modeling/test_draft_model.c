// The DFlash draft model: parameter table (names, shapes, order, roles, decay flags), init (statistics,
// determinism, the exact draftforge RNG values), the whole forward+backward against central differences,
// arena reuse across shapes, strict warm start (round trip, missing tensor), RoPE scaling tables, bad input.
//
// Finite differences (tests fd_*): fp32 forward, probe loss Σ r·out accumulated in double, central step
// h = 5e-3 on parameters of scale ~0.3–1 (weights U(±0.5), norms U(0.5, 1.5), biases U(±0.2)), i.e. about
// 1e-2 · scale. Per tensor, for 6 entries spread over it: |fd − g| ≤ 1e-2 · max|g| + 1e-4. Why: each loss
// evaluation carries fp32 rounding of ~1e-6 relative over ~200 output terms (|loss| ~ 10), ~1e-5 absolute,
// which the 2h divisor turns into ~1e-3 of noise; the h² truncation term is ~1e-3 · max|g| at h = 1e-2 and
// a quarter of that here. Measured: every check passes at 1e-3 · max|g| with no absolute slack (10x margin).
// A wrong term in a backward moves g by O(max|g|): dropping k_proj's weight gradient from the context rows,
// or overwriting instead of summing the context gradient across layers, fails dozens of checks.
#define _GNU_SOURCE // nftw, mkdtemp
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "modeling/draft_layer.h"
#include "modeling/draft_model.h"
#include "modeling/strict_load.h"
#include "tests/common/fixture.h"

// ---- helpers -------------------------------------------------------------------------------------------

static char *read_text(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  cr_assert_not_null(fp, "cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *s = calloc((size_t)n + 1, 1);
  cr_assert_eq(fread(s, 1, (size_t)n, fp), (size_t)n);
  fclose(fp);
  *len = (size_t)n;
  return s;
}

// configs/tiny-dflash.json, optionally with attention_bias switched on.
static const df_draft_config *tiny_config(bool bias) {
  size_t len;
  char *text = read_text(DF_FIXTURE_DIR "/../../configs/tiny-dflash.json", &len);
  if (bias) {
    char *p = strstr(text, "\"attention_bias\": false");
    cr_assert_not_null(p, "tiny-dflash.json lost its attention_bias key");
    memcpy(p, "\"attention_bias\":  true", strlen("\"attention_bias\": false"));
  }
  const df_draft_config *cfg;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, len, "tiny-dflash.json", &cfg, &err), &err);
  free(text);
  return cfg;
}

// The micro config of the finite-difference tests: H 16, 2 heads / 1 kv head of 8, I 24, 2 layers (layer 0
// slides with window 4), K 2, bs 3. rope is spliced in ("" for default RoPE).
static const df_draft_config *micro_config(bool bias, const char *rope) {
  char text[2048];
  snprintf(text, sizeof text,
           "{\"architectures\": [\"DFlashDraftModel\"], \"attention_bias\": %s, \"block_size\": 3,"
           " \"dflash_config\": {\"mask_token_id\": 255, \"target_layer_ids\": [1, 2]},"
           " \"head_dim\": 8, \"hidden_act\": \"silu\", \"hidden_size\": 16, \"initializer_range\": 0.02,"
           " \"intermediate_size\": 24, \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
           " \"max_position_embeddings\": 64, \"max_window_layers\": 0, \"model_type\": \"qwen3\","
           " \"num_attention_heads\": 2, \"num_hidden_layers\": 2, \"num_key_value_heads\": 1,"
           " \"num_target_layers\": 4, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000, %s"
           " \"sliding_window\": 4, \"use_sliding_window\": true, \"vocab_size\": 256}",
           bias ? "true" : "false", rope);
  const df_draft_config *cfg;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "micro", &cfg, &err), &err);
  return cfg;
}

static df_draft_model *make_model(const df_draft_config *cfg, df_ctx *ctx) {
  df_draft_model *m;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  return m;
}

// ---- (a) parameter table -------------------------------------------------------------------------------

typedef struct {
  char name[96];
  int ndim;
  int64_t d0, d1;
  df_param_role role;
} want_param;

static int want_add(want_param *w, int n, const char *name, int ndim, int64_t d0, int64_t d1, df_param_role r) {
  snprintf(w[n].name, sizeof w[n].name, "%s", name);
  w[n].ndim = ndim, w[n].d0 = d0, w[n].d1 = d1, w[n].role = r;
  return n + 1;
}

// The tiny config's table, written out by hand: H 64, 4 heads / 2 kv heads of 16, I 128, K 2, 2 layers.
static int tiny_expected(want_param *w, bool bias) {
  static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  static const int64_t rows[4] = {64, 32, 32, 64}, cols[4] = {64, 64, 64, 64};
  char nm[96];
  int n = want_add(w, 0, "fc.weight", 2, 64, 128, DF_ROLE_WEIGHT);
  n = want_add(w, n, "hidden_norm.weight", 1, 64, 0, DF_ROLE_NORM);
  for (int i = 0; i < 2; i++) {
    snprintf(nm, sizeof nm, "layers.%d.input_layernorm.weight", i);
    n = want_add(w, n, nm, 1, 64, 0, DF_ROLE_NORM);
    for (int p = 0; p < 4; p++) {
      snprintf(nm, sizeof nm, "layers.%d.self_attn.%s.weight", i, proj[p]);
      n = want_add(w, n, nm, 2, rows[p], cols[p], DF_ROLE_WEIGHT);
      if (!bias) continue;
      snprintf(nm, sizeof nm, "layers.%d.self_attn.%s.bias", i, proj[p]);
      n = want_add(w, n, nm, 1, rows[p], 0, DF_ROLE_BIAS);
    }
    snprintf(nm, sizeof nm, "layers.%d.self_attn.q_norm.weight", i);
    n = want_add(w, n, nm, 1, 16, 0, DF_ROLE_NORM);
    snprintf(nm, sizeof nm, "layers.%d.self_attn.k_norm.weight", i);
    n = want_add(w, n, nm, 1, 16, 0, DF_ROLE_NORM);
    snprintf(nm, sizeof nm, "layers.%d.post_attention_layernorm.weight", i);
    n = want_add(w, n, nm, 1, 64, 0, DF_ROLE_NORM);
    snprintf(nm, sizeof nm, "layers.%d.mlp.gate_proj.weight", i);
    n = want_add(w, n, nm, 2, 128, 64, DF_ROLE_WEIGHT);
    snprintf(nm, sizeof nm, "layers.%d.mlp.up_proj.weight", i);
    n = want_add(w, n, nm, 2, 128, 64, DF_ROLE_WEIGHT);
    snprintf(nm, sizeof nm, "layers.%d.mlp.down_proj.weight", i);
    n = want_add(w, n, nm, 2, 64, 128, DF_ROLE_WEIGHT);
  }
  return want_add(w, n, "norm.weight", 1, 64, 0, DF_ROLE_NORM);
}

static void check_table(bool bias, int64_t want_numel) {
  const df_draft_config *cfg = tiny_config(bias);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *m = make_model(cfg, ctx);
  const df_params *p = df_draft_model_params(m);
  want_param w[64];
  const int n = tiny_expected(w, bias);
  cr_assert_eq(df_params_count(p), n, "table has %d entries, expected %d", df_params_count(p), n);
  for (int i = 0; i < n; i++) {
    const df_param *e = df_params_at(p, i);
    cr_expect_str_eq(e->name, w[i].name, "entry %d", i);
    cr_expect_eq(e->ndim, w[i].ndim, "%s ndim", w[i].name);
    cr_expect_eq(e->shape[0], w[i].d0, "%s shape[0]", w[i].name);
    if (w[i].ndim == 2) cr_expect_eq(e->shape[1], w[i].d1, "%s shape[1]", w[i].name);
    cr_expect_eq(e->role, w[i].role, "%s role", w[i].name);
    cr_expect(e->trainable, "%s trainable", w[i].name);
    cr_expect_eq(e->weight_decay, w[i].role == DF_ROLE_WEIGHT, "%s: decay only on weights", w[i].name);
    cr_expect_eq(e->offset % DF_PARAMS_ALIGN_ELEMS, 0, "%s aligned", w[i].name);
  }
  cr_expect_eq(df_params_param_numel(p), want_numel, "parameter count %lld", (long long)df_params_param_numel(p));
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// 8192 + 64 + 2 · (64 + 4096 + 2048 + 2048 + 4096 + 16 + 16 + 64 + 3 · 8192) + 64; bias adds 2 · 192.
Test(draft_model, table_tiny) { check_table(false, 82368); }
Test(draft_model, table_tiny_attention_bias) { check_table(true, 82368 + 384); }

// ---- (b) init ------------------------------------------------------------------------------------------

Test(draft_model, init_matches_rng_and_is_deterministic) {
  const df_draft_config *cfg = tiny_config(true);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *a = make_model(cfg, ctx), *b = make_model(cfg, ctx);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_init(a, 1234, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(b, 1234, &err), &err);
  const df_params *p = df_draft_model_params(a);
  const size_t bytes = sizeof(float) * (size_t)df_params_numel(p);
  const float *wa = df_draft_model_weights(a);
  cr_expect_eq(memcmp(wa, df_draft_model_weights(b), bytes), 0, "same seed, different bits");

  // fc.weight is drawn first, row-major; q_proj of layer 0 continues the stream (norms draw nothing).
  df_rng r;
  df_rng_init(&r, 1234, DF_RNG_STREAM_INIT);
  const df_param *fc = df_params_find(p, "fc.weight"), *q = df_params_find(p, "layers.0.self_attn.q_proj.weight");
  for (int64_t j = 0; j < fc->numel; j++) {
    const float want = (float)(0.02 * df_rng_normal(&r));
    if (j < 16) cr_expect_eq(wa[fc->offset + j], want, "fc.weight[%lld]", (long long)j);
  }
  for (int j = 0; j < 8; j++) cr_expect_eq(wa[q->offset + j], (float)(0.02 * df_rng_normal(&r)), "q_proj[%d]", j);

  DF_ASSERT_OK(df_draft_model_init(b, 1235, &err), &err);
  cr_expect_neq(memcmp(wa, df_draft_model_weights(b), bytes), 0, "another seed, same bits");
  df_draft_model_free(a);
  df_draft_model_free(b);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(draft_model, init_statistics) {
  const df_draft_config *cfg = tiny_config(true);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *m = make_model(cfg, ctx);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_init(m, 42, &err), &err);
  const df_params *p = df_draft_model_params(m);
  const float *w = df_draft_model_weights(m);
  double s = 0, ss = 0;
  int64_t count = 0;
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    for (int64_t j = 0; j < e->numel; j++) {
      const float x = w[e->offset + j];
      if (e->role == DF_ROLE_NORM) cr_expect_eq(x, 1.0f, "%s[%lld] = %g", e->name, (long long)j, (double)x);
      if (e->role == DF_ROLE_BIAS) cr_expect_eq(x, 0.0f, "%s[%lld] = %g", e->name, (long long)j, (double)x);
      if (e->role == DF_ROLE_WEIGHT) s += x, ss += (double)x * x, count++;
    }
  }
  // ~8e4 draws of N(0, 0.02²): the mean is within 5 standard errors, the std within 2%.
  const double mean = s / (double)count, sd = sqrt(ss / (double)count - mean * mean);
  cr_expect_leq(fabs(mean), 5 * 0.02 / sqrt((double)count), "mean %g", mean);
  cr_expect_leq(fabs(sd - 0.02), 0.02 * 0.02, "std %g", sd);
  // Gradients start at zero.
  const float *g = df_draft_model_grads(m);
  for (int64_t j = 0; j < df_params_numel(p); j++) cr_assert_eq(g[j], 0.0f);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- (c) forward + backward against finite differences --------------------------------------------------

enum { FD_B = 2, FD_S = 10, FD_N = 2, FD_BS = 3, FD_H = 16, FD_K = 2, FD_Q = FD_N * FD_BS };

typedef struct {
  float th[FD_B * FD_S * FD_K * FD_H]; // (B, S, K·H)
  float emb[FD_B * FD_Q * FD_H];       // (B, Q, H)
  int32_t anchors[FD_B * FD_N];        // (B, N)
  uint8_t keep[FD_B * FD_N];           // (B, N)
  float r[FD_B * FD_Q * FD_H];         // (B, Q, H) probe weights
  df_draft_batch batch;
  df_draft_model *m;
} fd_case;

static void fd_batch(fd_case *c) {
  df_test_fill_uniform(c->th, FD_B * FD_S * FD_K * FD_H, 11, -1.0f, 1.0f);
  df_test_fill_uniform(c->emb, FD_B * FD_Q * FD_H, 12, -1.0f, 1.0f);
  df_test_fill_uniform(c->r, FD_B * FD_Q * FD_H, 13, -1.0f, 1.0f);
  // Sample 0: anchors 2 and 6; sample 1: anchor 4 and one padding block.
  const int32_t an[FD_B * FD_N] = {2, 6, 4, 0};
  const uint8_t kp[FD_B * FD_N] = {1, 1, 1, 0};
  memcpy(c->anchors, an, sizeof an);
  memcpy(c->keep, kp, sizeof kp);
  c->batch = (df_draft_batch){.B = FD_B,
                              .S = FD_S,
                              .N = FD_N,
                              .target_hidden = c->th,
                              .block_embed = c->emb,
                              .anchors = c->anchors,
                              .keep = c->keep};
}

// Weights U(±0.5), norms U(0.5, 1.5), biases U(±0.2): every path carries signal.
static void fd_params(df_draft_model *m) {
  const df_params *p = df_draft_model_params(m);
  float *w = df_draft_model_weights(m);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    const float lo = e->role == DF_ROLE_NORM ? 0.5f : (e->role == DF_ROLE_BIAS ? -0.2f : -0.5f);
    const float hi = e->role == DF_ROLE_NORM ? 1.5f : (e->role == DF_ROLE_BIAS ? 0.2f : 0.5f);
    df_test_fill_uniform(w + e->offset, e->numel, 100 + (uint64_t)i, lo, hi);
  }
}

static double fd_loss(void *vc) {
  fd_case *c = vc;
  const float *out;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_forward(c->m, &c->batch, &out, &err), &err);
  double s = 0.0;
  for (int64_t i = 0; i < FD_B * FD_Q * FD_H; i++) s += (double)c->r[i] * out[i];
  return s;
}

#ifndef FD_RTOL
#define FD_RTOL 1e-2 // (overridable, to probe the margin)
#define FD_ATOL 1e-4
#define FD_STEP 5e-3
#endif

static void check_fd(const df_draft_config *cfg) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  fd_case *c = calloc(1, sizeof *c);
  fd_batch(c);
  c->m = make_model(cfg, ctx);
  fd_params(c->m);
  df_error err = {0};
  fd_loss(c);
  DF_ASSERT_OK(df_draft_model_backward(c->m, c->r, &err), &err);

  const df_params *p = df_draft_model_params(c->m);
  float *w = df_draft_model_weights(c->m);
  const float *g = df_draft_model_grads(c->m);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    double gmax = 0.0;
    for (int64_t j = 0; j < e->numel; j++) gmax = fmax(gmax, fabs((double)g[e->offset + j]));
    cr_expect_gt(gmax, 1e-3, "%s: gradient is (almost) zero, max|g| = %g", e->name, gmax);
    df_fd_check(e->name, w + e->offset, g + e->offset, e->numel, fd_loss, c, FD_STEP, FD_RTOL, FD_ATOL, 6);
  }
  df_draft_model_free(c->m);
  free(c);
  df_ctx_destroy(ctx);
}

Test(draft_model, fd_every_parameter_bias_default_rope, .timeout = 120) {
  const df_draft_config *cfg = micro_config(true, "");
  check_fd(cfg);
  df_draft_config_free(cfg);
}

Test(draft_model, fd_every_parameter_yarn_rope, .timeout = 120) {
  const df_draft_config *cfg = micro_config(false, "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                                                   "\"original_max_position_embeddings\": 16},");
  check_fd(cfg);
  df_draft_config_free(cfg);
}

// A second backward of the same forward adds the same gradient again; zero_grads clears it.
Test(draft_model, backward_accumulates) {
  const df_draft_config *cfg = micro_config(true, "");
  df_ctx *ctx = df_test_cpu_ctx(2);
  fd_case *c = calloc(1, sizeof *c);
  fd_batch(c);
  c->m = make_model(cfg, ctx);
  fd_params(c->m);
  df_error err = {0};
  fd_loss(c);
  DF_ASSERT_OK(df_draft_model_backward(c->m, c->r, &err), &err);
  const int64_t n = df_params_numel(df_draft_model_params(c->m));
  float *once = malloc(sizeof(float) * (size_t)n);
  memcpy(once, df_draft_model_grads(c->m), sizeof(float) * (size_t)n);
  DF_ASSERT_OK(df_draft_model_backward(c->m, c->r, &err), &err);
  const float *g = df_draft_model_grads(c->m);
  // Not bitwise 2×: a GEMM with beta = 1 and the per-sample k/v calls add in a different order.
  for (int64_t j = 0; j < n; j++) once[j] *= 2.0f;
  df_expect_close("2 x grad", g, once, n, 1e-6, 0.0);
  df_draft_model_zero_grads(c->m);
  for (int64_t j = 0; j < n; j++) cr_assert_eq(g[j], 0.0f);
  free(once);
  df_draft_model_free(c->m);
  free(c);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// The model keeps its own copy of the batch: scribbling over the caller's arrays between forward and
// backward changes nothing.
Test(draft_model, batch_is_copied) {
  const df_draft_config *cfg = micro_config(false, "");
  df_ctx *ctx = df_test_cpu_ctx(2);
  fd_case *c = calloc(1, sizeof *c);
  fd_batch(c);
  c->m = make_model(cfg, ctx);
  fd_params(c->m);
  df_error err = {0};
  fd_loss(c);
  DF_ASSERT_OK(df_draft_model_backward(c->m, c->r, &err), &err);
  const int64_t n = df_params_numel(df_draft_model_params(c->m));
  float *clean = malloc(sizeof(float) * (size_t)n);
  memcpy(clean, df_draft_model_grads(c->m), sizeof(float) * (size_t)n);
  df_draft_model_zero_grads(c->m);
  fd_loss(c);
  memset(c->th, 0x7f, sizeof c->th);
  memset(c->emb, 0x7f, sizeof c->emb);
  memset(c->anchors, 0x7f, sizeof c->anchors);
  DF_ASSERT_OK(df_draft_model_backward(c->m, c->r, &err), &err);
  cr_expect_eq(memcmp(clean, df_draft_model_grads(c->m), sizeof(float) * (size_t)n), 0);
  free(clean);
  df_draft_model_free(c->m);
  free(c);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- arena reuse, determinism, bad input ----------------------------------------------------------------

static void forward_copy(df_draft_model *m, const df_draft_batch *b, float *dst) {
  const float *out;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_forward(m, b, &out, &err), &err);
  memcpy(dst, out, sizeof(float) * (size_t)(b->B * b->N * FD_BS * FD_H));
}

Test(draft_model, arena_grows_and_results_do_not_depend_on_history) {
  const df_draft_config *cfg = micro_config(false, "");
  df_ctx *ctx = df_test_cpu_ctx(2);
  fd_case *c = calloc(1, sizeof *c);
  fd_batch(c);
  c->m = make_model(cfg, ctx);
  fd_params(c->m);
  // The same data as a one-sample, shorter batch (sample 0 truncated to S = 9 keeps its anchors valid).
  static float th1[9 * FD_K * FD_H];
  for (int s = 0; s < 9; s++) memcpy(th1 + s * FD_K * FD_H, c->th + s * FD_K * FD_H, sizeof(float) * FD_K * FD_H);
  df_draft_batch small = {
      .B = 1, .S = 9, .N = FD_N, .target_hidden = th1, .block_embed = c->emb, .anchors = c->anchors, .keep = c->keep};
  float a[FD_Q * FD_H], b[FD_Q * FD_H], big1[FD_B * FD_Q * FD_H], big2[FD_B * FD_Q * FD_H];
  forward_copy(c->m, &small, a);
  const int64_t small_bytes = df_draft_model_activation_bytes(c->m);
  forward_copy(c->m, &c->batch, big1);
  cr_expect_gt(df_draft_model_activation_bytes(c->m), small_bytes, "a larger batch needs more activation memory");
  forward_copy(c->m, &small, b);
  cr_expect_eq(df_draft_model_activation_bytes(c->m), small_bytes);
  cr_expect_eq(memcmp(a, b, sizeof a), 0, "the small batch changed after a larger one went through");
  forward_copy(c->m, &c->batch, big2);
  cr_expect_eq(memcmp(big1, big2, sizeof big1), 0, "forward is not deterministic");
  df_draft_model_free(c->m);
  free(c);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(draft_model, rejects_bad_anchor_and_backward_without_forward) {
  const df_draft_config *cfg = micro_config(false, "");
  df_ctx *ctx = df_test_cpu_ctx(2);
  fd_case *c = calloc(1, sizeof *c);
  fd_batch(c);
  c->m = make_model(cfg, ctx);
  df_error err = {0};
  cr_expect_eq(df_draft_model_backward(c->m, c->r, &err), DF_ERR_INVALID);
  c->anchors[1] = FD_S; // a kept block's anchor past the context
  const float *out = (const float *)1;
  cr_expect_eq(df_draft_model_forward(c->m, &c->batch, &out, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "anchors[0,1]");
  cr_expect_null(out);
  c->anchors[1] = 6;
  c->anchors[3] = 1000; // a padding block's anchor is ignored
  DF_ASSERT_OK(df_draft_model_forward(c->m, &c->batch, &out, &err), &err);
  df_draft_model_free(c->m);
  free(c);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- (d) strict warm start -----------------------------------------------------------------------------

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

// Writes every parameter but `skip` (NULL: none), plus a 4-element tensor `extra` (NULL: none).
static void write_params(const df_params *p, const float *w, const char *path, const char *skip, const char *extra) {
  df_error err = {0};
  df_st_writer *wr;
  DF_ASSERT_OK(df_st_writer_new(&wr, &err), &err);
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    if (skip && !strcmp(e->name, skip)) continue;
    DF_ASSERT_OK(df_st_writer_add_f32_as(wr, e->name, DF_ST_F32, e->ndim, e->shape, w + e->offset, &err), &err);
  }
  static const float four[4] = {1, 2, 3, 4};
  if (extra) DF_ASSERT_OK(df_st_writer_add_f32_as(wr, extra, DF_ST_F32, 1, (const int64_t[]){4}, four, &err), &err);
  DF_ASSERT_OK(df_st_writer_write(wr, path, &err), &err);
  df_st_writer_free(wr);
}

Test(draft_model, load_round_trip_and_mismatches) {
  char dir[] = "/tmp/df_draft_model_XXXXXX", path[96], bad[96];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  snprintf(bad, sizeof bad, "%s/edited.safetensors", dir);
  const df_draft_config *cfg = tiny_config(true);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *a = make_model(cfg, ctx), *b = make_model(cfg, ctx);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_init(a, 5, &err), &err);
  const df_params *p = df_draft_model_params(a);
  const size_t bytes = sizeof(float) * (size_t)df_params_numel(p);
  DF_ASSERT_OK(df_params_save(p, df_draft_model_weights(a), path, NULL, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(b, path, &err), &err);
  cr_expect_eq(memcmp(df_draft_model_weights(a), df_draft_model_weights(b), bytes), 0, "round trip changed bits");

  // The same file without one tensor: the load fails naming it and leaves the weights as they were.
  const char *gone = "layers.1.self_attn.k_norm.weight";
  write_params(p, df_draft_model_weights(a), bad, gone, NULL);
  DF_ASSERT_OK(df_draft_model_init(b, 6, &err), &err);
  float *before = malloc(bytes);
  memcpy(before, df_draft_model_weights(b), bytes);
  cr_expect_eq(df_draft_model_load(b, bad, &err), DF_ERR_INVALID);
  cr_expect_not_null(strstr(err.msg, "missing parameter 'layers.1.self_attn.k_norm.weight'"), "msg: %s", err.msg);
  cr_expect_not_null(strstr(err.where, gone), "where: %s", err.where);
  cr_expect_eq(memcmp(before, df_draft_model_weights(b), bytes), 0, "a failed load touched the weights");
  cr_expect_neq(df_draft_model_load(b, "/nonexistent/model.safetensors", &err), DF_OK);

  // A tensor that is no parameter fails the load (here the frozen target head)...
  write_params(p, df_draft_model_weights(a), bad, NULL, "lm_head.weight");
  cr_expect_eq(df_draft_model_load(b, bad, &err), DF_ERR_INVALID);
  cr_expect_not_null(strstr(err.msg, "unexpected tensor 'lm_head.weight'"), "msg: %s", err.msg);
  // ...except the derived RoPE table older HF checkpoints persisted.
  write_params(p, df_draft_model_weights(a), bad, NULL, "rotary_emb.inv_freq");
  DF_ASSERT_OK(df_draft_model_load(b, bad, &err), &err);
  cr_expect_eq(memcmp(df_draft_model_weights(a), df_draft_model_weights(b), bytes), 0);
  free(before);
  df_draft_model_free(a);
  df_draft_model_free(b);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
  nftw(dir, rm_entry, 4, FTW_DEPTH | FTW_PHYS);
}

// ---- RoPE tables ---------------------------------------------------------------------------------------

// The HF formulas evaluated in double; the model's fp32 tables must agree to 2e-6 relative.
static df_rope_config rope_base(df_rope_type t, double factor) {
  return (df_rope_config){.type = t,
                          .theta = 10000.0,
                          .head_dim = 16,
                          .max_position_embeddings = 4096,
                          .factor = factor,
                          .beta_fast = 32.0,
                          .beta_slow = 1.0,
                          .truncate = true};
}

static double default_inv(const df_rope_config *rc, int i) {
  return 1.0 / pow(rc->theta, (2.0 * i) / (double)rc->head_dim);
}

static void expect_rel(const char *what, int i, float got, double want) {
  cr_expect_leq(fabs((double)got - want), 2e-6 * fabs(want), "%s[%d]: %.9g vs %.9g", what, i, (double)got, want);
}

Test(draft_model, rope_tables_linear_llama3_yarn) {
  float f[8], ms;
  df_error err = {0};
  df_rope_config rc = rope_base(DF_ROPE_LINEAR, 4.0);
  DF_ASSERT_OK(dflash_rope_table(&rc, f, &ms, &err), &err);
  for (int i = 0; i < 8; i++) expect_rel("linear", i, f[i], default_inv(&rc, i) / 4.0);
  cr_expect_eq(ms, 1.0f);

  rc = rope_base(DF_ROPE_LLAMA3, 8.0);
  rc.original_max_position_embeddings = 64, rc.low_freq_factor = 1.0, rc.high_freq_factor = 4.0;
  DF_ASSERT_OK(dflash_rope_table(&rc, f, &ms, &err), &err);
  for (int i = 0; i < 8; i++) {
    const double inv = default_inv(&rc, i), wl = 2 * M_PI / inv, lo = 64.0, hi = 16.0;
    const double s = (64.0 / wl - 1.0) / 3.0;
    const double want = wl < hi ? inv : (wl > lo ? inv / 8.0 : (1 - s) * inv / 8.0 + s * inv);
    expect_rel("llama3", i, f[i], want);
  }
  cr_expect_eq(ms, 1.0f);

  rc = rope_base(DF_ROPE_YARN, 4.0);
  rc.original_max_position_embeddings = 256;
  DF_ASSERT_OK(dflash_rope_table(&rc, f, &ms, &err), &err);
  const double cd_fast = 16 * log(256 / (32 * 2 * M_PI)) / (2 * log(1e4));
  const double cd_slow = 16 * log(256 / (1 * 2 * M_PI)) / (2 * log(1e4));
  const double lo = fmax(floor(cd_fast), 0), hi = fmin(ceil(cd_slow), 15);
  for (int i = 0; i < 8; i++) {
    const double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), ef = 1 - ramp, inv = default_inv(&rc, i);
    expect_rel("yarn", i, f[i], inv / 4.0 * (1 - ef) + inv * ef);
  }
  cr_expect_float_eq(ms, (float)(0.1 * log(4.0) + 1.0), 1e-7, "yarn attention factor %g", (double)ms);
}
