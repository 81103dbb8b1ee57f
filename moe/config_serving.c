// What a resolved MoE config says outside training: which recipes serve (the rules export and the qwen layout
// share), the serving fields of an exported config.json (moe.md 4.5), the registry names of its enums, and the
// `inspect` listing.
#include <stdio.h>
#include <string.h>

#include "moe/config.h"
#include "moe/registry.h"

static const char *reg_name(df_moe_reg_kind kind, int id) {
  const df_moe_reg_entry *e = df_moe_registry_by_id(kind, id);
  return e ? e->name : "?";
}

const char *df_moe_score_func_name(df_moe_score_func f) { return reg_name(DF_MOE_REG_SCORE, (int)f); }
const char *df_moe_balance_name(df_moe_balance b) { return reg_name(DF_MOE_REG_BALANCE, (int)b); }
const char *df_moe_shared_gate_name(df_moe_shared_gate g) { return reg_name(DF_MOE_REG_SHARED_GATE, (int)g); }
const char *df_moe_aux_type_name(df_moe_aux_type a) { return reg_name(DF_MOE_REG_AUX_LOSS, (int)a); }
const char *df_moe_center_name(df_moe_center c) { return c == DF_MOE_CENTER_SAMPLE ? "sample" : "none"; }
const char *df_moe_dispatch_name(df_moe_dispatch d) {
  return d == DF_MOE_DISPATCH_GROUPED_MM ? "grouped_mm" : "sorted_loop";
}

// The one place that says which MoE recipes serve (moe.md 4.5, 9): SGLang's MoE draft classes
// (Qwen3MoeDSparkModel, DFlashMoEDraftModel, the Qwen block) route with softmax top-k scores, no selection
// bias, no groups, scale 1, no SwiGLU clamp and at most one shared expert. Anything else would serve a
// different model, so the qwen layout and `draftforge export` both refuse it here.
static const char SERVE_HINT[] = "the MoE serving classes (Qwen3MoeDSparkModel, DFlashMoEDraftModel) run softmax "
                                 "top-k routing without selection bias, groups, scaling or clamp; train such a recipe";

df_status df_moe_serving_check(const df_moe_config *m, df_error *err) {
  if (!m) return DF_OK;
  if (m->scoring_func != DF_MOE_SCORE_SOFTMAX)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "scoring_func", SERVE_HINT,
                   "not servable: the MoE serving classes route with softmax scores, this draft with %s",
                   df_moe_score_func_name(m->scoring_func));
  if (m->balance != DF_MOE_BALANCE_NONE)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "balance", SERVE_HINT,
                   "not servable: balance %s (a selection bias) is not served", df_moe_balance_name(m->balance));
  if (m->n_group != 1 || m->topk_group != 1)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, m->n_group != 1 ? "n_group" : "topk_group", SERVE_HINT,
                   "not servable: group-limited routing (n_group %lld, topk_group %lld) is not served",
                   (long long)m->n_group, (long long)m->topk_group);
  if (m->n_shared_experts < 0 || m->n_shared_experts > 1)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "n_shared_experts", SERVE_HINT,
                   "not servable: n_shared_experts %lld (the serving classes have 0 or 1)",
                   (long long)m->n_shared_experts);
  if (m->num_experts_per_tok < 1 || m->num_experts_per_tok > m->n_routed_experts)
    return DF_FAIL(err, DF_ERR_INVALID, "num_experts_per_tok", "use 1 <= num_experts_per_tok <= n_routed_experts",
                   "not servable: top-%lld of %lld experts", (long long)m->num_experts_per_tok,
                   (long long)m->n_routed_experts);
  if (m->n_shared_experts == 1 && m->shared_expert_intermediate_size <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "shared_expert_intermediate_size", "set a positive shared expert width",
                   "not servable: a shared expert of width %lld", (long long)m->shared_expert_intermediate_size);
  if (m->routed_scaling_factor != 1.0)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "routed_scaling_factor", SERVE_HINT,
                   "not servable: routed_scaling_factor %g (the serving classes scale by 1)", m->routed_scaling_factor);
  if (m->swiglu_limit > 0.0)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "swiglu_limit", SERVE_HINT,
                   "not servable: swiglu_limit %g (the serving classes have no SwiGLU clamp)", m->swiglu_limit);
  return DF_OK;
}

#define SET(key, value)                                                                                                \
  do {                                                                                                                 \
    if (json_object_set_new(o, (key), (value))) ok = false;                                                            \
  } while (0)

