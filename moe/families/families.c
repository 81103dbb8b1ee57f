// The one table of registered target families: a new family is a new file in this folder plus one line here.
#include "moe/families/families.h"

const df_moe_family *const df_moe_families[] = {
    &df_moe_family_qwen,
    &df_moe_family_deepseek,
};

const int df_moe_num_families = (int)(sizeof df_moe_families / sizeof *df_moe_families);
