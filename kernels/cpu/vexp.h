// exp for softmax loops: arguments are logits minus their row max (x <= 0). Plain float arithmetic so that
// loops calling it vectorize (libm's expf does not without -ffast-math); Cephes expf, ~1 ulp.
#ifndef DF_KERNELS_CPU_VEXP_H
#define DF_KERNELS_CPU_VEXP_H

#include <stdint.h>
#include <string.h>

// Below −87 the result is clamped to exp(−87) ≈ 1.6e−38, nothing against the row max's term of 1.
static inline float df_exp_nonpos(float x) {
  const float shifter = 12582912.0f; // 1.5·2²³: adding it rounds to an integer held in the low mantissa bits
  x = x < -87.0f ? -87.0f : x;
  float j = x * 1.44269504f + shifter;
  float n = j - shifter;
  float r = x - n * 0.693359375f + n * 2.12194440e-4f; // x − n·ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t jb;
  memcpy(&jb, &j, sizeof jb);
  int32_t sb = (jb - 0x4B400000 + 127) << 23; // 2^n as float bits
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  return p * scale;
}

#endif
