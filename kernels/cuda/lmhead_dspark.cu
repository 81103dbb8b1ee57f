// CUDA fused DSpark objective over the LM head (df_lmhead_dspark; the per-row math of kernels/cpu/lmhead_dspark.c).
// Per chunk of rows: GEMMs for the draft logits z = hidden·headᵀ (+ u·w2ᵀ, a β = 1 GEMM) and the teacher logits
// t = teacher·headᵀ into reused fp32 buffers; one kernel per row for CE, L1, agreement, top-1s, the confidence
// BCE and the logit gradient G (in place over z for fp32 storage, into a bf16 buffer for bf16); then GEMMs for
// dhidden = G·head, du = G·w2 and dw2 += Gᵀ·u. dw2 is deterministic for a given chunk size (fixed GEMM order).
#include "kernels/cuda/backend.h"
#include "kernels/cuda/lmhead_rows.cuh"

namespace {

constexpr int kThreads = 512;

struct ld_params {
  int64_t V, ldz, c0;
  const float *t; // teacher logits or NULL
  const int32_t *labels;
  const float *weights, *conf;
  float gs, a_ce, a_l1, a_conf;
  float *ce, *top1, *l1, *ttop1, *bce, *dconf;
  uint8_t *correct, *agree;
};

__device__ __forceinline__ float sign_of(float d) { return (float)((d > 0.0f) - (d < 0.0f)); }

__device__ __forceinline__ double sigmoid_d(double x) {
  double e = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// Per-row outputs that are 0 for a skipped row.
__device__ void clear_row(const ld_params &p, int64_t r) {
  p.ce[r] = 0.0f, p.correct[r] = 0;
  if (p.top1) p.top1[r] = 0.0f;
  if (p.l1) p.l1[r] = 0.0f;
  if (p.agree) p.agree[r] = 0;
  if (p.ttop1) p.ttop1[r] = 0.0f;
  if (p.bce) p.bce[r] = 0.0f;
  if (p.dconf) p.dconf[r] = 0.0f;
}

template <typename G>
__global__ void __launch_bounds__(kThreads) dspark_rows_kernel(ld_params p, float *z_all, G *grad) {
  __shared__ df_row_stats scratch[32];
  __shared__ double red[32];
  const int64_t i = blockIdx.x, r = p.c0 + i, V = p.V;
  float *z = z_all + i * p.ldz;
  const float *t = p.t ? p.t + i * p.ldz : NULL;
  const int32_t label = p.labels[r];
  if (!(label >= 0 && label < V)) {
    if (threadIdx.x == 0) clear_row(p, r);
    if (grad)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) df_st(grad + i * p.ldz + v, 0.0f);
    return;
  }
  const df_row_stats sz = df_row_stats_of(z, V, scratch);
  const float zl = z[label], invz = (float)(1.0 / sz.s);
  if (threadIdx.x == 0) {
    p.ce[r] = (float)((double)sz.m - (double)zl + log(sz.s));
    p.correct[r] = sz.arg == label;
    if (p.top1) p.top1[r] = invz;
  }
  double a = 0.0; // Σ sign(p − q)·p
  float invt = 0.0f, mt = 0.0f;
  if (t) {
    const df_row_stats st = df_row_stats_of(t, V, scratch);
    invt = (float)(1.0 / st.s), mt = st.m;
    double l1 = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float pv = expf(z[v] - sz.m) * invz, qv = expf(t[v] - mt) * invt;
      l1 += fabs((double)pv - (double)qv);
      a += (double)(sign_of(pv - qv) * pv);
    }
    l1 = df_block_sum(l1, red);
    a = df_block_sum(a, red);
    const float l1f = (float)l1;
    if (threadIdx.x == 0) {
      if (p.l1) p.l1[r] = l1f;
      if (p.agree) p.agree[r] = sz.arg == st.arg;
      if (p.ttop1) p.ttop1[r] = invt;
      if (p.conf) {
        const double c = p.conf[r], y = fmin(fmax(1.0 - 0.5 * (double)l1f, 0.0), 1.0);
        if (p.bce) p.bce[r] = (float)(fmax(c, 0.0) - c * y + log1p(exp(-fabs(c))));
        if (grad && p.dconf) {
          const double w = p.weights ? p.weights[r] : 1.0;
          p.dconf[r] = (float)((double)p.gs * w * p.a_conf * (sigmoid_d(c) - y));
        }
      }
    }
  }
  if (!grad) return;
  const float c1 = p.gs * (p.weights ? p.weights[r] : 1.0f);
  __syncthreads(); // z[label] and every z read above happen before the in-place overwrite
  if (!t) {
    const float c = c1 * p.a_ce * invz;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      float gv = expf(z[v] - sz.m) * c;
      if (v == label) gv -= c1 * p.a_ce;
      df_st(grad + i * p.ldz + v, gv);
    }
  } else {
    const float A = (float)(c1 * (p.a_ce - p.a_l1 * a)), B = c1 * p.a_l1;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float pv = expf(z[v] - sz.m) * invz, qv = expf(t[v] - mt) * invt;
      float gv = pv * (A + B * sign_of(pv - qv));
      if (v == label) gv -= c1 * p.a_ce;
      df_st(grad + i * p.ldz + v, gv);
    }
  }
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

