// One DFlash decoder layer (pre-norm Qwen3 block whose keys/values cover [context ; block]): parameters,
// forward and backward through kernels/ops.h only. Context rows and block rows of one sample are adjacent
// in the key buffer, so the k/v projections run per sample on two contiguous row ranges.
#include "modeling/draft_layer.h"

#include <math.h>
#include <stdio.h>

// ---- parameters ----------------------------------------------------------------------------------------

// self_attn.<proj>.weight [rows, cols], then .bias [rows] when the config has attention_bias.
static df_status add_proj(df_params *p, int64_t i, const char *proj, int64_t rows, int64_t cols, bool bias,
                          df_error *err) {
  char name[96];
  snprintf(name, sizeof name, "layers.%lld.self_attn.%s.weight", (long long)i, proj);
  DF_TRY(df_params_add_f32(p, name, DF_ROLE_WEIGHT, 2, rows, cols, err));
  if (!bias) return DF_OK;
  snprintf(name, sizeof name, "layers.%lld.self_attn.%s.bias", (long long)i, proj);
  return df_params_add_f32(p, name, DF_ROLE_BIAS, 1, rows, 0, err);
}

static df_status add_norm(df_params *p, int64_t i, const char *what, int64_t dim, df_error *err) {
  char name[96];
  snprintf(name, sizeof name, "layers.%lld.%s.weight", (long long)i, what);
  return df_params_add_f32(p, name, DF_ROLE_NORM, 1, dim, 0, err);
}

df_status draft_layer_add_params(const df_draft_config *cfg, int64_t i, df_params *p, draft_layer *L, df_error *err) {
  const int64_t H = cfg->hidden_size, hd = cfg->head_dim;
  const int64_t qd = cfg->num_attention_heads * hd, kvd = cfg->num_key_value_heads * hd;
  const bool bias = cfg->attention_bias;
  *L = (draft_layer){
      .index = i, .has_bias = bias, .window = df_draft_config_layer_is_sliding(cfg, i) ? cfg->sliding_window : 0};
  DF_TRY(add_norm(p, i, "input_layernorm", H, err));
  DF_TRY(add_proj(p, i, "q_proj", qd, H, bias, err));
  DF_TRY(add_proj(p, i, "k_proj", kvd, H, bias, err));
  DF_TRY(add_proj(p, i, "v_proj", kvd, H, bias, err));
  DF_TRY(add_proj(p, i, "o_proj", H, qd, bias, err));
  DF_TRY(add_norm(p, i, "self_attn.q_norm", hd, err));
  DF_TRY(add_norm(p, i, "self_attn.k_norm", hd, err));
  DF_TRY(add_norm(p, i, "post_attention_layernorm", H, err));
  return df_ffn_create(cfg, i, p, &L->ffn, err);
}

static df_status bind_view(const df_params *p, int64_t i, const char *what, float *weights, float *grads, df_device dev,
                           dflash_pview *v, df_error *err) {
  char name[96];
  snprintf(name, sizeof name, "layers.%lld.%s", (long long)i, what);
  return df_params_bind(p, name, weights, grads, dev, &v->w, &v->g, err);
}

static df_status bind_proj(const df_params *p, int64_t i, const char *proj, bool bias, float *weights, float *grads,
                           df_device dev, dflash_pview *w, dflash_pview *b, df_error *err) {
  char what[64];
  snprintf(what, sizeof what, "self_attn.%s.weight", proj);
  DF_TRY(bind_view(p, i, what, weights, grads, dev, w, err));
  if (!bias) return DF_OK;
  snprintf(what, sizeof what, "self_attn.%s.bias", proj);
  return bind_view(p, i, what, weights, grads, dev, b, err);
}

