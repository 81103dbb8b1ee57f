// Held-out evaluation of a DFlash or DSpark draft (docs/export-and-eval.md): forward-only over every sample of
// the eval data in file order, anchors from a fixed seed, and the report: loss, acc, per-position accuracy and
// τ (plus the DSpark loss terms and tau_probabilistic for a DSpark draft).
#ifndef DF_TRAIN_EVAL_EVALUATE_H
#define DF_TRAIN_EVAL_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "train/data/batch_source.h"
#include "train/data/hs_scan.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t batch_size;      // samples per forward; the last batch may be smaller (nothing is dropped)
  int64_t max_length;      // data.max_length (<= 0: no truncation)
  int64_t num_anchors;     // training.num_anchors: blocks per sample
  double loss_decay_gamma; // the weights w of the loss (0: none), as in training
  int64_t mask_token_id;   // resolved (>= 0)
  int64_t chunk_blocks;    // training.objective_chunk_blocks (0: one pass)
  uint64_t seed;           // anchor stream, started afresh by every call: eval never touches training RNG
  int64_t max_samples;     // 0: all samples; else the first max_samples in file order
  // DSpark drafts: the loss weights, as df_step_options.dspark (unless `set`, SpecForge's 0.1 / 0.9 / 1.0).
  struct {
    bool set;
    double ce_alpha, l1_alpha, conf_alpha; // training.dspark_{ce_loss,l1_loss,confidence_head}_alpha
  } dspark;
} df_eval_options;

// The eval options a recipe implies (batch size, max_length, num_anchors, loss_decay_gamma, chunking, seed, the
// DSpark alphas) with the resolved mask token; max_samples 0.
df_eval_options df_eval_options_from_recipe(const df_recipe *rc, int64_t mask_token_id);

typedef struct {
  int64_t num_samples, num_batches;
  int64_t skipped_samples; // samples without an anchor candidate (no two adjacent supervised tokens)
  int64_t num_blocks;      // Σ kept blocks
  int64_t block_size;
  double loss_num, loss_den, loss;   // Σ CE·w, Σ w, their ratio (DFlash CE whatever the training loss_type)
  double acc_num, acc_den, acc;      // argmax = label over supervised slots
  double *pos_acc_num, *pos_acc_den; // (block_size) by slot k; slot 0 is never supervised
  double accept_len_sum;             // Σ over kept blocks of 1 + the leading run of correct slots k >= 1
  double accept_len;                 // τ = accept_len_sum / num_blocks
  double seconds;
  // DSpark drafts (dspark true; the objective of df_dspark_objective, forward only, no MoE aux loss): loss_num /
  // loss_den is the α-weighted α_ce·ΣCE·w + α_l1·ΣL1·w + α_conf·ΣBCE·w over Σw; acc and the per-position counts
  // are over prefix-valid slots (slot 0 included: it predicts the token after the anchor), and accept_len the
  // greedy τ (1 + the leading run of correct valid slots). The rest are SpecForge's DSpark metrics: *_loss and
  // confidence_abs_error = *_num / loss_den, teacher_agreement = teacher_agree_num / acc_den, tau_probabilistic =
  // tau_num / tau_den; NaN when the term did not run (has_teacher, has_confidence) or has no denominator.
  bool dspark, has_teacher, has_confidence;
  double ce_num, l1_num, conf_num, conf_err_num, teacher_agree_num, tau_num, tau_den;
  double ce_loss, l1_loss, confidence_loss, confidence_abs_error, teacher_agreement, tau_probabilistic;
  // Samples whose hidden states (or teacher states) hold NaN/Inf, found as they are read (train/data/hs_scan.h): a
  // non-finite result names them.
  df_hs_scan_report nonfinite;
} df_eval_report;

// Runs the draft forward-only over the samples of data_path (a shard or shard directory captured for cfg)
// in batches of opt->batch_size, in file order, and sums the counts before taking ratios. The draft kind decides
// the objective: DFlash's CE, or for a DSpark draft the DSpark labels, heads and objective (the batches then
// carry target_last_hidden_states when the L1 term or an active confidence head needs the teacher). No gradient
// is written. out is owned by the caller (df_eval_report_free).
df_status df_evaluate(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                      const char *data_path, const df_eval_options *opt, df_eval_report *out, df_error *err);
// The same over any batch source (train/data/batch_source.h: captured shards or online data), which stays open.
df_status df_evaluate_source(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                             df_batch_source *src, const df_eval_options *opt, df_eval_report *out, df_error *err);
void df_eval_report_free(df_eval_report *r);

// Human-readable summary, a few lines.
void df_eval_report_print(const df_eval_report *r, FILE *fp);
// The report as JSON (keys: loss, acc, accept_len, per_position_acc, counts, and the given labels: checkpoint
// and data, which may be NULL; a DSpark report adds strategy "dspark", ce_loss, l1_loss, confidence_loss,
// confidence_abs_error, teacher_agreement, tau_probabilistic and their numerators), written atomically (temp
// file + rename).
df_status df_eval_report_write_json(const df_eval_report *r, const char *checkpoint, const char *data, const char *path,
                                    df_error *err);

#ifdef __cplusplus
}
#endif

#endif
