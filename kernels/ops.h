// The op interface: every numerical operation the draft models and the trainer need, forward and
// backward, over df_tensor views. Model code calls only these; the context decides which backend runs.
//
// Conventions
// - All tensors are contiguous and row-major; indices are i32, flags u8.
// - Storage dtype: an op's activation, weight and gradient tensors share one storage dtype, f32 or bf16 (the
//   GPU path stores bf16 and accumulates in fp32); statistics are always f32: RMSNorm rstd, attention lse,
//   RoPE frequencies, per-row losses / weights / flags' companions, confidence logits, norms, and the
//   optimizer's masters and moments. Whether a backend takes bf16 is its table's answer (kernels/backend.h);
//   the CPU backend is f32 only, and says so naming the op.
// - Backward ops *write* the input gradient (dx, dq, ...) unless `accumulate_dx` says add; parameter
//   gradients (dw, db, dtable) are always *added to*, so a caller zeroes the grad buffer once per step.
// - Every op validates shapes, dtypes and devices first and fails with an error naming the argument;
//   nothing is written when validation fails.
// - Shape letters: R rows, D/H feature width, V vocab, B batch, S context, N anchors, bs block size,
//   nH/nKV query/kv heads, hd head dim.
#ifndef DF_KERNELS_OPS_H
#define DF_KERNELS_OPS_H

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------------------------------------
// Context: the backend (kernels/backend.h: CPU, CUDA or the fake test device) and its handles. Passed down
// to every op; never global.
typedef struct df_ctx df_ctx;

struct df_backend;

typedef struct {
  df_device device;
  int num_threads; // CPU worker threads; 0 = OpenMP default
  int cuda_device; // CUDA ordinal when device == DF_DEV_CUDA
  // An explicit backend table (kernels/backend.h), e.g. the strict fake device for tests; NULL: device's table.
  const struct df_backend *backend;
  // Measure mode (a memory plan, docs/architecture.md "Memory accounting"): the backend's state is never created;
  // df_buffer_alloc hands out unique addresses in PROT_NONE ranges (any host or op access faults) and accounts them;
  // copies and ops validate their arguments, then do nothing — except that an op whose backend takes workspace
  // requests exactly what it would (its measure path). Reads back to the host give zeros; pinned host memory is
  // real. The table is the device's (CUDA even without a GPU): the plan is that backend's.
  bool measure;
} df_ctx_options;

df_status df_ctx_create(const df_ctx_options *opt, df_ctx **out, df_error *err);
void df_ctx_destroy(df_ctx *ctx);
df_device df_ctx_device(const df_ctx *ctx);
int df_ctx_num_threads(const df_ctx *ctx);
const char *df_ctx_backend_name(const df_ctx *ctx);
// Whether host code may dereference the context's buffers (true only for the CPU backend). Code that would
// otherwise read device memory (checkpoint writes, test hooks) stages through df_copy when it is false.
bool df_ctx_host_addressable(const df_ctx *ctx);
// Whether this build can run op on a CUDA device at all (compiled in and a device present).
bool df_cuda_available(void);
// Whether this build has the CUDA backend's table, GPU or not (a measuring context can plan for it without one).
bool df_cuda_built(void);

// Whether ctx measures instead of running (df_ctx_options.measure).
bool df_ctx_measuring(const df_ctx *ctx);

// What a device buffer holds, for the accounting below: set at the allocation site (df_buffer_alloc_as), or for a
// whole call by its caller (df_ctx_set_mem_tag). Weights are the model's fp32 parameters (today also the masters:
// DF_MEM_MASTERS is for a separate fp32 copy once weights are stored bf16); optimizer: AdamW moments and the element
// mask; stage: the micro-batch's upload slots and step scratch; workspace: df_ctx_workspace and backend scratch.
typedef enum {
  DF_MEM_OTHER,
  DF_MEM_WEIGHTS,
  DF_MEM_GRADS,
  DF_MEM_MASTERS,
  DF_MEM_OPTIMIZER,
  DF_MEM_ACTIVATIONS,
  DF_MEM_STAGE,
  DF_MEM_WORKSPACE,
  DF_MEM_STATS,
  DF_MEM_FFN_STATE,
  DF_MEM_FROZEN,
  DF_MEM_TARGET_WEIGHTS,
  DF_MEM_KV_CACHE,
  DF_MEM_TARGET_ACTIVATIONS,
  DF_MEM_TAGS
} df_mem_tag;
const char *df_mem_tag_name(df_mem_tag tag); // "weights", "kv_cache", ...

