// CPU SwiGLU: h = silu(g')·u' with the optional GPT-OSS style clamp (g' = min(g, L), u' = clamp(u, ±L)).
// Elementwise in fp32; the clamp gradient follows torch.clamp (passes where min <= x <= max, inclusive).
// exp is a polynomial the compiler vectorizes: libm's expf stays scalar here and made the op compute-bound.
#include <stdint.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/vexp.h"

// Below this many elements a call stays on the calling thread.
#define SWIGLU_PAR_MIN 32768
// Elements per OpenMP work item (16 KiB per stream).
#define SWIGLU_SPAN 4096

// Written as a ternary (not fminf) so a NaN input stays NaN, as torch.clamp does.
static inline float clamp_hi(float x, float hi) { return x > hi ? hi : x; }
static inline float clamp_pm(float x, float lim) { return x > lim ? lim : (x < -lim ? -lim : x); }

static inline float sigmoidf(float x) { return 1.0f / (1.0f + df_exp(-x)); }

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

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_swiglu(df_backend *be) {
  be->swiglu_forward = df_cpu_swiglu_forward;
  be->swiglu_backward = df_cpu_swiglu_backward;
}
