// CUDA block-objective ops (twin of kernels/cpu/metrics.c): D-PACE's detached weights (one thread per block) and
// the DFlash / DSpark per-block metric sums. The sums are a few thousand rows per micro-step, so one thread runs the
// CPU loop in its exact order: the double sums are the CPU's bit for bit (up to libm's and CUDA's exp in D-PACE).
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

__global__ void dpace_kernel(df_dpace_mode mode, double alpha, int64_t nb, int64_t bs, const float *ce, const float *w,
                             float *out, float *row_w, double *prefix_all) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= nb) return;
  const float *c = ce + i * bs, *wt = w + i * bs;
  float *o = out + i * bs;
  double *prefix = prefix_all + i * bs, p = 1.0;
  for (int64_t k = 0; k < bs; k++) {
    const double s = wt[k] != 0.0f ? (1.0 - alpha) * exp(-(double)c[k]) + alpha : 1.0;
    prefix[k] = p *= s;
  }
  double suffix = 0.0;
  for (int64_t k = bs - 1; k >= 0; k--) {
    suffix += prefix[k] * wt[k];
    const double v = mode == DF_DPACE_PREFIX   ? prefix[k]
                     : mode == DF_DPACE_SUFFIX ? suffix
                     : prefix[k] > 0           ? suffix / prefix[k]
                                               : 0.0;
    o[k] = mode == DF_DPACE_ONE ? 1.0f : (float)v;
  }
  if (row_w)
    for (int64_t k = 0; k < bs; k++) row_w[i * bs + k] = wt[k] * o[k];
}

__device__ int64_t accept_len(const uint8_t *valid, const uint8_t *correct, int64_t bs) {
  int64_t run = 0;
  for (int64_t k = 1; k < bs; k++) {
    if (!valid[k]) continue;
    if (!correct[k]) break;
    run++;
  }
  return 1 + run;
}

__global__ void block_metrics_kernel(int64_t bs, int64_t R, const float *c, const uint8_t *cor, const float *w,
                                     const uint8_t *val, const uint8_t *kp, double *pos, double *st) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int64_t nb = R / bs;
  double loss = 0.0, accept = 0.0, blocks = 0.0;
  for (int64_t r = 0; r < R; r++) loss += (double)c[r] * w[r];
  for (int64_t k = 0; k < 2 * bs; k++) pos[k] = 0.0;
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *v = val + i * bs, *ok = cor + i * bs;
    for (int64_t k = 0; k < bs; k++) pos[k] += v[k] && ok[k], pos[bs + k] += v[k];
    if (!kp[i]) continue;
    blocks += 1.0;
    accept += (double)accept_len(v, ok, bs);
  }
  double acc_num = 0.0, acc_den = 0.0;
  for (int64_t k = 0; k < bs; k++) acc_num += pos[k], acc_den += pos[bs + k];
  st[DF_BSTAT_LOSS_NUM] += loss;
  st[DF_BSTAT_ACC_NUM] += acc_num, st[DF_BSTAT_ACC_DEN] += acc_den;
  st[DF_BSTAT_ACCEPT_SUM] += accept, st[DF_BSTAT_BLOCKS] += blocks;
  for (int64_t k = 0; k < 2 * bs; k++) st[DF_BSTAT_POS + k] += pos[k];
}

