// CPU fused Domino LM head (kernels/ops_domino.h), the oracle: lmhead_dspark.c's row tiling (rowtile.h: whole 48-row
// blocks of the global row index, row r always in slot r mod 48, so every per-row output is bitwise the same for any
// chunk_rows and thread count) with two logit sets per tile. Per tile of n rows:
//   b[n, V] = x[n, H] · headᵀ                       base logits (sgemm)
//   f[n, V] = b + u[n, E] · w2ᵀ                     final logits (copy, then a beta = 1 sgemm)
//   per row: both softmaxes, CEs and argmaxes; f becomes Gf = fs·w·(p_f − onehot), b becomes Gf + bs·w·(p_b − onehot)
//   dx[n, H] = b · head,  du[n, E] = f · w2         (scattered into dhidden, dcorr)
// and dw2 += Gfᵀ · u, which sums over rows: after each wave of tiles (one per thread) the team splits the vocabulary
// into fixed slices and adds the wave's 48-row blocks in global block order, so dw2 does not depend on the thread
// count. Memory: threads · tile · (2V + 2H + 2E) floats; the [R, V] logits never exist whole.
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

enum { LD_VSLICE = 768 }; // vocabulary rows per dw2 slice (fixed: the dw2 rounding must not depend on threads)

typedef struct {
  df_rt_plan plan;
  const float *hidden, *head, *u, *w2, *weights;
  const int32_t *labels;
  float *ce_f, *ce_b, *dhidden, *du, *dw2;
  uint8_t *ok_f, *ok_b;
  int64_t R, H, V, E, ldz;
  float fs, bs; // final_scale, base_scale
} dm_job;

typedef struct {
  float *x, *dx, *u, *du, *zb, *zf;
} dm_scratch;

static void *ptr(const df_tensor *t) { return t ? t->data : NULL; }

// One live row: zb, zf [V] its base and final logits. With grad, zf becomes Gf and zb becomes Gf + Gb.
static void dm_row(const dm_job *jb, int64_t r, float *zb, float *zf, bool grad) {
  const int64_t V = jb->V;
  const int32_t label = jb->labels[r];
  const float lf = zf[label], lb = zb[label];
  int64_t af, ab;
  double sf, sb;
  const float mf = df_softmax_row_in_place(zf, V, &af, &sf), mb = df_softmax_row_in_place(zb, V, &ab, &sb);
  jb->ce_f[r] = (float)((double)mf - (double)lf + log(sf));
  jb->ce_b[r] = (float)((double)mb - (double)lb + log(sb));
  jb->ok_f[r] = af == label, jb->ok_b[r] = ab == label;
  if (!grad) return;
  const float w = jb->weights ? jb->weights[r] : 1.0f, cf = jb->fs * w, cb = jb->bs * w;
  const float kf = cf * (float)(1.0 / sf), kb = cb * (float)(1.0 / sb);
#pragma omp simd
  for (int64_t v = 0; v < V; v++) {
    zf[v] *= kf;
    zb[v] *= kb;
  }
  zf[label] -= cf;
  zb[label] -= cb;
#pragma omp simd
  for (int64_t v = 0; v < V; v++) zb[v] += zf[v];
}

// Live rows of the tile into x and u; other rows are zero, so their logits and gradients stay 0.
static void gather(const dm_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t n, const dm_scratch *s) {
  const size_t hb = sizeof(float) * (size_t)jb->H, ub = sizeof(float) * (size_t)jb->E;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = df_rt_tile_row(blocks, i);
    if (df_rt_row_live(&jb->plan, r, ch)) {
      memcpy(s->x + i * jb->H, jb->hidden + r * jb->H, hb);
      memcpy(s->u + i * jb->E, jb->u + r * jb->E, ub);
    } else {
      memset(s->x + i * jb->H, 0, hb);
      memset(s->u + i * jb->E, 0, ub);
    }
  }
}

