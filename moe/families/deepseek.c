// The DeepSeek family: the deepseek_v4 preset (lineage #812, "C1") and the deepseek per-expert layout
// (experts.{e}.w1/w2/w3.weight, shared_experts.*, the noaux_tc selection bias as gate.bias).
#include "moe/families/families.h"
#include "moe/layout.h"

// sqrtsoftplus scores, renormalised, scale 1.5, one ungated shared expert, SwiGLU clamp 10, noaux_tc
// balancing and no aux loss.
static const df_moe_preset DEEPSEEK_V4 = {.layout = "deepseek",
                                          .scoring_func = "sqrtsoftplus",
                                          .norm_topk_prob = true,
                                          .routed_scaling_factor = 1.5,
                                          .n_shared_experts = 1,
                                          .shared_expert_gate = "none",
                                          .swiglu_limit = 10.0,
                                          .balance = "noaux_tc",
                                          .router = "topk",
                                          .experts_backend = "grouped",
                                          .shared_expert = "swiglu",
                                          .n_group = 1,
                                          .topk_group = 1,
                                          .aux_loss_forbidden = true};

static const df_moe_layout DEEPSEEK_LAYOUT = {.name = "deepseek",
                                              .file = {[DF_MOE_T_SELECTION_BIAS] = "gate.bias",
                                                       [DF_MOE_T_EXPERTS_W1] = "experts.{e}.w1.weight",
                                                       [DF_MOE_T_EXPERTS_W3] = "experts.{e}.w3.weight",
                                                       [DF_MOE_T_EXPERTS_W2] = "experts.{e}.w2.weight"}};

static const df_moe_registration DEEPSEEK[] = {
    {DF_MOE_REG_PRESET, {"deepseek_v4", 0, &DEEPSEEK_V4}},
    {DF_MOE_REG_LAYOUT, {"deepseek", 0, &DEEPSEEK_LAYOUT}},
};

const df_moe_family df_moe_family_deepseek = {"deepseek", DEEPSEEK, (int)(sizeof DEEPSEEK / sizeof *DEEPSEEK)};
