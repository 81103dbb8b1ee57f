// CPU block-masked attention (DFlash), flash style. Per (sample b, block n, kv head g) the G = nH/nKV query
// heads × bs rows form one query tile that walks its visible keys (context [lo, anchor), then its own block)
// in key tiles with an online softmax; the Q×KV mask and score matrix never exist. Scores are kept transposed,
// sᵀ (keys × tile rows), so every tile GEMM reads K and V as stored (kernels/cpu/gemm.h, on the calling
// thread) and the softmax statistics vectorise across the tile's rows.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/check.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vexp.h"

// Keys per score tile: the M × 256 scores and the 256-row K/V slices stay in L2.
enum { KEY_TILE = 256 };
// Backward work items (sample, kv head, chunk of blocks) aimed for. A constant, not the thread count, so
// the partition and the summation order of the shared context dk/dv (and so the bits) never depend on it.
enum { BWD_ITEMS = 16 };
// Context rows per reduction work item.
enum { REDUCE_ROWS = 64 };

typedef struct {
  int64_t B, N, bs, S, nH, nKV, hd;
  int64_t G;  // query heads per kv head
  int64_t M;  // query tile rows G·bs; row r is head g·G + r/bs, block offset r%bs
  int64_t KV; // key rows per sample: S + N·bs
  int64_t W;  // sliding window, 0 = full
  int64_t ld; // floats between consecutive key rows of one kv head: nKV·hd
  float scale;
} attn_geom;

// One query tile: sample b, block n, kv head g.
typedef struct {
  int64_t b, n, g;
  int64_t a;  // anchor
  int64_t lo; // first context key any row of the tile sees (the row at offset 0 sees furthest back)
} qtile;

// A run of at most KEY_TILE keys of one kv head, rows g->ld apart.
typedef struct {
  const float *k, *v;
  float *dk, *dv; // backward: where the run's key gradients accumulate, rows ldd apart
  int64_t ldd;
  int64_t j0, n; // first key (context index, or offset inside the block) and count
  bool block;    // the block's own keys, else context keys
} krun;

static attn_geom make_geom(const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                           const df_tensor *anchors) {
  attn_geom g = {.B = q->shape[0],
                 .N = anchors->shape[1],
                 .bs = desc->block_size,
                 .S = desc->context_len,
                 .nH = q->shape[2],
                 .nKV = k->shape[2],
                 .hd = q->shape[3],
                 .W = desc->window,
                 .scale = desc->scale};
  g.G = g.nH / g.nKV;
  g.M = g.G * g.bs;
  g.KV = g.S + g.N * g.bs;
  g.ld = g.nKV * g.hd;
  return g;
}

static qtile make_qtile(const attn_geom *g, const int32_t *anchors, int64_t b, int64_t n, int64_t kh) {
  int64_t a = anchors[b * g->N + n];
  int64_t lo = g->W > 0 ? a - (g->W - 1) : 0;
  return (qtile){.b = b, .n = n, .g = kh, .a = a, .lo = lo > 0 ? lo : 0};
}

// Offset of tile row r in a [B, N·bs, nH, hd] tensor.
static inline int64_t q_off(const attn_geom *g, const qtile *t, int64_t r) {
  int64_t tok = t->b * g->N * g->bs + t->n * g->bs + r % g->bs;
  return (tok * g->nH + t->g * g->G + r / g->bs) * g->hd;
}

// Offset of tile row r in the [B, nH, N·bs] lse.
static inline int64_t lse_off(const attn_geom *g, const qtile *t, int64_t r) {
  return (t->b * g->nH + t->g * g->G + r / g->bs) * g->N * g->bs + t->n * g->bs + r % g->bs;
}

// Offset of key row j (context index, or S + block token) of kv head kh in a [B, S + N·bs, nKV, hd] tensor.
static inline int64_t k_off(const attn_geom *g, int64_t b, int64_t j, int64_t kh) {
  return ((b * g->KV + j) * g->nKV + kh) * g->hd;
}

