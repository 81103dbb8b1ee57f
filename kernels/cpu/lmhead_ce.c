// CPU fused LM head + cross-entropy. Rows are taken a chunk at a time; the row tiles of a chunk are shared
// out among the OpenMP threads (each sgemm then runs on its calling thread). Per tile:
//   z[n, V]  = x[n, H] · head[V, H]ᵀ                        (sgemm into per-thread scratch)
//   max, first argmax, Σ exp(z − max) per row                (loss, correct; exps kept in z)
//   z       ← grad_scale · w · (softmax − onehot(label))     (in place, only when dhidden is wanted)
//   dx[n, H] = z[n, V] · head[V, H]                          (sgemm, scattered into dhidden)
// so the [R, V] logits never exist whole: memory is threads · tile · (V + 2H) floats. The full-vocab tile
// (rather than an online softmax over V tiles) keeps the cost at exactly two GEMMs, 4·R·V·H flops.
//
// Bitwise reproducibility: OpenBLAS's sgemm rounds a row differently depending on where it sits inside the
// micro-kernel's row group (12 rows on Haswell). Tiles are therefore made of whole 48-row blocks of the
// global row index, row r always in slot r mod 48 (rows outside the chunk or ignored are zero rows), so each
// row meets the same arithmetic whatever chunk_rows and the thread count are: outputs are bitwise equal for
// all of them (checked with OpenBLAS 0.3.21's Haswell, Zen, SkylakeX, Sandybridge and Cooperlake kernels;
// the tests pin it). Blocks with no labelled row in the chunk are skipped.
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/rowtile.h"
#include "kernels/cpu/vexp.h"

#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
  df_rt_plan plan;
  const float *hidden, *head, *weights; // [R, H], [V, H], [R] or NULL
  const int32_t *labels;                // [R]
  float *loss, *dhidden;                // [R], [R, H] or NULL
  uint8_t *correct;                     // [R]
  int64_t R, H, V;
  int64_t ldz;      // scratch row stride, V rounded up to DF_RT_PAD
  float grad_scale; // multiplies dhidden
} lmce_job;

// One row of logits z [V] → loss and correct. When coef_w (= grad_scale · w) is given, z becomes
// coef_w · (softmax − onehot(label)); otherwise z holds exp(z − max) afterwards.
static void ce_row(float *z, int64_t V, int32_t label, const float *coef_w, float *loss, uint8_t *correct) {
  float m = z[0];
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; v++) m = z[v] > m ? z[v] : m;
  int64_t arg = 0;
  while (arg < V - 1 && z[arg] != m) arg++; // first maximum wins, as torch.argmax
  float zl = z[label];
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; v++) {
    z[v] = df_exp_nonpos(z[v] - m);
    s += (double)z[v];
  }
  *loss = (float)((double)m - (double)zl + log(s));
  *correct = arg == label;
  if (!coef_w) return;
  float c = (float)((double)*coef_w / s);
#pragma omp simd
  for (int64_t v = 0; v < V; v++) z[v] *= c;
  z[label] -= *coef_w;
}

// One tile: nb blocks of chunk ch, both GEMMs and the per-row softmax, through scratch x, z, dx.
static void ce_tile(const lmce_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t nb, float *x, float *z,
                    float *dx) {
  int64_t H = jb->H, V = jb->V, n = nb * DF_RT_BLOCK;
  size_t row_bytes = sizeof(float) * (size_t)H;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    if (df_rt_row_live(&jb->plan, r, ch))
      memcpy(x + i * H, jb->hidden + r * H, row_bytes);
    else
      memset(x + i * H, 0, row_bytes); // zero row: its z and G rows stay 0 and are never read back
  }
  // z[n, V] = x[n, H] · head[V, H]ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)H, 1.0f, x, (int)H, jb->head, (int)H, 0.0f,
              z, (int)jb->ldz);
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    if (!df_rt_row_live(&jb->plan, r, ch)) continue;
    float coef_w = jb->grad_scale * (jb->weights ? jb->weights[r] : 1.0f);
    ce_row(z + i * jb->ldz, V, jb->labels[r], jb->dhidden ? &coef_w : NULL, &jb->loss[r], &jb->correct[r]);
  }
  if (!jb->dhidden) return;
  // dx[n, H] = G[n, V] · head[V, H]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)V, 1.0f, z, (int)jb->ldz, jb->head,
              (int)H, 0.0f, dx, (int)H);
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    if (df_rt_row_live(&jb->plan, r, ch)) memcpy(jb->dhidden + r * H, dx + i * H, row_bytes);
  }
}

