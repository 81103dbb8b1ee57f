// MoE config: preset tables, explicit overrides, training keys, one failing case per validation rule (each
// naming its key), registries, the native parameter table, serving fields and the 27B parameter count.
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "modeling/draft_model.h"
#include "moe/config.h"
#include "moe/params.h"
#include "moe/registry.h"
#include "tests/common/fixture.h"
#include "tests/common/json_edit.h"

#define CONFIGS_DIR DF_SOURCE_DIR "/configs"

// The tiny dense draft with a preset and the three per-run sizes (E = 8, k = 2, I = 32).
static json_t *with_preset(const char *preset) {
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "moe_preset", json_string(preset));
  df_test_json_set(d, "n_routed_experts", json_integer(8));
  df_test_json_set(d, "num_experts_per_tok", json_integer(2));
  df_test_json_set(d, "moe_intermediate_size", json_integer(32));
  return d;
}

static df_status resolve(json_t *d, bool *is_moe, df_moe_config *m, df_error *err) {
  df_status st = df_moe_config_resolve(d, "mut.json", is_moe, m, err);
  json_decref(d);
  return st;
}

static df_moe_config resolve_ok(json_t *d) {
  df_moe_config m;
  bool is_moe = false;
  df_error err = {0};
  df_status st = resolve(d, &is_moe, &m, &err);
  cr_assert_eq(st, DF_OK, "%s [%s]", err.msg, err.where);
  cr_assert(is_moe);
  return m;
}

// d must fail with want; key must appear in where or msg, with the file named and a hint.
static void expect_fail(json_t *d, df_status want, const char *key, const char *also) {
  df_moe_config m;
  bool is_moe = true;
  df_error err = {0};
  df_status st = resolve(d, &is_moe, &m, &err);
  cr_expect_eq(st, want, "key %s: want %s, got %s: %s", key, df_status_name(want), df_status_name(st), err.msg);
  cr_expect(strstr(err.where, key) || strstr(err.msg, key), "key %s not named: msg \"%s\" where \"%s\"", key, err.msg,
            err.where);
  cr_expect(strstr(err.msg, "mut.json"), "file not named: %s", err.msg);
  cr_expect(err.hint[0], "no hint for %s: %s", key, err.msg);
  if (also)
    cr_expect(strstr(err.msg, also) || strstr(err.hint, also), "%s: \"%s\" missing: %s | %s", key, also, err.msg,
              err.hint);
}

Test(moe_config, qwen3_5_moe_preset_values) {
  df_moe_config m = resolve_ok(with_preset("qwen3_5_moe"));
  cr_expect_str_eq(m.preset, "qwen3_5_moe");
  cr_expect_eq(m.n_routed_experts, 8);
  cr_expect_eq(m.num_experts_per_tok, 2);
  cr_expect_eq(m.moe_intermediate_size, 32);
  cr_expect_eq(m.scoring_func, DF_MOE_SCORE_SOFTMAX);
  cr_expect(m.norm_topk_prob);
  cr_expect_eq(m.routed_scaling_factor, 1.0);
  cr_expect_eq(m.n_shared_experts, 1);
  cr_expect_eq(m.shared_expert_intermediate_size, 32); // defaults to moe_intermediate_size
  cr_expect_eq(m.shared_expert_gate, DF_MOE_SHARED_GATE_SIGMOID);
  cr_expect_eq(m.swiglu_limit, 0.0);
  cr_expect_eq(m.balance, DF_MOE_BALANCE_NONE);
  cr_expect_eq(m.n_group, 1);
  cr_expect_eq(m.topk_group, 1);
  cr_expect_str_eq(m.router, "topk");
  cr_expect_str_eq(m.experts_backend, "grouped");
  cr_expect_str_eq(m.shared_expert, "swiglu");
  cr_expect_not(m.moe_router_bias);
  cr_expect_str_eq(m.moe_layout, "qwen");
  // training defaults
  cr_expect_eq(m.aux_loss_coeff, 0.001);
  cr_expect_eq(m.aux_loss_type, DF_MOE_AUX_SWITCH);
  cr_expect_eq(m.dispatch, DF_MOE_DISPATCH_SORTED_LOOP);
  cr_expect_eq(m.router_center, DF_MOE_CENTER_NONE);
  cr_expect_eq(m.router_center_momentum, 0.99);
  cr_expect_eq(m.bias_update_rate, 0.0);
  cr_expect_not(m.freeze_experts);
}