// Tile rows in packed order: dst[r] = alpha · src row r (q-like tensor); with dst_t also transposed,
// dst_t[i·M + r] (hd × M).
static void pack_rows(const attn_geom *g, const qtile *t, const float *src, float alpha, float *dst, float *dst_t) {
  for (int64_t r = 0; r < g->M; r++) {
    const float *s = src + q_off(g, t, r);
    float *d = dst + r * g->hd;
    for (int64_t i = 0; i < g->hd; i++) d[i] = alpha * s[i];
    if (dst_t)
      for (int64_t i = 0; i < g->hd; i++) dst_t[i * g->M + r] = d[i];
  }
}

// Puts −inf on the scores a window hides: context keys before anchor + o − (W−1), block keys after o.
static void mask_scores(const attn_geom *g, const qtile *t, const krun *kr, float *st) {
  if (g->W == 0) return;
  for (int64_t r = 0; r < g->M; r++) {
    int64_t o = r % g->bs, c0, c1;
    if (kr->block) {
      c0 = o + 1 - kr->j0, c1 = kr->n; // hide offsets o′ > o
    } else {
      c0 = 0, c1 = t->a + o - (g->W - 1) - kr->j0; // hide context keys before the window
    }
    c0 = c0 < 0 ? 0 : c0;
    c1 = c1 > kr->n ? kr->n : c1;
    for (int64_t c = c0; c < c1; c++) st[c * g->M + r] = -INFINITY;
  }
}

// sᵀ (n × M) = K (n × hd) · (scale·q)ᵀ (hd × M) for one key run, masked.
static void scores(const attn_geom *g, const qtile *t, const krun *kr, const float *qs_t, float *st) {
  df_cpu_sgemm(1, false, false, kr->n, g->M, g->hd, 1.0f, kr->k, g->ld, qs_t, g->M, 0.0f, st, g->M);
  mask_scores(g, t, kr, st);
}

// ---------------------------------------------------------------------------------------------
// Forward

typedef struct {
  float *qs_t;    // (hd, M) (scale · q)ᵀ
  float *acc;     // (M, hd) unnormalised output
  float *st;      // (KEY_TILE, M) scores, then probabilities, transposed
  float *m, *l;   // (M) running max and sum
  float *mx, *sh; // (M) this run's new max, and the shift its exponentials use
  float *alpha;   // (M) rescale of the old sum and output
} fwd_scratch;

static size_t fwd_scratch_floats(const attn_geom *g) {
  size_t f = (size_t)(2 * g->M * g->hd + g->M * KEY_TILE + 5 * g->M);
  return (f + 15) / 16 * 16; // each thread's slice starts on a cache line
}

static fwd_scratch fwd_scratch_at(const attn_geom *g, float *base) {
  fwd_scratch w = {.qs_t = base, .acc = base + g->M * g->hd, .st = base + 2 * g->M * g->hd};
  w.m = w.st + g->M * KEY_TILE;
  w.l = w.m + g->M, w.mx = w.l + g->M, w.sh = w.mx + g->M, w.alpha = w.sh + g->M;
  return w;
}