// Ignored rows: loss 0, correct 0, zero gradient.
static void clear_ignored(const lmce_job *jb, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (jb->R > 4096)
  for (int64_t r = 0; r < jb->R; r++) {
    if (jb->labels[r] >= 0) continue;
    jb->loss[r] = 0.0f;
    jb->correct[r] = 0;
    if (jb->dhidden) memset(jb->dhidden + r * jb->H, 0, sizeof(float) * (size_t)jb->H);
  }
}

// Chunk by chunk; the tiles of one chunk run in parallel and the chunk ends at the implicit barrier.
static void run_chunks(const lmce_job *jb, float *scratch, size_t per_thread, int nthreads) {
  const df_rt_plan *pl = &jb->plan;
  int64_t tile_rows = pl->tile_blocks * DF_RT_BLOCK;
#pragma omp parallel num_threads(nthreads)
  {
#ifdef _OPENMP
    float *x = scratch + per_thread * (size_t)omp_get_thread_num();
#else
    float *x = scratch;
#endif
    float *dx = x + df_rt_round_up(tile_rows * jb->H, DF_RT_PAD); // [tile_rows, H]
    float *z = dx + df_rt_round_up(tile_rows * jb->H, DF_RT_PAD); // [tile_rows, ldz]
    for (int64_t c = 0; c < pl->nchunks; c++) {
      const df_rt_chunk *ch = &pl->chunks[c];
      int64_t ntiles = df_rt_ntiles(pl, ch);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < ntiles; t++) {
        int64_t a = t * pl->tile_blocks;
        ce_tile(jb, ch, pl->blocks + ch->first + a, df_rt_min64(ch->count - a, pl->tile_blocks), x, z, dx);
      }
    }
  }
}

// Per-thread scratch x [tile, H], dx [tile, H], z [tile, ldz] for `team` threads, then the chunks.
static df_status run_with_scratch(const lmce_job *jb, int team, df_error *err) {
  int64_t tile_rows = jb->plan.tile_blocks * DF_RT_BLOCK;
  size_t per_thread = (size_t)(df_rt_round_up(tile_rows * jb->H, DF_RT_PAD) * 2 + tile_rows * jb->ldz);
  size_t bytes = per_thread * (size_t)team * sizeof(float);
  float *scratch = aligned_alloc(64, bytes);
  if (!scratch)
    return DF_FAIL(err, DF_ERR_NOMEM, "lmhead_ce", "lower the thread count",
                   "cannot allocate %zu bytes of logits scratch", bytes);
  run_chunks(jb, scratch, per_thread, team);
  free(scratch);
  return DF_OK;
}

df_status df_cpu_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden, const df_tensor *head,
                           const df_tensor *labels, const df_tensor *weights, df_tensor *loss, df_tensor *correct,
                           df_tensor *dhidden, df_error *err) {
  lmce_job jb = {.hidden = hidden->data,
                 .head = head->data,
                 .weights = weights ? weights->data : NULL,
                 .labels = labels->data,
                 .loss = loss->data,
                 .dhidden = dhidden ? dhidden->data : NULL,
                 .correct = correct->data,
                 .R = df_rows(hidden),
                 .H = head->shape[1],
                 .V = head->shape[0],
                 .grad_scale = desc->grad_scale};
  DF_TRY(df_rt_check_labels(jb.labels, jb.R, jb.V, "ignore", err));
  if (jb.R == 0) return DF_OK;
  int nthreads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  DF_TRY(df_rt_plan_init(&jb.plan, jb.labels, jb.R, desc->chunk_rows, jb.V, 1, nthreads, "lmhead_ce", err));
  jb.ldz = df_rt_round_up(jb.V, DF_RT_PAD);
  int team = df_rt_team_size(&jb.plan, nthreads);
  df_status st = team > 0 ? run_with_scratch(&jb, team, err) : DF_OK;
  if (st == DF_OK) clear_ignored(&jb, nthreads);
  df_rt_plan_free(&jb.plan);
  return st;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_lmhead_ce(df_backend *be) { be->lmhead_ce = df_cpu_lmhead_ce; }