Test(moe_config, qwen3_preset_values) {
  df_moe_config m = resolve_ok(with_preset("qwen3"));
  cr_expect_eq(m.scoring_func, DF_MOE_SCORE_SOFTMAX);
  cr_expect(m.norm_topk_prob);
  cr_expect_eq(m.routed_scaling_factor, 1.0);
  cr_expect_eq(m.n_shared_experts, 0);
  cr_expect_eq(m.shared_expert_gate, DF_MOE_SHARED_GATE_NONE);
  cr_expect_eq(m.balance, DF_MOE_BALANCE_NOAUX_TC);
  cr_expect_eq(m.swiglu_limit, 0.0);
  cr_expect_str_eq(m.moe_layout, "deepseek");
  cr_expect_eq(m.aux_loss_coeff, 0.001); // optional for qwen3
}

Test(moe_config, deepseek_v4_preset_values) {
  df_moe_config m = resolve_ok(with_preset("deepseek_v4"));
  cr_expect_eq(m.scoring_func, DF_MOE_SCORE_SQRTSOFTPLUS);
  cr_expect(m.norm_topk_prob);
  cr_expect_eq(m.routed_scaling_factor, 1.5);
  cr_expect_eq(m.n_shared_experts, 1);
  cr_expect_eq(m.shared_expert_gate, DF_MOE_SHARED_GATE_NONE);
  cr_expect_eq(m.swiglu_limit, 10.0);
  cr_expect_eq(m.balance, DF_MOE_BALANCE_NOAUX_TC);
  cr_expect_eq(m.aux_loss_coeff, 0.0); // the preset takes no aux loss
  cr_expect_str_eq(m.moe_layout, "deepseek");
}

Test(moe_config, shipped_tiny_configs) {
  df_moe_config q = resolve_ok(df_test_config_doc("tiny-dflash-moe.json"));
  cr_expect_eq(q.n_routed_experts, 4);
  cr_expect_eq(q.num_experts_per_tok, 2);
  cr_expect_eq(q.moe_intermediate_size, 32);
  cr_expect_eq(q.shared_expert_intermediate_size, 48);
  cr_expect_eq(q.router_center, DF_MOE_CENTER_SAMPLE);
  df_moe_config d = resolve_ok(df_test_config_doc("tiny-dflash-moe-deepseek.json"));
  cr_expect_eq(d.n_routed_experts, 8);
  cr_expect_eq(d.n_group, 4);
  cr_expect_eq(d.topk_group, 2);
  cr_expect_eq(d.swiglu_limit, 10.0);
  cr_expect_eq(d.bias_update_rate, 0.001);
  cr_expect_eq(d.shared_expert_intermediate_size, 32);
}

