// The GPU attention's tile schedule (kernels/attn_tiles.h), checked on the CPU against the DFlash mask built densely
// here from its definition in kernels/ops.h: the forward / dQ tiles of a kept block cover exactly its visible keys,
// each once, and hold no tile without a visible key; the dK/dV key tiles partition every key of a sample, and a key
// tile visits a block exactly when one of the block's queries sees one of its keys.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attn_tiles.h"

// kernels/ops.h: query (block n, offset o) sees context key j iff j < a (and j >= a + o − (W − 1) with W > 0), and
// block key o' of its own block for every o' (o' <= o with a window). Key index: j < S context, S + n·bs + o' block.
static bool mask_visible(int64_t S, int64_t bs, int64_t W, int64_t a, int64_t n, int64_t o, int64_t key) {
  if (key < S) return key < a && (W == 0 || key >= a + o - (W - 1));
  const int64_t t = key - S;
  return t / bs == n && (W == 0 || t % bs <= o);
}

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

typedef struct {
  int64_t S, N, bs, W;
  int32_t anchors[64];
  uint8_t keep[64];
} tcase;

static tcase random_case(uint64_t seed) {
  uint64_t s = seed;
  tcase c;
  c.S = (int64_t)(rng_next(&s) % 300);
  c.N = 1 + (int64_t)(rng_next(&s) % 12);
  const int64_t bss[] = {1, 3, 4, 16, 64, 65, 100};
  c.bs = bss[rng_next(&s) % 7];
  const int64_t ws[] = {0, 0, 1, 2, 7, 64, 65, 500};
  c.W = ws[rng_next(&s) % 8];
  for (int64_t n = 0; n < c.N; n++) {
    c.anchors[n] = c.S > 0 ? (int32_t)(rng_next(&s) % (uint64_t)c.S) : 0;
    if (n % 5 == 1) c.anchors[n] = c.S > 0 ? (int32_t)(c.S - 1) : 0; // the last context key
    c.keep[n] = rng_next(&s) % 4 != 0;
  }
  return c;
}

// Forward / dQ: per kept block, the tiles' keys ∩ the element predicate == the block's visible set, each key once.
static void check_forward(const tcase *c) {
  const int64_t KV = c->S + c->N * c->bs;
  int *hits = malloc(sizeof(int) * (size_t)KV);
  for (int64_t n = 0; n < c->N; n++) {
    if (!c->keep[n]) continue;
    const int64_t a = c->anchors[n], nt = df_attn_fwd_ntiles(a, c->W, c->bs);
    memset(hits, 0, sizeof(int) * (size_t)KV);
    for (int64_t i = 0; i < nt; i++) {
      const df_attn_tile t = df_attn_fwd_tile(i, a, c->W, c->bs);
      cr_assert(t.n >= 1 && t.n <= DF_ATTN_KT, "tile %lld of block %lld has %lld keys", (long long)i, (long long)n,
                (long long)t.n);
      bool any = false;
      for (int64_t x = 0; x < t.n; x++) {
        const int64_t key = t.block ? c->S + n * c->bs + t.j0 + x : t.j0 + x;
        cr_assert(key >= 0 && key < KV, "tile key %lld out of range", (long long)key);
        hits[key]++;
        for (int64_t o = 0; o < c->bs; o++) {
          const bool vis = df_attn_visible(a, c->W, c->bs, o, t.block, t.j0 + x);
          cr_assert_eq(vis, mask_visible(c->S, c->bs, c->W, a, n, o, key),
                       "predicate differs from the mask: block %lld offset %lld key %lld", (long long)n, (long long)o,
                       (long long)key);
          any = any || vis;
        }
      }
      cr_expect(any, "block %lld tile %lld holds no visible key (wasted work)", (long long)n, (long long)i);
    }
    for (int64_t key = 0; key < KV; key++) {
      bool seen = false;
      for (int64_t o = 0; o < c->bs; o++) seen = seen || mask_visible(c->S, c->bs, c->W, a, n, o, key);
      if (seen)
        cr_expect_eq(hits[key], 1, "visible key %lld of block %lld visited %d times", (long long)key, (long long)n,
                     hits[key]);
      else
        cr_expect_eq(hits[key], 0, "invisible key %lld of block %lld visited", (long long)key, (long long)n);
    }
  }
  free(hits);
}

