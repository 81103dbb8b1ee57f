// Choosing the device a command runs on: training.device (train/recipe/recipe.h) or --device, resolved to a context.
#ifndef DF_TRAIN_RECIPE_DEVICE_H
#define DF_TRAIN_RECIPE_DEVICE_H

#include <stdio.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "train/recipe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *df_device_choice_name(df_device_choice c); // "auto", "cpu", "cuda"
// Parses a --device value; the error names the flag and lists the choices.
df_status df_device_choice_parse(const char *s, df_device_choice *out, df_error *err);

// The context for a choice: cpu; cuda (device 0; an error without a usable GPU); auto: cuda when the build has
// the CUDA backend, a device is visible and the backend implements every op a training step calls, else cpu.
// threads: CPU worker threads (0: OpenMP default). When log is not NULL, auto says what it picked and why.
// cpu_only: why the draft cannot run on the GPU yet (df_device_cpu_only_reason), NULL when it can; auto then picks
// the CPU and says why.
df_status df_device_open(df_device_choice c, const char *cpu_only, int threads, FILE *log, df_ctx **out, df_error *err);
// The same on CUDA device ordinal cuda_device (a GPU rank's local rank) instead of device 0.
df_status df_device_open_on(df_device_choice c, int cuda_device, const char *cpu_only, int threads, FILE *log,
                            df_ctx **out, df_error *err);
// Whether df_device_open would pick the GPU for c (before any draft is known: auto without a host-only reason).
bool df_device_picks_cuda(df_device_choice c);
// Why a draft must train on the CPU today, or NULL: the DSpark heads and the MoE FFN run host loops.
const char *df_device_cpu_only_reason(const df_draft_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