// One online-softmax step over n keys, across the tile's rows: sᵀ becomes exp(s − m_new), l and acc are
// rescaled to the new running max. A row the window hides from the whole run (and from all before) keeps
// m = −inf: its exponentials are 0 and nothing is rescaled.
static void online_softmax_step(const attn_geom *g, int64_t n, fwd_scratch *w) {
  const int64_t M = g->M;
  float *mx = w->mx, *sh = w->sh, *alpha = w->alpha, *l = w->l;
  memcpy(mx, w->m, sizeof(float) * (size_t)M);
  for (int64_t c = 0; c < n; c++) {
    const float *sr = w->st + c * M;
#pragma omp simd
    for (int64_t r = 0; r < M; r++) mx[r] = sr[r] > mx[r] ? sr[r] : mx[r];
  }
  for (int64_t r = 0; r < M; r++) {
    sh[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
    alpha[r] = mx[r] == -INFINITY ? 1.0f : df_exp_nonpos(w->m[r] - mx[r]);
    l[r] *= alpha[r];
  }
  for (int64_t c = 0; c < n; c++) {
    float *sr = w->st + c * M;
#pragma omp simd
    for (int64_t r = 0; r < M; r++) {
      const float p = df_exp_nonpos(sr[r] - sh[r]);
      sr[r] = p;
      l[r] += p;
    }
  }
  for (int64_t r = 0; r < M; r++) {
    w->m[r] = mx[r];
    if (alpha[r] != 1.0f)
      for (int64_t i = 0; i < g->hd; i++) w->acc[r * g->hd + i] *= alpha[r];
  }
}

static void fwd_run(const attn_geom *g, const qtile *t, const krun *kr, fwd_scratch *w) {
  scores(g, t, kr, w->qs_t, w->st);
  online_softmax_step(g, kr->n, w);
  // acc (M, hd) += P (M, n) · V (n, hd), P read from its transpose
  df_cpu_sgemm(1, true, false, g->M, g->hd, kr->n, 1.0f, w->st, g->M, kr->v, g->ld, 1.0f, w->acc, g->hd);
}

// out rows = acc / l and lse = m + log l; rows that saw no key get 0 and −inf.
static void fwd_finish(const attn_geom *g, const qtile *t, const fwd_scratch *w, float *out, float *lse) {
  for (int64_t r = 0; r < g->M; r++) {
    float *o = out + q_off(g, t, r);
    float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
    for (int64_t i = 0; i < g->hd; i++) o[i] = w->acc[r * g->hd + i] * inv;
    lse[lse_off(g, t, r)] = w->l[r] > 0.0f ? w->m[r] + logf(w->l[r]) : -INFINITY;
  }
}

static void fwd_tile(const attn_geom *g, const qtile *t, bool keep, const float *q, const float *k, const float *v,
                     fwd_scratch *w, float *out, float *lse) {
  memset(w->acc, 0, sizeof(float) * (size_t)(g->M * g->hd));
  for (int64_t r = 0; r < g->M; r++) w->m[r] = -INFINITY, w->l[r] = 0.0f;
  if (keep) {
    for (int64_t r = 0; r < g->M; r++) {
      const float *s = q + q_off(g, t, r);
      for (int64_t i = 0; i < g->hd; i++) w->qs_t[i * g->M + r] = g->scale * s[i];
    }
    for (int64_t j0 = t->lo; j0 < t->a; j0 += KEY_TILE) {
      int64_t off = k_off(g, t->b, j0, t->g);
      krun kr = {.k = k + off, .v = v + off, .j0 = j0, .n = t->a - j0 < KEY_TILE ? t->a - j0 : KEY_TILE};
      fwd_run(g, t, &kr, w);
    }
    for (int64_t j0 = 0; j0 < g->bs; j0 += KEY_TILE) {
      int64_t off = k_off(g, t->b, g->S + t->n * g->bs + j0, t->g);
      krun kr = {
          .k = k + off, .v = v + off, .j0 = j0, .n = g->bs - j0 < KEY_TILE ? g->bs - j0 : KEY_TILE, .block = true};
      fwd_run(g, t, &kr, w);
    }
  }
  fwd_finish(g, t, w, out, lse);
}

df_status df_cpu_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                    const df_tensor *v, const df_tensor *anchors, const df_tensor *keep, df_tensor *out,
                                    df_tensor *lse, df_error *err) {
  attn_geom g = make_geom(desc, q, k, anchors);
  int nt = ctx->num_threads;
  size_t per = fwd_scratch_floats(&g);
  float *scratch;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * per * (size_t)nt, (void **)&scratch, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const int32_t *an = anchors->data;
  const uint8_t *kp = keep->data;
  int64_t items = g.B * g.N * g.nKV;
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1); // this task's ICV: any OpenBLAS call stays on this thread
    fwd_scratch w = fwd_scratch_at(&g, scratch + per * (size_t)omp_get_thread_num());
    // Latest blocks first: anchors are sorted, so the heaviest tiles start early and the tail is short.
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; i++) {
      int64_t it = items - 1 - i, b = it / (g.N * g.nKV), n = it / g.nKV % g.N;
      qtile t = make_qtile(&g, an, b, n, it % g.nKV);
      fwd_tile(&g, &t, kp[b * g.N + n] != 0, q->data, k->data, v->data, &w, out->data, lse->data);
    }
  }
  return DF_OK;
}

