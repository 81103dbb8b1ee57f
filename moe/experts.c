// Grouped routed experts, composed of ops: the dispatch plan (df_moe_plan), the gather and the weighted combine
// (the embedding ops: a row gather by int32 ids and its ordered scatter-add), the grouped expert GEMMs
// (df_moe_grouped_*: one GEMM per expert segment; the kernel reads the segment offsets), SwiGLU, and the
// combine-weight scaling and its backward (df_moe_scale_rows, df_moe_gate_backward). Each token receives its k expert
// outputs in sorted-position order (expert id, then slot), so the routed sum is the same for any thread count.
// Nothing here touches tensor data: every buffer may live on the device.
#include "moe/experts.h"

static df_tensor mat(const float *p, df_device dev, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, dev, 2, (const int64_t[]){rows, cols});
}

df_status df_moe_slots_plan(df_ctx *ctx, const df_moe_experts_spec *s, int64_t T, const int32_t *indices,
                            const int32_t *counts, df_moe_slots *d, df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  const int64_t E = s->E, Tk = T * s->k;
  d->T = T;
  df_tensor ix = df_i32_on(dev, indices, Tk), c = df_i32_on(dev, counts, E), off = df_i32_on(dev, d->offsets, E + 1);
  df_tensor sl = df_i32_on(dev, d->slot, Tk), tok = df_i32_on(dev, d->token, Tk);
  return df_moe_plan(ctx, s->k, &ix, &c, &off, &sl, &tok, err);
}

int64_t df_moe_experts_forward_scratch_elems(const df_moe_experts_spec *s, int64_t T) {
  const int64_t Tk = T * s->k;
  return Tk * s->H + Tk * s->I; // rows (then expert outputs) (Tk, H); activations (Tk, I)
}

int64_t df_moe_experts_backward_scratch_elems(const df_moe_experts_spec *s, int64_t T) {
  const int64_t Tk = T * s->k;
  return 2 * Tk * s->H + 3 * Tk * s->I; // rows, d(outputs) then d(rows) (Tk, H); act, d(act), d(up) (Tk, I)
}

// h[pos] *= w[slot[pos]] over (Tk, I) rows.
static df_status scale_rows(df_ctx *ctx, float *h, const float *w, const int32_t *slot, int64_t Tk, int64_t I,
                            df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  df_tensor ht = mat(h, dev, Tk, I), wt = df_f32_on(dev, w, Tk), st = df_i32_on(dev, slot, Tk);
  return df_moe_scale_rows(ctx, &ht, &wt, &st, err);
}

// The (E, out, in) stacked weights' grouped GEMM over the sorted rows of one pass.
static df_status grouped_fwd(df_ctx *ctx, const df_moe_slots *d, const float *x, int64_t in, const df_tensor *w,
                             float *y, int64_t out, int64_t Tk, df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  df_tensor xt = mat(x, dev, Tk, in), yt = mat(y, dev, Tk, out), off = df_i32_on(dev, d->offsets, w->shape[0] + 1);
  return df_moe_grouped_forward(ctx, &xt, w, &off, &yt, err);
}

static df_status grouped_bwd(df_ctx *ctx, const df_moe_slots *d, const float *dy, int64_t out, const float *x,
                             int64_t in, const df_tensor *w, float *dx, bool acc, const df_tensor *dw, int64_t Tk,
                             df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  df_tensor dyt = mat(dy, dev, Tk, out), xt = mat(x, dev, Tk, in), dxt = mat(dx, dev, Tk, in);
  df_tensor off = df_i32_on(dev, d->offsets, w->shape[0] + 1), dwt = dw ? *dw : (df_tensor){0};
  return df_moe_grouped_backward(ctx, &dyt, &xt, w, &off, &dxt, acc, dw ? &dwt : NULL, err);
}

