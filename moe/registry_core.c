// The core's registrations: every built-in component and the native layout. Families add presets and
// layouts in moe/families/ (listed by moe/families/families.c). A new component is one row here.
#include "moe/config.h"
#include "moe/layout.h"
#include "moe/registry.h"

// native: every tensor under its module name, experts stacked [E, out, in].
static const df_moe_layout NATIVE = {.name = "native"};

static const df_moe_registration CORE[] = {
    {DF_MOE_REG_SCORE, {"softmax", DF_MOE_SCORE_SOFTMAX, NULL}},
    {DF_MOE_REG_SCORE, {"sigmoid", DF_MOE_SCORE_SIGMOID, NULL}},
    {DF_MOE_REG_SCORE, {"sqrtsoftplus", DF_MOE_SCORE_SQRTSOFTPLUS, NULL}},
    {DF_MOE_REG_ROUTER, {"topk", 0, NULL}},
    {DF_MOE_REG_BALANCE, {"none", DF_MOE_BALANCE_NONE, NULL}},
    {DF_MOE_REG_BALANCE, {"noaux_tc", DF_MOE_BALANCE_NOAUX_TC, NULL}},
    {DF_MOE_REG_AUX_LOSS, {"switch", DF_MOE_AUX_SWITCH, NULL}},
    {DF_MOE_REG_EXPERTS, {"grouped", 0, NULL}},
    {DF_MOE_REG_SHARED_EXPERT, {"swiglu", 0, NULL}},
    {DF_MOE_REG_SHARED_GATE, {"none", DF_MOE_SHARED_GATE_NONE, NULL}},
    {DF_MOE_REG_SHARED_GATE, {"sigmoid", DF_MOE_SHARED_GATE_SIGMOID, NULL}},
    {DF_MOE_REG_LAYOUT, {"native", 0, &NATIVE}},
};

const df_moe_family df_moe_core_family = {"core", CORE, (int)(sizeof CORE / sizeof *CORE)};
