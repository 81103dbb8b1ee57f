// Internal to train/trainer*.c: everything one training run owns, built by trainer_setup.c (resources,
// horizon, fresh start or resume) and driven by trainer.c (the loop).
#ifndef DF_TRAIN_TRAINER_TRAINER_INTERNAL_H
#define DF_TRAIN_TRAINER_TRAINER_INTERNAL_H

#include "base/collective.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "strategies/strategy.h"
#include "train/data/data_feed.h"
#include "train/data/online_data.h"
#include "train/observe/metrics_log.h"
#include "train/recipe/recipe.h"
#include "train/run/ckpt.h"
#include "train/run/run_plan.h"
#include "train/step/resources.h"
#include "train/step/step.h"
#include "train/trainer/lr_schedule.h"
#include "train/trainer/trainer.h"

// The optimizer's state, on the context's device: the model's fp32 weights are the masters; the AdamW moments and the
// per-element mask (DF_PARAM_TRAIN | DF_PARAM_DECAY, kernels/ops.h) share the parameter table's layout. The
// hyper-parameters are built once (the rate is the schedule's, per step). ZeRO-1 (training.fsdp_sharding
// SHARD_GRAD_OP / FULL_SHARD on several ranks, train/trainer/trainer_dp.c): rank r owns [r · shard_size, ...) of
// the flat buffer (shard_size a multiple of 16; the last rank also owns the remainder); exp_avg / exp_avg_sq hold
// only this rank's [shard_off, shard_off + shard_len). The gradient and the parameters are exchanged in place in the
// model's own buffers; zero_full holds the checkpoint's full moments (2n) on rank 0 while a resume hands them out.
typedef struct {
  float *exp_avg, *exp_avg_sq;
  uint8_t *mask;
  df_adamw_hparams hp;
  double max_grad_norm;
  bool zero;
  int64_t shard_size, shard_off, shard_len;
  float *zero_full;
} df_trainer_optim;

// One f64 block on the device holding the window's sums — the strategy's (nobj), then the FFN kind's statistics —
// followed by the optimizer's {norm, coef, ok}: the one block read back per optimizer step. win covers all n sums (the
// go/no-go guard), obj the strategy's part.
typedef struct {
  void *buf;
  double *host; // page-locked copy
  df_tensor win, obj, norm;
  int64_t n, nobj;
} df_trainer_stats;

// The run directory as the trainer writes it (train/run/): fresh run or resume, the newest checkpoint of this run and
// when it was written (training.save_interval_minutes), the resolved recipe, metrics.jsonl with its TensorBoard mirror
// (tracking.report_to: tensorboard), and the tracker process (wandb | swanlab | mlflow, train/observe/tracker.h).
typedef struct {
  df_run_plan plan;
  int64_t last_saved_step; // -1: none
  double last_save_s;      // monotonic time of the last save (or the start)
  char last_ckpt[4200];
  char *recipe_yaml;
  df_metrics_log metrics;
  struct df_tracker *tracker;
} df_trainer_rundir;

// Data parallel (train/trainer/trainer_dp.c): the job's communicator (NULL: one process), this rank, the global batch
// the current micro-step's anchors replay, and the layers' all-reduce over comm. Only rank 0 writes (metrics,
// trackers, checkpoints, exports) and logs.
typedef struct {
  df_comm *comm;
  int rank, world;
  int64_t global_S, global_cmax;
  df_collective coll;
  int64_t bucket_floats;        // the gradient all-reduce bucket (training.dp_bucket_mb)
  int64_t buckets_issued;       // of the current window's gradient (trainer_dp.c)
  bool reported;                // the buckets' line is printed once
  void *stage;                  // ZeRO-1: the moments' piece in transit (checkpoint, resume), on the context's device
  df_event *computed, *reduced; // device ranks: the compute stream → communicator stream ordering, and back
} df_trainer_dp;

// A memory plan (train/trainer/mem_plan.h) builds a trainer on a measuring context: the recipe's configs only (no
// weight read), synthetic data of `batch` samples of data.max_length tokens, and the optimizer of rank 0 of `world`.
typedef struct {
  int64_t batch;
  int world;
} df_trainer_plan;

typedef struct {
  const df_train_options *opt;
  FILE *log;
  const df_trainer_plan *plan; // NULL: a training run

  // resources
  const df_recipe *recipe;
  df_run_resources res;         // configs, frozen target pieces, mask token
  const df_draft_config *draft; // = res.draft
  df_ctx *ctx;
  df_draft_model *model;
  df_dtype storage;        // the draft's storage (model.torch_dtype as resolved for this device and draft)
  const char *storage_why; // why that storage, for the start-up line
  const df_params *table;
  df_ffn_set ffn;            // the model's FFNs with their kind (hooks: no-ops for a dense draft)
  df_strategy_values values; // the strategy's own recipe keys
  df_step_settings settings; // what the strategy run is opened with
  df_strategy_run *strategy; // the draft's strategy: batch build, forward, objective, backward (stage included)
  df_feed *feed;
  df_online_target *online;  // the target of online data (NULL: offline), shared by the feed's and eval's sources
  df_batch_source *eval_src; // the eval set (captured or online), open when training.eval_interval > 0

  df_trainer_optim optim;
  df_trainer_stats stats;
  df_trainer_rundir rundir;
  df_trainer_dp dp;

  df_lr_schedule sched;
  df_dflash_sampler sampler; // the anchor stream (block strategies; a checkpoint saves it)
  df_ckpt_contract contract;
  df_ckpt_progress prog;
  int64_t stop_step;
  int64_t start_step;

  // failure handling (train/trainer/trainer_data.c); stop: the stop request reduced over the ranks at the last step
  bool stop;
  bool state_dirty;     // the saved state (weights, moments, FFN buffers) is mid-update: no checkpoint now
  int64_t *win_samples; // the global sample numbers of the current window's micro-batches
  int64_t n_win_samples, cap_win_samples;
} df_trainer;

