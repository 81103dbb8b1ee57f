// MoE config resolution from the draft JSON: preset → explicit top-level architecture keys → dflash_config.moe_*
// training keys → validation (moe.md 4.1–4.4). Every choice is an explicit, registered, validated value.
#include "moe/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/config_json.h"
#include "moe/layout.h"
#include "moe/registry.h"

#define MAX_EXPERTS (1 << 16)
#define MAX_WIDTH   (1 << 20)

static const char PRESET_HINT[] = "name a preset to build an MoE draft (\"moe_preset\": \"qwen3_5_moe\", \"qwen3\" or "
                                  "\"deepseek_v4\"), or remove the MoE keys for a dense one";

// Top-level architecture keys (target-family HF names), in the order the resolver reads them.
static const char *const ARCH_KEYS[] = {"moe_preset",
                                        "n_routed_experts",
                                        "num_experts",
                                        "num_experts_per_tok",
                                        "moe_intermediate_size",
                                        "n_shared_experts",
                                        "shared_expert_intermediate_size",
                                        "scoring_func",
                                        "norm_topk_prob",
                                        "routed_scaling_factor",
                                        "n_group",
                                        "topk_group",
                                        "swiglu_limit",
                                        "router",
                                        "balance",
                                        "experts_backend",
                                        "shared_expert",
                                        "shared_expert_gate",
                                        "moe_router_bias",
                                        "moe_layout",
                                        "topk_method"}; // a serving field; must agree with balance when present

// HF MoE keys that would make some layers dense or move the aux coefficient; checked, never silently ignored.
static const char *const HF_EXTRA_KEYS[] = {"decoder_sparse_step", "mlp_only_layers", "first_k_dense_replace",
                                            "router_aux_loss_coef", "output_router_logits"};

// dflash_config.moe_* training keys.
static const char *const TRAIN_KEYS[] = {"moe_aux_loss_coeff", "moe_aux_loss_type",          "moe_dispatch",
                                         "moe_router_center",  "moe_router_center_momentum", "moe_bias_update_rate",
                                         "moe_freeze_experts"};

#define COUNT(a) (int)(sizeof(a) / sizeof *(a))

static bool in_list(const char *key, const char *const *list, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(key, list[i])) return true;
  return false;
}

bool df_moe_is_top_level_key(const char *key) {
  return in_list(key, ARCH_KEYS, COUNT(ARCH_KEYS)) || in_list(key, HF_EXTRA_KEYS, COUNT(HF_EXTRA_KEYS));
}

static const char *join(const char *const *list, int n, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && len < size; i++) {
    int w = snprintf(buf + len, size - len, "%s%s", i ? ", " : "", list[i]);
    if (w < 0) break;
    len += (size_t)w;
  }
  return buf;
}

// ---- dense drafts -------------------------------------------------------------------------------------------

// Without moe_preset a draft is dense: every MoE key is an error (an explicit expert count of 0 means dense).
static df_status check_dense(const df_cj *c, const json_t *root) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)root, key, v) {
    if (json_is_null(v) || !strcmp(key, "output_router_logits")) continue;
    const bool count = !strcmp(key, "n_routed_experts") || !strcmp(key, "num_experts");
    if (count && json_is_integer(v) && json_integer_value(v) == 0) continue;
    if (df_moe_is_top_level_key(key) || !strncmp(key, "moe_", 4))
      return DF_CJ_FAIL(c, DF_ERR_INVALID, key, PRESET_HINT, "an MoE key, but the draft names no moe_preset");
  }
  const json_t *dc = df_cj_get(root, "dflash_config");
  if (!json_is_object(dc)) return DF_OK;
  json_object_foreach((json_t *)dc, key, v) {
    char path[DF_CJ_PATH];
    if (!json_is_null(v) && !strncmp(key, "moe_", 4))
      return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, "dflash_config", key), PRESET_HINT,
                        "an MoE training key, but the draft names no moe_preset");
  }
  return DF_OK;
}

// ---- registered names -----------------------------------------------------------------------------------------

