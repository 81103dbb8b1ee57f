// The resolved MoE FFN configuration of a draft: preset → explicit top-level keys → dflash_config.moe_*
// training keys → validation, done once when the draft config is built. Immutable afterwards.
#ifndef DF_MOE_CONFIG_H
#define DF_MOE_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_MOE_SCORE_SOFTMAX = 0, DF_MOE_SCORE_SIGMOID, DF_MOE_SCORE_SQRTSOFTPLUS } df_moe_score_func;
typedef enum { DF_MOE_BALANCE_NONE = 0, DF_MOE_BALANCE_NOAUX_TC } df_moe_balance;
typedef enum { DF_MOE_SHARED_GATE_NONE = 0, DF_MOE_SHARED_GATE_SIGMOID } df_moe_shared_gate;
typedef enum { DF_MOE_CENTER_NONE = 0, DF_MOE_CENTER_SAMPLE } df_moe_center;
typedef enum { DF_MOE_AUX_SWITCH = 0 } df_moe_aux_type;
typedef enum { DF_MOE_DISPATCH_SORTED_LOOP = 0, DF_MOE_DISPATCH_GROUPED_MM } df_moe_dispatch;

typedef struct {
  // Architecture keys (draft JSON top level; target-family HF names).
  const char *preset;              // moe_preset (registered)
  int64_t n_routed_experts;        // E (n_routed_experts / num_experts)
  int64_t num_experts_per_tok;     // k, 1 <= k <= E
  int64_t moe_intermediate_size;   // I of a routed expert
  int64_t n_shared_experts;        // 0 or 1
  int64_t shared_expert_intermediate_size;
  df_moe_score_func scoring_func;
  bool norm_topk_prob;
  double routed_scaling_factor;
  int64_t n_group, topk_group;     // group-limited iff topk_group < n_group
  double swiglu_limit;             // 0 = no clamp
  const char *router;              // registered router ("topk")
  df_moe_balance balance;
  const char *experts_backend;     // registered experts backend ("grouped")
  const char *shared_expert;       // registered shared expert ("swiglu")
  df_moe_shared_gate shared_expert_gate;
  bool moe_router_bias;            // fp32 logit bias buffer gate.bias
  const char *moe_layout;          // registered checkpoint layout ("native" | "qwen" | "deepseek")
  // Training keys (dflash_config.moe_*).
  double aux_loss_coeff;           // 0 disables
  df_moe_aux_type aux_loss_type;
  df_moe_dispatch dispatch;
  df_moe_center router_center;
  double router_center_momentum;   // [0, 1)
  double bias_update_rate;         // noaux_tc selection-bias step
  bool freeze_experts;
} df_moe_config;

#ifdef __cplusplus
}
#endif

#endif
