// draftforge's random streams: xoshiro256** seeded through splitmix64, with a Python twin in
// tools/reference/df_rng.py so the PyTorch reference draws the same numbers. State is 32 bytes: checkpointable.
#ifndef DF_BASE_RNG_H
#define DF_BASE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t s[4];
} df_rng;

// Named streams, so that e.g. anchor sampling never shifts parameter init.
enum { DF_RNG_STREAM_INIT = 1, DF_RNG_STREAM_DATA = 2, DF_RNG_STREAM_ANCHORS = 3 };

// state = four splitmix64 outputs starting from seed ^ (stream · 0xD1B54A32D192ED03).
void df_rng_init(df_rng *r, uint64_t seed, uint64_t stream);
uint64_t df_rng_next_u64(df_rng *r);
// Uniform in [0, 1): the top 53 bits of one draw.
double df_rng_uniform(df_rng *r);
// Standard normal by Box–Muller from two uniforms (one value per call; nothing cached).
double df_rng_normal(df_rng *r);
// Uniform integer in [0, n) as next_u64 % n (n > 0; the bias is below n / 2^64).
uint64_t df_rng_below(df_rng *r, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif
