// CUDA twins of EAGLE-3's objective ops (kernels/eagle3.h; CPU oracles in kernels/cpu/eagle3_loss.c): the compact
// teacher's pass over the target vocabulary (cuBLASLt GEMM per row chunk and vocabulary block into the workspace, then
// one block per row folding the block into a running max / sum / first argmax), the teacher rows, the per-row terms
// and their gradient (one block per row, block reductions in a fixed tree), and the step sums and acceptance lengths
// (one block, a fixed partition of the rows summed in double). fp32 storage, except the lse pass, whose GEMM also
// takes bf16 operands (fp32 logits); nothing here waits for the host.
#include <math.h>

#include "kernels/context.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

static const int kThreads = 256;
static const int64_t kChunkRows = 256, kVocabBlock = 8192;

// ---- the compact teacher ------------------------------------------------------------------------------------------

// state [c, 3]: running max, running sum (of exp(z − max)), argmax (as a float index: exact below 2^24).
__global__ void lse_fold_kernel(const float *z, int64_t nb, int64_t v0, double *state, int32_t *arg, int first) {
  __shared__ double sd[32];
  __shared__ df_argmax_t sa[32];
  const int64_t r = blockIdx.x;
  const float *zr = z + r * nb;
  df_argmax_t best = {-INFINITY, 0x7fffffff};
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) best = df_argmax_pick(best, df_argmax_t{zr[j], (int)j});
  best = df_block_argmax(best, sa);
  double m = first ? -INFINITY : state[2 * r], s = first ? 0.0 : state[2 * r + 1];
  const double mn = (double)best.v > m ? (double)best.v : m;
  double part = 0.0;
  for (int64_t j = threadIdx.x; j < nb; j += blockDim.x) part += exp((double)zr[j] - mn);
  part = df_block_sum(part, sd);
  if (threadIdx.x == 0) {
    if (first || (double)best.v > m) arg[r] = (int32_t)(v0 + best.i); // strictly greater: the earlier maximum wins
    state[2 * r] = mn, state[2 * r + 1] = s * exp(m - mn) + part;
  }
}

__global__ void lse_finish_kernel(const double *state, float *lse, int64_t n) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < n) lse[r] = (float)(state[2 * r] + log(state[2 * r + 1]));
}

static df_status cuda_lmhead_lse_argmax(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden, const df_tensor *head,
                                        df_tensor *lse, df_tensor *argmax, df_error *err) {
  const int64_t R = hidden->shape[0], H = hidden->shape[1], V = head->shape[0];
  const int64_t c = chunk_rows > 0 ? chunk_rows : kChunkRows, vb = V < kVocabBlock ? V : kVocabBlock;
  float *buf;
  double *state;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(c * vb), (void **)&buf, err));
  DF_TRY(df_ctx_workspace(ctx, 1, sizeof(double) * (size_t)(2 * c), (void **)&state, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  cudaStream_t s = df_cuda_stream(ctx);
  const size_t es = df_dtype_size(head->dtype); // f32, or bf16 operands into fp32 logits
  for (int64_t r0 = 0; r0 < R; r0 += c) {
    const int64_t n = R - r0 < c ? R - r0 : c;
    for (int64_t v0 = 0; v0 < V; v0 += vb) {
      const int64_t nb = V - v0 < vb ? V - v0 : vb;
      df_cu_gemm_args a = {};
      a.trans_b = true, a.M = n, a.N = nb, a.K = H;
      a.A = (const char *)hidden->data + (size_t)(r0 * H) * es, a.lda = H;
      a.B = (const char *)head->data + (size_t)(v0 * H) * es, a.ldb = H, a.ab_dt = head->dtype;
      a.D = buf, a.ldd = nb, a.cd_dt = DF_F32, a.alpha = 1.0f;
      DF_TRY(df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &a, err));
      lse_fold_kernel<<<(unsigned)n, kThreads, 0, s>>>(buf, nb, v0, state, (int32_t *)argmax->data + r0, v0 == 0);
      DF_CUDA_CHECK_LAUNCH(err, "lse_fold_kernel");
    }
    lse_finish_kernel<<<df_cu_blocks(n, kThreads), kThreads, 0, s>>>(state, (float *)lse->data + r0, n);
    DF_CUDA_CHECK_LAUNCH(err, "lse_finish_kernel");
  }
  return DF_OK;
}

