// C-callable launchers of the CUDA kernels, one group per file of kernels/cuda/ (named like the CPU twin in
// kernels/cpu/). Each takes a stream and raw device pointers, dimensions and storage dtypes (DF_F32 or DF_BF16;
// arithmetic is fp32 inside every kernel), queues its work and returns at once: nothing here synchronises with
// the host or allocates. Scratch comes from the caller as a workspace, sized by the *_workspace functions.
// Arguments are trusted (the op dispatchers in kernels/*.c validate shapes; data-dependent checks such as
// token ids in range happen on the host where the batch is built): out-of-range ids and labels are treated as
// ignored rows instead of being read out of bounds. Launch failures come back as a df_status naming the kernel.
#ifndef DF_KERNELS_CUDA_LAUNCH_H
#define DF_KERNELS_CUDA_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *df_cu_stream; // cudaStream_t without the CUDA headers

// ---- elementwise.cu: casts, fill, scale, residual adds ----------------------------------------------------

// dst[i] = src[i] converted (fp32 → bf16 rounds to nearest even; NaN stays NaN).
df_status df_cu_cast(df_cu_stream s, void *dst, df_dtype dst_dt, const void *src, df_dtype src_dt, int64_t n,
                     df_error *err);
df_status df_cu_fill(df_cu_stream s, void *dst, df_dtype dt, int64_t n, float value, df_error *err);
// x[i] *= alpha; with d_alpha (device fp32 scalar) instead when it is not NULL, so no host value is needed.
df_status df_cu_scale(df_cu_stream s, void *x, df_dtype dt, int64_t n, float alpha, const float *d_alpha,
                      df_error *err);
// y[i] += alpha · x[i] (gradient accumulation, residual add in place).
df_status df_cu_axpy(df_cu_stream s, float alpha, const void *x, df_dtype x_dt, void *y, df_dtype y_dt, int64_t n,
                     df_error *err);
// out[i] = a[i] + b[i] (a residual add into a new buffer; out may alias a or b).
df_status df_cu_add(df_cu_stream s, const void *a, df_dtype a_dt, const void *b, df_dtype b_dt, void *out,
                    df_dtype out_dt, int64_t n, df_error *err);

// ---- gemm.cu: cuBLASLt GEMMs with cached descriptors and heuristics ------------------------------------------

typedef struct df_cu_gemm_ctx df_cu_gemm_ctx;

// lt and blas are the backend's cublasLtHandle_t / cublasHandle_t (passed as void *); workspace is device memory
// the context uses for every GEMM (32 MiB is plenty on Hopper). The context caches one descriptor set and one
// heuristic result per distinct shape (and pointer alignment).
df_status df_cu_gemm_ctx_create(void *lt, void *blas, void *workspace, size_t workspace_bytes, df_cu_gemm_ctx **out,
                                df_error *err);
void df_cu_gemm_ctx_destroy(df_cu_gemm_ctx *g);
int df_cu_gemm_cache_size(const df_cu_gemm_ctx *g);

// Row-major D[M, N] = alpha · op(A)[M, K] · op(B)[K, N] + beta · C (+ bias[N] broadcast over rows).
// A and B share a dtype (f32, or bf16 with fp32 accumulation); C and D are f32 or bf16; C = NULL means C = D
// (β = 1 then accumulates into D, e.g. fp32 weight gradients across micro-batches). lda/ldb/ldc/ldd are row
// strides in elements of the matrices as stored. batch > 1 runs a strided batch (strides in elements).
typedef struct {
  bool trans_a, trans_b;
  int64_t M, N, K;
  const void *A;
  int64_t lda;
  const void *B;
  int64_t ldb;
  df_dtype ab_dt;
  const void *C; // NULL: C = D
  int64_t ldc;
  void *D;
  int64_t ldd;
  df_dtype cd_dt;
  float alpha, beta;
  const void *bias; // [N] or NULL: the BIAS epilogue
  df_dtype bias_dt;
  int64_t batch;                                  // 0 or 1: a single GEMM
  int64_t stride_a, stride_b, stride_c, stride_d; // per batch item
} df_cu_gemm_args;

df_status df_cu_gemm(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_gemm_args *a, df_error *err);

