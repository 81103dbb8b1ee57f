// EAGLE-3's ops (docs/eagle3-step.md §4): the training-time-test attention (step 0's causal keys plus the diagonal
// keys of later steps, never a dense [S·T, S·T] mask), the compact teacher's chunked pass over the target vocabulary,
// and the per-step objective pieces (forward KL against the draft-vocabulary teacher, the expected acceptance α, the
// LK losses, SpecForge's metrics). Entries of the backend table (kernels/backend.h); dispatchers in kernels/eagle3.c,
// CPU oracles in cpu/ttt_attn.c and cpu/eagle3_loss.c, CUDA twins in cuda/ttt_attn.cu and cuda/eagle3_loss.cu.
#ifndef DF_KERNELS_EAGLE3_H
#define DF_KERNELS_EAGLE3_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- TTT attention ------------------------------------------------------------------------------------------------
// Step i of T. The key cache holds every step's rotated keys and values, step-major: k, v [T·B, S, nKV, hd]. The
// query of step i at position p of sample b sees
//   - step 0's keys at positions j <= p with j < lengths[b] (the causal mask with the sample's padding), and
//   - the keys of steps 1 .. i at its own position p (the diagonal), never masked,
// one softmax over all of them, scale `scale`. GQA: query head h reads kv head h / (nH / nKV).
typedef struct {
  int64_t step; // i: 0 <= i < T
  float scale;  // 1/sqrt(hd)
} df_ttt_attn_desc;

// q [B, S, nH, hd] (step i's rotated queries); k, v [T·B, S, nKV, hd]; lengths [B] i32 (1 <= lengths[b] <= S: the
// host checks it where it builds the batch); out [B, S, nH, hd]; lse [B, S, nH] (log-sum-exp of the scaled scores).
df_status df_ttt_attn_forward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                              const df_tensor *v, const df_tensor *lengths, df_tensor *out, df_tensor *lse,
                              df_error *err);
// dq [B, S, nH, hd] is written; dk, dv [T·B, S, nKV, hd] are added to (steps 0 .. i: step 0's causal rows and the
// diagonal rows of steps 1 .. i), so the backward of steps T−1 .. 0 in turn completes step m's key gradient when step
// m's own backward has run. out and lse come from the forward.
df_status df_ttt_attn_backward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                               const df_tensor *v, const df_tensor *lengths, const df_tensor *out, const df_tensor *lse,
                               const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv, df_error *err);

// ---- the compact teacher ------------------------------------------------------------------------------------------
// The full-vocabulary statistics of the target's logits hidden [R, H] · head [V, H]ᵀ without the [R, V] logits:
// per row the log-sum-exp and the argmax (first maximum wins, as torch.argmax), in chunks of at most chunk_rows rows
// (0: a backend default) and vocabulary blocks. hidden and head f32, or both bf16 (CUDA; the logits fp32); lse [R] f32,
// argmax [R] i32.
df_status df_lmhead_lse_argmax(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden, const df_tensor *head,
                               df_tensor *lse, df_tensor *argmax, df_error *err);

// The teacher rows from the target's logits over the draft vocabulary (draft id order): logits [R, D] are replaced by
// target_p = softmax(logits) in place; ratio[r] = exp(logsumexp(logits_r) − lse_v[r]) (so the target's own
// probability of draft token d is target_p[r, d] · ratio[r]); pm[r] = t2d[argmax[r]] · loss_mask[r], the position mask.
// lse_v, argmax: df_lmhead_lse_argmax's; t2d [V] u8; loss_mask [R] f32; ratio, pm [R] f32.
df_status df_eagle3_teacher(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                            const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio, df_tensor *pm,
                            df_error *err);

// ---- the per-step objective ---------------------------------------------------------------------------------------
// Rows are the B·S positions of a micro-batch, sample-major. Step i reads the teacher i positions further: row
// r = b·S + p uses teacher row r + i when p + i < S; rows with p + i >= S read nothing (SpecForge's padding: every
// term and gradient of theirs is 0). A call covers the chunk of z rows row0 .. row0 + c − 1.
typedef enum { DF_LK_NONE = 0, DF_LK_ALPHA = 1, DF_LK_LAMBDA = 2 } df_lk_loss;

typedef struct {
  int64_t step;      // i
  int64_t S;         // positions per sample
  int64_t row0;      // the chunk's first row
  int64_t positions; // N = B·S: the KL is a mean over every position, padding included
  df_lk_loss lk;     // training.lk_loss_type
  double kl_scale, kl_decay;
  double weight; // backward: the step's weight in the differentiated loss (0.8^i · grad scale)
  // P-EAGLE (docs/peagle.md): rows [c] i32, when set, names the teacher row of each chunk row (−1: none) in place of
  // row0 + r + step (row0, step and S then only pass the checks); pm_mean makes the KL a mean over the position mask,
  // Σ kl / max(Σ pm, 1e-6) (SpecForge's compute_peagle_metrics), instead of over the N positions.
  const df_tensor *rows;
  bool pm_mean;
} df_eagle3_loss_desc;