// ---------------------------------------------------------------------------------------------
// Backward

typedef struct {
  float *qs, *qs_t;     // (M, hd) scale · q and its transpose (hd, M)
  float *dout, *dout_t; // (M, hd) dout and its transpose
  float *dq;            // (M, hd) unscaled dq
  float *pt, *dst;      // (KEY_TILE, M) probabilities, then dP and dS, transposed
  float *lse, *dsum;    // (M) lse and D = rowsum(dout ∘ out)
} bwd_scratch;

static size_t bwd_scratch_floats(const attn_geom *g) {
  size_t f = (size_t)(5 * g->M * g->hd + 2 * g->M * KEY_TILE + 2 * g->M);
  return (f + 15) / 16 * 16;
}

static bwd_scratch bwd_scratch_at(const attn_geom *g, float *base) {
  const int64_t mh = g->M * g->hd;
  bwd_scratch w = {.qs = base, .qs_t = base + mh, .dout = base + 2 * mh, .dout_t = base + 3 * mh, .dq = base + 4 * mh};
  w.pt = w.dq + mh;
  w.dst = w.pt + g->M * KEY_TILE;
  w.lse = w.dst + g->M * KEY_TILE;
  w.dsum = w.lse + g->M;
  return w;
}

// The five tile GEMMs of the flash backward for one key run, on transposed scores.
static void bwd_run(const attn_geom *g, const qtile *t, const krun *kr, bwd_scratch *w) {
  const int64_t M = g->M, n = kr->n, hd = g->hd, ld = g->ld, ldd = kr->ldd;
  scores(g, t, kr, w->qs_t, w->pt);
  for (int64_t c = 0; c < n; c++) {
    float *pr = w->pt + c * M;
#pragma omp simd
    for (int64_t r = 0; r < M; r++) pr[r] = df_exp_nonpos(pr[r] - w->lse[r]);
  }
  // dPᵀ (n, M) = V (n, hd) · doutᵀ (hd, M)
  df_cpu_sgemm(1, false, false, n, M, hd, 1.0f, kr->v, ld, w->dout_t, M, 0.0f, w->dst, M);
  for (int64_t c = 0; c < n; c++) {
    const float *pr = w->pt + c * M;
    float *dr = w->dst + c * M;
#pragma omp simd
    for (int64_t r = 0; r < M; r++) dr[r] = pr[r] * (dr[r] - w->dsum[r]);
  }
  // dq (M, hd) += dS · K;  dK (n, hd) += dSᵀ · (scale·q);  dV (n, hd) += Pᵀ · dout
  df_cpu_sgemm(1, true, false, M, hd, n, 1.0f, w->dst, M, kr->k, ld, 1.0f, w->dq, hd);
  df_cpu_sgemm(1, false, false, n, hd, M, 1.0f, w->dst, M, w->qs, hd, 1.0f, kr->dk, ldd);
  df_cpu_sgemm(1, false, false, n, hd, M, 1.0f, w->pt, M, w->dout, hd, 1.0f, kr->dv, ldd);
}

// Where a work item accumulates context-key gradients: rows [row0, ...) of dk/dv, ld floats apart.
typedef struct {
  float *dk, *dv;
  int64_t row0, ld;
} ctx_grad;

