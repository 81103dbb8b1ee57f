// CPU rotary embedding, NeoX rotate-half (HF Qwen3): per token, cos/sin of fp32(pos)·inv_freq[i] are
// computed once (fp32 angle as HF's float matmul; sinf/cosf are glibc's, < 1 ulp) and applied to every
// head. The backward is the same rotation by the negated angle.
#include <math.h>

#include "kernels/check.h"

// Below this many elements a call stays on the calling thread.
#define ROPE_PAR_MIN 16384
// Frequencies handled per pass over the heads (the cos/sin scratch lives on the stack).
#define ROPE_CHUNK 128

// Rotates the two halves x1 = row[0:h], x2 = row[h:2h] into y1, y2 by (c, s) per frequency. y may be x:
// every iteration reads x1[i], x2[i] before writing y1[i], y2[i] and touches nothing else, hence the simd.
static void rotate_halves(const float *x1, const float *x2, float *y1, float *y2, const float *c, const float *s,
                          int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    const float a = x1[i], b = x2[i];
    y1[i] = a * c[i] - b * s[i];
    y2[i] = b * c[i] + a * s[i];
  }
}

// sign = +1 forward, −1 backward (the transposed rotation).
static void rope_apply(df_ctx *ctx, const float *xd, const int32_t *pos, const float *inv_freq, float mscale,
                       float sign, float *yd, int64_t tokens, int64_t heads, int64_t hd) {
  const int64_t half = hd / 2;
#pragma omp parallel for num_threads(ctx->num_threads) if (tokens * heads * hd > ROPE_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < tokens; t++) {
    const float p = (float)pos[t];
    float c[ROPE_CHUNK], s[ROPE_CHUNK]; // cos, sin of this token's angles, times mscale
    for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
      const int64_t n = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
      for (int64_t i = 0; i < n; i++) {
        const float angle = p * inv_freq[i0 + i];
        // HF scales the fp32 cos/sin tables by attention_scaling, so round first, then multiply.
        c[i] = cosf(angle) * mscale;
        s[i] = sign * (sinf(angle) * mscale);
      }
      for (int64_t h = 0; h < heads; h++) {
        const int64_t o = (t * heads + h) * hd + i0;
        rotate_halves(xd + o, xd + o + half, yd + o, yd + o + half, c, s, n);
      }
    }
  }
}

df_status df_cpu_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                              float mscale, df_tensor *y, df_error *err) {
  (void)err;
  // x, y [T, nh, hd]; pos [T]; inv_freq [hd/2]
  rope_apply(ctx, x->data, pos->data, inv_freq->data, mscale, 1.0f, y->data, x->shape[0], x->shape[1], x->shape[2]);
  return DF_OK;
}

df_status df_cpu_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                               float mscale, df_tensor *dx, df_error *err) {
  (void)err;
  // dy, dx [T, nh, hd]
  rope_apply(ctx, dy->data, pos->data, inv_freq->data, mscale, -1.0f, dx->data, dy->shape[0], dy->shape[1],
             dy->shape[2]);
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_rope(df_backend *be) {
  be->rope_forward = df_cpu_rope_forward;
  be->rope_backward = df_cpu_rope_backward;
}
