// The micro-batch stage (docs/architecture.md "One training step"): everything a micro-step needs from the host —
// anchors, block inputs, labels, row weights, positions, and the batch's target features — is built and validated
// on the host, packed into page-locked memory and uploaded in ONE asynchronous copy. Two slots alternate (double
// buffering: the host builds micro-batch k+1 while the device still runs k; a slot is rebuilt only after the event
// recorded behind its upload). The stage also owns the step's device scratch (block embeddings, d(hidden), the
// objective's per-row buffers, a local stats vector), so a step allocates nothing. On a host-addressable backend
// (the CPU) nothing is copied: the target features are read in place and the small arrays are built where the ops
// read them.
#ifndef DF_TRAIN_STEP_STAGE_H
#define DF_TRAIN_STEP_STAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "strategies/dflash.h"
#include "strategies/dspark.h"
#include "train/data/batch.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the stage builds, fixed for a run.
typedef struct {
  df_draft_kind kind; // DFlash blocks, or DSpark labels on top of them
  int64_t block_size; // bs
  int64_t vocab;      // ids and labels must be < vocab (checked on the host)
  int64_t hidden;     // H of the frozen pieces (block embeddings, teacher rows)
  int64_t mask_token_id;
  double loss_decay_gamma;
  df_dflash_loss_type loss_type; // DFlash: loss_den is Σw (dflash) or B (D-PACE)
  bool teacher;                  // DSpark: upload target_last_hidden_states (the L1 / confidence terms)
  int64_t markov_rank;           // DSpark: du scratch [R, rank]
} df_stage_spec;

// A staged micro-batch: views on the context's device, valid until its slot is prepared again (two prepares on).
typedef struct {
  int64_t B, S, N, R;      // R = B·N·bs block rows
  df_draft_batch model;   // for df_draft_model_forward (on_device; block_embed is the scratch below)
  df_tensor block_ids;     // [R] i32 block input ids (anchor token, else the mask token)
  df_dflash_rows dflash;   // DFlash objective rows (DFlash drafts)
  df_dflash_work dflash_w; //   and their scratch
  df_dspark_rows dspark;   // DSpark labels (DSpark drafts)
  df_dspark_work dspark_w; //   and their scratch
  df_tensor last_hidden;   // [B·S, H] the teacher's rows source, or data NULL when not staged
  df_tensor block_embed;   // [R, H] scratch: the frozen embedding of block_ids
  df_tensor dhidden;       // [R, H] scratch: d(loss)/d(draft output)
  df_tensor stats;         // [DF_DSPARK_STATS(bs)] f64 scratch (a step's own sums when the caller has none)
  double loss_den;         // of the objective, known on the host
  int64_t num_blocks;      // Σ keep
  int64_t upload_bytes;    // bytes of this micro-batch's one upload (0 on a host-addressable backend)
} df_staged;

typedef struct df_stage df_stage;

df_status df_stage_create(df_ctx *ctx, const df_stage_spec *spec, df_stage **out, df_error *err);
// Waits for queued work that may still read the stage, then frees it.
void df_stage_free(df_stage *s);

// Builds batch bt with anchors a (host; df_dflash_sample_anchors or eval's per-sample anchors) into the next slot:
// blocks (and DSpark labels), positions, row weights, loss_den, every id and label checked against the
// vocabulary (an error names the sample and position, before anything is uploaded); then queues the upload.
df_status df_stage_prepare(df_stage *s, const df_batch *bt, const df_dflash_anchors *a, df_staged *out, df_error *err);

// The forward of a staged micro-batch, shared by the step and eval: the frozen embedding of the block ids (embed
// [V, H] on the context's device) into block_embed, then df_draft_model_forward. *hidden views the model's
// final-normed output [R, H].
df_status df_stage_forward(df_ctx *ctx, df_draft_model *m, const float *embed, int64_t vocab, df_staged *st,
                           df_tensor *hidden, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
