// CPU fused DSpark objective: the row tiling of rowtile.h, shared with lmhead_ce.c (whole 48-row blocks of the global
// row index, a row always in slot r mod 48, so every per-row output is bitwise the same whatever chunk_rows and the
// thread count), with two logit sets per tile. Per tile of n rows:
//   z[n, V] = x[n, H] · headᵀ (+ u[n, r] · w2ᵀ)              draft logits (sgemm, then a beta = 1 sgemm)
//   t[n, V] = xt[n, H] · headᵀ                               teacher logits
//   per row: softmaxes, CE, L1, argmaxes, top-1 probabilities, BCE; z becomes the logit gradient G
//   dx[n, H] = G · head,  du[n, r] = G · w2                  (scattered into dhidden, du)
// and dw2 += Gᵀ · u, which sums over rows. That sum runs after each wave of tiles (one tile per thread):
// the team splits the vocabulary into fixed slices and adds the wave's 48-row blocks in global block order,
// so dw2 is bitwise independent of the thread count (a chunk border inside a 48-row block changes the
// grouping of that block's rows, hence its rounding, but not the value beyond it).
// Memory: threads · tile · (2V + 3H + 2r) floats; the [R, V] logits never exist whole.
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

enum {
  LD_VSLICE = 768, // vocabulary rows per dw2 slice (fixed: the dw2 rounding must not depend on threads)
};

typedef struct {
  df_rt_plan plan;
  const float *hidden, *head, *u, *w2, *teacher, *weights, *conf;
  const int32_t *labels;
  float *ce, *top1, *l1, *ttop1, *bce, *dhidden, *du, *dw2, *dconf;
  uint8_t *correct, *agree;
  int64_t R, H, V, r; // r: Markov rank, 0 without a Markov latent
  int64_t ldz;        // logit row stride
  float gs, a_ce, a_l1, a_conf;
} ld_job;

// One thread's scratch pieces.
typedef struct {
  float *x, *xt, *dx, *u, *du, *z, *t;
} ld_scratch;

static void *ptr(const df_tensor *t) { return t ? t->data : NULL; }

// ---- one row -------------------------------------------------------------------------------------------------

// torch.sign: ties give 0, so equal probabilities pass no L1 gradient.
static inline float sign_of(float d) { return (float)((d > 0.0f) - (d < 0.0f)); }