// Grouped GEMM over experts with host-known row counts (cublasGemmGroupedBatchedEx): for every e with
// rows[e] > 0, row-major D_e[rows_e, N] (= or +=) op(X_e)·op(W_e), X_e = X + offset_e·ldx (rows of the sorted
// token buffer), W_e = W + e·stride_w. trans_w: W_e stored [N, K] (forward: x·Wᵀ) else [K, N] (the data
// gradient dx = dy·W). The host must know the counts: one device→host copy of counts per MoE layer.
typedef struct {
  int E;
  const int32_t *h_rows;    // [E] host row counts
  const int32_t *h_offsets; // [E] host first sorted row of each expert
  int64_t N, K;
  const void *X; // [Σ rows, K] (lda ldx)
  int64_t ldx;
  const void *W; // [E, N, K] (trans_w) or [E, K, N]
  int64_t stride_w;
  bool trans_w;
  void *D; // [Σ rows, N]
  int64_t ldd;
  df_dtype ab_dt, d_dt; // bf16/bf16 → f32/bf16, or f32/f32 → f32
  float beta;           // 0: write, 1: accumulate
} df_cu_grouped_args;

// dW_e[N, K] += dY_eᵀ · X_e for every expert (β = 1; fp32 dW), the weight gradient of y = x·Wᵀ.
typedef struct {
  int E;
  const int32_t *h_rows, *h_offsets;
  int64_t N, K;
  const void *dY; // [Σ rows, N]
  int64_t lddy;
  const void *X; // [Σ rows, K]
  int64_t ldx;
  void *dW; // [E, N, K] fp32
  int64_t stride_dw;
  df_dtype ab_dt;
} df_cu_grouped_wgrad_args;

// Device pointer arrays for a grouped call: 3·E pointers (24·E bytes) of device workspace.
size_t df_cu_grouped_workspace(int E);
df_status df_cu_gemm_grouped(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_grouped_args *a, void *workspace,
                             df_error *err);
df_status df_cu_gemm_grouped_wgrad(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_grouped_wgrad_args *a,
                                   void *workspace, df_error *err);

// ---- rmsnorm.cu ------------------------------------------------------------------------------------------------

// y = x · rstd · w over rows of D; rstd [R] fp32 saved for the backward. x, y: [R, D]; w: [D].
df_status df_cu_rmsnorm_fwd(df_cu_stream s, const void *x, df_dtype x_dt, const void *w, df_dtype w_dt, float eps,
                            void *y, df_dtype y_dt, float *rstd, int64_t R, int64_t D, df_error *err);
// dx (= or +=) ∂/∂x; dw [D] += ∂/∂w (may be NULL; summed in double over a fixed row partition, deterministic,
// then added in dw_dt). dx may alias dy.
size_t df_cu_rmsnorm_bwd_workspace(int64_t R, int64_t D);
df_status df_cu_rmsnorm_bwd(df_cu_stream s, const void *dy, df_dtype dy_dt, const void *x, df_dtype x_dt, const void *w,
                            df_dtype w_dt, const float *rstd, void *dx, df_dtype dx_dt, bool accumulate_dx, void *dw,
                            df_dtype dw_dt, int64_t R, int64_t D, void *workspace, df_error *err);

// ---- rope.cu ---------------------------------------------------------------------------------------------------

// NeoX rotate-half over x [T, nh, hd] by angle = pos[t] · inv_freq[i] (fp32), cos/sin times mscale;
// sign +1 forward, −1 backward (the transposed rotation). y may be x.
df_status df_cu_rope(df_cu_stream s, const void *x, df_dtype x_dt, const int32_t *pos, const float *inv_freq,
                     float mscale, float sign, void *y, df_dtype y_dt, int64_t T, int64_t nh, int64_t hd,
                     df_error *err);

// ---- swiglu.cu -------------------------------------------------------------------------------------------------

// h = silu(g')·u' over [rows, cols] (row strides ldg, ldu, ldh, so g and u may be the two halves of one fused
// gate/up GEMM output); with limit > 0: g' = min(g, L), u' = clamp(u, −L, L), clipped elements pass no gradient.
typedef struct {
  int64_t rows, cols;
  const void *g, *u;
  int64_t ldg, ldu;
  df_dtype in_dt;
  float limit;
} df_cu_swiglu_in;

