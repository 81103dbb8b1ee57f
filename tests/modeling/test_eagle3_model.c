// The EAGLE-3 draft (modeling/eagle3_model.h) and its config (modeling/draft_config_eagle3.c): the parameter table in
// SpecForge's order and names, the initial buffers, checkpoints round-tripping the integer buffers, strict loading,
// the decode path against the training-time test (the TTT simulates chain drafting exactly: step i at position p
// is the decode row at p + i given the same tokens), and every refusal of the config parser naming its key.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../common/fixture.h"
#include "modeling/draft_model.h"
#include "modeling/eagle3_model.h"
#include "modeling/strict_load.h"

#define CFG   DF_FIXTURE_DIR "/eagle3_step/eagle3.json"
#define CFG31 DF_FIXTURE_DIR "/eagle3_step/eagle31-fc-norm.json"
#define TMP   "/tmp/df_test_eagle3_model"

static const df_draft_config *config_of(const char *text) {
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), &err);
  return cfg;
}

static const df_draft_config *resolved(const char *path, const int *ids) {
  const df_draft_config *cfg = NULL, *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(path, &cfg, &err), &err);
  DF_ASSERT_OK(df_draft_config_resolve_capture(cfg, 8, ids, ids ? 3 : 0, &r, &err), &err);
  df_draft_config_free(cfg);
  return r;
}

Test(eagle3_model, parameter_table_in_specforge_order) {
  const df_draft_config *cfg = resolved(CFG31, NULL);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  const df_params *p = df_draft_model_params(m);
  const char *names[] = {"midlayer.self_attn.q_proj.weight",
                         "midlayer.self_attn.k_proj.weight",
                         "midlayer.self_attn.v_proj.weight",
                         "midlayer.self_attn.o_proj.weight",
                         "midlayer.mlp.gate_proj.weight",
                         "midlayer.mlp.up_proj.weight",
                         "midlayer.mlp.down_proj.weight",
                         "midlayer.hidden_norm.weight",
                         "midlayer.input_layernorm.weight",
                         "midlayer.post_attention_layernorm.weight",
                         "fc.weight",
                         "fc_norm.0.weight",
                         "fc_norm.1.weight",
                         "fc_norm.2.weight",
                         "norm.weight",
                         "lm_head.weight",
                         "t2d",
                         "d2t"};
  cr_assert_eq(df_params_count(p), 18);
  for (int i = 0; i < 18; i++) cr_expect_str_eq(df_params_at(p, i)->name, names[i]);
  const df_param *q = df_params_find(p, "midlayer.self_attn.q_proj.weight"), *fc = df_params_find(p, "fc.weight");
  cr_expect_eq(q->shape[1], 128, "q reads [input_layernorm(emb) ; hidden_norm(h)]: 2H");
  cr_expect_eq(fc->shape[1], 192, "fc reads three captured layers");
  cr_expect_eq(df_params_find(p, "lm_head.weight")->shape[0], 48, "lm_head over the draft vocabulary");
  const df_param *t2d = df_params_find(p, "t2d"), *d2t = df_params_find(p, "d2t");
  cr_expect_eq(t2d->dtype, DF_BOOL);
  cr_expect_eq(d2t->dtype, DF_I64);
  cr_expect(!t2d->trainable && !d2t->trainable && t2d->role == DF_ROLE_BUFFER);
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(cfg, &total, &active);
  cr_expect_eq(total, df_params_param_numel(p) - t2d->numel - d2t->numel, "the config's count is the trainable part");
  DF_ASSERT_OK(df_draft_model_init(m, 3, &err), &err);
  const float *w = df_draft_model_weights(m);
  for (int64_t i = 0; i < t2d->numel; i++) cr_assert_eq(w[t2d->offset + i], 1.0f, "t2d starts all true");
  for (int64_t i = 0; i < d2t->numel; i++) cr_assert_eq(w[d2t->offset + i], 0.0f, "d2t starts 0");
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(eagle3_model, checkpoints_keep_the_integer_buffers) {
  cr_assert_eq(system("rm -rf " TMP " && mkdir -p " TMP), 0);
  const df_draft_config *cfg = resolved(CFG, NULL);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *a = NULL, *b = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &a, &err), &err);
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &b, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(a, 5, &err), &err);
  df_eagle3_model *e = df_draft_model_eagle3(a);
  cr_assert_not_null(e);
  int64_t d2t[64];
  uint8_t t2d[256] = {0};
  for (int d = 0; d < 64; d++) d2t[d] = 3 * d, t2d[4 * d] = 1; // draft id d is target id 4d
  DF_ASSERT_OK(df_eagle3_vocab_write(e, d2t, t2d, &err), &err);
  const df_params *p = df_draft_model_params(a);
  DF_ASSERT_OK(df_params_save(p, df_draft_model_weights(a), TMP "/model.safetensors", NULL, &err), &err);
  df_st_file *f = NULL;
  DF_ASSERT_OK(df_st_open(TMP "/model.safetensors", &f, &err), &err);
  cr_expect_eq(df_st_find(f, "d2t")->dtype, DF_ST_I64);
  cr_expect_eq(df_st_find(f, "t2d")->dtype, DF_ST_BOOL);
  cr_expect_null(df_st_find(f, "embed_tokens.weight"), "the frozen embedding is the target's");
  df_st_close(f);
  DF_ASSERT_OK(df_draft_model_load(b, TMP "/model.safetensors", &err), &err);
  int64_t back[64];
  uint8_t tb[256];
  DF_ASSERT_OK(df_eagle3_vocab_read(df_draft_model_eagle3(b), back, tb, &err), &err);
  cr_expect_eq(memcmp(back, d2t, sizeof d2t), 0);
  cr_expect_eq(memcmp(tb, t2d, sizeof t2d), 0);
  cr_expect_eq(memcmp(df_draft_model_weights(a), df_draft_model_weights(b), sizeof(float) * (size_t)df_params_numel(p)),
               0);
  // a warm start must carry the mapping (SpecForge's rule): t2d missing is named
  const df_save_options only = {.dtype = DF_ST_F32, .trainable_only = true};
  DF_ASSERT_OK(df_params_save(p, df_draft_model_weights(a), TMP "/no_vocab.safetensors", &only, &err), &err);
  cr_expect_eq(df_draft_model_load(b, TMP "/no_vocab.safetensors", &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "missing parameter 't2d'") != NULL, "%s", err.msg);
  df_draft_model_free(a), df_draft_model_free(b);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- the decode path against the training-time test -------------------------------------------------------------

