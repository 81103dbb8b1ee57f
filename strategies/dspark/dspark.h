// The DSpark training strategy for one micro-batch (docs/dflash-step.md §6; shared/reference/dflash-dspark.md
// §2.1, §3.3). DSpark shares DFlash's anchors, block inputs, positions and masks (strategies/dflash/dflash.h) and
// differs in its labels (next token, prefix-valid), its heads (modeling/dspark_heads.h) and its objective:
// CE + L1 against the target's distribution + the confidence BCE, all inside one chunked LM-head pass
// (df_lmhead_dspark).
#ifndef DF_STRATEGIES_DSPARK_DSPARK_H
#define DF_STRATEGIES_DSPARK_DSPARK_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/dspark_heads.h"
#include "strategies/dflash/dflash.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- labels (§6.1) -----------------------------------------------------------------------------------------

typedef struct {
  int64_t B, N, bs;     // rows = B·N·bs, ordered (b, n, k) like df_dflash_blocks
  int32_t *labels;      // (B, N·bs) input_ids[anchor + k + 1] where valid, else −1
  uint8_t *valid;       // (B, N·bs) keep · [anchor + k + 1 < S] · loss_mask[anchor + k + 1], prefix product over k
  int32_t *prev;        // (B, N·bs) previous token: input_ids[a + k] with a = anchor for kept blocks (0 for
                        // padding) and the index clamped to S − 1, as SpecForge builds prev_token_ids
  float *weights;       // (B, N·bs) valid · exp(−k/γ) when γ > 0 (k from 0), else valid
  int32_t *teacher_pos; // (B, N·bs) anchor + k where valid (the position whose target state predicts the
                        // label), else −1
} df_dspark_labels;

// input_ids, loss_mask: (B, S); a: the anchors (df_dflash_sample_anchors); gamma >= 0 (0: no decay).
df_status df_dspark_build_labels(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, double gamma, df_dspark_labels *out,
                                 df_error *err);
void df_dspark_labels_free(df_dspark_labels *l);

// ---- objective (§6.3) --------------------------------------------------------------------------------------

typedef struct {
  double ce_alpha, l1_alpha, conf_alpha; // training.dspark_{ce_loss,l1_loss,confidence_head}_alpha (>= 0)
  int64_t chunk_blocks;                  // objective_chunk_blocks; 0 = all rows in one pass
  double grad_scale; // 0: the gradient is d(loss_num / loss_den); > 0: d(grad_scale · loss_num) (accumulation)
} df_dspark_loss_options;

// Additive sums of one micro-batch (ratios are left to the caller: they sum across micro-steps and ranks).
// SpecForge's metric = numerator / denominator:
//   loss = loss_num / loss_den;  ce_loss, l1_loss, confidence_loss, confidence_abs_error = *_num / loss_den;
//   acc, teacher_agreement, teacher_top1_prob, draft_top1_prob = *_num / eval_den;
//   ce_position_k, accuracy_position_k = pos_*_num[k] / pos_den[k];  tau_probabilistic = tau_num / tau_den.
typedef struct {
  double loss_num, loss_den; // α_ce ΣCE·w + α_l1 ΣL1·w + α_conf ΣBCE·w;  Σw
  double ce_num, l1_num, conf_num, conf_err_num;
  double acc_num, eval_den; // correct valid slots; valid slots
  double teacher_agree_num, teacher_top1_num, draft_top1_num;
  double tau_num, tau_den;  // Σ over blocks with a valid slot of 1 + Σ_k Π_{j<=k} y_j·valid_j; their count
  double greedy_accept_sum; // Σ over kept blocks of 1 + the leading run of correct valid slots
  int64_t num_blocks;       // Σ keep
  int64_t bs;
  double *pos_ce_num, *pos_acc_num, *pos_den; // (bs)
  bool has_teacher;    // the teacher was computed (α_l1 > 0, or a confidence head with α_conf > 0)
  bool has_confidence; // the BCE term ran (a confidence head and α_conf > 0)
} df_dspark_metrics;

void df_dspark_metrics_free(df_dspark_metrics *m);

