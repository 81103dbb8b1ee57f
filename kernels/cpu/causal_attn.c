// CPU causal attention over a KV cache: per (sample, head, tile of queries) two GEMMs (scores = q·kᵀ over the
// visible keys, out = p·v) around an exact row softmax. Work is split by fixed tiles, never by thread count,
// so the result does not depend on the number of threads.
#include "kernels/causal_attn.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "kernels/check.h"

enum { QTILE = 32 }; // queries per task

// Softmax of row r of s (n visible keys; the rest of the row is set to 0 so the second GEMM can take all of it).
static void softmax_row(float *s, int64_t lo, int64_t hi, int64_t n, float scale) {
  float m = -INFINITY;
  for (int64_t j = lo; j < hi; j++) m = s[j] > m ? s[j] : m;
  double sum = 0.0;
  for (int64_t j = lo; j < hi; j++) {
    float e = expf((s[j] - m) * scale);
    s[j] = e;
    sum += e;
  }
  float inv = (float)(1.0 / sum);
  for (int64_t j = 0; j < lo; j++) s[j] = 0.0f;
  for (int64_t j = lo; j < hi; j++) s[j] *= inv;
  for (int64_t j = hi; j < n; j++) s[j] = 0.0f;
}

static df_status cpu_causal_attn_forward(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q,
                                         const df_tensor *k, const df_tensor *v, df_tensor *out, df_error *err) {
  const int64_t B = q->shape[0], T = q->shape[1], nH = q->shape[2], hd = q->shape[3];
  const int64_t C = k->shape[1], nKV = k->shape[2], group = nH / nKV, past = desc->past, W = desc->window;
  const int64_t ntiles = (T + QTILE - 1) / QTILE, ntasks = B * nH * ntiles;
  const float *qd = q->data, *kd = k->data, *vd = v->data;
  float *od = out->data;
  // Below ~64k multiply-adds (decode steps of small models) a parallel region costs more than it saves.
  const bool par = ntasks > 1 && (double)ntasks * QTILE * (double)(past + T) * (double)hd > 65536.0;
  const int nt = par ? ctx->num_threads : 1;
  const size_t per = (size_t)QTILE * (size_t)(past + T); // one thread's score tile
  float *scratch;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * per * (size_t)nt, (void **)&scratch, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
#pragma omp parallel num_threads(nt) if (par)
  {
    float *s = scratch + per * (size_t)omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; task++) {
      const int64_t b = task / (nH * ntiles), h = task / ntiles % nH, tile = task % ntiles, g = h / group;
      const int64_t t0 = tile * QTILE, rows = T - t0 < QTILE ? T - t0 : QTILE;
      const int64_t kend = past + t0 + rows; // keys the last query of the tile may see
      int64_t kbeg = W > 0 ? past + t0 - W + 1 : 0;
      kbeg = kbeg < 0 ? 0 : kbeg;
      const int64_t n = kend - kbeg;
      const float *qp = qd + ((b * T + t0) * nH + h) * hd;
      const float *kp = kd + ((b * C + kbeg) * nKV + g) * hd, *vp = vd + ((b * C + kbeg) * nKV + g) * hd;
      // s[rows, n] = q_tile · k[kbeg:kend]ᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)n, (int)hd, 1.0f, qp, (int)(nH * hd), kp,
                  (int)(nKV * hd), 0.0f, s, (int)n);
      for (int64_t r = 0; r < rows; r++) {
        const int64_t pos = past + t0 + r; // this query's position: keys kbeg + j <= pos are visible
        int64_t lo = W > 0 ? pos - W + 1 - kbeg : 0;
        lo = lo < 0 ? 0 : lo;
        softmax_row(s + r * n, lo, pos + 1 - kbeg, n, desc->scale);
      }
      // out_tile[rows, hd] = p · v[kbeg:kend]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)n, 1.0f, s, (int)n, vp,
                  (int)(nKV * hd), 0.0f, od + ((b * T + t0) * nH + h) * hd, (int)(nH * hd));
    }
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_causal_attn(df_backend *be) {
  be->causal_attn_forward = cpu_causal_attn_forward;
  be->measures[DF_OP_CAUSAL_ATTN_FORWARD] = true;
}
