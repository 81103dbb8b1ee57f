// The resolved MoE FFN configuration of a draft: preset → explicit top-level keys → dflash_config.moe_*
// training keys → validation, done once when the draft config is built. Immutable afterwards.
#ifndef DF_MOE_CONFIG_H
#define DF_MOE_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops_moe.h" // df_moe_score_func, df_moe_aux_type: the kernels switch on them

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_MOE_BALANCE_NONE = 0, DF_MOE_BALANCE_NOAUX_TC } df_moe_balance;
typedef enum { DF_MOE_SHARED_GATE_NONE = 0, DF_MOE_SHARED_GATE_SIGMOID } df_moe_shared_gate;
typedef enum { DF_MOE_CENTER_NONE = 0, DF_MOE_CENTER_SAMPLE } df_moe_center;
typedef enum { DF_MOE_DISPATCH_SORTED_LOOP = 0, DF_MOE_DISPATCH_GROUPED_MM } df_moe_dispatch;

typedef struct df_moe_config {
  // Architecture keys (draft JSON top level; target-family HF names).
  const char *preset;            // moe_preset (registered)
  int64_t n_routed_experts;      // E (n_routed_experts / num_experts)
  int64_t num_experts_per_tok;   // k, 1 <= k <= E
  int64_t moe_intermediate_size; // I of a routed expert
  int64_t n_shared_experts;      // 0 or 1
  int64_t shared_expert_intermediate_size;
  df_moe_score_func scoring_func;
  bool norm_topk_prob;
  double routed_scaling_factor;
  int64_t n_group, topk_group; // group-limited iff topk_group < n_group
  double swiglu_limit;         // 0 = no clamp
  const char *router;          // registered router ("topk")
  df_moe_balance balance;
  const char *experts_backend; // registered experts backend ("grouped")
  const char *shared_expert;   // registered shared expert ("swiglu")
  df_moe_shared_gate shared_expert_gate;
  bool moe_router_bias;   // fp32 logit bias buffer gate.bias
  const char *moe_layout; // registered checkpoint layout ("native" | "qwen" | "deepseek")
  // Training keys (dflash_config.moe_*).
  double aux_loss_coeff; // 0 disables
  df_moe_aux_type aux_loss_type;
  df_moe_dispatch dispatch;
  df_moe_center router_center;
  double router_center_momentum; // [0, 1)
  double bias_update_rate;       // noaux_tc selection-bias step
  bool freeze_experts;
} df_moe_config;

// Every string field points at a registry name (static storage): a resolved config owns no memory.

// The default of dflash_config.moe_aux_loss_coeff (#993); a preset that balances without an aux loss
// (deepseek_v4) defaults to, and requires, 0.
#define DF_MOE_DEFAULT_AUX_LOSS_COEFF 0.001

// Resolves the MoE FFN of a draft document (root: the whole draft JSON object; source names it in errors):
// preset → explicit top-level architecture keys → dflash_config.moe_* training keys → validation. A draft is
// MoE iff it names moe_preset; then *is_moe is true and *out holds the resolved config. Without moe_preset
// *is_moe is false, and any MoE key (n_routed_experts, dflash_config.moe_*, ...) is an error: an MoE key never
// silently builds a dense FFN. Errors name the key path ("dflash_config.moe_dispatch") and carry a hint;
// unknown names list the registered ones.
df_status df_moe_config_resolve(const json_t *root, const char *source, bool *is_moe, df_moe_config *out,
                                df_error *err);

// Whether key is a top-level MoE key this resolver reads (for `inspect`'s list of unused keys).
bool df_moe_is_top_level_key(const char *key);

// The serving rules, in one place (the qwen layout and `draftforge export` both call it): refuses, naming the
// field, what SGLang's MoE draft classes cannot run: scoring_func other than softmax, any balance (a selection
// bias; noaux_tc), n_group / topk_group != 1, n_shared_experts > 1, num_experts_per_tok outside 1..E, a shared
// expert without width, routed_scaling_factor != 1, swiglu_limit > 0. NULL (dense) passes.
df_status df_moe_serving_check(const df_moe_config *m, df_error *err);

// The routing fields an exported config.json carries (moe.md 4.5): n_routed_experts, num_experts_per_tok,
// moe_intermediate_size, n_shared_experts, shared_expert_intermediate_size, scoring_func, norm_topk_prob,
// routed_scaling_factor, n_group, topk_group, topk_method (noaux_tc | greedy), swiglu_limit (only when > 0);
// the qwen layout adds the Qwen vocabulary (num_experts, shared_expert_gate, moe_router_bias) and refuses
// recipes the Qwen serving block cannot run. moe_router_bias is true when the export folds router centering
// into gate.bias. *out is a new object the caller decrefs.
df_status df_moe_serving_fields(const df_moe_config *m, json_t **out, df_error *err);

// Registry names of the resolved enums ("softmax", "noaux_tc", "sigmoid", "sample", "grouped_mm", "switch").
const char *df_moe_score_func_name(df_moe_score_func f);
const char *df_moe_balance_name(df_moe_balance b);
const char *df_moe_shared_gate_name(df_moe_shared_gate g);
const char *df_moe_center_name(df_moe_center c);
const char *df_moe_dispatch_name(df_moe_dispatch d);
const char *df_moe_aux_type_name(df_moe_aux_type a);

// Every resolved field, one per line (`draftforge inspect`).
void df_moe_config_print(const df_moe_config *m, FILE *fp);

#ifdef __cplusplus
}
#endif

#endif
