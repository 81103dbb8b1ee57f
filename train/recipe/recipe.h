// The run recipe (SpecForge's YAML schema, docs: shared/reference/dflash-dspark.md §6.1): parsed with libyaml,
// checked key by key against one schema table (train/recipe/recipe_schema.c), resolved once into an immutable struct.
#ifndef DF_TRAIN_RECIPE_RECIPE_H
#define DF_TRAIN_RECIPE_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/tensor.h"
#include "strategies/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_LR_COSINE = 0, DF_LR_CONSTANT = 1 } df_lr_kind; // training.lr_scheduler, in schema order
// training.fsdp_sharding (SpecForge's key), in schema order: SHARD_GRAD_OP and FULL_SHARD shard the fp32 masters'
// optimizer state across data-parallel ranks (ZeRO-1, docs/distributed.md), NO_SHARD replicates it.
typedef enum { DF_SHARD_GRAD_OP = 0, DF_SHARD_FULL = 1, DF_SHARD_NONE = 2 } df_shard_kind;

// training.device, in schema order (train/recipe/device.h resolves it to a context).
typedef enum { DF_DEVICE_AUTO = 0, DF_DEVICE_CPU = 1, DF_DEVICE_CUDA = 2 } df_device_choice;

// tracking.report_to, in schema order
typedef enum {
  DF_REPORT_NONE = 0,
  DF_REPORT_WANDB,
  DF_REPORT_TENSORBOARD,
  DF_REPORT_SWANLAB,
  DF_REPORT_MLFLOW
} df_report_to;

// What a recipe resolves to. Paths are absolute: a relative one (in the file or a --set) is resolved against the
// current directory, as SpecForge resolves it, and a model path may be a Hugging Face hub id found in the local
// cache (train/recipe/recipe_paths.c). Optional values absent from the file are NULL / flagged.
typedef struct df_recipe {
  const char *path; // the recipe file ("<memory>" name for df_recipe_parse)
  const char *run_id;
  const char *output_dir;
  struct {
    const char *target_model_path;
    const char *draft_model_config;    // NULL: not given
    const char *draft_checkpoint_path; // NULL: no warm start
    const char *embedding_key;
    const char *lm_head_key;
    df_dtype torch_dtype;       // model.torch_dtype: DF_BF16 (default) or DF_F32 (the storage asked for on CUDA)
    bool has_mask_token_id;     // model.mask_token_id given (it overrides the draft config's)
    bool load_target_embedding; // a cold P-EAGLE draft's own embedding starts as the target's (the others borrow it)
    int64_t mask_token_id;
    // EAGLE-3: model.aux_hidden_state_layer_ids (n 0: not given; they override the draft config's eagle_config) and
    // model.vocab_mapping_path (NULL: derive the mapping from the data; strategies/eagle3/prepare.c).
    int num_aux_layer_ids;
    int aux_layer_ids[8];
    const char *vocab_mapping_path;
  } model;
  struct {
    // Exactly one training source: captured shards (offline), or online data the target turns into features
    // during the run (train/data/online_data.h). NULL: not given.
    const char *hidden_states_path;
    const char *train_data_path;         // data.train_data_path, else data.prompts_path (read the same way)
    const char *eval_hidden_states_path; // at most one eval source; NULL: none
    const char *eval_data_path;
    int64_t max_length;
    // online data: conversations are prepared by tools/run/prepare_data.py with these; max_prompts 0 = all
    const char *chat_template, *cache_dir;
    bool train_only_last_turn, is_preformatted;
    int64_t max_prompts;
    df_dtype online_feature_dtype; // DF_BF16 or DF_F32
  } data;
  struct {
    const char *strategy; // training.strategy: a name of the strategy registry (strategies/registry.c)
    int64_t batch_size;
    int64_t num_anchors;
    double loss_decay_gamma;        // 0: no decay (SpecForge's None)
    int64_t objective_chunk_blocks; // 0: one pass
    uint64_t seed;
    // A strategy's own keys (training.loss_type, dspark_*_alpha, ...) are read by name: df_recipe_strategy_values.
    // the trainer (train/trainer/trainer.h); 0 = unset for max_steps / total_steps
    int64_t num_epochs, max_steps, total_steps, accumulation_steps;
    double learning_rate, warmup_ratio, max_grad_norm;
    df_lr_kind lr_scheduler;
    df_device_choice device;
    double weight_decay, adam_beta1, adam_beta2, adam_eps;
    int64_t max_consecutive_skips;
    int64_t save_interval, eval_interval, log_interval, max_checkpoints; // intervals: 0 = off
    double save_interval_minutes;                                        // wall-clock saving (extension); 0 = off
    const char *resume_from;                                             // NULL: a fresh run
    double dp_bucket_mb;                                                 // gradient all-reduce bucket (MiB)
    double dist_timeout;                                                 // minutes (train/dist)
    df_shard_kind fsdp_sharding;
  } training;
  struct {
    // deployment.trainer: what the launcher must have started (train/dist/launch.h); *_set: written in the
    // file or by --set (an unwritten default is no demand).
    struct {
      int64_t nnodes, nproc_per_node, node_rank, master_port;
      const char *master_addr; // NULL: not given
      bool nnodes_set, nproc_per_node_set, node_rank_set, master_port_set;
    } trainer;
  } deployment;
  struct { // experiment tracking (train/observe/tracker.h, train/observe/tb_writer.h); NULL: not given
    df_report_to report_to;
    const char *wandb_project, *wandb_name, *wandb_key, *wandb_dir;
    bool wandb_offline;
    const char *swanlab_project, *swanlab_name, *swanlab_key;
    const char *mlflow_tracking_uri, *mlflow_experiment_name, *mlflow_run_name;
  } tracking;
} df_recipe;

