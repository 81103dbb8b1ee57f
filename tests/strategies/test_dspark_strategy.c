// DSpark strategy: labels, prefix validity, previous tokens and decayed weights on hand-built blocks; the heads'
// parameter table; the objective's gradients (backbone hidden states and every head type's parameters) against
// finite differences; chunked = one pass; the teacher requirement; metric sums on a hand-checked case; the export
// config normalization.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "modeling/dspark_heads.h"
#include "strategies/dspark/dspark.h"
#include "tests/common/fixture.h"

// ---- labels --------------------------------------------------------------------------------------------------

// S = 10; block A at anchor 2 meets a masked label at position 5 and stops; block B at anchor 7 runs past S;
// block C is padding.
Test(dspark_labels, prefix_validity_prev_tokens_and_weights) {
  enum { S = 10, BS = 4 };
  int32_t ids[S];
  for (int i = 0; i < S; i++) ids[i] = 100 + i;
  uint8_t mask[S] = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  int32_t anchors[3] = {2, 7, 0};
  uint8_t keep[3] = {1, 1, 0};
  df_dflash_anchors a = {.B = 1, .N = 3, .anchors = anchors, .keep = keep};
  df_dspark_labels l;
  df_error err = {0};
  DF_ASSERT_OK(df_dspark_build_labels(ids, mask, S, &a, BS, 4.0, &l, &err), &err);
  const uint8_t valid[12] = {1, 1, 0, 0, /**/ 1, 1, 0, 0, /**/ 0, 0, 0, 0};
  const int32_t labels[12] = {103, 104, -1, -1, 108, 109, -1, -1, -1, -1, -1, -1};
  const int32_t prev[12] = {102, 103, 104, 105, 107, 108, 109, 109, 100, 100, 100, 100};
  const int32_t tpos[12] = {2, 3, -1, -1, 7, 8, -1, -1, -1, -1, -1, -1};
  for (int r = 0; r < 12; r++) {
    cr_expect_eq(l.valid[r], valid[r], "valid[%d]", r);
    cr_expect_eq(l.labels[r], labels[r], "labels[%d]", r);
    cr_expect_eq(l.prev[r], prev[r], "prev[%d]", r);
    cr_expect_eq(l.teacher_pos[r], tpos[r], "teacher_pos[%d]", r);
    float w = valid[r] ? (float)exp(-(double)(r % BS) / 4.0) : 0.0f; // exp(−k/γ) from k = 0
    cr_expect_eq(l.weights[r], w, "weights[%d] = %g, expected %g", r, l.weights[r], w);
  }
  df_dspark_labels_free(&l);
  DF_ASSERT_OK(df_dspark_build_labels(ids, mask, S, &a, BS, 0.0, &l, &err), &err);
  cr_expect_eq(l.weights[1], 1.0f, "no decay without gamma");
  df_dspark_labels_free(&l);
  cr_expect_eq(df_dspark_build_labels(ids, mask, S, &a, BS, -1.0, &l, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.loss_decay_gamma");
}

// ---- a tiny DSpark draft's heads -----------------------------------------------------------------------------

enum { V = 32, H = 64, RK = 8, B = 2, S = 14, N = 3, BS = 4, R = B * N * BS };

typedef struct {
  const df_draft_config *cfg;
  df_params *p;
  float *w, *g;
  df_dspark_heads *heads;
  df_ctx *ctx;
  int32_t ids[B * S];
  uint8_t mask[B * S];
  int32_t anchors[B * N];
  uint8_t keep[B * N];
  df_dflash_anchors a;
  df_dspark_labels lab;
  float hidden[R * H], head[V * H], last[B * S * H], dhidden[R * H];
} rig;

// configs/tiny-dspark.json with a small vocabulary and the given head keys.
static const df_draft_config *tiny_config(const char *type, int64_t rank, bool conf, bool conf_markov) {
  json_t *j = json_load_file(DF_SOURCE_DIR "/configs/tiny-dspark.json", 0, NULL);
  cr_assert_not_null(j);
  json_object_set_new(j, "vocab_size", json_integer(V));
  json_object_set_new(j, "eos_token_id", json_integer(V - 2));
  json_t *dc = json_object_get(j, "dflash_config");
  json_object_set_new(dc, "mask_token_id", json_integer(V - 1));
  json_object_set_new(dc, "markov_rank", json_integer(rank));
  json_object_set_new(dc, "markov_head_type", json_string(type));
  json_object_set_new(dc, "enable_confidence_head", json_boolean(conf));
  json_object_set_new(dc, "confidence_head_with_markov", json_boolean(conf_markov));
  char *text = json_dumps(j, 0);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "tiny", &cfg, &err), &err);
  free(text);
  json_decref(j);
  return cfg;
}