Test(moe_config, explicit_keys_override_the_preset) {
  json_t *d = with_preset("qwen3_5_moe");
  df_test_json_set(d, "scoring_func", df_test_json("\"Sigmoid\"")); // names are case-insensitive, stored canonical
  df_test_json_set(d, "norm_topk_prob", df_test_json("false"));
  df_test_json_set(d, "routed_scaling_factor", df_test_json("2.5"));
  df_test_json_set(d, "n_shared_experts", df_test_json("0"));
  df_test_json_set(d, "n_group", df_test_json("4"));
  df_test_json_set(d, "topk_group", df_test_json("2"));
  df_test_json_set(d, "swiglu_limit", df_test_json("7"));
  df_test_json_set(d, "balance", df_test_json("\"noaux_tc\""));
  df_test_json_set(d, "moe_layout", df_test_json("\"deepseek\""));
  df_test_json_set(d, "num_experts", df_test_json("8")); // both spellings, agreeing
  df_moe_config m = resolve_ok(d);
  cr_expect_eq(m.scoring_func, DF_MOE_SCORE_SIGMOID);
  cr_expect_not(m.norm_topk_prob);
  cr_expect_eq(m.routed_scaling_factor, 2.5);
  cr_expect_eq(m.n_shared_experts, 0);
  cr_expect_eq(m.shared_expert_gate, DF_MOE_SHARED_GATE_NONE); // nothing left to gate
  cr_expect_eq(m.n_group, 4);
  cr_expect_eq(m.topk_group, 2);
  cr_expect_eq(m.swiglu_limit, 7.0);
  cr_expect_eq(m.balance, DF_MOE_BALANCE_NOAUX_TC);
  cr_expect_str_eq(m.moe_layout, "deepseek");
  // num_experts alone is the count too; null keys are "not set".
  d = with_preset("qwen3");
  df_test_json_set(d, "n_routed_experts", NULL);
  df_test_json_set(d, "num_experts", df_test_json("16"));
  df_test_json_set(d, "scoring_func", df_test_json("null"));
  m = resolve_ok(d);
  cr_expect_eq(m.n_routed_experts, 16);
  cr_expect_eq(m.scoring_func, DF_MOE_SCORE_SOFTMAX);
  // moe_router_bias and the deepseek layout for a qwen3_5_moe draft.
  d = with_preset("qwen3_5_moe");
  df_test_json_set(d, "moe_router_bias", df_test_json("true"));
  df_test_json_set(d, "shared_expert_intermediate_size", df_test_json("64"));
  m = resolve_ok(d);
  cr_expect(m.moe_router_bias);
  cr_expect_eq(m.shared_expert_intermediate_size, 64);
}

Test(moe_config, training_keys) {
  json_t *d = with_preset("qwen3");
  df_test_json_set(d, "dflash_config.moe_aux_loss_coeff", df_test_json("0"));
  df_test_json_set(d, "dflash_config.moe_aux_loss_type", df_test_json("\"switch\""));
  df_test_json_set(d, "dflash_config.moe_dispatch", df_test_json("\"grouped_mm\""));
  df_test_json_set(d, "dflash_config.moe_router_center", df_test_json("\"sample\""));
  df_test_json_set(d, "dflash_config.moe_router_center_momentum", df_test_json("0"));
  df_test_json_set(d, "dflash_config.moe_bias_update_rate", df_test_json("0.001"));
  df_test_json_set(d, "dflash_config.moe_freeze_experts", df_test_json("true"));
  df_moe_config m = resolve_ok(d);
  cr_expect_eq(m.aux_loss_coeff, 0.0);
  cr_expect_eq(m.dispatch, DF_MOE_DISPATCH_GROUPED_MM);
  cr_expect_eq(m.router_center, DF_MOE_CENTER_SAMPLE);
  cr_expect_eq(m.router_center_momentum, 0.0);
  cr_expect_eq(m.bias_update_rate, 0.001);
  cr_expect(m.freeze_experts);
}

typedef struct {
  const char *preset; // NULL: tiny-dflash.json without a preset
  const char *path;
  const char *value; // NULL deletes
  const char *key;   // must be named
  const char *also;  // must appear in msg or hint (NULL: nothing more)
} bad_case;

