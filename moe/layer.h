// One sparse-MoE FFN layer: centering → router → routed experts + shared expert → fp32 sum, forward and
// backward on rows of (T, H) in device memory, composed of ops, plus the training state the trainer drives: the
// training/eval flag, the deferred updates (EMA centering mean, noaux_tc bias), the aux loss and the metrics.
//
// Per-step contract (SpecForge #993 TrainingState):
// - A TRAINING forward first applies the pending updates stashed by the previous training forward
//   (df_moe_layer_apply_pending, which the trainer may also call itself before the model forward; the stash
//   is consumed once), then routes, then stashes (overwrites) this micro-batch's counts / input mean and
//   computes the aux loss and the metrics. An EVAL forward applies nothing, stashes nothing, produces no aux
//   loss and leaves the metrics alone; sample centering uses the running mean there.
// - The aux loss is part of the objective: df_moe_layer_aux_loss gives its coefficient-scaled value from the
//   last training forward, and the backward adds its gradient scaled by aux_grad_scale = ∂objective/∂aux
//   (default 1: objective = loss + Σ_layers aux). train/step/step.c adds aux·den to the numerator, so it sets the
//   scale to grad_scale·den (trainer: numerator mode) or 1 (draftforge step: num/den), before the backward.
#ifndef DF_MOE_LAYER_H
#define DF_MOE_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "moe/aux_loss.h"
#include "moe/balance.h"
#include "moe/config.h"
#include "moe/experts.h"
#include "moe/router.h"
#include "moe/shared_expert.h"

