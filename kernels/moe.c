// Dispatchers of the MoE ops (kernels/ops_moe.h): every argument checked, then the backend's slot.
#include "kernels/check.h"

#define CHK(t, name, dt, nd) DF_TRY(df_check_tensor(ctx, t, name, dt, nd, err))
#define OPT(t, name, dt, nd)                                                                                           \
  do {                                                                                                                 \
    if (t) CHK(t, name, dt, nd);                                                                                       \
  } while (0)

static df_status bad_score(int f, df_error *err) {
  return DF_FAIL(err, DF_ERR_INVALID, "scoring_func", "use a registered score function (moe/registry_core.c)",
                 "unknown score function %d", f);
}

static df_status check_scores(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, const df_tensor *scores,
                              df_error *err) {
  if ((unsigned)f > DF_MOE_SCORE_SQRTSOFTPLUS) return bad_score((int)f, err);
  CHK(logits, "logits", DF_F32, 2);
  CHK(scores, "scores", DF_F32, 2);
  DF_TRY(df_check_dim(scores, "scores", 0, logits->shape[0], err));
  return df_check_dim(scores, "scores", 1, logits->shape[1], err);
}

df_status df_moe_scores_forward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores,
                                df_error *err) {
  DF_TRY(check_scores(ctx, f, logits, scores, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SCORES_FORWARD, DF_F32, err);
  return ctx->backend->moe_scores_forward(ctx, f, logits, scores, err);
}

df_status df_moe_scores_backward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, const df_tensor *scores,
                                 const df_tensor *dscores, df_tensor *dlogits, df_error *err) {
  DF_TRY(check_scores(ctx, f, logits, scores, err));
  DF_TRY(check_scores(ctx, f, logits, dscores, err));
  DF_TRY(check_scores(ctx, f, logits, dlogits, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SCORES_BACKWARD, DF_F32, err);
  return ctx->backend->moe_scores_backward(ctx, f, logits, scores, dscores, dlogits, err);
}

static df_status check_route(df_ctx *ctx, const df_moe_route_desc *d, const df_tensor *scores, const df_tensor *indices,
                             const df_tensor *weights, df_error *err) {
  if (d->E <= 0 || d->k < 1 || d->k > d->E || d->n_group < 1 || d->E % d->n_group || d->topk_group < 1 ||
      d->topk_group > d->n_group || d->topk_group * (d->E / d->n_group) < d->k)
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "1 <= k <= E; n_group divides E; the kept groups hold >= k experts",
                   "router E = %lld, k = %lld, n_group = %lld, topk_group = %lld", (long long)d->E, (long long)d->k,
                   (long long)d->n_group, (long long)d->topk_group);
  CHK(scores, "scores", DF_F32, 2);
  DF_TRY(df_check_dim(scores, "scores", 1, d->E, err));
  const int64_t T = scores->shape[0];
  CHK(indices, "indices", DF_I32, -1);
  CHK(weights, "weights", DF_F32, -1);
  DF_TRY(df_check_per_row(ctx, indices, "indices", DF_I32, T * d->k, err));
  return df_check_per_row(ctx, weights, "weights", DF_F32, T * d->k, err);
}