// Looks name up in a registry; an unknown name fails at path, listing the registered names.
static df_status lookup(const df_cj *c, df_moe_reg_kind kind, const char *name, const char *path,
                        const df_moe_reg_entry **out) {
  *out = df_moe_registry_find(kind, name);
  if (*out) return DF_OK;
  char names[256], hint[300];
  df_moe_registry_names(kind, names, sizeof names);
  snprintf(hint, sizeof hint, "use one of: %s", names);
  return DF_CJ_FAIL(c, DF_ERR_INVALID, path, hint, "unknown %s \"%.64s\"; registered: %s", df_moe_reg_kind_name(kind),
                    name, names);
}

// An optional name-valued key of obj: the registry entry of its value, or of def (a preset's value, reported
// against the preset when unregistered) when the key is absent or null.
static df_status name_key(const df_cj *c, const json_t *obj, const char *prefix, const char *key, df_moe_reg_kind kind,
                          const char *def, const df_moe_reg_entry **out, bool *given) {
  char path[DF_CJ_PATH];
  const json_t *v = df_cj_get(obj, key);
  const char *name = def;
  df_cj_path(path, prefix, key);
  if (given) *given = v != NULL;
  if (v) DF_TRY(df_cj_string(c, v, path, &name));
  if (!v) snprintf(path, sizeof path, "moe_preset (default %s)", key);
  return lookup(c, kind, name, path, out);
}

// ---- architecture keys ---------------------------------------------------------------------------------------

static df_status read_expert_count(const df_cj *c, const json_t *root, df_moe_config *m) {
  const json_t *a = df_cj_get(root, "n_routed_experts"), *b = df_cj_get(root, "num_experts");
  int64_t na = 0, nb = 0;
  if (a) DF_TRY(df_cj_int(c, a, "n_routed_experts", 1, MAX_EXPERTS, &na));
  if (b) DF_TRY(df_cj_int(c, b, "num_experts", 1, MAX_EXPERTS, &nb));
  if (!a && !b)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "n_routed_experts",
                      "set the routed-expert count of this run, e.g. \"n_routed_experts\": 64 (presets never do)",
                      "required for an MoE draft (moe_preset %s)", m->preset);
  if (a && b && na != nb)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "num_experts", "keep one spelling, or make both equal",
                      "conflicting routed-expert counts: num_experts %lld, n_routed_experts %lld", (long long)nb,
                      (long long)na);
  m->n_routed_experts = a ? na : nb;
  return DF_OK;
}

static df_status read_sizes(const df_cj *c, const json_t *root, df_moe_config *m) {
  DF_TRY(read_expert_count(c, root, m));
  const json_t *k = df_cj_get(root, "num_experts_per_tok"), *w = df_cj_get(root, "moe_intermediate_size");
  if (!k)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "num_experts_per_tok", "set the top-k of this run, e.g. 8",
                      "required for an MoE draft");
  DF_TRY(df_cj_int(c, k, "num_experts_per_tok", 1, MAX_EXPERTS, &m->num_experts_per_tok));
  if (m->num_experts_per_tok > m->n_routed_experts)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "num_experts_per_tok", "route each token to at most n_routed_experts experts",
                      "%lld exceeds n_routed_experts %lld", (long long)m->num_experts_per_tok,
                      (long long)m->n_routed_experts);
  if (!w)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "moe_intermediate_size", "set the routed-expert width, e.g. 512",
                      "required for an MoE draft");
  DF_TRY(df_cj_int(c, w, "moe_intermediate_size", 1, MAX_WIDTH, &m->moe_intermediate_size));
  const json_t *ns = df_cj_get(root, "n_shared_experts");
  if (ns) {
    if (!json_is_integer(ns) || (json_integer_value(ns) != 0 && json_integer_value(ns) != 1))
      return DF_CJ_FAIL(c, DF_ERR_INVALID, "n_shared_experts",
                        "use 0 (none) or 1 (one shared expert of width shared_expert_intermediate_size)",
                        "must be 0 or 1, got %s", json_is_integer(ns) ? "another integer" : df_cj_type_name(ns));
    m->n_shared_experts = json_integer_value(ns);
  }
  return df_cj_opt_int(c, root, "", "shared_expert_intermediate_size", m->moe_intermediate_size, 1, MAX_WIDTH,
                       &m->shared_expert_intermediate_size);
}

