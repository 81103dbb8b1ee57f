// The MoE FFN's parameters in the draft's parameter table: their native (in-memory) names, shapes, roles and
// checkpoint order. Every other name a file may use is a layout's business (moe/layout.h), at the file boundary.
#ifndef DF_MOE_PARAMS_H
#define DF_MOE_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/tensor.h"
#include "modeling/ffn.h" // the FFN interface (parameter table)
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// One MoE layer's tensors, in checkpoint order. Native names (SpecForge's module names) under the prefix
// "layers.{i}.mlp.":
//
//   tensor                      native suffix                shape      role    trainable  present iff
//   DF_MOE_T_ROUTER_WEIGHT      gate.weight                  [E, H]     ROUTER  yes        always
//   DF_MOE_T_ROUTER_BIAS        gate.bias                    [E]        BUFFER  no         moe_router_bias
//   DF_MOE_T_SELECTION_BIAS     gate.balance.bias            [E]        BUFFER  no         balance noaux_tc
//   DF_MOE_T_INPUT_MEAN         gate.input_mean              [H]        BUFFER  no         router_center != none
//   DF_MOE_T_INPUT_MEAN_STEPS   gate.input_mean_steps        []  (I64)  BUFFER  no         router_center != none
//   DF_MOE_T_EXPERTS_W1         experts.w1 (gate)            [E, I, H]  WEIGHT  !freeze    always
//   DF_MOE_T_EXPERTS_W3         experts.w3 (up)              [E, I, H]  WEIGHT  !freeze    always
//   DF_MOE_T_EXPERTS_W2         experts.w2 (down)            [E, H, I]  WEIGHT  !freeze    always
//   DF_MOE_T_SHARED_W1          shared_experts.w1.weight     [S, H]     WEIGHT  yes        n_shared_experts = 1
//   DF_MOE_T_SHARED_W3          shared_experts.w3.weight     [S, H]     WEIGHT  yes        n_shared_experts = 1
//   DF_MOE_T_SHARED_W2          shared_experts.w2.weight     [H, S]     WEIGHT  yes        n_shared_experts = 1
//   DF_MOE_T_SHARED_GATE        shared_experts.gate.weight   [1, H]     WEIGHT  yes        shared gate sigmoid
//
// Buffers are fp32 in the flat buffer and owned by no optimizer (not trainable, so never in a gradient dump).
// gate.input_mean_steps is an int64 step counter in files (dtype DF_I64, 0-dim); the flat buffer holds it as
// an fp32 value, exact up to 2^24 steps. Weight decay follows the model's rule: matrices (router, experts,
// shared expert, shared gate) decay, buffers do not.
typedef enum {
  DF_MOE_T_ROUTER_WEIGHT = 0,
  DF_MOE_T_ROUTER_BIAS,
  DF_MOE_T_SELECTION_BIAS,
  DF_MOE_T_INPUT_MEAN,
  DF_MOE_T_INPUT_MEAN_STEPS,
  DF_MOE_T_EXPERTS_W1,
  DF_MOE_T_EXPERTS_W3,
  DF_MOE_T_EXPERTS_W2,
  DF_MOE_T_SHARED_W1,
  DF_MOE_T_SHARED_W3,
  DF_MOE_T_SHARED_W2,
  DF_MOE_T_SHARED_GATE,
  DF_MOE_T_COUNT
} df_moe_tensor;

enum { DF_MOE_NAME_MAX = 128 }; // longest parameter name the helpers format

// "gate.weight", "experts.w1", ... (the part after "layers.{i}.mlp.").
const char *df_moe_tensor_suffix(df_moe_tensor t);
// Whether the config gives layer tensors of this kind (the "present iff" column).
bool df_moe_tensor_present(const df_moe_config *m, df_moe_tensor t);
// The tensor's shape for hidden size H; returns ndim (0 for the step counter).
int df_moe_tensor_shape(const df_moe_config *m, int64_t hidden_size, df_moe_tensor t, int64_t shape[DF_MAX_DIMS]);
// Stacked per-expert tensors ([E, out, in]): w1, w3, w2.
bool df_moe_tensor_is_stacked(df_moe_tensor t);
// "layers.{layer}.mlp.<suffix>" into buf (n >= DF_MOE_NAME_MAX is always enough); returns buf.
const char *df_moe_param_name(int64_t layer, df_moe_tensor t, char *buf, size_t n);
// The inverse: whether name is "layers.{i}.mlp.<native suffix>" of some MoE tensor (sets *layer, *t).
bool df_moe_param_parse(const char *name, int64_t *layer, df_moe_tensor *t);

// Appends layer `layer`'s MoE parameters to p (not yet finalized) in the order above, skipping absent ones.
df_status df_moe_params_add(const df_moe_config *m, int64_t hidden_size, int64_t layer, df_params *p, df_error *err);

// Parameters of one MoE layer: total (every expert) and active per token (k routed experts, the router, the
// shared expert and its gate). Buffers are not parameters and are not counted.
int64_t df_moe_layer_params_total(const df_moe_config *m, int64_t hidden_size);
int64_t df_moe_layer_params_active(const df_moe_config *m, int64_t hidden_size);

#ifdef __cplusplus
}
#endif

#endif
