// One micro-step of a draft through its strategy's table (strategies/strategy.h), with its sums read back: what
// `draftforge step` dumps (docs/dflash-step.md: the gradients and loss terms, the parity target of the PyTorch
// references), and what tests and benches run. No optimizer step. The trainer drives the strategy run itself.
#ifndef DF_TRAIN_STEP_STEP_H
#define DF_TRAIN_STEP_STEP_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "strategies/dflash/dflash.h"
#include "strategies/strategy.h"
#include "train/data/batch.h"
#include "train/recipe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

// What a strategy run is opened with besides the model (df_strategy_env's settings).
typedef struct {
  int64_t num_anchors;
  double loss_decay_gamma; // 0: off
  int64_t mask_token_id;
  int64_t chunk_blocks;             // training.objective_chunk_blocks
  const df_strategy_values *values; // the strategy's own keys (NULL: SpecForge's defaults)
} df_step_settings;

// The settings a recipe implies (training.num_anchors, loss_decay_gamma, objective_chunk_blocks, the strategy's keys
// read through values, which the caller keeps: df_recipe_strategy_values) with the resolved mask token.
df_step_settings df_step_settings_of(const df_recipe *rc, int64_t mask_token_id, const df_strategy_values *values);

// The draft's strategy opened on ctx (eval: the eval objective, no backward).
df_status df_step_open(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                       const df_step_settings *set, bool eval, df_strategy_run **out, df_error *err);

// A micro-step's results, read back.
typedef struct {
  double loss_num, loss_den, loss, acc_num, acc_den;
  double aux_loss; // the FFN kind's term (MoE: Σ_layers coefficient-scaled router aux loss); loss_num includes
                   // aux_loss·loss_den
  int64_t num_blocks;
  int64_t B, S, N, bs;
  double mean_accept_len;      // over kept blocks
  df_strategy_metrics metrics; // the shared metrics, per-position counts included (owned)
  json_t *report;              // the strategy's own step.json keys (owned; DSpark: its loss terms)
} df_step_result;
void df_step_result_free(df_step_result *r);

// One micro-step on a loaded batch: anchors from sampler, the strategy's batch build, forward, objective and backward
// into the model's grads — d(loss_num/loss_den), zeroing them first — with the sums read back into out.
df_status df_step_micro(df_strategy_run *run, const df_batch *batch, df_dflash_sampler *sampler, df_step_result *out,
                        df_error *err);
// The same with a gradient scale: 0 is the above; > 0 makes the backward produce d(grad_scale · loss_num) and
// accumulate adds into the grads instead of zeroing them first (the trainer's accumulation, for tests).
df_status df_step_micro_scaled(df_strategy_run *run, const df_batch *batch, df_dflash_sampler *sampler,
                               double grad_scale, bool accumulate, df_step_result *out, df_error *err);

// Parses the recipe, loads the target pieces, configs, model (init or warm start) and the first batch, runs
// one micro-step on threads CPU threads (0: OpenMP default) and, when dump_dir is not NULL, writes
// dump_dir/grads.safetensors (F32, every trainable parameter, no buffers; FFN-kind tensors named by the config's
// checkpoint layout, e.g. experts.{e}.gate_proj.weight for qwen MoE) and dump_dir/step.json atomically. For an MoE
// draft step.json's loss = objective ratio + aux_loss and the gradients include it. The draft config decides the
// strategy; training.strategy must agree with it. device: where it runs (NULL: the recipe's training.device).
df_status df_step_run(const char *recipe, const char *dump_dir, int threads, const df_device_choice *device,
                      df_step_result *out, df_error *err);
// The same with recipe overrides ("section.key=value", as `draftforge train --set`).
df_status df_step_run_ex(const char *recipe, const char *const *sets, int n_sets, const char *dump_dir, int threads,
                         const df_device_choice *device, df_step_result *out, df_error *err);
// Writes r as step.json into dir (temp file + rename).
df_status df_step_write_json(const df_step_result *r, const char *dir, df_error *err);
// `draftforge step RECIPE.yaml --dump DIR [--threads N] [--device auto|cpu|cuda]`: argv holds the arguments after
// "step" (the train/cli/commands.h convention); returns the process exit code.
int df_cmd_step(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
