// MoE auxiliary load-balancing losses by df_moe_aux_type ("switch", registered in moe/registry_core.c): the name
// check here; the value, its score gradient and the load statistics are ops (df_moe_route_stats,
// df_moe_aux_backward in kernels/ops_moe.h), so a new loss is a registry row plus its kernel cases.
//   switch (transformers' load_balancing_loss_func for one layer, no mask):
//   L = coeff · E · Σ_e (counts_e / T) · P_e,  P_e = (1/T) Σ_t s_te;  ∂L/∂s_te = coeff · E · counts_e / T².
#ifndef DF_MOE_AUX_LOSS_H
#define DF_MOE_AUX_LOSS_H

#include "base/error.h"
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// The registered name of an aux loss type; fails naming moe_aux_loss_type for an unknown one.
df_status df_moe_aux_loss_name(df_moe_aux_type type, const char **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
