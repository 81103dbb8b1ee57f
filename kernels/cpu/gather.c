// CPU row gather with holes (negative indices give zero rows). Indices are range-checked before anything is
// written.
#include <string.h>

#include "kernels/check.h"

enum { GATHER_PAR_MIN = 32768 };

df_status df_cpu_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out, df_error *err) {
  const int64_t N = src->shape[0], H = src->shape[1], R = df_numel(idx);
  const int32_t *ix = idx->data;
  for (int64_t r = 0; r < R; r++)
    if (ix[r] >= N)
      return DF_FAIL(err, DF_ERR_INVALID, "idx", "indices address rows of src (negative: a zero row)",
                     "idx[%lld] = %d is outside [0, %lld)", (long long)r, ix[r], (long long)N);
  const float *s = src->data;
  float *o = out->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (R * H > GATHER_PAR_MIN) schedule(static)
  for (int64_t r = 0; r < R; r++) {
    if (ix[r] < 0)
      memset(o + r * H, 0, sizeof(float) * (size_t)H);
    else
      memcpy(o + r * H, s + (int64_t)ix[r] * H, sizeof(float) * (size_t)H);
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_gather(df_backend *be) { be->gather_rows = df_cpu_gather_rows; }
