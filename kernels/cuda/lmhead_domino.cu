// CUDA fused Domino LM head (df_lmhead_domino; the per-row math of kernels/cpu/lmhead_domino.c). Per chunk of rows:
// GEMMs for the base logits b = hidden·headᵀ and the final logits f = corr·w2ᵀ + b (a β = 1 GEMM reading b) into two
// reused fp32 buffers; one kernel per row for both softmaxes (lmhead_rows.cuh's online statistics), both CEs and
// argmaxes and the logit gradients Gf = fs·w·(p_f − onehot) and Gb + Gf (in place for fp32 storage, into bf16 buffers
// for bf16); then GEMMs for dhidden = (Gb + Gf)·head, dcorr = Gf·w2 and dw2 += Gfᵀ·corr. dw2 is deterministic for a
// given chunk size (a fixed GEMM order).
#include "kernels/cuda/backend.h"
#include "kernels/cuda/lmhead_rows.cuh"

namespace {

constexpr int kThreads = 512;

struct dm_params {
  int64_t V, ldz, c0;
  const int32_t *labels;
  const float *weights;
  float fs, bs;
  float *ce_f, *ce_b;
  uint8_t *ok_f, *ok_b;
};

// One row per thread block: zb, zf its base and final logits; with gradients gf = Gf and gb = Gb + Gf.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    domino_rows_kernel(dm_params p, float *zb_all, float *zf_all, G *gb_all, G *gf_all) {
  __shared__ df_row_stats scratch[32];
  const int64_t i = blockIdx.x, r = p.c0 + i, V = p.V;
  float *zb = zb_all + i * p.ldz, *zf = zf_all + i * p.ldz;
  const int32_t label = p.labels[r];
  const bool grad = gb_all != NULL;
  if (!(label >= 0 && label < V)) {
    if (threadIdx.x == 0) p.ce_f[r] = p.ce_b[r] = 0.0f, p.ok_f[r] = p.ok_b[r] = 0;
    if (grad)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        df_st(gb_all + i * p.ldz + v, 0.0f), df_st(gf_all + i * p.ldz + v, 0.0f);
    return;
  }
  const df_row_stats sf = df_row_stats_of(zf, V, scratch);
  const df_row_stats sb = df_row_stats_of(zb, V, scratch);
  const float lf = zf[label], lb = zb[label];
  if (threadIdx.x == 0) {
    p.ce_f[r] = (float)((double)sf.m - (double)lf + log(sf.s));
    p.ce_b[r] = (float)((double)sb.m - (double)lb + log(sb.s));
    p.ok_f[r] = sf.arg == label, p.ok_b[r] = sb.arg == label;
  }
  if (!grad) return;
  const float w = p.weights ? p.weights[r] : 1.0f, cf = p.fs * w, cb = p.bs * w;
  const float kf = cf * (float)(1.0 / sf.s), kb = cb * (float)(1.0 / sb.s);
  __syncthreads(); // every read of zf / zb above happens before the in-place overwrite
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float gf = expf(zf[v] - sf.m) * kf, gb = expf(zb[v] - sb.m) * kb;
    if (v == label) gf -= cf, gb -= cb;
    df_st(gf_all + i * p.ldz + v, gf);
    df_st(gb_all + i * p.ldz + v, gb + gf);
  }
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

struct dm_shape {
  int64_t R, H, V, E, chunk_rows;
  df_dtype dt;
  bool grad;
};

int64_t chunk_of(const dm_shape &a) {
  const int64_t ldz = df_lmhead_ld(a.V), per = 8 + (a.dt == DF_BF16 && a.grad ? 4 : 0);
  int64_t c = a.chunk_rows > 0 ? a.chunk_rows : df_lmhead_chunk_for(a.R, ldz, per);
  return c < a.R ? c : (a.R > 0 ? a.R : 1);
}

size_t workspace_of(const dm_shape &a) {
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a.V);
  size_t b = 2 * round256(sizeof(float) * (size_t)(C * ldz));
  if (a.grad && a.dt == DF_BF16) b += 2 * round256(sizeof(bf16) * (size_t)(C * ldz));
  return b;
}

df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                     int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g = {};
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

const void *data_of(const df_tensor *t) { return t ? t->data : NULL; }

} // namespace