typedef struct {
  const float *q, *k, *v, *out, *lse, *dout;
  float *dq, *dk, *dv;
} bwd_io;

static void bwd_tile(const attn_geom *g, const qtile *t, const bwd_io *io, const ctx_grad *cg, bwd_scratch *w) {
  pack_rows(g, t, io->q, g->scale, w->qs, w->qs_t);
  pack_rows(g, t, io->dout, 1.0f, w->dout, w->dout_t);
  memset(w->dq, 0, sizeof(float) * (size_t)(g->M * g->hd));
  for (int64_t r = 0; r < g->M; r++) {
    const float *o = io->out + q_off(g, t, r), *d = w->dout + r * g->hd;
    double s = 0.0;
    for (int64_t i = 0; i < g->hd; i++) s += (double)o[i] * d[i];
    w->dsum[r] = (float)s;
    w->lse[r] = io->lse[lse_off(g, t, r)];
  }
  for (int64_t j0 = t->lo; j0 < t->a; j0 += KEY_TILE) {
    int64_t off = k_off(g, t->b, j0, t->g), goff = (j0 - cg->row0) * cg->ld;
    krun kr = {.k = io->k + off,
               .v = io->v + off,
               .dk = cg->dk + goff,
               .dv = cg->dv + goff,
               .ldd = cg->ld,
               .j0 = j0,
               .n = t->a - j0 < KEY_TILE ? t->a - j0 : KEY_TILE};
    bwd_run(g, t, &kr, w);
  }
  for (int64_t j0 = 0; j0 < g->bs; j0 += KEY_TILE) {
    int64_t off = k_off(g, t->b, g->S + t->n * g->bs + j0, t->g);
    krun kr = {.k = io->k + off,
               .v = io->v + off,
               .dk = io->dk + off,
               .dv = io->dv + off,
               .ldd = g->ld,
               .j0 = j0,
               .n = g->bs - j0 < KEY_TILE ? g->bs - j0 : KEY_TILE,
               .block = true};
    bwd_run(g, t, &kr, w);
  }
  for (int64_t r = 0; r < g->M; r++) {
    float *d = io->dq + q_off(g, t, r);
    for (int64_t i = 0; i < g->hd; i++) d[i] = g->scale * w->dq[r * g->hd + i];
  }
}

// The backward's fixed partition: each sample's blocks split into P contiguous chunks of about equal work.
// Chunk 0 of every (sample, kv head) adds its context dk/dv straight into dk/dv; chunk c >= 1 into its own
// partial rows [lo, hi), which are added afterwards in chunk order.
typedef struct {
  int64_t P;
  int64_t *start;   // [B, P+1] first block of each chunk
  int64_t *lo, *hi; // [B, P] context rows the chunk's kept blocks see
  int64_t *off;     // [B, P] float offset of the chunk's partials: per kv head, dk (hi−lo, hd) then dv
  float *part;
} bwd_plan;

// The cost of one block in the backward: keys it sees plus a per-block overhead; dropped blocks cost ~nothing.
static int64_t block_cost(const attn_geom *g, const int32_t *an, const uint8_t *kp, int64_t b, int64_t n) {
  if (!kp[b * g->N + n]) return 1;
  qtile t = make_qtile(g, an, b, n, 0);
  return t.a - t.lo + g->bs + 32;
}

// Splits sample b's blocks into P contiguous chunks of about equal cost: a block goes to the chunk holding
// the midpoint of its cost interval.
static void plan_split(const attn_geom *g, const int32_t *an, const uint8_t *kp, int64_t b, bwd_plan *pl) {
  int64_t total = 0, cum = 0, c = 0, *start = pl->start + b * (pl->P + 1);
  for (int64_t n = 0; n < g->N; n++) total += block_cost(g, an, kp, b, n);
  for (int64_t n = 0; n < g->N; n++) {
    int64_t w = block_cost(g, an, kp, b, n), chunk = (2 * cum + w) * pl->P / (2 * total);
    while (c <= chunk && c < pl->P) start[c++] = n;
    cum += w;
  }
  while (c <= pl->P) start[c++] = g->N;
}

