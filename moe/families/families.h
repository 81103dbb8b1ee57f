// The target families the build registers (moe/families/families.c lists them). Only family files and the
// table include this header; the MoE core never does.
#ifndef DF_MOE_FAMILIES_H
#define DF_MOE_FAMILIES_H

#include "moe/registry.h"

extern const df_moe_family df_moe_family_qwen;     // moe/families/qwen.c
extern const df_moe_family df_moe_family_deepseek; // moe/families/deepseek.c

#endif