// Buffers on the context's device (CPU: 64-byte aligned host memory) and copies between devices. df_buffer_alloc
// tags the buffer with the context's current tag (DF_MEM_OTHER unless a caller set one).
df_status df_buffer_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err);
df_status df_buffer_alloc_as(df_ctx *ctx, df_mem_tag tag, size_t bytes, void **out, df_error *err);
void df_buffer_free(df_ctx *ctx, void *p);
// Sets the tag df_buffer_alloc uses from now on; returns the previous one (restore it when the call is done).
df_mem_tag df_ctx_set_mem_tag(df_ctx *ctx, df_mem_tag tag);
// Page-locked host memory for staging uploads (CPU: ordinary aligned memory).
df_status df_host_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err);
void df_host_free(df_ctx *ctx, void *p);
// A copy that has completed on return.
df_status df_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                  df_error *err);
// A copy queued on the context's stream, ordered with the ops around it; its host side must stay untouched
// (and, for uploads, should be df_host_alloc memory) until an event recorded after it has been waited for.
df_status df_copy_async(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                        df_error *err);
// A point in the context's queue: record it after queued work, wait for it before reusing that work's host
// buffers. Synchronous backends (CPU) complete everything before record returns.
typedef struct df_event df_event;
df_status df_event_create(df_ctx *ctx, df_event **out, df_error *err);
df_status df_event_record(df_ctx *ctx, df_event *ev, df_error *err);
df_status df_event_wait(df_ctx *ctx, df_event *ev, df_error *err);
void df_event_destroy(df_ctx *ctx, df_event *ev);
// The backend's own handle (a cudaEvent_t on CUDA, for another CUDA stream to wait on or record); NULL on a
// backend without events and in a measuring context.
void *df_event_native(const df_event *ev);
// Waits for the context's queued work (no-op on the CPU).
df_status df_sync(df_ctx *ctx, df_error *err);

// Debug counters of host↔device traffic through df_copy / df_copy_async (device↔device and host↔host copies
// are not transfers). Tests use them to prove a training step stays on the device.
typedef struct {
  int64_t h2d, d2h;             // copies
  int64_t h2d_bytes, d2h_bytes; // bytes
} df_transfer_stats;
df_transfer_stats df_ctx_transfer_stats(const df_ctx *ctx);
void df_ctx_reset_transfer_stats(df_ctx *ctx);

// Memory accounting, for every backend (kernels/context.c): bytes as requested of df_buffer_alloc*, the workspace
// (df_ctx_workspace) and the backend's own state (CUDA: the cuBLASLt workspace), live now and at their peaks since
// the context was made. at_peak is the tags' split of the device peak (its entries add up to device.peak); tag[i].peak
// is each tag's own maximum, reached at any time. Page-locked host memory (df_host_alloc) is counted apart.
typedef struct {
  int64_t live, peak;
} df_mem_count;
typedef struct {
  df_mem_count device, host;
  df_mem_count tag[DF_MEM_TAGS];
  int64_t at_peak[DF_MEM_TAGS];
  int64_t allocs; // device allocations made (workspace regrowths included)
} df_mem_stats;
df_mem_stats df_ctx_mem_stats(const df_ctx *ctx);
// Two contexts on one device (the trainer's and the online target's): live and at_peak add, peaks add — exact when
// one context's memory stays as it is while the other peaks (the target's, after its first prefill), else a bound.
void df_mem_stats_add(df_mem_stats *into, const df_mem_stats *b);

// ---------------------------------------------------------------------------------------------
// Dense algebra

// c[M,N] = alpha · op(a) · op(b) + beta · c, op = transpose when the flag is set.
df_status df_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b, float alpha,
                    float beta, df_tensor *c, df_error *err);

