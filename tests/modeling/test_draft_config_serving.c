// df_draft_config_resolved_json: the draft config with every key SGLang 0.5.23 reads written out as draftforge
// resolved it (modeling/draft_config_serving.c), its conflicts refused naming the key, and the document
// parsing back into the same draft.
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "tests/common/fixture.h"
#include "tests/common/json_edit.h"

static const df_draft_config *build(json_t *doc) {
  char *text = json_dumps(doc, JSON_COMPACT);
  cr_assert_not_null(text);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "draft.json", &cfg, &err), &err);
  free(text);
  return cfg;
}

static json_t *resolved(const df_draft_config *cfg, int64_t mask) {
  json_t *out = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_resolved_json(cfg, mask, &out, &err), &err);
  return out;
}

static json_int_t geti(json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

Test(draft_serving, dflash_without_mask_or_layers_gets_the_resolved_ones) {
  json_t *doc = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(doc, "dflash_config.mask_token_id", NULL);
  df_test_json_set(doc, "dflash_config.target_layer_ids", NULL);
  df_test_json_set(doc, "head_dim", NULL); // Qwen3Config's default, 128: written out
  const df_draft_config *cfg = build(doc);
  json_t *r = resolved(cfg, 7);
  json_t *dc = json_object_get(r, "dflash_config");
  cr_expect_eq(geti(dc, "mask_token_id"), 7);
  json_t *ids = json_object_get(dc, "target_layer_ids");
  cr_assert_eq(json_array_size(ids), (size_t)cfg->dflash.num_target_layer_ids);
  for (int i = 0; i < cfg->dflash.num_target_layer_ids; i++)
    cr_expect_eq(json_integer_value(json_array_get(ids, (size_t)i)), cfg->dflash.target_layer_ids[i]);
  cr_expect_eq(geti(r, "block_size"), cfg->block_size);
  cr_expect_eq(geti(r, "head_dim"), 128);
  cr_expect_eq(json_array_size(json_object_get(r, "layer_types")), (size_t)cfg->num_hidden_layers);
  cr_expect_null(json_object_get(r, "markov_rank"), "no DSpark keys on a DFlash draft");
  // the default rotation, three ways
  cr_expect(json_is_null(json_object_get(r, "rope_scaling")));
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r, "rope_parameters"), "rope_type")), "default");
  cr_expect_eq(json_number_value(json_object_get(json_object_get(r, "rope_parameters"), "rope_theta")),
               cfg->rope.theta);
  cr_expect_eq(json_number_value(json_object_get(r, "rope_theta")), cfg->rope.theta);
  // it parses back into the same draft
  const df_draft_config *back = build(r);
  cr_expect_eq(back->dflash.mask_token_id, 7);
  cr_expect_eq(back->head_dim, cfg->head_dim);
  cr_expect_eq(back->rope.theta, cfg->rope.theta);
  df_draft_config_free(back), df_draft_config_free(cfg);
  json_decref(r), json_decref(doc);
}

Test(draft_serving, dspark_head_keys_are_written_at_both_levels_with_sglangs_needs) {
  json_t *doc = df_test_config_doc("tiny-dspark.json");
  df_test_json_set(doc, "dflash_config.confidence_head_with_markov", NULL); // SpecForge: false; SGLang: rank > 0
  df_test_json_set(doc, "dflash_config.markov_head_type", NULL);            // draftforge's default, vanilla
  const df_draft_config *cfg = build(doc);
  json_t *r = resolved(cfg, -1);
  json_t *dc = json_object_get(r, "dflash_config");
  static const char *const keys[] = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                     "confidence_head_with_markov"};
  for (int i = 0; i < 4; i++) {
    cr_assert_not_null(json_object_get(r, keys[i]), "%s at the top level", keys[i]);
    cr_expect(json_equal(json_object_get(r, keys[i]), json_object_get(dc, keys[i])), "%s", keys[i]);
  }
  cr_expect(json_is_false(json_object_get(r, "confidence_head_with_markov")));
  cr_expect_str_eq(json_string_value(json_object_get(r, "markov_head_type")), "vanilla");
  cr_expect_eq(geti(dc, "mask_token_id"), 255, "mask -1 keeps the config's own");
  df_draft_config_free(cfg);
  json_decref(r), json_decref(doc);
}

