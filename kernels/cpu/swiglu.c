// CPU SwiGLU: h = silu(g')·u' with the optional GPT-OSS style clamp (g' = min(g, L), u' = clamp(u, ±L)).
// Elementwise in fp32; the clamp gradient follows torch.clamp (passes where min <= x <= max, inclusive).
// exp is a polynomial the compiler vectorizes: libm's expf stays scalar here and made the op compute-bound.
#include <stdint.h>
#include <string.h>

#include "kernels/check.h"

// Below this many elements a call stays on the calling thread.
#define SWIGLU_PAR_MIN 32768
// Elements per OpenMP work item (16 KiB per stream).
#define SWIGLU_SPAN 4096

// Written as a ternary (not fminf) so a NaN input stays NaN, as torch.clamp does.
static inline float clamp_hi(float x, float hi) { return x > hi ? hi : x; }
static inline float clamp_pm(float x, float lim) { return x > lim ? lim : (x < -lim ? -lim : x); }

// e^x to ~1 ulp (Cephes expf): x = n·ln2 + r, |r| <= ln2/2, e^r by a degree-7 polynomial, times 2^n built
// in the exponent bits. x is clamped to where 2^n stays a normal float; below, e^x is taken as ~1e-38
// instead of a denormal, which changes silu(x) = x / (1 + e^-x) by less than 1e-36 absolute.
// A NaN x maps to the upper bound (no UB in the int conversion); silu's own factor x keeps it NaN.
static inline float exp_poly(float x) {
  x = x < 88.3f ? x : 88.3f;
  x = x > -87.3f ? x : -87.3f;
  // Round to nearest with the 1.5·2^23 shifter: floorf would not vectorize without -ffast-math.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f; // ln2 split hi/lo
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + exp_poly(-x)); }

// One span of the forward: plain loops (outside the OpenMP region) so the compiler vectorizes them.
static void swiglu_forward_span(const float *g, const float *u, float limit, float *h, int64_t n) {
  if (limit > 0.0f)
    for (int64_t i = 0; i < n; i++) {
      const float a = clamp_hi(g[i], limit), b = clamp_pm(u[i], limit);
      h[i] = a * sigmoidf(a) * b;
    }
  else
    for (int64_t i = 0; i < n; i++) h[i] = g[i] * sigmoidf(g[i]) * u[i];
}

// d silu(a)/da = s·(1 + a·(1 − s)), s = sigmoid(a); a clipped input passes no gradient (0/1 mask).
static void swiglu_backward_span(const float *dh, const float *g, const float *u, float limit, float *dg, float *du,
                                 int64_t n) {
  if (limit > 0.0f)
    for (int64_t i = 0; i < n; i++) {
      const float gi = g[i], ui = u[i], d = dh[i];
      const float a = clamp_hi(gi, limit), b = clamp_pm(ui, limit), s = sigmoidf(a);
      const float pass_g = gi <= limit ? 1.0f : 0.0f;
      const float pass_u = ui >= -limit && ui <= limit ? 1.0f : 0.0f;
      dg[i] = pass_g * (d * b * (s * (1.0f + a * (1.0f - s))));
      du[i] = pass_u * (d * (a * s));
    }
  else
    for (int64_t i = 0; i < n; i++) {
      const float a = g[i], b = u[i], d = dh[i], s = sigmoidf(a);
      dg[i] = d * b * (s * (1.0f + a * (1.0f - s)));
      du[i] = d * (a * s);
    }
}

df_status df_cpu_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                                df_error *err) {
  (void)err;
  const int64_t n = df_numel(g);
  const float *gd = g->data, *ud = u->data; // [n], [n]
  float *hd = h->data;                      // [n]
#pragma omp parallel for num_threads(ctx->num_threads) if (n > SWIGLU_PAR_MIN) schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += SWIGLU_SPAN) {
    const int64_t len = n - i0 < SWIGLU_SPAN ? n - i0 : SWIGLU_SPAN;
    swiglu_forward_span(gd + i0, ud + i0, limit, hd + i0, len);
  }
  return DF_OK;
}

df_status df_cpu_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u, float limit,
                                 df_tensor *dg, df_tensor *du, df_error *err) {
  (void)err;
  const int64_t n = df_numel(g);
  const float *dhd = dh->data, *gd = g->data, *ud = u->data; // [n] each
  float *dgd = dg->data, *dud = du->data;                    // [n] each
#pragma omp parallel for num_threads(ctx->num_threads) if (n > SWIGLU_PAR_MIN) schedule(static)
  for (int64_t i0 = 0; i0 < n; i0 += SWIGLU_SPAN) {
    const int64_t len = n - i0 < SWIGLU_SPAN ? n - i0 : SWIGLU_SPAN;
    swiglu_backward_span(dhd + i0, gd + i0, ud + i0, limit, dgd + i0, dud + i0, len);
  }
  return DF_OK;
}
