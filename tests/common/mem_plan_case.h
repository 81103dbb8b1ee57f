// The memory plan's check (train/trainer/mem_plan.h), shared by the CPU suite (tests/train/test_mem_plan.c, the fake
// device) and the GPU suite (tests/cuda/test_mem_plan_gpu.c, a GPU or the emulated CUDA backend): a recipe trained
// for two steps with the accounting on and the same recipe planned on a measuring context give exactly the same
// device peak, split by category, peak per category and pinned host memory. The data makes every batch the largest
// the plan assumes (samples longer than data.max_length, every token supervised).
#ifndef DF_TESTS_MEM_PLAN_CASE_H
#define DF_TESTS_MEM_PLAN_CASE_H

#include <stdbool.h>
#include <stdint.h>

#include "train/trainer/mem_plan.h"

enum { PLAN_CASE_MAX_LEN = 40, PLAN_CASE_SAMPLES = 8 };

// A scratch directory: data/ (a shard or tokens.jsonl) and recipe.yaml.
typedef struct {
  char root[200], data[300], recipe[300];
} plan_case;

void plan_case_open(plan_case *d, const char *name);
void plan_case_close(const plan_case *d);

// PLAN_CASE_SAMPLES captured samples of len tokens, all supervised; K·H features (and the final hidden states with
// last) of small finite values, ids below vocab.
void plan_case_write_shard(const plan_case *d, int64_t len, int64_t H, int K, const int *layers, int64_t vocab,
                           bool last);
// Token samples for an online target (ids below 250); data becomes the JSONL's path.
void plan_case_write_tokens(plan_case *d, int64_t len);
// Two optimizer steps of two micro-batches of 2 (both upload slots used), 4 anchors, evaluating when eval is set;
// extra: more training keys ("  key: value\n" lines).
void plan_case_write_recipe(const plan_case *d, const char *target, const char *draft, const char *strategy,
                            bool online, bool eval, const char *extra);

// Trains d->recipe on `real`, then plans it for the same context options; fails the test unless the two agree, the
// plan measured 2 x PLAN_CASE_MAX_LEN tokens (and `anchors` blocks per sample, when >= 0) and every category a run
// always has is there. Returns the plan for the caller's own checks.
df_mem_plan plan_case_equals_run(const plan_case *d, const df_ctx_options *real, int64_t anchors, const char *what);
// The offline case both suites run: a shard of PLAN_CASE_MAX_LEN + 9 tokens (H 64, layers 1 and 2, vocab 256, the final
// hidden states with last) and a recipe on target, checked by plan_case_equals_run with 4 anchors. d stays open for
// the caller's checks (plan_case_close).
df_mem_plan plan_case_offline(plan_case *d, const char *name, const char *target, const char *draft,
                              const char *strategy, bool last, bool eval, const char *extra,
                              const df_ctx_options *real);

#endif