// y[M,N] = x[M,K] · w[N,K]ᵀ (+ b[N]). x may have any leading dims; they are flattened into M.
df_status df_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b, df_tensor *y,
                            df_error *err);

// dx[M,K] (= or +=) dy · w;  dw[N,K] += dyᵀ · x;  db[N] += Σ_rows dy.  dx, dw, db may each be NULL. With bf16
// storage, dw and db may be f32 (mixed precision keeps fp32 weight gradients: the products accumulate in fp32 and
// are added to the fp32 gradient without a bf16 rounding).
df_status df_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w, df_tensor *dx,
                             bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err);

// y (+)= alpha · x, elementwise over equal shapes (residual adds, gradient accumulation).
df_status df_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err);

// t[i] = value, for any dtype (rounded to nearest for bf16, truncated for integers): zeroing gradients and
// accumulators on the device.
df_status df_fill(df_ctx *ctx, df_tensor *t, double value, df_error *err);
// t[i] *= alpha over f32 or bf16 storage.
df_status df_scale(df_ctx *ctx, df_tensor *t, float alpha, df_error *err);
// dst = src converted between f32 and bf16 (round to nearest even), or copied when the dtypes agree; equal numel.
df_status df_cast(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err);

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dimension D: y = x · rsqrt(mean(x²) + eps) · w.
// x is viewed as [R, D] with D = w's length; this covers the per-head q_norm/k_norm too (x [T, nh, hd],
// w [hd]). rstd [R] is saved for the backward.
df_status df_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                             df_tensor *rstd, df_error *err);
// dx (= or +=) ∂/∂x;  dw[D] += ∂/∂w (dw may be NULL; f32 under bf16 storage too, as in df_linear_backward).
df_status df_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                              const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_error *err);

// ---------------------------------------------------------------------------------------------
// Rotary embedding, NeoX rotate-half convention. x [T, nh, hd], pos [T] i32 (any positions),
// inv_freq [hd/2] (df_rope_default_inv_freq or a scaled table), mscale multiplies cos and sin
// (1 for default RoPE, YaRN's attention factor otherwise). angle = pos · inv_freq[i] in fp32.
//   y[i]        = x[i]·cos − x[i+hd/2]·sin
//   y[i+hd/2]   = x[i+hd/2]·cos + x[i]·sin        (i < hd/2)
// y may alias x; dx may alias dy.
void df_rope_default_inv_freq(double theta, int head_dim, float *inv_freq);
df_status df_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                          float mscale, df_tensor *y, df_error *err);
df_status df_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                           float mscale, df_tensor *dx, df_error *err);

// ---------------------------------------------------------------------------------------------
// SwiGLU: h = silu(g') · u' with, when limit L > 0, g' = min(g, L) and u' = clamp(u, −L, L);
// otherwise g' = g, u' = u. g, u, h share one shape. Clamped elements pass no gradient.
df_status df_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                            df_error *err);
df_status df_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u, float limit,
                             df_tensor *dg, df_tensor *du, df_error *err);

// ---------------------------------------------------------------------------------------------
// Embedding gather: out[T, H] = table[ids[T], :]. An id outside [0, V) is an error naming its index.
df_status df_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                               df_error *err);
// dtable[V, H] += scatter of dout by ids (only for a trainable table; the target's is frozen).
df_status df_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                df_error *err);
// Row gather with holes: out[r, :] = src[idx[r], :] for idx[r] >= 0 and 0 for idx[r] < 0; src [N, H],
// idx [R] i32, out [R, H] (DSpark's teacher rows). idx[r] >= N is the caller's bug: the CPU backend reports it,
// others assume the host validated the indices where it built them.
df_status df_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out, df_error *err);
// Strided 2-D copy between two distinct buffers of one storage dtype, offsets and strides in elements:
//   dst[dst_offset + i·dst_stride + j]  =  (+= with accumulate)  src[src_offset + i·src_stride + j]
// for i < rows, j < cols; dst_stride >= cols (its rows do not overlap); both ranges inside their tensors.
// Concatenating row pieces ([h ; e]), adding a column range of a gradient back, taking every bs-th row.
typedef struct {
  int64_t rows, cols;
  int64_t src_offset, src_stride;
  int64_t dst_offset, dst_stride;
  bool accumulate;
} df_copy_2d_desc;
df_status df_copy_2d(df_ctx *ctx, const df_copy_2d_desc *desc, const df_tensor *src, df_tensor *dst, df_error *err);

