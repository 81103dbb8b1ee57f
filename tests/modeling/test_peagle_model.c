// The P-EAGLE draft (modeling/peagle_model.h) and its config (modeling/draft_config_eagle3.c): the parameter table in
// SpecForge's order and names and its cold init; the backward against central differences of the forward; parallel
// drafting's causal decode against the dense training layout (a mask row of depth d appended after anchor p is the
// training row (d, p)), across two rounds that overwrite the first round's mask rows; the config's defaults, refusals
// and serving keys.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fixture.h"
#include "modeling/draft_model.h"
#include "modeling/peagle_model.h"

#define CORE                                                                                                           \
  "\"architectures\": [\"PEagleDraftModel\"], \"hidden_size\": 32, \"intermediate_size\": 48, "                        \
  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 40, \"draft_vocab_size\": 24, "             \
  "\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [0, 1, 2]}"

enum { H = 32, W = 96, V = 40, MASK = 39 };

static const df_draft_config *config_of(const char *text) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), &err);
  return cfg;
}

static df_draft_model *model_of(const df_draft_config *cfg, df_ctx *ctx, uint64_t seed) {
  df_draft_model *m = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, seed, &err), &err);
  return m;
}

Test(peagle_model, parameter_table_in_specforge_order_and_cold_init) {
  const df_draft_config *cfg = config_of("{" CORE ", \"num_hidden_layers\": 2}");
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m = model_of(cfg, ctx, 5);
  const df_params *p = df_draft_model_params(m);
  const char *names[] = {"embed_tokens.weight",
                         "fc.weight",
                         "mask_hidden",
                         "layers.0.input_layernorm.weight",
                         "layers.0.hidden_norm.weight",
                         "layers.0.self_attn.q_proj.weight",
                         "layers.0.self_attn.k_proj.weight",
                         "layers.0.self_attn.v_proj.weight",
                         "layers.0.self_attn.o_proj.weight",
                         "layers.0.post_attention_layernorm.weight",
                         "layers.0.mlp.gate_proj.weight",
                         "layers.0.mlp.up_proj.weight",
                         "layers.0.mlp.down_proj.weight",
                         "layers.1.input_layernorm.weight",
                         "layers.1.self_attn.q_proj.weight",
                         "layers.1.self_attn.k_proj.weight",
                         "layers.1.self_attn.v_proj.weight",
                         "layers.1.self_attn.o_proj.weight",
                         "layers.1.post_attention_layernorm.weight",
                         "layers.1.mlp.gate_proj.weight",
                         "layers.1.mlp.up_proj.weight",
                         "layers.1.mlp.down_proj.weight",
                         "norm.weight",
                         "lm_head.weight",
                         "t2d",
                         "d2t"};
  const int n = (int)(sizeof names / sizeof *names);
  cr_assert_eq(df_params_count(p), n);
  for (int i = 0; i < n; i++) cr_expect_str_eq(df_params_at(p, i)->name, names[i]);
  cr_expect_eq(df_params_find(p, "layers.0.self_attn.q_proj.weight")->shape[1], 2 * H, "layer 0 reads 2H");
  cr_expect_eq(df_params_find(p, "layers.1.self_attn.q_proj.weight")->shape[1], H, "the others read H");
  const df_param *mh = df_params_find(p, "mask_hidden"), *e = df_params_find(p, "embed_tokens.weight");
  cr_expect(mh->ndim == 3 && mh->shape[0] == 1 && mh->shape[1] == 1 && mh->shape[2] == W && mh->trainable);
  cr_expect(e->trainable, "SpecForge trains P-EAGLE's embedding");
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(cfg, &total, &active);
  cr_expect_eq(total, df_params_param_numel(p) - V - 24, "the config's count is the trainable part");
  // cold init: mask_hidden N(0, 1) as torch.randn, the linear weights N(0, 0.02)
  const float *w = df_draft_model_weights(m);
  double s2 = 0, f2 = 0;
  for (int64_t i = 0; i < mh->numel; i++) s2 += (double)w[mh->offset + i] * w[mh->offset + i];
  const df_param *fc = df_params_find(p, "fc.weight");
  for (int64_t i = 0; i < fc->numel; i++) f2 += (double)w[fc->offset + i] * w[fc->offset + i];
  const double sd = sqrt(s2 / (double)mh->numel), sf = sqrt(f2 / (double)fc->numel);
  cr_expect(sd > 0.8 && sd < 1.2, "mask_hidden std %g (N(0, 1))", sd);
  cr_expect(sf > 0.018 && sf < 0.022, "fc std %g (N(0, 0.02))", sf);
  // a cold start's embedding from the target
  float *tab = malloc(sizeof(float) * V * H);
  df_test_fill_uniform(tab, V * H, 3, -1, 1);
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_init_from_target(m, tab, V, H, &err), &err);
  cr_expect(!memcmp(w + e->offset, tab, sizeof(float) * V * H), "embed_tokens is the target's");
  cr_expect_eq(df_draft_model_init_from_target(m, tab, V, H + 1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "embed_tokens.weight");
  free(tab);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- a dense micro-batch --------------------------------------------------------------------------------------

enum { S = 9, T = 3 };

typedef struct {
  float aux[S * W];
  int32_t tok[S + 1], ids[T * S], pos[T * S], len[1];
} batch;

static void batch_fill(batch *b, int seed) {
  df_test_fill_uniform(b->aux, S * W, (uint64_t)seed, -2, 2);
  for (int i = 0; i <= S; i++) b->tok[i] = (int32_t)((i * 13 + seed) % (V - 1));
  for (int d = 0; d < T; d++)
    for (int p = 0; p < S; p++) b->ids[d * S + p] = d > 0 ? MASK : b->tok[p + 1], b->pos[d * S + p] = p + d;
  b->len[0] = S;
}

static df_peagle_batch view_of(batch *b) {
  return (df_peagle_batch){.B = 1, .S = S, .T = T, .aux = b->aux, .ids = b->ids, .pos = b->pos, .lengths = b->len};
}

// loss = Σ out ⊙ G: the backward is run with d_out = G.
static double loss_of(df_peagle_model *m, batch *b, const float *G) {
  const df_peagle_batch v = view_of(b);
  const float *out = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_peagle_forward(m, &v, &out, &err), &err);
  double s = 0;
  for (int i = 0; i < T * S * H; i++) s += (double)out[i] * G[i];
  return s;
}

