// The sparse-MoE FFN behind the df_ffn vtable: parameters from moe/params.h (native names), binding, and the
// hooks a strategy/trainer drives on every MoE layer of a model (training flag, rows per sample, aux loss
// value and gradient scale, deferred updates, metrics). See moe/layer.h for the per-step contract.
#ifndef DF_MOE_FFN_MOE_H
#define DF_MOE_FFN_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "modeling/ffn.h" // the one modeling/ header moe/ builds on (the FFN interface, its table and loader)
#include "moe/config.h"
#include "moe/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// The "moe" FFN kind (modeling/ffn.h), listed by train/ffn_kinds.c: a draft config naming moe_preset resolves it.
extern const df_ffn_kind df_ffn_moe_kind;

// The MoE FFN of decoder layer `layer` for the draft's resolved MoE config (cfg->moe); appends its parameters
// to p (df_moe_params_add order).
df_status df_ffn_moe_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);
// The same from the MoE config and hidden size alone (tests, benchmarks).
df_status df_ffn_moe_create_from(const df_moe_config *m, int64_t hidden_size, int64_t layer, df_params *p, df_ffn **out,
                                 df_error *err);

// The MoE layer behind an FFN, or NULL when f is not an MoE FFN (dense layers pass through every helper below).
df_moe_layer *df_ffn_moe_layer(df_ffn *f);
bool df_ffn_is_moe(const df_ffn *f);

// ---- model-level hooks over a model's FFNs (non-MoE entries are skipped) ---------------------------------

// Training (true) or eval (false) for every MoE layer; eval forwards apply no update, stash nothing and
// produce no aux loss.
void df_moe_set_training(df_ffn *const *ffns, int n, bool training);
// The FFN rows of one sample (N·bs) for sample centering, when the layer passes (B·N·bs, H) rows.
void df_moe_set_rows_per_sample(df_ffn *const *ffns, int n, int64_t rows_per_sample);
// Data parallel: every MoE layer's all-reduce (moe/balance.h) for its deferred updates and global routing
// statistics; NULL: one rank.
void df_moe_set_collective(df_ffn *const *ffns, int n, const df_collective *c);
// ∂objective/∂(aux loss sum), set before the backward (default 1).
void df_moe_set_aux_grad_scale(df_ffn *const *ffns, int n, float scale);
// Applies every pending deferred update (also done by each layer's next training forward).
df_status df_moe_apply_pending(df_ffn *const *ffns, int n, df_error *err);
// Σ over MoE layers of the last training forward's aux loss: what the objective adds (0 for dense models).
double df_moe_aux_loss_sum(df_ffn *const *ffns, int n);

// One named scalar ("moe/load_max_ratio", ...).
typedef struct {
  const char *name;
  double value;
} df_moe_metric;
enum { DF_MOE_MAX_METRICS = 8 };
// Metrics averaged over the MoE layers that ran a training forward: moe/load_max_ratio, moe/load_min_ratio,
// moe/experts_unused_frac, moe/aux_loss, and moe/bias_abs_max when a layer uses noaux_tc. Returns the count
// written to out (0 for dense models).
int df_moe_collect_metrics(df_ffn *const *ffns, int n, df_moe_metric out[DF_MOE_MAX_METRICS]);
// ---- statistics on the device (the trainer: one read per optimizer step) ---------------------------------------

// The MoE layers of the model, and the f64 elements of their statistics sums: one DF_MOE_STATS(E) block per MoE
// layer (kernels/ops_moe.h), in layer order (0 for dense models).
int df_moe_num_layers(df_ffn *const *ffns, int n);
int64_t df_moe_stats_elems(df_ffn *const *ffns, int n);
// Training forwards add their statistics into sums (df_moe_stats_elems f64 on the model's device; NULL: stop), the
// aux loss weighted by den (the micro-batch's loss_den).
void df_moe_set_stats(df_ffn *const *ffns, int n, double *sums, double den);
// From sums read back to the host: Σ_layers Σ_micro aux·den (the aux part of loss_num), and the moe/* metrics
// averaged over the layers and the `micro` forwards (as df_moe_collect_metrics would per forward).
double df_moe_stats_aux_num(df_ffn *const *ffns, int n, const double *sums);
int df_moe_stats_metrics(df_ffn *const *ffns, int n, const double *sums, int micro,
                         df_moe_metric out[DF_MOE_MAX_METRICS]);

// The expert count of the model's MoE layers (0 for dense models).
int64_t df_moe_num_experts(df_ffn *const *ffns, int n);
// Per MoE layer (at most max_layers), the share of routed slots each expert took in its last training
// forward: layer_ids[j] is the decoder layer, load[j*E .. j*E + E) its E shares (E = df_moe_num_experts).
// Returns the number of layers written (0 before the first training forward or for dense models).
int df_moe_collect_load(df_ffn *const *ffns, int n, int max_layers, int64_t *layer_ids, double *load);

#ifdef __cplusplus
}
#endif

#endif
