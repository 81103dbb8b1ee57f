// CUDA MoE routed experts and shared expert, composed from the dispatch kernels (moe_dispatch.cu), the grouped
// GEMMs (gemm.cu) and SwiGLU, in the CPU's order (moe/experts.c, moe/shared_expert.c): gather the token rows in
// sorted order, gate/up grouped GEMMs, SwiGLU, the combine weight before the down projection, the deterministic
// gather-combine. The grouped GEMMs need the per-expert row counts on the host (h_counts): the caller copies the
// counts once per layer and forward (the one host synchronisation of an MoE layer, documented in docs/).
#include <stdlib.h>

#include "kernels/cuda/cu_common.cuh"

namespace {

size_t r256(size_t b) { return (b + 255) / 256 * 256; }
size_t es(df_dtype dt) { return dt == DF_BF16 ? 2 : 4; }

struct ws_layout {
  size_t plan, rows, drows, a, h, du, ptrs, total;
};

ws_layout layout_of(const df_cu_moe_experts_args *a, bool bwd) {
  const int64_t Tk = a->T * a->k;
  ws_layout l = {};
  size_t o = 0;
  l.plan = o, o += bwd ? 0 : r256(df_cu_moe_plan_workspace(Tk, a->E));
  l.rows = o, o += r256(es(a->dt) * (size_t)(Tk * a->H));
  l.drows = o, o += bwd ? r256(es(a->dt) * (size_t)(Tk * a->H)) : 0;
  l.a = o, o += r256(es(a->dt) * (size_t)(Tk * a->I));
  l.h = o, o += bwd ? r256(es(a->dt) * (size_t)(Tk * a->I)) : 0;
  l.du = o, o += bwd ? r256(es(a->dt) * (size_t)(Tk * a->I)) : 0;
  l.ptrs = o, o += r256(df_cu_grouped_workspace((int)a->E));
  l.total = o;
  return l;
}

// Exclusive scan of the host counts.
int32_t *host_offsets(const df_cu_moe_experts_args *a) {
  int32_t *off = (int32_t *)malloc(sizeof(int32_t) * (size_t)(a->E > 0 ? a->E : 1));
  if (!off) return NULL;
  int32_t acc = 0;
  for (int64_t e = 0; e < a->E; e++) off[e] = acc, acc += a->h_counts[e];
  return off;
}

df_cu_grouped_args grouped(const df_cu_moe_experts_args *a, const int32_t *hoff, int64_t N, int64_t K, const void *X,
                           const void *W, int64_t stride_w, bool trans_w, void *D, float beta) {
  df_cu_grouped_args g = {};
  g.E = (int)a->E, g.h_rows = a->h_counts, g.h_offsets = hoff, g.N = N, g.K = K, g.X = X, g.ldx = K, g.W = W;
  g.stride_w = stride_w, g.trans_w = trans_w, g.D = D, g.ldd = N, g.ab_dt = a->dt, g.d_dt = a->dt, g.beta = beta;
  return g;
}

df_cu_grouped_wgrad_args wgrad(const df_cu_moe_experts_args *a, const int32_t *hoff, int64_t N, int64_t K,
                               const void *dY, const void *X, float *dW) {
  df_cu_grouped_wgrad_args g = {};
  g.E = (int)a->E, g.h_rows = a->h_counts, g.h_offsets = hoff, g.N = N, g.K = K, g.dY = dY, g.lddy = N, g.X = X;
  g.ldx = K, g.dW = dW, g.stride_dw = N * K, g.ab_dt = a->dt;
  return g;
}

df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                     int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g = {};
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

} // namespace

extern "C" size_t df_cu_moe_experts_fwd_workspace(const df_cu_moe_experts_args *a) { return layout_of(a, false).total; }
extern "C" size_t df_cu_moe_experts_bwd_workspace(const df_cu_moe_experts_args *a) { return layout_of(a, true).total; }

extern "C" df_status df_cu_moe_experts_fwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_experts_args *a, void *y,
                                           df_dtype y_dt, void *workspace, df_error *err) {
  const int64_t T = a->T, H = a->H, I = a->I, E = a->E, k = a->k, Tk = T * k;
  const ws_layout l = layout_of(a, false);
  char *w = (char *)workspace;
  DF_TRY(df_cu_moe_plan(s, T, k, E, a->indices, a->counts, a->offsets, a->slot, a->token, a->pos, w + l.plan, err));
  if (Tk == 0) return df_cu_fill(s, y, y_dt, T * H, 0.0f, err);
  int32_t *hoff = host_offsets(a);
  if (!hoff) return DF_FAIL(err, DF_ERR_NOMEM, "moe_experts", NULL, "cannot allocate the expert offsets");
  void *rows = w + l.rows, *act = w + l.a, *ptrs = w + l.ptrs;
  df_status st = df_cu_embedding_fwd(s, a->x, a->dt, a->token, rows, a->dt, Tk, T, H, err); // sorted rows
  df_cu_grouped_args q = grouped(a, hoff, I, H, rows, a->w1, I * H, true, a->gate, 0.0f);
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err); // gate = x_e·w1[e]ᵀ
  q = grouped(a, hoff, I, H, rows, a->w3, I * H, true, a->up, 0.0f);
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err); // up = x_e·w3[e]ᵀ
  df_cu_swiglu_in in = {Tk, I, a->gate, a->up, I, I, a->dt, a->swiglu_limit};
  if (st == DF_OK) st = df_cu_swiglu_fwd(s, &in, act, a->dt, I, err);
  if (st == DF_OK) st = df_cu_moe_scale_rows(s, act, a->dt, Tk, I, a->weights, a->slot, err);
  q = grouped(a, hoff, H, I, act, a->w2, H * I, true, rows, 0.0f); // outputs replace the gathered rows
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err);
  if (st == DF_OK) st = df_cu_moe_combine(s, rows, a->dt, a->pos, T, k, H, y, y_dt, false, err);
  free(hoff);
  return st;
}

