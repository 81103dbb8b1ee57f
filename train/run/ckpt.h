// Training checkpoints (docs/training.md): <output_dir>/checkpoints/step-<8 digits>/ holding config.json +
// model.safetensors (the draft as an HF directory) and state.h5 (fp32 masters, AdamW moments, counters, data
// cursor, RNG, schedule and the run contract); atomic directory writes, latest/best links, rotation, resume.
#ifndef DF_TRAIN_RUN_CKPT_H
#define DF_TRAIN_RUN_CKPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/rng.h"
#include "modeling/ffn.h"
#include "modeling/param_table.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_CKPT_FORMAT  "draftforge-train-state"
#define DF_CKPT_VERSION 1
#define DF_CKPT_DIR     "checkpoints"

// A strategy's own recipe key in the contract (training.<key>; the state.h5 attribute has its name).
enum { DF_CKPT_MAX_STRATEGY_KEYS = 8 };
typedef struct {
  char key[48];
  bool is_text;
  char text[64];
  double number;
} df_ckpt_value;

// What a run must keep to continue a checkpoint bit for bit: a mismatch on resume is an error naming the field.
typedef struct {
  char strategy[32];
  char draft_config_hash[24]; // FNV-1a 64 of the draft config's canonical JSON, hex
  char lr_scheduler[16];
  int64_t data_size;  // samples
  int64_t batch_size; // the global batch: ranks × training.batch_size (resumable on another number of ranks)
  int64_t accumulation_steps, world_size; // world_size: informational, not compared on resume
  // The storage of the run that wrote it ("bfloat16" or "float32"): informational, not compared (the masters and
  // moments are fp32 either way, so a bf16 GPU run resumes on the CPU and back); "float32" for older checkpoints.
  char precision[16];
  int64_t block_size, num_anchors, max_length, mask_token_id;
  int64_t seed;
  int64_t horizon; // LR schedule T
  double loss_decay_gamma;
  double learning_rate, warmup_ratio, max_grad_norm;
  double weight_decay, adam_beta1, adam_beta2, adam_eps;
  // The strategy's own keys (df_strategy.keys), whatever they are: each is recorded by name.
  int nkeys;
  df_ckpt_value keys[DF_CKPT_MAX_STRATEGY_KEYS];
} df_ckpt_contract;

// Where the run stands after optimizer step `step` (checkpoints are only taken at optimizer-step boundaries).
typedef struct {
  int64_t step;              // optimizer steps taken, skipped ones included
  int64_t adam_step;         // AdamW updates applied (bias correction's t)
  int64_t epoch, cursor;     // data feed position of the next micro-batch
  int64_t consecutive_skips; // NaN/Inf skips in a row ending at `step`
  int64_t skipped_steps;     // all skips so far
  int64_t tokens_seen;       // real (unpadded) tokens consumed
  double last_lr;            // the rate step `step` used
  bool has_best;             // an eval has run
  double best_eval_tau;
  int64_t best_step;
  df_rng anchor_rng; // the DFlash anchor sampler
} df_ckpt_progress;

// One checkpoint's contents; the flat buffers are laid out by table (df_params_numel elements each).
typedef struct {
  const df_params *table;
  const float *params, *exp_avg, *exp_avg_sq;
  const df_ckpt_contract *contract;
  const df_ckpt_progress *progress;
  const json_t *draft_config; // written as config.json
  const char *recipe_yaml;    // the resolved recipe, stored in state.h5 (NULL: none)
  // model.safetensors is written through the FFN kind's checkpoint layout (modeling/ffn.h: MoE tensors renamed
  // at the file boundary); NULL or a dense set: the parameter table's names.
  const df_ffn_set *ffn;
} df_ckpt_state;

// FNV-1a 64 over json_dumps(cfg, JSON_SORT_KEYS | JSON_COMPACT), as 16 hex digits.
void df_ckpt_config_hash(const json_t *cfg, char out[24]);

// Writes <output_dir>/checkpoints/step-<N>/ (N = progress->step): every file into a temporary directory, the
// manifest (train/run/ckpt_manifest.h) last, fsynced, then renamed into place; checkpoints at steps >= N are removed
// first (a resumed run rewinds); `latest` points at it; with max_checkpoints > 0 the oldest are deleted, never the one
// `best` points at. out (may be NULL) receives the directory written.
df_status df_ckpt_write(const char *output_dir, const df_ckpt_state *s, int64_t max_checkpoints, char *out, size_t n,
                        df_error *err);

// Points <output_dir>/checkpoints/best at step-<step> and writes best.json {step, metric, value}.
df_status df_ckpt_mark_best(const char *output_dir, int64_t step, const char *metric, double value, df_error *err);

// A resume path: a checkpoint directory (holds state.h5), a run directory (its checkpoints/latest, else the
// highest complete step), or a checkpoints/ directory. out receives the checkpoint directory.
df_status df_ckpt_resolve(const char *path, char *out, size_t n, df_error *err);

// Reads state.h5 of a checkpoint directory into the caller's flat buffers (the parameter table must match the
// file's, name by name), contract and progress.
df_status df_ckpt_read(const char *ckpt_dir, const df_params *table, float *params, float *exp_avg, float *exp_avg_sq,
                       df_ckpt_contract *contract, df_ckpt_progress *progress, df_error *err);

// Every field of want (the recipe) must equal have (the checkpoint); the error names the first that differs.
df_status df_ckpt_check_contract(const df_ckpt_contract *want, const df_ckpt_contract *have, const char *ckpt_dir,
                                 df_error *err);

// Writes just state.h5 at path (a new file); df_ckpt_write calls it inside the temporary directory.
df_status df_ckpt_write_state(const char *path, const df_ckpt_state *s, df_error *err);

// The steps of the complete checkpoints under <output_dir>/checkpoints, ascending; *out is malloc'd.
df_status df_ckpt_list(const char *output_dir, int64_t **out, int *count, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
