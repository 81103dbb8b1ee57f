// Balance controllers: none, and noaux_tc's aux-loss-free selection bias with its deferred sign update.
#include "moe/balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

df_status df_moe_allreduce(const df_moe_collective *c, float *buf, int64_t n, bool mean, df_error *err) {
  if (!c || !c->sum || c->world_size <= 1) return DF_OK;
  DF_TRY(c->sum(c->user, buf, n, err));
  if (mean)
    for (int64_t i = 0; i < n; i++) buf[i] /= (float)c->world_size;
  return DF_OK;
}

df_status df_moe_balance_init(df_moe_balance_state *b, df_moe_balance kind, int64_t E, double rate, df_error *err) {
  *b = (df_moe_balance_state){.kind = kind, .E = E, .rate = (float)rate};
  if (kind == DF_MOE_BALANCE_NONE) return DF_OK;
  if (kind != DF_MOE_BALANCE_NOAUX_TC)
    return DF_FAIL(err, DF_ERR_INVALID, "balance", "use \"none\" or \"noaux_tc\"", "unknown balance controller %d",
                   (int)kind);
  if (!(rate >= 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "moe_bias_update_rate", "the bias update rate must be >= 0",
                   "moe_bias_update_rate = %g", rate);
  b->stash = calloc((size_t)E, sizeof(float));
  if (!b->stash) return DF_FAIL(err, DF_ERR_NOMEM, "gate.balance.bias", NULL, "cannot allocate the load stash");
  return DF_OK;
}

void df_moe_balance_free(df_moe_balance_state *b) {
  free(b->stash);
  b->stash = NULL;
}

const float *df_moe_balance_shift(const df_moe_balance_state *b) {
  return b->kind == DF_MOE_BALANCE_NOAUX_TC ? b->bias : NULL;
}

void df_moe_balance_observe(df_moe_balance_state *b, const int32_t *counts) {
  if (b->kind != DF_MOE_BALANCE_NOAUX_TC) return;
  for (int64_t e = 0; e < b->E; e++) b->stash[e] = (float)counts[e];
  b->pending = true;
}

df_status df_moe_balance_apply_pending(df_moe_balance_state *b, const df_moe_collective *coll, df_error *err) {
  if (b->kind != DF_MOE_BALANCE_NOAUX_TC || !b->pending) return DF_OK;
  if (!b->bias)
    return DF_FAIL(err, DF_ERR_INVALID, "gate.balance.bias", "bind the layer before its first forward",
                   "the noaux_tc selection bias is not bound");
  b->pending = false;
  DF_TRY(df_moe_allreduce(coll, b->stash, b->E, false, err));
  double mean = 0.0;
  for (int64_t e = 0; e < b->E; e++) mean += b->stash[e];
  mean /= (double)b->E;
  for (int64_t e = 0; e < b->E; e++) {
    const double gap = mean - b->stash[e];
    const float sgn = gap > 0 ? 1.0f : (gap < 0 ? -1.0f : 0.0f);
    b->bias[e] += b->rate * sgn;
  }
  return DF_OK;
}

float df_moe_balance_bias_abs_max(const df_moe_balance_state *b) {
  const float *beta = df_moe_balance_shift(b);
  float m = 0.0f;
  for (int64_t e = 0; beta && e < b->E; e++) m = fabsf(beta[e]) > m ? fabsf(beta[e]) : m;
  return m;
}