// ---------------------------------------------------------------------------------------------
// Block-masked attention (DFlash). Queries are the N·bs block tokens of each sample; keys/values are
// [context (S rows) ; block tokens (N·bs rows)]. Query (block n, offset o) of sample b sees:
//   - context key j iff j < anchor[b,n]  (and, with a window W > 0, j ≥ anchor + o − (W − 1));
//   - block key (n, o′) of its own block: all o′, or o′ ≤ o with a window (causal inside the block);
//   - nothing if keep[b,n] == 0: its output row is 0.
// GQA: query head h reads kv head h / (nH / nKV). Memory is O(rows · hd): the Q×KV mask is never built.
typedef struct {
  int64_t context_len; // S
  int64_t block_size;  // bs
  int64_t window;      // 0: full attention; > 0: sliding window W
  float scale;         // softmax scale, normally 1/sqrt(hd)
} df_block_attn_desc;

// q [B, N·bs, nH, hd]; k, v [B, S + N·bs, nKV, hd]; anchors [B, N] i32; keep [B, N] u8;
// out [B, N·bs, nH, hd]; lse [B, nH, N·bs] (log-sum-exp of the scaled scores; −inf for empty rows).
df_status df_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                const df_tensor *v, const df_tensor *anchors, const df_tensor *keep, df_tensor *out,
                                df_tensor *lse, df_error *err);
// dq, dk, dv are written (not accumulated); out and lse come from the forward.
df_status df_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                 const df_tensor *v, const df_tensor *anchors, const df_tensor *keep,
                                 const df_tensor *out, const df_tensor *lse, const df_tensor *dout, df_tensor *dq,
                                 df_tensor *dk, df_tensor *dv, df_error *err);

// ---------------------------------------------------------------------------------------------
// Fused LM head + cross-entropy. hidden [R, H] · head [V, H]ᵀ gives logits that are produced and
// consumed in row chunks (at most chunk_rows rows at a time, and in smaller tiles inside), so the
// [R, V] logits never exist whole.
//   loss[r]    = −log softmax(logits_r)[labels[r]]        (unweighted; 0 when labels[r] < 0)
//   correct[r] = argmax(logits_r) == labels[r]            (first maximum wins, as torch.argmax)
//   dhidden    = grad_scale · weights[r] · ∂loss[r]/∂hidden_r   (written; NULL = forward only)
// weights may be NULL (all 1). Rows with labels < 0 get loss 0, correct 0 and zero gradient.
typedef struct {
  int64_t chunk_rows; // 0: all rows in one chunk
  float grad_scale;   // e.g. 1/Σw; multiplies dhidden
} df_lmhead_ce_desc;

df_status df_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden, const df_tensor *head,
                       const df_tensor *labels, const df_tensor *weights, df_tensor *loss, df_tensor *correct,
                       df_tensor *dhidden, df_error *err);

// ---------------------------------------------------------------------------------------------
// DSpark extras.
// l1[r] = Σ_v |softmax(p_r)_v − softmax(q_r)_v| for two logit sets p, q [R, V] (q is the teacher).
df_status df_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1, df_error *err);
// dp[R, V] = dl1[r] · ∂l1[r]/∂p_r (written). q receives no gradient.
df_status df_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                 df_tensor *dp, df_error *err);
// BCE with logits, elementwise over [R]: loss = max(x, 0) − x·t + log(1 + exp(−|x|)).
df_status df_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss, df_error *err);
// dx = dloss · (sigmoid(x) − t) (written). t receives no gradient.
df_status df_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                 df_tensor *dx, df_error *err);