static void rig_init(rig *t, const char *type, int64_t rank, bool conf, bool conf_markov) {
  memset(t, 0, sizeof *t);
  df_error err = {0};
  t->cfg = tiny_config(type, rank, conf, conf_markov);
  DF_ASSERT_OK(df_params_new(&t->p, &err), &err);
  DF_ASSERT_OK(df_dspark_heads_add_params(t->cfg, t->p, &err), &err);
  DF_ASSERT_OK(df_params_finalize(t->p, &err), &err);
  int64_t n = df_params_numel(t->p);
  t->w = calloc((size_t)n + 1, sizeof(float)), t->g = calloc((size_t)n + 1, sizeof(float));
  df_test_fill_uniform(t->w, n, 7, -0.6f, 0.6f); // large enough that every head matters
  t->ctx = df_test_cpu_ctx(2);
  DF_ASSERT_OK(df_dspark_heads_create(t->cfg, t->ctx, t->p, t->w, t->g, &t->heads, &err), &err);
  df_test_fill_uniform(t->hidden, R * H, 8, -1.5f, 1.5f);
  df_test_fill_uniform(t->head, V * H, 9, -0.3f, 0.3f);
  df_test_fill_uniform(t->last, B * S * H, 10, -1.5f, 1.5f);
  for (int i = 0; i < B * S; i++) t->ids[i] = (i * 7 + 3) % (V - 1), t->mask[i] = (i % S) >= 2 && (i % S) != 9;
  const int32_t anc[B * N] = {2, 5, 10, 3, 11, 0};
  const uint8_t kp[B * N] = {1, 1, 1, 1, 1, 0};
  memcpy(t->anchors, anc, sizeof anc), memcpy(t->keep, kp, sizeof kp);
  t->a = (df_dflash_anchors){.B = B, .N = N, .anchors = t->anchors, .keep = t->keep};
  DF_ASSERT_OK(df_dspark_build_labels(t->ids, t->mask, S, &t->a, BS, 3.0, &t->lab, &err), &err);
}

static void rig_free(rig *t) {
  df_dspark_labels_free(&t->lab);
  df_dspark_heads_free(t->heads);
  df_ctx_destroy(t->ctx);
  df_params_free(t->p);
  free(t->w), free(t->g);
  df_draft_config_free(t->cfg);
}

static df_status objective(rig *t, const df_dspark_loss_options *o, float *dh, df_dspark_metrics *m, df_error *err) {
  df_tensor h = df_f32(t->hidden, R, H), head = df_f32(t->head, V, H);
  return df_dspark_objective(t->ctx, o, t->heads, &h, &head, t->last, S, &t->lab, &t->a, dh, m, err);
}

typedef struct {
  rig *t;
  df_dspark_loss_options o;
} probe;

static double probe_loss(void *ctx) {
  probe *p = ctx;
  df_dspark_metrics m;
  df_error err = {0};
  cr_assert_eq(objective(p->t, &p->o, NULL, &m, &err), DF_OK, "%s", err.msg);
  double v = m.loss_num / m.loss_den;
  df_dspark_metrics_free(&m);
  return v;
}

