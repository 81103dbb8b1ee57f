// The shared expert, composed of ops (linear, SwiGLU, df_moe_sigmoid_scale, df_moe_scale_rows,
// df_moe_gate_backward). The gate is one scalar per token applied to the activations before the down projection:
// ∂ζ_t = z_t(1 − z_t) · (dy_t·w2) · a_t, where a = swiglu(gate, up) is unscaled.
#include "moe/shared_expert.h"

static df_tensor mat(const float *p, df_device dev, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, dev, 2, (const int64_t[]){rows, cols});
}

int64_t df_moe_shared_saved_elems(const df_moe_shared_spec *s, int64_t T) { return 2 * T * s->S + (s->gated ? T : 0); }

int64_t df_moe_shared_scratch_elems(const df_moe_shared_spec *s, int64_t T) {
  return 3 * T * s->S + T; // activations, scaled activations (then d gate), d act (then d up); d ζ
}

df_moe_shared_saved df_moe_shared_saved_at(const df_moe_shared_spec *s, int64_t T, float *mem) {
  return (df_moe_shared_saved){.gate = mem, .up = mem + T * s->S, .z = s->gated ? mem + 2 * T * s->S : NULL};
}

df_status df_moe_shared_forward(df_ctx *ctx, const df_moe_shared_spec *s, const df_moe_shared_params *p,
                                const df_tensor *x, const df_moe_shared_saved *sv, float *scratch, df_tensor *y,
                                df_error *err) {
  const df_device dev = x->device;
  const int64_t H = s->H, S = s->S, T = df_numel(x) / H;
  df_tensor x2 = mat(x->data, dev, T, H), y2 = mat(y->data, dev, T, H);
  df_tensor g = mat(sv->gate, dev, T, S), u = mat(sv->up, dev, T, S), a = mat(scratch, dev, T, S);
  DF_TRY(df_linear_forward(ctx, &x2, &p->w1, NULL, &g, err));
  DF_TRY(df_linear_forward(ctx, &x2, &p->w3, NULL, &u, err));
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &a, err));
  if (s->gated) {
    df_tensor zt = mat(sv->z, dev, T, 1);
    DF_TRY(df_linear_forward(ctx, &x2, &p->gate, NULL, &zt, err));
    DF_TRY(df_moe_sigmoid_scale(ctx, &zt, &a, err)); // z = sigmoid(ζ), then a *= z
  }
  return df_matmul(ctx, &a, false, &p->w2, true, 1.0f, 1.0f, &y2, err); // y += a·w2ᵀ
}

df_status df_moe_shared_backward(df_ctx *ctx, const df_moe_shared_spec *s, df_moe_shared_params *p, const df_tensor *x,
                                 const df_tensor *dy, const df_moe_shared_saved *sv, float *scratch, df_tensor *dx,
                                 df_error *err) {
  const df_device dev = x->device;
  const int64_t H = s->H, S = s->S, T = df_numel(x) / H;
  float *act = scratch, *hs = act + T * S, *dact = hs + T * S, *dzeta = dact + T * S; // (T, S) ×3, (T)
  df_tensor x2 = mat(x->data, dev, T, H), dy2 = mat(dy->data, dev, T, H), dx2 = mat(dx->data, dev, T, H);
  df_tensor g = mat(sv->gate, dev, T, S), u = mat(sv->up, dev, T, S), a = mat(act, dev, T, S);
  df_tensor h = mat(hs, dev, T, S), da = mat(dact, dev, T, S);
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &a, err));
  DF_TRY(df_copy(ctx, hs, dev, act, dev, sizeof(float) * (size_t)(T * S), err));
  df_tensor z = df_f32_on(dev, sv->z, T);
  if (s->gated) DF_TRY(df_moe_scale_rows(ctx, &h, &z, NULL, err));
  // Down projection: e = dy·w2 (= ∂a when ungated); dw2 += dyᵀ·h.
  DF_TRY(df_linear_backward(ctx, &dy2, &h, &p->w2, &da, false, &p->g2, NULL, err));
  if (s->gated) { // ∂ζ_t = z_t(1 − z_t)·(e_t·a_t), then ∂a = z·e
    df_tensor dz = df_f32_on(dev, dzeta, T);
    DF_TRY(df_moe_gate_backward(ctx, true, &da, &a, &z, NULL, &dz, err));
  }
  df_tensor dg = mat(hs, dev, T, S), du = mat(act, dev, T, S); // h and a are dead now
  DF_TRY(df_swiglu_backward(ctx, &da, &g, &u, s->swiglu_limit, &dg, &du, err));
  DF_TRY(df_linear_backward(ctx, &dg, &x2, &p->w1, &dx2, true, &p->g1, NULL, err));
  DF_TRY(df_linear_backward(ctx, &du, &x2, &p->w3, &dx2, true, &p->g3, NULL, err));
  if (!s->gated) return DF_OK;
  df_tensor dz = mat(dzeta, dev, T, 1);
  return df_linear_backward(ctx, &dz, &x2, &p->gate, &dx2, true, &p->ggate, NULL, err);
}