static df_status read_routing(const df_cj *c, const json_t *root, const df_moe_preset *ps, df_moe_config *m) {
  const df_moe_reg_entry *e;
  DF_TRY(name_key(c, root, "", "scoring_func", DF_MOE_REG_SCORE, ps->scoring_func, &e, NULL));
  m->scoring_func = (df_moe_score_func)e->id;
  DF_TRY(df_cj_opt_bool(c, root, "", "norm_topk_prob", ps->norm_topk_prob, &m->norm_topk_prob));
  DF_TRY(df_cj_opt_real(c, root, "", "routed_scaling_factor", ps->routed_scaling_factor, 0.0, true, 1e6,
                        &m->routed_scaling_factor));
  DF_TRY(df_cj_opt_int(c, root, "", "n_group", ps->n_group, 1, MAX_EXPERTS, &m->n_group));
  DF_TRY(df_cj_opt_int(c, root, "", "topk_group", ps->topk_group, 1, MAX_EXPERTS, &m->topk_group));
  DF_TRY(df_cj_opt_real(c, root, "", "swiglu_limit", ps->swiglu_limit, 0.0, false, 1e30, &m->swiglu_limit));
  DF_TRY(name_key(c, root, "", "router", DF_MOE_REG_ROUTER, ps->router, &e, NULL));
  m->router = e->name;
  DF_TRY(name_key(c, root, "", "balance", DF_MOE_REG_BALANCE, ps->balance, &e, NULL));
  m->balance = (df_moe_balance)e->id;
  DF_TRY(name_key(c, root, "", "experts_backend", DF_MOE_REG_EXPERTS, ps->experts_backend, &e, NULL));
  m->experts_backend = e->name;
  DF_TRY(name_key(c, root, "", "shared_expert", DF_MOE_REG_SHARED_EXPERT, ps->shared_expert, &e, NULL));
  m->shared_expert = e->name;
  bool gate_given = false;
  DF_TRY(name_key(c, root, "", "shared_expert_gate", DF_MOE_REG_SHARED_GATE, ps->shared_expert_gate, &e, &gate_given));
  m->shared_expert_gate = (df_moe_shared_gate)e->id;
  if (m->n_shared_experts == 0 && m->shared_expert_gate != DF_MOE_SHARED_GATE_NONE) {
    if (gate_given)
      return DF_CJ_FAIL(c, DF_ERR_INVALID, "shared_expert_gate", "set n_shared_experts to 1, or the gate to \"none\"",
                        "a gated shared expert, but n_shared_experts is 0");
    m->shared_expert_gate = DF_MOE_SHARED_GATE_NONE; // the preset's gate has no shared expert to gate
  }
  DF_TRY(df_cj_opt_bool(c, root, "", "moe_router_bias", false, &m->moe_router_bias));
  DF_TRY(name_key(c, root, "", "moe_layout", DF_MOE_REG_LAYOUT, ps->layout, &e, NULL));
  m->moe_layout = e->name;
  return DF_OK;
}

// ---- training keys -----------------------------------------------------------------------------------------

static df_status check_training_keys(const df_cj *c, const json_t *dc) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)dc, key, v) {
    if (strncmp(key, "moe_", 4) || in_list(key, TRAIN_KEYS, COUNT(TRAIN_KEYS))) continue;
    char path[DF_CJ_PATH], known[320], hint[360];
    join(TRAIN_KEYS, COUNT(TRAIN_KEYS), known, sizeof known);
    snprintf(hint, sizeof hint, "known dflash_config MoE keys: %s", known);
    return DF_CJ_FAIL(c, DF_ERR_INVALID, df_cj_path(path, "dflash_config", key), hint,
                      "unknown MoE training key; known: %s", known);
  }
  return DF_OK;
}