// ---------------------------------------------------------------------------------------------
// Fused DSpark objective over the LM head: CE, softmax-L1 against a teacher and the confidence BCE in one
// chunked pass, the lmhead_ce row tiling with two logit sets per tile (draft and teacher), so no [R, V]
// tensor exists whole. Per live row r (labels[r] >= 0; every output of any other row is 0):
//   z = hidden_r · headᵀ (+ u_r · w2ᵀ with a Markov latent)   p = softmax(z)   (draft)
//   t = teacher_r · headᵀ                                      q = softmax(t)   (teacher, no gradient)
//   ce[r] = −log p[label];  correct[r] = argmax z == label;  draft_top1[r] = max p
//   l1[r] = Σ_v |p_v − q_v|;  agree[r] = argmax z == argmax t;  teacher_top1[r] = max q
//   bce[r] = BCEWithLogits(conf[r], y), y = clamp(1 − l1/2, 0, 1) detached
// (argmax: first maximum wins). With gradients, of L = grad_scale · Σ_r w_r (α_ce ce + α_l1 l1 + α_conf bce):
//   dhidden [R, H] and du [R, r] are written, dw2 [V, r] is added to, dconf [R] is written.
// L1, agree, teacher_top1 need the teacher; bce needs the teacher and conf.
typedef struct {
  int64_t chunk_rows; // 0: all rows in one chunk
  float grad_scale;   // e.g. 1/Σw
  float alpha_ce, alpha_l1, alpha_conf;
} df_lmhead_dspark_desc;

typedef struct {
  const df_tensor *hidden;    // [R, H] draft hidden rows
  const df_tensor *head;      // [V, H] frozen LM head
  const df_tensor *markov_u;  // [R, r] Markov latent (the bias is u · w2ᵀ), or NULL: no Markov bias
  const df_tensor *markov_w2; // [V, r], with markov_u
  const df_tensor *teacher;   // [R, H] teacher hidden rows, or NULL: CE only
  const df_tensor *labels;    // [R] i32, < 0: row skipped
  const df_tensor *weights;   // [R] f32, or NULL (all 1)
  const df_tensor *conf;      // [R] confidence logits, or NULL
} df_lmhead_dspark_in;

// Outputs; dhidden NULL means forward only, du and dw2 come with markov_u, dconf with conf.
typedef struct {
  df_tensor *ce, *correct;               // [R] f32, u8 (required)
  df_tensor *draft_top1;                 // [R] f32 or NULL
  df_tensor *l1, *agree, *teacher_top1;  // [R] f32, u8, f32 or NULL (need the teacher)
  df_tensor *bce;                        // [R] f32 or NULL (needs conf)
  df_tensor *dhidden, *du, *dw2, *dconf; // [R, H], [R, r], [V, r], [R]
} df_lmhead_dspark_out;

df_status df_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                           const df_lmhead_dspark_out *out, df_error *err);

// ---------------------------------------------------------------------------------------------
// DSpark's Markov heads (modeling/dspark_heads.h): the elementwise parts between their GEMMs (df_linear_*).
// Every tensor has the storage dtype of e / y; σ is the logistic function.

// gated, over [R, r]: gate = σ(pre), u = gate ⊙ e. gate may be pre (in place).
df_status df_markov_gate_forward(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate, df_tensor *u,
                                 df_error *err);
// de += du ⊙ gate;  dpre = du ⊙ e ⊙ gate (1 − gate)  (written).
df_status df_markov_gate_backward(df_ctx *ctx, const df_tensor *gate, const df_tensor *e, const df_tensor *du,
                                  df_tensor *de, df_tensor *dpre, df_error *err);

// rnn: one slot k of nb blocks of bs slots (rows of u and du are (block, slot): R = nb·bs).
typedef struct {
  int64_t slot, block_size; // k in [0, bs), bs
} df_markov_rnn_desc;
// y [nb, 3r] = (a, c, o), slot k's pre-activations; s_prev [nb, r] the state after slot k−1 (NULL: k = 0, zero):
//   s = σ(a) ⊙ s_prev + (1 − σ(a)) ⊙ tanh(c)  [nb, r];   u[b·bs + k, :] = tanh(o)  (u [R, r]; other rows kept).
df_status df_markov_rnn_forward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                const df_tensor *s_prev, df_tensor *s, df_tensor *u, df_error *err);
// Slot k's backward. ds [nb, r]: dL/ds_k in, dL/ds_{k−1} through the gate out (ds ⊙ σ(a)); du [R, r] or NULL (0):
//   dy = (ds (s_prev − tanh c) σ'(a),  ds (1 − σ(a)) (1 − tanh² c),  du[b·bs + k] (1 − tanh² o))  [nb, 3r] written.
df_status df_markov_rnn_backward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                 const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                 df_error *err);