static void dm_tile(const dm_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t nb, const dm_scratch *s) {
  const int64_t H = jb->H, V = jb->V, E = jb->E, n = nb * DF_RT_BLOCK, ldz = jb->ldz;
  gather(jb, ch, blocks, n, s);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)H, 1.0f, s->x, (int)H, jb->head, (int)H,
              0.0f, s->zb, (int)ldz);
  memcpy(s->zf, s->zb, sizeof(float) * (size_t)(n * ldz));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)E, 1.0f, s->u, (int)E, jb->w2, (int)E, 1.0f,
              s->zf, (int)ldz);
  const bool grad = jb->dhidden != NULL;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = df_rt_tile_row(blocks, i);
    if (df_rt_row_live(&jb->plan, r, ch)) dm_row(jb, r, s->zb + i * ldz, s->zf + i * ldz, grad);
  }
  if (!grad) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)V, 1.0f, s->zb, (int)ldz, jb->head,
              (int)H, 0.0f, s->dx, (int)H);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)E, (int)V, 1.0f, s->zf, (int)ldz, jb->w2, (int)E,
              0.0f, s->du, (int)E);
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = df_rt_tile_row(blocks, i);
    if (!df_rt_row_live(&jb->plan, r, ch)) continue;
    memcpy(jb->dhidden + r * H, s->dx + i * H, sizeof(float) * (size_t)H);
    memcpy(jb->du + r * E, s->du + i * E, sizeof(float) * (size_t)E);
  }
}

// ---- scratch and the chunk loop ------------------------------------------------------------------------------

static size_t scratch_floats(const dm_job *jb) {
  const int64_t n = jb->plan.tile_blocks * DF_RT_BLOCK, hx = df_rt_round_up(n * jb->H, DF_RT_PAD),
                ux = df_rt_round_up(n * jb->E, DF_RT_PAD);
  return (size_t)(2 * hx + 2 * ux + 2 * n * jb->ldz);
}

static dm_scratch carve(const dm_job *jb, float *p) {
  const int64_t n = jb->plan.tile_blocks * DF_RT_BLOCK, hx = df_rt_round_up(n * jb->H, DF_RT_PAD),
                ux = df_rt_round_up(n * jb->E, DF_RT_PAD);
  dm_scratch s;
  s.x = p, p += hx;
  s.dx = p, p += hx;
  s.u = p, p += ux;
  s.du = p, p += ux;
  s.zb = p, p += n * jb->ldz;
  s.zf = p;
  return s;
}

// dw2[v0:v1] += Gf_blockᵀ · u_block over the wave's tiles, block by block in global order.
static void dw2_slice(const dm_job *jb, const df_rt_chunk *ch, int64_t wave_first, int64_t ntiles, float *scratch,
                      size_t per_thread, int64_t v0, int64_t v1) {
  const int E = (int)jb->E;
  for (int64_t j = 0; j < ntiles; j++) {
    const dm_scratch s = carve(jb, scratch + per_thread * (size_t)j);
    const int64_t a = (wave_first + j) * jb->plan.tile_blocks, nb = df_rt_min64(ch->count - a, jb->plan.tile_blocks);
    for (int64_t b = 0; b < nb; b++)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(v1 - v0), E, DF_RT_BLOCK, 1.0f,
                  s.zf + b * DF_RT_BLOCK * jb->ldz + v0, (int)jb->ldz, s.u + b * DF_RT_BLOCK * E, E, 1.0f,
                  jb->dw2 + v0 * E, E);
  }
}

// One chunk as waves of `team` tiles (thread j takes tile wave + j), each followed by the dw2 sum.
static void chunk_waves(const dm_job *jb, const df_rt_chunk *ch, float *scratch, size_t per_thread, int team, int tid) {
  const int64_t ntiles = df_rt_ntiles(&jb->plan, ch), nslices = (jb->V + LD_VSLICE - 1) / LD_VSLICE;
  const dm_scratch mine = carve(jb, scratch + per_thread * (size_t)tid);
  for (int64_t w0 = 0; w0 < ntiles; w0 += team) {
    const int64_t t = w0 + tid;
    if (t < ntiles) {
      const int64_t a = t * jb->plan.tile_blocks;
      dm_tile(jb, ch, jb->plan.blocks + ch->first + a, df_rt_min64(ch->count - a, jb->plan.tile_blocks), &mine);
    }
#pragma omp barrier
    const int64_t nt = df_rt_min64(team, ntiles - w0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t sl = 0; sl < nslices; sl++)
      dw2_slice(jb, ch, w0, nt, scratch, per_thread, sl * LD_VSLICE, df_rt_min64((sl + 1) * LD_VSLICE, jb->V));
  }
}

