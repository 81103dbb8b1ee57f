// CPU grouped expert GEMMs: rows sorted by expert (segments [offsets[e], offsets[e + 1])) against a stacked weight
// (E, out, in). Each expert's segment is one OpenBLAS GEMM on its calling thread; the experts are spread over the
// GEMM thread budget (the OpenMP default team, which OpenBLAS would use for one GEMM), which beats threading each
// small GEMM. Every segment's GEMMs run single-threaded, so the results are bitwise independent of thread counts;
// segments are disjoint, so the schedule does not matter.
#include <cblas.h>
#include <omp.h>

#include "kernels/check.h"

// y_e (n, out) = x_e (n, in) · w_eᵀ.
static void fwd_segment(const float *x, const float *w, float *y, int n, int out, int in) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

static df_status cpu_grouped_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                                     df_tensor *y, df_error *err) {
  (void)ctx, (void)err;
  const int64_t E = w->shape[0], out = w->shape[1], in = w->shape[2];
  const int32_t *off = offsets->data;
  const float *xd = x->data, *wd = w->data;
  float *yd = y->data;
  const int team = omp_get_max_threads();
#pragma omp parallel for num_threads(team) if (team > 1) schedule(dynamic, 1)
  for (int64_t e = 0; e < E; e++) {
    const int64_t o = off[e], n = off[e + 1] - o;
    if (n > 0) fwd_segment(xd + o * in, wd + e * out * in, yd + o * out, (int)n, (int)out, (int)in);
  }
  return DF_OK;
}

// dw_e += dy_eᵀ·x_e first, then dx_e (= or +=) dy_e·w_e: dx may alias x (the down projection overwrites its input).
static df_status cpu_grouped_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                      const df_tensor *offsets, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                      df_error *err) {
  (void)ctx, (void)err;
  const int64_t E = w->shape[0], out = w->shape[1], in = w->shape[2];
  const int32_t *off = offsets->data;
  const float *dyd = dy->data, *xd = x->data, *wd = w->data;
  float *dxd = dx ? dx->data : NULL, *dwd = dw ? dw->data : NULL;
  const int team = omp_get_max_threads();
#pragma omp parallel for num_threads(team) if (team > 1) schedule(dynamic, 1)
  for (int64_t e = 0; e < E; e++) {
    const int64_t o = off[e];
    const int n = (int)(off[e + 1] - o), N = (int)out, K = (int)in;
    if (n <= 0) continue;
    const float *dye = dyd + o * out, *we = wd + e * out * in;
    if (dwd)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, n, 1.0f, dye, N, xd + o * in, K, 1.0f,
                  dwd + e * out * in, K);
    if (dxd)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, K, N, 1.0f, dye, N, we, K, accumulate_dx ? 1.0f : 0.0f,
                  dxd + o * in, K);
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_moe_experts(df_backend *be) {
  be->moe_grouped_forward = cpu_grouped_forward;
  be->moe_grouped_backward = cpu_grouped_backward;
}
