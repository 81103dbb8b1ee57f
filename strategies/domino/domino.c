// Domino's labels, λ and objective (strategies/domino/domino.h; docs/domino-step.md): the host builds the per-row
// arrays, the device runs the head, the fused two-logit-set pass and the block metrics, then the head's backward.
#include "strategies/domino/domino.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- λ -------------------------------------------------------------------------------------------------------

double df_domino_lambda(int64_t step, int64_t total_steps, double start, double decay_ratio) {
  if (total_steps <= 0) return 0.0; // SpecForge: no horizon, no base term
  double d = (double)total_steps * decay_ratio;
  int64_t decay = d >= 1.0 ? (int64_t)d : 1; // Python's int() truncates; max(1, ·)
  double progress = (double)step / (double)decay;
  if (progress > 1.0) progress = 1.0;
  const double v = start * (1.0 - progress);
  return v < 0.0 ? 0.0 : v > 1.0 ? 1.0 : v;
}

// ---- labels --------------------------------------------------------------------------------------------------

void df_domino_labels_free(df_domino_labels *l) {
  if (!l) return;
  free(l->labels), free(l->head_ids), free(l->valid), free(l->corrected), free(l->weights);
  memset(l, 0, sizeof *l);
}

df_status df_domino_build_labels(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, bool shift_label, int64_t suffix_start,
                                 double gamma, df_domino_labels *out, df_error *err) {
  memset(out, 0, sizeof *out);
  if (!(gamma >= 0) || !isfinite(gamma))
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_decay_gamma", "use 0 (off) or a positive value",
                   "loss_decay_gamma = %g", gamma);
  if (bs < 2 || S < 1 || suffix_start < 0 || suffix_start >= bs)
    return DF_FAIL(err, DF_ERR_INVALID, "domino labels", NULL, "bad shape: S %lld, bs %lld, suffix_start %lld",
                   (long long)S, (long long)bs, (long long)suffix_start);
  const int64_t R = a->B * a->N * bs;
  out->B = a->B, out->N = a->N, out->bs = bs;
  out->labels = malloc(sizeof(int32_t) * (size_t)(R + 1));
  out->head_ids = malloc(sizeof(int32_t) * (size_t)(R + 1));
  out->valid = malloc((size_t)(R + 1));
  out->corrected = malloc((size_t)(R + 1));
  out->weights = malloc(sizeof(float) * (size_t)(R + 1));
  if (!out->labels || !out->head_ids || !out->valid || !out->corrected || !out->weights) {
    df_domino_labels_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "domino labels", NULL, "out of memory for %lld rows", (long long)R);
  }
  // OnlineDominoModel's weight mask: DFlash's decay exp(−(k−1)/γ) without shift_label, from slot 0 with it.
  const int64_t off = shift_label ? 0 : 1, shift = shift_label ? 1 : 0;
  double wsum = 0.0;
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t n = 0; n < a->N; n++) {
      const int64_t anchor = a->anchors[b * a->N + n];
      const bool keep = a->keep[b * a->N + n];
      for (int64_t k = 0; k < bs; k++) {
        const int64_t r = (b * a->N + n) * bs + k, l = anchor + k + shift;
        const int64_t safe = l < S ? l : S - 1, prev = anchor + k < S ? anchor + k : S - 1;
        const bool v = keep && l < S && loss_mask[b * S + safe] && (shift_label || k > 0);
        const int64_t kk = k - off > 0 ? k - off : 0;
        out->valid[r] = v;
        out->labels[r] = v ? input_ids[b * S + safe] : -1;
        out->head_ids[r] = input_ids[b * S + (prev < 0 ? 0 : prev)];
        out->corrected[r] = k >= suffix_start;
        out->weights[r] = !v ? 0.0f : gamma > 0 ? (float)exp(-(double)kk / gamma) : 1.0f;
        wsum += out->weights[r];
      }
    }
  out->weight_sum = wsum;
  return DF_OK;
}

// ---- objective -----------------------------------------------------------------------------------------------

