// The memory plan (`draftforge train RECIPE --plan`, docs/gpu-training.md "Memory plan"): the device memory a run
// needs, measured — not estimated — by running the run's own setup and two optimizer steps of its largest micro-batch
// (data.max_length tokens, every one supervised) and, when it evaluates, one evaluation, on a measuring context
// (kernels/ops.h df_ctx_options.measure). Nothing computes and no weight or data is read; every byte comes from the
// allocation code a run executes, so the plan's peak is the tracked peak of a run of that batch (tests/train/
// test_mem_plan.c checks it is equal).
#ifndef DF_TRAIN_TRAINER_MEM_PLAN_H
#define DF_TRAIN_TRAINER_MEM_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *recipe_path;
  const char *const *overrides; // --set section.key=value
  int n_overrides;
  df_ctx_options ctx; // the device (or table) planned for; the plan sets measure. {.device = DF_DEV_CUDA}: the GPU
  int64_t batch_size; // the micro-batch planned (0: training.batch_size)
  int world_size;     // ranks (0: deployment.trainer nnodes × nproc_per_node); ZeRO-1 then shards the moments
  FILE *log;          // notes (may be NULL)
} df_mem_plan_options;

typedef struct {
  df_mem_stats mem;        // the trainer's context plus the online target's
  int64_t batch, S, N, bs; // the micro-batch measured: B samples of S tokens, N blocks of bs per sample (bs 0:
                           // EAGLE-3, N its TTT steps)
  int64_t params;          // the draft's parameters (flat elements, padding included)
  int world;               // ranks; the moments are rank 0's shard under ZeRO-1 (zero)
  bool zero, online, eval; // ZeRO-1; the target runs online (its weights and KV cache counted); one eval measured
  char backend[16];        // the table planned for ("cuda", "cpu", "fake")
  bool bf16;               // the draft stores bf16 (model.torch_dtype resolved for that backend)
} df_mem_plan;

// The context options a plan takes by default: the CUDA table when the build has one (with or without a GPU), else
// the CPU's (*note says which and why).
df_ctx_options df_mem_plan_default_ctx(const char **note);

// Measures one micro-batch size.
df_status df_mem_plan_run(const df_mem_plan_options *o, df_mem_plan *out, df_error *err);

// The largest micro-batch (<= max_batch) whose device peak fits device_bytes, by doubling then bisection over
// df_mem_plan_run (the peak grows with the batch): *best (0 when batch 1 does not fit), its plan in *at_best, and the
// plan of best + 1 in *over (over->batch 0 when max_batch fits).
df_status df_mem_plan_fit(const df_mem_plan_options *o, int64_t device_bytes, int64_t max_batch, int64_t *best,
                          df_mem_plan *at_best, df_mem_plan *over, df_error *err);

// The table: each category's bytes at the peak and its own peak, the device peak, pinned host memory.
void df_mem_plan_print(const df_mem_plan *p, FILE *fp);
// "12.34 GiB" (or MiB / KiB / B) into buf.
const char *df_mem_bytes_text(int64_t bytes, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
