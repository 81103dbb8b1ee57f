// The CPU kernels' exp: Cephes expf (~1 ulp) in plain float arithmetic, so the loops that call it vectorize
// (libm's expf stays scalar without -ffast-math, which made softmax and SiLU loops compute-bound).
#ifndef DF_KERNELS_CPU_VEXP_H
#define DF_KERNELS_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

// e^x for any x: x is clamped to [−87.3, 88.3], where 2^n stays a normal float (below, e^x ≈ 1e−38 instead
// of a denormal); a NaN x gives NaN. x = n·ln2 + r with |r| ≤ ln2/2; e^r by a degree-7 polynomial.
static inline float df_exp(float x) {
  float xc = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // Round to nearest with the 1.5·2²³ shifter: floorf/rintf would not vectorize without -ffast-math.
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f; // ln2 split hi/lo
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = ((int32_t)(n == n ? n : 0.0f) + 127) << 23; // 2^n; NaN kept out of the int conversion
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// For softmax arguments (logit − row max ≤ 0): exactly 0 below −87, so masked (−inf) scores weigh nothing.
static inline float df_exp_nonpos(float x) { return x < -87.0f ? 0.0f : df_exp(x); }

// One logits row z [V] in place: its max (returned) and first argmax (torch.argmax's tie rule), then
// z ← exp(z − max) and their double sum through *sum. The fused LM-head objectives share it (lmhead_dspark.c,
// lmhead_domino.c).
static inline float df_softmax_row_in_place(float *z, int64_t V, int64_t *argmax, double *sum) {
  float m = z[0];
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  int64_t a = 0;
  while (a < V - 1 && z[a] != m) a++;
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; v++) {
    z[v] = df_exp_nonpos(z[v] - m);
    s += (double)z[v];
  }
  *argmax = a, *sum = s;
  return m;
}

#endif