df_status draft_layer_bind(draft_layer *L, const df_params *p, float *weights, float *grads, df_device dev,
                           df_error *err) {
  const int64_t i = L->index;
  const bool b = L->has_bias;
  DF_TRY(bind_view(p, i, "input_layernorm.weight", weights, grads, dev, &L->in_norm, err));
  DF_TRY(bind_proj(p, i, "q_proj", b, weights, grads, dev, &L->q_w, &L->q_b, err));
  DF_TRY(bind_proj(p, i, "k_proj", b, weights, grads, dev, &L->k_w, &L->k_b, err));
  DF_TRY(bind_proj(p, i, "v_proj", b, weights, grads, dev, &L->v_w, &L->v_b, err));
  DF_TRY(bind_proj(p, i, "o_proj", b, weights, grads, dev, &L->o_w, &L->o_b, err));
  DF_TRY(bind_view(p, i, "self_attn.q_norm.weight", weights, grads, dev, &L->q_norm, err));
  DF_TRY(bind_view(p, i, "self_attn.k_norm.weight", weights, grads, dev, &L->k_norm, err));
  DF_TRY(bind_view(p, i, "post_attention_layernorm.weight", weights, grads, dev, &L->post_norm, err));
  return L->ffn->vt->bind(L->ffn, p, weights, grads, dev, err);
}

void draft_layer_free(draft_layer *L) {
  df_ffn_free(L->ffn);
  L->ffn = NULL;
}

// ---- views ---------------------------------------------------------------------------------------------

// Views of storage-dtype activations (sh->dt), of fp32 statistics (v3f, vrow), and n storage elements past p.
static df_tensor v2(const dflash_shared *sh, const void *p, int64_t d0, int64_t d1) {
  return df_view((void *)p, sh->dt, sh->dev, 2, (const int64_t[]){d0, d1});
}
static df_tensor v3(const dflash_shared *sh, const void *p, int64_t d0, int64_t d1, int64_t d2) {
  return df_view((void *)p, sh->dt, sh->dev, 3, (const int64_t[]){d0, d1, d2});
}
static df_tensor v4(const dflash_shared *sh, const void *p, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  return df_view((void *)p, sh->dt, sh->dev, 4, (const int64_t[]){d0, d1, d2, d3});
}
static df_tensor v3f(const float *p, df_device dev, int64_t d0, int64_t d1, int64_t d2) {
  return df_view((void *)p, DF_F32, dev, 3, (const int64_t[]){d0, d1, d2});
}
static float *at(const dflash_shared *sh, const void *p, int64_t n) {
  return (float *)((char *)p + n * (int64_t)df_dtype_size(sh->dt));
}
static df_tensor vi32(const int32_t *p, df_device dev, int ndim, int64_t d0, int64_t d1) {
  return df_view((void *)p, DF_I32, dev, ndim, (const int64_t[]){d0, d1});
}
static df_tensor vrow(const float *p, df_device dev, int64_t n) {
  return df_view((void *)p, DF_F32, dev, 1, (const int64_t[]){n});
}

static const df_tensor *bias_or_null(const draft_layer *L, const dflash_pview *b) { return L->has_bias ? &b->w : NULL; }
static df_tensor *dbias_or_null(const draft_layer *L, dflash_pview *b) { return L->has_bias ? &b->g : NULL; }

static df_block_attn_desc attn_desc(const draft_layer *L, const dflash_dims *d) {
  return (df_block_attn_desc){
      .context_len = d->S, .block_size = d->bs, .window = L->window, .scale = (float)(1.0 / sqrt((double)d->hd))};
}

// ---- forward -------------------------------------------------------------------------------------------

// dst (B, S+Q, width) = proj over [ctx rows ; block rows x] per sample (context rows first).
static df_status kv_proj_forward(df_ctx *ctx, const draft_layer *L, const dflash_pview *w, const dflash_pview *b,
                                 const dflash_dims *d, const dflash_shared *sh, const float *x, float *dst,
                                 df_error *err) {
  const int64_t width = w->w.shape[0], H = d->H;
  for (int64_t s = 0; s < d->B; s++) {
    float *row0 = at(sh, dst, s * (d->S + d->Q) * width);
    df_tensor xc = v2(sh, at(sh, sh->ctx, s * d->S * H), d->S, H), yc = v2(sh, row0, d->S, width);
    df_tensor xb = v2(sh, at(sh, x, s * d->Q * H), d->Q, H), yb = v2(sh, at(sh, row0, d->S * width), d->Q, width);
    DF_TRY(df_linear_forward(ctx, &xc, &w->w, bias_or_null(L, b), &yc, err));
    DF_TRY(df_linear_forward(ctx, &xb, &w->w, bias_or_null(L, b), &yb, err));
  }
  return DF_OK;
}

