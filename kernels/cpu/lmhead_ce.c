// CPU fused LM head + cross-entropy. Rows are taken a chunk at a time; each chunk's live 48-row blocks are cut
// into one run of tiles per thread (static, contiguous, sizes within one block of each other). A tile of n rows
// works on transposed logits, so every GEMM reads the head as stored and the softmax vectorises across rows:
//   xt[H, n]  = x[n, H]ᵀ                                      (the tile's rows, dead rows zero)
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
// and thread count (the tests pin it).
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
  TILE_BLOCKS = 6,  // 48-row blocks per tile at most (288 rows)
  STATS_FLOATS = 8, // per-row statistics per tile row: max, zl, coef, arg (int), sum (double, 2 floats), pad
};

typedef struct {
  df_rt_plan plan;
  const float *hidden, *head, *weights; // [R, H], [V, H], [R] or NULL
  const int32_t *labels;                // [R]
  float *loss, *dhidden;                // [R], [R, H] or NULL
  uint8_t *correct;                     // [R]
  int64_t R, H, V;
  int64_t tile_blocks; // largest tile, in blocks
  float grad_scale;    // multiplies dhidden
} lmce_job;

// One thread's scratch for a tile of at most `rows` rows.
typedef struct {
  float *xt, *z, *dx; // [H, rows], [V, rows], [rows, H]
  float *mx, *zl, *coef, *mhist;
  int32_t *arg, *lab; // [rows]: first argmax; label (−1 for a dead row)
  double *sum;        // [rows]
} ce_scratch;

static int64_t nblocks_v(int64_t V) { return (V + VB - 1) / VB; }

static size_t scratch_floats(const lmce_job *jb) {
  const int64_t rows = jb->tile_blocks * DF_RT_BLOCK;
  const int64_t f = 2 * df_rt_round_up(rows * jb->H, DF_RT_PAD) + df_rt_round_up(rows * jb->V, DF_RT_PAD) +
                    rows * (STATS_FLOATS + nblocks_v(jb->V));
  return (size_t)df_rt_round_up(f, DF_RT_PAD);
}

static ce_scratch scratch_at(const lmce_job *jb, float *base) {
  const int64_t rows = jb->tile_blocks * DF_RT_BLOCK, hx = df_rt_round_up(rows * jb->H, DF_RT_PAD);
  ce_scratch s = {.xt = base, .dx = base + hx, .z = base + 2 * hx};
  float *p = s.z + df_rt_round_up(rows * jb->V, DF_RT_PAD);
  s.sum = (double *)p, p += 2 * rows; // rows is a multiple of 48: the doubles stay 8-byte aligned
  s.mx = p, s.zl = p + rows, s.coef = p + 2 * rows;
  s.arg = (int32_t *)(p + 3 * rows), s.lab = (int32_t *)(p + 4 * rows);
  s.mhist = p + 6 * rows; // after 8 stats floats per row (sum counts two)
  return s;
}