#ifdef __cplusplus
extern "C" {
#endif

// The layer's metrics from its last training forward (names are "moe/<field>").
typedef struct {
  double load_max_ratio, load_min_ratio, experts_unused_frac;
  double aux_loss;     // coefficient-scaled; 0 when off
  double bias_abs_max; // noaux_tc only
} df_moe_metrics;

typedef struct {
  df_moe_config cfg; // a copy of the resolved values (its strings stay the config's)
  int64_t layer, H;
  df_moe_router_spec router;
  df_moe_experts_spec experts;
  df_moe_shared_spec shared;
  bool has_shared;
  bool aux; // aux_loss_coeff > 0 (the type is cfg.aux_loss_type)

  // Bound tensors (views on the model's device; see df_moe_layer_bind_views).
  df_tensor w_router, g_router; // (E, H)
  df_tensor logit_bias;         // (E) gate.bias, when moe_router_bias
  float *input_mean;            // (H) gate.input_mean (sample centering)
  float *input_mean_steps;      // (1) gate.input_mean_steps, held as fp32
  df_moe_experts_params ep;
  df_moe_shared_params sp;
  df_moe_balance_state balance; // its bias is gate.balance.bias (noaux_tc)

  // Device state (not checkpointed): the last training forward's statistics record (f64, DF_MOE_STATS(E)), the
  // noaux_tc count stash (E) and the centering mean stash (H). Bound by the model (df_moe_layer_bind_state) or,
  // on a host-addressable context, allocated by the first forward.
  double *record;
  float *center_stash;
  void *owned_state;

  // Training state.
  bool training;           // default true
  int64_t rows_per_sample; // sample centering: the FFN rows of one sample (N·bs); 0 = all rows one sample
  float aux_grad_scale;    // ∂objective/∂(this layer's aux loss); default 1
  df_collective coll;      // all-reduce for the deferred updates (default: one rank)
  df_ctx *ctx;             // the context of the last forward (deferred updates and reads run on it)
  bool center_pending;
  // The stats sink a training forward also adds its record into (f64 DF_MOE_STATS(E) on the device; NULL: none),
  // with the aux loss weighted by sink_den (the micro-batch's loss_den): df_moe_layer_set_stats.
  double *sink;
  double sink_den;
  // What the last forward did (the backward checks and follows it).
  struct {
    bool valid;
    int64_t T, rows_per_sample;
    int center; // none, sample, fixed
    bool aux_on;
    bool dp; // the statistics and the aux gradient use the reduced routing (dp_counts, dp_T)
  } fwd;
  bool aux_valid;      // the record's aux loss is the last forward's (a training forward with the loss on)
  bool has_metrics;    // a training forward has filled the record
  double *host_record; // (DF_MOE_STATS(E)) the record read back for the metrics getters (owned)
  // Data parallel (coll.world_size > 1): the last training forward's routing counts, score column sums and row
  // count summed over the ranks — what the aux loss, its gradient and the statistics use, as one process would
  // over the global batch (owned; the experts still run on this rank's own counts). The sums are formed on the host:
  // a device context reads the counts and scores back (one copy each per training forward) and gets the reduced
  // counts (dp_counts_dev, for the aux gradient) and statistics written back.
  int32_t *dp_counts; // (E)
  int64_t dp_T;
  float *dp_buf;          // (2E + 1) the reduction's buffer
  double *dp_sums;        // (E) the reduced score column sums
  int32_t *dp_counts_dev; // (E) device copy of dp_counts (device contexts only)
  float *dp_scores;       // (T·E) host copy of the scores (device contexts only), dp_scores_cap elements
  int32_t *dp_local;      // (E) host copy of this rank's counts (device contexts only)
  double *dp_stats;       // (2·DF_MOE_STATS(E)) host: the global statistics and the sink read back
  float *dp_bias;         // (E) host copy of the noaux_tc bias
  int64_t dp_scores_cap;
} df_moe_layer;

// Validates the config for a layer of hidden size H and sets the layer up (unbound).
df_status df_moe_layer_init(df_moe_layer *L, const df_moe_config *m, int64_t H, int64_t layer, df_error *err);
void df_moe_layer_free(df_moe_layer *L);

// fp32 elements of the layer's device state, and its binding (mem: df_moe_layer_state_elems floats on the model's
// device, 16-float aligned, zeroed).
int64_t df_moe_layer_state_elems(const df_moe_layer *L);
void df_moe_layer_bind_state(df_moe_layer *L, float *mem);

// fp32 elements of saved / scratch memory for T rows.
int64_t df_moe_layer_saved_elems(const df_moe_layer *L, int64_t T);
int64_t df_moe_layer_scratch_elems(const df_moe_layer *L, int64_t T);

// y (T, H) = moe(x (T, H)); x may also be (B, Q, H), which sets rows_per_sample = Q for this call.
df_status df_moe_layer_forward(df_moe_layer *L, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved,
                               float *scratch, df_error *err);
// dx (= or +=) ∂/∂x of dy (plus the aux loss's gradient when the forward produced one); parameter
// gradients added (none for the experts when frozen; none ever for the buffers).
df_status df_moe_layer_backward(df_moe_layer *L, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                                bool accumulate_dx, const float *saved, float *scratch, df_error *err);

// Views of the routing a forward of T rows left in saved (scores, indices, weights, counts, ...).
df_moe_routing df_moe_layer_saved_routing(const df_moe_layer *L, const float *saved, int64_t T);

// Training-state hooks.
void df_moe_layer_set_training(df_moe_layer *L, bool training);
// Training forwards also add their statistics (weighted aux loss, load ratios, per-expert load) into sink, f64
// DF_MOE_STATS(E) on the model's device (NULL: only the layer's own record), the aux loss weighted by den.
void df_moe_layer_set_stats(df_moe_layer *L, double *sink, double den);
void df_moe_layer_set_rows_per_sample(df_moe_layer *L, int64_t rows_per_sample);
void df_moe_layer_set_aux_grad_scale(df_moe_layer *L, float scale);
void df_moe_layer_set_collective(df_moe_layer *L, const df_collective *c);
// Applies and consumes the pending updates (EMA centering mean, then the noaux_tc bias); a no-op without
// a stash. Training forwards call it first themselves.
df_status df_moe_layer_apply_pending(df_moe_layer *L, df_error *err);
// Reads of the layer's record (a device→host copy when the context is not host-addressable: tests and the step
// command; the trainer reads the sink instead).
// The coefficient-scaled aux loss of the last training forward (0 when off or after an eval forward).
double df_moe_layer_aux_loss(df_moe_layer *L);
// The metrics of the last training forward; false (and *out untouched) before the first one.
bool df_moe_layer_metrics(df_moe_layer *L, df_moe_metrics *out);
// The per-expert load of the last training forward (E values summing to 1); NULL before the first one.
const double *df_moe_layer_load(df_moe_layer *L);
// The metrics of one statistics block (a record, or a sink's sums divided by their count).
df_moe_metrics df_moe_metrics_of(const double *stats);

#ifdef __cplusplus
}
#endif

#endif