df_status df_moe_select(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores, const df_tensor *sel_shift,
                        df_tensor *indices, df_tensor *weights, df_tensor *counts, df_error *err) {
  DF_TRY(check_route(ctx, desc, scores, indices, weights, err));
  if (sel_shift) DF_TRY(df_check_per_row(ctx, sel_shift, "sel_shift", DF_F32, desc->E, err));
  DF_TRY(df_check_per_row(ctx, counts, "counts", DF_I32, desc->E, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SELECT, DF_F32, err);
  return ctx->backend->moe_select(ctx, desc, scores, sel_shift, indices, weights, counts, err);
}

df_status df_moe_select_backward(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores,
                                 const df_tensor *indices, const df_tensor *weights, const df_tensor *dweights,
                                 const df_tensor *aux_row, df_tensor *dscores, df_error *err) {
  DF_TRY(check_route(ctx, desc, scores, indices, weights, err));
  const int64_t T = scores->shape[0];
  if (dweights) DF_TRY(df_check_per_row(ctx, dweights, "dweights", DF_F32, T * desc->k, err));
  if (aux_row) DF_TRY(df_check_per_row(ctx, aux_row, "aux_row", DF_F32, desc->E, err));
  CHK(dscores, "dscores", DF_F32, 2);
  DF_TRY(df_check_same_numel(dscores, "dscores", scores, "scores", err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SELECT_BACKWARD, DF_F32, err);
  return ctx->backend->moe_select_backward(ctx, desc, scores, indices, weights, dweights, aux_row, dscores, err);
}

// ---- centering ----------------------------------------------------------------------------------------------------

static df_status check_rows_per_sample(int64_t T, int64_t n, df_error *err) {
  if (n <= 0 || T % n)
    return DF_FAIL(err, DF_ERR_INVALID, "rows_per_sample",
                   "sample centering needs the FFN rows grouped per sample (N·bs rows each)",
                   "%lld rows do not split into samples of %lld rows", (long long)T, (long long)n);
  return DF_OK;
}

df_status df_moe_center_forward(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *x, const df_tensor *mu,
                                df_tensor *u, df_tensor *batch_mean, df_error *err) {
  CHK(x, "x", DF_F32, 2);
  CHK(u, "u", DF_F32, 2);
  DF_TRY(df_check_same_numel(u, "u", x, "x", err));
  const int64_t T = x->shape[0], H = x->shape[1];
  if (mu)
    DF_TRY(df_check_per_row(ctx, mu, "mu", DF_F32, H, err));
  else
    DF_TRY(check_rows_per_sample(T, rows_per_sample, err));
  if (batch_mean) DF_TRY(df_check_per_row(ctx, batch_mean, "batch_mean", DF_F32, H, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_CENTER_FORWARD, DF_F32, err);
  return ctx->backend->moe_center_forward(ctx, rows_per_sample, x, mu, u, batch_mean, err);
}

df_status df_moe_center_backward(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *du, df_tensor *dx,
                                 bool accumulate, df_error *err) {
  CHK(du, "du", DF_F32, 2);
  CHK(dx, "dx", DF_F32, -1);
  DF_TRY(df_check_same_numel(dx, "dx", du, "du", err));
  DF_TRY(check_rows_per_sample(du->shape[0], rows_per_sample, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_CENTER_BACKWARD, DF_F32, err);
  return ctx->backend->moe_center_backward(ctx, rows_per_sample, du, dx, accumulate, err);
}

// ---- dispatch -----------------------------------------------------------------------------------------------------

df_status df_moe_plan(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts, df_tensor *offsets,
                      df_tensor *slot, df_tensor *token, df_error *err) {
  CHK(indices, "indices", DF_I32, -1);
  CHK(counts, "counts", DF_I32, -1);
  const int64_t Tk = df_numel(indices), E = df_numel(counts);
  if (k < 1 || Tk % k || Tk > INT32_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "indices", NULL, "%lld slots for k = %lld", (long long)Tk, (long long)k);
  DF_TRY(df_check_per_row(ctx, offsets, "offsets", DF_I32, E + 1, err));
  DF_TRY(df_check_per_row(ctx, slot, "slot", DF_I32, Tk, err));
  DF_TRY(df_check_per_row(ctx, token, "token", DF_I32, Tk, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_PLAN, DF_F32, err);
  return ctx->backend->moe_plan(ctx, k, indices, counts, offsets, slot, token, err);
}

df_status df_moe_scale_rows(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(h, "h", &st, err));
  CHK(h, "h", st, 2);
  CHK(w, "w", DF_F32, -1);
  if (idx)
    DF_TRY(df_check_per_row(ctx, idx, "idx", DF_I32, h->shape[0], err));
  else
    DF_TRY(df_check_per_row(ctx, w, "w", DF_F32, h->shape[0], err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SCALE_ROWS, st, err);
  return ctx->backend->moe_scale_rows(ctx, h, w, idx, err);
}

df_status df_moe_gate_backward(df_ctx *ctx, bool sigmoid, df_tensor *dh, const df_tensor *act, const df_tensor *w,
                               const df_tensor *idx, df_tensor *out, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(dh, "dh", &st, err));
  CHK(dh, "dh", st, 2);
  CHK(act, "act", st, 2);
  DF_TRY(df_check_same_numel(act, "act", dh, "dh", err));
  CHK(w, "w", DF_F32, -1);
  CHK(out, "out", DF_F32, -1);
  const int64_t N = dh->shape[0];
  if (sigmoid && idx)
    return DF_FAIL(err, DF_ERR_INVALID, "idx", "the sigmoid gate scales row p by w[p]", "idx must be NULL");
  if (idx)
    DF_TRY(df_check_per_row(ctx, idx, "idx", DF_I32, N, err));
  else
    DF_TRY(df_check_per_row(ctx, w, "w", DF_F32, N, err));
  if (df_numel(out) != df_numel(w))
    return DF_FAIL(err, DF_ERR_INVALID, "out", NULL, "out needs the %lld elements of w", (long long)df_numel(w));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_GATE_BACKWARD, st, err);
  return ctx->backend->moe_gate_backward(ctx, sigmoid, dh, act, w, idx, out, err);
}

df_status df_moe_sigmoid_scale(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(a, "a", &st, err));
  CHK(a, "a", st, 2);
  DF_TRY(df_check_per_row(ctx, z, "z", DF_F32, a->shape[0], err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_SIGMOID_SCALE, st, err);
  return ctx->backend->moe_sigmoid_scale(ctx, z, a, err);
}

// ---- aux loss, statistics, deferred updates ---------------------------------------------------------------------

static df_status check_stats_desc(const df_moe_stats_desc *d, df_error *err) {
  if ((unsigned)d->aux != DF_MOE_AUX_SWITCH)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_aux_loss_type", "the registered aux losses are: switch",
                   "unknown aux loss type %d", (int)d->aux);
  if (d->k < 1 || !(d->coeff >= 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "k >= 1 and coeff >= 0", "k = %lld, coeff = %g", (long long)d->k,
                   d->coeff);
  return DF_OK;
}

df_status df_moe_route_stats(df_ctx *ctx, const df_moe_stats_desc *desc, const df_tensor *scores,
                             const df_tensor *counts, const df_tensor *bias, df_tensor *stats, bool accumulate,
                             df_tensor *count_stash, df_error *err) {
  DF_TRY(check_stats_desc(desc, err));
  CHK(scores, "scores", DF_F32, 2);
  const int64_t E = scores->shape[1];
  DF_TRY(df_check_per_row(ctx, counts, "counts", DF_I32, E, err));
  if (bias) DF_TRY(df_check_per_row(ctx, bias, "bias", DF_F32, E, err));
  DF_TRY(df_check_per_row(ctx, stats, "stats", DF_F64, DF_MOE_STATS(E), err));
  if (count_stash) DF_TRY(df_check_per_row(ctx, count_stash, "count_stash", DF_F32, E, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_ROUTE_STATS, DF_F32, err);
  return ctx->backend->moe_route_stats(ctx, desc, scores, counts, bias, stats, accumulate, count_stash, err);
}

df_status df_moe_aux_backward(df_ctx *ctx, const df_moe_stats_desc *desc, int64_t T, const df_tensor *counts,
                              double upstream, df_tensor *row, df_error *err) {
  DF_TRY(check_stats_desc(desc, err));
  CHK(counts, "counts", DF_I32, -1);
  DF_TRY(df_check_per_row(ctx, row, "row", DF_F32, df_numel(counts), err));
  if (T < 0) return DF_FAIL(err, DF_ERR_INVALID, "T", NULL, "T = %lld", (long long)T);
  DF_REQUIRE_OP(ctx, DF_OP_MOE_AUX_BACKWARD, DF_F32, err);
  return ctx->backend->moe_aux_backward(ctx, desc, T, counts, upstream, row, err);
}

df_status df_moe_center_ema(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps,
                            df_error *err) {
  if (!(rho >= 0.0 && rho < 1.0))
    return DF_FAIL(err, DF_ERR_INVALID, "moe_router_center_momentum", "the momentum must lie in [0, 1)", "rho = %g",
                   rho);
  CHK(stash, "stash", DF_F32, -1);
  DF_TRY(df_check_per_row(ctx, mu, "mu", DF_F32, df_numel(stash), err));
  DF_TRY(df_check_per_row(ctx, steps, "steps", DF_F32, 1, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_CENTER_EMA, DF_F32, err);
  return ctx->backend->moe_center_ema(ctx, rho, stash, mu, steps, err);
}

df_status df_moe_noaux_update(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias, df_error *err) {
  CHK(load, "load", DF_F32, -1);
  DF_TRY(df_check_per_row(ctx, bias, "bias", DF_F32, df_numel(load), err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_NOAUX_UPDATE, DF_F32, err);
  return ctx->backend->moe_noaux_update(ctx, rate, load, bias, err);
}

// ---- grouped expert GEMMs -----------------------------------------------------------------------------------------

static df_status check_grouped(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                               const df_tensor *y, const char *yname, df_dtype *st, df_error *err) {
  DF_TRY(df_check_storage(w, "w", st, err));
  CHK(w, "w", *st, 3);
  CHK(x, "x", *st, 2);
  DF_TRY(df_check_dim(x, "x", 1, w->shape[2], err));
  CHK(y, yname, *st, 2);
  DF_TRY(df_check_dim(y, yname, 0, x->shape[0], err));
  DF_TRY(df_check_dim(y, yname, 1, w->shape[1], err));
  return df_check_per_row(ctx, offsets, "offsets", DF_I32, w->shape[0] + 1, err);
}

df_status df_moe_grouped_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                                 df_tensor *y, df_error *err) {
  df_dtype st;
  DF_TRY(check_grouped(ctx, x, w, offsets, y, "y", &st, err));
  DF_REQUIRE_OP(ctx, DF_OP_MOE_GROUPED_FORWARD, st, err);
  return ctx->backend->moe_grouped_forward(ctx, x, w, offsets, y, err);
}

df_status df_moe_grouped_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                  const df_tensor *offsets, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                  df_error *err) {
  df_dtype st;
  DF_TRY(check_grouped(ctx, x, w, offsets, dy, "dy", &st, err));
  if (dx) {
    CHK(dx, "dx", st, 2);
    DF_TRY(df_check_same_numel(dx, "dx", x, "x", err));
  }
  if (dw) {
    CHK(dw, "dw", st, 3);
    DF_TRY(df_check_same_numel(dw, "dw", w, "w", err));
  }
  DF_REQUIRE_OP(ctx, DF_OP_MOE_GROUPED_BACKWARD, st, err);
  return ctx->backend->moe_grouped_backward(ctx, dy, x, w, offsets, dx, accumulate_dx, dw, err);
}
