// CPU fill, scale and cast. bf16 is accepted here (fill and cast only) so the CPU can produce and read the bf16
// buffers a GPU run stores; every compute op stays fp32.
#include <math.h>
#include <string.h>

#include "kernels/check.h"

enum { EW_PAR_MIN = 1 << 16 };

static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

df_status df_cpu_fill(df_ctx *ctx, df_tensor *t, double value, df_error *err) {
  const int64_t n = df_numel(t);
  if (value == 0.0 && !signbit(value)) { // every dtype's zero is all-zero bytes; large buffers (a step's gradients)
    const size_t bytes = (size_t)n * df_dtype_size(t->dtype), chunk = (size_t)1 << 20; // are cleared by every thread
    const int64_t chunks = (int64_t)((bytes + chunk - 1) / chunk);
    char *p = t->data;
#pragma omp parallel for num_threads(df_ctx_num_threads(ctx)) schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
      const size_t off = (size_t)c * chunk;
      memset(p + off, 0, bytes - off < chunk ? bytes - off : chunk);
    }
    return DF_OK;
  }
  switch (t->dtype) {
  case DF_F32:
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = (float)value;
    break;
  case DF_F64:
    for (int64_t i = 0; i < n; i++) ((double *)t->data)[i] = value;
    break;
  case DF_BF16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)t->data)[i] = f32_to_bf16((float)value);
    break;
  case DF_I64:
    for (int64_t i = 0; i < n; i++) ((int64_t *)t->data)[i] = (int64_t)value;
    break;
  case DF_I32:
    for (int64_t i = 0; i < n; i++) ((int32_t *)t->data)[i] = (int32_t)value;
    break;
  case DF_U8:
  case DF_BOOL: memset(t->data, (int)(uint8_t)value, (size_t)n); break;
  case DF_F16: return DF_FAIL(err, DF_ERR_UNSUPPORTED, "t", "use f32 or bf16", "fill of an f16 tensor");
  }
  return DF_OK;
}

df_status df_cpu_scale(df_ctx *ctx, df_tensor *t, float alpha, df_error *err) {
  (void)err;
  const int64_t n = df_numel(t);
  float *p = t->data;
#pragma omp parallel for simd num_threads(ctx->num_threads) if (n > EW_PAR_MIN)
  for (int64_t i = 0; i < n; i++) p[i] *= alpha;
  return DF_OK;
}

df_status df_cpu_cast(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err) {
  (void)err;
  const int64_t n = df_numel(src);
  if (src->dtype == dst->dtype) {
    memmove(dst->data, src->data, (size_t)n * df_dtype_size(src->dtype));
    return DF_OK;
  }
  if (src->dtype == DF_F32) {
    const float *s = src->data;
    uint16_t *d = dst->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (n > EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
  } else {
    const uint16_t *s = src->data;
    float *d = dst->data;
#pragma omp parallel for num_threads(ctx->num_threads) if (n > EW_PAR_MIN)
    for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(s[i]);
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_elementwise(df_backend *be) {
  be->fill = df_cpu_fill;
  be->scale = df_cpu_scale;
  be->cast = df_cpu_cast;
}