// The teacher of a micro-batch (df_eagle3_teacher's outputs, unshifted) and its token rows.
typedef struct {
  const df_tensor *target_p;  // [R, D]
  const df_tensor *ratio;     // [R] f32
  const df_tensor *pm;        // [R] f32: the position mask
  const df_tensor *loss_mask; // [R] f32: the (normalised) loss mask
  const df_tensor *tokens;    // [R] i32: the teacher's argmax (a target id)
  const df_tensor *d2t;       // [D] i32: draft id d means target id d + d2t[d]
} df_eagle3_teacher_rows;

// Per-row terms of the chunk (each [c] f32), with q = softmax(z_r), p the teacher row, o = p · ratio:
//   kl[r] = pm · (−Σ_v p_v log q_v)        alpha[r] = pm · Σ_v min(o_v, q_v)      log_alpha[r] = pm · log α (0 if α=0)
//   pm[r] = pm                             correct[r] = loss_mask · [argmax z + d2t[argmax z] == token]
//   mask[r] = loss_mask (the shifted values; all 0 past the sample's end).
typedef struct {
  df_tensor *kl, *alpha, *log_alpha, *pm, *correct, *mask;
} df_eagle3_row_terms;

// z [c, D]: the draft's logits of rows row0 .. row0 + c − 1.
df_status df_eagle3_loss_forward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                 const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out, df_error *err);

// Step sums of a micro-batch: SUM_* of the per-row terms over all R rows (fixed-order, in double), the step's losses
// from them, and the running sums of a window. local [DF_EAGLE3_STEP_LOCAL] f64 is written (the backward reads its
// acceptance rate and mask sum); stats (f64) are added to: stats[loss_num] += 0.8^i · loss_i, and the step block
// stats[step_block + k] (k = DF_EAGLE3_S_*) += the sums and the micro-batch's kl_i, loss_i, acceptance_i; the shared
// stats[acc_num] / stats[acc_den] += correct / mask sums.
enum {
  DF_EAGLE3_SUM_KL = 0,
  DF_EAGLE3_SUM_ALPHA,
  DF_EAGLE3_SUM_LOG_ALPHA,
  DF_EAGLE3_SUM_PM,
  DF_EAGLE3_SUM_CORRECT,
  DF_EAGLE3_SUM_MASK,
  DF_EAGLE3_STEP_LOCAL // and the number of f64 in local
};
// The step block of the stats vector: the six sums above, then the micro-batch's values, summed over micro-batches.
enum {
  DF_EAGLE3_S_KL_LOSS = DF_EAGLE3_STEP_LOCAL,
  DF_EAGLE3_S_LOSS,
  DF_EAGLE3_S_ACCEPT_RATE,
  DF_EAGLE3_S_LOG_ACCEPT,
  DF_EAGLE3_STEP_STATS
};
typedef struct {
  int64_t step, positions; // i, N = B·S
  df_lk_loss lk;
  double kl_scale, kl_decay;
  double step_weight;                 // 0.8^i
  int64_t loss_num, acc_num, acc_den; // stats slots
  int64_t step_block;                 // first slot of this step's DF_EAGLE3_STEP_STATS
  bool pm_mean;                       // P-EAGLE: the KL over Σ pm (clamped at 1e-6), as df_eagle3_loss_desc
} df_eagle3_sums_desc;
df_status df_eagle3_step_sums(df_ctx *ctx, const df_eagle3_sums_desc *desc, const df_eagle3_row_terms *rows,
                              df_tensor *local, df_tensor *stats, df_error *err);

// dz [c, D] (written) = desc->weight · ∂loss_i/∂z of the chunk's rows; local: this step's df_eagle3_step_sums.
//   none:   loss_i = KL_i = Σ_r kl[r] / N
//   alpha:  loss_i = −Σ_r log_alpha[r] / max(Σ pm, 1e-8)
//   lambda: loss_i = w·KL_i + (1 − w)·(1 − Σ_r alpha[r] / max(Σ pm, 1e-8)), w = kl_scale·exp(−kl_decay·acceptance)
//           with the acceptance detached inside w
// (∂min(o, q)/∂q is 1 where q < o and ½ at a tie, as torch.minimum's backward.)
df_status df_eagle3_loss_backward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                  const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                  df_error *err);

// The greedy acceptance length of the training-time test: per position p of a sample with mask[p] (step 0's loss
// mask), 1 + the run of steps 0, 1, .. whose prediction was correct; correct [T, R] f32 (the df_eagle3_row_terms
// correct of every step). stats[accept_sum] += Σ (1 + run), stats[blocks] += Σ mask.
df_status df_eagle3_accept(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                           int64_t blocks, df_tensor *stats, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