static inline double sigmoid(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// Teacher part of a row: z becomes p = softmax(z) (it holds exp(z − max), reciprocal sum invz), t becomes
// q = softmax(t); L1, agreement, teacher top-1, BCE and its gradient. Returns a = Σ_v sign(p_v − q_v)·p_v.
// (p and q are also stored, so no multiply can be contracted into p − q: the gradient pass, which reads them
// back, sees the same signs.)
static double teacher_row(const ld_job *jb, int64_t r, float *z, float invz, int64_t az, float *t, bool grad) {
  int64_t V = jb->V, at;
  double st;
  df_softmax_row_in_place(t, V, &at, &st);
  float invt = (float)(1.0 / st);
  double l1 = 0.0, a = 0.0;
#pragma omp simd reduction(+ : l1, a)
  for (int64_t v = 0; v < V; v++) {
    float p = z[v] * invz, q = t[v] * invt;
    z[v] = p, t[v] = q;
    l1 += fabs((double)p - (double)q);
    a += (double)(sign_of(p - q) * p);
  }
  float l1f = (float)l1;
  if (jb->l1) jb->l1[r] = l1f;
  if (jb->agree) jb->agree[r] = az == at;
  if (jb->ttop1) jb->ttop1[r] = invt; // max q = exp(0) / Σ
  if (jb->conf) {
    double c = jb->conf[r], y = fmin(fmax(1.0 - 0.5 * (double)l1f, 0.0), 1.0); // target detached
    if (jb->bce) jb->bce[r] = (float)(fmax(c, 0.0) - c * y + log1p(exp(-fabs(c))));
    if (grad) {
      double w = jb->weights ? jb->weights[r] : 1.0;
      jb->dconf[r] = (float)((double)jb->gs * w * jb->a_conf * (sigmoid(c) - y));
    }
  }
  return a;
}

// One live row: z [V] draft logits, t [V] teacher logits (or NULL). With grad, z becomes the logit gradient
//   G_v = gs·w·(α_ce (p_v − δ_v,label) + α_l1 p_v (sign(p_v − q_v) − a)).
static void ld_row(const ld_job *jb, int64_t r, float *z, float *t, bool grad) {
  int64_t V = jb->V, az;
  int32_t label = jb->labels[r];
  float zl = z[label];
  double sz;
  float mz = df_softmax_row_in_place(z, V, &az, &sz);
  jb->ce[r] = (float)((double)mz - (double)zl + log(sz));
  jb->correct[r] = az == label;
  float invz = (float)(1.0 / sz);
  if (jb->top1) jb->top1[r] = invz;                              // max p = exp(0) / Σ
  double a = t ? teacher_row(jb, r, z, invz, az, t, grad) : 0.0; // z = p from here on, with a teacher
  if (!grad) return;
  float c1 = jb->gs * (jb->weights ? jb->weights[r] : 1.0f);
  if (!t) {
    float c = c1 * jb->a_ce * invz;
#pragma omp simd
    for (int64_t v = 0; v < V; v++) z[v] *= c;
  } else {
    float A = (float)(c1 * (jb->a_ce - jb->a_l1 * a)), B = c1 * jb->a_l1;
#pragma omp simd
    for (int64_t v = 0; v < V; v++) {
      float p = z[v];
      z[v] = p * (A + B * sign_of(p - t[v]));
    }
  }
  z[label] -= c1 * jb->a_ce;
}

// ---- tiles ---------------------------------------------------------------------------------------------------

// Live rows of the tile into x (and xt, u); other rows are zero, so their logits and gradients stay 0.
static void gather(const ld_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t n, const ld_scratch *s) {
  size_t hb = sizeof(float) * (size_t)jb->H, ub = sizeof(float) * (size_t)jb->r;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    bool live = df_rt_row_live(&jb->plan, r, ch);
    if (live)
      memcpy(s->x + i * jb->H, jb->hidden + r * jb->H, hb);
    else
      memset(s->x + i * jb->H, 0, hb);
    if (jb->teacher) {
      if (live)
        memcpy(s->xt + i * jb->H, jb->teacher + r * jb->H, hb);
      else
        memset(s->xt + i * jb->H, 0, hb);
    }
    if (jb->r) {
      if (live)
        memcpy(s->u + i * jb->r, jb->u + r * jb->r, ub);
      else
        memset(s->u + i * jb->r, 0, ub);
    }
  }
}

static void ld_tile(const ld_job *jb, const df_rt_chunk *ch, const int64_t *blocks, int64_t nb, const ld_scratch *s) {
  int64_t H = jb->H, V = jb->V, n = nb * DF_RT_BLOCK, ldz = jb->ldz;
  int rk = (int)jb->r;
  gather(jb, ch, blocks, n, s);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)H, 1.0f, s->x, (int)H, jb->head, (int)H,
              0.0f, s->z, (int)ldz);
  if (rk)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, rk, 1.0f, s->u, rk, jb->w2, rk, 1.0f, s->z,
                (int)ldz);
  if (jb->teacher)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)H, 1.0f, s->xt, (int)H, jb->head, (int)H,
                0.0f, s->t, (int)ldz);
  bool grad = jb->dhidden != NULL;
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    if (df_rt_row_live(&jb->plan, r, ch)) ld_row(jb, r, s->z + i * ldz, jb->teacher ? s->t + i * ldz : NULL, grad);
  }
  if (!grad) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)H, (int)V, 1.0f, s->z, (int)ldz, jb->head, (int)H,
              0.0f, s->dx, (int)H);
  if (rk)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, rk, (int)V, 1.0f, s->z, (int)ldz, jb->w2, rk, 0.0f,
                s->du, rk);
  for (int64_t i = 0; i < n; i++) {
    int64_t r = df_rt_tile_row(blocks, i);
    if (!df_rt_row_live(&jb->plan, r, ch)) continue;
    memcpy(jb->dhidden + r * H, s->dx + i * H, sizeof(float) * (size_t)H);
    if (rk) memcpy(jb->du + r * rk, s->du + i * rk, sizeof(float) * (size_t)rk);
  }
}

