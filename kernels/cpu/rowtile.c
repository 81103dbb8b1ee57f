#include "kernels/cpu/rowtile.h"

#include <stdio.h>
#include <stdlib.h>

df_status df_rt_check_labels(const int32_t *labels, int64_t R, int64_t V, const char *skip, df_error *err) {
  char hint[80];
  snprintf(hint, sizeof hint, "labels must be < V; use a negative label to %s a row", skip);
  for (int64_t r = 0; r < R; r++)
    if (labels[r] >= V)
      return DF_FAIL(err, DF_ERR_INVALID, "labels", hint, "labels[%lld] = %d is outside the vocabulary [0, %lld)",
                     (long long)r, labels[r], (long long)V);
  return DF_OK;
}

static int64_t pick_tile_blocks(int64_t chunk_rows, int64_t V, int logit_sets, int nthreads) {
  int64_t per_chunk = chunk_rows / DF_RT_BLOCK + 2; // a chunk may straddle two partial blocks
  int64_t t = (per_chunk + nthreads - 1) / nthreads;
  int64_t cap = (int64_t)(DF_RT_SCRATCH_BYTES / sizeof(float)) / (V * DF_RT_BLOCK * logit_sets);
  t = df_rt_min64(df_rt_min64(t, DF_RT_TILE_BLOCKS), cap);
  return t < 1 ? 1 : t;
}

static void plan_chunks(df_rt_plan *p, int64_t chunk_rows) {
  int64_t nb = 0;
  for (int64_t c = 0; c < p->nchunks; c++) {
    df_rt_chunk *ch = &p->chunks[c];
    ch->c0 = c * chunk_rows, ch->c1 = df_rt_min64(ch->c0 + chunk_rows, p->R), ch->first = nb;
    for (int64_t b = ch->c0 / DF_RT_BLOCK; b * DF_RT_BLOCK < ch->c1; b++) {
      int64_t r = b * DF_RT_BLOCK, end = df_rt_min64(r + DF_RT_BLOCK, ch->c1);
      while (r < end && !df_rt_row_live(p, r, ch)) r++;
      if (r < end) p->blocks[nb++] = b;
    }
    ch->count = nb - ch->first;
  }
}

df_status df_rt_plan_init(df_rt_plan *p, const int32_t *labels, int64_t R, int64_t chunk_rows, int64_t V,
                          int logit_sets, int nthreads, const char *op, df_error *err) {
  if (chunk_rows <= 0 || chunk_rows > R) chunk_rows = R;
  *p = (df_rt_plan){.labels = labels, .R = R, .nchunks = (R + chunk_rows - 1) / chunk_rows};
  p->tile_blocks = pick_tile_blocks(chunk_rows, V, logit_sets, nthreads);
  p->chunks = malloc(sizeof(df_rt_chunk) * (size_t)p->nchunks);
  p->blocks = malloc(sizeof(int64_t) * (size_t)(R / DF_RT_BLOCK + 2 * p->nchunks));
  if (!p->chunks || !p->blocks) {
    df_rt_plan_free(p);
    return DF_FAIL(err, DF_ERR_NOMEM, op, NULL, "cannot allocate the plan for %lld rows", (long long)R);
  }
  plan_chunks(p, chunk_rows);
  return DF_OK;
}

void df_rt_plan_free(df_rt_plan *p) {
  free(p->chunks), free(p->blocks);
  p->chunks = NULL, p->blocks = NULL;
}

int df_rt_team_size(const df_rt_plan *p, int nthreads) {
  int64_t most = 0;
  for (int64_t c = 0; c < p->nchunks; c++) {
    int64_t tiles = df_rt_ntiles(p, &p->chunks[c]);
    most = tiles > most ? tiles : most;
  }
  return (int)df_rt_min64(nthreads, most);
}
