// The MoE FFN's native parameter names, shapes and roles, and the table entries one MoE layer adds.
#include "moe/params.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const SUFFIX[DF_MOE_T_COUNT] = {
    [DF_MOE_T_ROUTER_WEIGHT] = "gate.weight",
    [DF_MOE_T_ROUTER_BIAS] = "gate.bias",
    [DF_MOE_T_SELECTION_BIAS] = "gate.balance.bias",
    [DF_MOE_T_INPUT_MEAN] = "gate.input_mean",
    [DF_MOE_T_INPUT_MEAN_STEPS] = "gate.input_mean_steps",
    [DF_MOE_T_EXPERTS_W1] = "experts.w1",
    [DF_MOE_T_EXPERTS_W3] = "experts.w3",
    [DF_MOE_T_EXPERTS_W2] = "experts.w2",
    [DF_MOE_T_SHARED_W1] = "shared_experts.w1.weight",
    [DF_MOE_T_SHARED_W3] = "shared_experts.w3.weight",
    [DF_MOE_T_SHARED_W2] = "shared_experts.w2.weight",
    [DF_MOE_T_SHARED_GATE] = "shared_experts.gate.weight",
};

const char *df_moe_tensor_suffix(df_moe_tensor t) { return (unsigned)t < DF_MOE_T_COUNT ? SUFFIX[t] : "?"; }

bool df_moe_tensor_is_stacked(df_moe_tensor t) {
  return t == DF_MOE_T_EXPERTS_W1 || t == DF_MOE_T_EXPERTS_W3 || t == DF_MOE_T_EXPERTS_W2;
}

bool df_moe_tensor_present(const df_moe_config *m, df_moe_tensor t) {
  switch (t) {
  case DF_MOE_T_ROUTER_BIAS: return m->moe_router_bias;
  case DF_MOE_T_SELECTION_BIAS: return m->balance == DF_MOE_BALANCE_NOAUX_TC;
  case DF_MOE_T_INPUT_MEAN:
  case DF_MOE_T_INPUT_MEAN_STEPS: return m->router_center != DF_MOE_CENTER_NONE;
  case DF_MOE_T_SHARED_W1:
  case DF_MOE_T_SHARED_W3:
  case DF_MOE_T_SHARED_W2: return m->n_shared_experts > 0;
  case DF_MOE_T_SHARED_GATE: return m->n_shared_experts > 0 && m->shared_expert_gate == DF_MOE_SHARED_GATE_SIGMOID;
  case DF_MOE_T_ROUTER_WEIGHT:
  case DF_MOE_T_EXPERTS_W1:
  case DF_MOE_T_EXPERTS_W3:
  case DF_MOE_T_EXPERTS_W2: return true;
  default: return false;
  }
}

#define SET(...)                                                                                                       \
  do {                                                                                                                 \
    const int64_t s_[] = {__VA_ARGS__};                                                                                \
    memcpy(shape, s_, sizeof s_);                                                                                      \
    return (int)(sizeof s_ / sizeof *s_);                                                                              \
  } while (0)

int df_moe_tensor_shape(const df_moe_config *m, int64_t H, df_moe_tensor t, int64_t shape[DF_MAX_DIMS]) {
  const int64_t E = m->n_routed_experts, I = m->moe_intermediate_size, S = m->shared_expert_intermediate_size;
  switch (t) {
  case DF_MOE_T_ROUTER_WEIGHT: SET(E, H);
  case DF_MOE_T_ROUTER_BIAS:
  case DF_MOE_T_SELECTION_BIAS: SET(E);
  case DF_MOE_T_INPUT_MEAN: SET(H);
  case DF_MOE_T_EXPERTS_W1:
  case DF_MOE_T_EXPERTS_W3: SET(E, I, H);
  case DF_MOE_T_EXPERTS_W2: SET(E, H, I);
  case DF_MOE_T_SHARED_W1:
  case DF_MOE_T_SHARED_W3: SET(S, H);
  case DF_MOE_T_SHARED_W2: SET(H, S);
  case DF_MOE_T_SHARED_GATE: SET(1, H);
  default: return 0; // the step counter is a scalar
  }
}