// x = input_layernorm(h_in); q = rope(q_norm(q_proj x)); k = rope(k_norm(k_proj [ctx ; x])); v = v_proj [ctx ; x].
static df_status qkv_forward(df_ctx *ctx, const draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                             const float *h_in, draft_layer_acts *a, df_error *err) {
  const df_device dev = sh->dev;
  const int64_t T = d->T, KV = d->KV, H = d->H, hd = d->hd, nH = d->nH, nKV = d->nKV;
  df_tensor h = v2(sh, h_in, T, H), x = v2(sh, a->x, T, H), r_in = vrow(a->rstd_in, dev, T);
  DF_TRY(df_rmsnorm_forward(ctx, &h, &L->in_norm.w, sh->eps, &x, &r_in, err));

  df_tensor q_raw = v2(sh, a->q_raw, T, nH * hd), q = v3(sh, a->q, T, nH, hd), q_r = vrow(a->q_rstd, dev, T * nH);
  df_tensor pos_q = vi32(sh->pos_q, dev, 1, T, 0), inv = vrow(sh->inv_freq, dev, hd / 2);
  DF_TRY(df_linear_forward(ctx, &x, &L->q_w.w, bias_or_null(L, &L->q_b), &q_raw, err));
  DF_TRY(df_rmsnorm_forward(ctx, &q_raw, &L->q_norm.w, sh->eps, &q, &q_r, err));
  DF_TRY(df_rope_forward(ctx, &q, &pos_q, &inv, sh->mscale, &q, err));

  DF_TRY(kv_proj_forward(ctx, L, &L->k_w, &L->k_b, d, sh, a->x, a->k_raw, err));
  DF_TRY(kv_proj_forward(ctx, L, &L->v_w, &L->v_b, d, sh, a->x, a->v, err));
  df_tensor k_raw = v2(sh, a->k_raw, KV, nKV * hd), k = v3(sh, a->k, KV, nKV, hd);
  df_tensor k_r = vrow(a->k_rstd, dev, KV * nKV), pos_kv = vi32(sh->pos_kv, dev, 1, KV, 0);
  DF_TRY(df_rmsnorm_forward(ctx, &k_raw, &L->k_norm.w, sh->eps, &k, &k_r, err));
  return df_rope_forward(ctx, &k, &pos_kv, &inv, sh->mscale, &k, err);
}

df_status draft_layer_forward(df_ctx *ctx, const draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                              const float *h_in, float *h_out, draft_layer_acts *a, dflash_scratch *scr,
                              df_error *err) {
  const df_device dev = sh->dev;
  const int64_t T = d->T, H = d->H, Q = d->Q, SQ = d->S + d->Q, nH = d->nH, nKV = d->nKV, hd = d->hd;
  DF_TRY(qkv_forward(ctx, L, d, sh, h_in, a, err));

  const df_block_attn_desc desc = attn_desc(L, d);
  df_tensor q = v4(sh, a->q, d->B, Q, nH, hd), k = v4(sh, a->k, d->B, SQ, nKV, hd);
  df_tensor v = v4(sh, a->v, d->B, SQ, nKV, hd), out = v4(sh, a->attn, d->B, Q, nH, hd);
  df_tensor lse = v3f(a->lse, dev, d->B, nH, Q);
  df_tensor anchors = vi32(sh->anchors, dev, 2, d->B, d->N);
  df_tensor keep = df_view((void *)sh->keep, DF_U8, dev, 2, (const int64_t[]){d->B, d->N});
  DF_TRY(df_block_attn_forward(ctx, &desc, &q, &k, &v, &anchors, &keep, &out, &lse, err));

  // h_mid = h_in + o_proj(attn); y = post_attention_layernorm(h_mid); h_out = h_mid + ffn(y).
  df_tensor attn = v2(sh, a->attn, T, nH * hd), h = v2(sh, h_in, T, H), h_mid = v2(sh, a->h_mid, T, H);
  DF_TRY(df_linear_forward(ctx, &attn, &L->o_w.w, bias_or_null(L, &L->o_b), &h_mid, err));
  DF_TRY(df_axpy(ctx, 1.0f, &h, &h_mid, err));
  df_tensor y = v2(sh, a->y, T, H), r_post = vrow(a->rstd_post, dev, T), ho = v2(sh, h_out, T, H);
  DF_TRY(df_rmsnorm_forward(ctx, &h_mid, &L->post_norm.w, sh->eps, &y, &r_post, err));
  DF_TRY(L->ffn->vt->forward(L->ffn, ctx, &y, &ho, a->ffn_saved, scr->ffn, err));
  return df_axpy(ctx, 1.0f, &h_mid, &ho, err);
}