// Domino: the head's four keys resolved into dflash_config (defaults written out), the top-level copy of emb_dim
// following, projector_type domino; the document reads back as the same Domino draft, also under SpecForge's export
// name DFlashDraftModel.
Test(draft_serving, domino_head_keys_are_resolved_into_dflash_config) {
  json_t *doc = df_test_config_doc("tiny-domino.json");
  df_test_json_set(doc, "dflash_config.pure_draft_prefix_len", NULL);
  df_test_json_set(doc, "dflash_config.shift_label", NULL);
  df_test_json_set(doc, "dflash_config.projector_type", NULL);
  const df_draft_config *cfg = build(doc);
  json_t *r = resolved(cfg, 255);
  json_t *dc = json_object_get(r, "dflash_config");
  cr_expect_eq(geti(dc, "emb_dim"), 16);
  cr_expect_eq(geti(dc, "gru_hidden_dim"), 24);
  cr_expect_eq(geti(dc, "pure_draft_prefix_len"), 0);
  cr_expect(json_is_false(json_object_get(dc, "shift_label")));
  cr_expect_str_eq(json_string_value(json_object_get(dc, "projector_type")), "domino");
  cr_expect_eq(geti(r, "emb_dim"), 16);
  cr_expect_null(json_object_get(r, "gru_hidden_dim"), "only copies that exist are rewritten");
  json_object_set_new(r, "architectures", json_pack("[s]", "DFlashDraftModel"));
  const df_draft_config *back = build(r);
  cr_expect_eq(back->kind, DF_DRAFT_DOMINO);
  cr_expect_eq(back->dflash.gru_hidden_dim, 24);
  cr_expect_not(back->dflash.shift_label);
  df_draft_config_free(back), df_draft_config_free(cfg);
  json_decref(r), json_decref(doc);
}

Test(draft_serving, yarn_in_rope_parameters_is_mirrored_into_rope_scaling) {
  json_t *doc = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(doc, "rope_scaling", NULL);
  df_test_json_set(doc, "rope_theta", NULL);
  df_test_json_set(doc, "rope_parameters",
                   df_test_json("{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": "
                                "1024, \"rope_theta\": 500000.0}"));
  const df_draft_config *cfg = build(doc);
  json_t *r = resolved(cfg, -1);
  json_t *sc = json_object_get(r, "rope_scaling"), *pa = json_object_get(r, "rope_parameters");
  cr_assert(json_is_object(sc));
  cr_expect_str_eq(json_string_value(json_object_get(sc, "rope_type")), "yarn");
  cr_expect_eq(json_number_value(json_object_get(sc, "factor")), 4.0);
  cr_expect_eq(geti(sc, "original_max_position_embeddings"), 1024);
  cr_expect_null(json_object_get(sc, "rope_theta"), "transformers 4 keeps rope_theta at the top level");
  cr_expect_eq(json_number_value(json_object_get(pa, "rope_theta")), 500000.0);
  cr_expect_eq(json_number_value(json_object_get(r, "rope_theta")), 500000.0);
  const df_draft_config *back = build(r);
  cr_expect_eq(back->rope.type, DF_ROPE_YARN);
  cr_expect_eq(back->rope.factor, 4.0);
  df_draft_config_free(back), df_draft_config_free(cfg);
  json_decref(r), json_decref(doc);
}