static const bad_case BAD[] = {
    // no preset: never a silent dense FFN
    {NULL, "n_routed_experts", "8", "n_routed_experts", "moe_preset"},
    {NULL, "num_experts_per_tok", "2", "num_experts_per_tok", "moe_preset"},
    {NULL, "dflash_config.moe_aux_loss_coeff", "0.001", "dflash_config.moe_aux_loss_coeff", "moe_preset"},
    // registries list their names
    {"qwen3_5_moe", "moe_preset", "\"mixtral\"", "moe_preset", "deepseek_v4, qwen3, qwen3_5_moe"},
    {"qwen3_5_moe", "moe_layout", "\"megatron\"", "moe_layout", "deepseek, native, qwen"},
    {"qwen3_5_moe", "scoring_func", "\"relu\"", "scoring_func", "sigmoid, softmax, sqrtsoftplus"},
    {"qwen3_5_moe", "balance", "\"aux_loss\"", "balance", "noaux_tc"},
    {"qwen3_5_moe", "router", "\"hash\"", "router", "topk"},
    {"qwen3_5_moe", "experts_backend", "\"dense\"", "experts_backend", "grouped"},
    {"qwen3_5_moe", "shared_expert", "\"gelu\"", "shared_expert", "swiglu"},
    {"qwen3_5_moe", "shared_expert_gate", "\"tanh\"", "shared_expert_gate", "none, sigmoid"},
    {"qwen3_5_moe", "dflash_config.moe_aux_loss_type", "\"zloss\"", "dflash_config.moe_aux_loss_type", "switch"},
    {"qwen3_5_moe", "moe_preset", "5", "moe_preset", NULL},
    // per-run sizes
    {"qwen3_5_moe", "n_routed_experts", NULL, "n_routed_experts", "required"},
    {"qwen3_5_moe", "n_routed_experts", "0", "n_routed_experts", NULL},
    {"qwen3_5_moe", "num_experts", "4", "num_experts", "conflicting"},
    {"qwen3_5_moe", "num_experts_per_tok", "9", "num_experts_per_tok", "n_routed_experts"},
    {"qwen3_5_moe", "num_experts_per_tok", "0", "num_experts_per_tok", NULL},
    {"qwen3_5_moe", "num_experts_per_tok", NULL, "num_experts_per_tok", "required"},
    {"qwen3_5_moe", "moe_intermediate_size", NULL, "moe_intermediate_size", "required"},
    {"qwen3_5_moe", "moe_intermediate_size", "-1", "moe_intermediate_size", NULL},
    {"qwen3_5_moe", "n_shared_experts", "2", "n_shared_experts", "0 or 1"},
    {"qwen3_5_moe", "shared_expert_intermediate_size", "0", "shared_expert_intermediate_size", NULL},
    // routing
    {"qwen3", "n_group", "3", "n_group", "divide"},
    {"qwen3", "topk_group", "2", "topk_group", "n_group"},
    {"qwen3", "routed_scaling_factor", "0", "routed_scaling_factor", NULL},
    {"qwen3", "swiglu_limit", "-1", "swiglu_limit", NULL},
    {"qwen3", "norm_topk_prob", "1", "norm_topk_prob", NULL},
    {"qwen3", "topk_method", "\"greedy\"", "topk_method", "noaux_tc"},
    {"qwen3", "decoder_sparse_step", "2", "decoder_sparse_step", NULL},
    {"qwen3", "router_aux_loss_coef", "0.01", "router_aux_loss_coef", "moe_aux_loss_coeff"},
    {"qwen3", "shared_expert_gate", "\"sigmoid\"", "shared_expert_gate", "n_shared_experts"},
    // training keys
    {"deepseek_v4", "dflash_config.moe_aux_loss_coeff", "0.001", "dflash_config.moe_aux_loss_coeff", "deepseek_v4"},
    {"qwen3_5_moe", "dflash_config.moe_aux_loss_coeff", "-0.1", "dflash_config.moe_aux_loss_coeff", NULL},
    {"qwen3_5_moe", "dflash_config.moe_router_noise_std", "0.1", "dflash_config.moe_router_noise_std",
     "moe_aux_loss_coeff, moe_aux_loss_type, moe_dispatch, moe_router_center, moe_router_center_momentum, "
     "moe_bias_update_rate, moe_freeze_experts"},
    {"qwen3_5_moe", "dflash_config.moe_router_center_momentum", "1.0", "dflash_config.moe_router_center_momentum",
     "[0, 1)"},
    {"qwen3_5_moe", "dflash_config.moe_router_center_momentum", "-0.5", "dflash_config.moe_router_center_momentum",
     NULL},
    {"qwen3_5_moe", "dflash_config.moe_router_center", "\"ema\"", "dflash_config.moe_router_center", NULL},
    {"qwen3_5_moe", "dflash_config.moe_dispatch", "\"scatter\"", "dflash_config.moe_dispatch", NULL},
    {"qwen3_5_moe", "dflash_config.moe_bias_update_rate", "0.001", "dflash_config.moe_bias_update_rate", "noaux_tc"},
    {"qwen3_5_moe", "dflash_config.moe_freeze_experts", "\"yes\"", "dflash_config.moe_freeze_experts", NULL},
    {"qwen3_5_moe", "moe_aux_loss_coeff", "0.01", "moe_aux_loss_coeff", "dflash_config"},
    {"qwen3_5_moe", "moe_experts", "8", "moe_experts", NULL},
};