// ---- scratch and the chunk loop ------------------------------------------------------------------------------

static size_t scratch_floats(const ld_job *jb) {
  int64_t n = jb->plan.tile_blocks * DF_RT_BLOCK, hx = df_rt_round_up(n * jb->H, DF_RT_PAD),
          ux = df_rt_round_up(n * jb->r, DF_RT_PAD);
  int64_t logits = n * jb->ldz * (jb->teacher ? 2 : 1);
  return (size_t)(hx * (jb->teacher ? 3 : 2) + 2 * ux + logits);
}

static ld_scratch carve(const ld_job *jb, float *base) {
  int64_t n = jb->plan.tile_blocks * DF_RT_BLOCK, hx = df_rt_round_up(n * jb->H, DF_RT_PAD),
          ux = df_rt_round_up(n * jb->r, DF_RT_PAD);
  ld_scratch s = {0};
  float *p = base;
  s.x = p, p += hx;
  s.dx = p, p += hx;
  if (jb->teacher) s.xt = p, p += hx;
  s.u = p, p += ux;
  s.du = p, p += ux;
  s.z = p, p += n * jb->ldz;
  if (jb->teacher) s.t = p;
  return s;
}

// dw2[v0:v1] += G_blockᵀ · u_block over the wave's tiles, block by block in global order.
static void dw2_slice(const ld_job *jb, const df_rt_chunk *ch, int64_t wave_first, int64_t ntiles, float *scratch,
                      size_t per_thread, int64_t v0, int64_t v1) {
  int rk = (int)jb->r;
  for (int64_t j = 0; j < ntiles; j++) {
    ld_scratch s = carve(jb, scratch + per_thread * (size_t)j);
    int64_t a = (wave_first + j) * jb->plan.tile_blocks, nb = df_rt_min64(ch->count - a, jb->plan.tile_blocks);
    for (int64_t b = 0; b < nb; b++)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(v1 - v0), rk, DF_RT_BLOCK, 1.0f,
                  s.z + b * DF_RT_BLOCK * jb->ldz + v0, (int)jb->ldz, s.u + b * DF_RT_BLOCK * rk, rk, 1.0f,
                  jb->dw2 + v0 * rk, rk);
  }
}

// One chunk as waves of `team` tiles (thread j takes tile wave + j), each followed by the dw2 sum.
static void chunk_waves(const ld_job *jb, const df_rt_chunk *ch, float *scratch, size_t per_thread, int team, int tid) {
  int64_t ntiles = df_rt_ntiles(&jb->plan, ch);
  int64_t nslices = (jb->V + LD_VSLICE - 1) / LD_VSLICE;
  ld_scratch mine = carve(jb, scratch + per_thread * (size_t)tid);
  for (int64_t w0 = 0; w0 < ntiles; w0 += team) {
    int64_t t = w0 + tid;
    if (t < ntiles) {
      int64_t a = t * jb->plan.tile_blocks;
      ld_tile(jb, ch, jb->plan.blocks + ch->first + a, df_rt_min64(ch->count - a, jb->plan.tile_blocks), &mine);
    }
#pragma omp barrier
    int64_t nt = df_rt_min64(team, ntiles - w0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t sl = 0; sl < nslices; sl++)
      dw2_slice(jb, ch, w0, nt, scratch, per_thread, sl * LD_VSLICE, df_rt_min64((sl + 1) * LD_VSLICE, jb->V));
  }
}

static void run_chunks(const ld_job *jb, float *scratch, size_t per_thread, int team) {
  bool waves = jb->dhidden && jb->r > 0;
#pragma omp parallel num_threads(team)
  {
#ifdef _OPENMP
    int tid = omp_get_thread_num();
#else
    int tid = 0;
#endif
    ld_scratch mine = carve(jb, scratch + per_thread * (size_t)tid);
    for (int64_t c = 0; c < jb->plan.nchunks; c++) {
      const df_rt_chunk *ch = &jb->plan.chunks[c];
      if (waves) {
        chunk_waves(jb, ch, scratch, per_thread, team, tid);
        continue;
      }
      int64_t ntiles = df_rt_ntiles(&jb->plan, ch);
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < ntiles; t++) {
        int64_t a = t * jb->plan.tile_blocks;
        ld_tile(jb, ch, jb->plan.blocks + ch->first + a, df_rt_min64(ch->count - a, jb->plan.tile_blocks), &mine);
      }
    }
  }
}