// The heads' parameters after the table order of modeling/dspark_heads.h, with their shapes.
Test(dspark_heads, parameter_table) {
  rig t;
  rig_init(&t, "rnn", RK, true, false);
  const char *names[] = {"markov_head.markov_w1.weight",  "markov_head.markov_w2.weight",
                         "markov_head.joint_proj.weight", "markov_head.joint_proj.bias",
                         "confidence_head.proj.weight",   "confidence_head.proj.bias"};
  const int64_t d0[] = {V, V, 3 * RK, 3 * RK, 1, 1}, d1[] = {RK, RK, 2 * RK + H, 0, H, 0};
  cr_assert_eq(df_params_count(t.p), 6);
  for (int i = 0; i < 6; i++) {
    const df_param *e = df_params_at(t.p, i);
    cr_expect_str_eq(e->name, names[i]);
    cr_expect_eq(e->shape[0], d0[i], "%s dim 0", names[i]);
    if (d1[i]) cr_expect_eq(e->shape[1], d1[i], "%s dim 1", names[i]);
  }
  rig_free(&t);
  rig_init(&t, "gated", RK, true, true);
  cr_expect_not_null(df_params_find(t.p, "markov_head.gate_proj.weight"));
  cr_expect_eq(df_params_find(t.p, "markov_head.gate_proj.weight")->shape[1], H + RK);
  cr_expect_eq(df_params_find(t.p, "confidence_head.proj.weight")->shape[1], H + RK);
  int n = 0;
  const df_rename *rn = df_dspark_heads_legacy_renames(&n);
  cr_expect_eq(n, 2);
  cr_expect_str_eq(rn[0].from, "logit_head.markov_head.");
  cr_expect_str_eq(rn[0].to, "markov_head.");
  rig_free(&t);
}

// Finite differences of loss_num / loss_den in every input the gradient reaches. The BCE target is detached
// (SpecForge), so the Markov and backbone checks run without the BCE term (α_conf = 0) and the confidence
// head's own weights, which the target does not depend on, with it. fp32 forward: h = 1e−2, tolerance 2e−3 of
// max|g| + 2e−4 (wrong indices or signs are O(max|g|)).
static void fd_check(const char *type, int64_t rank, bool conf, bool conf_markov) {
  rig t;
  rig_init(&t, type, rank, conf, conf_markov);
  probe pr = {&t, {.ce_alpha = 0.3, .l1_alpha = 0.7, .conf_alpha = 0.0, .chunk_blocks = 2}};
  df_dspark_metrics m;
  df_error err = {0};
  for (int pass = 0; pass < 2; pass++) {
    pr.o.conf_alpha = pass ? 1.5 : 0.0;
    if (pass && !conf) break;
    memset(t.g, 0, sizeof(float) * (size_t)df_params_numel(t.p));
    DF_ASSERT_OK(objective(&t, &pr.o, t.dhidden, &m, &err), &err);
    df_dspark_metrics_free(&m);
    for (int i = 0; i < df_params_count(t.p); i++) {
      const df_param *e = df_params_at(t.p, i);
      bool conf_param = strncmp(e->name, "confidence_head.", 16) == 0;
      if (conf_param != (pass == 1)) continue;
      df_fd_check(e->name, t.w + e->offset, t.g + e->offset, e->numel, probe_loss, &pr, 3e-3, 2e-3, 2e-4, 40);
    }
    if (pass == 0) df_fd_check("hidden", t.hidden, t.dhidden, R * H, probe_loss, &pr, 1e-2, 2e-3, 2e-4, 60);
  }
  rig_free(&t);
}

Test(dspark_objective, vanilla_gradients_match_finite_differences) { fd_check("vanilla", RK, true, true); }
Test(dspark_objective, gated_gradients_match_finite_differences) { fd_check("gated", RK, true, true); }
Test(dspark_objective, rnn_gradients_match_finite_differences) { fd_check("rnn", RK, true, false); }
Test(dspark_objective, confidence_only_gradients_match_finite_differences) { fd_check("vanilla", 0, true, false); }