df_status df_cu_swiglu_fwd(df_cu_stream s, const df_cu_swiglu_in *in, void *h, df_dtype h_dt, int64_t ldh,
                           df_error *err);
// dg, du (written) from dh; dg/du share out_dt and may be the halves of one [rows, 2·cols] buffer.
df_status df_cu_swiglu_bwd(df_cu_stream s, const df_cu_swiglu_in *in, const void *dh, df_dtype dh_dt, int64_t lddh,
                           void *dg, void *du, df_dtype out_dt, int64_t ldd, df_error *err);

// ---- embedding.cu ----------------------------------------------------------------------------------------------

// out[t, :] = table[ids[t], :] (a row gather; an id outside [0, V) gives a zero row).
df_status df_cu_embedding_fwd(df_cu_stream s, const void *table, df_dtype tab_dt, const int32_t *ids, void *out,
                              df_dtype out_dt, int64_t T, int64_t V, int64_t H, df_error *err);
// dtable[V, H] (dtype dt_dt) += scatter of dout by ids, deterministic: the (id, t) pairs are sorted stably by id and
// each id's rows are added in t order (fp32 sums), with no atomics.
size_t df_cu_embedding_bwd_workspace(int64_t T, int64_t V);
df_status df_cu_embedding_bwd(df_cu_stream s, const void *dout, df_dtype dout_dt, const int32_t *ids, void *dtable,
                              df_dtype dt_dt, int64_t T, int64_t V, int64_t H, void *workspace, df_error *err);

// ---- gather.cu: the strided 2-D copy ------------------------------------------------------------------------------

// dst[dst_offset + i·dst_stride + j] = (+= when accumulate) src[src_offset + i·src_stride + j], i < rows, j < cols;
// src and dst do not overlap; offsets and strides in elements of dt.
df_status df_cu_copy_2d(df_cu_stream s, df_dtype dt, const void *src, int64_t src_offset, int64_t src_stride, void *dst,
                        int64_t dst_offset, int64_t dst_stride, int64_t rows, int64_t cols, bool accumulate,
                        df_error *err);

// ---- markov.cu: DSpark's Markov heads (gate, rnn cell), elementwise -------------------------------------------

// gate = σ(pre), u = gate ⊙ e over n elements (gate may be pre).
df_status df_cu_markov_gate_fwd(df_cu_stream s, df_dtype dt, const void *pre, const void *e, void *gate, void *u,
                                int64_t n, df_error *err);
// de += du ⊙ gate; dpre = du ⊙ e ⊙ gate (1 − gate).
df_status df_cu_markov_gate_bwd(df_cu_stream s, df_dtype dt, const void *gate, const void *e, const void *du, void *de,
                                void *dpre, int64_t n, df_error *err);
// Slot `slot` of the rnn cell: y [nb, 3r] = (a, c, o), s_prev [nb, r] or NULL (zero state), s [nb, r],
// u [nb·bs, r] (only rows b·bs + slot written).
df_status df_cu_markov_rnn_fwd(df_cu_stream s, df_dtype dt, const void *y, const void *s_prev, void *st, void *u,
                               int64_t nb, int64_t r, int64_t bs, int64_t slot, df_error *err);
// Its backward: ds [nb, r] in (dL/ds_k) and out (dL/ds_{k−1}), du [nb·bs, r] or NULL, dy [nb, 3r] written.
df_status df_cu_markov_rnn_bwd(df_cu_stream s, df_dtype dt, const void *y, const void *s_prev, const void *du, void *ds,
                               void *dy, int64_t nb, int64_t r, int64_t bs, int64_t slot, df_error *err);

// ---- attention.cu (bf16 tensor cores) and attention_f32.cu (fp32 CUDA cores) ------------------------------------

typedef enum {
  DF_CU_ATTN_AUTO = 0, // bf16 inputs → tensor cores, fp32 inputs → the fp32 kernels
  DF_CU_ATTN_TENSOR_CORE,
  DF_CU_ATTN_FP32,
} df_cu_attn_path;

