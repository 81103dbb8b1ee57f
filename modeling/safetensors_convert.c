// Safetensors dtypes: names, sizes, and bit-exact conversions to and from fp32.
#include <math.h>
#include <string.h>

#include "modeling/safetensors.h"

static const struct {
  const char *name;
  size_t size;
  bool is_float;
} st_dtypes[DF_ST_NUM_DTYPES] = {
    [DF_ST_F64] = {"F64", 8, true},         [DF_ST_F32] = {"F32", 4, true},
    [DF_ST_F16] = {"F16", 2, true},         [DF_ST_BF16] = {"BF16", 2, true},
    [DF_ST_F8_E4M3] = {"F8_E4M3", 1, true}, [DF_ST_F8_E5M2] = {"F8_E5M2", 1, true},
    [DF_ST_F8_E8M0] = {"F8_E8M0", 1, true}, [DF_ST_I64] = {"I64", 8, false},
    [DF_ST_I32] = {"I32", 4, false},        [DF_ST_I16] = {"I16", 2, false},
    [DF_ST_I8] = {"I8", 1, false},          [DF_ST_U64] = {"U64", 8, false},
    [DF_ST_U32] = {"U32", 4, false},        [DF_ST_U16] = {"U16", 2, false},
    [DF_ST_U8] = {"U8", 1, false},          [DF_ST_BOOL] = {"BOOL", 1, false},
};

const char *df_st_dtype_name(df_st_dtype dt) { return (unsigned)dt < DF_ST_NUM_DTYPES ? st_dtypes[dt].name : "?"; }

size_t df_st_dtype_size(df_st_dtype dt) { return (unsigned)dt < DF_ST_NUM_DTYPES ? st_dtypes[dt].size : 0; }

bool df_st_dtype_is_float(df_st_dtype dt) { return (unsigned)dt < DF_ST_NUM_DTYPES && st_dtypes[dt].is_float; }

bool df_st_dtype_from_name(const char *name, df_st_dtype *out) {
  for (int i = 0; i < DF_ST_NUM_DTYPES; i++)
    if (!strcmp(name, st_dtypes[i].name)) {
      *out = (df_st_dtype)i;
      return true;
    }
  return false;
}

bool df_st_dtype_to_df(df_st_dtype dt, df_dtype *out) {
  switch (dt) {
  case DF_ST_F64: *out = DF_F64; return true;
  case DF_ST_F32: *out = DF_F32; return true;
  case DF_ST_F16: *out = DF_F16; return true;
  case DF_ST_BF16: *out = DF_BF16; return true;
  case DF_ST_I64: *out = DF_I64; return true;
  case DF_ST_I32: *out = DF_I32; return true;
  case DF_ST_U8: *out = DF_U8; return true;
  case DF_ST_BOOL: *out = DF_BOOL; return true;
  default: return false;
  }
}

df_st_dtype df_st_dtype_from_df(df_dtype dt) {
  switch (dt) {
  case DF_F64: return DF_ST_F64;
  case DF_F32: return DF_ST_F32;
  case DF_F16: return DF_ST_F16;
  case DF_BF16: return DF_ST_BF16;
  case DF_I64: return DF_ST_I64;
  case DF_I32: return DF_ST_I32;
  case DF_U8: return DF_ST_U8;
  case DF_BOOL: return DF_ST_BOOL;
  }
  return DF_ST_F32;
}

static float f32_from_bits(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint32_t bits_from_f32(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

float df_st_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t df_st_f32_to_bf16(float f) {
  uint32_t x = bits_from_f32(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u); // NaN: keep sign, force quiet
  x += 0x7FFFu + ((x >> 16) & 1u);                                           // round to nearest, ties to even
  return (uint16_t)(x >> 16);
}

float df_st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e) return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  float v = ldexpf((float)m, -24); // subnormal (or zero): exact in fp32
  return sign ? -v : v;
}