df_status df_moe_experts_forward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                 const df_tensor *x, const int32_t *indices, const float *weights,
                                 const int32_t *counts, df_moe_slots *d, float *scratch, df_tensor *y, df_error *err) {
  const df_device dev = x->device;
  const int64_t H = s->H, I = s->I, T = df_numel(x) / H, Tk = T * s->k;
  df_tensor y2 = mat(y->data, dev, T, H);
  DF_TRY(df_fill(ctx, &y2, 0.0, err));
  DF_TRY(df_moe_slots_plan(ctx, s, T, indices, counts, d, err));
  if (Tk == 0) return DF_OK;
  float *rows = scratch, *act = scratch + Tk * H; // gathered x rows, then the expert outputs; activations
  df_tensor x2 = mat(x->data, dev, T, H), xs = mat(rows, dev, Tk, H);
  df_tensor tok = df_i32_on(dev, d->token, Tk);
  DF_TRY(df_embedding_forward(ctx, &x2, &tok, &xs, err));
  DF_TRY(grouped_fwd(ctx, d, rows, H, &p->w1, d->gate, I, Tk, err)); // gate = x_e·w1[e]ᵀ
  DF_TRY(grouped_fwd(ctx, d, rows, H, &p->w3, d->up, I, Tk, err));   // up = x_e·w3[e]ᵀ
  df_tensor g = mat(d->gate, dev, Tk, I), u = mat(d->up, dev, Tk, I), h = mat(act, dev, Tk, I);
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &h, err));
  DF_TRY(scale_rows(ctx, act, weights, d->slot, Tk, I, err));    // the combine weight, before the down proj.
  DF_TRY(grouped_fwd(ctx, d, act, I, &p->w2, rows, H, Tk, err)); // expert outputs replace the gathered rows
  df_tensor ys = mat(rows, dev, Tk, H);
  return df_embedding_backward(ctx, &ys, &tok, &y2, err); // the ordered scatter-add: the weighted combine
}

df_status df_moe_experts_backward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                  const df_tensor *x, const df_tensor *dy, const float *weights, const df_moe_slots *d,
                                  float *scratch, float *dweights, df_tensor *dx, df_error *err) {
  const df_device dev = x->device;
  const int64_t H = s->H, I = s->I, T = d->T, Tk = T * s->k;
  if (Tk == 0) return DF_OK;
  float *rows = scratch, *drows = scratch + Tk * H; // gathered x rows; gathered dy rows, then d(rows)
  float *act = drows + Tk * H, *dact = act + Tk * I, *dup = dact + Tk * I;
  df_tensor tok = df_i32_on(dev, d->token, Tk);
  df_tensor x2 = mat(x->data, dev, T, H), dy2 = mat(dy->data, dev, T, H);
  df_tensor xs = mat(rows, dev, Tk, H), dys = mat(drows, dev, Tk, H);
  DF_TRY(df_embedding_forward(ctx, &x2, &tok, &xs, err));
  DF_TRY(df_embedding_forward(ctx, &dy2, &tok, &dys, err));
  df_tensor g = mat(d->gate, dev, Tk, I), u = mat(d->up, dev, Tk, I), a = mat(act, dev, Tk, I);
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &a, err)); // unscaled activations
  DF_TRY(df_copy(ctx, dact, dev, act, dev, sizeof(float) * (size_t)(Tk * I), err));
  DF_TRY(scale_rows(ctx, dact, weights, d->slot, Tk, I, err)); // h = w·a, the down projection's input
  const bool fr = p->frozen;
  // dw2[e] += dy_eᵀ·h_e, then dh_e = dy_e·w2[e] overwrites h_e.
  DF_TRY(grouped_bwd(ctx, d, drows, H, dact, I, &p->w2, dact, false, fr ? NULL : &p->g2, Tk, err));
  // h = w·a: ∂w = dh·a (the dot with the unscaled activation), ∂a = w·dh.
  df_tensor dh = mat(dact, dev, Tk, I), wt = df_f32_on(dev, weights, Tk), sl = df_i32_on(dev, d->slot, Tk);
  df_tensor dwt = df_f32_on(dev, dweights, Tk);
  DF_TRY(df_moe_gate_backward(ctx, false, &dh, &a, &wt, &sl, &dwt, err));
  df_tensor da = mat(dact, dev, Tk, I), dg = mat(act, dev, Tk, I), du = mat(dup, dev, Tk, I);
  DF_TRY(df_swiglu_backward(ctx, &da, &g, &u, s->swiglu_limit, &dg, &du, err));
  // d(rows)_e = dgate_e·w1[e] + dup_e·w3[e] (into the dead dy rows); dw1[e], dw3[e] += ...ᵀ·x_e.
  DF_TRY(grouped_bwd(ctx, d, act, I, rows, H, &p->w1, drows, false, fr ? NULL : &p->g1, Tk, err));
  DF_TRY(grouped_bwd(ctx, d, dup, I, rows, H, &p->w3, drows, true, fr ? NULL : &p->g3, Tk, err));
  df_tensor dx2 = mat(dx->data, dev, T, H);
  return df_embedding_backward(ctx, &dys, &tok, &dx2, err);
}
