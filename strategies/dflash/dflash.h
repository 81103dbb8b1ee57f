// The DFlash training strategy for one micro-batch (docs/dflash-step.md §2, §3, §5): anchor sampling, block
// inputs, positions, labels and weights, and the chunked objective (DFlash CE or D-PACE) with its metrics.
#ifndef DF_STRATEGIES_DFLASH_DFLASH_H
#define DF_STRATEGIES_DFLASH_DFLASH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "base/rng.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- anchors (§2) ------------------------------------------------------------------------------------------

// The anchor stream: created once per run from the seed; its state is all a checkpoint needs to save.
typedef struct {
  df_rng rng;
} df_dflash_sampler;

void df_dflash_sampler_init(df_dflash_sampler *s, uint64_t seed);

typedef struct {
  int64_t B, N;        // samples, blocks per sample
  int32_t *anchors;    // (B, N) ascending per sample; padding blocks hold 0
  uint8_t *keep;       // (B, N) 1 = a real block, 0 = padding
  int64_t *candidates; // (B) c_b: valid anchor positions of each sample
} df_dflash_anchors;

// valid[b][p] = p <= S−2 and loss_mask[b][p] and loss_mask[b][p+1]; N = min(num_anchors, max_b c_b). Draws
// S−1 uniforms per sample (valid or not) and keeps the min(N, c_b) smallest keys of the valid positions.
// No valid position in the whole batch is an error. out is owned by the caller (df_dflash_anchors_free).
df_status df_dflash_sample_anchors(df_dflash_sampler *s, const uint8_t *loss_mask, int64_t B, int64_t S,
                                   int64_t num_anchors, df_dflash_anchors *out, df_error *err);
void df_dflash_anchors_free(df_dflash_anchors *a);

// Data parallel: this rank's batch is its share of a global batch of world·B samples (slots rank, rank + world,
// … of it, train/data/data_feed.h), padded to global_S = the longest sample of the whole global batch, with
// global_cmax = the largest candidate count over it (both reduced with MAX across ranks). The stream is replayed
// over the global batch in slot order — global_S − 1 draws per sample, the other ranks' draws discarded — and
// N = min(num_anchors, global_cmax), so the anchors, N and the stream state equal the one-process ones of the
// global batch. world 1 (global_S = S, global_cmax = the local maximum) is df_dflash_sample_anchors.
typedef struct {
  int world, rank;
  int64_t global_S, global_cmax;
} df_dflash_global_batch;

df_status df_dflash_sample_anchors_global(df_dflash_sampler *s, const uint8_t *loss_mask, int64_t B, int64_t S,
                                          int64_t num_anchors, const df_dflash_global_batch *g, df_dflash_anchors *out,
                                          df_error *err);
// max_b c_b of a (B, S) loss mask (what df_dflash_global_batch.global_cmax reduces).
int64_t df_dflash_max_candidates(const uint8_t *loss_mask, int64_t B, int64_t S);

// ---- block inputs, positions, labels, weights (§3) ---------------------------------------------------------

typedef struct {
  int64_t B, N, bs;   // rows = B·N·bs, ordered (b, n, k)
  int32_t *input_ids; // (B, N·bs) anchor token at k = 0 of a kept block, else mask_token_id
  int32_t *positions; // (B, N·bs) anchor + k (the model derives the same from the anchors)
  int32_t *labels;    // (B, N·bs) input_ids[anchor + k] where the binary weight is 1, else −1 (ignored row)
  uint8_t *binary;    // (B, N·bs) keep · [anchor + k < S] · [k > 0] · loss_mask[anchor + k]
  float *weights;     // (B, N·bs) binary · d_k, d_k = exp(−(k−1)/γ) when γ > 0, else 1
} df_dflash_blocks;

// input_ids, loss_mask: (B, S). mask_token_id must be >= 0; gamma >= 0 (0: no decay).
df_status df_dflash_build_blocks(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, int64_t mask_token_id, double gamma,
                                 df_dflash_blocks *out, df_error *err);
void df_dflash_blocks_free(df_dflash_blocks *blk);

// ---- objective (§5) ----------------------------------------------------------------------------------------

typedef enum {
  DF_LOSS_DFLASH = 0,          // Σ CE·w / Σ w
  DF_LOSS_DPACE = 1,           // weight Σ_{j≥k} P_j·w_j
  DF_LOSS_DPACE_CUMCONF = 2,   // "dpace-cumulative-confidence-only": weight P_k
  DF_LOSS_DPACE_CONTVALUE = 3, // "dpace-continuation-value-only": weight Σ_{j≥k} P_j·w_j ÷ P_k
} df_dflash_loss_type;