Test(draft_serving, mask_copies_elsewhere_follow_and_conflicts_are_refused) {
  json_t *doc = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(doc, "mask_token_id", json_integer(3)); // a top-level copy SGLang falls back to
  df_test_json_set(doc, "dspark_config.mask_token_id", json_integer(4));
  const df_draft_config *cfg = build(doc);
  json_t *r = resolved(cfg, 9);
  cr_expect_eq(geti(r, "mask_token_id"), 9);
  cr_expect_eq(geti(json_object_get(r, "dspark_config"), "mask_token_id"), 9);
  cr_expect_eq(geti(json_object_get(r, "dflash_config"), "mask_token_id"), 9);
  json_decref(r);
  json_t *out = NULL;
  df_error err = {0};
  cr_expect_eq(df_draft_config_resolved_json(cfg, cfg->vocab_size, &out, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "mask_token_id");
  df_draft_config_free(cfg);
  // a dflash_config block_size SGLang would read first, disagreeing with the top-level one draftforge trains
  df_test_json_set(doc, "dflash_config.block_size", json_integer(8));
  cfg = build(doc);
  cr_expect_eq(df_draft_config_resolved_json(cfg, -1, &out, &err), DF_ERR_INVALID);
  cr_expect_null(out);
  cr_expect_str_eq(err.where, "dflash_config");
  cr_expect(strstr(err.msg, "dflash_config.block_size disagrees with the top-level block_size"), "%s", err.msg);
  df_draft_config_free(cfg);
  json_decref(doc);
}

Test(draft_serving, an_moe_draft_names_its_moe_serving_class) {
  json_t *doc = df_test_config_doc("tiny-dflash-moe.json");
  const df_draft_config *cfg = build(doc);
  cr_assert_not_null(cfg->moe);
  json_t *r = resolved(cfg, -1);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(r, "architectures"), 0)), "DFlashMoEDraftModel");
  const df_draft_config *back = build(r);
  cr_expect(back->moe && back->kind == DF_DRAFT_DFLASH, "read back as the DFlash MoE draft it is");
  df_draft_config_free(back), df_draft_config_free(cfg);
  json_decref(r), json_decref(doc);
}

// Keys SGLang reads that select another computation (Gemma norms, GPT-J rotary pairs, grouped convolutions, V
// scaling, attention sinks, quantized weights; DSpark: no anchor sampling) are refused naming the key; their
// values that change nothing pass.
Test(draft_serving, keys_that_make_sglang_serve_another_model_are_refused_naming_them) {
  static const struct {
    const char *cfg, *path, *bad, *fine;
  } cases[] = {
      {"tiny-dflash.json", "use_gemma_norm", "true", "false"},
      {"tiny-dflash.json", "rope_is_neox_style", "false", "true"},
      {"tiny-dflash.json", "is_neox_style", "null", "true"},
      {"tiny-dflash.json", "quantization_config", "{\"quant_method\": \"fp8\"}", "null"},
      {"tiny-dflash.json", "dflash_config.conv_kernel_size", "3", "0"},
      {"tiny-dflash.json", "dflash_config.conv_group_size", "2", "null"},
      {"tiny-dflash.json", "dflash_config.attention_value_scale", "0.5", "1.0"},
      {"tiny-dflash.json", "dflash_config.attention_sink_bias", "true", "false"},
      {"tiny-dspark.json", "sample_from_anchor", "false", "true"},
      {"tiny-dspark.json", "use_gemma_norm", "1", "null"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    json_t *doc = df_test_config_doc(cases[i].cfg);
    df_test_json_set(doc, cases[i].path, df_test_json(cases[i].bad));
    const df_draft_config *cfg = build(doc);
    json_t *out = NULL;
    df_error err = {0};
    cr_expect_eq(df_draft_config_resolved_json(cfg, -1, &out, &err), DF_ERR_UNSUPPORTED, "%s = %s", cases[i].path,
                 cases[i].bad);
    cr_expect_null(out);
    cr_expect_str_eq(err.where, cases[i].path);
    cr_expect(strstr(err.msg, cases[i].path) && strstr(err.msg, "SGLang 0.5.23 serve"), "%s", err.msg);
    cr_expect(err.hint[0]);
    df_draft_config_free(cfg);
    df_test_json_set(doc, cases[i].path, df_test_json(cases[i].fine));
    cfg = build(doc);
    json_decref(resolved(cfg, -1));
    df_draft_config_free(cfg);
    json_decref(doc);
  }
  // sample_from_anchor is DSpark's: SGLang's DFlash never reads it
  json_t *doc = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(doc, "sample_from_anchor", json_false());
  const df_draft_config *cfg = build(doc);
  json_decref(resolved(cfg, -1));
  df_draft_config_free(cfg);
  json_decref(doc);
}