df_status df_moe_serving_fields(const df_moe_config *m, json_t **out, df_error *err) {
  *out = NULL;
  if (!m) return DF_FAIL(err, DF_ERR_INVALID, "moe_preset", "only MoE drafts have routing fields", "no MoE config");
  const bool qwen = m->moe_layout && !strcmp(m->moe_layout, "qwen");
  if (qwen) DF_TRY(df_moe_serving_check(m, err)); // the Qwen block serves only that recipe
  json_t *o = json_object();
  bool ok = o != NULL;
  if (!ok) return DF_FAIL(err, DF_ERR_NOMEM, "config.json", NULL, "out of memory");
  SET("n_routed_experts", json_integer(m->n_routed_experts));
  SET("num_experts_per_tok", json_integer(m->num_experts_per_tok));
  SET("moe_intermediate_size", json_integer(m->moe_intermediate_size));
  SET("n_shared_experts", json_integer(m->n_shared_experts));
  SET("shared_expert_intermediate_size", json_integer(m->shared_expert_intermediate_size));
  SET("scoring_func", json_string(df_moe_score_func_name(m->scoring_func)));
  SET("norm_topk_prob", json_boolean(m->norm_topk_prob));
  SET("routed_scaling_factor", json_real(m->routed_scaling_factor));
  SET("n_group", json_integer(m->n_group));
  SET("topk_group", json_integer(m->topk_group));
  SET("topk_method", json_string(m->balance == DF_MOE_BALANCE_NOAUX_TC ? "noaux_tc" : "greedy"));
  if (m->swiglu_limit > 0.0) SET("swiglu_limit", json_real(m->swiglu_limit)); // an engine reads 0 as "clamp at 0"
  if (qwen) {
    SET("num_experts", json_integer(m->n_routed_experts));
    SET("shared_expert_gate", json_string(df_moe_shared_gate_name(m->shared_expert_gate)));
    // The export folds router centering into gate.bias, so a centered draft serves with a logit bias.
    SET("moe_router_bias", json_boolean(m->moe_router_bias || m->router_center != DF_MOE_CENTER_NONE));
  }
  if (!ok) {
    json_decref(o);
    return DF_FAIL(err, DF_ERR_NOMEM, "config.json", NULL, "out of memory");
  }
  *out = o;
  return DF_OK;
}

#define ROW "  %-36s "

void df_moe_config_print(const df_moe_config *m, FILE *fp) {
  if (!m) {
    fprintf(fp, ROW "%s\n", "ffn", "dense");
    return;
  }
  fprintf(fp, ROW "moe (preset %s, layout %s)\n", "ffn", m->preset, m->moe_layout);
  fprintf(fp, ROW "%lld, top-%lld, width %lld\n", "moe.experts", (long long)m->n_routed_experts,
          (long long)m->num_experts_per_tok, (long long)m->moe_intermediate_size);
  if (m->n_shared_experts)
    fprintf(fp, ROW "%lld of width %lld, gate %s, %s\n", "moe.shared_expert", (long long)m->n_shared_experts,
            (long long)m->shared_expert_intermediate_size, df_moe_shared_gate_name(m->shared_expert_gate),
            m->shared_expert);
  else
    fprintf(fp, ROW "%s\n", "moe.shared_expert", "none");
  fprintf(fp, ROW "%s, %s, scale %g\n", "moe.scoring", df_moe_score_func_name(m->scoring_func),
          m->norm_topk_prob ? "renormalised" : "not renormalised", m->routed_scaling_factor);
  fprintf(fp, ROW "%lld of %lld\n", "moe.topk_group / n_group", (long long)m->topk_group, (long long)m->n_group);
  fprintf(fp, ROW "%g%s\n", "moe.swiglu_limit", m->swiglu_limit, m->swiglu_limit > 0 ? "" : " (no clamp)");
  fprintf(fp, ROW "%s, balance %s, experts %s\n", "moe.router", m->router, df_moe_balance_name(m->balance),
          m->experts_backend);
  fprintf(fp, ROW "%s\n", "moe.router_bias", m->moe_router_bias ? "true" : "false");
  fprintf(fp, ROW "%g (%s)%s\n", "moe.aux_loss_coeff", m->aux_loss_coeff, df_moe_aux_type_name(m->aux_loss_type),
          m->aux_loss_coeff > 0 ? "" : " off");
  fprintf(fp, ROW "%s\n", "moe.dispatch", df_moe_dispatch_name(m->dispatch));
  fprintf(fp, ROW "%s (momentum %g)\n", "moe.router_center", df_moe_center_name(m->router_center),
          m->router_center_momentum);
  fprintf(fp, ROW "%g\n", "moe.bias_update_rate", m->bias_update_rate);
  fprintf(fp, ROW "%s\n", "moe.freeze_experts", m->freeze_experts ? "true" : "false");
}