Test(moe_config, every_rule_names_its_key) {
  for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
    json_t *d = BAD[i].preset ? with_preset(BAD[i].preset) : df_test_config_doc("tiny-dflash.json");
    df_test_json_set(d, BAD[i].path, BAD[i].value ? df_test_json(BAD[i].value) : NULL);
    expect_fail(d, DF_ERR_INVALID, BAD[i].key, BAD[i].also);
  }
  // The kept groups must hold k experts: 8 groups of 1, keep 1, top-2.
  json_t *g = with_preset("qwen3");
  df_test_json_set(g, "n_group", df_test_json("8"));
  df_test_json_set(g, "topk_group", df_test_json("1"));
  expect_fail(g, DF_ERR_INVALID, "topk_group", "num_experts_per_tok");
  // Every decoder layer of an MoE draft is MoE.
  json_t *d = with_preset("qwen3");
  df_test_json_set(d, "mlp_only_layers", df_test_json("[0]"));
  expect_fail(d, DF_ERR_UNSUPPORTED, "mlp_only_layers", NULL);
}

Test(moe_config, layout_collisions_are_refused) {
  // deepseek writes the noaux_tc selection bias as gate.bias: a logit bias too would need the same name.
  json_t *d = with_preset("qwen3");
  df_test_json_set(d, "moe_router_bias", df_test_json("true"));
  expect_fail(d, DF_ERR_INVALID, "moe_layout", "gate.bias");
  // The qwen layout keeps them apart.
  d = with_preset("qwen3");
  df_test_json_set(d, "moe_router_bias", df_test_json("true"));
  df_test_json_set(d, "moe_layout", df_test_json("\"qwen\""));
  resolve_ok(d);
}

Test(moe_config, dense_drafts) {
  df_moe_config m;
  bool is_moe = true;
  df_error err = {0};
  cr_expect_eq(resolve(df_test_config_doc("tiny-dflash.json"), &is_moe, &m, &err), DF_OK);
  cr_expect_not(is_moe);
  json_t *d = df_test_config_doc("tiny-dflash.json");
  df_test_json_set(d, "num_experts", df_test_json("0")); // an explicit zero experts is dense (e300)
  df_test_json_set(d, "n_routed_experts", df_test_json("null"));
  df_test_json_set(d, "output_router_logits", df_test_json("false"));
  cr_expect_eq(resolve(d, &is_moe, &m, &err), DF_OK, "%s", err.msg);
  cr_expect_not(is_moe);
}