static df_status read_training(const df_cj *c, const json_t *dc, const df_moe_preset *ps, df_moe_config *m) {
  static const char *const dispatch[] = {"sorted_loop", "grouped_mm"}, *const center[] = {"none", "sample"};
  const char *dp = "dflash_config";
  DF_TRY(check_training_keys(c, dc));
  const double def = ps->aux_loss_forbidden ? 0.0 : DF_MOE_DEFAULT_AUX_LOSS_COEFF;
  DF_TRY(df_cj_opt_real(c, dc, dp, "moe_aux_loss_coeff", def, 0.0, false, 1e6, &m->aux_loss_coeff));
  if (ps->aux_loss_forbidden && m->aux_loss_coeff != 0.0)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.moe_aux_loss_coeff",
                      "this preset balances with the noaux_tc selection bias: set 0 (or drop the key)",
                      "moe_preset %s takes no aux loss, got %g", m->preset, m->aux_loss_coeff);
  const df_moe_reg_entry *e;
  DF_TRY(name_key(c, dc, dp, "moe_aux_loss_type", DF_MOE_REG_AUX_LOSS, "switch", &e, NULL));
  m->aux_loss_type = (df_moe_aux_type)e->id;
  int idx = 0;
  const json_t *v = df_cj_get(dc, "moe_dispatch");
  if (v) DF_TRY(df_cj_enum(c, v, "dflash_config.moe_dispatch", dispatch, 2, &idx));
  m->dispatch = (df_moe_dispatch)idx;
  idx = 0;
  v = df_cj_get(dc, "moe_router_center");
  if (v) DF_TRY(df_cj_enum(c, v, "dflash_config.moe_router_center", center, 2, &idx));
  m->router_center = (df_moe_center)idx;
  DF_TRY(df_cj_opt_real(c, dc, dp, "moe_router_center_momentum", 0.99, 0.0, false, 1.0, &m->router_center_momentum));
  if (m->router_center_momentum >= 1.0)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.moe_router_center_momentum",
                      "use a momentum in [0, 1), e.g. 0.99 (1 would never update the running mean)",
                      "must be in [0, 1), got %g", m->router_center_momentum);
  DF_TRY(df_cj_opt_real(c, dc, dp, "moe_bias_update_rate", 0.0, 0.0, false, 1e6, &m->bias_update_rate));
  if (m->bias_update_rate > 0.0 && m->balance != DF_MOE_BALANCE_NOAUX_TC)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.moe_bias_update_rate",
                      "set \"balance\": \"noaux_tc\", or drop the rate",
                      "%g, but balance is %s (the rate steps the noaux_tc selection bias)", m->bias_update_rate,
                      df_moe_balance_name(m->balance));
  return df_cj_opt_bool(c, dc, dp, "moe_freeze_experts", false, &m->freeze_experts);
}

// ---- validation --------------------------------------------------------------------------------------------

static df_status check_groups(const df_cj *c, const df_moe_config *m) {
  const long long E = m->n_routed_experts, g = m->n_group, tg = m->topk_group, k = m->num_experts_per_tok;
  if (E % g)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "n_group", "use a group count that divides n_routed_experts (1 = no groups)",
                      "%lld does not divide n_routed_experts %lld", g, E);
  if (tg > g)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "topk_group", "keep at most n_group groups (topk_group = n_group: no limit)",
                      "%lld exceeds n_group %lld", tg, g);
  if (k > tg * (E / g))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "topk_group", "keep enough groups to hold num_experts_per_tok experts",
                      "%lld groups of %lld experts cannot hold num_experts_per_tok %lld", tg, E / g, k);
  return DF_OK;
}