// Block-masked DFlash attention, the semantics of df_block_attn_* in kernels/ops.h. q, out, dout, dq:
// [B, N·bs, nH, hd]; k, v, dk, dv: [B, S + N·bs, nKV, hd]; anchors [B, N] i32, keep [B, N] u8 (device);
// lse [B, nH, N·bs] fp32. Anchors of kept blocks are trusted to lie in [0, S).
typedef struct {
  int64_t B, N, bs, S, nH, nKV, hd, window;
  float scale;
  const void *q, *k, *v;
  df_dtype in_dt;
  const int32_t *anchors;
  const uint8_t *keep;
  void *out;
  df_dtype out_dt;
  float *lse;
  // backward only
  const void *dout;
  void *dq, *dk, *dv;
  df_dtype grad_dt;
  df_cu_attn_path path;
} df_cu_attn_args;

df_status df_cu_block_attn_fwd(df_cu_stream s, const df_cu_attn_args *a, df_error *err);
// Workspace: D = rowsum(dout ∘ out) per query row (fp32 [B, nH, N·bs]).
size_t df_cu_block_attn_bwd_workspace(const df_cu_attn_args *a);
// dq, dk, dv written (not accumulated); every key gradient tile is owned by one thread block that visits its
// query tiles in block order, so dk/dv are deterministic without atomics.
df_status df_cu_block_attn_bwd(df_cu_stream s, const df_cu_attn_args *a, void *workspace, df_error *err);

// ---- cudnn_sdpa.cu: cuDNN's SDPA (composite graph) as the GPU attention oracle ----------------------------------

// The DFlash block mask as an additive bias [B, 1, N·bs, S + N·bs] bf16: 0 where visible, −30000 elsewhere
// (rows of dropped blocks are fully masked, and their oracle output is meaningless).
df_status df_cu_dflash_bias(df_cu_stream s, const df_cu_attn_args *a, void *bias_bf16, df_error *err);
// Repeats kv heads: dst [B, L, nH, hd] from src [B, L, nKV, hd] (GQA → MHA for the oracle), bf16.
df_status df_cu_repeat_kv(df_cu_stream s, const void *src, void *dst, int64_t B, int64_t L, int64_t nKV, int64_t nH,
                          int64_t hd, df_error *err);
// out [B, Sq, H, hd] bf16 and stats (log-sum-exp) [B, H, Sq] fp32 from q [B, Sq, H, hd], k/v [B, Skv, H, hd]
// (all bf16) and the bias. Loads libcudnn.so.9 on first use (DF_ERR_UNSUPPORTED when it is absent) and caches one
// execution plan per shape. Forward only.
typedef struct df_cu_sdpa df_cu_sdpa;
df_status df_cu_sdpa_create(df_cu_sdpa **out, df_error *err);
void df_cu_sdpa_destroy(df_cu_sdpa *p);
df_status df_cu_sdpa_fwd(df_cu_sdpa *p, df_cu_stream s, int64_t B, int64_t H, int64_t Sq, int64_t Skv, int64_t hd,
                         float scale, const void *q, const void *k, const void *v, const void *bias, void *out,
                         float *stats, df_error *err);

// ---- lmhead_ce.cu: fused chunked LM head + cross-entropy ---------------------------------------------------------

// Per chunk of at most chunk_rows rows: logits = hidden·headᵀ (fp32, into a reused workspace buffer), one kernel
// for loss, argmax (first maximum), the weight and d(logits) in place, then dhidden = d(logits)·head. No [R, V]
// tensor exists. Semantics of df_lmhead_ce (kernels/ops.h); rows with a label outside [0, V) are ignored rows.
typedef struct {
  int64_t R, H, V, chunk_rows; // chunk_rows <= 0: the default (df_cu_lmhead_default_chunk)
  const void *hidden;          // [R, H]
  const void *head;            // [V, H]
  df_dtype dt;                 // hidden and head storage (bf16: bf16 GEMMs with fp32 accumulation)
  const int32_t *labels;       // [R]
  const float *weights;        // [R] or NULL
  float grad_scale;
  float *loss;      // [R]
  uint8_t *correct; // [R]
  void *dhidden;    // [R, H] (dh_dt) or NULL: forward only
  df_dtype dh_dt;
} df_cu_lmhead_ce_args;