// Skipped rows: every per-row output and gradient row is 0.
static void clear_skipped(const ld_job *jb, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (jb->R > 4096)
  for (int64_t r = 0; r < jb->R; r++) {
    if (jb->labels[r] >= 0) continue;
    jb->ce[r] = 0.0f, jb->correct[r] = 0;
    if (jb->top1) jb->top1[r] = 0.0f;
    if (jb->l1) jb->l1[r] = 0.0f;
    if (jb->agree) jb->agree[r] = 0;
    if (jb->ttop1) jb->ttop1[r] = 0.0f;
    if (jb->bce) jb->bce[r] = 0.0f;
    if (jb->dconf) jb->dconf[r] = 0.0f;
    if (jb->dhidden) memset(jb->dhidden + r * jb->H, 0, sizeof(float) * (size_t)jb->H);
    if (jb->dhidden && jb->r) memset(jb->du + r * jb->r, 0, sizeof(float) * (size_t)jb->r);
  }
}

static df_status run_with_scratch(const ld_job *jb, int team, df_error *err) {
  size_t per_thread = df_rt_round_up((int64_t)scratch_floats(jb), DF_RT_PAD);
  size_t bytes = per_thread * (size_t)team * sizeof(float);
  float *scratch = aligned_alloc(64, bytes);
  if (!scratch)
    return DF_FAIL(err, DF_ERR_NOMEM, "lmhead_dspark", "lower the thread count or objective_chunk_blocks",
                   "cannot allocate %zu bytes of logits scratch", bytes);
  run_chunks(jb, scratch, per_thread, team);
  free(scratch);
  return DF_OK;
}

df_status df_cpu_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                               const df_lmhead_dspark_out *out, df_error *err) {
  bool grad = out->dhidden != NULL;
  ld_job jb = {.hidden = in->hidden->data,
               .head = in->head->data,
               .u = ptr(in->markov_u),
               .w2 = ptr(in->markov_w2),
               .teacher = ptr(in->teacher),
               .weights = ptr(in->weights),
               .conf = ptr(in->conf),
               .labels = in->labels->data,
               .ce = out->ce->data,
               .top1 = ptr(out->draft_top1),
               .l1 = ptr(out->l1),
               .ttop1 = ptr(out->teacher_top1),
               .bce = ptr(out->bce),
               .dhidden = ptr(out->dhidden),
               .du = grad ? ptr(out->du) : NULL,
               .dw2 = grad ? ptr(out->dw2) : NULL,
               .dconf = grad ? ptr(out->dconf) : NULL,
               .correct = out->correct->data,
               .agree = ptr(out->agree),
               .R = df_rows(in->hidden),
               .H = in->head->shape[1],
               .V = in->head->shape[0],
               .r = in->markov_u ? in->markov_w2->shape[1] : 0,
               .gs = desc->grad_scale,
               .a_ce = desc->alpha_ce,
               .a_l1 = desc->alpha_l1,
               .a_conf = desc->alpha_conf};
  DF_TRY(df_rt_check_labels(jb.labels, jb.R, jb.V, "skip", err));
  if (jb.R == 0) return DF_OK;
  int nthreads = ctx->num_threads > 0 ? ctx->num_threads : 1;
  DF_TRY(df_rt_plan_init(&jb.plan, jb.labels, jb.R, desc->chunk_rows, jb.V, jb.teacher ? 2 : 1, nthreads,
                         "lmhead_dspark", err));
  jb.ldz = df_rt_round_up(jb.V, DF_RT_PAD);
  int team = df_rt_team_size(&jb.plan, nthreads);
  df_status st = team > 0 ? run_with_scratch(&jb, team, err) : DF_OK;
  if (st == DF_OK) clear_skipped(&jb, nthreads);
  df_rt_plan_free(&jb.plan);
  return st;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_lmhead_dspark(df_backend *be) { be->lmhead_dspark = df_cpu_lmhead_dspark; }