extern "C" df_status df_cu_moe_experts_bwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_experts_args *a,
                                           const void *dy, df_dtype dy_dt, float *dweights, void *dx, df_dtype dx_dt,
                                           void *workspace, df_error *err) {
  const int64_t T = a->T, H = a->H, I = a->I, k = a->k, Tk = T * k;
  if (Tk == 0) return DF_OK;
  const ws_layout l = layout_of(a, true);
  char *w = (char *)workspace;
  void *rows = w + l.rows, *drows = w + l.drows, *act = w + l.a, *h = w + l.h, *du = w + l.du, *ptrs = w + l.ptrs;
  int32_t *hoff = host_offsets(a);
  if (!hoff) return DF_FAIL(err, DF_ERR_NOMEM, "moe_experts", NULL, "cannot allocate the expert offsets");
  df_status st = df_cu_embedding_fwd(s, a->x, a->dt, a->token, rows, a->dt, Tk, T, H, err);
  if (st == DF_OK) st = df_cu_embedding_fwd(s, dy, dy_dt, a->token, drows, a->dt, Tk, T, H, err);
  df_cu_swiglu_in in = {Tk, I, a->gate, a->up, I, I, a->dt, a->swiglu_limit};
  if (st == DF_OK) st = df_cu_swiglu_fwd(s, &in, act, a->dt, I, err); // a, unscaled
  if (st == DF_OK) st = df_cu_cast(s, h, a->dt, act, a->dt, Tk * I, err);
  if (st == DF_OK) st = df_cu_moe_scale_rows(s, h, a->dt, Tk, I, a->weights, a->slot, err); // h = w·a
  // Down projection: dw2[e] += dy_eᵀ·h_e; dh = dy_e·w2[e] (over h).
  df_cu_grouped_wgrad_args wg = wgrad(a, hoff, H, I, drows, h, a->g2);
  if (st == DF_OK && a->g2) st = df_cu_gemm_grouped_wgrad(g, s, &wg, ptrs, err);
  df_cu_grouped_args q = grouped(a, hoff, I, H, drows, a->w2, H * I, false, h, 0.0f);
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err);
  // h = w·a: dweights = dh·a, da = w·dh.
  if (st == DF_OK) st = df_cu_moe_dweights(s, h, a->dt, act, a->dt, Tk, I, a->weights, a->slot, dweights, err);
  // SwiGLU backward: d(gate) into act, d(up) into du.
  if (st == DF_OK) st = df_cu_swiglu_bwd(s, &in, h, a->dt, I, act, du, a->dt, I, err);
  // Up projections: d(rows) = dgate·w1[e] + dup·w3[e] (into drows); dw1, dw3 += ...ᵀ·x_e.
  q = grouped(a, hoff, H, I, act, a->w1, I * H, false, drows, 0.0f);
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err);
  q = grouped(a, hoff, H, I, du, a->w3, I * H, false, drows, 1.0f);
  if (st == DF_OK) st = df_cu_gemm_grouped(g, s, &q, ptrs, err);
  wg = wgrad(a, hoff, I, H, act, rows, a->g1);
  if (st == DF_OK && a->g1) st = df_cu_gemm_grouped_wgrad(g, s, &wg, ptrs, err);
  wg = wgrad(a, hoff, I, H, du, rows, a->g3);
  if (st == DF_OK && a->g3) st = df_cu_gemm_grouped_wgrad(g, s, &wg, ptrs, err);
  // dx += the token's k rows in sorted order (the CPU's scatter-add order).
  if (st == DF_OK) st = df_cu_moe_combine(s, drows, a->dt, a->pos, T, k, H, dx, dx_dt, true, err);
  free(hoff);
  return st;
}

// ---- shared expert ---------------------------------------------------------------------------------------------

extern "C" size_t df_cu_moe_shared_workspace(const df_cu_moe_shared_args *a) {
  const size_t ts = es(a->dt) * (size_t)(a->T * a->S);
  return 3 * r256(ts) + r256(es(a->dt) * (size_t)a->T) + r256(sizeof(float) * (size_t)a->T);
}