int64_t df_cu_lmhead_default_chunk(int64_t R, int64_t V);
size_t df_cu_lmhead_ce_workspace(const df_cu_lmhead_ce_args *a);
df_status df_cu_lmhead_ce(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_lmhead_ce_args *a, void *workspace,
                          df_error *err);

// ---- lmhead_dspark.cu: the fused DSpark objective ------------------------------------------------------------------

// df_lmhead_dspark semantics (kernels/ops.h, kernels/cpu/lmhead_dspark.c): draft logits z = hidden·headᵀ
// (+ u·w2ᵀ), teacher logits t = teacher·headᵀ, per row CE / L1 / BCE and metrics, the logit gradient in place,
// then dhidden = G·head, du = G·w2 (written), dw2 += Gᵀ·u (β = 1), dconf written.
typedef struct {
  int64_t R, H, V, r, chunk_rows;                             // r: Markov rank (0: no Markov latent)
  const void *hidden, *head, *teacher, *markov_u, *markov_w2; // teacher, u, w2 may be NULL
  df_dtype dt;                                                // storage of hidden, head, teacher, u, w2
  const int32_t *labels;
  const float *weights, *conf; // [R] or NULL
  float grad_scale, alpha_ce, alpha_l1, alpha_conf;
  float *ce;
  uint8_t *correct;
  float *draft_top1, *l1, *teacher_top1, *bce, *dconf; // NULL when not wanted
  uint8_t *agree;
  void *dhidden, *du; // dh_dt, NULL: forward only
  void *dw2;          // [V, r], dw2_dt (the default DF_F32: fp32 accumulation across chunks and micro-batches)
  df_dtype dh_dt, dw2_dt;
} df_cu_lmhead_dspark_args;

size_t df_cu_lmhead_dspark_workspace(const df_cu_lmhead_dspark_args *a);
df_status df_cu_lmhead_dspark(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_lmhead_dspark_args *a, void *workspace,
                              df_error *err);

// ---- dspark_loss.cu: the unfused DSpark pieces ------------------------------------------------------------------

// l1[r] = Σ_v |softmax(p_r) − softmax(q_r)| over fp32 logits [R, V]; dp (written) = dl1[r]·∂l1/∂p_r.
df_status df_cu_softmax_l1_fwd(df_cu_stream s, const float *p, const float *q, float *l1, int64_t R, int64_t V,
                               df_error *err);
df_status df_cu_softmax_l1_bwd(df_cu_stream s, const float *p, const float *q, const float *dl1, float *dp, int64_t R,
                               int64_t V, df_error *err);
// BCE with logits elementwise; dx = dloss·(sigmoid(x) − t).
df_status df_cu_bce_logits_fwd(df_cu_stream s, const float *x, const float *t, float *loss, int64_t n, df_error *err);
df_status df_cu_bce_logits_bwd(df_cu_stream s, const float *x, const float *t, const float *dloss, float *dx, int64_t n,
                               df_error *err);

// ---- optim.cu: fused AdamW, global norm, clip over the flat buffers ------------------------------------------------

// The trainable spans of the flat parameter layout, cut into chunks of at most DF_CU_OPTIM_CHUNK elements that
// never straddle a span, so every chunk has one weight-decay flag. Built on the host once (df_cu_optim_plan_make),
// its table uploaded once (df_cu_optim_plan_upload copies it into device memory the caller owns).
enum { DF_CU_OPTIM_CHUNK = 8192 };

typedef struct {
  int64_t start; // first element (offset into the flat buffers)
  int32_t len;
  int32_t decay; // 1: weight decay applies
} df_cu_optim_chunk;

typedef struct {
  int64_t nchunks;
  df_cu_optim_chunk *h_chunks;       // host table (owned)
  const df_cu_optim_chunk *d_chunks; // device copy (caller memory), set by the caller after upload
} df_cu_optim_plan;

// spans: nspan (offset, length, decay) triples of trainable entries.
df_status df_cu_optim_plan_make(const int64_t *offsets, const int64_t *lengths, const uint8_t *decay, int nspan,
                                df_cu_optim_plan *p, df_error *err);
void df_cu_optim_plan_free(df_cu_optim_plan *p);
size_t df_cu_optim_norm_workspace(const df_cu_optim_plan *p);

