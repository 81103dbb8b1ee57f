// Domino strategy: labels, head tokens, corrected slots and decayed weights on hand-built blocks for both label
// alignments (no prefix product); lambda_base against SpecForge's linear_lambda_base on the fixtures' schedules; the
// proposals of the propose hook against SpecForge's _sample_draft_tokens (tests/fixtures/domino_step/generate/, via
// the float64 reference); loss_type refused; the export name; the registry row; strict loading of the head (a
// checkpoint of another width or without the head is refused naming the tensor).
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/domino_head.h"
#include "modeling/draft_model.h"
#include "modeling/safetensors.h"
#include "modeling/target_pieces.h"
#include "strategies/domino/domino.h"
#include "strategies/strategy.h"
#include "tests/common/fixture.h"

#define DOMINO_DIR DF_FIXTURE_DIR "/domino_step"

// ---- labels --------------------------------------------------------------------------------------------------

// S = 10, bs 4. Block A at anchor 2 meets a masked position 5 (and goes on: no prefix product); block B at anchor 7
// runs past S; block C is padding.
Test(domino_labels, shift_label_next_tokens_and_weights) {
  enum { S = 10, BS = 4 };
  int32_t ids[S];
  for (int i = 0; i < S; i++) ids[i] = 100 + i;
  uint8_t mask[S] = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  int32_t anchors[3] = {2, 7, 0};
  uint8_t keep[3] = {1, 1, 0};
  df_dflash_anchors a = {.B = 1, .N = 3, .anchors = anchors, .keep = keep};
  df_domino_labels l;
  df_error err = {0};
  DF_ASSERT_OK(df_domino_build_labels(ids, mask, S, &a, BS, true, 1, 4.0, &l, &err), &err);
  // labels at anchor + k + 1: A 3 4 [5 masked] 6; B 8 9 [10, 11 past S]
  const uint8_t valid[12] = {1, 1, 0, 1, /**/ 1, 1, 0, 0, /**/ 0, 0, 0, 0};
  const int32_t labels[12] = {103, 104, -1, 106, 108, 109, -1, -1, -1, -1, -1, -1};
  const int32_t head[12] = {102, 103, 104, 105, 107, 108, 109, 109, 100, 101, 102, 103};
  double wsum = 0;
  for (int r = 0; r < 12; r++) {
    cr_expect_eq(l.valid[r], valid[r], "valid[%d]", r);
    cr_expect_eq(l.labels[r], labels[r], "labels[%d]", r);
    cr_expect_eq(l.head_ids[r], head[r], "head_ids[%d]", r);
    cr_expect_eq(l.corrected[r], r % BS >= 1, "corrected[%d]", r);
    const float w = valid[r] ? (float)exp(-(double)(r % BS) / 4.0) : 0.0f; // exp(−k/γ) from k = 0
    cr_expect_eq(l.weights[r], w, "weights[%d] = %g, expected %g", r, l.weights[r], w);
    wsum += w;
  }
  cr_expect_float_eq(l.weight_sum, wsum, 1e-12);
  df_domino_labels_free(&l);
  cr_expect_eq(df_domino_build_labels(ids, mask, S, &a, BS, true, BS, 0.0, &l, &err), DF_ERR_INVALID);
  cr_expect_eq(df_domino_build_labels(ids, mask, S, &a, BS, true, 1, NAN, &l, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.loss_decay_gamma");
}

// Without shift_label: DFlash's same-position labels, slot 0 never supervised, DFlash's decay exp(−(k−1)⁺/γ); the
// GRU reads the same tokens (the labels themselves, one slot behind inside the head).
Test(domino_labels, same_position_labels_without_shift) {
  enum { S = 10, BS = 4 };
  int32_t ids[S];
  for (int i = 0; i < S; i++) ids[i] = 100 + i;
  uint8_t mask[S] = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  int32_t anchors[2] = {2, 7};
  uint8_t keep[2] = {1, 1};
  df_dflash_anchors a = {.B = 1, .N = 2, .anchors = anchors, .keep = keep};
  df_domino_labels l;
  df_error err = {0};
  DF_ASSERT_OK(df_domino_build_labels(ids, mask, S, &a, BS, false, 2, 7.0, &l, &err), &err);
  const uint8_t valid[8] = {0, 1, 1, 0, /**/ 0, 1, 1, 0};
  const int32_t labels[8] = {-1, 103, 104, -1, -1, 108, 109, -1};
  const int32_t head[8] = {102, 103, 104, 105, 107, 108, 109, 109};
  for (int r = 0; r < 8; r++) {
    cr_expect_eq(l.valid[r], valid[r], "valid[%d]", r);
    cr_expect_eq(l.labels[r], labels[r], "labels[%d]", r);
    cr_expect_eq(l.head_ids[r], head[r], "head_ids[%d]", r);
    cr_expect_eq(l.corrected[r], r % BS >= 2, "corrected[%d]", r);
    const int k = r % BS;
    const float w = valid[r] ? (float)exp(-(double)(k > 1 ? k - 1 : 0) / 7.0) : 0.0f;
    cr_expect_eq(l.weights[r], w, "weights[%d]", r);
  }
  df_domino_labels_free(&l);
}

// ---- λ ---------------------------------------------------------------------------------------------------------

Test(domino_lambda, linear_lambda_base) {
  cr_expect_float_eq(df_domino_lambda(63, 200, 1.0, 0.5), 0.37, 1e-15); // shift_lambda037_decay
  cr_expect_float_eq(df_domino_lambda(10, 80, 0.8, 0.25), 0.4, 1e-15);  // noshift_horizon_from_data
  cr_expect_float_eq(df_domino_lambda(7, 40, 1.0, 0.5), 0.65, 1e-15);   // shift_full_block6
  cr_expect_eq(df_domino_lambda(0, 100, 1.0, 0.5), 1.0);
  cr_expect_eq(df_domino_lambda(150, 100, 1.0, 0.5), 0.0); // past the decay
  cr_expect_eq(df_domino_lambda(0, 0, 1.0, 0.5), 0.0);     // no horizon
  cr_expect_eq(df_domino_lambda(0, 10, 3.0, 0.5), 1.0);    // clamped
  cr_expect_eq(df_domino_lambda(1, 10, 1.0, 0.0), 0.0);    // decay over max(1, 0) = 1 step
  cr_expect_eq(df_domino_lambda(0, 10, 1.0, 0.0), 1.0);
}

// ---- proposals ---------------------------------------------------------------------------------------------------

static int64_t json_int_at(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

// SpecForge's greedy Domino proposals (and, for contrast, the base-only argmax) of generate/cases.json, from the
// draft's forward over [first token, MASK × (bs − 1)] on the recorded context.
static void check_proposal_case(const json_t *c) {
  df_error err = {0};
  const char *name = json_string_value(json_object_get(c, "name"));
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", DF_SOURCE_DIR, json_string_value(json_object_get(c, "draft_model_config")));
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(p, &cfg, &err), &err);
  cr_assert_eq(cfg->kind, DF_DRAFT_DOMINO);
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  snprintf(p, sizeof p, "%s/%s", DF_SOURCE_DIR, json_string_value(json_object_get(c, "draft_checkpoint_path")));
  DF_ASSERT_OK(df_draft_model_load(m, p, &err), &err);
  snprintf(p, sizeof p, "%s/%s", DF_SOURCE_DIR, json_string_value(json_object_get(c, "target_model_path")));
  df_target_pieces tp;
  DF_ASSERT_OK(df_target_pieces_load(p, NULL, &tp, &err), &err);
  fx_file *f = fx_load("domino_step/generate/context.safetensors");
  char key[128];
  snprintf(key, sizeof key, "%s.context", name);
  const df_tensor ctxv = fx_view(f, key);
  const int64_t P = json_int_at(c, "context_length"), bs = cfg->block_size, H = cfg->hidden_size;
  const int32_t first = (int32_t)json_int_at(c, "first_token"), mask = (int32_t)cfg->dflash.mask_token_id;
  float *emb = malloc(sizeof(float) * (size_t)(bs * H));
  for (int64_t k = 0; k < bs; k++) memcpy(emb + k * H, tp.embed + (k ? mask : first) * H, sizeof(float) * (size_t)H);
  // as eval --spec-decode lays it out: S = P + 1 context rows, the last one (the anchor's own, masked) zero
  const int64_t KH = cfg->dflash.num_target_layer_ids * H;
  float *feats = calloc((size_t)((P + 1) * KH), sizeof(float));
  memcpy(feats, ctxv.data, sizeof(float) * (size_t)(P * KH));
  int32_t anchor = (int32_t)P;
  uint8_t keep = 1;
  const df_draft_batch b = {
      .B = 1, .S = P + 1, .N = 1, .target_hidden = feats, .block_embed = emb, .anchors = &anchor, .keep = &keep};
  const float *hidden;
  DF_ASSERT_OK(df_draft_model_forward(m, &b, &hidden, &err), &err);
  snprintf(key, sizeof key, "%s.draft_hidden", name);
  const df_tensor want_h = fx_view(f, key);
  df_expect_close("draft hidden", hidden, want_h.data, bs * H, 1e-4, 1e-5);
  const df_strategy_env env = {.ctx = ctx,
                               .model = m,
                               .cfg = cfg,
                               .frozen = {.embed = tp.embed, .lm_head = tp.lm_head, .vocab = tp.vocab, .hidden = H},
                               .mask_token_id = mask,
                               .num_anchors = 1,
                               .eval = true};
  const df_strategy *s = df_strategy_of(cfg);
  cr_assert_not_null(s);
  cr_expect_str_eq(s->name, "domino");
  df_strategy_run *run;
  DF_ASSERT_OK(df_strategy_open(s, &env, &run, &err), &err);
  cr_assert_eq(s->proposals(run), bs - 1);
  int32_t props[64];
  const df_propose_in in = {
      .hidden = hidden, .anchor_token = first, .lm_head = df_f32((float *)tp.lm_head, tp.vocab, H)};
  DF_ASSERT_OK(s->propose(run, &in, props, &err), &err);
  const json_t *want = json_object_get(c, "proposal");
  for (int64_t k = 0; k < bs - 1; k++)
    cr_expect_eq(props[k], json_integer_value(json_array_get(want, (size_t)k)), "%s: proposal %lld = %d, expected %lld",
                 name, (long long)k, props[k], (long long)json_integer_value(json_array_get(want, (size_t)k)));
  df_strategy_close(run);
  fx_free(f);
  free(emb), free(feats);
  df_target_pieces_free(&tp);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(domino_propose, matches_specforge_sample_draft_tokens) {
  json_error_t je;
  json_t *cases = json_load_file(DOMINO_DIR "/generate/cases.json", 0, &je);
  cr_assert_not_null(cases, "%s", je.text);
  cr_assert_geq(json_array_size(cases), 2);
  for (size_t i = 0; i < json_array_size(cases); i++) check_proposal_case(json_array_get(cases, i));
  json_decref(cases);
}

// ---- table -------------------------------------------------------------------------------------------------------

Test(domino_strategy, registry_row_export_name_and_loss_type) {
  const df_strategy *s = df_strategy_find("domino");
  cr_assert_not_null(s);
  cr_expect_eq(df_strategy_for_projector("domino"), s);
  cr_expect_str_eq(s->keys[0], "lambda_base_start");
  cr_expect_str_eq(s->keys[1], "lambda_base_decay_ratio");
  cr_expect_null(s->keys[2]);
  // SpecForge's normaliser: DFlashDraftModel, projector_type kept, auto_map gone
  json_t *c = json_pack("{s:[s], s:{s:s}, s:{s:s, s:i}}", "architectures", "DominoDraftModel", "auto_map", "AutoModel",
                        "domino.DominoDraftModel", "dflash_config", "projector_type", "domino", "emb_dim", 16);
  df_error err = {0};
  DF_ASSERT_OK(s->export_normalize(c, "config.json", &err), &err);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "DFlashDraftModel");
  cr_expect_null(json_object_get(c, "auto_map"));
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(c, "dflash_config"), "projector_type")), "domino");
  json_decref(c);
  json_t *nodc = json_pack("{s:[s]}", "architectures", "DominoDraftModel");
  cr_expect_eq(s->export_normalize(nodc, "config.json", &err), DF_ERR_INVALID);
  json_decref(nodc);

  // a Domino run refuses training.loss_type other than dflash (SpecForge would ignore it)
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(DOMINO_DIR "/domino-shift.json", &cfg, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  static float table[256 * 64];
  const df_strategy_value dpace[] = {{.key = "loss_type", .text = "dpace"}};
  const df_strategy_value_list l = {.v = dpace, .n = 1};
  const df_strategy_values vals = df_strategy_values_of_list(&l);
  df_strategy_env env = {.ctx = ctx,
                         .model = m,
                         .cfg = cfg,
                         .frozen = {.embed = table, .lm_head = table, .vocab = 256, .hidden = 64},
                         .mask_token_id = 255,
                         .num_anchors = 4,
                         .values = &vals};
  df_strategy_run *run = NULL;
  cr_expect_eq(df_strategy_open(s, &env, &run, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "training.loss_type");
  cr_expect_null(run);
  env.values = NULL;
  DF_ASSERT_OK(df_strategy_open(s, &env, &run, &err), &err);
  cr_expect_eq(s->first_position(run), 0); // shift_label: slot 0 is supervised
  df_strategy_close(run);
  // a DFlash strategy does not train it
  cr_expect_eq(df_strategy_open(df_strategy_find("dflash"), &env, &run, &err), DF_ERR_INVALID);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- strict loading of the head ------------------------------------------------------------------------------------

Test(domino_strategy, a_checkpoint_of_another_head_is_refused_naming_the_tensor) {
  df_error err = {0};
  json_t *c = json_load_file(DOMINO_DIR "/domino-shift.json", 0, NULL);
  cr_assert_not_null(c);
  json_object_set_new(json_object_get(c, "dflash_config"), "gru_hidden_dim", json_integer(32)); // the ckpt has 24
  char *text = json_dumps(c, JSON_COMPACT);
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "g32.json", &cfg, &err), &err);
  free(text), json_decref(c);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  cr_expect_neq(df_draft_model_load(m, DOMINO_DIR "/ckpt_shift", &err), DF_OK);
  cr_expect(strstr(err.where, "prefix_gru.") || strstr(err.msg, "prefix_gru."), "%s [%s]", err.msg, err.where);
  df_draft_model_free(m);
  df_draft_config_free(cfg);
  // a DFlash draft's checkpoint has no head: a Domino draft refuses it
  DF_ASSERT_OK(df_draft_config_from_file(DOMINO_DIR "/domino-shift.json", &cfg, &err), &err);
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  cr_expect_neq(df_draft_model_load(m, DF_FIXTURE_DIR "/dflash_step/draft_ckpt", &err), DF_OK);
  df_draft_model_free(m);
  df_draft_config_free(cfg);
  df_ctx_destroy(ctx);
}