// xt = the tile's rows transposed (dead rows 0); per-row label (−1 dead) and coef = grad_scale · w.
static void gather_rows(const lmce_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t n,
                        const ce_scratch *s) {
  const int64_t H = jb->H;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = df_rt_tile_row(blocks, i);
    const bool live = df_rt_row_live(&jb->plan, r, ch);
    const float *x = jb->hidden + r * H;
    if (live)
      for (int64_t h = 0; h < H; h++) s->xt[h * n + i] = x[h];
    else
      for (int64_t h = 0; h < H; h++) s->xt[h * n + i] = 0.0f;
    s->lab[i] = live ? jb->labels[r] : -1;
    s->coef[i] = live ? jb->grad_scale * (jb->weights ? jb->weights[r] : 1.0f) : 0.0f;
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
  float mold[DF_RT_BLOCK * TILE_BLOCKS];
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
  float f[DF_RT_BLOCK * TILE_BLOCKS];
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

// One tile: nb blocks of chunk ch.
static void ce_tile(const lmce_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t nb, const ce_scratch *s) {
  const int64_t H = jb->H, V = jb->V, n = nb * DF_RT_BLOCK, nvb = nblocks_v(V);
  gather_rows(jb, ch, blocks, n, s);
  for (int64_t i = 0; i < n; i++) s->mx[i] = -INFINITY, s->arg[i] = 0, s->sum[i] = 0.0, s->zl[i] = 0.0f;
  for (int64_t b = 0; b < nvb; b++) {
    const int64_t v0 = b * VB, vb = df_rt_min64(VB, V - v0);
    float *z = s->z + v0 * n;
    // z_b[vb, n] = head_b[vb, H] · xt[H, n]
    df_cpu_sgemm(1, false, false, vb, n, H, 1.0f, jb->head + v0 * H, H, s->xt, n, 0.0f, z, n);
    reduce_block(n, v0, vb, z, s, s->mhist + b * n);
  }
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = df_rt_tile_row(blocks, i);
    if (s->lab[i] < 0) continue;
    jb->loss[r] = (float)((double)s->mx[i] - (double)s->zl[i] + log(s->sum[i]));
    jb->correct[r] = s->arg[i] == s->lab[i];
  }
  if (!jb->dhidden) return;
  for (int64_t b = 0; b < nvb; b++) {
    const int64_t v0 = b * VB, vb = df_rt_min64(VB, V - v0);
    float *z = s->z + v0 * n;
    grad_block(n, v0, vb, z, s, s->mhist + b * n);
    // dx[n, H] += z_bᵀ · head_b[vb, H]
    df_cpu_sgemm(1, true, false, n, H, vb, 1.0f, z, n, jb->head + v0 * H, H, b ? 1.0f : 0.0f, s->dx, H);
  }
  for (int64_t i = 0; i < n; i++)
    if (s->lab[i] >= 0) memcpy(jb->dhidden + df_rt_tile_row(blocks, i) * H, s->dx + i * H, sizeof(float) * (size_t)H);
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

// Tiles of a chunk: team · k of them (k the fewest that keeps a tile within tile_blocks), thread j taking the
// j-th contiguous run of k; tile t covers blocks [count·t / ntiles, count·(t+1) / ntiles).
static int64_t chunk_tiles(const lmce_job *jb, const df_rt_chunk *ch, int team) {
  const int64_t per = (int64_t)team * jb->tile_blocks;
  return (int64_t)team * ((ch->count + per - 1) / per);
}

static void run_chunks(const lmce_job *jb, float *scratch, size_t per_thread, int team) {
  const df_rt_plan *pl = &jb->plan;
#pragma omp parallel num_threads(team)
  {
    omp_set_num_threads(1); // this task's ICV: any OpenBLAS fallback stays on this thread
    const ce_scratch s = scratch_at(jb, scratch + per_thread * (size_t)omp_get_thread_num());
    for (int64_t c = 0; c < pl->nchunks; c++) {
      const df_rt_chunk *ch = &pl->chunks[c];
      const int64_t ntiles = chunk_tiles(jb, ch, team);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < ntiles; t++) {
        const int64_t a = ch->count * t / ntiles, e = ch->count * (t + 1) / ntiles;
        if (e > a) ce_tile(jb, ch, pl->blocks + ch->first + a, e - a, &s);
      }
    }
  }
}

// The largest chunk's live blocks spread over the threads, at most TILE_BLOCKS (and the scratch cap) per tile;
// the team: no more threads than that chunk has blocks.
static int plan_team(lmce_job *jb, int nthreads) {
  int64_t most = 0;
  for (int64_t c = 0; c < jb->plan.nchunks; c++)
    if (jb->plan.chunks[c].count > most) most = jb->plan.chunks[c].count;
  const int team = (int)df_rt_min64(nthreads, most);
  if (team == 0) return 0;
  const int64_t cap = (int64_t)(DF_RT_SCRATCH_BYTES / sizeof(float)) / (jb->V * DF_RT_BLOCK);
  const int64_t per = (most + team - 1) / team;
  jb->tile_blocks = df_rt_min64(df_rt_min64(per, TILE_BLOCKS), cap > 1 ? cap : 1);
  return team;
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
  const int team = plan_team(&jb, nthreads);
  df_status st = DF_OK;
  if (team > 0) {
    const size_t per_thread = scratch_floats(&jb);
    float *scratch;
    st = df_ctx_workspace(ctx, 0, per_thread * (size_t)team * sizeof(float), (void **)&scratch, err);
    if (st == DF_OK) run_chunks(&jb, scratch, per_thread, team);
  }
  if (st == DF_OK) clear_ignored(&jb, nthreads);
  df_rt_plan_free(&jb.plan);
  return st;
}
