// Held-out evaluation of a DFlash draft (docs/export-and-eval.md): forward-only over every sample of the eval
// data in file order, anchors from a fixed seed, and the report: loss, acc, per-position accuracy and τ.
#ifndef DF_TRAIN_EVALUATE_H
#define DF_TRAIN_EVALUATE_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/dflash_model.h"
#include "train/step.h"

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
} df_eval_options;

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
} df_eval_report;

// Runs the draft forward-only over the samples of data_path (a shard or shard directory captured for cfg)
// in batches of opt->batch_size, in file order, and sums the counts before taking ratios. out is owned by the
// caller (df_eval_report_free).
df_status df_evaluate(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                      const char *data_path, const df_eval_options *opt, df_eval_report *out, df_error *err);
void df_eval_report_free(df_eval_report *r);

// Human-readable summary, a few lines.
void df_eval_report_print(const df_eval_report *r, FILE *fp);
// The report as JSON (keys: loss, acc, accept_len, per_position_acc, counts, and the given labels: checkpoint
// and data, which may be NULL), written atomically (temp file + rename).
df_status df_eval_report_write_json(const df_eval_report *r, const char *checkpoint, const char *data, const char *path,
                                    df_error *err);

#ifdef __cplusplus
}
#endif

#endif