extern "C" df_status df_cu_moe_shared_fwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_shared_args *a, void *y,
                                          df_dtype y_dt, void *workspace, df_error *err) {
  const int64_t T = a->T, H = a->H, S = a->S;
  if (T <= 0) return DF_OK;
  void *act = workspace;
  df_cu_gemm_args q = gemm(false, true, T, S, H, a->x, H, a->w1, H, a->dt, a->gate, S, a->dt, 0.0f);
  DF_TRY(df_cu_gemm(g, s, &q, err));
  q = gemm(false, true, T, S, H, a->x, H, a->w3, H, a->dt, a->up, S, a->dt, 0.0f);
  DF_TRY(df_cu_gemm(g, s, &q, err));
  df_cu_swiglu_in in = {T, S, a->gate, a->up, S, S, a->dt, a->swiglu_limit};
  DF_TRY(df_cu_swiglu_fwd(s, &in, act, a->dt, S, err));
  if (a->gated) {
    q = gemm(false, true, T, 1, H, a->x, H, a->wg, H, a->dt, a->z, 1, DF_F32, 0.0f); // z logits (fp32)
    DF_TRY(df_cu_gemm(g, s, &q, err));
    DF_TRY(df_cu_rows_sigmoid_scale(s, a->z, act, a->dt, T, S, err));
  }
  q = gemm(false, true, T, H, S, act, S, a->w2, S, a->dt, y, H, y_dt, 1.0f); // y += a·w2ᵀ
  return df_cu_gemm(g, s, &q, err);
}

extern "C" df_status df_cu_moe_shared_bwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_shared_args *a,
                                          const void *dy, df_dtype dy_dt, void *dx, df_dtype dx_dt, void *workspace,
                                          df_error *err) {
  const int64_t T = a->T, H = a->H, S = a->S;
  if (T <= 0) return DF_OK;
  if (dy_dt != a->dt)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_shared_bwd", "pass dy in the expert's storage dtype",
                   "dy is %s, the expert stores %s", df_dtype_name(dy_dt), df_dtype_name(a->dt));
  const size_t ts = r256(es(a->dt) * (size_t)(T * S));
  char *w = (char *)workspace;
  void *act = w, *hs = w + ts, *da = w + 2 * ts, *dz16 = w + 3 * ts;
  float *dzeta = (float *)(w + 3 * ts + r256(es(a->dt) * (size_t)T));
  df_cu_swiglu_in in = {T, S, a->gate, a->up, S, S, a->dt, a->swiglu_limit};
  DF_TRY(df_cu_swiglu_fwd(s, &in, act, a->dt, S, err));
  DF_TRY(df_cu_cast(s, hs, a->dt, act, a->dt, T * S, err));
  if (a->gated) DF_TRY(df_cu_rows_scale(s, a->z, hs, a->dt, T, S, err));
  // Down projection: e = dy·w2 (∂a when ungated); dw2 += dyᵀ·h.
  df_cu_gemm_args q = gemm(false, false, T, S, H, dy, H, a->w2, S, a->dt, da, S, a->dt, 0.0f);
  DF_TRY(df_cu_gemm(g, s, &q, err));
  if (a->g2) {
    q = gemm(true, false, H, S, T, dy, H, hs, S, a->dt, a->g2, S, DF_F32, 1.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
  }
  if (a->gated) DF_TRY(df_cu_rows_gate_bwd(s, a->z, da, a->dt, act, a->dt, T, S, dzeta, err));
  // SwiGLU backward: d(gate) into hs, d(up) into act.
  DF_TRY(df_cu_swiglu_bwd(s, &in, da, a->dt, S, hs, act, a->dt, S, err));
  q = gemm(false, false, T, H, S, hs, S, a->w1, H, a->dt, dx, H, dx_dt, 1.0f); // dx += dgate·w1
  DF_TRY(df_cu_gemm(g, s, &q, err));
  q = gemm(false, false, T, H, S, act, S, a->w3, H, a->dt, dx, H, dx_dt, 1.0f); // dx += dup·w3
  DF_TRY(df_cu_gemm(g, s, &q, err));
  if (a->g1) {
    q = gemm(true, false, S, H, T, hs, S, a->x, H, a->dt, a->g1, H, DF_F32, 1.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
  }
  if (a->g3) {
    q = gemm(true, false, S, H, T, act, S, a->x, H, a->dt, a->g3, H, DF_F32, 1.0f);
    DF_TRY(df_cu_gemm(g, s, &q, err));
  }
  if (!a->gated) return DF_OK;
  // The gate: dx += dζ·g_s, dg_s += dζᵀ·x (dζ cast to the storage dtype for the GEMMs).
  DF_TRY(df_cu_cast(s, dz16, a->dt, dzeta, DF_F32, T, err));
  q = gemm(false, false, T, H, 1, dz16, 1, a->wg, H, a->dt, dx, H, dx_dt, 1.0f);
  DF_TRY(df_cu_gemm(g, s, &q, err));
  if (!a->gg) return DF_OK;
  q = gemm(true, false, 1, H, T, dz16, 1, a->x, H, a->dt, a->gg, H, DF_F32, 1.0f);
  return df_cu_gemm(g, s, &q, err);
}