Test(moe_config, registries) {
  df_error err = {0};
  DF_ASSERT_OK(df_moe_registry_check(&err), &err);
  char buf[256];
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_PRESET, buf, sizeof buf), "deepseek_v4, qwen3, qwen3_5_moe");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_LAYOUT, buf, sizeof buf), "deepseek, native, qwen");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_SCORE, buf, sizeof buf), "sigmoid, softmax, sqrtsoftplus");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_BALANCE, buf, sizeof buf), "noaux_tc, none");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_AUX_LOSS, buf, sizeof buf), "switch");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_ROUTER, buf, sizeof buf), "topk");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_EXPERTS, buf, sizeof buf), "grouped");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_SHARED_EXPERT, buf, sizeof buf), "swiglu");
  cr_expect_str_eq(df_moe_registry_names(DF_MOE_REG_SHARED_GATE, buf, sizeof buf), "none, sigmoid");
  const df_moe_reg_entry *e = NULL;
  DF_ASSERT_OK(df_moe_registry_get(DF_MOE_REG_SCORE, "SQRTSOFTPLUS", "scoring_func", &e, &err), &err);
  cr_expect_str_eq(e->name, "sqrtsoftplus");
  cr_expect_eq(e->id, DF_MOE_SCORE_SQRTSOFTPLUS);
  cr_expect_eq(df_moe_registry_get(DF_MOE_REG_LAYOUT, "nope", "moe_layout", &e, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "moe_layout");
  cr_expect(strstr(err.msg, "unknown checkpoint layout 'nope'; registered: deepseek, native, qwen"), "%s", err.msg);
  cr_expect_null(e);
  cr_expect_str_eq(df_moe_score_func_name(DF_MOE_SCORE_SIGMOID), "sigmoid");
  cr_expect_str_eq(df_moe_balance_name(DF_MOE_BALANCE_NOAUX_TC), "noaux_tc");
  cr_expect_str_eq(df_moe_shared_gate_name(DF_MOE_SHARED_GATE_SIGMOID), "sigmoid");
  // Presets name only registered components.
  for (const char *const *p = (const char *const[]){"qwen3_5_moe", "qwen3", "deepseek_v4", NULL}; *p; p++) {
    const df_moe_preset *ps = df_moe_registry_find(DF_MOE_REG_PRESET, *p)->impl;
    cr_expect_not_null(df_moe_registry_find(DF_MOE_REG_LAYOUT, ps->layout), "%s", *p);
    cr_expect_not_null(df_moe_registry_find(DF_MOE_REG_SCORE, ps->scoring_func), "%s", *p);
    cr_expect_not_null(df_moe_registry_find(DF_MOE_REG_BALANCE, ps->balance), "%s", *p);
    cr_expect_not_null(df_moe_registry_find(DF_MOE_REG_SHARED_GATE, ps->shared_expert_gate), "%s", *p);
  }
}

