// CPU fused LM head + cross-entropy. Rows are taken a chunk at a time; each chunk's labelled rows are cut into
// one run of tiles per thread (static, contiguous, sizes within one row of each other). A tile of n rows works on
// transposed logits, so every GEMM reads the head as stored and the softmax vectorises across rows:
//   xt[H, n]  = x[n, H]ᵀ                                      (the tile's rows)
//   per vocab block b of VB rows:
//     z_b[VB, n] = head_b[VB, H] · xt                         (GEMM)
//     running max, first argmax, Σ exp(z − max) per row       (online; z_b ← exp(z_b − max so far))
//   loss, correct; then, only when dhidden is wanted, per block again:
//     z_b ← grad_scale · w · (softmax − onehot(label))        (rescaled from the stored exponentials)
//     dx[n, H] += z_bᵀ · head_b                                (GEMM, K = VB)
// so the [R, V] logits never exist whole (memory: threads · (V + 2H) · tile floats, in the context workspace)
// and the cost stays two GEMMs, 4·R·V·H flops. Each block is hot in cache while it is reduced.
//
// Bitwise reproducibility: a row's loss, correct and dhidden depend only on its own data. The GEMMs' elements do
// not depend on their position in the call (kernels/cpu/gemm.h), the per-row reductions run in vocabulary order
// inside one SIMD lane, and the vocab blocking is fixed by V. So outputs are bitwise equal for every chunk_rows
// and thread count (the tests pin it), and tiles need no alignment to the GEMM's blocks.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rowtile.h"
#include "kernels/cpu/vexp.h"

enum {
  VB = 512,         // vocabulary rows per block (fixed: the block decides the rounding of the sums)
  TILE_ROWS = 288,  // rows per tile at most
  STATS_FLOATS = 8, // per-row statistics per tile row: max, zl, coef, arg (int), label, sum (double: two), pad
};

typedef struct {
  const float *hidden, *head, *weights; // [R, H], [V, H], [R] or NULL
  const int32_t *labels;                // [R]
  float *loss, *dhidden;                // [R], [R, H] or NULL
  uint8_t *correct;                     // [R]
  int64_t R, H, V;
  int64_t chunk_rows; // rows per chunk (R: one chunk)
  int64_t tile_rows;  // largest tile
  int64_t *live;      // [nlive] labelled rows, ascending
  int64_t nlive;
  float grad_scale; // multiplies dhidden
} lmce_job;

// One thread's scratch for a tile of at most tile_rows rows.
typedef struct {
  float *xt, *z, *dx; // [H, rows], [V, rows], [rows, H]
  float *mx, *zl, *coef, *mhist;
  int32_t *arg, *lab; // [rows]: first argmax; label
  double *sum;        // [rows]
} ce_scratch;

static int64_t nblocks_v(int64_t V) { return (V + VB - 1) / VB; }

static size_t scratch_floats(const lmce_job *jb) {
  const int64_t rows = df_rt_round_up(jb->tile_rows, DF_RT_PAD);
  const int64_t f = 2 * df_rt_round_up(rows * jb->H, DF_RT_PAD) + df_rt_round_up(rows * jb->V, DF_RT_PAD) +
                    rows * (STATS_FLOATS + nblocks_v(jb->V));
  return (size_t)df_rt_round_up(f, DF_RT_PAD);
}

static ce_scratch scratch_at(const lmce_job *jb, float *base) {
  const int64_t rows = df_rt_round_up(jb->tile_rows, DF_RT_PAD), hx = df_rt_round_up(rows * jb->H, DF_RT_PAD);
  ce_scratch s = {.xt = base, .dx = base + hx, .z = base + 2 * hx};
  float *p = s.z + df_rt_round_up(rows * jb->V, DF_RT_PAD);
  s.sum = (double *)p, p += 2 * rows; // rows is a multiple of 16: the doubles stay aligned
  s.mx = p, s.zl = p + rows, s.coef = p + 2 * rows;
  s.arg = (int32_t *)(p + 3 * rows), s.lab = (int32_t *)(p + 4 * rows);
  s.mhist = p + 6 * rows; // after the 8 stats floats per row
  return s;
}

// xt = the tile's rows transposed; per-row label and coef = grad_scale · w.
static void gather_rows(const lmce_job *jb, const int64_t *rows, int64_t n, const ce_scratch *s) {
  const int64_t H = jb->H;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = rows[i];
    const float *x = jb->hidden + r * H;
    for (int64_t h = 0; h < H; h++) s->xt[h * n + i] = x[h];
    s->lab[i] = jb->labels[r];
    s->coef[i] = jb->grad_scale * (jb->weights ? jb->weights[r] : 1.0f);
  }
}