__device__ __forceinline__ double sigmoid_d(double x) {
  const double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

struct dspark_ptrs {
  const float *ce, *w, *top1, *l1, *ttop1, *bce, *conf;
  const uint8_t *cor, *val, *agree, *keep;
};

__global__ void dspark_metrics_kernel(int64_t bs, int64_t nb, dspark_ptrs in, double *pos, double *st) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double m[DF_DSTAT_POS];
  for (int j = 0; j < DF_DSTAT_POS; j++) m[j] = 0.0;
  for (int64_t k = 0; k < 3 * bs; k++) pos[k] = 0.0;
  const bool teacher = in.l1 != NULL, conf = in.bce != NULL;
  for (int64_t i = 0; i < nb; i++) {
    int64_t greedy = 0;
    bool any = false, run = true;
    double prod = 1.0, expect = 0.0;
    for (int64_t k = 0; k < bs; k++) {
      const int64_t r = i * bs + k;
      const bool v = in.val[r];
      const double wr = in.w[r];
      m[DF_DSTAT_CE] += (double)in.ce[r] * wr;
      if (v) any = true, pos[2 * bs + k] += 1, pos[k] += in.ce[r], pos[bs + k] += in.cor[r];
      run = run && v && in.cor[r];
      greedy += run;
      if (!teacher) continue;
      const double y = fmin(fmax(1.0 - 0.5 * (double)in.l1[r], 0.0), 1.0);
      m[DF_DSTAT_L1] += (double)in.l1[r] * wr;
      prod *= v ? y : 0.0;
      expect += prod;
      if (v) {
        m[DF_DSTAT_AGREE] += in.agree[r];
        m[DF_DSTAT_TTOP1] += in.ttop1[r];
        m[DF_DSTAT_DTOP1] += in.top1[r];
      }
      if (!conf) continue;
      m[DF_DSTAT_CONF] += (double)in.bce[r] * wr;
      m[DF_DSTAT_CONF_ERR] += fabs(sigmoid_d(in.conf[r]) - y) * wr;
    }
    if (in.keep[i]) m[DF_DSTAT_BLOCKS] += 1, m[DF_DSTAT_GREEDY] += (double)(1 + greedy);
    if (teacher && any) m[DF_DSTAT_TAU_NUM] += 1.0 + expect, m[DF_DSTAT_TAU_DEN] += 1.0;
  }
  for (int64_t k = 0; k < bs; k++) m[DF_DSTAT_ACC_NUM] += pos[bs + k], m[DF_DSTAT_EVAL_DEN] += pos[2 * bs + k];
  for (int j = 0; j < DF_DSTAT_POS; j++) st[j] += m[j];
  for (int64_t k = 0; k < 3 * bs; k++) st[DF_DSTAT_POS + k] += pos[k];
}

template <typename T> const T *ptr(const df_tensor *t) { return t ? (const T *)t->data : NULL; }

} // namespace

static df_status cuda_dpace_weights(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                                    const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err) {
  const int64_t nb = df_numel(ce) / bs;
  if (nb <= 0) return DF_OK;
  double *prefix = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)(nb * bs), (void **)&prefix, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  dpace_kernel<<<df_cu_blocks(nb, 128), 128, 0, df_cuda_stream(ctx)>>>(mode, alpha, nb, bs, (const float *)ce->data,
                                                                       (const float *)w->data, (float *)out->data,
                                                                       row_w ? (float *)row_w->data : NULL, prefix);
  DF_CU_CHECK_LAUNCH(err, "dpace_weights");
  return DF_OK;
}

static df_status cuda_block_metrics(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct,
                                    const df_tensor *lw, const df_tensor *valid, const df_tensor *keep,
                                    df_tensor *stats, df_error *err) {
  double *pos = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * 2 * (size_t)bs, (void **)&pos, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  block_metrics_kernel<<<1, 32, 0, df_cuda_stream(ctx)>>>(
      bs, df_numel(ce), (const float *)ce->data, (const uint8_t *)correct->data, (const float *)lw->data,
      (const uint8_t *)valid->data, (const uint8_t *)keep->data, pos, (double *)stats->data);
  DF_CU_CHECK_LAUNCH(err, "block_metrics");
  return DF_OK;
}

static df_status cuda_dspark_block_metrics(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *in, df_tensor *stats,
                                           df_error *err) {
  double *pos = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * 3 * (size_t)bs, (void **)&pos, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  dspark_ptrs p;
  p.ce = ptr<float>(in->ce), p.w = ptr<float>(in->weights), p.top1 = ptr<float>(in->draft_top1);
  p.l1 = ptr<float>(in->l1), p.ttop1 = ptr<float>(in->teacher_top1), p.bce = ptr<float>(in->bce);
  p.conf = ptr<float>(in->conf), p.cor = ptr<uint8_t>(in->correct), p.val = ptr<uint8_t>(in->valid);
  p.agree = ptr<uint8_t>(in->agree), p.keep = ptr<uint8_t>(in->keep);
  dspark_metrics_kernel<<<1, 32, 0, df_cuda_stream(ctx)>>>(bs, df_numel(in->ce) / bs, p, pos, (double *)stats->data);
  DF_CU_CHECK_LAUNCH(err, "dspark_block_metrics");
  return DF_OK;
}

extern "C" void df_cuda_register_metrics(df_backend *be) {
  be->dpace_weights = cuda_dpace_weights;
  be->block_metrics = cuda_block_metrics;
  be->dspark_block_metrics = cuda_dspark_block_metrics;
  be->measures[DF_OP_DPACE_WEIGHTS] = be->measures[DF_OP_BLOCK_METRICS] = true;
  be->measures[DF_OP_DSPARK_BLOCK_METRICS] = true;
}
