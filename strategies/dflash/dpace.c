// D-PACE (SpecForge `loss_type: dpace*`): the loss-type names. The detached per-slot weights that turn the
// DFlash CE into an acceptance-aware objective (shared/reference/dflash-dspark.md §3.2) are the op
// df_dpace_weights (kernels/cpu/metrics.c).
#include <string.h>

#include "strategies/dflash/dflash.h"

const char *df_dflash_loss_type_name(df_dflash_loss_type t) {
  switch (t) {
  case DF_LOSS_DFLASH: return "dflash";
  case DF_LOSS_DPACE: return "dpace";
  case DF_LOSS_DPACE_CUMCONF: return "dpace-cumulative-confidence-only";
  case DF_LOSS_DPACE_CONTVALUE: return "dpace-continuation-value-only";
  }
  return "?";
}

bool df_dflash_loss_type_parse(const char *s, df_dflash_loss_type *out) {
  for (int t = DF_LOSS_DFLASH; t <= DF_LOSS_DPACE_CONTVALUE; t++)
    if (s && !strcmp(s, df_dflash_loss_type_name((df_dflash_loss_type)t))) return *out = (df_dflash_loss_type)t, true;
  return false;
}

bool df_dflash_loss_type_is_dpace(df_dflash_loss_type t) { return t != DF_LOSS_DFLASH; }

df_dpace_mode df_dflash_dpace_mode(df_dflash_loss_type t) {
  switch (t) {
  case DF_LOSS_DPACE: return DF_DPACE_SUFFIX;
  case DF_LOSS_DPACE_CUMCONF: return DF_DPACE_PREFIX;
  case DF_LOSS_DPACE_CONTVALUE: return DF_DPACE_RATIO;
  case DF_LOSS_DFLASH: break;
  }
  return DF_DPACE_ONE;
}