// Native names, shapes, roles, order and flags of one layer.
Test(moe_config, params_of_one_layer) {
  json_t *d = df_test_config_doc("tiny-dflash-moe.json"); // E 4, k 2, I 32, S 48, H 64, sample centering
  df_moe_config m = resolve_ok(d);
  df_params *p;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  DF_ASSERT_OK(df_moe_params_add(&m, 64, 3, p, &err), &err);
  DF_ASSERT_OK(df_params_finalize(p, &err), &err);
  static const struct {
    const char *name;
    int ndim;
    int64_t shape[3];
    df_param_role role;
    bool trainable;
    df_dtype dtype;
  } want[] = {
      {"layers.3.mlp.gate.weight", 2, {4, 64}, DF_ROLE_ROUTER, true, DF_F32},
      {"layers.3.mlp.gate.input_mean", 1, {64}, DF_ROLE_BUFFER, false, DF_F32},
      {"layers.3.mlp.gate.input_mean_steps", 0, {0}, DF_ROLE_BUFFER, false, DF_I64},
      {"layers.3.mlp.experts.w1", 3, {4, 32, 64}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.experts.w3", 3, {4, 32, 64}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.experts.w2", 3, {4, 64, 32}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.shared_experts.w1.weight", 2, {48, 64}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.shared_experts.w3.weight", 2, {48, 64}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.shared_experts.w2.weight", 2, {64, 48}, DF_ROLE_WEIGHT, true, DF_F32},
      {"layers.3.mlp.shared_experts.gate.weight", 2, {1, 64}, DF_ROLE_WEIGHT, true, DF_F32},
  };
  cr_assert_eq(df_params_count(p), (int)(sizeof want / sizeof *want));
  for (int i = 0; i < df_params_count(p); i++) {
    const df_param *e = df_params_at(p, i);
    cr_expect_str_eq(e->name, want[i].name);
    cr_expect_eq(e->ndim, want[i].ndim, "%s", e->name);
    for (int k = 0; k < want[i].ndim; k++) cr_expect_eq(e->shape[k], want[i].shape[k], "%s dim %d", e->name, k);
    cr_expect_eq(e->role, want[i].role, "%s", e->name);
    cr_expect_eq(e->trainable, want[i].trainable, "%s", e->name);
    cr_expect_eq(e->weight_decay, want[i].role != DF_ROLE_BUFFER, "%s", e->name);
    cr_expect_eq(e->dtype, want[i].dtype, "%s", e->name);
    int64_t layer = -1;
    df_moe_tensor t;
    cr_expect(df_moe_param_parse(e->name, &layer, &t), "%s", e->name);
    cr_expect_eq(layer, 3);
    cr_expect_eq(t < DF_MOE_T_COUNT, true);
  }
  // Parameters (not buffers) equal the per-layer total.
  int64_t trainable = 0;
  for (int i = 0; i < df_params_count(p); i++)
    if (df_params_at(p, i)->role != DF_ROLE_BUFFER) trainable += df_params_at(p, i)->numel;
  cr_expect_eq(trainable, df_moe_layer_params_total(&m, 64));
  cr_expect_eq(df_moe_layer_params_active(&m, 64), trainable - 2 * 3 * 32 * 64);
  df_params_free(p);
  cr_expect_not(df_moe_param_parse("layers.3.mlp.gate_proj.weight", &(int64_t){0}, &(df_moe_tensor){0}));
  cr_expect_not(df_moe_param_parse("layers.x.mlp.gate.weight", &(int64_t){0}, &(df_moe_tensor){0}));

  // deepseek: selection bias, no centering, no shared gate; frozen experts.
  d = df_test_config_doc("tiny-dflash-moe-deepseek.json");
  df_test_json_set(d, "dflash_config.moe_freeze_experts", df_test_json("true"));
  m = resolve_ok(d);
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  DF_ASSERT_OK(df_moe_params_add(&m, 64, 0, p, &err), &err);
  DF_ASSERT_OK(df_params_finalize(p, &err), &err);
  cr_expect_eq(df_params_count(p), 8);
  const df_param *sb = df_params_find(p, "layers.0.mlp.gate.balance.bias");
  cr_assert_not_null(sb);
  cr_expect_eq(sb->role, DF_ROLE_BUFFER);
  cr_expect_not(sb->trainable);
  cr_expect_not(df_params_find(p, "layers.0.mlp.experts.w1")->trainable);
  cr_expect(df_params_find(p, "layers.0.mlp.gate.weight")->trainable);
  cr_expect_null(df_params_find(p, "layers.0.mlp.shared_experts.gate.weight"));
  cr_expect_null(df_params_find(p, "layers.0.mlp.gate.input_mean"));
  df_params_free(p);
}

static json_t *fields(const df_moe_config *m) {
  json_t *o = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_moe_serving_fields(m, &o, &err), &err);
  return o;
}

static int64_t geti(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  cr_assert(json_is_integer(v), "%s is not an integer", k);
  return json_integer_value(v);
}

static const char *gets(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  cr_assert(json_is_string(v), "%s is not a string", k);
  return json_string_value(v);
}

