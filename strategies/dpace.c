// D-PACE (SpecForge `loss_type: dpace*`): the detached per-slot weights that turn the DFlash CE into an
// acceptance-aware objective (shared/reference/dflash-dspark.md §3.2), and the loss-type names.
#include <math.h>
#include <stdlib.h>

#include "strategies/dflash.h"

const char *df_dflash_loss_type_name(df_dflash_loss_type t) {
  switch (t) {
  case DF_LOSS_DFLASH: return "dflash";
  case DF_LOSS_DPACE: return "dpace";
  case DF_LOSS_DPACE_CUMCONF: return "dpace-cumulative-confidence-only";
  case DF_LOSS_DPACE_CONTVALUE: return "dpace-continuation-value-only";
  }
  return "?";
}

bool df_dflash_loss_type_is_dpace(df_dflash_loss_type t) { return t != DF_LOSS_DFLASH; }

// One block: prefix P (cumulative smoothed confidence) and suffix Σ_{j≥k} P_j·w_j, in double.
static void dpace_block(df_dflash_loss_type type, double alpha, const float *ce, const float *w, int64_t bs,
                        double *prefix, float *out) {
  double p = 1.0;
  for (int64_t k = 0; k < bs; k++) {
    double s = w[k] != 0.0f ? (1.0 - alpha) * exp(-(double)ce[k]) + alpha : 1.0;
    prefix[k] = p *= s;
  }
  double suffix = 0.0;
  for (int64_t k = bs - 1; k >= 0; k--) {
    suffix += prefix[k] * w[k];
    double v = type == DF_LOSS_DPACE_CUMCONF ? prefix[k]
               : type == DF_LOSS_DPACE       ? suffix
               : prefix[k] > 0               ? suffix / prefix[k]
                                             : 0.0; // P_k underflowed (α = 0 and a certain miss)
    out[k] = type == DF_LOSS_DFLASH ? 1.0f : (float)v;
  }
}

df_status df_dpace_weights(df_dflash_loss_type type, double alpha, const float *ce, const float *w, int64_t nblocks,
                           int64_t bs, float *out, df_error *err) {
  double prefix_small[64];
  double *prefix = bs <= 64 ? prefix_small : malloc((size_t)bs * sizeof *prefix);
  if (!prefix) return DF_FAIL(err, DF_ERR_NOMEM, "dpace", NULL, "out of memory for a block of %lld", (long long)bs);
  for (int64_t i = 0; i < nblocks; i++) dpace_block(type, alpha, ce + i * bs, w + i * bs, bs, prefix, out + i * bs);
  if (prefix != prefix_small) free(prefix);
  return DF_OK;
}