// Chunking changes nothing but rounding: metrics equal, gradients within fp32 rounding.
Test(dspark_objective, chunked_equals_one_pass) {
  rig t;
  rig_init(&t, "rnn", RK, true, true);
  int64_t n = df_params_numel(t.p);
  float *g0 = malloc(sizeof(float) * (size_t)n), *dh0 = malloc(sizeof t.dhidden);
  df_dspark_metrics m0, m;
  df_error err = {0};
  df_dspark_loss_options o = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0, .chunk_blocks = 0};
  DF_ASSERT_OK(objective(&t, &o, t.dhidden, &m0, &err), &err);
  memcpy(g0, t.g, sizeof(float) * (size_t)n), memcpy(dh0, t.dhidden, sizeof t.dhidden);
  for (int64_t c = 1; c <= 4; c++) {
    memset(t.g, 0, sizeof(float) * (size_t)n);
    o.chunk_blocks = c;
    DF_ASSERT_OK(objective(&t, &o, t.dhidden, &m, &err), &err);
    cr_expect_eq(m.loss_num, m0.loss_num, "per-row values are chunk-invariant, so the sums are too (chunk %lld)",
                 (long long)c);
    cr_expect_eq(m.tau_num, m0.tau_num);
    cr_expect_eq(m.acc_num, m0.acc_num);
    cr_expect(!memcmp(dh0, t.dhidden, sizeof t.dhidden), "dhidden bitwise (chunk %lld)", (long long)c);
    df_expect_close("head grads", t.g, g0, n, 1e-6, 1e-9);
    df_dspark_metrics_free(&m);
  }
  df_dspark_metrics_free(&m0);
  free(g0), free(dh0);
  rig_free(&t);
}

// The sums against the rows the fused op produced, recomputed here: loss_num, tau, greedy acceptance.
Test(dspark_objective, metric_sums) {
  rig t;
  rig_init(&t, "vanilla", RK, true, true);
  df_dspark_metrics m;
  df_error err = {0};
  df_dspark_loss_options o = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0};
  DF_ASSERT_OK(objective(&t, &o, NULL, &m, &err), &err);
  cr_expect(m.has_teacher && m.has_confidence);
  cr_expect_eq(m.num_blocks, 5);
  double den = 0, valid = 0;
  int blocks_with_valid = 0;
  for (int i = 0; i < B * N; i++) {
    bool any = false;
    for (int k = 0; k < BS; k++)
      den += t.lab.weights[i * BS + k], valid += t.lab.valid[i * BS + k], any |= t.lab.valid[i * BS + k];
    blocks_with_valid += any;
  }
  cr_expect_float_eq(m.loss_den, den, 1e-9);
  cr_expect_eq(m.eval_den, valid);
  cr_expect_eq(m.tau_den, blocks_with_valid);
  cr_expect_float_eq(m.loss_num, 0.1 * m.ce_num + 0.9 * m.l1_num + 1.0 * m.conf_num, 1e-9);
  cr_expect(m.tau_num >= m.tau_den && m.tau_num <= m.tau_den * (1 + BS), "1 <= tau <= 1 + bs");
  cr_expect(m.greedy_accept_sum >= m.num_blocks);
  double pos = 0;
  for (int k = 0; k < BS; k++) pos += m.pos_den[k];
  cr_expect_eq(pos, valid);
  df_dspark_metrics_free(&m);
  rig_free(&t);
}

