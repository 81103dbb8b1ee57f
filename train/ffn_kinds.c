// The FFN kinds this build has beyond the dense MLP (modeling/ffn.h): the list modeling/ resolves draft configs
// against. It lives above modeling/ and moe/, so neither includes the other; a new kind is one line here.
#include "modeling/ffn.h"
#include "moe/ffn_moe.h"

const df_ffn_kind *const df_ffn_kinds[] = {&df_ffn_moe_kind};
const int df_ffn_num_kinds = (int)(sizeof df_ffn_kinds / sizeof *df_ffn_kinds);
