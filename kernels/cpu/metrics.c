// CPU block-objective ops: D-PACE's detached weights and the DFlash / DSpark per-block metric sums, in the
// order the host loops of strategies/ used to run them (row order, double accumulators from 0 per call), so
// their results are bit for bit the ones those loops produced.
#include <math.h>
#include <stdlib.h>

#include "kernels/check.h"

// One block: prefix P (cumulative smoothed confidence) and the mode's weight from the suffix Σ_{j≥k} P_j·w_j.
static void dpace_block(df_dpace_mode mode, double alpha, const float *ce, const float *w, int64_t bs, double *prefix,
                        float *out) {
  double p = 1.0;
  for (int64_t k = 0; k < bs; k++) {
    double s = w[k] != 0.0f ? (1.0 - alpha) * exp(-(double)ce[k]) + alpha : 1.0;
    prefix[k] = p *= s;
  }
  double suffix = 0.0;
  for (int64_t k = bs - 1; k >= 0; k--) {
    suffix += prefix[k] * w[k];
    double v = mode == DF_DPACE_PREFIX   ? prefix[k]
               : mode == DF_DPACE_SUFFIX ? suffix
               : prefix[k] > 0           ? suffix / prefix[k]
                                         : 0.0; // P_k underflowed (α = 0 and a certain miss)
    out[k] = mode == DF_DPACE_ONE ? 1.0f : (float)v;
  }
}

df_status df_cpu_dpace_weights(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                               const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err) {
  double *prefix;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)bs, (void **)&prefix, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const int64_t nb = df_numel(ce) / bs;
  const float *c = ce->data, *wt = w->data;
  float *o = out->data;
  for (int64_t i = 0; i < nb; i++) dpace_block(mode, alpha, c + i * bs, wt + i * bs, bs, prefix, o + i * bs);
  if (row_w)
    for (int64_t r = 0; r < nb * bs; r++) ((float *)row_w->data)[r] = wt[r] * o[r];
  return DF_OK;
}

// 1 + the leading run of correct slots k >= 1; slots that are not valid are skipped, not counted.
static int64_t accept_len(const uint8_t *valid, const uint8_t *correct, int64_t bs) {
  int64_t run = 0;
  for (int64_t k = 1; k < bs; k++) {
    if (!valid[k]) continue;
    if (!correct[k]) break;
    run++;
  }
  return 1 + run;
}

df_status df_cpu_block_metrics(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct,
                               const df_tensor *lw, const df_tensor *valid, const df_tensor *keep, df_tensor *stats,
                               df_error *err) {
  double *pos;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * 2 * (size_t)bs, (void **)&pos, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const int64_t R = df_numel(ce), nb = R / bs;
  const float *c = ce->data, *w = lw->data;
  const uint8_t *cor = correct->data, *val = valid->data, *kp = keep->data;
  double *st = stats->data, loss = 0.0, accept = 0.0, blocks = 0.0;
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
  return DF_OK;
}

static inline double sigmoid(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// The sums of one call, from 0, in the order the DSpark host loop ran them.
typedef struct {
  double v[DF_DSTAT_POS];
  double *pos; // (3·bs): Σ v·ce, Σ v·correct, Σ v per slot
} dspark_sums;

static void dspark_block(const df_dspark_metrics_in *in, int64_t bs, int64_t i, dspark_sums *m) {
  const float *ce = in->ce->data, *w = in->weights->data, *top1 = in->draft_top1->data;
  const uint8_t *cor = in->correct->data, *val = in->valid->data;
  const bool teacher = in->l1 != NULL, conf = in->bce != NULL;
  int64_t greedy = 0;
  bool any = false, run = true;
  double prod = 1.0, expect = 0.0;
  for (int64_t k = 0; k < bs; k++) {
    const int64_t r = i * bs + k;
    const bool v = val[r];
    const double wr = w[r];
    m->v[DF_DSTAT_CE] += (double)ce[r] * wr;
    if (v) any = true, m->pos[2 * bs + k] += 1, m->pos[k] += ce[r], m->pos[bs + k] += cor[r];
    run = run && v && cor[r];
    greedy += run;
    if (!teacher) continue;
    const float *l1 = in->l1->data;
    double y = fmin(fmax(1.0 - 0.5 * (double)l1[r], 0.0), 1.0); // acceptance probability, detached
    m->v[DF_DSTAT_L1] += (double)l1[r] * wr;
    prod *= v ? y : 0.0;
    expect += prod;
    if (v) {
      m->v[DF_DSTAT_AGREE] += ((const uint8_t *)in->agree->data)[r];
      m->v[DF_DSTAT_TTOP1] += ((const float *)in->teacher_top1->data)[r];
      m->v[DF_DSTAT_DTOP1] += top1[r];
    }
    if (!conf) continue;
    m->v[DF_DSTAT_CONF] += (double)((const float *)in->bce->data)[r] * wr;
    m->v[DF_DSTAT_CONF_ERR] += fabs(sigmoid(((const float *)in->conf->data)[r]) - y) * wr;
  }
  if (((const uint8_t *)in->keep->data)[i]) m->v[DF_DSTAT_BLOCKS] += 1, m->v[DF_DSTAT_GREEDY] += (double)(1 + greedy);
  if (teacher && any) m->v[DF_DSTAT_TAU_NUM] += 1.0 + expect, m->v[DF_DSTAT_TAU_DEN] += 1.0;
}

df_status df_cpu_dspark_block_metrics(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *in, df_tensor *stats,
                                      df_error *err) {
  dspark_sums m = {.pos = NULL};
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * 3 * (size_t)bs, (void **)&m.pos, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  for (int64_t k = 0; k < 3 * bs; k++) m.pos[k] = 0.0;
  const int64_t nb = df_numel(in->ce) / bs;
  for (int64_t i = 0; i < nb; i++) dspark_block(in, bs, i, &m);
  for (int64_t k = 0; k < bs; k++) m.v[DF_DSTAT_ACC_NUM] += m.pos[bs + k], m.v[DF_DSTAT_EVAL_DEN] += m.pos[2 * bs + k];
  double *st = stats->data;
  for (int j = 0; j < DF_DSTAT_POS; j++) st[j] += m.v[j];
  for (int64_t k = 0; k < 3 * bs; k++) st[DF_DSTAT_POS + k] += m.pos[k];
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_metrics(df_backend *be) {
  be->dpace_weights = df_cpu_dpace_weights;
  be->block_metrics = df_cpu_block_metrics;
  be->dspark_block_metrics = df_cpu_dspark_block_metrics;
  be->measures[DF_OP_DPACE_WEIGHTS] = be->measures[DF_OP_BLOCK_METRICS] = true;
  be->measures[DF_OP_DSPARK_BLOCK_METRICS] = true;
}