static df_status cuda_lmhead_domino(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in,
                                    const df_lmhead_domino_out *out, df_error *err) {
  dm_shape a;
  a.R = df_rows(in->hidden), a.H = in->head->shape[1], a.V = in->head->shape[0], a.E = in->w2->shape[1];
  a.chunk_rows = desc->chunk_rows, a.dt = in->head->dtype, a.grad = out->dhidden != NULL;
  if (a.dt != DF_F32 && a.dt != DF_BF16) return df_cu_bad_dtype(err, "lmhead_domino.head", a.dt);
  if (a.R <= 0) return DF_OK;
  void *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, workspace_of(a), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a.V), H = a.H, E = a.E;
  const size_t es = a.dt == DF_BF16 ? 2 : 4, zbytes = round256(sizeof(float) * (size_t)(C * ldz));
  float *zb = (float *)ws, *zf = (float *)((char *)ws + zbytes);
  void *gb = NULL, *gf = NULL;
  if (a.grad) {
    if (a.dt == DF_BF16) {
      const size_t gbytes = round256(sizeof(bf16) * (size_t)(C * ldz));
      gb = (char *)ws + 2 * zbytes, gf = (char *)ws + 2 * zbytes + gbytes;
    } else {
      gb = zb, gf = zf; // in place
    }
  }
  dm_params p = {};
  p.V = a.V, p.ldz = ldz, p.labels = (const int32_t *)in->labels->data;
  p.weights = (const float *)data_of(in->weights), p.fs = desc->final_scale, p.bs = desc->base_scale;
  p.ce_f = (float *)out->ce_final->data, p.ce_b = (float *)out->ce_base->data;
  p.ok_f = (uint8_t *)out->correct_final->data, p.ok_b = (uint8_t *)out->correct_base->data;
  df_cu_gemm_ctx *g = df_cuda_gemm(ctx);
  const df_cu_stream s = df_cuda_cu_stream(ctx);
  const df_dtype hdt = a.grad ? out->dhidden->dtype : a.dt;
  for (int64_t c0 = 0; c0 < a.R; c0 += C) {
    const int64_t n = a.R - c0 < C ? a.R - c0 : C;
    const char *hid = (const char *)in->hidden->data + (size_t)c0 * H * es;
    const char *u = (const char *)in->corr->data + (size_t)c0 * E * es;
    df_cu_gemm_args q = gemm(false, true, n, a.V, H, hid, H, in->head->data, H, a.dt, zb, ldz, DF_F32, 0.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
    q = gemm(false, true, n, a.V, E, u, E, in->w2->data, E, a.dt, zf, ldz, DF_F32, 1.0f); // zf = u·w2ᵀ + zb
    q.C = zb, q.ldc = ldz;
    DF_TRY(df_cu_gemm(g, s, &q, err));
    p.c0 = c0;
    if (!a.grad)
      domino_rows_kernel<float><<<(unsigned)n, kThreads, 0, (cudaStream_t)s>>>(p, zb, zf, NULL, NULL);
    else if (a.dt == DF_BF16)
      domino_rows_kernel<bf16><<<(unsigned)n, kThreads, 0, (cudaStream_t)s>>>(p, zb, zf, (bf16 *)gb, (bf16 *)gf);
    else
      domino_rows_kernel<float><<<(unsigned)n, kThreads, 0, (cudaStream_t)s>>>(p, zb, zf, (float *)gb, (float *)gf);
    DF_CU_CHECK_LAUNCH(err, "lmhead_domino.rows");
    if (!a.grad) continue;
    const size_t hs = hdt == DF_BF16 ? 2 : 4;
    q = gemm(false, false, n, H, a.V, gb, ldz, in->head->data, H, a.dt,
             (char *)out->dhidden->data + (size_t)c0 * H * hs, H, hdt, 0.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
    q = gemm(false, false, n, E, a.V, gf, ldz, in->w2->data, E, a.dt, (char *)out->dcorr->data + (size_t)c0 * E * hs, E,
             out->dcorr->dtype, 0.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
    // dw2[V, E] += Gfᵀ[V, n] · corr[n, E]
    q = gemm(true, false, a.V, E, n, gf, ldz, u, E, a.dt, out->dw2->data, E, out->dw2->dtype, 1.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
  }
  return DF_OK;
}

extern "C" void df_cuda_register_lmhead_domino(df_backend *be) {
  be->lmhead_domino = cuda_lmhead_domino;
  be->measures[DF_OP_LMHEAD_DOMINO] = true;
}