df_status df_domino_objective_rows(df_ctx *ctx, const df_domino_loss *opt, df_domino_head *dh, const df_tensor *hidden,
                                   const df_tensor *head, const df_tensor *embed, const df_domino_rows *rows,
                                   df_domino_work *w, df_tensor *dhidden, df_tensor *stats, df_error *err) {
  if (!opt || !dh || !hidden || !head || !embed || !rows || !w || !stats)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_domino_objective_rows");
  if (!(opt->lambda >= 0 && opt->lambda <= 1) || !(opt->weight_sum >= 0) || !(opt->grad_scale >= 0))
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "lambda %g, weight sum %g, grad scale %g", opt->lambda,
                   opt->weight_sum, opt->grad_scale);
  const int64_t R = rows->B * rows->N * rows->bs;
  if (R <= 0 || df_numel(hidden) != R * head->shape[1])
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "pass the draft output (B·N·bs, H)",
                   "hidden does not hold B·N·bs = %lld rows of %lld", (long long)R, (long long)head->shape[1]);
  const void *corr = NULL;
  const df_domino_head_in hin = {.nblocks = rows->B * rows->N,
                                 .bs = rows->bs,
                                 .hidden = hidden->data,
                                 .head_ids = rows->head_ids.data,
                                 .corrected = rows->corrected.data,
                                 .embed = embed};
  DF_TRY(df_domino_head_forward(dh, &hin, &corr, err));
  // loss = Σ_r w_r ((1 − λ) CE_final + λ CE_base) / (Σw + ε): per-row coefficients of the fused op, × grad_scale.
  const double inv = 1.0 / (opt->weight_sum + DF_DOMINO_EPS), gs = opt->grad_scale > 0 ? opt->grad_scale : 1.0;
  const double cf = (1.0 - opt->lambda) * inv, cb = opt->lambda * inv;
  const df_device dev = df_ctx_device(ctx);
  const int64_t E = df_domino_head_emb_dim(dh);
  df_tensor ct = df_view_on(hidden->dtype, dev, corr, R, E); // the storage dtype, as hidden and the LM head
  const df_lmhead_domino_desc desc = {
      .chunk_rows = opt->chunk_rows, .final_scale = (float)(gs * cf), .base_scale = (float)(gs * cb)};
  const df_lmhead_domino_in in = {.hidden = hidden,
                                  .head = head,
                                  .corr = &ct,
                                  .w2 = df_domino_head_w2(dh),
                                  .labels = &rows->labels,
                                  .weights = &rows->weights};
  const df_lmhead_domino_out out = {.ce_final = &w->ce_final,
                                    .ce_base = &w->ce_base,
                                    .correct_final = &w->correct_final,
                                    .correct_base = &w->correct_base,
                                    .dhidden = dhidden,
                                    .dcorr = dhidden ? &w->dcorr : NULL,
                                    .dw2 = dhidden ? df_domino_head_w2_grad(dh) : NULL};
  DF_TRY(df_lmhead_domino(ctx, &desc, &in, &out, err));
  const df_domino_metrics_in mi = {.ce_final = &w->ce_final,
                                   .ce_base = &w->ce_base,
                                   .correct_final = &w->correct_final,
                                   .correct_base = &w->correct_base,
                                   .valid = &rows->valid,
                                   .weights = &rows->weights,
                                   .keep = &rows->keep,
                                   .final_scale = cf,
                                   .base_scale = cb,
                                   .inv_den = inv};
  DF_TRY(df_domino_block_metrics(ctx, rows->bs, &mi, stats, err));
  if (!dhidden) return DF_OK;
  return df_domino_head_backward(dh, w->dcorr.data, dhidden->data, err);
}

// ---- metrics -------------------------------------------------------------------------------------------------

void df_domino_metrics_of(const double *st, int64_t bs, df_domino_metrics *m) {
  *m = (df_domino_metrics){.loss_num = st[DF_DOMSTAT_LOSS],
                           .final_sum = st[DF_DOMSTAT_FINAL],
                           .base_sum = st[DF_DOMSTAT_BASE],
                           .final_num = st[DF_DOMSTAT_FINAL_NUM],
                           .base_num = st[DF_DOMSTAT_BASE_NUM],
                           .weight = st[DF_DOMSTAT_WEIGHT],
                           .acc_num = st[DF_DOMSTAT_ACC],
                           .base_acc_num = st[DF_DOMSTAT_BASE_ACC],
                           .acc_den = st[DF_DOMSTAT_ACC_DEN],
                           .accept_num = st[DF_DOMSTAT_ACCEPT],
                           .base_accept_num = st[DF_DOMSTAT_BASE_ACCEPT],
                           .accept_den = st[DF_DOMSTAT_ACCEPT_DEN],
                           .num_blocks = (int64_t)st[DF_DOMSTAT_BLOCKS],
                           .bs = bs,
                           .pos_num = st + DF_DOMSTAT_POS,
                           .pos_den = st + DF_DOMSTAT_POS + bs};
}