__global__ void teacher_kernel(float *z, int64_t D, const float *lse_v, const int32_t *argmax, const uint8_t *t2d,
                               int64_t V, const float *lm, float *ratio, float *pm) {
  __shared__ double sd[32];
  __shared__ float sf[32];
  const int64_t r = blockIdx.x;
  float *zr = z + r * D;
  float mx = -INFINITY;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) mx = fmaxf(mx, zr[d]);
  mx = df_block_max(mx, sf);
  double s = 0.0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) s += exp((double)zr[d] - mx);
  s = df_block_sum(s, sd);
  const double lse_d = mx + log(s);
  __syncthreads(); // every thread has read zr before it is overwritten
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) zr[d] = (float)exp((double)zr[d] - lse_d);
  if (threadIdx.x == 0) {
    ratio[r] = (float)exp(lse_d - (double)lse_v[r]);
    const int32_t tok = argmax[r];
    pm[r] = tok >= 0 && tok < V && t2d[tok] ? lm[r] : 0.0f;
  }
}

static df_status cuda_eagle3_teacher(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                                     const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio, df_tensor *pm,
                                     df_error *err) {
  const int64_t R = logits->shape[0], D = logits->shape[1];
  teacher_kernel<<<(unsigned)R, kThreads, 0, df_cuda_stream(ctx)>>>(
      (float *)logits->data, D, (const float *)lse_v->data, (const int32_t *)argmax->data, (const uint8_t *)t2d->data,
      t2d->shape[0], (const float *)loss_mask->data, (float *)ratio->data, (float *)pm->data);
  DF_CUDA_CHECK_LAUNCH(err, "teacher_kernel");
  return DF_OK;
}

// ---- the per-step objective ---------------------------------------------------------------------------------------

typedef struct {
  const float *tp, *ratio, *pm, *lm;
  const int32_t *tok, *d2t;
  const int32_t *rows; // P-EAGLE's mapped teacher rows (NULL: row0 + r + step)
  int64_t D, S, step, row0, N;
  int lk;
  bool pm_mean;
  double kl_scale, kl_decay, weight;
} loss_args;

__device__ __forceinline__ int64_t teacher_row_of(const loss_args &a, int64_t r) {
  if (a.rows) return a.rows[r];
  const int64_t g = a.row0 + r;
  return g % a.S + a.step < a.S ? g + a.step : -1;
}

// Row statistics shared by the forward and the backward: lse, Σp, α, β (= Σ q·g), the first argmax.
struct row_stats_t {
  double lse, sum_p, alpha, beta, pz;
  int pred;
};

__device__ row_stats_t row_stats(const float *zr, const float *p, float ratio, int64_t D, bool need_alpha) {
  __shared__ double sd[32];
  __shared__ df_argmax_t sa[32];
  df_argmax_t best = {-INFINITY, 0x7fffffff};
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) best = df_argmax_pick(best, df_argmax_t{zr[d], (int)d});
  best = df_block_argmax(best, sa);
  const double mx = best.v;
  double s = 0.0, sp = 0.0, pz = 0.0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    s += exp((double)zr[d] - mx);
    sp += p[d], pz += (double)p[d] * zr[d];
  }
  row_stats_t st;
  st.pred = best.i;
  st.lse = mx + log(df_block_sum(s, sd));
  st.sum_p = df_block_sum(sp, sd);
  st.pz = df_block_sum(pz, sd);
  st.alpha = st.beta = 0.0;
  if (!need_alpha) return st;
  double al = 0.0, be = 0.0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const double q = exp((double)zr[d] - st.lse), o = (double)p[d] * ratio;
    al += q < o ? q : o;
    be += q < o ? q : (q == o ? 0.5 * q : 0.0);
  }
  st.alpha = df_block_sum(al, sd);
  st.beta = df_block_sum(be, sd);
  return st;
}

__global__ void loss_fwd_kernel(loss_args a, const float *z, float *kl, float *al, float *la, float *po, float *co,
                                float *mo) {
  const int64_t r = blockIdx.x, tr = teacher_row_of(a, r);
  if (tr < 0) {
    if (threadIdx.x == 0) kl[r] = al[r] = la[r] = po[r] = co[r] = mo[r] = 0.0f;
    return;
  }
  const row_stats_t st = row_stats(z + r * a.D, a.tp + tr * a.D, a.ratio[tr], a.D, true);
  if (threadIdx.x != 0) return;
  const double w = a.pm[tr];
  kl[r] = (float)(w * (st.lse * st.sum_p - st.pz));
  al[r] = (float)(w * st.alpha);
  la[r] = (float)(st.alpha > 0 ? w * log(st.alpha) : 0.0);
  po[r] = (float)w;
  co[r] = st.pred + a.d2t[st.pred] == a.tok[tr] ? a.lm[tr] : 0.0f;
  mo[r] = a.lm[tr];
}

