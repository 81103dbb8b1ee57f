// Balance controllers: none, and noaux_tc's aux-loss-free selection bias with its deferred sign update (an op).
#include "moe/balance.h"

df_status df_moe_balance_init(df_moe_balance_state *b, df_moe_balance kind, int64_t E, double rate, df_error *err) {
  *b = (df_moe_balance_state){.kind = kind, .E = E, .rate = (float)rate};
  if (kind == DF_MOE_BALANCE_NONE) return DF_OK;
  if (kind != DF_MOE_BALANCE_NOAUX_TC)
    return DF_FAIL(err, DF_ERR_INVALID, "balance", "use \"none\" or \"noaux_tc\"", "unknown balance controller %d",
                   (int)kind);
  if (!(rate >= 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "moe_bias_update_rate", "the bias update rate must be >= 0",
                   "moe_bias_update_rate = %g", rate);
  return DF_OK;
}

const float *df_moe_balance_shift(const df_moe_balance_state *b) {
  return b->kind == DF_MOE_BALANCE_NOAUX_TC ? b->bias : NULL;
}

df_status df_moe_balance_apply_pending(df_moe_balance_state *b, df_ctx *ctx, const df_collective *coll, df_error *err) {
  if (b->kind != DF_MOE_BALANCE_NOAUX_TC || !b->pending) return DF_OK;
  if (!b->bias || !b->stash)
    return DF_FAIL(err, DF_ERR_INVALID, "gate.balance.bias", "bind the layer before its first forward",
                   "the noaux_tc selection bias is not bound");
  b->pending = false;
  DF_TRY(df_allreduce(coll, b->stash, b->E, false, err));
  const df_device d = df_ctx_device(ctx);
  df_tensor load = df_f32_on(d, b->stash, b->E), bias = df_f32_on(d, b->bias, b->E);
  return df_moe_noaux_update(ctx, b->rate, &load, &bias, err);
}