enum { S = 9, T = 3, H = 64, W = 192, V = 256 };

Test(eagle3_model, decode_rows_equal_the_training_time_test) {
  const df_draft_config *cfg = resolved(CFG31, NULL); // fc_norm too
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *dm = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &dm, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(dm, 11, &err), &err);
  df_eagle3_model *m = df_draft_model_eagle3(dm);
  float *aux = malloc(sizeof(float) * S * W), *embed = malloc(sizeof(float) * V * H);
  df_test_fill_uniform(aux, S * W, 1, -2, 2);
  df_test_fill_uniform(embed, V * H, 2, -1, 1);
  int32_t tok[S + T + 1], ids[T * S], pos[T * S], len[1] = {S};
  for (int i = 0; i < S + T + 1; i++) tok[i] = (int32_t)((i * 37 + 5) % V);
  for (int i = 0; i < T; i++)
    for (int p = 0; p < S; p++) ids[i * S + p] = p + 1 + i < S ? tok[p + 1 + i] : 0, pos[i * S + p] = p + i;
  const df_eagle3_batch b = {
      .B = 1, .S = S, .T = T, .aux = aux, .ids = ids, .pos = pos, .lengths = len, .embed = embed, .vocab = V};
  DF_ASSERT_OK(df_eagle3_begin(m, &b, &err), &err);
  float *out[T], *hout0 = malloc(sizeof(float) * S * H);
  for (int i = 0; i < T; i++) {
    const float *o = NULL;
    DF_ASSERT_OK(df_eagle3_step_forward(m, i, &o, &err), &err);
    out[i] = malloc(sizeof(float) * S * H);
    memcpy(out[i], o, sizeof(float) * S * H);
  }
  // step 0 for every position: one batched decode of the captured rows
  df_eagle3_cache *c = NULL;
  DF_ASSERT_OK(df_eagle3_cache_create(m, S + T, &c, &err), &err);
  const float *h = NULL, *x = NULL;
  DF_ASSERT_OK(df_eagle3_decode(m, c, 0, S, aux, true, ids, embed, V, &h, &x, &err), &err);
  df_expect_close("decode rows = TTT step 0", x, out[0], S * H, 1e-5, 1e-6);
  memcpy(hout0, h, sizeof(float) * S * H);
  // the chain from position p = S − 3: row p + i with the previous row's layer output and step i's token
  const int p = S - 3;
  const float *prev = hout0 + p * H;
  float carry[H];
  for (int i = 1; i < T; i++) {
    memcpy(carry, prev, sizeof carry);
    DF_ASSERT_OK(df_eagle3_decode(m, c, p + i, 1, carry, false, &ids[i * S + p], embed, V, &h, &x, &err), &err);
    char what[64];
    snprintf(what, sizeof what, "chain row %d = TTT step %d at %d", p + i, i, p);
    df_expect_close(what, x, out[i] + p * H, H, 1e-5, 1e-6);
    prev = h;
  }
  df_eagle3_cache_free(c);
  for (int i = 0; i < T; i++) free(out[i]);
  free(aux), free(embed), free(hout0);
  df_draft_model_free(dm);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- the config ---------------------------------------------------------------------------------------------------

