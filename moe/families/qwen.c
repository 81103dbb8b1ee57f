// The Qwen family: the qwen3_5_moe preset (#993 families/qwen.py), the e300 qwen3 preset and the qwen layout
// (HF / SGLang Qwen2-MoE names: experts.{e}.gate_proj/up_proj/down_proj, shared_expert.*, shared_expert_gate).
#include "moe/families/families.h"
#include "moe/layout.h"

// Softmax, renormalised, scale 1, one sigmoid-gated shared expert, no selection bias; switch aux loss.
static const df_moe_preset QWEN3_5_MOE = {.layout = "qwen",
                                          .scoring_func = "softmax",
                                          .norm_topk_prob = true,
                                          .routed_scaling_factor = 1.0,
                                          .n_shared_experts = 1,
                                          .shared_expert_gate = "sigmoid",
                                          .swiglu_limit = 0.0,
                                          .balance = "none",
                                          .router = "topk",
                                          .experts_backend = "grouped",
                                          .shared_expert = "swiglu",
                                          .n_group = 1,
                                          .topk_group = 1};

// e300's Qwen3.8-27B DFlash2 ablation: softmax + noaux_tc selection bias, no shared expert.
static const df_moe_preset QWEN3 = {.layout = "deepseek",
                                    .scoring_func = "softmax",
                                    .norm_topk_prob = true,
                                    .routed_scaling_factor = 1.0,
                                    .n_shared_experts = 0,
                                    .shared_expert_gate = "none",
                                    .swiglu_limit = 0.0,
                                    .balance = "noaux_tc",
                                    .router = "topk",
                                    .experts_backend = "grouped",
                                    .shared_expert = "swiglu",
                                    .n_group = 1,
                                    .topk_group = 1};

static const df_moe_layout QWEN_LAYOUT = {.name = "qwen",
                                          .file = {[DF_MOE_T_EXPERTS_W1] = "experts.{e}.gate_proj.weight",
                                                   [DF_MOE_T_EXPERTS_W3] = "experts.{e}.up_proj.weight",
                                                   [DF_MOE_T_EXPERTS_W2] = "experts.{e}.down_proj.weight",
                                                   [DF_MOE_T_SHARED_W1] = "shared_expert.gate_proj.weight",
                                                   [DF_MOE_T_SHARED_W3] = "shared_expert.up_proj.weight",
                                                   [DF_MOE_T_SHARED_W2] = "shared_expert.down_proj.weight",
                                                   [DF_MOE_T_SHARED_GATE] = "shared_expert_gate.weight"}};

static const df_moe_registration QWEN[] = {
    {DF_MOE_REG_PRESET, {"qwen3_5_moe", 0, &QWEN3_5_MOE}},
    {DF_MOE_REG_PRESET, {"qwen3", 0, &QWEN3}},
    {DF_MOE_REG_LAYOUT, {"qwen", 0, &QWEN_LAYOUT}},
};

const df_moe_family df_moe_family_qwen = {"qwen", QWEN, (int)(sizeof QWEN / sizeof *QWEN)};