// The teacher is required when the L1 term or an active confidence head needs it, and only then.
Test(dspark_objective, teacher_requirement) {
  rig t;
  rig_init(&t, "vanilla", RK, true, true);
  df_dspark_metrics m;
  df_error err = {0};
  df_tensor h = df_f32(t.hidden, R, H), head = df_f32(t.head, V, H);
  df_dspark_loss_options o = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0};
  cr_expect_eq(df_dspark_objective(t.ctx, &o, t.heads, &h, &head, NULL, S, &t.lab, &t.a, NULL, &m, &err),
               DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "target_last_hidden_states");
  o.l1_alpha = 0;
  cr_expect_eq(df_dspark_objective(t.ctx, &o, t.heads, &h, &head, NULL, S, &t.lab, &t.a, NULL, &m, &err),
               DF_ERR_INVALID, "the confidence head's BCE target needs the teacher");
  o.conf_alpha = 0;
  DF_ASSERT_OK(df_dspark_objective(t.ctx, &o, t.heads, &h, &head, NULL, S, &t.lab, &t.a, NULL, &m, &err), &err);
  cr_expect(!m.has_teacher && !m.has_confidence);
  cr_expect_eq(m.l1_num, 0.0);
  df_dspark_metrics_free(&m);
  o.ce_alpha = -1;
  cr_expect_eq(df_dspark_objective(t.ctx, &o, t.heads, &h, &head, t.last, S, &t.lab, &t.a, NULL, &m, &err),
               DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.dspark_ce_loss_alpha");
  rig_free(&t);
}

// ---- export ----------------------------------------------------------------------------------------------------

Test(dspark_export, normalize_config) {
  json_t *j = json_load_file(DF_SOURCE_DIR "/configs/tiny-dspark.json", 0, NULL);
  cr_assert_not_null(j);
  json_object_set_new(json_object_get(j, "dflash_config"), "markov_head_type", json_string("Gated"));
  df_error err = {0};
  DF_ASSERT_OK(df_dspark_normalize_export_config(j, "tiny", &err), &err);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)), "Qwen3DSparkModel");
  cr_expect_eq(json_array_size(json_object_get(j, "architectures")), 1);
  cr_expect_null(json_object_get(j, "auto_map"));
  cr_expect_eq(json_integer_value(json_object_get(j, "markov_rank")), 8);
  cr_expect_str_eq(json_string_value(json_object_get(j, "markov_head_type")), "gated");
  cr_expect(json_is_true(json_object_get(j, "enable_confidence_head")));
  cr_expect(json_is_true(json_object_get(j, "confidence_head_with_markov")));
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "dflash_config"), "attention_mode")), "gqa");
  // A second run compares the lifted copies with dflash_config's: equal values pass (as in SpecForge, "Gated"
  // against the lifted "gated" would be a conflict).
  json_object_set_new(json_object_get(j, "dflash_config"), "markov_head_type", json_string("gated"));
  DF_ASSERT_OK(df_dspark_normalize_export_config(j, "tiny", &err), &err);
  // conflicts and bad values fail naming the key, leaving the document unchanged
  json_object_set_new(j, "markov_rank", json_integer(16));
  cr_expect_eq(df_dspark_normalize_export_config(j, "tiny", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "markov_rank");
  cr_expect_eq(json_integer_value(json_object_get(j, "markov_rank")), 16);
  json_object_set_new(j, "markov_rank", json_integer(8));
  json_object_set_new(j, "model_type", json_string("llama"));
  cr_expect_eq(df_dspark_normalize_export_config(j, "tiny", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "model_type");
  json_object_set_new(j, "model_type", json_string("qwen3"));
  json_object_set_new(json_object_get(j, "dflash_config"), "markov_rank", json_integer(0));
  json_object_del(j, "markov_rank");
  cr_expect_eq(df_dspark_normalize_export_config(j, "tiny", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dflash_config.markov_rank");
  json_object_set_new(json_object_get(j, "dflash_config"), "markov_rank", json_integer(8));
  json_object_set_new(json_object_get(j, "dflash_config"), "markov_head_type", json_string("lstm"));
  json_object_del(j, "markov_head_type");
  cr_expect_eq(df_dspark_normalize_export_config(j, "tiny", &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dflash_config.markov_head_type");
  json_decref(j);
}