__global__ void loss_bwd_kernel(loss_args a, const float *z, const double *local, float *dz) {
  const int64_t r = blockIdx.x, tr = teacher_row_of(a, r);
  float *gr = dz + r * a.D;
  if (tr < 0 || a.pm[tr] == 0.0f) {
    for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) gr[d] = 0.0f;
    return;
  }
  const double den = local[DF_EAGLE3_SUM_PM] > 1e-8 ? local[DF_EAGLE3_SUM_PM] : 1e-8, N = (double)a.N;
  double ck = a.weight / (a.pm_mean ? fmax(local[DF_EAGLE3_SUM_PM], 1e-6) : N), ca = 0.0;
  bool over = false;
  if (a.lk == DF_LK_ALPHA) ck = 0.0, ca = -a.weight / den, over = true;
  if (a.lk == DF_LK_LAMBDA) {
    const double w = a.kl_scale * exp(-a.kl_decay * (local[DF_EAGLE3_SUM_ALPHA] / den));
    ck = a.weight * w / N, ca = -a.weight * (1.0 - w) / den;
  }
  const float *zr = z + r * a.D, *p = a.tp + tr * a.D;
  const float ratio = a.ratio[tr];
  const bool need_alpha = ca != 0.0;
  const row_stats_t st = row_stats(zr, p, ratio, a.D, need_alpha);
  ca *= a.pm[tr], ck *= a.pm[tr];
  if (over) ca = st.alpha > 0 ? ca / st.alpha : 0.0;
  for (int64_t d = threadIdx.x; d < a.D; d += blockDim.x) {
    const double q = exp((double)zr[d] - st.lse), o = (double)p[d] * ratio;
    const double gq = q < o ? 1.0 : (q == o ? 0.5 : 0.0);
    gr[d] = (float)(ck * (q * st.sum_p - p[d]) + (need_alpha ? ca * q * (gq - st.beta) : 0.0));
  }
}

static loss_args args_of(const df_eagle3_loss_desc *desc, const df_tensor *z, const df_eagle3_teacher_rows *t) {
  loss_args a;
  a.tp = (const float *)t->target_p->data, a.ratio = (const float *)t->ratio->data, a.pm = (const float *)t->pm->data;
  a.lm = (const float *)t->loss_mask->data, a.tok = (const int32_t *)t->tokens->data;
  a.d2t = (const int32_t *)t->d2t->data, a.D = z->shape[1], a.S = desc->S, a.step = desc->step;
  a.row0 = desc->row0, a.N = desc->positions, a.lk = (int)desc->lk, a.kl_scale = desc->kl_scale;
  a.kl_decay = desc->kl_decay, a.weight = desc->weight;
  a.rows = desc->rows ? (const int32_t *)desc->rows->data : NULL, a.pm_mean = desc->pm_mean;
  return a;
}

static df_status cuda_eagle3_loss_forward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                          const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out,
                                          df_error *err) {
  loss_fwd_kernel<<<(unsigned)z->shape[0], kThreads, 0, df_cuda_stream(ctx)>>>(
      args_of(desc, z, t), (const float *)z->data, (float *)out->kl->data, (float *)out->alpha->data,
      (float *)out->log_alpha->data, (float *)out->pm->data, (float *)out->correct->data, (float *)out->mask->data);
  DF_CUDA_CHECK_LAUNCH(err, "loss_fwd_kernel");
  return DF_OK;
}

static df_status cuda_eagle3_loss_backward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                           const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                           df_error *err) {
  loss_bwd_kernel<<<(unsigned)z->shape[0], kThreads, 0, df_cuda_stream(ctx)>>>(
      args_of(desc, z, t), (const float *)z->data, (const double *)local->data, (float *)dz->data);
  DF_CUDA_CHECK_LAUNCH(err, "loss_bwd_kernel");
  return DF_OK;
}