// *d_norm (double) = sqrt(Σ over chunks of Σ (scale·g)²) with scale = *d_grad_scale (or 1 when NULL): per-chunk
// double partials, added in chunk order by one block (deterministic).
df_status df_cu_global_norm(df_cu_stream s, const df_cu_optim_plan *p, const float *grad, const float *d_grad_scale,
                            void *workspace, double *d_norm, df_error *err);

// The per-step scalars, computed on the host from lr, betas and the step (no device value involved).
typedef struct {
  float decay, beta1, a1, beta2, a2, bc2_sqrt, eps, neg_step_size;
} df_cu_adamw_coefs;

df_cu_adamw_coefs df_cu_adamw_coefs_of(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);

// One fused update of every chunk: g = grad·scale·clip, torch AdamW order (decay on decayed chunks only), fp32
// master updated, bf16 params (when param is not NULL) rounded from it. clip = min(1, max_norm/(norm + 1e−6)) from
// *d_norm (max_norm <= 0 or d_norm NULL: no clipping); a non-finite norm skips the whole update on the device.
// coefs_nodecay: the same step's scalars with weight_decay 0 (for chunks without decay).
df_status df_cu_adamw(df_cu_stream s, const df_cu_optim_plan *p, float *master, void *param, df_dtype param_dt,
                      const float *grad, float *m, float *v, const df_cu_adamw_coefs *coefs,
                      const df_cu_adamw_coefs *coefs_nodecay, const float *d_grad_scale, const double *d_norm,
                      double max_norm, df_error *err);

// The unfused op-interface pieces: plain AdamW over n elements (all fp32), and buffers scaled by the clip
// coefficient computed on the device from *d_norm.
df_status df_cu_adamw_plain(df_cu_stream s, float *param, const float *grad, float *m, float *v, int64_t n,
                            const df_cu_adamw_coefs *c, df_error *err);
df_status df_cu_sumsq(df_cu_stream s, const float *x, int64_t n, double *d_out, void *workspace, df_error *err);
size_t df_cu_sumsq_workspace(int64_t n);

// ---- moe_router.cu, moe_dispatch.cu, moe_aux.cu: the sparse-MoE FFN pieces --------------------------------------

typedef enum { DF_CU_SCORE_SOFTMAX = 0, DF_CU_SCORE_SIGMOID = 1, DF_CU_SCORE_SQRTSOFTPLUS = 2 } df_cu_score_func;

typedef struct {
  int64_t E, k;
  df_cu_score_func score;
  bool norm_topk_prob;
  float routed_scaling_factor;
  int64_t n_group, topk_group;
} df_cu_router_spec;

// scores [T, E] from fp32 logits (evaluated in double, stored fp32), and the backward dlogits (may alias dscores).
df_status df_cu_moe_scores_fwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                               float *scores, df_error *err);
df_status df_cu_moe_scores_bwd(df_cu_stream s, df_cu_score_func f, int64_t T, int64_t E, const float *logits,
                               const float *scores, const float *dscores, float *dlogits, df_error *err);
// Selection per token (one warp): scores (+ sel_shift), group-limited masking to −inf, top-k best first with ties
// to the lower expert id, combine weights from the unbiased scores; counts [E] int32 (zeroed here, integer atomics).
// E <= 1024, k <= 32.
df_status df_cu_moe_select(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                           const float *sel_shift, int32_t *indices, float *weights, int32_t *counts, df_error *err);
// dscores (written) = aux_row (E, may be NULL) + ∂/∂s of Σ dweights·weights.
df_status df_cu_moe_weights_bwd(df_cu_stream s, const df_cu_router_spec *sp, int64_t T, const float *scores,
                                const int32_t *indices, const float *weights, const float *dweights,
                                const float *aux_row, float *dscores, df_error *err);

// Centering: u = x − per-sample column mean (samples are consecutive blocks of rps rows); batch_mean [H] = mean
// over all rows (may be NULL). Backward: dx (= or +=) du − per-sample mean of du. Fixed: u = x − mu.
df_status df_cu_moe_center_sample_fwd(df_cu_stream s, const float *x, int64_t T, int64_t H, int64_t rps, float *u,
                                      float *batch_mean, df_error *err);
