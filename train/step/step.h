// `draftforge step`: one DFlash or DSpark micro-step from a recipe (docs/dflash-step.md) with a dump of the gradients
// and loss terms, the parity target of the PyTorch reference. No optimizer step.
#ifndef DF_TRAIN_STEP_STEP_H
#define DF_TRAIN_STEP_STEP_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "moe/balance.h"
#include "strategies/dflash.h"
#include "strategies/dspark.h"
#include "train/data/batch.h"
#include "train/recipe/recipe.h"
#include "train/step/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

// What one micro-step needs besides the model and the batch.
typedef struct {
  int64_t num_anchors;
  double loss_decay_gamma; // 0: off
  int64_t mask_token_id;
  df_dflash_loss_options loss;
  // Gradient accumulation (the trainer): 0 keeps the step command's gradient, d(loss_num/loss_den); > 0 makes
  // the backward produce d(grad_scale · loss_num), so a window's numerators add up and the trainer divides once
  // by the window's Σ loss_den at the optimizer boundary.
  double grad_scale;
  bool accumulate; // add into the model's grads instead of zeroing them first
  // DSpark drafts (cfg->kind == DF_DRAFT_DSPARK; a DFlash draft ignores these). Unless `set`, the loss weights
  // are SpecForge's defaults 0.1 / 0.9 / 1.0, so zero-initialized options train a DSpark draft as SpecForge
  // does. The chunking is loss.chunk_blocks; loss.type must be dflash (DSpark has its own objective).
  struct {
    bool set;
    double ce_alpha, l1_alpha, conf_alpha; // training.dspark_{ce_loss,l1_loss,confidence_head}_alpha
  } dspark;
  df_dspark_metrics *dspark_metrics; // when not NULL, receives the DSpark metrics (df_dspark_metrics_free)
  // Device residency (train/step/stage.h). stage: the caller's double-buffered stage, reused across micro-steps (NULL:
  // a temporary one). stats: an f64 vector on the context's device that the step's metric sums are *added* to —
  // DF_BLOCK_STATS(bs) for DFlash, DF_DSPARK_STATS(bs) for DSpark — and nothing is read back; the metrics then
  // carry only what the host knows (loss_den, num_blocks, bs). NULL: the step reads its own sums back once and
  // fills the metrics in full. moe_stats (MoE drafts, with stats): df_moe_stats_elems f64 on the device that the
  // MoE layers add their statistics into (the aux loss weighted by loss_den: its part of loss_num; moe/ffn_moe.h).
  df_stage *stage;
  df_tensor *stats;
  double *moe_stats;
  // Data parallel (the trainer on several ranks): the batch is this rank's share of a global batch, and the
  // anchors replay the global batch's stream (strategies/dflash.h). NULL: the batch is the whole batch.
  const df_dflash_global_batch *global;
  // With global: the ranks' fp32 SUM (MoE drafts: the micro-batch's global loss_den scales the aux gradient).
  const df_moe_collective *dp_sum;
} df_step_options;

// The frozen target pieces as the step reads them: embedding (V, H) and LM head (V, H), fp32 on the context's
// device (df_run_resources_place uploads them once).
typedef struct {
  const float *embed, *lm_head;
  int64_t vocab, hidden;
} df_step_frozen;

// One micro-step on a loaded batch: anchors from s, block inputs embedded with the frozen embedding, the
// draft forward, the objective, and the backward into the model's zeroed grads (d(loss_num/loss_den); see
// df_step_options.grad_scale and .accumulate for the trainer's numerator gradients).
// out->N receives the blocks per sample; metrics are owned by the caller (df_dflash_metrics_free).
// A DSpark draft (docs/dflash-step.md §6) runs the DSpark labels, heads and objective instead; out then holds
// loss_num / loss_den of the DSpark loss, acc_num / acc_den = correct / valid (prefix-valid) slots, the
// per-slot accuracy counts and, as accept_len_sum, Σ over kept blocks of 1 + the leading run of correct valid
// slots; opt->dspark_metrics gets the rest. The batch must carry last_hidden when the loss needs the teacher.
// An MoE draft adds the routers' aux loss to the objective (out->aux_loss; loss_num += aux_loss·loss_den) and its
// gradient to the backward, scaled for the gradient mode (docs/training.md "MoE drafts").
df_status df_step_micro(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                        const df_batch *batch, df_dflash_sampler *s, const df_step_options *opt, int64_t *out_n,
                        df_dflash_metrics *out, df_error *err);

// What the stage of a run with these options builds (train/step/stage.h); heads: the model's DSpark heads or NULL.
df_stage_spec df_step_stage_spec(const df_draft_config *cfg, const df_step_frozen *fz, const df_step_options *opt,
                                 df_dspark_heads *heads);
// The DSpark loss weights of the options (SpecForge's defaults unless opt->dspark.set), with the chunking and
// grad_scale.
df_dspark_loss_options df_step_dspark_loss(const df_step_options *opt);
// The part of DSpark metrics callers that read df_dflash_metrics need (pos arrays allocated).
df_status df_step_dspark_shared(const df_dspark_metrics *d, df_dflash_metrics *out, df_error *err);

typedef struct {
  double loss_num, loss_den, loss, acc_num, acc_den;
  double aux_loss; // MoE: Σ_layers coefficient-scaled router aux loss; loss_num includes aux_loss·loss_den
  int64_t num_blocks;
  int64_t B, S, N, bs;
  double mean_accept_len;    // over kept blocks
  df_dflash_metrics metrics; // per-position counts (owned; df_step_result_free)
  bool dspark;               // a DSpark draft: dspark_metrics is filled (owned; df_step_result_free)
  df_dspark_metrics dspark_metrics;
} df_step_result;

// Parses the recipe, loads the target pieces, configs, model (init or warm start) and the first batch, runs
// one micro-step on threads CPU threads (0: OpenMP default) and, when dump_dir is not NULL, writes
// dump_dir/grads.safetensors (F32, every trainable parameter, no buffers; MoE tensors named by the config's
// checkpoint layout, e.g. experts.{e}.gate_proj.weight for qwen) and dump_dir/step.json atomically. For an MoE
// draft step.json's loss = CE ratio + aux_loss (the routers' summed aux loss) and the gradients include it. The draft
// config decides the strategy (DFlash or DSpark); training.strategy must agree with it.
// device: where it runs (NULL: the recipe's training.device).
df_status df_step_run(const char *recipe, const char *dump_dir, int threads, const df_device_choice *device,
                      df_step_result *out, df_error *err);
void df_step_result_free(df_step_result *r);

// Writes r as step.json into dir (temp file + rename).
df_status df_step_write_json(const df_step_result *r, const char *dir, df_error *err);

// `draftforge step RECIPE.yaml --dump DIR [--threads N] [--device auto|cpu|cuda]`: argv holds the arguments after
// "step" (the train/cli/commands.h convention); returns the process exit code.
int df_cmd_step(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
