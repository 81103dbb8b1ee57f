// The backend table's MoE slots on CUDA: the launchers of moe_router.cu, moe_dispatch.cu and moe_aux.cu (written
// on the cuda branch against the CPU twins kernels/cpu/moe_*.c) behind the op signatures of kernels/ops_moe.h, plus
// the two small kernels the table's shape needs beyond them (the statistics record, the noaux_tc update from an fp32
// load). The grouped expert GEMMs are not here yet: their slots stay NULL, so an MoE forward on CUDA stops at
// moe_grouped_forward, naming it.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/launch.h"

namespace {

df_cu_stream stream_of(df_ctx *ctx) { return (df_cu_stream)df_cuda_stream(ctx); }

df_cu_router_spec spec_of(const df_moe_route_desc *d) {
  return df_cu_router_spec{d->E,       d->k,         DF_CU_SCORE_SOFTMAX, d->norm_topk_prob, d->routed_scaling_factor,
                           d->n_group, d->topk_group};
}

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// One block, thread 0: the record (CPU order, kernels/cpu/moe_aux.c) from the aux loss and the load statistics the
// launchers left in tmp = {aux, max, min, unused}.
__global__ void finish_stats_kernel(const double *tmp, bool aux_on, double den, const int32_t *counts,
                                    const float *bias, int64_t E, int64_t T, int64_t k, double *stats, bool accumulate,
                                    float *stash) {
  if (threadIdx.x != 0) return;
  double v[DF_MOE_STAT_LOAD] = {0};
  v[DF_MOE_STAT_AUX] = aux_on ? tmp[0] : 0.0;
  v[DF_MOE_STAT_AUX_NUM] = den > 0 ? v[DF_MOE_STAT_AUX] * den : 0.0;
  if (T > 0) v[DF_MOE_STAT_LOAD_MAX] = tmp[1], v[DF_MOE_STAT_LOAD_MIN] = tmp[2], v[DF_MOE_STAT_UNUSED] = tmp[3];
  if (bias) {
    float m = 0.0f;
    for (int64_t e = 0; e < E; e++) m = fabsf(bias[e]) > m ? fabsf(bias[e]) : m;
    v[DF_MOE_STAT_BIAS_ABS_MAX] = m;
  }
  for (int i = 0; i < DF_MOE_STAT_LOAD; i++) stats[i] = accumulate ? stats[i] + v[i] : v[i];
  for (int64_t e = 0; e < E; e++) {
    const double share = T * k > 0 ? (double)counts[e] / (double)(T * k) : 0.0;
    stats[DF_MOE_STAT_LOAD + e] = accumulate ? stats[DF_MOE_STAT_LOAD + e] + share : share;
    if (stash) stash[e] = (float)counts[e];
  }
}

// noaux_tc from an fp32 load: the mean in double in expert order (as on the CPU), then the sign step.
__global__ void noaux_kernel(int64_t E, const float *load, float *bias, float rate) {
  __shared__ double mean;
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int64_t e = 0; e < E; e++) s += load[e];
    mean = s / (double)E;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const double gap = mean - load[e];
    const float sgn = gap > 0 ? 1.0f : (gap < 0 ? -1.0f : 0.0f);
    bias[e] += rate * sgn;
  }
}

df_status scores_forward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores, df_error *err) {
  return df_cu_moe_scores_fwd(stream_of(ctx), (df_cu_score_func)f, logits->shape[0], logits->shape[1],
                              (const float *)logits->data, (float *)scores->data, err);
}

df_status scores_backward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, const df_tensor *scores,
                          const df_tensor *dscores, df_tensor *dlogits, df_error *err) {
  return df_cu_moe_scores_bwd(stream_of(ctx), (df_cu_score_func)f, logits->shape[0], logits->shape[1],
                              (const float *)logits->data, (const float *)scores->data, (const float *)dscores->data,
                              (float *)dlogits->data, err);
}

df_status select(df_ctx *ctx, const df_moe_route_desc *d, const df_tensor *scores, const df_tensor *sel_shift,
                 df_tensor *indices, df_tensor *weights, df_tensor *counts, df_error *err) {
  const df_cu_router_spec sp = spec_of(d);
  return df_cu_moe_select(stream_of(ctx), &sp, scores->shape[0], (const float *)scores->data,
                          sel_shift ? (const float *)sel_shift->data : NULL, (int32_t *)indices->data,
                          (float *)weights->data, (int32_t *)counts->data, err);
}

df_status select_backward(df_ctx *ctx, const df_moe_route_desc *d, const df_tensor *scores, const df_tensor *indices,
                          const df_tensor *weights, const df_tensor *dweights, const df_tensor *aux_row,
                          df_tensor *dscores, df_error *err) {
  const df_cu_router_spec sp = spec_of(d);
  return df_cu_moe_weights_bwd(stream_of(ctx), &sp, scores->shape[0], (const float *)scores->data,
                               (const int32_t *)indices->data, (const float *)weights->data,
                               dweights ? (const float *)dweights->data : NULL,
                               aux_row ? (const float *)aux_row->data : NULL, (float *)dscores->data, err);
}

df_status center_forward(df_ctx *ctx, int64_t rps, const df_tensor *x, const df_tensor *mu, df_tensor *u,
                         df_tensor *batch_mean, df_error *err) {
  const int64_t T = x->shape[0], H = x->shape[1];
  if (mu)
    return df_cu_moe_center_fixed(stream_of(ctx), (const float *)x->data, (const float *)mu->data, T, H,
                                  (float *)u->data, err);
  return df_cu_moe_center_sample_fwd(stream_of(ctx), (const float *)x->data, T, H, rps, (float *)u->data,
                                     batch_mean ? (float *)batch_mean->data : NULL, err);
}