static void run_chunks(const dm_job *jb, float *scratch, size_t per_thread, int team) {
  const bool waves = jb->dhidden != NULL;
#pragma omp parallel num_threads(team)
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    const dm_scratch mine = carve(jb, scratch + per_thread * (size_t)tid);
    for (int64_t c = 0; c < jb->plan.nchunks; c++) {
      const df_rt_chunk *ch = &jb->plan.chunks[c];
      if (waves) {
        chunk_waves(jb, ch, scratch, per_thread, team, tid);
        continue;
      }
      const int64_t ntiles = df_rt_ntiles(&jb->plan, ch);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < ntiles; t++) {
        const int64_t a = t * jb->plan.tile_blocks;
        dm_tile(jb, ch, jb->plan.blocks + ch->first + a, df_rt_min64(ch->count - a, jb->plan.tile_blocks), &mine);
      }
    }
  }
}

// Skipped rows: every per-row output and gradient row is 0.
static void clear_skipped(const dm_job *jb, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (jb->R > 4096)
  for (int64_t r = 0; r < jb->R; r++) {
    if (jb->labels[r] >= 0) continue;
    jb->ce_f[r] = jb->ce_b[r] = 0.0f, jb->ok_f[r] = jb->ok_b[r] = 0;
    if (!jb->dhidden) continue;
    memset(jb->dhidden + r * jb->H, 0, sizeof(float) * (size_t)jb->H);
    memset(jb->du + r * jb->E, 0, sizeof(float) * (size_t)jb->E);
  }
}

static df_status run_with_scratch(const dm_job *jb, int team, df_error *err) {
  const size_t per_thread = df_rt_round_up((int64_t)scratch_floats(jb), DF_RT_PAD);
  const size_t bytes = per_thread * (size_t)team * sizeof(float);
  float *scratch = aligned_alloc(64, bytes);
  if (!scratch)
    return DF_FAIL(err, DF_ERR_NOMEM, "lmhead_domino", "lower the thread count or objective_chunk_blocks",
                   "cannot allocate %zu bytes of logits scratch", bytes);
  run_chunks(jb, scratch, per_thread, team);
  free(scratch);
  return DF_OK;
}

static df_status cpu_lmhead_domino(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in,
                                   const df_lmhead_domino_out *out, df_error *err) {
  const bool grad = out->dhidden != NULL;
  dm_job jb = {.hidden = in->hidden->data,
               .head = in->head->data,
               .u = in->corr->data,
               .w2 = in->w2->data,
               .weights = ptr(in->weights),
               .labels = in->labels->data,
               .ce_f = out->ce_final->data,
               .ce_b = out->ce_base->data,
               .ok_f = out->correct_final->data,
               .ok_b = out->correct_base->data,
               .dhidden = ptr(out->dhidden),
               .du = grad ? out->dcorr->data : NULL,
               .dw2 = grad ? out->dw2->data : NULL,
               .R = df_rows(in->hidden),
               .H = in->head->shape[1],
               .V = in->head->shape[0],
               .E = in->w2->shape[1],
               .fs = desc->final_scale,
               .bs = desc->base_scale};
  DF_TRY(df_rt_check_labels(jb.labels, jb.R, jb.V, "skip", err));
  if (jb.R == 0) return DF_OK;
  const int nthreads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  DF_TRY(df_rt_plan_init(&jb.plan, jb.labels, jb.R, desc->chunk_rows, jb.V, 2, nthreads, "lmhead_domino", err));
  jb.ldz = df_rt_round_up(jb.V, DF_RT_PAD);
  const int team = df_rt_team_size(&jb.plan, nthreads);
  df_status st = team > 0 ? run_with_scratch(&jb, team, err) : DF_OK;
  if (st == DF_OK) clear_skipped(&jb, nthreads);
  df_rt_plan_free(&jb.plan);
  return st;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_lmhead_domino(df_backend *be) { be->lmhead_domino = cpu_lmhead_domino; }
