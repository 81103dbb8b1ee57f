// The MoE registries: name → entry maps for every configurable component (score functions, routers, balance
// controllers, aux losses, experts backends, shared experts, shared-expert gates, checkpoint layouts, presets).
// They are static const tables: the core's own (registry_core.c) plus each family's, which the build lists in
// moe/families/families.c. The core never includes moe/families/; it only sees the df_moe_families table.
#ifndef DF_MOE_REGISTRY_H
#define DF_MOE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DF_MOE_REG_SCORE = 0,     // scoring_func: softmax, sigmoid, sqrtsoftplus (id: df_moe_score_func)
  DF_MOE_REG_ROUTER,        // router: topk
  DF_MOE_REG_BALANCE,       // balance: none, noaux_tc (id: df_moe_balance)
  DF_MOE_REG_AUX_LOSS,      // dflash_config.moe_aux_loss_type: switch (id: df_moe_aux_type)
  DF_MOE_REG_EXPERTS,       // experts_backend: grouped
  DF_MOE_REG_SHARED_EXPERT, // shared_expert: swiglu
  DF_MOE_REG_SHARED_GATE,   // shared_expert_gate: none, sigmoid (id: df_moe_shared_gate)
  DF_MOE_REG_LAYOUT,        // moe_layout: native (core), qwen, deepseek (families); impl: const df_moe_layout *
  DF_MOE_REG_PRESET,        // moe_preset: qwen3_5_moe, qwen3, deepseek_v4 (families); impl: const df_moe_preset *
  DF_MOE_REG_COUNT
} df_moe_reg_kind;

typedef struct {
  const char *name; // the canonical spelling; lookups ignore case (SpecForge lower-cases these values)
  int id;           // the config enum value where the kind has one, else 0
  const void *impl; // the component behind the name (layout, preset, or a numerics vtable); may be NULL
} df_moe_reg_entry;

// One registration: a row of a registry table.
typedef struct {
  df_moe_reg_kind kind;
  df_moe_reg_entry entry;
} df_moe_registration;

// A set of registrations: the core's, or one target family's.
typedef struct {
  const char *name; // "core", "qwen", "deepseek"
  const df_moe_registration *regs;
  int n;
} df_moe_family;

// What a preset sets (moe.md 4.4). Names are resolved through the registries, so a preset cannot name an
// unregistered component. Per-run sizes and training keys are not preset fields.
typedef struct {
  const char *layout; // default checkpoint layout (moe_layout overrides)
  const char *scoring_func;
  bool norm_topk_prob;
  double routed_scaling_factor;
  int64_t n_shared_experts;
  const char *shared_expert_gate;
  double swiglu_limit;
  const char *balance;
  const char *router, *experts_backend, *shared_expert;
  int64_t n_group, topk_group;
  bool aux_loss_forbidden; // the recipe balances without an aux loss: moe_aux_loss_coeff defaults to, and must be, 0
} df_moe_preset;

// The core table (moe/registry_core.c) and the family table the build lists (moe/families/families.c).
extern const df_moe_family df_moe_core_family;
extern const df_moe_family *const df_moe_families[];
extern const int df_moe_num_families;

// "score function", "router", ... for messages.
const char *df_moe_reg_kind_name(df_moe_reg_kind kind);
// The entry registered under name (case-insensitive), or NULL.
const df_moe_reg_entry *df_moe_registry_find(df_moe_reg_kind kind, const char *name);
// The same, failing with "unknown <kind> 'x'; registered: a, b" (names sorted); where is the config key path.
df_status df_moe_registry_get(df_moe_reg_kind kind, const char *name, const char *where, const df_moe_reg_entry **out,
                              df_error *err);
// The registered names of a kind, sorted, comma-separated, into buf; returns buf.
const char *df_moe_registry_names(df_moe_reg_kind kind, char *buf, size_t n);
// The entry with this id (the first registered), or NULL: maps a resolved enum back to its name.
const df_moe_reg_entry *df_moe_registry_by_id(df_moe_reg_kind kind, int id);
// Every table is well formed: no name registered twice within a kind (across core and families), no empty
// name, presets and layouts carry their impl.
df_status df_moe_registry_check(df_error *err);

#ifdef __cplusplus
}
#endif

#endif
