// `draftforge inspect CHECKPOINT`: what a training checkpoint holds, read from its files alone (no recipe, no
// model build): progress, run contract, RNG, the tensor table with weight and AdamW-moment statistics, and
// whether model.safetensors agrees with state.h5.
#ifndef DF_TRAIN_EXPORT_INSPECT_CKPT_H
#define DF_TRAIN_EXPORT_INSPECT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// Whether path is a checkpoint directory (holds state.h5) or a run directory whose checkpoints/latest is one;
// out receives the checkpoint directory.
bool df_inspect_checkpoint_dir(const char *path, char *out, size_t n);

// Prints the checkpoint in dir: its manifest check (train/run/ckpt_manifest.h), then the state and one row per tensor
// (columns: shape and dtype in model.safetensors, "-" for names an MoE layout renames there; RMS and max |w| of the
// fp32 master; RMS of AdamW's m; sqrt of the mean of v). Findings that make it unusable (a file that differs from
// the manifest, non-finite values, a tensor table that does not cover the buffers, a model.safetensors that
// disagrees with state.h5) are printed as "PROBLEM:" lines and make it return DF_ERR_INVALID after printing
// everything; a file it cannot read is an error at once.
df_status df_inspect_checkpoint(const char *dir, FILE *out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
