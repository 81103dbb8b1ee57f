// MoE balance controllers: the selection-score shift they own (never the combine weights) and its update,
// stashed by a training forward and applied at the start of the next one (noaux_tc), with the deferred updates
// all-reduced through base/collective.h.
#ifndef DF_MOE_BALANCE_H
#define DF_MOE_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/collective.h"
#include "base/error.h"
#include "kernels/ops_moe.h"
#include "moe/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Device memory: the bias is a parameter-table buffer, the stash the layer's device state (moe/layer.h); the
// training forward fills the stash (df_moe_route_stats' count_stash) and marks it pending.
typedef struct {
  df_moe_balance kind;
  int64_t E;
  float rate;   // noaux_tc step: |Δβ_e| <= rate per update
  float *bias;  // (E) β = gate.balance.bias (noaux_tc; bound by the layer), NULL for none
  float *stash; // (E) the last training forward's counts, as fp32 (the layer's device state)
  bool pending;
} df_moe_balance_state;

df_status df_moe_balance_init(df_moe_balance_state *b, df_moe_balance kind, int64_t E, double rate, df_error *err);

// The selection shift added to the scores before top-k: β for noaux_tc, NULL for none.
const float *df_moe_balance_shift(const df_moe_balance_state *b);
// Consumes the stash: load = counts all-reduced (SUM); β_e += rate · sign(mean_e(load) − load_e), sign(0) = 0
// (df_moe_noaux_update). A second call without a new stash does nothing.
df_status df_moe_balance_apply_pending(df_moe_balance_state *b, df_ctx *ctx, const df_collective *coll, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