static void gradients_match(const char *extra) {
  char text[1024];
  snprintf(text, sizeof text, "{" CORE ", \"num_hidden_layers\": 2%s}", extra);
  const df_draft_config *cfg = config_of(text);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *dm = model_of(cfg, ctx, 9);
  df_peagle_model *m = df_draft_model_peagle(dm);
  const df_params *p = df_draft_model_params(dm);
  float *w = df_draft_model_weights(dm), *g = df_draft_model_grads(dm);
  for (int i = 0; i < df_params_count(p); i++) { // larger weights than the init: every path carries signal
    const df_param *e = df_params_at(p, i);
    if (e->role == DF_ROLE_WEIGHT || e->role == DF_ROLE_EMBED)
      df_test_fill_uniform(w + e->offset, e->numel, 100 + (uint64_t)i, -0.4f, 0.4f);
    if (e->role == DF_ROLE_NORM) df_test_fill_uniform(w + e->offset, e->numel, 200 + (uint64_t)i, 0.6f, 1.4f);
  }
  batch b;
  batch_fill(&b, 4);
  float *G = malloc(sizeof(float) * T * S * H);
  df_test_fill_uniform(G, T * S * H, 77, -1, 1);
  df_error err = {0};
  df_draft_model_zero_grads(dm);
  loss_of(m, &b, G);
  DF_ASSERT_OK(df_peagle_backward(m, G, &err), &err);
  // central differences on entries of every kind of parameter
  const struct {
    const char *name;
    int64_t idx;
  } probes[] = {{"mask_hidden", 5},
                {"mask_hidden", 70},
                {"fc.weight", 33},
                {"embed_tokens.weight", MASK * H + 3}, // the mask token's row: every depth > 0 row reads it
                {"embed_tokens.weight", 7 * H + 1},
                {"layers.0.hidden_norm.weight", 2},
                {"layers.0.input_layernorm.weight", 9},
                {"layers.0.self_attn.k_proj.weight", 100},
                {"layers.0.self_attn.q_proj.weight", 1000},
                {"layers.1.self_attn.v_proj.weight", 60},
                {"layers.1.input_layernorm.weight", 4},
                {"layers.1.mlp.down_proj.weight", 500},
                {"norm.weight", 11}};
  for (size_t k = 0; k < sizeof probes / sizeof *probes; k++) {
    const df_param *e = df_params_find(p, probes[k].name);
    cr_assert_not_null(e, "%s", probes[k].name);
    float *x = w + e->offset + probes[k].idx;
    const float x0 = *x, h = 1e-2f;
    *x = x0 + h;
    DF_ASSERT_OK(df_draft_model_sync_params(dm, &err), &err);
    const double lp = loss_of(m, &b, G);
    *x = x0 - h;
    DF_ASSERT_OK(df_draft_model_sync_params(dm, &err), &err);
    const double lm = loss_of(m, &b, G);
    *x = x0;
    DF_ASSERT_OK(df_draft_model_sync_params(dm, &err), &err);
    const double num = (lp - lm) / (2.0 * h), ana = g[e->offset + probes[k].idx];
    cr_expect(fabs(num - ana) <= 2e-2 * fmax(fabs(num), 1.0), "%s%s[%lld]: analytic %.6g, numeric %.6g", extra,
              probes[k].name, (long long)probes[k].idx, ana, num);
  }
  free(G);
  df_draft_model_free(dm);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(peagle_model, backward_matches_central_differences) { gradients_match(""); }
Test(peagle_model, backward_matches_central_differences_norm_before_residual) {
  gradients_match(", \"norm_before_residual\": true");
}

// ---- parallel drafting -------------------------------------------------------------------------------------------

Test(peagle_model, decode_rows_equal_the_dense_training_rows) {
  const df_draft_config *cfg = config_of("{" CORE ", \"num_hidden_layers\": 2}");
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *dm = model_of(cfg, ctx, 13);
  df_peagle_model *m = df_draft_model_peagle(dm);
  batch b;
  batch_fill(&b, 6);
  const df_peagle_batch v = view_of(&b);
  const float *o = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_peagle_forward(m, &v, &o, &err), &err);
  float *dense = malloc(sizeof(float) * T * S * H);
  memcpy(dense, o, sizeof(float) * T * S * H);
  df_peagle_cache *c = NULL;
  DF_ASSERT_OK(df_peagle_cache_create(m, S + T, &c, &err), &err);
  // round 1: positions 0 .. 4, then anchor 4's mask rows at 5, 6; round 2: positions 5 .. 8 over them, anchor 8's
  const int rounds[2][2] = {{0, 5}, {5, S}};
  for (int r = 0; r < 2; r++) {
    const int from = rounds[r][0], to = rounds[r][1], n0 = to - from, n = n0 + T - 1;
    int32_t ids[S + T];
    for (int j = 0; j < n0; j++) ids[j] = b.tok[from + j + 1];
    for (int j = n0; j < n; j++) ids[j] = MASK;
    DF_ASSERT_OK(df_peagle_decode(m, c, from, n, n0, b.aux + from * W, ids, &o, &err), &err);
    char what[160];
    for (int j = 0; j < n0; j++) {
      snprintf(what, sizeof what, "round %d: decode row %d = training row (0, %d)", r, from + j, from + j);
      df_expect_close(what, o + j * H, dense + (from + j) * H, H, 1e-5, 1e-6);
    }
    for (int d = 1; d < T; d++) {
      snprintf(what, sizeof what, "round %d: mask row of depth %d = training row (%d, %d)", r, d, d, to - 1);
      df_expect_close(what, o + (n0 - 1 + d) * H, dense + (d * S + to - 1) * H, H, 1e-5, 1e-6);
    }
  }
  df_peagle_cache_free(c);
  free(dense);
  df_draft_model_free(dm);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- the config ---------------------------------------------------------------------------------------------------

static void refused(const char *extra, const char *where, df_status want) {
  char text[1024];
  snprintf(text, sizeof text, "{" CORE "%s}", extra);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_expect_eq(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), want, "%s", extra);
  cr_expect_str_eq(err.where, where, "%s: %s", extra, err.msg);
  cr_expect_null(cfg);
}

