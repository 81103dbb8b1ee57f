// CUDA fused chunked LM head + cross-entropy. Per chunk of rows: one cuBLASLt GEMM writes the fp32 logits into a
// reused workspace buffer, one kernel (a thread block per row) computes loss, the first argmax, the weight and
// d(logits), then one GEMM gives dhidden = d(logits)·head. With fp32 storage d(logits) overwrites the logits in
// place; with bf16 it goes to a bf16 buffer beside them (the dhidden GEMM then runs on bf16 tensor cores). Memory:
// chunk · ldz · (4 or 6) bytes, never [R, V].
#include "kernels/cuda/backend.h"
#include "kernels/cuda/lmhead_rows.cuh"

namespace {

constexpr int kThreads = 512;

// One row: loss = m − z_label + log Σ exp(z − m); correct = argmax == label; with G: G_v = coef·softmax_v, and
// G_label −= coef (coef = grad_scale·w). Ignored rows: loss 0, correct 0, G row 0.
template <typename G>
__global__ void __launch_bounds__(kThreads)
    ce_rows_kernel(float *logits, int64_t ldz, int64_t V, int64_t c0, const int32_t *labels, const float *weights,
                   float grad_scale, float *loss, uint8_t *correct, G *grad, int64_t ldg) {
  __shared__ df_row_stats scratch[32];
  const int64_t i = blockIdx.x, r = c0 + i;
  const float *z = logits + i * ldz;
  const int32_t label = labels[r];
  const bool live = label >= 0 && label < V;
  if (!live) {
    if (threadIdx.x == 0) loss[r] = 0.0f, correct[r] = 0;
    if (grad)
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) df_st(grad + i * ldg + v, 0.0f);
    return;
  }
  const df_row_stats st = df_row_stats_of(z, V, scratch);
  const float zl = z[label];
  if (threadIdx.x == 0) {
    loss[r] = (float)((double)st.m - (double)zl + log(st.s));
    correct[r] = st.arg == label;
  }
  if (!grad) return;
  const float coef = grad_scale * (weights ? weights[r] : 1.0f);
  const float c = (float)((double)coef / st.s);
  __syncthreads(); // every thread has read z[label] before anyone overwrites the row in place
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float g = expf(z[v] - st.m) * c;
    if (v == label) g -= coef;
    df_st(grad + i * ldg + v, g);
  }
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

} // namespace

extern "C" int64_t df_cu_lmhead_default_chunk(int64_t R, int64_t V) {
  return df_lmhead_chunk_for(R, df_lmhead_ld(V), 6);
}

static int64_t chunk_of(const df_cu_lmhead_ce_args *a) {
  int64_t c = a->chunk_rows > 0 ? a->chunk_rows : df_cu_lmhead_default_chunk(a->R, a->V);
  return c < a->R ? c : (a->R > 0 ? a->R : 1);
}

extern "C" size_t df_cu_lmhead_ce_workspace(const df_cu_lmhead_ce_args *a) {
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a->V);
  size_t b = round256(sizeof(float) * (size_t)(C * ldz));
  if (a->dhidden && a->dt == DF_BF16) b += round256(sizeof(bf16) * (size_t)(C * ldz));
  return b;
}

extern "C" df_status df_cu_lmhead_ce(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_lmhead_ce_args *a, void *workspace,
                                     df_error *err) {
  if (a->dt != DF_F32 && a->dt != DF_BF16) return df_cu_bad_dtype(err, "lmhead_ce.hidden", a->dt);
  if (a->R <= 0) return DF_OK;
  const int64_t C = chunk_of(a), ldz = df_lmhead_ld(a->V);
  const size_t es = a->dt == DF_BF16 ? 2 : 4, hs = a->dh_dt == DF_BF16 ? 2 : 4;
  float *logits = (float *)workspace;
  void *grad = NULL;
  if (a->dhidden)
    grad =
        a->dt == DF_BF16 ? (void *)((char *)workspace + round256(sizeof(float) * (size_t)(C * ldz))) : (void *)logits;
  for (int64_t c0 = 0; c0 < a->R; c0 += C) {
    const int64_t n = a->R - c0 < C ? a->R - c0 : C;
    // logits[n, V] = hidden[c0 : c0 + n] · headᵀ
    df_cu_gemm_args fw = {};
    fw.trans_b = true, fw.M = n, fw.N = a->V, fw.K = a->H;
    fw.A = (const char *)a->hidden + (size_t)c0 * (size_t)a->H * es, fw.lda = a->H;
    fw.B = a->head, fw.ldb = a->H, fw.ab_dt = a->dt;
    fw.D = logits, fw.ldd = ldz, fw.cd_dt = DF_F32, fw.alpha = 1.0f;
    DF_TRY(df_cu_gemm(g, s, &fw, err));
    if (!grad) {
      ce_rows_kernel<float><<<(unsigned)n, kThreads, 0, s>>>(logits, ldz, a->V, c0, a->labels, a->weights,
                                                             a->grad_scale, a->loss, a->correct, NULL, ldz);
    } else if (a->dt == DF_BF16) {
      ce_rows_kernel<bf16><<<(unsigned)n, kThreads, 0, s>>>(logits, ldz, a->V, c0, a->labels, a->weights, a->grad_scale,
                                                            a->loss, a->correct, (bf16 *)grad, ldz);
    } else {
      ce_rows_kernel<float><<<(unsigned)n, kThreads, 0, s>>>(logits, ldz, a->V, c0, a->labels, a->weights,
                                                             a->grad_scale, a->loss, a->correct, (float *)grad, ldz);
    }
    DF_CU_CHECK_LAUNCH(err, "lmhead_ce.rows");
    if (!grad) continue;
    // dhidden[c0 : c0 + n] = G[n, V] · head[V, H]
    df_cu_gemm_args bw = {};
    bw.M = n, bw.N = a->H, bw.K = a->V, bw.A = grad, bw.lda = ldz, bw.B = a->head, bw.ldb = a->H, bw.ab_dt = a->dt;
    bw.D = (char *)a->dhidden + (size_t)c0 * (size_t)a->H * hs, bw.ldd = a->H, bw.cd_dt = a->dh_dt, bw.alpha = 1.0f;
    DF_TRY(df_cu_gemm(g, s, &bw, err));
  }
  return DF_OK;
}

// ---- the backend table's slot ------------------------------------------------------------------------------------

static df_status cuda_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden,
                                const df_tensor *head, const df_tensor *labels, const df_tensor *weights,
                                df_tensor *loss, df_tensor *correct, df_tensor *dhidden, df_error *err) {
  df_cu_lmhead_ce_args a = {};
  a.R = df_rows(hidden), a.H = head->shape[1], a.V = head->shape[0], a.chunk_rows = desc->chunk_rows;
  a.hidden = hidden->data, a.head = head->data, a.dt = head->dtype, a.labels = (const int32_t *)labels->data;
  a.weights = weights ? (const float *)weights->data : NULL, a.grad_scale = desc->grad_scale;
  a.loss = (float *)loss->data, a.correct = (uint8_t *)correct->data;
  a.dhidden = dhidden ? dhidden->data : NULL, a.dh_dt = dhidden ? dhidden->dtype : head->dtype;
  void *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, df_cu_lmhead_ce_workspace(&a), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_lmhead_ce(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &a, ws, err);
}

extern "C" void df_cuda_register_lmhead_ce(df_backend *be) {
  be->lmhead_ce = cuda_lmhead_ce;
  be->measures[DF_OP_LMHEAD_CE] = true;
}
