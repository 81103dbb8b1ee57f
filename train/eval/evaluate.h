// Held-out evaluation of a draft through its strategy (docs/export-and-eval.md): forward-only over every sample of
// the eval data in file order, anchors from a fixed seed, and the report: loss, acc, per-position accuracy and
// τ, plus the strategy's own metrics (DSpark: its loss terms and tau_probabilistic).
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
  int64_t batch_size;   // samples per forward; the last batch may be smaller (nothing is dropped)
  int64_t max_length;   // data.max_length (<= 0: no truncation)
  uint64_t seed;        // anchor streams, started afresh by every call: eval never touches training RNG
  int64_t max_samples;  // 0: all samples; else the first max_samples in file order
  df_step_settings set; // the strategy's settings (anchors, decay weights, mask token, chunking, its keys)
  // The schedule position a step-dependent objective reads (Domino's lambda_base): optimizer steps taken and the
  // run's horizon; a training run's eval passes its own, a standalone eval 0 and 0 (no horizon).
  int64_t step, horizon;
} df_eval_options;

// The eval options a recipe implies (batch size, max_length, num_anchors, loss_decay_gamma, chunking, seed, the
// strategy's keys through values, which the caller keeps) with the resolved mask token; max_samples 0.
df_eval_options df_eval_options_from_recipe(const df_recipe *rc, int64_t mask_token_id,
                                            const df_strategy_values *values);

typedef struct {
  int64_t num_samples, num_batches;
  int64_t skipped_samples;           // samples with nothing to predict (no two adjacent supervised tokens)
  int64_t num_blocks;                // Σ kept blocks
  int64_t block_size;                // positions of the per-position accuracy
  int64_t first_position;            // the first supervised one (DFlash: 1, the anchor slot is given)
  double loss_num, loss_den, loss;   // the eval objective: its numerator, Σ weights, their ratio
  double acc_num, acc_den, acc;      // correct / supervised predictions
  double *pos_acc_num, *pos_acc_den; // (block_size) by position
  double accept_len_sum;             // Σ over kept blocks of the greedy acceptance length
  double accept_len;                 // τ = accept_len_sum / num_blocks
  double seconds;
  const char *strategy; // the strategy's name
  json_t *report;       // the strategy's own keys of the eval report (owned; DSpark: its loss terms)
  json_t *line;         // the same for a training run's eval line ("eval/..." keys; owned)
  char summary[512];    // the strategy's own metrics as one line of text ("" when none)
  // Samples whose hidden states (or teacher states) hold NaN/Inf, found as they are read (train/data/hs_scan.h): a
  // non-finite result names them.
  df_hs_scan_report nonfinite;
} df_eval_report;

// Runs the draft forward-only over the samples of data_path (a shard or shard directory captured for cfg)
// in batches of opt->batch_size, in file order, and sums the counts before taking ratios. The draft's strategy
// decides the objective (DFlash: the plain CE whatever the training loss; DSpark: its labels, heads and objective,
// the batches then carrying target_last_hidden_states when a term needs the teacher). No gradient is written. out is
// owned by the caller (df_eval_report_free).
df_status df_evaluate(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                      const char *data_path, const df_eval_options *opt, df_eval_report *out, df_error *err);
// The same over any batch source (train/data/batch_source.h: captured shards or online data), which stays open.
df_status df_evaluate_source(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                             df_batch_source *src, const df_eval_options *opt, df_eval_report *out, df_error *err);
void df_eval_report_free(df_eval_report *r);

// Human-readable summary, a few lines.
void df_eval_report_print(const df_eval_report *r, FILE *fp);
// The report as JSON (keys: loss, acc, accept_len, per_position_acc, counts, and the given labels: checkpoint
// and data, which may be NULL; then the strategy's own keys — DSpark: strategy "dspark", ce_loss, l1_loss,
// confidence_loss, confidence_abs_error, teacher_agreement, tau_probabilistic and their numerators), written
// atomically (temp file + rename).
df_status df_eval_report_write_json(const df_eval_report *r, const char *checkpoint, const char *data, const char *path,
                                    df_error *err);

#ifdef __cplusplus
}
#endif

#endif