// ---- backward ------------------------------------------------------------------------------------------

// Backward of kv_proj_forward: dsrc (B, S+Q, width) → dx (B, Q, H) added, dctx (B, S, H) written or added.
static df_status kv_proj_backward(df_ctx *ctx, draft_layer *L, dflash_pview *w, dflash_pview *b, const dflash_dims *d,
                                  const dflash_shared *sh, const float *x, const float *dsrc, float *dx, float *dctx,
                                  bool write_ctx, df_error *err) {
  const int64_t width = w->w.shape[0], H = d->H;
  for (int64_t s = 0; s < d->B; s++) {
    const float *row0 = at(sh, dsrc, s * (d->S + d->Q) * width);
    df_tensor dyc = v2(sh, row0, d->S, width), xc = v2(sh, at(sh, sh->ctx, s * d->S * H), d->S, H);
    df_tensor dxc = v2(sh, at(sh, dctx, s * d->S * H), d->S, H);
    df_tensor dyb = v2(sh, at(sh, row0, d->S * width), d->Q, width), xb = v2(sh, at(sh, x, s * d->Q * H), d->Q, H);
    df_tensor dxb = v2(sh, at(sh, dx, s * d->Q * H), d->Q, H);
    DF_TRY(df_linear_backward(ctx, &dyc, &xc, &w->w, &dxc, !write_ctx, &w->g, dbias_or_null(L, b), err));
    DF_TRY(df_linear_backward(ctx, &dyb, &xb, &w->w, &dxb, true, &w->g, dbias_or_null(L, b), err));
  }
  return DF_OK;
}