Test(moe_config, serving_fields_per_layout) {
  df_moe_config q = resolve_ok(df_test_config_doc("qwen3.8-27b-dspark-moe.json"));
  json_t *o = fields(&q);
  cr_expect_eq(geti(o, "n_routed_experts"), 512);
  cr_expect_eq(geti(o, "num_experts"), 512); // the Qwen vocabulary
  cr_expect_eq(geti(o, "num_experts_per_tok"), 10);
  cr_expect_eq(geti(o, "moe_intermediate_size"), 512);
  cr_expect_eq(geti(o, "shared_expert_intermediate_size"), 2048);
  cr_expect_eq(geti(o, "n_shared_experts"), 1);
  cr_expect_eq(geti(o, "n_group"), 1);
  cr_expect_eq(geti(o, "topk_group"), 1);
  cr_expect_str_eq(gets(o, "scoring_func"), "softmax");
  cr_expect_str_eq(gets(o, "topk_method"), "greedy");
  cr_expect_str_eq(gets(o, "shared_expert_gate"), "sigmoid");
  cr_expect(json_is_true(json_object_get(o, "norm_topk_prob")));
  cr_expect(json_is_true(json_object_get(o, "moe_router_bias"))); // centering is folded into gate.bias
  cr_expect_eq(json_number_value(json_object_get(o, "routed_scaling_factor")), 1.0);
  cr_expect_null(json_object_get(o, "swiglu_limit")); // omitted at 0
  json_decref(o);

  df_moe_config d = resolve_ok(df_test_config_doc("tiny-dflash-moe-deepseek.json"));
  o = fields(&d);
  cr_expect_eq(geti(o, "n_routed_experts"), 8);
  cr_expect_null(json_object_get(o, "num_experts"));
  cr_expect_null(json_object_get(o, "moe_router_bias"));
  cr_expect_null(json_object_get(o, "shared_expert_gate"));
  cr_expect_str_eq(gets(o, "topk_method"), "noaux_tc");
  cr_expect_str_eq(gets(o, "scoring_func"), "sqrtsoftplus");
  cr_expect_eq(json_number_value(json_object_get(o, "swiglu_limit")), 10.0);
  cr_expect_eq(json_number_value(json_object_get(o, "routed_scaling_factor")), 1.5);
  cr_expect_eq(geti(o, "n_group"), 4);
  cr_expect_eq(geti(o, "topk_group"), 2);
  cr_expect_eq(json_object_size(o), 12);
  json_decref(o);

  // The qwen layout refuses recipes the Qwen serving block cannot run.
  json_t *doc_sig = with_preset("qwen3_5_moe");
  df_test_json_set(doc_sig, "scoring_func", df_test_json("\"sigmoid\""));
  df_moe_config s = resolve_ok(doc_sig);
  df_error err = {0};
  cr_expect_eq(df_moe_serving_fields(&s, &o, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "scoring_func");
  cr_expect_null(o);
}

// moe.md 12: 20.8 B total / 1.08 B active, rounded to 3 significant digits in the reference. Counted: the
// draft's own parameters (5 layers of attention + norms + MoE FFN, fc, hidden_norm, norm, the DSpark Markov
// head 2·V·r and confidence head H + r + 1); active keeps k = 10 of the 512 routed experts per layer.
Test(moe_config, qwen38_27b_parameter_count) {
  char path[512];
  snprintf(path, sizeof path, "%s/qwen3.8-27b-dspark-moe.json", CONFIGS_DIR);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(path, &cfg, &err), &err);
  cr_assert_not_null(cfg->moe);
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(cfg, &total, &active);
  // Exact values from the formula above, then the reference's rounding (tolerance: half a unit of the
  // third significant digit).
  cr_expect_eq(total, INT64_C(20823502337), "total %lld", (long long)total);
  cr_expect_eq(active, INT64_C(1084059137), "active %lld", (long long)active);
  cr_expect_leq(fabs((double)total - 20.8e9), 0.05e9, "total %.4g", (double)total);
  cr_expect_leq(fabs((double)active - 1.08e9), 0.005e9, "active %.4g", (double)active);
  // The routed experts alone: 5 · 512 · 3 · 5120 · 512 ≈ 20.13 B.
  cr_expect_eq(5 * 512 * (3 * INT64_C(5120) * 512), INT64_C(20132659200));
  df_draft_config_free(cfg);
}

// The count agrees with the parameter table the model really builds (buffers excluded), dense and MoE.
static void expect_count_matches_model(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", CONFIGS_DIR, name);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_file(path, &cfg, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *model = NULL;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &model, &err), &err);
  const df_params *p = df_draft_model_params(model);
  int64_t params = 0;
  for (int i = 0; i < df_params_count(p); i++)
    if (df_params_at(p, i)->role != DF_ROLE_BUFFER) params += df_params_at(p, i)->numel;
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(cfg, &total, &active);
  cr_expect_eq(total, params, "%s: counted %lld, the model has %lld", name, (long long)total, (long long)params);
  if (!cfg->moe) cr_expect_eq(active, total);
  if (cfg->moe) cr_expect_lt(active, total);
  df_draft_model_free(model);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

Test(moe_config, count_matches_the_model_table) {
  expect_count_matches_model("tiny-dflash.json");
  expect_count_matches_model("tiny-dflash-moe.json");
  expect_count_matches_model("tiny-dflash-moe-deepseek.json");
  expect_count_matches_model("tiny-dspark.json"); // Markov + confidence heads
}
