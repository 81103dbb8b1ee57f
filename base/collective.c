// The data-parallel all-reduce hook (base/collective.h).
#include "base/collective.h"

df_status df_allreduce_host(const df_collective *c, float *buf, int64_t n, bool mean, df_error *err) {
  if (!c || !c->sum || c->world_size <= 1) return DF_OK;
  DF_TRY((c->sum_host ? c->sum_host : c->sum)(c->user, buf, n, err));
  if (mean)
    for (int64_t i = 0; i < n; i++) buf[i] /= (float)c->world_size;
  return DF_OK;
}

df_status df_allreduce(const df_collective *c, float *buf, int64_t n, bool mean, df_error *err) {
  if (!c || !c->sum || c->world_size <= 1) return DF_OK;
  DF_TRY(c->sum(c->user, buf, n, err));
  if (mean)
    for (int64_t i = 0; i < n; i++) buf[i] /= (float)c->world_size;
  return DF_OK;
}
