// The micro-batch stage of the block strategies (DFlash, DSpark; docs/architecture.md "One training step"):
// everything a micro-step needs from the host — anchors, block input ids, positions, the batch's target features,
// and the strategy's own per-row arrays (labels, weights, ...) — is built and validated on the host, packed into
// page-locked memory and uploaded in ONE asynchronous copy. Two slots alternate (double buffering: the host builds
// micro-batch k+1 while the device still runs k; a slot is rebuilt only after the event recorded behind its upload).
// The stage also owns the step's device scratch (block embeddings, d(hidden), a stats vector, the strategy's own
// buffers), so a step allocates nothing. On a host-addressable backend (the CPU) nothing is copied: the target
// features are read in place and the small arrays are built where the ops read them.
#ifndef DF_STRATEGIES_DFLASH_STAGE_H
#define DF_STRATEGIES_DFLASH_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_model.h"
#include "strategies/batch.h"
#include "strategies/dflash/dflash.h"
#include "strategies/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

// Hands out 64-byte aligned pieces of a region; with base NULL it only measures (the pieces are NULL).
typedef struct {
  char *base;
  size_t off;
} df_carver;
void *df_carve(df_carver *c, int64_t bytes);

// The three passes over a strategy's layout: sizes only; the host copy (fill it); the device copies (bind views).
typedef enum { DF_STAGE_MEASURE, DF_STAGE_FILL, DF_STAGE_BIND } df_stage_pass;

// A staged micro-batch's shape: B samples of S context rows, N blocks of bs slots each, R = B·N·bs block rows.
typedef struct {
  int64_t B, S, N, bs, R;
} df_stage_dims;

// What a strategy adds to a staged micro-batch: its per-row arrays, built on the host and uploaded with the rest,
// and its device scratch.
typedef struct {
  void *self;
  // Builds the arrays for batch bt and anchors a, checking every id and label against the vocabulary (an error
  // names the sample and row, before anything is uploaded); *loss_den receives the objective's denominator.
  df_status (*build)(void *self, const df_batch *bt, const df_dflash_anchors *a, int64_t bs, int64_t vocab,
                     double *loss_den, df_error *err);
  // Carves the upload arrays from up and the scratch from scratch. MEASURE: sizes. FILL: up is the host copy — write
  // the built arrays there. BIND: up and scratch are device memory — point the device views at them (keep: the staged
  // keep flags [B·N] u8).
  void (*layout)(void *self, df_stage_pass pass, df_carver *up, df_carver *scratch, const df_stage_dims *d,
                 df_device dev, const df_tensor *keep);
  void (*release)(void *self); // frees what build made
} df_stage_rows;

// What the stage builds, fixed for a run.
typedef struct {
  int64_t block_size; // bs
  int64_t vocab;      // ids must be < vocab (checked on the host)
  int64_t hidden;     // H of the frozen pieces (block embeddings, teacher rows)
  int64_t mask_token_id;
  bool last_hidden; // upload the batch's target_last_hidden_states (the strategy reads the teacher rows)
  df_dtype storage; // of the block embeddings and d(hidden): the draft's (df_draft_model_storage)
} df_stage_spec;

// A staged micro-batch: views on the context's device, valid until its slot is prepared again (two prepares on).
typedef struct {
  int64_t B, S, N, R;    // R = B·N·bs block rows
  df_draft_batch model;  // for df_draft_model_forward (on_device; block_embed is the scratch below)
  df_tensor block_ids;   // [R] i32 block input ids (anchor token, else the mask token)
  df_tensor keep;        // [B·N] u8
  df_tensor last_hidden; // [B·S, H] the teacher's rows source, or data NULL when not staged
  df_tensor block_embed; // [R, H] scratch: the frozen embedding of block_ids
  df_tensor dhidden;     // [R, H] scratch: d(loss)/d(draft output)
  double loss_den;       // of the objective, known on the host
  int64_t num_blocks;    // Σ keep
  int64_t upload_bytes;  // bytes of this micro-batch's one upload (0 on a host-addressable backend)
} df_staged;

typedef struct df_stage df_stage;

// Every id the device will look up, checked where it was built (the ops assume valid input): v [R] must be < vocab
// (labels use −1 for "no target"). An error names what (e.g. "labels"), the sample (r / per_sample) and row.
df_status df_stage_check_ids(const char *what, const int32_t *v, int64_t R, int64_t per_sample, int64_t vocab,
                             df_error *err);

df_status df_stage_create(df_ctx *ctx, const df_stage_spec *spec, df_stage **out, df_error *err);
// Waits for queued work that may still read the stage, then frees it.
void df_stage_free(df_stage *s);
// Builds batch bt with anchors a (host; sampled, or eval's per-sample anchors) and the strategy's rows into the next
// slot — block ids, positions, the rows, loss_den, every id checked — then queues the upload.
df_status df_stage_prepare(df_stage *s, const df_batch *bt, const df_dflash_anchors *a, const df_stage_rows *rows,
                           df_staged *out, df_error *err);
// The forward of a staged micro-batch: the frozen embedding of the block ids (fz->embed [V, H] on the context's device,
// in the draft's storage dtype) into block_embed, then df_draft_model_forward. *hidden views the model's final-normed
// output [R, H] (storage dtype).
df_status df_stage_forward(df_ctx *ctx, df_draft_model *m, const df_frozen *fz, df_staged *st, df_tensor *hidden,
                           df_error *err);

#ifdef __cplusplus
}
#endif

#endif
