// The MoE router as a composition of ops: the logit GEMM (df_linear_*), the score function and the selection
// (df_moe_scores_*, df_moe_select*), and the centering (df_moe_center_*), on the context's device.
#include "moe/router.h"

df_moe_router_spec df_moe_router_spec_from(const df_moe_config *m, int64_t H) {
  return (df_moe_router_spec){.H = H,
                              .E = m->n_routed_experts,
                              .k = m->num_experts_per_tok,
                              .score_func = m->scoring_func,
                              .norm_topk_prob = m->norm_topk_prob,
                              .routed_scaling_factor = (float)m->routed_scaling_factor,
                              .n_group = m->n_group,
                              .topk_group = m->topk_group};
}

df_status df_moe_router_spec_check(const df_moe_router_spec *s, df_error *err) {
  if (s->H <= 0 || s->E <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "n_routed_experts", "the router needs hidden_size > 0 and experts > 0",
                   "router of H = %lld, E = %lld", (long long)s->H, (long long)s->E);
  if (s->k < 1 || s->k > s->E)
    return DF_FAIL(err, DF_ERR_INVALID, "num_experts_per_tok", "choose 1 <= num_experts_per_tok <= n_routed_experts",
                   "k = %lld with E = %lld experts", (long long)s->k, (long long)s->E);
  if (s->n_group < 1 || s->E % s->n_group || s->topk_group < 1 || s->topk_group > s->n_group)
    return DF_FAIL(err, DF_ERR_INVALID, "n_group", "n_group must divide the expert count; 1 <= topk_group <= n_group",
                   "n_group = %lld, topk_group = %lld, E = %lld", (long long)s->n_group, (long long)s->topk_group,
                   (long long)s->E);
  if (s->topk_group * (s->E / s->n_group) < s->k)
    return DF_FAIL(err, DF_ERR_INVALID, "topk_group", "keep more groups or route fewer experts per token",
                   "the %lld kept groups of %lld experts cannot supply k = %lld distinct experts",
                   (long long)s->topk_group, (long long)(s->E / s->n_group), (long long)s->k);
  return DF_OK;
}

df_moe_route_desc df_moe_router_desc(const df_moe_router_spec *s) {
  return (df_moe_route_desc){.E = s->E,
                             .k = s->k,
                             .n_group = s->n_group,
                             .topk_group = s->topk_group,
                             .norm_topk_prob = s->norm_topk_prob,
                             .routed_scaling_factor = s->routed_scaling_factor};
}

// ---- centering -----------------------------------------------------------------------------------------

df_status df_moe_center_sample_forward(df_ctx *ctx, const float *x, int64_t T, int64_t H, int64_t rows_per_sample,
                                       float *u, float *batch_mean, df_error *err) {
  const df_device d = df_ctx_device(ctx);
  df_tensor xt = df_f32_on(d, x, T, H), ut = df_f32_on(d, u, T, H), bm = df_f32_on(d, batch_mean, H);
  return df_moe_center_forward(ctx, rows_per_sample, &xt, NULL, &ut, batch_mean ? &bm : NULL, err);
}

df_status df_moe_center_sample_backward(df_ctx *ctx, const float *du, int64_t T, int64_t H, int64_t rows_per_sample,
                                        float *dx, bool accumulate, df_error *err) {
  const df_device d = df_ctx_device(ctx);
  df_tensor dut = df_f32_on(d, du, T, H), dxt = df_f32_on(d, dx, T, H);
  return df_moe_center_backward(ctx, rows_per_sample, &dut, &dxt, accumulate, err);
}

df_status df_moe_center_fixed(df_ctx *ctx, const float *x, const float *mu, int64_t T, int64_t H, float *u,
                              df_error *err) {
  const df_device d = df_ctx_device(ctx);
  df_tensor xt = df_f32_on(d, x, T, H), mt = df_f32_on(d, mu, H), ut = df_f32_on(d, u, T, H);
  return df_moe_center_forward(ctx, T > 0 ? T : 1, &xt, &mt, &ut, NULL, err);
}

// ---- router --------------------------------------------------------------------------------------------

df_status df_moe_router_select(df_ctx *ctx, const df_moe_router_spec *s, const float *sel_shift, df_moe_routing *r,
                               df_error *err) {
  const df_device d = df_ctx_device(ctx);
  const int64_t T = r->T, E = s->E, k = s->k;
  const df_moe_route_desc desc = df_moe_router_desc(s);
  df_tensor sc = df_f32_on(d, r->scores, T, E), sh = df_f32_on(d, sel_shift, E);
  df_tensor ix = df_i32_on(d, r->indices, T, k), w = df_f32_on(d, r->weights, T, k), c = df_i32_on(d, r->counts, E);
  return df_moe_select(ctx, &desc, &sc, sel_shift ? &sh : NULL, &ix, &w, &c, err);
}

df_status df_moe_router_forward(df_ctx *ctx, const df_moe_router_spec *s, const df_tensor *u, const df_tensor *w,
                                const df_tensor *b, const float *sel_shift, df_moe_routing *r, df_error *err) {
  df_tensor logits = df_f32_on(u->device, r->logits, r->T, s->E), scores = df_f32_on(u->device, r->scores, r->T, s->E);
  DF_TRY(df_linear_forward(ctx, u, w, b, &logits, err));
  DF_TRY(df_moe_scores_forward(ctx, s->score_func, &logits, &scores, err));
  return df_moe_router_select(ctx, s, sel_shift, r, err);
}

// ---- backward ------------------------------------------------------------------------------------------

df_status df_moe_router_weights_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r,
                                         const float *dweights, const float *aux_row, float *dscores, df_error *err) {
  const df_device d = df_ctx_device(ctx);
  const int64_t T = r->T, E = s->E, k = s->k;
  const df_moe_route_desc desc = df_moe_router_desc(s);
  df_tensor sc = df_f32_on(d, r->scores, T, E), ix = df_i32_on(d, r->indices, T, k), w = df_f32_on(d, r->weights, T, k);
  df_tensor dw = df_f32_on(d, dweights, T, k), aux = df_f32_on(d, aux_row, E), ds = df_f32_on(d, dscores, T, E);
  return df_moe_select_backward(ctx, &desc, &sc, &ix, &w, dweights ? &dw : NULL, aux_row ? &aux : NULL, &ds, err);
}

df_status df_moe_router_backward(df_ctx *ctx, const df_moe_router_spec *s, const df_moe_routing *r, const df_tensor *u,
                                 const df_tensor *w, df_tensor *dw, const float *dweights, const float *aux_row,
                                 float *dlogits, df_tensor *du, df_error *err) {
  DF_TRY(df_moe_router_weights_backward(ctx, s, r, dweights, aux_row, dlogits, err));
  const df_device d = u->device;
  df_tensor lg = df_f32_on(d, r->logits, r->T, s->E), sc = df_f32_on(d, r->scores, r->T, s->E);
  df_tensor dl = df_f32_on(d, dlogits, r->T, s->E);
  DF_TRY(df_moe_scores_backward(ctx, s->score_func, &lg, &sc, &dl, &dl, err));
  return df_linear_backward(ctx, &dl, u, w, du, false, dw, NULL, err);
}