// Chunk c's context rows: the union of what its kept blocks see.
static void plan_rows(const attn_geom *g, const int32_t *an, const uint8_t *kp, int64_t b, int64_t c, bwd_plan *pl) {
  int64_t lo = g->S, hi = 0, i = b * pl->P + c;
  for (int64_t n = pl->start[b * (pl->P + 1) + c]; n < pl->start[b * (pl->P + 1) + c + 1]; n++) {
    if (!kp[b * g->N + n]) continue;
    qtile t = make_qtile(g, an, b, n, 0);
    lo = t.lo < lo ? t.lo : lo;
    hi = t.a > hi ? t.a : hi;
  }
  pl->lo[i] = lo, pl->hi[i] = hi > lo ? hi : lo;
}

// The plan's index arrays live in workspace slot 0, its partial gradients in slot 1 (the thread tiles: slot 2). Slot 1
// is sized for chunks that each see the whole context — from the shapes alone, so a measuring context sizes it
// without the anchors; the chunks' rows [lo, hi) are packed into it as the anchors give them.
static df_status plan_alloc(df_ctx *ctx, const attn_geom *g, bwd_plan *pl, df_error *err) {
  int64_t units = g->B * g->nKV > 0 ? g->B * g->nKV : 1, per_sample = (BWD_ITEMS + units - 1) / units;
  pl->P = per_sample < g->N ? per_sample : (g->N > 0 ? g->N : 1);
  const size_t nb = (size_t)(g->B * pl->P);
  int64_t *idx;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(int64_t) * (4 * nb + (size_t)g->B), (void **)&idx, err));
  pl->start = idx, pl->lo = idx + nb + (size_t)g->B, pl->hi = pl->lo + nb, pl->off = pl->hi + nb;
  const int64_t most = g->B * (pl->P - 1) * 2 * g->nKV * g->S * g->hd;
  return df_ctx_workspace(ctx, 1, sizeof(float) * (size_t)(most > 0 ? most : 1), (void **)&pl->part, err);
}

static void plan_make(const attn_geom *g, const int32_t *an, const uint8_t *kp, bwd_plan *pl) {
  int64_t total = 0;
  for (int64_t b = 0; b < g->B; b++) {
    plan_split(g, an, kp, b, pl);
    for (int64_t c = 0; c < pl->P; c++) {
      int64_t i = b * pl->P + c;
      plan_rows(g, an, kp, b, c, pl);
      pl->off[i] = total;
      if (c > 0) total += 2 * g->nKV * (pl->hi[i] - pl->lo[i]) * g->hd;
    }
  }
}

// Context gradient target of chunk c of (b, kv head kh).
static ctx_grad plan_target(const attn_geom *g, const bwd_plan *pl, const bwd_io *io, int64_t b, int64_t kh,
                            int64_t c) {
  if (c == 0) {
    int64_t off = k_off(g, b, 0, kh);
    return (ctx_grad){.dk = io->dk + off, .dv = io->dv + off, .row0 = 0, .ld = g->ld};
  }
  int64_t i = b * pl->P + c, rows = pl->hi[i] - pl->lo[i];
  float *dk = pl->part + pl->off[i] + 2 * kh * rows * g->hd;
  return (ctx_grad){.dk = dk, .dv = dk + rows * g->hd, .row0 = pl->lo[i], .ld = g->hd};
}

