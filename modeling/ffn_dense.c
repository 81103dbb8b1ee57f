// The dense SwiGLU MLP of a Qwen3 decoder layer (HF Qwen3MLP): y = down_proj(silu(gate_proj x) ⊙ up_proj x).
// Keeps gate and up pre-activations for the backward; silu(gate) ⊙ up is recomputed there.
#include <stdio.h>
#include <stdlib.h>

#include "modeling/ffn.h"

typedef struct {
  df_ffn base;
  int64_t H, I;
  df_tensor w_gate, w_up, w_down; // [I, H], [I, H], [H, I]
  df_tensor g_gate, g_up, g_down; // gradients, same shapes
} ffn_dense;

static const char *const DENSE_NAMES[3] = {"gate_proj", "up_proj", "down_proj"};

static int64_t dense_saved_elems(const df_ffn *f, int64_t rows) {
  const ffn_dense *d = (const ffn_dense *)f;
  return 2 * rows * d->I; // gate, up (R, I)
}

static int64_t dense_scratch_elems(const df_ffn *f, int64_t rows) {
  const ffn_dense *d = (const ffn_dense *)f;
  return 3 * rows * d->I; // act (later d_gate), d_act, d_up (R, I)
}

static df_status bind_one(const df_params *p, int64_t layer, const char *proj, float *weights, float *grads,
                          df_device dev, df_tensor *w, df_tensor *g, df_error *err) {
  char name[96];
  snprintf(name, sizeof name, "layers.%lld.mlp.%s.weight", (long long)layer, proj);
  return df_params_bind(p, name, weights, grads, dev, w, g, err);
}

static df_status dense_bind(df_ffn *f, const df_params *p, float *weights, float *grads, df_device dev, df_error *err) {
  ffn_dense *d = (ffn_dense *)f;
  DF_TRY(bind_one(p, f->layer, DENSE_NAMES[0], weights, grads, dev, &d->w_gate, &d->g_gate, err));
  DF_TRY(bind_one(p, f->layer, DENSE_NAMES[1], weights, grads, dev, &d->w_up, &d->g_up, err));
  return bind_one(p, f->layer, DENSE_NAMES[2], weights, grads, dev, &d->w_down, &d->g_down, err);
}

// A (rows, cols) view of x's storage dtype at element offset off of p (the saved and scratch buffers hold elements of
// the activations' dtype).
static df_tensor rows_view(const df_tensor *x, const float *p, int64_t off, int64_t rows, int64_t cols) {
  char *at = (char *)p + off * (int64_t)df_dtype_size(x->dtype);
  return df_view(at, x->dtype, x->device, 2, (const int64_t[]){rows, cols});
}

static df_status dense_forward(df_ffn *f, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved, float *scratch,
                               df_error *err) {
  ffn_dense *d = (ffn_dense *)f;
  const int64_t R = df_numel(x) / d->H;
  df_tensor gate = rows_view(x, saved, 0, R, d->I);      // (R, I)
  df_tensor up = rows_view(x, saved, R * d->I, R, d->I); // (R, I)
  df_tensor act = rows_view(x, scratch, 0, R, d->I);     // (R, I) silu(gate) ⊙ up
  DF_TRY(df_linear_forward(ctx, x, &d->w_gate, NULL, &gate, err));
  DF_TRY(df_linear_forward(ctx, x, &d->w_up, NULL, &up, err));
  DF_TRY(df_swiglu_forward(ctx, &gate, &up, 0.0f, &act, err));
  return df_linear_forward(ctx, &act, &d->w_down, NULL, y, err);
}

static df_status dense_backward(df_ffn *f, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                                bool accumulate_dx, const float *saved, float *scratch, df_error *err) {
  ffn_dense *d = (ffn_dense *)f;
  const int64_t R = df_numel(x) / d->H, RI = R * d->I;
  df_tensor gate = rows_view(x, saved, 0, R, d->I);        // (R, I)
  df_tensor up = rows_view(x, saved, RI, R, d->I);         // (R, I)
  df_tensor act = rows_view(x, scratch, 0, R, d->I);       // (R, I), reused for d_gate
  df_tensor d_act = rows_view(x, scratch, RI, R, d->I);    // (R, I)
  df_tensor d_up = rows_view(x, scratch, 2 * RI, R, d->I); // (R, I)
  DF_TRY(df_swiglu_forward(ctx, &gate, &up, 0.0f, &act, err));
  DF_TRY(df_linear_backward(ctx, dy, &act, &d->w_down, &d_act, false, &d->g_down, NULL, err));
  df_tensor d_gate = act; // act is dead once down_proj's weight gradient is taken
  DF_TRY(df_swiglu_backward(ctx, &d_act, &gate, &up, 0.0f, &d_gate, &d_up, err));
  DF_TRY(df_linear_backward(ctx, &d_gate, x, &d->w_gate, dx, accumulate_dx, &d->g_gate, NULL, err));
  return df_linear_backward(ctx, &d_up, x, &d->w_up, dx, true, &d->g_up, NULL, err);
}

static void dense_destroy(df_ffn *f) { free(f); }

static const df_ffn_vtable DENSE_VT = {.kind = "dense",
                                       .saved_elems = dense_saved_elems,
                                       .scratch_elems = dense_scratch_elems,
                                       .bind = dense_bind,
                                       .forward = dense_forward,
                                       .backward = dense_backward,
                                       .destroy = dense_destroy};

static df_status add_weight(df_params *p, int64_t layer, const char *proj, int64_t rows, int64_t cols, df_error *err) {
  char name[96];
  snprintf(name, sizeof name, "layers.%lld.mlp.%s.weight", (long long)layer, proj);
  const df_param_spec spec = {.name = name,
                              .role = DF_ROLE_WEIGHT,
                              .ndim = 2,
                              .shape = (const int64_t[]){rows, cols},
                              .dtype = DF_F32,
                              .trainable = true,
                              .weight_decay = true};
  return df_params_add(p, &spec, err);
}

df_status df_ffn_dense_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err) {
  *out = NULL;
  const int64_t H = cfg->hidden_size, I = cfg->intermediate_size;
  if (H <= 0 || I <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "intermediate_size", NULL, "the MLP needs hidden_size, intermediate_size > 0");
  DF_TRY(add_weight(p, layer, DENSE_NAMES[0], I, H, err));
  DF_TRY(add_weight(p, layer, DENSE_NAMES[1], I, H, err));
  DF_TRY(add_weight(p, layer, DENSE_NAMES[2], H, I, err));
  ffn_dense *d = calloc(1, sizeof *d);
  if (!d) return DF_FAIL(err, DF_ERR_NOMEM, "mlp", NULL, "cannot allocate the MLP of layer %lld", (long long)layer);
  d->base = (df_ffn){.vt = &DENSE_VT, .layer = layer};
  d->H = H;
  d->I = I;
  *out = &d->base;
  return DF_OK;
}

// A draft whose config resolved a kind (e.g. "moe" for moe_preset) gets that kind's FFN in every decoder layer.
df_status df_ffn_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err) {
  if (cfg->ffn_kind) return cfg->ffn_kind->create(cfg, layer, p, out, err);
  return df_ffn_dense_create(cfg, layer, p, out, err);
}