df_status center_backward(df_ctx *ctx, int64_t rps, const df_tensor *du, df_tensor *dx, bool accumulate,
                          df_error *err) {
  return df_cu_moe_center_sample_bwd(stream_of(ctx), (const float *)du->data, du->shape[0], du->shape[1], rps,
                                     (float *)dx->data, accumulate, err);
}

df_status plan(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts, df_tensor *offsets,
               df_tensor *slot, df_tensor *token, df_error *err) {
  const int64_t Tk = df_numel(indices), E = df_numel(counts);
  const size_t inv = round256(sizeof(int32_t) * (size_t)(Tk > 0 ? Tk : 1));
  char *ws;
  DF_TRY(df_ctx_workspace(ctx, 1, inv + df_cu_moe_plan_workspace(Tk, E), (void **)&ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_moe_plan(stream_of(ctx), Tk / k, k, E, (const int32_t *)indices->data, (const int32_t *)counts->data,
                        (int32_t *)offsets->data, (int32_t *)slot->data, (int32_t *)token->data, (int32_t *)ws,
                        ws + inv, err);
}

df_status scale_rows(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx, df_error *err) {
  const int64_t N = h->shape[0], I = h->shape[1];
  if (!idx) return df_cu_rows_scale(stream_of(ctx), (const float *)w->data, h->data, h->dtype, N, I, err);
  return df_cu_moe_scale_rows(stream_of(ctx), h->data, h->dtype, N, I, (const float *)w->data,
                              (const int32_t *)idx->data, err);
}

df_status gate_backward(df_ctx *ctx, bool sigmoid, df_tensor *dh, const df_tensor *act, const df_tensor *w,
                        const df_tensor *idx, df_tensor *out, df_error *err) {
  const int64_t N = dh->shape[0], I = dh->shape[1];
  if (sigmoid)
    return df_cu_rows_gate_bwd(stream_of(ctx), (const float *)w->data, dh->data, dh->dtype, act->data, act->dtype, N, I,
                               (float *)out->data, err);
  return df_cu_moe_dweights(stream_of(ctx), dh->data, dh->dtype, act->data, act->dtype, N, I, (const float *)w->data,
                            (const int32_t *)idx->data, (float *)out->data, err);
}

df_status sigmoid_scale(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err) {
  return df_cu_rows_sigmoid_scale(stream_of(ctx), (float *)z->data, a->data, a->dtype, a->shape[0], a->shape[1], err);
}

df_status route_stats(df_ctx *ctx, const df_moe_stats_desc *d, const df_tensor *scores, const df_tensor *counts,
                      const df_tensor *bias, df_tensor *stats, bool accumulate, df_tensor *count_stash, df_error *err) {
  const int64_t T = scores->shape[0], E = scores->shape[1];
  const size_t head = round256(4 * sizeof(double));
  char *ws;
  DF_TRY(df_ctx_workspace(ctx, 0, head + df_cu_moe_aux_workspace(T, E), (void **)&ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  double *tmp = (double *)ws;
  const df_cu_stream s = stream_of(ctx);
  const int32_t *c = (const int32_t *)counts->data;
  const bool aux_on = d->coeff > 0;
  if (aux_on) DF_TRY(df_cu_moe_switch_loss(s, d->coeff, T, E, (const float *)scores->data, c, ws + head, tmp, err));
  DF_TRY(df_cu_moe_load_stats(s, c, E, T, d->k, tmp + 1, err));
  finish_stats_kernel<<<1, 32, 0, (cudaStream_t)s>>>(tmp, aux_on, d->den, c, bias ? (const float *)bias->data : NULL, E,
                                                     T, d->k, (double *)stats->data, accumulate,
                                                     count_stash ? (float *)count_stash->data : NULL);
  DF_CUDA_CHECK_LAUNCH(err, "moe_finish_stats");
  return DF_OK;
}

df_status aux_backward(df_ctx *ctx, const df_moe_stats_desc *d, int64_t T, const df_tensor *counts, double upstream,
                       df_tensor *row, df_error *err) {
  return df_cu_moe_switch_grad_row(stream_of(ctx), d->coeff, T, df_numel(counts), (const int32_t *)counts->data,
                                   upstream, (float *)row->data, err);
}

df_status center_ema(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps, df_error *err) {
  return df_cu_moe_center_ema(stream_of(ctx), df_numel(stash), (const float *)stash->data, (float *)mu->data,
                              (float *)steps->data, rho, err);
}

df_status noaux_update(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias, df_error *err) {
  const int64_t E = df_numel(load);
  if (E <= 0) return DF_OK;
  noaux_kernel<<<1, 256, 0, df_cuda_stream(ctx)>>>(E, (const float *)load->data, (float *)bias->data, rate);
  DF_CUDA_CHECK_LAUNCH(err, "moe_noaux_update");
  return DF_OK;
}

} // namespace

// This file's slots of the CUDA backend table (kernels/cuda/backend.cu).
extern "C" void df_cuda_register_moe(df_backend *be) {
  be->moe_scores_forward = scores_forward;
  be->moe_scores_backward = scores_backward;
  be->moe_select = select;
  be->moe_select_backward = select_backward;
  be->moe_center_forward = center_forward;
  be->moe_center_backward = center_backward;
  be->moe_plan = plan;
  be->measures[DF_OP_MOE_PLAN] = be->measures[DF_OP_MOE_ROUTE_STATS] = true;
  be->moe_scale_rows = scale_rows;
  be->moe_gate_backward = gate_backward;
  be->moe_sigmoid_scale = sigmoid_scale;
  be->moe_route_stats = route_stats;
  be->moe_aux_backward = aux_backward;
  be->moe_center_ema = center_ema;
  be->moe_noaux_update = noaux_update;
}
