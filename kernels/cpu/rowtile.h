// Row tiling of the fused DSpark LM-head kernel (lmhead_dspark.c; lmhead_ce.c uses only the label check and the
// constants). Rows are grouped into whole 48-row blocks of the global row index, row r always in slot r mod 48,
// because OpenBLAS's sgemm rounds a row differently depending on its place in the micro-kernel's row group: that
// keeps every per-row output bitwise independent of chunk_rows and the thread count. (kernels/cpu/gemm.h has no
// such dependence.)
#ifndef DF_KERNELS_CPU_ROWTILE_H
#define DF_KERNELS_CPU_ROWTILE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

enum {
  DF_RT_BLOCK = 48,      // rows per aligned block: a multiple of every sgemm micro-kernel height
  DF_RT_TILE_BLOCKS = 5, // blocks per tile at most (240 rows): tall enough to amortize repacking head per call
  DF_RT_PAD = 16,        // floats; scratch rows start 64-byte aligned
};
#define DF_RT_SCRATCH_BYTES ((size_t)48 << 20) // per-thread logits scratch cap (V = 152k: one block per tile)

typedef struct {
  int64_t c0, c1;       // rows [c0, c1)
  int64_t first, count; // its live blocks: blocks[first .. first + count)
} df_rt_chunk;

typedef struct {
  const int32_t *labels; // [R]; negative labels mark skipped rows
  int64_t R;
  int64_t tile_blocks; // blocks per tile
  df_rt_chunk *chunks;
  int64_t nchunks;
  int64_t *blocks; // block indices (row / DF_RT_BLOCK), chunk by chunk
} df_rt_plan;

static inline int64_t df_rt_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t df_rt_min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Row r takes part in chunk ch when it lies there and has a label.
static inline bool df_rt_row_live(const df_rt_plan *p, int64_t r, const df_rt_chunk *ch) {
  return r >= ch->c0 && r < ch->c1 && p->labels[r] >= 0;
}

// The global row in slot i of a tile made of `blocks`.
static inline int64_t df_rt_tile_row(const int64_t *blocks, int64_t i) {
  return blocks[i / DF_RT_BLOCK] * DF_RT_BLOCK + i % DF_RT_BLOCK;
}

static inline int64_t df_rt_ntiles(const df_rt_plan *p, const df_rt_chunk *ch) {
  return (ch->count + p->tile_blocks - 1) / p->tile_blocks;
}

// Labels must index the vocabulary; `skip` names what a negative label does in the hint ("ignore", "skip").
df_status df_rt_check_labels(const int32_t *labels, int64_t R, int64_t V, const char *skip, df_error *err);

// Splits R rows into chunks of chunk_rows (<= 0 or >= R: one chunk) and lists, chunk by chunk, the blocks holding
// a labelled row. Tiles are sized so every thread gets work, tiles stay tall, and `logit_sets` [tile, V] sets
// fit the scratch cap. R > 0. Free with df_rt_plan_free.
df_status df_rt_plan_init(df_rt_plan *p, const int32_t *labels, int64_t R, int64_t chunk_rows, int64_t V,
                          int logit_sets, int nthreads, const char *op, df_error *err);
void df_rt_plan_free(df_rt_plan *p);

// Threads worth starting: no more than the most tiles any chunk has (0 when no row has a label).
int df_rt_team_size(const df_rt_plan *p, int nthreads);

#endif