Test(peagle_config, defaults_refusals_and_the_serving_config) {
  const df_draft_config *cfg = config_of("{" CORE "}");
  cr_expect_eq(cfg->kind, DF_DRAFT_PEAGLE);
  cr_expect(df_draft_is_eagle(cfg));
  cr_expect_eq(cfg->num_hidden_layers, 1);
  cr_expect(!cfg->eagle3.norm_before_residual);
  cr_expect_eq(cfg->dflash.mask_token_id, -1, "no mask token unless the config names one");
  df_draft_config_free(cfg);
  cfg = config_of("{" CORE ", \"num_hidden_layers\": 4, \"norm_before_residual\": true, \"mask_token_id\": 39}");
  cr_expect_eq(cfg->num_hidden_layers, 4);
  cr_expect(cfg->eagle3.norm_before_residual);
  cr_expect_eq(cfg->dflash.mask_token_id, 39);
  const df_draft_config *set = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_set_bool(cfg, "norm_before_residual", false, &set, &err), &err);
  cr_expect(!set->eagle3.norm_before_residual, "the recipe's override");
  df_draft_config_free(set);
  const df_draft_config *r = NULL;
  DF_ASSERT_OK(df_draft_config_resolve_capture(cfg, 8, NULL, 0, &r, &err), &err);
  json_t *j = NULL;
  DF_ASSERT_OK(df_draft_config_resolved_json(r, 7, &j, &err), &err);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)), "PEagleDraftModel");
  cr_expect_eq(json_integer_value(json_object_get(j, "mask_token_id")), 7, "the run's mask token");
  cr_expect(json_is_true(json_object_get(j, "norm_before_residual")));
  cr_expect_eq(json_integer_value(json_object_get(j, "num_hidden_layers")), 4);
  cr_expect_null(json_object_get(j, "fc_norm"), "an EAGLE 3.1 key PEagleDraftModel does not read");
  json_t *ids = json_object_get(json_object_get(j, "eagle_config"), "eagle_aux_hidden_state_layer_ids");
  cr_expect_eq(json_integer_value(json_array_get(ids, 2)), 2);
  json_decref(j);
  df_draft_config_free(r);
  df_draft_config_free(cfg);
  refused(", \"fc_norm\": true", "fc_norm", DF_ERR_UNSUPPORTED);
  refused(", \"norm_output\": false", "norm_output", DF_ERR_UNSUPPORTED);
  refused(", \"mask_token_id\": 40", "mask_token_id", DF_ERR_INVALID);
  refused(", \"num_hidden_layers\": 0", "num_hidden_layers", DF_ERR_INVALID);
  refused(", \"target_hidden_size\": 64", "target_hidden_size", DF_ERR_UNSUPPORTED);
}