// Block b (vocab rows v0 .. v0+vb) of the logits: running max and first argmax, the label's logit, and the
// online sum; the block is left holding exp(z − max after this block), which mhist keeps per row.
static void reduce_block(int64_t n, int64_t v0, int64_t vb, float *z, const ce_scratch *s, float *mhist) {
  float *mx = s->mx;
  int32_t *arg = s->arg;
  for (int64_t i = 0; i < n; i++) {
    const int32_t l = s->lab[i];
    if (l >= v0 && l < v0 + vb) s->zl[i] = z[(l - v0) * n + i];
  }
  float mold[TILE_ROWS];
  memcpy(mold, mx, sizeof(float) * (size_t)n);
  for (int64_t v = 0; v < vb; v++) {
    const float *zr = z + v * n;
    const int32_t id = (int32_t)(v0 + v);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
      const bool gt = zr[i] > mx[i]; // strict: the first maximum wins, as torch.argmax
      arg[i] = gt ? id : arg[i];
      mx[i] = gt ? zr[i] : mx[i];
    }
  }
  for (int64_t i = 0; i < n; i++)
    if (mx[i] != mold[i]) s->sum[i] *= exp((double)mold[i] - (double)mx[i]); // 0 · e^−∞ = 0 on the first block
  double *sum = s->sum;
  for (int64_t v = 0; v < vb; v++) {
    float *zr = z + v * n;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) zr[i] = df_exp_nonpos(zr[i] - mx[i]);
#pragma omp simd // a separate loop: GCC does not vectorise the exp and the widening add together
    for (int64_t i = 0; i < n; i++) sum[i] += (double)zr[i];
  }
  memcpy(mhist, mx, sizeof(float) * (size_t)n);
}

// Block b of the logit gradient from its stored exponentials: G = coef · (softmax − onehot(label)).
static void grad_block(int64_t n, int64_t v0, int64_t vb, float *z, const ce_scratch *s, const float *mhist) {
  float f[TILE_ROWS];
  for (int64_t i = 0; i < n; i++)
    f[i] =
        s->coef[i] == 0.0f ? 0.0f : (float)((double)s->coef[i] * exp((double)mhist[i] - (double)s->mx[i]) / s->sum[i]);
  for (int64_t v = 0; v < vb; v++) {
    float *zr = z + v * n;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) zr[i] *= f[i];
  }
  for (int64_t i = 0; i < n; i++) {
    const int32_t l = s->lab[i];
    if (l >= v0 && l < v0 + vb) z[(l - v0) * n + i] -= s->coef[i];
  }
}