uint16_t df_st_f32_to_f16(float f) {
  uint32_t x = bits_from_f32(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu)); // NaN stays NaN
  if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);                        // ≥ 65520 rounds to infinity
  if (ax >= 0x38800000u) { // normal half: rebias, round 13 bits away
    uint32_t r = ax - 0x38000000u;
    return (uint16_t)(sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (ax <= 0x33000000u) return (uint16_t)sign; // ≤ 2^-25: ties to even give zero
  uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) r++;
  return (uint16_t)(sign | r);
}

static float f8e4m3_to_f32(uint8_t b) {
  uint32_t e = (b >> 3) & 0xFu, m = b & 0x7u;
  if (e == 0xF && m == 0x7) return NAN;
  float v = e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
  return (b & 0x80u) ? -v : v;
}

static float f8e8m0_to_f32(uint8_t b) { return b == 0xFF ? NAN : ldexpf(1.0f, (int)b - 127); }

// Loads through memcpy: mmap'd tensors carry no alignment promise.
#define CONVERT_LOOP(T, expr)                                                                                          \
  do {                                                                                                                 \
    for (int64_t i = 0; i < n; i++) {                                                                                  \
      T v;                                                                                                             \
      memcpy(&v, s + i * (int64_t)sizeof(T), sizeof(T));                                                               \
      dst[i] = (expr);                                                                                                 \
    }                                                                                                                  \
  } while (0)

void df_st_convert_to_f32(df_st_dtype dt, const void *src, float *dst, int64_t n) {
  const unsigned char *s = src;
  switch (dt) {
  case DF_ST_F32: memcpy(dst, src, (size_t)n * 4); break;
  case DF_ST_F64: CONVERT_LOOP(double, (float)v); break;
  case DF_ST_F16: CONVERT_LOOP(uint16_t, df_st_f16_to_f32(v)); break;
  case DF_ST_BF16: CONVERT_LOOP(uint16_t, df_st_bf16_to_f32(v)); break;
  case DF_ST_F8_E4M3: CONVERT_LOOP(uint8_t, f8e4m3_to_f32(v)); break;
  case DF_ST_F8_E5M2: CONVERT_LOOP(uint8_t, df_st_f16_to_f32((uint16_t)(v << 8))); break;
  case DF_ST_F8_E8M0: CONVERT_LOOP(uint8_t, f8e8m0_to_f32(v)); break;
  case DF_ST_I64: CONVERT_LOOP(int64_t, (float)v); break;
  case DF_ST_I32: CONVERT_LOOP(int32_t, (float)v); break;
  case DF_ST_I16: CONVERT_LOOP(int16_t, (float)v); break;
  case DF_ST_I8: CONVERT_LOOP(int8_t, (float)v); break;
  case DF_ST_U64: CONVERT_LOOP(uint64_t, (float)v); break;
  case DF_ST_U32: CONVERT_LOOP(uint32_t, (float)v); break;
  case DF_ST_U16: CONVERT_LOOP(uint16_t, (float)v); break;
  case DF_ST_U8: CONVERT_LOOP(uint8_t, (float)v); break;
  case DF_ST_BOOL: CONVERT_LOOP(uint8_t, v ? 1.0f : 0.0f); break;
  case DF_ST_NUM_DTYPES: break;
  }
}

bool df_st_convert_from_f32(df_st_dtype dt, const float *src, void *dst, int64_t n) {
  unsigned char *d = dst;
  for (int64_t i = 0; i < n && dt != DF_ST_F32; i++) {
    if (dt == DF_ST_F64) {
      double v = src[i];
      memcpy(d + i * 8, &v, 8);
    } else if (dt == DF_ST_BF16 || dt == DF_ST_F16) {
      uint16_t v = dt == DF_ST_BF16 ? df_st_f32_to_bf16(src[i]) : df_st_f32_to_f16(src[i]);
      memcpy(d + i * 2, &v, 2);
    } else {
      return false;
    }
  }
  if (dt == DF_ST_F32) memcpy(dst, src, (size_t)n * 4);
  return true;
}