// ---------------------------------------------------------------------------------------------
// Block objectives on the device: D-PACE weights and the per-block metric sums, so the strategies never read
// per-row results on the host. Rows are ordered (block, slot) with bs slots per block; every f32 / u8 tensor
// holds nblocks·bs values (keep: nblocks). Sums are *added* into an f64 stats vector (zero it with df_fill
// once per accumulation window); each call sums its own rows from 0 in row order first, then adds, so one call
// on a zeroed vector reproduces the host loops bit for bit.

typedef enum {
  DF_DPACE_ONE,    // weight 1 (the plain DFlash objective)
  DF_DPACE_SUFFIX, // Σ_{j≥k} P_j·w_j             (loss_type dpace)
  DF_DPACE_PREFIX, // P_k                         (dpace-cumulative-confidence-only)
  DF_DPACE_RATIO,  // Σ_{j≥k} P_j·w_j ÷ P_k, 0 where P_k underflowed (dpace-continuation-value-only)
} df_dpace_mode;

// Per block, in double: s_k = (1−α)·exp(−ce_k) + α where w_k ≠ 0, else 1; P_k = Π_{j≤k} s_j; weight_k by mode.
// out[r] = weight (f32); row_w, when not NULL, gets w[r]·weight (the gradient's row weight).
df_status df_dpace_weights(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                           const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err);

// DFlash block metrics: stats [DF_BLOCK_STATS(bs)] f64 += loss_num = Σ ce·lw; acc_num / acc_den = Σ valid ∧
// correct / Σ valid; accept_sum = Σ over kept blocks of 1 + the leading run of correct slots k >= 1 (slots
// that are not valid neither break nor extend the run); blocks = Σ keep; pos_num + k / pos_num + bs + k: the
// acc counts of slot k. ce, lw f32; correct, valid, keep u8.
enum { DF_BSTAT_LOSS_NUM, DF_BSTAT_ACC_NUM, DF_BSTAT_ACC_DEN, DF_BSTAT_ACCEPT_SUM, DF_BSTAT_BLOCKS, DF_BSTAT_POS };
#define DF_BLOCK_STATS(bs) (DF_BSTAT_POS + 2 * (int64_t)(bs))
df_status df_block_metrics(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct, const df_tensor *lw,
                           const df_tensor *valid, const df_tensor *keep, df_tensor *stats, df_error *err);

// DSpark block metrics (strategies/dspark/dspark.h names each sum). Per row: w the loss weight, v valid (a prefix along
// the block), y = clamp(1 − l1/2, 0, 1). stats [DF_DSPARK_STATS(bs)] f64 +=
//   ce = Σ ce·w; l1 = Σ l1·w; conf = Σ bce·w; conf_err = Σ |sigmoid(conf) − y|·w; acc_num = Σ v·correct;
//   eval_den = Σ v; agree / ttop1 / dtop1 = Σ v·agree / v·teacher_top1 / v·draft_top1;
//   tau_num / tau_den = Σ over blocks with a valid slot of 1 + Σ_k Π_{j≤k} v_j·y_j, and their count;
//   greedy = Σ over kept blocks of 1 + the leading run of valid correct slots; blocks = Σ keep;
//   pos + k, pos + bs + k, pos + 2bs + k: Σ v·ce, Σ v·correct, Σ v of slot k.
// The teacher terms need l1, agree, teacher_top1 (else they stay 0); the confidence terms also bce and conf.
enum {
  DF_DSTAT_CE,
  DF_DSTAT_L1,
  DF_DSTAT_CONF,
  DF_DSTAT_CONF_ERR,
  DF_DSTAT_ACC_NUM,
  DF_DSTAT_EVAL_DEN,
  DF_DSTAT_AGREE,
  DF_DSTAT_TTOP1,
  DF_DSTAT_DTOP1,
  DF_DSTAT_TAU_NUM,
  DF_DSTAT_TAU_DEN,
  DF_DSTAT_GREEDY,
  DF_DSTAT_BLOCKS,
  DF_DSTAT_POS
};
#define DF_DSPARK_STATS(bs) (DF_DSTAT_POS + 3 * (int64_t)(bs))
typedef struct {
  const df_tensor *ce, *correct, *draft_top1; // f32, u8, f32 (required)
  const df_tensor *l1, *agree, *teacher_top1; // f32, u8, f32, or NULL: no teacher
  const df_tensor *bce, *conf;                // f32, or NULL: no confidence term (needs the teacher)
  const df_tensor *valid, *weights, *keep;    // u8, f32, u8 [nblocks]
} df_dspark_metrics_in;
df_status df_dspark_block_metrics(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *in, df_tensor *stats,
                                  df_error *err);

