// The tile schedule of the block-sparse DFlash attention on the GPU, as plain inline functions that the CUDA
// kernels (kernels/cuda/attention*.cu) and a CPU test (tests/kernels/test_attn_tiles.c) both compile, so the
// index mapping the kernels rely on is checked on every machine.
//
// Forward and dQ: one query tile per (sample b, block n, kv head g, row chunk): the G·bs rows of block n's query
// heads that read kv head g (row r: head g·G + r/bs, block offset r%bs), at most DF_ATTN_QT of them. It walks
// the context keys [lo, anchor) in DF_ATTN_KT-key tiles starting at lo, then its own block's keys: exactly the
// tiles holding a visible key, never the dense mask. dK/dV: one key tile per (b, g, aligned DF_ATTN_KT-key slice of
// the context, or slice of one block's keys); a context tile is visited by every kept block whose visible range
// [lo, anchor) meets it, in block order; a block's key tile only by that block.
#ifndef DF_KERNELS_ATTN_TILES_H
#define DF_KERNELS_ATTN_TILES_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DF_ATTN_FN static inline __host__ __device__
#else
#define DF_ATTN_FN static inline
#endif

#define DF_ATTN_QT ((int64_t)64) // query rows per tile
#define DF_ATTN_KT ((int64_t)64) // keys per tile

typedef struct {
  bool block;    // the block's own keys (offsets j0..), else context keys j0..
  int64_t j0, n; // first key and count (n <= DF_ATTN_KT)
} df_attn_tile;

// First context key any row of a block with this anchor sees: a − (W − 1) with a window W > 0, else 0.
DF_ATTN_FN int64_t df_attn_ctx_lo(int64_t anchor, int64_t window) {
  int64_t lo = window > 0 ? anchor - (window - 1) : 0;
  return lo > 0 ? lo : 0;
}

// Whether query offset o of a block with this anchor sees key j: a context key (block false) or the block's own
// key at offset j. The element predicate of kernels/ops.h.
DF_ATTN_FN bool df_attn_visible(int64_t anchor, int64_t window, int64_t bs, int64_t o, bool block, int64_t j) {
  if (block) return j >= 0 && j < bs && (window == 0 || j <= o);
  return j >= 0 && j < anchor && (window == 0 || j >= anchor + o - (window - 1));
}

DF_ATTN_FN int64_t df_attn_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Forward / dQ: the number of key tiles of a kept block, then tile i of them (context tiles first).
DF_ATTN_FN int64_t df_attn_fwd_ntiles(int64_t anchor, int64_t window, int64_t bs) {
  int64_t lo = df_attn_ctx_lo(anchor, window);
  return (anchor > lo ? df_attn_ceil(anchor - lo, DF_ATTN_KT) : 0) + df_attn_ceil(bs, DF_ATTN_KT);
}

DF_ATTN_FN df_attn_tile df_attn_fwd_tile(int64_t i, int64_t anchor, int64_t window, int64_t bs) {
  int64_t lo = df_attn_ctx_lo(anchor, window);
  int64_t nctx = anchor > lo ? df_attn_ceil(anchor - lo, DF_ATTN_KT) : 0;
  df_attn_tile t;
  if (i < nctx) {
    t.block = false, t.j0 = lo + i * DF_ATTN_KT;
    t.n = anchor - t.j0 < DF_ATTN_KT ? anchor - t.j0 : DF_ATTN_KT;
  } else {
    t.block = true, t.j0 = (i - nctx) * DF_ATTN_KT;
    t.n = bs - t.j0 < DF_ATTN_KT ? bs - t.j0 : DF_ATTN_KT;
  }
  return t;
}

// Query row chunks of one (b, n, g): ceil(G·bs / DF_ATTN_QT).
DF_ATTN_FN int64_t df_attn_row_chunks(int64_t G, int64_t bs) { return df_attn_ceil(G * bs, DF_ATTN_QT); }

// dK/dV: key tiles of one (b, g): the context in aligned slices, then every block's keys in slices.
DF_ATTN_FN int64_t df_attn_key_tiles(int64_t S, int64_t N, int64_t bs) {
  return df_attn_ceil(S, DF_ATTN_KT) + N * df_attn_ceil(bs, DF_ATTN_KT);
}

// Key tile i of a (b, g); *owner is the block whose keys it holds (−1 for a context tile).
DF_ATTN_FN df_attn_tile df_attn_key_tile(int64_t i, int64_t S, int64_t bs, int64_t *owner) {
  int64_t nct = df_attn_ceil(S, DF_ATTN_KT), per = df_attn_ceil(bs, DF_ATTN_KT);
  df_attn_tile t;
  if (i < nct) {
    *owner = -1;
    t.block = false, t.j0 = i * DF_ATTN_KT;
    t.n = S - t.j0 < DF_ATTN_KT ? S - t.j0 : DF_ATTN_KT;
  } else {
    *owner = (i - nct) / per;
    t.block = true, t.j0 = (i - nct) % per * DF_ATTN_KT;
    t.n = bs - t.j0 < DF_ATTN_KT ? bs - t.j0 : DF_ATTN_KT;
  }
  return t;
}

// Whether the dK/dV pass of key tile t (of owner block `owner`, −1 for context) visits block n.
DF_ATTN_FN bool df_attn_key_tile_visits(const df_attn_tile *t, int64_t owner, int64_t n, bool keep, int64_t anchor,
                                        int64_t window) {
  if (!keep) return false;
  if (t->block) return owner == n;
  int64_t lo = df_attn_ctx_lo(anchor, window);
  return lo < t->j0 + t->n && anchor > t->j0 && anchor > lo;
}

#endif
