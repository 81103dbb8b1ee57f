// `draftforge step`: one DFlash micro-step from a recipe (docs/dflash-step.md) with a dump of the gradients
// and loss terms, the parity target of the PyTorch reference. No optimizer step.
#ifndef DF_TRAIN_STEP_H
#define DF_TRAIN_STEP_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/dflash_model.h"
#include "strategies/dflash.h"
#include "train/batch.h"

#ifdef __cplusplus
extern "C" {
#endif

// What one micro-step needs besides the model and the batch.
typedef struct {
  int64_t num_anchors;
  double loss_decay_gamma; // 0: off
  int64_t mask_token_id;
  df_dflash_loss_options loss;
} df_step_options;

// The frozen target pieces as the step reads them: embedding (V, H) and LM head (V, H), CPU fp32.
typedef struct {
  const float *embed, *lm_head;
  int64_t vocab, hidden;
} df_step_frozen;

// One micro-step on a loaded batch: anchors from s, block inputs embedded with the frozen embedding, the
// draft forward, the objective, and the backward into the model's zeroed grads (d(loss_num/loss_den)).
// out->N receives the blocks per sample; metrics are owned by the caller (df_dflash_metrics_free).
df_status df_step_micro(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                        const df_batch *batch, df_dflash_sampler *s, const df_step_options *opt, int64_t *out_n,
                        df_dflash_metrics *out, df_error *err);

typedef struct {
  double loss_num, loss_den, loss, acc_num, acc_den;
  int64_t num_blocks;
  int64_t B, S, N, bs;
  double mean_accept_len;    // over kept blocks
  df_dflash_metrics metrics; // per-position counts (owned; df_step_result_free)
} df_step_result;

// Parses the recipe, loads the target pieces, configs, model (init or warm start) and the first batch, runs
// one micro-step on threads CPU threads (0: OpenMP default) and, when dump_dir is not NULL, writes
// dump_dir/grads.safetensors (F32, every trainable parameter) and dump_dir/step.json atomically.
df_status df_step_run(const char *recipe, const char *dump_dir, int threads, df_step_result *out, df_error *err);
void df_step_result_free(df_step_result *r);

// Writes r as step.json into dir (temp file + rename).
df_status df_step_write_json(const df_step_result *r, const char *dir, df_error *err);

// `draftforge step RECIPE.yaml --dump DIR [--threads N]`: argv holds the arguments after "step" (the
// train/commands.h convention); returns the process exit code.
int df_cmd_step(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