// Keys whose meaning is fixed by the resolved config: present only to agree with it.
static df_status check_hf_keys(const df_cj *c, const json_t *root, const df_moe_config *m) {
  const json_t *v;
  int64_t n = 0;
  if ((v = df_cj_get(root, "topk_method"))) {
    const char *want = m->balance == DF_MOE_BALANCE_NOAUX_TC ? "noaux_tc" : "greedy", *got = NULL;
    DF_TRY(df_cj_string(c, v, "topk_method", &got));
    if (strcmp(got, want))
      return DF_CJ_FAIL(c, DF_ERR_INVALID, "topk_method", "drop it: it is derived from \"balance\" on export",
                        "\"%.32s\" contradicts balance %s (topk_method \"%s\")", got, df_moe_balance_name(m->balance),
                        want);
  }
  DF_TRY(df_cj_opt_int(c, root, "", "decoder_sparse_step", 1, 1, 1, &n));
  DF_TRY(df_cj_opt_int(c, root, "", "first_k_dense_replace", 0, 0, 0, &n));
  if ((v = df_cj_get(root, "mlp_only_layers")) && !(json_is_array(v) && json_array_size(v) == 0))
    return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "mlp_only_layers", "every decoder layer of an MoE draft is MoE; drop it",
                      "dense layers inside an MoE draft are not supported");
  double coef = 0;
  if ((v = df_cj_get(root, "router_aux_loss_coef"))) {
    DF_TRY(df_cj_real(c, v, "router_aux_loss_coef", 0.0, false, 1e6, &coef));
    if (coef != m->aux_loss_coeff)
      return DF_CJ_FAIL(c, DF_ERR_INVALID, "router_aux_loss_coef",
                        "set the coefficient as dflash_config.moe_aux_loss_coeff and drop this HF key",
                        "%g differs from dflash_config.moe_aux_loss_coeff %g", coef, m->aux_loss_coeff);
  }
  bool b = false;
  return df_cj_opt_bool(c, root, "", "output_router_logits", false, &b);
}

static df_status validate(const df_cj *c, const json_t *root, df_moe_config *m) {
  DF_TRY(check_groups(c, m));
  DF_TRY(check_hf_keys(c, root, m));
  const df_moe_layout *l = df_moe_layout_find(m->moe_layout);
  df_error inner = {0};
  if (df_moe_layout_check(l, m, "moe_layout", &inner) != DF_OK)
    return DF_CJ_FAIL(c, inner.status, "moe_layout", inner.hint, "%s", inner.msg);
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)root, key, v) { // a misplaced or misspelled moe_* key at the top level
    if (strncmp(key, "moe_", 4) || in_list(key, ARCH_KEYS, COUNT(ARCH_KEYS))) continue;
    const bool training = in_list(key, TRAIN_KEYS, COUNT(TRAIN_KEYS));
    return DF_CJ_FAIL(c, DF_ERR_INVALID, key,
                      training ? "training keys live under dflash_config" : "check the spelling of the MoE key",
                      training ? "an MoE training key at the top level" : "unknown top-level MoE key");
  }
  return DF_OK;
}

df_status df_moe_config_resolve(const json_t *root, const char *source, bool *is_moe, df_moe_config *out,
                                df_error *err) {
  df_cj c = {.source = source ? source : "<json>", .err = err};
  *out = (df_moe_config){0};
  *is_moe = false;
  const json_t *pv = df_cj_get(root, "moe_preset");
  if (!pv) return check_dense(&c, root);
  DF_TRY(df_moe_registry_check(err));
  const char *preset = NULL;
  const df_moe_reg_entry *pe;
  DF_TRY(df_cj_string(&c, pv, "moe_preset", &preset));
  DF_TRY(lookup(&c, DF_MOE_REG_PRESET, preset, "moe_preset", &pe));
  const df_moe_preset *ps = pe->impl;
  const json_t *dc = df_cj_get(root, "dflash_config");
  json_t *empty = json_is_object(dc) ? NULL : json_object(); // dflash_config's own type is the parser's to check
  df_moe_config m = {.preset = pe->name, .n_shared_experts = ps->n_shared_experts};
  df_status st = read_sizes(&c, root, &m);
  if (st == DF_OK) st = read_routing(&c, root, ps, &m);
  if (st == DF_OK) st = read_training(&c, empty ? empty : dc, ps, &m);
  if (st == DF_OK) st = validate(&c, root, &m);
  json_decref(empty);
  if (st != DF_OK) return st;
  *out = m;
  *is_moe = true;
  return DF_OK;
}
