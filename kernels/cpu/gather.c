// CPU row gather with holes (negative indices give zero rows; indices are range-checked before anything is
// written) and the strided 2-D copy.
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

static df_status cpu_copy_2d(df_ctx *ctx, const df_copy_2d_desc *c, const df_tensor *src, df_tensor *dst,
                             df_error *err) {
  (void)err;
  const float *s = (const float *)src->data + c->src_offset;
  float *d = (float *)dst->data + c->dst_offset;
  const int64_t rows = c->rows, cols = c->cols;
#pragma omp parallel for num_threads(ctx->num_threads) if (rows * cols > GATHER_PAR_MIN) schedule(static)
  for (int64_t i = 0; i < rows; i++) {
    const float *si = s + i * c->src_stride;
    float *di = d + i * c->dst_stride;
    if (c->accumulate)
      for (int64_t j = 0; j < cols; j++) di[j] += si[j];
    else
      memcpy(di, si, sizeof(float) * (size_t)cols);
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_gather(df_backend *be) {
  be->gather_rows = df_cpu_gather_rows;
  be->copy_2d = cpu_copy_2d;
}