df_status df_cu_moe_center_sample_bwd(df_cu_stream s, const float *du, int64_t T, int64_t H, int64_t rps, float *dx,
                                      bool accumulate, df_error *err);
df_status df_cu_moe_center_fixed(df_cu_stream s, const float *x, const float *mu, int64_t T, int64_t H, float *u,
                                 df_error *err);
// μ ← m on the first update (*steps == 0), else ρ·μ + (1−ρ)·m; *steps += 1 (all on the device).
df_status df_cu_moe_center_ema(df_cu_stream s, int64_t H, const float *stash, float *mu, float *steps, double rho,
                               df_error *err);
// noaux_tc: β_e += rate · sign(mean(load) − load_e), load = counts (device).
df_status df_cu_moe_noaux_update(df_cu_stream s, int64_t E, const int32_t *counts, float *bias, float rate,
                                 df_error *err);
// Switch aux loss *d_loss = coeff·E·Σ_e (counts_e/T)·(Σ_t s_te / T) (double, column sums in a fixed order), and
// its score-gradient row: row[e] = upstream·coeff·E·counts_e / T². Load stats: out[0..2] = max/mean, min/mean,
// fraction of unused experts.
size_t df_cu_moe_aux_workspace(int64_t T, int64_t E);
df_status df_cu_moe_switch_loss(df_cu_stream s, double coeff, int64_t T, int64_t E, const float *scores,
                                const int32_t *counts, void *workspace, double *d_loss, df_error *err);
df_status df_cu_moe_switch_grad_row(df_cu_stream s, double coeff, int64_t T, int64_t E, const int32_t *counts,
                                    double upstream, float *row, df_error *err);
df_status df_cu_moe_load_stats(df_cu_stream s, const int32_t *counts, int64_t E, int64_t T, int64_t k, double *d_out,
                               df_error *err);

// Dispatch plan, the CPU's stable counting sort: offsets [E+1] (exclusive scan of counts), slot [Tk] (slot t·k + j
// of each sorted position, sorted stably by expert), token [Tk] = slot / k, pos_of_slot [Tk] (the inverse).
size_t df_cu_moe_plan_workspace(int64_t Tk, int64_t E);
df_status df_cu_moe_plan(df_cu_stream s, int64_t T, int64_t k, int64_t E, const int32_t *indices, const int32_t *counts,
                         int32_t *offsets, int32_t *slot, int32_t *token, int32_t *pos_of_slot, void *workspace,
                         df_error *err);
// h[p, :] *= w[slot[p]] over [Tk, I] (the combine weight before the down projection).
df_status df_cu_moe_scale_rows(df_cu_stream s, void *h, df_dtype dt, int64_t Tk, int64_t I, const float *w,
                               const int32_t *slot, df_error *err);
// y[t] (= or +=) Σ_j ys[pos_of_slot[t·k + j]] with the k rows added in increasing sorted position (the CPU's
// order): deterministic, no atomics.
df_status df_cu_moe_combine(df_cu_stream s, const void *ys, df_dtype ys_dt, const int32_t *pos_of_slot, int64_t T,
                            int64_t k, int64_t H, void *y, df_dtype y_dt, bool accumulate, df_error *err);
// Backward of h = w·a per sorted row: dweights[slot[p]] = dh_p·a_p (double dot), then dh_p *= w[slot[p]] in place.
df_status df_cu_moe_dweights(df_cu_stream s, void *dh, df_dtype dh_dt, const void *act, df_dtype act_dt, int64_t Tk,
                             int64_t I, const float *w, const int32_t *slot, float *dweights, df_error *err);
// Shared-expert gate: z[t] = sigmoid(zlogit[t]) in place, then a[t, :] *= z[t]; backward dzeta[t] =
// z(1−z)·(da_t·act_t) and da[t, :] *= z[t] in place.
df_status df_cu_rows_sigmoid_scale(df_cu_stream s, float *z, void *a, df_dtype dt, int64_t T, int64_t S, df_error *err);
df_status df_cu_rows_gate_bwd(df_cu_stream s, const float *z, void *da, df_dtype da_dt, const void *act,
                              df_dtype act_dt, int64_t T, int64_t S, float *dzeta, df_error *err);