const char *df_dflash_loss_type_name(df_dflash_loss_type t); // the recipe spelling
bool df_dflash_loss_type_parse(const char *s, df_dflash_loss_type *out);
bool df_dflash_loss_type_is_dpace(df_dflash_loss_type t);
// The df_dpace_weights mode of a loss type (DF_DPACE_ONE for dflash).
df_dpace_mode df_dflash_dpace_mode(df_dflash_loss_type t);

typedef struct {
  df_dflash_loss_type type;
  double dpace_alpha;   // α in [0, 1]
  int64_t chunk_blocks; // objective_chunk_blocks: the LM head runs on chunk_blocks·bs rows at a time; 0 = all
} df_dflash_loss_options;

// Additive terms and metrics of one micro-batch. Ratios are left to the caller (they sum across micro-steps).
typedef struct {
  double loss_num, loss_den; // the gradient is that of loss_num / loss_den
  double acc_num, acc_den;   // argmax = label over binary-weight slots
  int64_t num_blocks;        // Σ keep
  int64_t bs;
  double *pos_acc_num, *pos_acc_den; // (bs) the same split by slot k (slot 0 is never supervised)
  double accept_len_sum; // Σ over kept blocks of 1 + the leading run of correct slots k >= 1 (invalid slots
                         // neither break nor extend the run, as SpecForge's compute_accept_len)
  double aux_loss; // MoE drafts (train/step/step.c): Σ over layers of the coefficient-scaled router aux loss of this
                   // training micro-batch, already added to loss_num as aux_loss·loss_den; 0 otherwise
} df_dflash_metrics;

void df_dflash_metrics_free(df_dflash_metrics *m);

// The objective on the draft's final hidden states (B·N·bs, H) with the frozen head (V, H). Writes the metrics
// and, when dhidden is not NULL, d(loss_num/loss_den)/d(hidden) into dhidden (B·N·bs, H). D-PACE first runs the
// fused LM head + CE forward-only to get every row's CE, derives the detached weights per block, then runs it
// again with row weights w·weight and grad_scale 1/B; DFlash runs once with weights w and grad_scale 1/Σw.
// Host-array entry point (tests, tools): blk and a are host memory, hidden and dhidden live on the context's
// device; the rows are uploaded, df_dflash_objective_rows runs, and its sums are read back once.
df_status df_dflash_objective(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                              const df_tensor *head, const df_dflash_blocks *blk, const df_dflash_anchors *a,
                              float *dhidden, df_dflash_metrics *out, df_error *err);

// ---- the objective on the device -----------------------------------------------------------------------------

// The objective's per-row inputs, as views on the context's device (strategies/dflash/stage.c uploads them with the
// batch).
typedef struct {
  int64_t B, N, bs;   // rows R = B·N·bs, ordered (b, n, k)
  df_tensor labels;   // [R] i32, −1: no target
  df_tensor weights;  // [R] f32 binary · d_k (DFlash's row weights)
  df_tensor binary;   // [R] u8
  df_tensor binary_f; // [R] f32 the binary weight as a float (D-PACE's w)
  df_tensor keep;     // [B·N] u8
  double loss_den;    // df_dflash_loss_den, computed on the host where the rows were built
} df_dflash_rows;

// Device scratch the objective writes, [R] each: CE, correct flags, D-PACE weights, the gradient's row weights.
typedef struct {
  df_tensor ce, correct, dpace, row_w;
} df_dflash_work;

// loss_den of the objective: Σ weights (DFlash) or B (D-PACE).
double df_dflash_loss_den(const df_dflash_loss_options *opt, const df_dflash_blocks *blk);

// The objective entirely on the device: the fused LM head + CE (twice for D-PACE, with df_dpace_weights
// between), the block metrics added into stats [DF_BLOCK_STATS(bs)] f64 (kernels/ops.h), and, when dhidden is not
// NULL, d(loss_num / loss_den)/d(hidden) written into it. Nothing is read back to the host.
df_status df_dflash_objective_rows(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                                   const df_tensor *head, const df_dflash_rows *rows, df_dflash_work *w,
                                   df_tensor *dhidden, df_tensor *stats, df_error *err);

// The metrics of a stats vector read back from the device (pos arrays allocated; df_dflash_metrics_free).
df_status df_dflash_metrics_from_stats(const double *stats, int64_t bs, double loss_den, df_dflash_metrics *out,
                                       df_error *err);

#ifdef __cplusplus
}
#endif

#endif