// dK/dV: the key tiles partition every sample's keys; visits == "some query of the block sees a key of the tile".
static void check_backward(const tcase *c) {
  const int64_t KV = c->S + c->N * c->bs, nt = df_attn_key_tiles(c->S, c->N, c->bs);
  int *hits = calloc((size_t)KV, sizeof(int));
  for (int64_t i = 0; i < nt; i++) {
    int64_t owner = -2;
    const df_attn_tile t = df_attn_key_tile(i, c->S, c->bs, &owner);
    cr_assert(t.n >= 1 && t.n <= DF_ATTN_KT, "key tile %lld has %lld keys", (long long)i, (long long)t.n);
    cr_assert(t.block ? owner >= 0 && owner < c->N : owner == -1, "key tile %lld owner %lld", (long long)i,
              (long long)owner);
    for (int64_t x = 0; x < t.n; x++) hits[t.block ? c->S + owner * c->bs + t.j0 + x : t.j0 + x]++;
    for (int64_t n = 0; n < c->N; n++) {
      bool needed = false;
      for (int64_t x = 0; x < t.n && c->keep[n]; x++)
        for (int64_t o = 0; o < c->bs; o++) {
          const int64_t key = t.block ? c->S + owner * c->bs + t.j0 + x : t.j0 + x;
          needed = needed || mask_visible(c->S, c->bs, c->W, c->anchors[n], n, o, key);
        }
      cr_expect_eq(df_attn_key_tile_visits(&t, owner, n, c->keep[n] != 0, c->anchors[n], c->W), needed,
                   "key tile %lld (j0 %lld, block %d) vs block %lld: visits must equal 'a query sees a key'",
                   (long long)i, (long long)t.j0, t.block, (long long)n);
    }
  }
  for (int64_t key = 0; key < KV; key++)
    cr_expect_eq(hits[key], 1, "key %lld in %d key tiles", (long long)key, hits[key]);
  free(hits);
}

Test(attn_tiles, forward_tiles_cover_exactly_the_visible_keys) {
  for (uint64_t seed = 1; seed <= 400; seed++) {
    tcase c = random_case(seed);
    check_forward(&c);
  }
}

Test(attn_tiles, key_tiles_partition_and_visit_exactly_the_needed_blocks) {
  for (uint64_t seed = 1; seed <= 400; seed++) {
    tcase c = random_case(seed);
    check_backward(&c);
  }
}

// The Qwen3-8B training shape: 512 sorted anchors × 16 over S 3072. The tiles hold the visible keys and almost
// nothing else: per block at most one partial context tile and the block's own tile.
Test(attn_tiles, training_shape_skips_the_masked_work) {
  const int64_t S = 3072, N = 512, bs = 16;
  int64_t visible_ctx = 0, tiled_ctx = 0;
  for (int64_t n = 0; n < N; n++) {
    const int64_t a = 1 + n * (S - 1) / N, nt = df_attn_fwd_ntiles(a, 0, bs);
    visible_ctx += a;
    for (int64_t i = 0; i < nt; i++) {
      const df_attn_tile t = df_attn_fwd_tile(i, a, 0, bs);
      if (!t.block) tiled_ctx += t.n;
    }
    cr_expect_eq(nt, (a + DF_ATTN_KT - 1) / DF_ATTN_KT + 1, "block %lld", (long long)n);
  }
  cr_expect_eq(tiled_ctx, visible_ctx, "context keys walked must equal the visible ones");
}