// Loads the recipe (with overrides), the configs, the frozen target pieces, the model, the data feed; sets
// the schedule, contract and progress; then either initialises (fresh run: init or warm start) or restores a
// checkpoint (resume); writes recipe.resolved.yaml and opens metrics.jsonl.
df_status df_trainer_setup(df_trainer *t, const df_train_options *opt, df_error *err);
void df_trainer_teardown(df_trainer *t);
// A memory plan's trainer (opt->ctx_options: a measuring context): the recipe with opt's overrides, the resources
// sized from the configs, the strategy, synthetic sources, the schedule and the optimizer buffers — the same setup
// functions a run uses, without a run directory, data checks, init or checkpoints.
df_status df_trainer_setup_plan(df_trainer *t, const df_train_options *opt, const df_trainer_plan *plan, df_error *err);
// The plan's step (train/trainer/trainer.c): one optimizer step — the window's micro-batches and the update — as a
// run takes it, then with eval one evaluation over the eval source (when the run has one); nothing logged or saved.
// *N: the anchors per sample of the last micro-batch.
df_status df_trainer_plan_step(df_trainer *t, bool eval, int64_t *N, df_error *err);
// The device memory of the run as tracked: the trainer's context plus the online target's (kernels/ops.h).
df_mem_stats df_trainer_mem_stats(const df_trainer *t);

// tracking.report_to (train/trainer/trainer_observe.c): prepare checks the tracker's package right after the recipe
// is read; open starts the TensorBoard mirror of metrics.jsonl or the tracker process; close waits for the
// tracker after metrics.jsonl is closed.
df_status df_trainer_observe_prepare(df_trainer *t, df_error *err);
df_status df_trainer_observe_open(df_trainer *t, df_error *err);
void df_trainer_observe_close(df_trainer *t);

// Data parallel (train/trainer/trainer_dp.c; all no-ops or unused at world 1). check: what cannot run on several ranks
// yet, and a communicator whose buffers are not where the context keeps its state. global_batch: the longest
// sample and the largest anchor-candidate count of the global batch b is this rank's share of (one MAX
// all-reduce), into t->global. reduce: the window's host scalars (in place), the device metric sums and (grads)
// the flat gradient buffer (in training.dp_bucket_mb buckets: all-reduced, or under ZeRO-1 on GPU ranks reduced to
// each shard's owner), all SUM. grads_in_buckets: whether the gradient goes through those buckets (else ZeRO-1 on CPU
// ranks reduce-scatters it in the step). share_state: rank 0's restored weights, moments and progress to every rank.
df_status df_trainer_dp_check(df_trainer *t, df_error *err);
df_status df_trainer_dp_global_batch(df_trainer *t, const df_batch *b, df_error *err);
df_status df_trainer_dp_reduce(df_trainer *t, double *scalars, int n_scalars, bool grads, df_error *err);
bool df_trainer_dp_grads_in_buckets(const df_trainer *t);
df_status df_trainer_dp_share_state(df_trainer *t, df_error *err);
// overlap(on) before a micro-step: on for the window's last one on GPU ranks, whose backward then starts the gradient
// buckets it completes (df_draft_model_on_grads_ready); reduce issues the rest.
df_status df_trainer_dp_overlap(df_trainer *t, bool on);
int64_t df_trainer_dp_bucket_floats(const df_trainer *t);
// ZeRO-1. plan: the shard sizes (t->zero from the recipe and world). step: the update of one optimizer step on
// the already-reduced scalars — the gradient reduce-scatter (CPU ranks; GPU ranks' buckets reduced each shard to its
// owner already), the global norm from the shards' squared sums, AdamW on this shard, parameter all-gather; fills
// t->norm_stats as the replicated path does. gather_moments: the full moments on rank 0's host (n elements each, for a
// checkpoint; collective; the other ranks pass NULL).
void df_trainer_dp_zero_plan(df_trainer *t);
df_status df_trainer_dp_zero_step(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                  df_error *err);
// A memory plan's ZeRO-1 update (no communicator): this rank's shard of the norm and AdamW on the device only.
df_status df_trainer_dp_zero_shard_ops(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                       df_error *err);
df_status df_trainer_dp_gather_moments(df_trainer *t, float *m_full, float *v_full, df_error *err);
// The stage of the moments' transfers (ZeRO-1 only; accounted as DF_MEM_STAGE) and, on free, the events too.
df_status df_trainer_dp_alloc(df_trainer *t, df_error *err);
void df_trainer_dp_free(df_trainer *t);

// Writes a checkpoint of the current state at t->prog.step (refusing non-finite weights or moments).
df_status df_trainer_save(df_trainer *t, df_error *err);

// ---- data checks (train/trainer/trainer_data.c) ----

// Start-up: every data path the recipe names opens and validates (every shard), the eval data was captured for
// this draft, and neither holds NaN/Inf hidden states (a sampled scan unless opt->data_scan says otherwise).
df_status df_trainer_check_data(df_trainer *t, df_error *err);
// Notes the samples of a micro-batch of the current window (reset: a new window starts).
void df_trainer_note_batch(df_trainer *t, const int64_t *index, int64_t B, bool reset);
// A skipped step: which of the window's samples hold NaN/Inf hidden states. Writes a sentence naming them (or
// saying the data is finite) into detail and their global numbers into a new JSON array *samples.
void df_trainer_explain_skip(df_trainer *t, char *detail, size_t n, json_t **samples);

#endif