// One tile: the n rows listed in rows.
static void ce_tile(const lmce_job *jb, const int64_t *rows, int64_t n, const ce_scratch *s) {
  const int64_t H = jb->H, V = jb->V, nvb = nblocks_v(V);
  gather_rows(jb, rows, n, s);
  for (int64_t i = 0; i < n; i++) s->mx[i] = -INFINITY, s->arg[i] = 0, s->sum[i] = 0.0, s->zl[i] = 0.0f;
  for (int64_t b = 0; b < nvb; b++) {
    const int64_t v0 = b * VB, vb = df_rt_min64(VB, V - v0);
    float *z = s->z + v0 * n;
    // z_b[vb, n] = head_b[vb, H] · xt[H, n]
    df_cpu_sgemm(1, false, false, vb, n, H, 1.0f, jb->head + v0 * H, H, s->xt, n, 0.0f, z, n);
    reduce_block(n, v0, vb, z, s, s->mhist + b * n);
  }
  for (int64_t i = 0; i < n; i++) {
    jb->loss[rows[i]] = (float)((double)s->mx[i] - (double)s->zl[i] + log(s->sum[i]));
    jb->correct[rows[i]] = s->arg[i] == s->lab[i];
  }
  if (!jb->dhidden) return;
  for (int64_t b = 0; b < nvb; b++) {
    const int64_t v0 = b * VB, vb = df_rt_min64(VB, V - v0);
    float *z = s->z + v0 * n;
    grad_block(n, v0, vb, z, s, s->mhist + b * n);
    // dx[n, H] += z_bᵀ · head_b[vb, H]
    df_cpu_sgemm(1, true, false, n, H, vb, 1.0f, z, n, jb->head + v0 * H, H, b ? 1.0f : 0.0f, s->dx, H);
  }
  for (int64_t i = 0; i < n; i++) memcpy(jb->dhidden + rows[i] * H, s->dx + i * H, sizeof(float) * (size_t)H);
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

// Live rows [lo, hi) of the chunk starting at row c0 (the live list is ascending).
static void chunk_span(const lmce_job *jb, int64_t c0, int64_t *lo, int64_t *hi) {
  int64_t a = 0, b = jb->nlive;
  while (a < b) { // first live row >= c0
    const int64_t m = (a + b) / 2;
    if (jb->live[m] < c0)
      a = m + 1;
    else
      b = m;
  }
  *lo = a, *hi = a;
  while (*hi < jb->nlive && jb->live[*hi] < c0 + jb->chunk_rows) (*hi)++;
}

// Chunk by chunk: team · k tiles (k the fewest that keeps a tile within tile_rows), thread j taking the j-th
// contiguous run of k, tile t covering live rows [L·t / ntiles, L·(t+1) / ntiles) of the chunk.
static void run_chunks(const lmce_job *jb, float *scratch, size_t per_thread, int team) {
#pragma omp parallel num_threads(team)
  {
    omp_set_num_threads(1); // this task's ICV: any OpenBLAS call stays on this thread
    const ce_scratch s = scratch_at(jb, scratch + per_thread * (size_t)omp_get_thread_num());
    for (int64_t c0 = 0; c0 < jb->R; c0 += jb->chunk_rows) {
      int64_t lo, hi;
      chunk_span(jb, c0, &lo, &hi);
      const int64_t L = hi - lo, per = (int64_t)team * jb->tile_rows, ntiles = team * ((L + per - 1) / per);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < ntiles; t++) {
        const int64_t a = L * t / ntiles, e = L * (t + 1) / ntiles;
        if (e > a) ce_tile(jb, jb->live + lo + a, e - a, &s);
      }
    }
  }
}

// Sizes the tiles for `most` labelled rows in the fullest chunk (spread over the threads, at most TILE_ROWS and the
// scratch cap) and returns the team: no more threads than that chunk has rows.
static int size_tiles(lmce_job *jb, int nthreads, int64_t most) {
  const int team = (int)df_rt_min64(nthreads, most);
  if (team == 0) return 0;
  const int64_t cap = (int64_t)(DF_RT_SCRATCH_BYTES / sizeof(float)) / jb->V;
  jb->tile_rows = df_rt_min64(df_rt_min64((most + team - 1) / team, TILE_ROWS), cap > 16 ? cap : 16);
  return team;
}

// Lists the labelled rows; returns how many the fullest chunk has.
static int64_t list_live(lmce_job *jb) {
  jb->nlive = 0;
  int64_t most = 0, in_chunk = 0;
  for (int64_t r = 0; r < jb->R; r++) {
    if (r % jb->chunk_rows == 0) in_chunk = 0;
    if (jb->labels[r] < 0) continue;
    jb->live[jb->nlive++] = r;
    if (++in_chunk > most) most = in_chunk;
  }
  return most;
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
  if (jb.R == 0) return DF_OK;
  jb.chunk_rows = desc->chunk_rows > 0 && desc->chunk_rows < jb.R ? desc->chunk_rows : jb.R;
  const int nthreads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  // The workspace is sized as if every row were labelled, from the shapes alone (a measuring context sizes it without
  // reading the labels); the tiles then take what the labelled rows need of it.
  lmce_job bound = jb;
  const int bound_team = size_tiles(&bound, nthreads, jb.chunk_rows);
  float *scratch;
  DF_TRY(df_ctx_workspace(ctx, 1, sizeof(int64_t) * (size_t)jb.R, (void **)&jb.live, err));
  DF_TRY(df_ctx_workspace(ctx, 0, scratch_floats(&bound) * (size_t)bound_team * sizeof(float), (void **)&scratch, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  DF_TRY(df_rt_check_labels(jb.labels, jb.R, jb.V, "ignore", err));
  const int team = size_tiles(&jb, nthreads, list_live(&jb));
  if (team > 0) run_chunks(&jb, scratch, scratch_floats(&jb), team);
  clear_ignored(&jb, nthreads);
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_lmhead_ce(df_backend *be) {
  be->lmhead_ce = df_cpu_lmhead_ce;
  be->measures[DF_OP_LMHEAD_CE] = true;
}