// The objective on the draft's final hidden states (B·N·bs, H) with the frozen head (V, H) and the heads of
// the model. last_hidden: the batch's target_last_hidden_states (B, S, H), needed (else an error naming
// target_last_hidden_states) when α_l1 > 0 or a confidence head has α_conf > 0. Runs the heads forward, the
// fused op (chunk_blocks·bs rows per chunk), and, when dhidden is not NULL, the heads' backward: the heads'
// parameter gradients are added into the model's grads and d/d(hidden) is written into dhidden (B·N·bs, H).
// This host-array entry point (tests, tools) uploads the labels, runs df_dspark_objective_rows and reads its sums
// back once; hidden and dhidden live on the context's device.
df_status df_dspark_objective(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                              const df_tensor *hidden, const df_tensor *head, const float *last_hidden, int64_t S,
                              const df_dspark_labels *lab, const df_dflash_anchors *a, float *dhidden,
                              df_dspark_metrics *out, df_error *err);

// ---- the objective on the device -----------------------------------------------------------------------------

// Which terms run (SpecForge: the teacher only when the L1 term or an active confidence head needs it).
typedef struct {
  int64_t rank; // the Markov head's rank (0: none)
  bool conf;    // the confidence BCE runs (a confidence head and α_conf > 0)
  bool teacher; // the teacher distribution is computed (α_l1 > 0, or conf)
} df_dspark_terms;
df_dspark_terms df_dspark_objective_terms(const df_dspark_loss_options *opt, const df_dspark_heads *heads);

// The objective's per-row inputs as views on the context's device (strategies/dflash/stage.c uploads them with the
// batch).
typedef struct {
  int64_t B, N, bs;      // rows R = B·N·bs, ordered (b, n, k)
  df_tensor labels;      // [R] i32
  df_tensor valid;       // [R] u8
  df_tensor prev;        // [R] i32
  df_tensor weights;     // [R] f32
  df_tensor teacher_idx; // [R] i32 row b·S + teacher_pos of the batch's last hidden states, −1 where not valid
  df_tensor keep;        // [B·N] u8
  double loss_den;       // Σ weights, computed on the host where the labels were built
} df_dspark_rows;

// Device scratch of the objective: per row f32 ce, top1, l1, ttop1, bce, dconf; u8 correct, agree; du [R, r]
// (with a Markov head); teacher [R, H] (the gathered teacher rows, when the teacher runs).
// du and teacher are in the draft's storage dtype; teacher32 (bf16 storage only, else data NULL) receives the fp32
// teacher rows before their cast.
typedef struct {
  df_tensor ce, top1, l1, ttop1, bce, dconf, correct, agree, du, teacher, teacher32;
} df_dspark_work;

// Σ weights of labels built on the host; the teacher row indices (df_dspark_rows.teacher_idx) for context S.
double df_dspark_loss_den(const df_dspark_labels *lab);
void df_dspark_teacher_index(const df_dspark_labels *lab, int64_t S, int32_t *idx);

// The objective on the device: the teacher rows gathered from last_hidden [B·S, H] (NULL when no term needs
// the teacher), the heads, the fused pass, the block metrics added into stats [DF_DSPARK_STATS(bs)] f64, and
// with dhidden the heads' backward. Nothing is read back to the host.
df_status df_dspark_objective_rows(df_ctx *ctx, const df_dspark_loss_options *opt, df_dspark_heads *heads,
                                   const df_tensor *hidden, const df_tensor *head, const df_tensor *last_hidden,
                                   const df_dspark_rows *rows, df_dspark_work *w, df_tensor *dhidden, df_tensor *stats,
                                   df_error *err);

// The metrics of a stats vector read back from the device: the sums, loss_num = α_ce·ce + α_l1·l1 + α_conf·conf
// (l1 only when α_l1 > 0, conf only when the term ran), pos arrays allocated (df_dspark_metrics_free).
df_status df_dspark_metrics_from_stats(const double *stats, int64_t bs, double loss_den,
                                       const df_dspark_loss_options *opt, df_dspark_terms terms, df_dspark_metrics *out,
                                       df_error *err);

#ifdef __cplusplus
}
#endif

#endif