// One block: thread t sums rows t, t + blockDim, ... of each term in double; a fixed tree adds the threads.
__global__ void step_sums_kernel(df_eagle3_sums_desc d, int64_t R, const float *kl, const float *al, const float *la,
                                 const float *pm, const float *co, const float *mo, double *local, double *stats) {
  __shared__ double sd[32];
  const float *src[DF_EAGLE3_STEP_LOCAL] = {kl, al, la, pm, co, mo};
  double sums[DF_EAGLE3_STEP_LOCAL];
  for (int k = 0; k < DF_EAGLE3_STEP_LOCAL; k++) {
    double s = 0.0;
    for (int64_t r = threadIdx.x; r < R; r += blockDim.x) s += src[k][r];
    sums[k] = df_block_sum(s, sd);
  }
  if (threadIdx.x != 0) return;
  const double den = sums[DF_EAGLE3_SUM_PM] > 1e-8 ? sums[DF_EAGLE3_SUM_PM] : 1e-8;
  const double kl_den = d.pm_mean ? fmax(sums[DF_EAGLE3_SUM_PM], 1e-6) : (double)d.positions;
  const double klv = sums[DF_EAGLE3_SUM_KL] / kl_den, acc = sums[DF_EAGLE3_SUM_ALPHA] / den;
  const double log_acc = sums[DF_EAGLE3_SUM_LOG_ALPHA] / den;
  double loss = klv;
  if (d.lk == DF_LK_ALPHA) loss = -log_acc;
  if (d.lk == DF_LK_LAMBDA) {
    const double w = d.kl_scale * exp(-d.kl_decay * acc);
    loss = w * klv + (1.0 - w) * (1.0 - acc);
  }
  double *blk = stats + d.step_block;
  for (int k = 0; k < DF_EAGLE3_STEP_LOCAL; k++) local[k] = sums[k], blk[k] += sums[k];
  blk[DF_EAGLE3_S_KL_LOSS] += klv, blk[DF_EAGLE3_S_LOSS] += loss;
  blk[DF_EAGLE3_S_ACCEPT_RATE] += acc, blk[DF_EAGLE3_S_LOG_ACCEPT] += log_acc;
  stats[d.loss_num] += d.step_weight * loss;
  stats[d.acc_num] += sums[DF_EAGLE3_SUM_CORRECT], stats[d.acc_den] += sums[DF_EAGLE3_SUM_MASK];
}

static df_status cuda_eagle3_step_sums(df_ctx *ctx, const df_eagle3_sums_desc *desc, const df_eagle3_row_terms *rows,
                                       df_tensor *local, df_tensor *stats, df_error *err) {
  step_sums_kernel<<<1, kThreads, 0, df_cuda_stream(ctx)>>>(
      *desc, df_numel(rows->kl), (const float *)rows->kl->data, (const float *)rows->alpha->data,
      (const float *)rows->log_alpha->data, (const float *)rows->pm->data, (const float *)rows->correct->data,
      (const float *)rows->mask->data, (double *)local->data, (double *)stats->data);
  DF_CUDA_CHECK_LAUNCH(err, "step_sums_kernel");
  return DF_OK;
}

__global__ void accept_kernel(const float *c, const float *m, int64_t T, int64_t R, int64_t accept_sum, int64_t blocks,
                              double *stats) {
  __shared__ double sd[32];
  double acc = 0.0, n = 0.0;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    if (!(m[r] > 0.0f)) continue;
    int64_t run = 0;
    while (run < T && c[run * R + r] > 0.0f) run++;
    acc += (double)(1 + run), n += 1.0;
  }
  acc = df_block_sum(acc, sd);
  n = df_block_sum(n, sd);
  if (threadIdx.x == 0) stats[accept_sum] += acc, stats[blocks] += n;
}

static df_status cuda_eagle3_accept(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                                    int64_t blocks, df_tensor *stats, df_error *err) {
  accept_kernel<<<1, kThreads, 0, df_cuda_stream(ctx)>>>((const float *)correct->data, (const float *)mask->data,
                                                         correct->shape[0], correct->shape[1], accept_sum, blocks,
                                                         (double *)stats->data);
  DF_CUDA_CHECK_LAUNCH(err, "accept_kernel");
  return DF_OK;
}

extern "C" void df_cuda_register_eagle3_loss(df_backend *be) {
  be->lmhead_lse_argmax = cuda_lmhead_lse_argmax;
  be->eagle3_teacher = cuda_eagle3_teacher;
  be->eagle3_loss_forward = cuda_eagle3_loss_forward;
  be->eagle3_loss_backward = cuda_eagle3_loss_backward;
  be->eagle3_step_sums = cuda_eagle3_step_sums;
  be->eagle3_accept = cuda_eagle3_accept;
  be->measures[DF_OP_LMHEAD_LSE_ARGMAX] = true;
}