// Runs chunk c of (b, kv head kh): all its kept blocks, in block order.
static void bwd_item(const attn_geom *g, const bwd_plan *pl, const bwd_io *io, const int32_t *an, const uint8_t *kp,
                     int64_t b, int64_t kh, int64_t c, bwd_scratch *w) {
  ctx_grad cg = plan_target(g, pl, io, b, kh, c);
  if (c > 0) {
    int64_t rows = pl->hi[b * pl->P + c] - pl->lo[b * pl->P + c];
    memset(cg.dk, 0, sizeof(float) * (size_t)(2 * rows * g->hd));
  }
  for (int64_t n = pl->start[b * (pl->P + 1) + c]; n < pl->start[b * (pl->P + 1) + c + 1]; n++) {
    if (!kp[b * g->N + n]) continue;
    qtile t = make_qtile(g, an, b, n, kh);
    bwd_tile(g, &t, io, &cg, w);
  }
}

// dk/dv context rows [r0, r1) of (b, kv head kh) += the partials of chunks 1..P−1, in chunk order.
static void reduce_rows(const attn_geom *g, const bwd_plan *pl, const bwd_io *io, int64_t b, int64_t kh, int64_t r0,
                        int64_t r1) {
  for (int64_t c = 1; c < pl->P; c++) {
    ctx_grad cg = plan_target(g, pl, io, b, kh, c);
    int64_t i = b * pl->P + c, lo = pl->lo[i] > r0 ? pl->lo[i] : r0, hi = pl->hi[i] < r1 ? pl->hi[i] : r1;
    for (int64_t j = lo; j < hi; j++) {
      float *dk = io->dk + k_off(g, b, j, kh), *dv = io->dv + k_off(g, b, j, kh);
      const float *pk = cg.dk + (j - cg.row0) * g->hd, *pv = cg.dv + (j - cg.row0) * g->hd;
      for (int64_t x = 0; x < g->hd; x++) dk[x] += pk[x], dv[x] += pv[x];
    }
  }
}

df_status df_cpu_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                     const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                     const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                     const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                     df_error *err) {
  attn_geom g = make_geom(desc, q, k, anchors);
  const int32_t *an = anchors->data;
  const uint8_t *kp = keep->data;
  bwd_plan pl = {0};
  DF_TRY(plan_alloc(ctx, &g, &pl, err));
  int nt = ctx->num_threads;
  size_t per = bwd_scratch_floats(&g);
  float *scratch;
  DF_TRY(df_ctx_workspace(ctx, 2, sizeof(float) * per * (size_t)nt, (void **)&scratch, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  plan_make(&g, an, kp, &pl);
  bwd_io io = {q->data, k->data, v->data, out->data, lse->data, dout->data, dq->data, dk->data, dv->data};
  int64_t nq = df_numel(q), nk = df_numel(k), items = g.B * g.nKV * pl.P;
  int64_t tiles = (g.S + REDUCE_ROWS - 1) / REDUCE_ROWS, nred = g.B * g.nKV * tiles;
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1); // this task's ICV: any OpenBLAS call stays on this thread
    bwd_scratch w = bwd_scratch_at(&g, scratch + per * (size_t)omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nq; i++) io.dq[i] = 0.0f; // rows of dropped blocks stay 0
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nk; i++) io.dk[i] = 0.0f, io.dv[i] = 0.0f;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < items; i++)
      bwd_item(&g, &pl, &io, an, kp, i / (g.nKV * pl.P), i / pl.P % g.nKV, i % pl.P, &w);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < nred; i++) {
      int64_t r0 = i % tiles * REDUCE_ROWS, r1 = r0 + REDUCE_ROWS < g.S ? r0 + REDUCE_ROWS : g.S;
      reduce_rows(&g, &pl, &io, i / (g.nKV * tiles), i / tiles % g.nKV, r0, r1);
    }
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_attention(df_backend *be) {
  be->block_attn_forward = df_cpu_block_attn_forward;
  be->block_attn_backward = df_cpu_block_attn_backward;
  be->measures[DF_OP_BLOCK_ATTN_FORWARD] = be->measures[DF_OP_BLOCK_ATTN_BACKWARD] = true;
}