const char *df_moe_param_name(int64_t layer, df_moe_tensor t, char *buf, size_t n) {
  snprintf(buf, n, "layers.%" PRId64 ".mlp.%s", layer, df_moe_tensor_suffix(t));
  return buf;
}

bool df_moe_param_parse(const char *name, int64_t *layer, df_moe_tensor *t) {
  static const char pre[] = "layers.";
  if (strncmp(name, pre, sizeof pre - 1)) return false;
  const char *p = name + sizeof pre - 1;
  if (*p < '0' || *p > '9') return false;
  char *end = NULL;
  long long i = strtoll(p, &end, 10);
  if (strncmp(end, ".mlp.", 5)) return false;
  for (int k = 0; k < DF_MOE_T_COUNT; k++)
    if (!strcmp(end + 5, SUFFIX[k])) {
      *layer = i;
      *t = (df_moe_tensor)k;
      return true;
    }
  return false;
}

static df_param_role role_of(df_moe_tensor t) {
  switch (t) {
  case DF_MOE_T_ROUTER_WEIGHT: return DF_ROLE_ROUTER;
  case DF_MOE_T_ROUTER_BIAS:
  case DF_MOE_T_SELECTION_BIAS:
  case DF_MOE_T_INPUT_MEAN:
  case DF_MOE_T_INPUT_MEAN_STEPS: return DF_ROLE_BUFFER;
  default: return DF_ROLE_WEIGHT;
  }
}

df_status df_moe_params_add(const df_moe_config *m, int64_t hidden_size, int64_t layer, df_params *p, df_error *err) {
  if (!m || hidden_size <= 0 || m->n_routed_experts <= 0 || m->moe_intermediate_size <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_preset", "resolve the MoE config (df_moe_config_resolve) first",
                   "layer %" PRId64 ": no resolved MoE config (hidden_size %" PRId64 ")", layer, hidden_size);
  for (int k = 0; k < DF_MOE_T_COUNT; k++) {
    const df_moe_tensor t = (df_moe_tensor)k;
    if (!df_moe_tensor_present(m, t)) continue;
    char name[DF_MOE_NAME_MAX];
    int64_t shape[DF_MAX_DIMS];
    const int ndim = df_moe_tensor_shape(m, hidden_size, t, shape);
    const df_param_role role = role_of(t);
    const bool buffer = role == DF_ROLE_BUFFER;
    const bool frozen = buffer || (df_moe_tensor_is_stacked(t) && m->freeze_experts);
    const df_param_spec spec = {.name = df_moe_param_name(layer, t, name, sizeof name),
                                .role = role,
                                .ndim = ndim,
                                .shape = shape,
                                .dtype = t == DF_MOE_T_INPUT_MEAN_STEPS ? DF_I64 : DF_F32,
                                .trainable = !frozen,
                                .weight_decay = !buffer};
    DF_TRY(df_params_add(p, &spec, err));
  }
  return DF_OK;
}

int64_t df_moe_layer_params_total(const df_moe_config *m, int64_t H) {
  const int64_t E = m->n_routed_experts, I = m->moe_intermediate_size, S = m->shared_expert_intermediate_size;
  int64_t n = E * H + E * 3 * H * I;
  if (m->n_shared_experts > 0) n += 3 * H * S;
  if (m->n_shared_experts > 0 && m->shared_expert_gate == DF_MOE_SHARED_GATE_SIGMOID) n += H;
  return n;
}

int64_t df_moe_layer_params_active(const df_moe_config *m, int64_t H) {
  const int64_t E = m->n_routed_experts, k = m->num_experts_per_tok;
  return df_moe_layer_params_total(m, H) - (E - k) * 3 * H * m->moe_intermediate_size;
}
