// bfloat16 of the CUDA emulator: CUDA's storage type and conversions, with CUDA's host rounding (round to
// nearest even; NaN becomes the canonical quiet NaN 0x7fff, as cuda_bf16.hpp's host path does).
#ifndef DF_EMU_CUDA_BF16_H
#define DF_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

#ifdef __cplusplus

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f);
  operator float() const;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline unsigned short df_emu_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

static inline float df_emu_bf16_float(unsigned short bits) {
  uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

inline __nv_bfloat16::__nv_bfloat16(float f) : __x(df_emu_bf16_bits(f)) {}
inline __nv_bfloat16::operator float() const { return df_emu_bf16_float(__x); }

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 h;
  h.__x = df_emu_bf16_bits(f);
  return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return df_emu_bf16_float(h.__x); }

#else

typedef struct {
  unsigned short __x;
} __nv_bfloat16;

#endif

#endif