// Rows scaled by a per-row factor: a[t, :] *= z[t].
df_status df_cu_rows_scale(df_cu_stream s, const float *z, void *a, df_dtype dt, int64_t T, int64_t S, df_error *err);

// ---- moe_grouped.cu: grouped expert GEMMs with device offsets ------------------------------------------------

// Rows sorted by expert, segment e = [offsets[e], offsets[e + 1]) of Tk rows (offsets: device i32 [E + 1]); w is
// [E, out, in]. Forward y [Tk, out] = x_e·w_eᵀ per segment (written). Backward: dw_e += dy_eᵀ·x_e (dw NULL: none),
// then dx [Tk, in] (= or +=) dy_e·w_e (dx NULL: none; dx may alias x). x, w, y, dy, dx, dw all of dtype dt.
df_status df_cu_moe_grouped_fwd(df_cu_stream s, df_dtype dt, const void *x, const void *w, const int32_t *offsets,
                                void *y, int64_t Tk, int64_t E, int64_t in, int64_t out, df_error *err);
df_status df_cu_moe_grouped_bwd(df_cu_stream s, df_dtype dt, const void *dy, const void *x, const void *w,
                                const int32_t *offsets, void *dx, bool accumulate_dx, void *dw, int64_t Tk, int64_t E,
                                int64_t in, int64_t out, df_error *err);

// ---- moe_experts.cu: the routed experts and the shared expert, composed ------------------------------------------

// The routed experts of one layer (moe/experts.c semantics) for T rows routed to k of E experts of width I, storage
// dtype dt for x, the stacked weights w1, w3 [E, I, H], w2 [E, H, I] and the saved activations. h_counts is the host
// copy of counts (the grouped GEMM sizes); the forward fills the saved dispatch plan and pre-activations.
typedef struct {
  int64_t T, H, I, E, k;
  float swiglu_limit;
  df_dtype dt;
  const void *x;
  const void *w1, *w3, *w2;
  float *g1, *g3, *g2; // fp32 gradients [E, ...], added to; NULL: frozen experts
  const int32_t *indices;
  const float *weights;
  const int32_t *counts;                 // device [E]
  const int32_t *h_counts;               // host [E]
  int32_t *offsets, *slot, *token, *pos; // saved: [E + 1], [T·k] ×3
  void *gate, *up;                       // saved: [T·k, I] (dt)
} df_cu_moe_experts_args;

size_t df_cu_moe_experts_fwd_workspace(const df_cu_moe_experts_args *a);
size_t df_cu_moe_experts_bwd_workspace(const df_cu_moe_experts_args *a);
// y (T, H) = Σ_j w_tj·expert_{idx_tj}(x_t) (written).
df_status df_cu_moe_experts_fwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_experts_args *a, void *y,
                                df_dtype y_dt, void *workspace, df_error *err);
// dweights [T·k] written; dx (T, H) added to; expert gradients added unless NULL.
df_status df_cu_moe_experts_bwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_experts_args *a, const void *dy,
                                df_dtype dy_dt, float *dweights, void *dx, df_dtype dx_dt, void *workspace,
                                df_error *err);

// The shared expert (moe/shared_expert.c): w1, w3 [S, H], w2 [H, S], gate wg [1, H] when gated; saved gate, up
// [T, S] (dt) and z [T] (fp32 sigmoid values).
typedef struct {
  int64_t T, H, S;
  float swiglu_limit;
  bool gated;
  df_dtype dt;
  const void *x;
  const void *w1, *w3, *w2, *wg;
  float *g1, *g3, *g2, *gg; // fp32 gradients, added to (NULL: none)
  void *gate, *up;
  float *z;
} df_cu_moe_shared_args;

size_t df_cu_moe_shared_workspace(const df_cu_moe_shared_args *a);
// y (T, H) += z ⊙ w2·swiglu(w1 x, w3 x).
df_status df_cu_moe_shared_fwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_shared_args *a, void *y,
                               df_dtype y_dt, void *workspace, df_error *err);
// dx (T, H) += ∂/∂x of dy (dy in dt); parameter gradients added.
df_status df_cu_moe_shared_bwd(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_moe_shared_args *a, const void *dy,
                               df_dtype dy_dt, void *dx, df_dtype dx_dt, void *workspace, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