#define CORE                                                                                                           \
  "\"architectures\": [\"LlamaForCausalLMEagle3\"], \"hidden_size\": 64, \"intermediate_size\": 128, "                 \
  "\"num_attention_heads\": 4, \"vocab_size\": 256"
#define BASE CORE ", \"num_key_value_heads\": 2, \"draft_vocab_size\": 32"

// The config with extra keys (core: without num_key_value_heads and draft_vocab_size) is refused at where.
static void refused_in(const char *base, const char *extra, const char *where, df_status want) {
  char text[1024];
  snprintf(text, sizeof text, "{%s%s}", base, extra);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  cr_expect_eq(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), want, "%s", extra);
  cr_expect_str_eq(err.where, where, "%s: %s", extra, err.msg);
  cr_expect_null(cfg);
}

static void refused(const char *extra, const char *where, df_status want) { refused_in(BASE, extra, where, want); }

Test(eagle3_config, defaults_and_refusals) {
  const df_draft_config *cfg = config_of("{" BASE "}");
  cr_expect_eq(cfg->kind, DF_DRAFT_EAGLE3);
  cr_expect_eq(cfg->head_dim, 16, "LlamaConfig's hidden_size / heads");
  cr_expect_eq(cfg->eagle3.target_hidden_size, 64);
  cr_expect(!cfg->eagle3.fc_norm && cfg->eagle3.norm_output);
  cr_expect_eq(cfg->dflash.num_target_layer_ids, 0, "capture layers resolved against the target later");
  cr_expect_eq(cfg->max_position_embeddings, 2048);
  df_draft_config_free(cfg);
  cfg = config_of("{\"architectures\": [\"Eagle3LlamaForCausalLM\"], \"hidden_size\": 8, \"intermediate_size\": 8, "
                  "\"num_attention_heads\": 2, \"vocab_size\": 10, \"draft_vocab_size\": 10}");
  cr_expect_eq(cfg->kind, DF_DRAFT_EAGLE3, "vLLM's name for the same layout");
  df_draft_config_free(cfg);
  refused(", \"num_hidden_layers\": 2", "num_hidden_layers", DF_ERR_UNSUPPORTED);
  refused_in(CORE, ", \"draft_vocab_size\": 300", "draft_vocab_size", DF_ERR_INVALID);
  refused_in(CORE, "", "draft_vocab_size", DF_ERR_INVALID); // required: LlamaForCausalLMEagle3 reads it
  refused(", \"target_hidden_size\": 128", "target_hidden_size", DF_ERR_UNSUPPORTED);
  refused(", \"hidden_act\": \"gelu\"", "hidden_act", DF_ERR_UNSUPPORTED);
  refused(", \"mlp_bias\": true", "mlp_bias", DF_ERR_UNSUPPORTED);
  refused(", \"pretraining_tp\": 2", "pretraining_tp", DF_ERR_UNSUPPORTED);
  refused_in(CORE, ", \"draft_vocab_size\": 32, \"num_key_value_heads\": 3", "num_key_value_heads", DF_ERR_INVALID);
  refused(", \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, 2]}",
          "eagle_config.eagle_aux_hidden_state_layer_ids", DF_ERR_INVALID);
  refused(", \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [1, -2, 3]}",
          "eagle_config.eagle_aux_hidden_state_layer_ids[1]", DF_ERR_INVALID);
  refused(", \"eagle_config\": {\"use_aux_hidden_state\": false}", "eagle_config.use_aux_hidden_state",
          DF_ERR_UNSUPPORTED);
  refused(", \"eagle_config\": 3", "eagle_config", DF_ERR_INVALID);
  refused(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling", DF_ERR_UNSUPPORTED);
  char text[256];
  snprintf(text, sizeof text, "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"hidden_size\": 64}");
  const df_draft_config *none = NULL;
  df_error err = {0};
  cr_expect_eq(df_draft_config_from_json(text, strlen(text), "draft", &none, &err), DF_ERR_INVALID);
}

Test(eagle3_config, capture_layers_and_the_serving_config) {
  const df_draft_config *cfg = config_of("{" BASE "}"), *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_resolve_capture(cfg, 32, NULL, 0, &r, &err), &err);
  cr_expect_eq(r->dflash.target_layer_ids[0], 1);
  cr_expect_eq(r->dflash.target_layer_ids[1], 15);
  cr_expect_eq(r->dflash.target_layer_ids[2], 28, "SpecForge's default [1, L/2 - 1, L - 4] for Llama-3.1-8B");
  json_t *served = NULL;
  DF_ASSERT_OK(df_draft_config_resolved_json(r, -1, &served, &err), &err);
  const json_t *ec = json_object_get(served, "eagle_config");
  cr_expect_eq(json_integer_value(json_array_get(json_object_get(ec, "eagle_aux_hidden_state_layer_ids"), 1)), 15);
  cr_expect_eq(json_integer_value(json_array_get(json_object_get(served, "eagle_aux_hidden_state_layer_ids"), 1)), 16,
               "vLLM's before-layer ids");
  cr_expect(json_is_false(json_object_get(served, "tie_word_embeddings")));
  cr_expect(json_is_false(json_object_get(served, "attention_bias")));
  cr_expect_eq(json_integer_value(json_object_get(served, "draft_vocab_size")), 32);
  cr_expect_null(json_object_get(served, "dflash_config"));
  // the served config reads back as the same draft, its layers kept
  char *text = json_dumps(served, 0);
  const df_draft_config *back = config_of(text);
  cr_expect_eq(back->dflash.num_target_layer_ids, 3);
  cr_expect_eq(back->dflash.target_layer_ids[2], 28);
  free(text);
  json_decref(served);
  df_draft_config_free(back);
  df_draft_config_free(r);
  const int ids[3] = {2, 5, 9};
  DF_ASSERT_OK(df_draft_config_resolve_capture(cfg, 32, ids, 3, &r, &err), &err);
  cr_expect_eq(r->dflash.target_layer_ids[2], 9, "the recipe's ids win");
  df_draft_config_free(r);
  cr_expect_eq(df_draft_config_resolve_capture(cfg, 32, ids, 2, &r, &err), DF_ERR_INVALID, "two ids");
  cr_expect_str_eq(err.where, "model.aux_hidden_state_layer_ids");
  const int far[3] = {1, 2, 40};
  cr_expect_eq(df_draft_config_resolve_capture(cfg, 32, far, 3, &r, &err), DF_ERR_INVALID, "layer 40 of 32");
  cr_expect_eq(df_draft_config_resolve_capture(cfg, 3, NULL, 0, &r, &err), DF_ERR_INVALID,
               "the default of a 3-layer target is [1, 0, -1]");
  df_draft_config_free(cfg);
  // a block draft takes no recipe ids: its layers are dflash_config.target_layer_ids
  const df_draft_config *dflash = NULL;
  DF_ASSERT_OK(df_draft_config_from_file(DF_FIXTURE_DIR "/../../configs/tiny-dflash.json", &dflash, &err), &err);
  cr_expect_eq(df_draft_config_resolve_capture(dflash, 32, ids, 3, &r, &err), DF_ERR_INVALID);
  DF_ASSERT_OK(df_draft_config_resolve_capture(dflash, 32, NULL, 0, &r, &err), &err);
  cr_expect_null(r);
  df_draft_config_free(dflash);
}