// From d(attention out) in scr->dattn down to ∂/∂x in scr->dtmp (written) and the context gradient.
static df_status qkv_backward(df_ctx *ctx, draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                              const draft_layer_acts *a, dflash_scratch *scr, bool first_ctx_write, df_error *err) {
  const df_device dev = sh->dev;
  const int64_t T = d->T, KV = d->KV, Q = d->Q, SQ = d->S + d->Q, H = d->H, nH = d->nH, nKV = d->nKV, hd = d->hd;
  const df_block_attn_desc desc = attn_desc(L, d);
  df_tensor q = v4(sh, a->q, d->B, Q, nH, hd), k = v4(sh, a->k, d->B, SQ, nKV, hd);
  df_tensor v = v4(sh, a->v, d->B, SQ, nKV, hd), out = v4(sh, a->attn, d->B, Q, nH, hd);
  df_tensor lse = v3f(a->lse, dev, d->B, nH, Q), dout = v4(sh, scr->dattn, d->B, Q, nH, hd);
  df_tensor dq = v4(sh, scr->dq, d->B, Q, nH, hd), dk = v4(sh, scr->dk, d->B, SQ, nKV, hd);
  df_tensor dv = v4(sh, scr->dv, d->B, SQ, nKV, hd), anchors = vi32(sh->anchors, dev, 2, d->B, d->N);
  df_tensor keep = df_view((void *)sh->keep, DF_U8, dev, 2, (const int64_t[]){d->B, d->N});
  DF_TRY(df_block_attn_backward(ctx, &desc, &q, &k, &v, &anchors, &keep, &out, &lse, &dout, &dq, &dk, &dv, err));

  // RoPE backward in place, then the per-head norms: dq → d(q_raw) (into dattn, now dead), dk → d(k_raw).
  df_tensor inv = vrow(sh->inv_freq, dev, hd / 2);
  df_tensor pos_q = vi32(sh->pos_q, dev, 1, T, 0), pos_kv = vi32(sh->pos_kv, dev, 1, KV, 0);
  df_tensor dq3 = v3(sh, scr->dq, T, nH, hd), dk3 = v3(sh, scr->dk, KV, nKV, hd);
  DF_TRY(df_rope_backward(ctx, &dq3, &pos_q, &inv, sh->mscale, &dq3, err));
  DF_TRY(df_rope_backward(ctx, &dk3, &pos_kv, &inv, sh->mscale, &dk3, err));
  df_tensor q_raw = v2(sh, a->q_raw, T, nH * hd), dq_raw = v2(sh, scr->dattn, T, nH * hd);
  df_tensor q_r = vrow(a->q_rstd, dev, T * nH), k_r = vrow(a->k_rstd, dev, KV * nKV);
  df_tensor k_raw = v2(sh, a->k_raw, KV, nKV * hd), dk_raw = v2(sh, scr->dk_raw, KV, nKV * hd);
  DF_TRY(df_rmsnorm_backward(ctx, &dq3, &q_raw, &L->q_norm.w, &q_r, &dq_raw, false, &L->q_norm.g, err));
  DF_TRY(df_rmsnorm_backward(ctx, &dk3, &k_raw, &L->k_norm.w, &k_r, &dk_raw, false, &L->k_norm.g, err));

  // Projections: q from the block rows only; k and v from context and block rows.
  df_tensor x = v2(sh, a->x, T, H), dx = v2(sh, scr->dtmp, T, H);
  DF_TRY(df_linear_backward(ctx, &dq_raw, &x, &L->q_w.w, &dx, false, &L->q_w.g, dbias_or_null(L, &L->q_b), err));
  DF_TRY(
      kv_proj_backward(ctx, L, &L->k_w, &L->k_b, d, sh, a->x, scr->dk_raw, scr->dtmp, scr->dctx, first_ctx_write, err));
  return kv_proj_backward(ctx, L, &L->v_w, &L->v_b, d, sh, a->x, scr->dv, scr->dtmp, scr->dctx, false, err);
}

df_status draft_layer_backward(df_ctx *ctx, draft_layer *L, const dflash_dims *d, const dflash_shared *sh,
                               const float *h_in, const draft_layer_acts *a, dflash_scratch *scr, bool first_ctx_write,
                               df_error *err) {
  const df_device dev = sh->dev;
  const int64_t T = d->T, H = d->H, qd = d->nH * d->hd;
  df_tensor dh = v2(sh, scr->dh, T, H), dtmp = v2(sh, scr->dtmp, T, H);

  // h_out = h_mid + ffn(y): dh passes through; ∂y = ffn backward; ∂h_mid += post_norm backward of ∂y.
  df_tensor y = v2(sh, a->y, T, H), h_mid = v2(sh, a->h_mid, T, H), r_post = vrow(a->rstd_post, dev, T);
  DF_TRY(L->ffn->vt->backward(L->ffn, ctx, &y, &dh, &dtmp, false, a->ffn_saved, scr->ffn, err));
  DF_TRY(df_rmsnorm_backward(ctx, &dtmp, &h_mid, &L->post_norm.w, &r_post, &dh, true, &L->post_norm.g, err));

  // h_mid = h_in + o_proj(attn).
  df_tensor attn = v2(sh, a->attn, T, qd), dattn = v2(sh, scr->dattn, T, qd);
  DF_TRY(df_linear_backward(ctx, &dh, &attn, &L->o_w.w, &dattn, false, &L->o_w.g, dbias_or_null(L, &L->o_b), err));
  DF_TRY(qkv_backward(ctx, L, d, sh, a, scr, first_ctx_write, err));

  // x = input_layernorm(h_in): ∂h_in += norm backward of ∂x.
  df_tensor h = v2(sh, h_in, T, H), r_in = vrow(a->rstd_in, dev, T);
  return df_rmsnorm_backward(ctx, &dtmp, &h, &L->in_norm.w, &r_in, &dh, true, &L->in_norm.g, err);
}
