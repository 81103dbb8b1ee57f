// The Domino training strategy for one micro-batch (docs/domino-step.md): DFlash's anchors, block inputs, positions
// and masks (strategies/dflash/dflash.h) with Domino's labels (next-token with shift_label, else DFlash's), the head
// tokens its GRU reads, the GRU correction head (modeling/domino_head.h) and its objective, both CE terms in one
// chunked LM-head pass (df_lmhead_domino):
//   loss = (1 − λ) · Σ w·CE(final) / (Σw + 1e-6) + λ · Σ w·CE(base) / (Σw + 1e-6),
// λ = lambda_base falling linearly from training.lambda_base_start to 0 over the first lambda_base_decay_ratio of the
// run's step horizon.
#ifndef DF_STRATEGIES_DOMINO_DOMINO_H
#define DF_STRATEGIES_DOMINO_DOMINO_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/domino_head.h"
#include "strategies/dflash/dflash.h"

#ifdef __cplusplus
extern "C" {
#endif

// SpecForge adds it to every denominator of the Domino objective and metrics (OnlineDominoModel).
#define DF_DOMINO_EPS 1e-6

// ---- λ (docs/domino-step.md §6) ----------------------------------------------------------------------------------

// SpecForge's linear_lambda_base: decay = max(1, int(total_steps · decay_ratio)), progress = min(step / decay, 1),
// λ = clamp(start · (1 − progress), 0, 1); total_steps <= 0 (no horizon) gives 0. step: optimizer steps taken.
double df_domino_lambda(int64_t step, int64_t total_steps, double start, double decay_ratio);

// ---- labels (§3) ---------------------------------------------------------------------------------------------

typedef struct {
  int64_t B, N, bs;   // rows = B·N·bs, ordered (b, n, k) like df_dflash_blocks
  int32_t *labels;    // input_ids[ℓ_k] where valid, else −1; ℓ_k = anchor + k + 1 (shift_label) or anchor + k
  int32_t *head_ids;  // the token the GRU reads at slot k: input_ids[min(anchor + k, S − 1)] (both modes)
  uint8_t *valid;     // keep · [ℓ_k < S] · loss_mask[ℓ_k] (· [k > 0] without shift_label); no prefix product
  uint8_t *corrected; // k >= suffix_start: the slot's logits get the correction
  float *weights;     // valid · exp(−(k − o)⁺/γ) (o = 0 with shift_label, 1 without) when γ > 0, else valid
  double weight_sum;  // Σ weights (double, in row order)
} df_domino_labels;

// input_ids, loss_mask: (B, S); a: the anchors; suffix_start: df_domino_suffix_start; gamma >= 0 (0: no decay).
df_status df_domino_build_labels(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, bool shift_label, int64_t suffix_start,
                                 double gamma, df_domino_labels *out, df_error *err);
void df_domino_labels_free(df_domino_labels *l);

// ---- the objective on the device (§4, §5, §7) ------------------------------------------------------------------

typedef struct {
  double lambda;      // lambda_base of this micro-step
  double weight_sum;  // Σ weights of the micro-batch (host-known)
  double grad_scale;  // 0: the gradient is d(loss); > 0: d(grad_scale · loss) (the trainer's accumulation)
  int64_t chunk_rows; // rows per chunk of the fused op (0: one pass)
} df_domino_loss;

// The staged per-row arrays (views on the context's device, strategies/dflash/stage.c uploads them).
typedef struct {
  int64_t B, N, bs;
  df_tensor labels, head_ids, valid, corrected, weights; // [R]
  df_tensor keep;                                        // [B·N]
} df_domino_rows;

// Device scratch: per row f32 CE of both logit sets, u8 their correctness, the correction latent's gradient [R, E].
typedef struct {
  df_tensor ce_final, ce_base, correct_final, correct_base, dcorr;
} df_domino_work;

// The head forward, the fused pass over both logit sets, the block metrics added into stats [DF_DOMINO_STATS(bs)]
// and, with dhidden (written), the head's backward: d(loss)/d(hidden) in dhidden, the head's gradients added into
// the model's. embed: the frozen target embedding [V, H]; head: the LM head [V, H].
df_status df_domino_objective_rows(df_ctx *ctx, const df_domino_loss *opt, df_domino_head *dh, const df_tensor *hidden,
                                   const df_tensor *head, const df_tensor *embed, const df_domino_rows *rows,
                                   df_domino_work *w, df_tensor *dhidden, df_tensor *stats, df_error *err);

// ---- metrics -----------------------------------------------------------------------------------------------------

// The sums of a stats vector read back, named (SpecForge's metric = ratio; ratios over several micro-steps use the
// sum of their loss denominators, one per micro-step).
typedef struct {
  double loss_num;                    // Σ per-micro-step losses
  double final_sum, base_sum;         // Σ per-micro-step final_loss / base_loss
  double final_num, base_num, weight; // Σ w·CE(final), Σ w·CE(base), Σ w
  double acc_num, base_acc_num, acc_den;
  double accept_num, base_accept_num, accept_den;
  int64_t num_blocks; // Σ keep
  int64_t bs;
  const double *pos_num, *pos_den; // (bs) borrowed from the stats vector
} df_domino_metrics;
void df_domino_metrics_of(const double *stats, int64_t bs, df_domino_metrics *out);

#ifdef __cplusplus
}
#endif

#endif
