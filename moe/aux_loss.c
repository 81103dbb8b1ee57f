// The aux loss types the registry knows (the numerics are kernels/cpu/moe_aux.c and its CUDA twin).
#include "moe/aux_loss.h"

#include "moe/registry.h"

df_status df_moe_aux_loss_name(df_moe_aux_type type, const char **out, df_error *err) {
  const df_moe_reg_entry *e = df_moe_registry_by_id(DF_MOE_REG_AUX_LOSS, (int)type);
  *out = e ? e->name : NULL;
  if (!e)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_aux_loss_type", "the registered aux losses are: switch",
                   "unknown aux loss type %d", (int)type);
  return DF_OK;
}