// ---------------------------------------------------------------------------------------------
// Optimizer over flat fp32 buffers (the parameter table keeps params, grads, m, v contiguous).
typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step; // 1-based count of this update (bias correction uses it)
} df_adamw_hparams;

// torch.optim.AdamW semantics: p ← p·(1 − lr·wd); m, v moments; p ← p − lr/(1−β1^t) · m/(√v/√(1−β2^t) + eps).
df_status df_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                        const df_adamw_hparams *hp, df_error *err);

// norm = sqrt(Σ over all buffers of Σ x²), accumulated in double in a fixed order (deterministic).
df_status df_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err);

// coef = min(1, max_norm / (norm + 1e−6)); every buffer is scaled by coef when coef < 1.
// A NaN/Inf norm (a non-finite gradient) fails with DF_ERR_NUMERIC and touches neither the buffers nor
// *coef: the trainer skips that step. df_global_norm itself returns such a norm with DF_OK.
df_status df_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                          df_error *err);

// The trainer's optimizer step over the whole flat buffer, without a host round trip. mask [n] u8 marks each
// element: bit 0 trainable (padding and buffers are 0: never touched), bit 1 weight decay.
enum { DF_PARAM_TRAIN = 1, DF_PARAM_DECAY = 2 };

// Global gradient norm of the scaled gradient g·grad_scale (each product rounded to fp32, squares summed in
// double in fixed blocks: deterministic) over trainable elements, the clip coefficient and the step's go/no-go,
// into out [DF_NORM_STATS] f64 = {norm, coef = min(1, max_norm / (norm + 1e−6)), ok}; ok = 1 when the norm and
// every value of guard (f64, e.g. the window's loss sums; NULL: none) are finite. Nothing is read back.
enum { DF_NORM_VALUE, DF_NORM_COEF, DF_NORM_OK, DF_NORM_STATS };
typedef struct {
  float grad_scale; // 1 / Σ loss weight of the window
  double max_norm;  // > 0
} df_grad_norm_desc;
df_status df_grad_norm_clip(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad, const df_tensor *mask,
                            const df_tensor *guard, df_tensor *out, df_error *err);

// One fused AdamW over the flat buffers, for elements with DF_PARAM_TRAIN: g = grad·grad_scale, then g·coef when
// coef < 1 (coef from norm_stats; each product rounded to fp32, as scaling then clipping in place would), then
// df_adamw_step's update of master, m, v with hp.weight_decay where DF_PARAM_DECAY is set (0 elsewhere). When
// norm_stats[ok] is 0 nothing is written (the step is skipped on the device). params, when not NULL, receives
// the updated masters in its storage dtype (the bf16 copy the forward reads). master, m, v: f32 [n];
// grad: storage [n]; norm_stats: the output of df_grad_norm_clip, or NULL (coef 1, always ok).
typedef struct {
  df_adamw_hparams hp; // hp.step is this update's 1-based count
  float grad_scale;
} df_adamw_fused_desc;
df_status df_adamw_fused(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master, const df_tensor *grad,
                         df_tensor *m, df_tensor *v, const df_tensor *mask, const df_tensor *norm_stats,
                         df_tensor *params, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