int64_t chunk_of(const df_cu_lmhead_dspark_args *a) {
  const int64_t ldz = df_lmhead_ld(a->V);
  const int64_t per = 4 * (a->teacher ? 2 : 1) + (a->dt == DF_BF16 && a->dhidden ? 2 : 0);
  int64_t c = a->chunk_rows > 0 ? a->chunk_rows : df_lmhead_chunk_for(a->R, ldz, per);
  return c < a->R ? c : (a->R > 0 ? a->R : 1);
}

df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                     int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g = {};
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

} // namespace

extern "C" size_t df_cu_lmhead_dspark_workspace(const df_cu_lmhead_dspark_args *a) {
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a->V);
  size_t b = round256(sizeof(float) * (size_t)(C * ldz)) * (a->teacher ? 2 : 1);
  if (a->dhidden && a->dt == DF_BF16) b += round256(sizeof(bf16) * (size_t)(C * ldz));
  return b;
}

extern "C" df_status df_cu_lmhead_dspark(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_lmhead_dspark_args *a,
                                         void *workspace, df_error *err) {
  if (a->dt != DF_F32 && a->dt != DF_BF16) return df_cu_bad_dtype(err, "lmhead_dspark.hidden", a->dt);
  if (a->R <= 0) return DF_OK;
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a->V), H = a->H, rk = a->markov_u ? a->r : 0;
  const size_t es = a->dt == DF_BF16 ? 2 : 4, hs = a->dh_dt == DF_BF16 ? 2 : 4, zb = round256(sizeof(float) * C * ldz);
  float *z = (float *)workspace, *t = a->teacher ? (float *)((char *)workspace + zb) : NULL;
  void *grad = NULL;
  if (a->dhidden) grad = a->dt == DF_BF16 ? (void *)((char *)workspace + zb * (a->teacher ? 2 : 1)) : (void *)z;
  ld_params p = {};
  p.V = a->V, p.ldz = ldz, p.labels = a->labels, p.weights = a->weights, p.conf = a->conf;
  p.gs = a->grad_scale, p.a_ce = a->alpha_ce, p.a_l1 = a->alpha_l1, p.a_conf = a->alpha_conf;
  p.ce = a->ce, p.top1 = a->draft_top1, p.l1 = a->l1, p.ttop1 = a->teacher_top1, p.bce = a->bce;
  p.dconf = a->dhidden ? a->dconf : NULL, p.correct = a->correct, p.agree = a->agree;
  for (int64_t c0 = 0; c0 < a->R; c0 += C) {
    const int64_t n = a->R - c0 < C ? a->R - c0 : C;
    const char *hid = (const char *)a->hidden + (size_t)c0 * H * es;
    df_cu_gemm_args q = gemm(false, true, n, a->V, H, hid, H, a->head, H, a->dt, z, ldz, DF_F32, 0.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
    if (rk) { // z += u·w2ᵀ
      q = gemm(false, true, n, a->V, rk, (const char *)a->markov_u + (size_t)c0 * rk * es, rk, a->markov_w2, rk, a->dt,
               z, ldz, DF_F32, 1.0f);
      DF_TRY(df_cu_gemm(g, s, &q, err));
    }
    if (t) {
      q = gemm(false, true, n, a->V, H, (const char *)a->teacher + (size_t)c0 * H * es, H, a->head, H, a->dt, t, ldz,
               DF_F32, 0.0f);
      DF_TRY(df_cu_gemm(g, s, &q, err));
    }
    p.c0 = c0, p.t = t;
    if (!grad)
      dspark_rows_kernel<float><<<(unsigned)n, kThreads, 0, s>>>(p, z, NULL);
    else if (a->dt == DF_BF16)
      dspark_rows_kernel<bf16><<<(unsigned)n, kThreads, 0, s>>>(p, z, (bf16 *)grad);
    else
      dspark_rows_kernel<float><<<(unsigned)n, kThreads, 0, s>>>(p, z, (float *)grad);
    DF_CU_CHECK_LAUNCH(err, "lmhead_dspark.rows");
    if (!grad) continue;
    q = gemm(false, false, n, H, a->V, grad, ldz, a->head, H, a->dt, (char *)a->dhidden + (size_t)c0 * H * hs, H,
             a->dh_dt, 0.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
    if (rk) {
      q = gemm(false, false, n, rk, a->V, grad, ldz, a->markov_w2, rk, a->dt, (char *)a->du + (size_t)c0 * rk * hs, rk,
               a->dh_dt, 0.0f);
      DF_TRY(df_cu_gemm(g, s, &q, err));
      // dw2[V, r] += Gᵀ[V, n] · u[n, r]
      q = gemm(true, false, a->V, rk, n, grad, ldz, (const char *)a->markov_u + (size_t)c0 * rk * es, rk, a->dt, a->dw2,
               rk, DF_F32, 1.0f);
      DF_TRY(df_cu_gemm(g, s, &q, err));
    }
  }
  return DF_OK;
}

// ---- the backend table's slot ------------------------------------------------------------------------------------

static const void *data_of(const df_tensor *t) { return t ? t->data : NULL; }

static df_status cuda_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                                    const df_lmhead_dspark_out *out, df_error *err) {
  df_cu_lmhead_dspark_args a = {};
  a.R = df_rows(in->hidden), a.H = in->head->shape[1], a.V = in->head->shape[0];
  a.r = in->markov_u ? in->markov_w2->shape[1] : 0, a.chunk_rows = desc->chunk_rows;
  a.hidden = in->hidden->data, a.head = in->head->data, a.teacher = data_of(in->teacher);
  a.markov_u = data_of(in->markov_u), a.markov_w2 = data_of(in->markov_w2), a.dt = in->head->dtype;
  a.labels = (const int32_t *)in->labels->data, a.weights = (const float *)data_of(in->weights);
  a.conf = (const float *)data_of(in->conf);
  a.grad_scale = desc->grad_scale, a.alpha_ce = desc->alpha_ce, a.alpha_l1 = desc->alpha_l1;
  a.alpha_conf = desc->alpha_conf;
  a.ce = (float *)out->ce->data, a.correct = (uint8_t *)out->correct->data;
  a.draft_top1 = (float *)data_of(out->draft_top1), a.l1 = (float *)data_of(out->l1);
  a.teacher_top1 = (float *)data_of(out->teacher_top1), a.bce = (float *)data_of(out->bce);
  a.agree = (uint8_t *)data_of(out->agree);
  if (out->dhidden) {
    a.dhidden = out->dhidden->data, a.dh_dt = out->dhidden->dtype, a.dconf = (float *)data_of(out->dconf);
    if (in->markov_u) a.du = out->du->data, a.dw2 = out->dw2->data, a.dw2_dt = out->dw2->dtype;
  }
  void *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, df_cu_lmhead_dspark_workspace(&a), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_lmhead_dspark(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &a, ws, err);
}

extern "C" void df_cuda_register_lmhead_dspark(df_backend *be) {
  be->lmhead_dspark = cuda_lmhead_dspark;
  be->measures[DF_OP_LMHEAD_DSPARK] = true;
}