typedef struct {
  // Notes and warnings (NULL: quiet). Errors go into the df_error only; an unknown key's error names the
  // closest valid key and points at `draftforge schema` for the full list.
  FILE *log;
  // Command-line overrides, "section.key=value" (a top-level key without a section: "output_dir=runs/x";
  // nested sections with dots: "deployment.trainer.nnodes=1"). The value is read as YAML (flow lists work) and
  // checked like the file's; it replaces the file's value.
  const char *const *overrides;
  int n_overrides;
  // A memory plan (`draftforge train --plan`) reads no data and no checkpoint: the data paths and
  // model.draft_checkpoint_path need not exist (the model configs still must).
  bool inputs_may_be_missing;
} df_recipe_options;

// Reads and resolves a recipe file. On failure *out is NULL and err names the key (section.key), the file,
// line and column. opt may be NULL; with opt->log the inert keys the recipe sets are listed there once.
df_status df_recipe_load(const char *path, const df_recipe_options *opt, const df_recipe **out, df_error *err);
// The same on len bytes of YAML; name labels messages, base_dir resolves relative paths (NULL: the current
// directory, which is what df_recipe_load uses).
df_status df_recipe_parse(const char *text, size_t len, const char *name, const char *base_dir,
                          const df_recipe_options *opt, const df_recipe **out, df_error *err);
void df_recipe_free(const df_recipe *r);

// The values of the strategy's own recipe keys (df_strategy.keys: training.<key>) for the strategy to read by name;
// r must outlive them.
df_strategy_values df_recipe_strategy_values(const df_recipe *r);
// Whether section.key holds its schema default (written or not).
bool df_recipe_is_default(const df_recipe *r, const char *section, const char *key);

// Checks --set overrides on their own (syntax, key, type, range, support), before any recipe is read: a failure
// is the command line's fault (exit code 2).
df_status df_recipe_check_overrides(const char *const *overrides, int n, df_error *err);

// The first schema key (in schema order) whose value differs between a and b, skipping the keys `skip` accepts
// (it gets "section.key"); paths are compared absolute and normalised. Returns false when none differs; else
// fills key and the two values as text.
bool df_recipe_first_difference(const df_recipe *a, const df_recipe *b, bool (*skip)(const char *key), char *key,
                                size_t kn, char *va, size_t van, char *vb, size_t vbn);

// The fully resolved recipe as YAML: every key of the schema with its value (defaults and overrides included,
// paths as resolved), section by section. Loading the output gives the same df_recipe.
df_status df_recipe_write_resolved(const df_recipe *r, FILE *fp, df_error *err);

// Every key of the schema with its type, default, range and whether draftforge implements it (the table
// train/recipe/recipe_schema.c holds), for `draftforge step --help` and the docs.
void df_recipe_print_schema(FILE *fp);
// The same as the Markdown page docs/recipe-reference.md (train/recipe/recipe_doc.c; `draftforge schema --markdown`).
void df_recipe_print_reference(FILE *fp);

#ifdef __cplusplus
}
#endif

#endif
