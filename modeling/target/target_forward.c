// The target forward of T new tokens through the op interface: embedding, per layer (input norm, q/k/v
// projections written straight into the KV cache, per-head q/k norm, RoPE, causal attention over the cache,
// o_proj + residual, post norm, SwiGLU MLP + residual), final norm, LM head rows and greedy argmax.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/causal_attn.h"
#include "modeling/target/target_internal.h"

static df_tensor v2(float *p, df_device dev, int64_t d0, int64_t d1) {
  return df_view(p, DF_F32, dev, 2, (const int64_t[]){d0, d1});
}
static df_tensor v3(float *p, df_device dev, int64_t d0, int64_t d1, int64_t d2) {
  return df_view(p, DF_F32, dev, 3, (const int64_t[]){d0, d1, d2});
}
static df_tensor v4(float *p, df_device dev, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  return df_view(p, DF_F32, dev, 4, (const int64_t[]){d0, d1, d2, d3});
}
static df_tensor v1(float *p, df_device dev, int64_t n) { return df_view(p, DF_F32, dev, 1, (const int64_t[]){n}); }
static int64_t align16(int64_t n) { return (n + 15) / 16 * 16; }

// Scratch for T rows: h, x, tmp (T, H); q, attn (T, nH·hd); gate, up (T, I); rstd (T·nH); ids, pos (T).
static df_status ensure_scratch(df_target *t, int64_t T, df_error *err) {
  if (T <= t->rows) return DF_OK;
  const df_target_spec *s = &t->spec;
  const int64_t H = s->hidden, qd = s->heads * s->head_dim, I = s->intermediate;
  const int64_t sizes[] = {T * H, T * H, T * H, T * qd, T * qd, T * I, T * I, T * s->heads, T, T};
  int64_t total = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += align16(sizes[i]);
  df_buffer_free(t->ctx, t->scratch);
  t->scratch = NULL, t->rows = 0;
  DF_TRY(
      df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_ACTIVATIONS, sizeof(float) * (size_t)total, (void **)&t->scratch, err));
  float *p = t->scratch;
  float **dst[] = {&t->h, &t->x, &t->tmp, &t->q, &t->attn, &t->gate, &t->up, &t->rstd};
  for (size_t i = 0; i < sizeof dst / sizeof *dst; i++) *dst[i] = p, p += align16(sizes[i]);
  t->ids = (int32_t *)p, p += align16(T);
  t->pos = (int32_t *)p;
  t->rows = T;
  return DF_OK;
}

static const df_tensor *opt(const df_tensor *b, bool on) { return on ? b : NULL; }

static df_status layer_forward(df_target *t, df_target_cache *c, int64_t l, int64_t T, df_error *err) {
  df_ctx *ctx = t->ctx;
  const df_device dev = t->dev;
  const df_target_spec *s = &t->spec;
  const target_layer *L = &t->layers[l];
  const int64_t H = s->hidden, nH = s->heads, nKV = s->kv_heads, hd = s->head_dim, I = s->intermediate;
  const int64_t cap = c->capacity, past = c->len;
  const float eps = (float)s->rms_norm_eps;
  float *kc = c->kv + (l * 2 + 0) * cap * nKV * hd, *vc = c->kv + (l * 2 + 1) * cap * nKV * hd;
  df_tensor h = v2(t->h, dev, T, H), x = v2(t->x, dev, T, H), r = v1(t->rstd, dev, T);
  DF_TRY(df_rmsnorm_forward(ctx, &h, &L->in_norm, eps, &x, &r, err));

  // q (T, nH, hd); the new keys/values go straight into cache rows past .. past+T−1.
  df_tensor q = v2(t->q, dev, T, nH * hd), kn = v2(kc + past * nKV * hd, dev, T, nKV * hd);
  df_tensor vn = v2(vc + past * nKV * hd, dev, T, nKV * hd);
  DF_TRY(df_linear_forward(ctx, &x, &L->q_w, opt(&L->q_b, s->qkv_bias), &q, err));
  DF_TRY(df_linear_forward(ctx, &x, &L->k_w, opt(&L->k_b, s->qkv_bias), &kn, err));
  DF_TRY(df_linear_forward(ctx, &x, &L->v_w, opt(&L->v_b, s->qkv_bias), &vn, err));
  df_tensor q3 = v3(t->q, dev, T, nH, hd), k3 = v3(kn.data, dev, T, nKV, hd);
  if (s->qk_norm) {
    df_tensor rq = v1(t->rstd, dev, T * nH), rk = v1(t->rstd, dev, T * nKV);
    DF_TRY(df_rmsnorm_forward(ctx, &q3, &L->q_norm, eps, &q3, &rq, err));
    DF_TRY(df_rmsnorm_forward(ctx, &k3, &L->k_norm, eps, &k3, &rk, err));
  }
  df_tensor pos = df_view(t->pos, DF_I32, dev, 1, (const int64_t[]){T}), inv = v1(t->inv_freq, dev, hd / 2);
  DF_TRY(df_rope_forward(ctx, &q3, &pos, &inv, t->mscale, &q3, err));
  DF_TRY(df_rope_forward(ctx, &k3, &pos, &inv, t->mscale, &k3, err));

  const df_causal_attn_desc desc = {.past = past, .window = 0, .scale = (float)(1.0 / sqrt((double)hd))};
  df_tensor q4 = v4(t->q, dev, 1, T, nH, hd), kall = v4(kc, dev, 1, cap, nKV, hd), vall = v4(vc, dev, 1, cap, nKV, hd);
  df_tensor a4 = v4(t->attn, dev, 1, T, nH, hd);
  DF_TRY(df_causal_attn_forward(ctx, &desc, &q4, &kall, &vall, &a4, err));

  // h += o_proj(attn); x = post norm(h); h += down(silu(gate x) · up x).
  df_tensor a2 = v2(t->attn, dev, T, nH * hd), tmp = v2(t->tmp, dev, T, H);
  DF_TRY(df_linear_forward(ctx, &a2, &L->o_w, opt(&L->o_b, s->o_bias), &tmp, err));
  DF_TRY(df_axpy(ctx, 1.0f, &tmp, &h, err));
  DF_TRY(df_rmsnorm_forward(ctx, &h, &L->post_norm, eps, &x, &r, err));
  df_tensor g = v2(t->gate, dev, T, I), u = v2(t->up, dev, T, I);
  DF_TRY(df_linear_forward(ctx, &x, &L->gate_w, NULL, &g, err));
  DF_TRY(df_linear_forward(ctx, &x, &L->up_w, NULL, &u, err));
  DF_TRY(df_swiglu_forward(ctx, &g, &u, 0.0f, &g, err));
  DF_TRY(df_linear_forward(ctx, &g, &L->down_w, NULL, &tmp, err));
  return df_axpy(ctx, 1.0f, &tmp, &h, err);
}

static df_status check_outputs(const df_target *t, const df_target_cache *c, int64_t T, const df_target_outputs *o,
                               df_error *err) {
  if (T < 1) return DF_FAIL(err, DF_ERR_INVALID, "T", "pass at least one token", "T = %lld", (long long)T);
  if (c->len + T > c->capacity)
    return DF_FAIL(err, DF_ERR_INVALID, "kv cache", "create the cache with room for the whole sequence",
                   "%lld cached + %lld new positions exceed the capacity %lld", (long long)c->len, (long long)T,
                   (long long)c->capacity);
  if (c->len + T > t->spec.max_position)
    return DF_FAIL(err, DF_ERR_INVALID, "max_position_embeddings", "shorten the sequence (data.max_length)",
                   "position %lld is past the target's max_position_embeddings %lld", (long long)(c->len + T - 1),
                   (long long)t->spec.max_position);
  if (o->num_capture < 0 || (o->num_capture > 0 && (!o->capture_ids || !o->captured)))
    return DF_FAIL(err, DF_ERR_INVALID, "capture_ids", "pass the layer ids and an output buffer",
                   "bad capture request (%d layers)", o->num_capture);
  for (int j = 0; j < o->num_capture; j++)
    if (o->capture_ids[j] < 0 || o->capture_ids[j] >= t->spec.num_layers)
      return DF_FAIL(err, DF_ERR_INVALID, "target_layer_ids",
                     "a layer id L is the output of decoder layer L: 0 <= L < num_hidden_layers",
                     "layer id %d is outside the target's %lld layers", o->capture_ids[j],
                     (long long)t->spec.num_layers);
  if ((o->logits || o->argmax) && (o->logits_from < 0 || o->logits_from >= T))
    return DF_FAIL(err, DF_ERR_INVALID, "logits_from", "logits cover rows logits_from .. T−1",
                   "logits_from %lld is outside [0, %lld)", (long long)o->logits_from, (long long)T);
  return DF_OK;
}

// Row t of h into column block j of the (T, K·H) capture buffer.
static df_status capture_rows(df_target *t, int64_t T, const df_target_outputs *o, int j, df_error *err) {
  const int64_t H = t->spec.hidden, W = (int64_t)o->num_capture * H;
  for (int64_t r = 0; r < T; r++)
    DF_TRY(df_copy(t->ctx, o->captured + r * W + j * H, t->dev, t->h + r * H, t->dev, sizeof(float) * (size_t)H, err));
  return DF_OK;
}

static void argmax_rows(const float *logits, int64_t n, int64_t V, int32_t *out) {
  for (int64_t r = 0; r < n; r++) {
    const float *z = logits + r * V;
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (z[v] > z[best]) best = v;
    out[r] = (int32_t)best;
  }
}

// logits (n, V) of the final-normed rows logits_from .. T−1, and their argmax on the host.
static df_status head_forward(df_target *t, int64_t T, const df_target_outputs *o, df_error *err) {
  const int64_t V = t->spec.vocab, H = t->spec.hidden, n = T - o->logits_from;
  const size_t bytes = sizeof(float) * (size_t)(n * V);
  float *logits = o->logits, *own = NULL, *host = NULL;
  if (!logits) {
    DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_ACTIVATIONS, bytes, (void **)&own, err));
    logits = own;
  }
  df_tensor x = v2(t->x + o->logits_from * H, t->dev, n, H), y = v2(logits, t->dev, n, V);
  df_status st = df_linear_forward(t->ctx, &x, &t->lm_head, NULL, &y, err);
  if (st == DF_OK && o->argmax) {
    if (t->dev == DF_DEV_CPU) {
      argmax_rows(logits, n, V, o->argmax);
    } else if (!(host = malloc(bytes))) {
      st = DF_FAIL(err, DF_ERR_NOMEM, "logits", NULL, "out of memory");
    } else if ((st = df_copy(t->ctx, host, DF_DEV_CPU, logits, t->dev, bytes, err)) == DF_OK) {
      argmax_rows(host, n, V, o->argmax);
    }
  }
  free(host);
  df_buffer_free(t->ctx, own);
  return st;
}

static df_status copy_rows(df_target *t, float *dst, const float *src, int64_t n, df_error *err) {
  return df_copy(t->ctx, dst, t->dev, src, t->dev, sizeof(float) * (size_t)n, err);
}

df_status df_target_forward(df_target *t, df_target_cache *c, const int32_t *ids, int64_t T,
                            const df_target_outputs *out, df_error *err) {
  static const df_target_outputs none = {0};
  const df_target_outputs *o = out ? out : &none;
  DF_TRY(check_outputs(t, c, T, o, err));
  DF_TRY(ensure_scratch(t, T, err));
  const df_target_spec *s = &t->spec;
  const int64_t H = s->hidden, nl = s->num_layers;
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
  if (!pos) return DF_FAIL(err, DF_ERR_NOMEM, "positions", NULL, "out of memory");
  for (int64_t i = 0; i < T; i++) pos[i] = (int32_t)(c->len + i);
  df_status st = df_copy(t->ctx, t->pos, t->dev, pos, DF_DEV_CPU, sizeof(int32_t) * (size_t)T, err);
  free(pos);
  DF_TRY(st);
  DF_TRY(df_copy(t->ctx, t->ids, t->dev, ids, DF_DEV_CPU, sizeof(int32_t) * (size_t)T, err));
  df_tensor idv = df_view(t->ids, DF_I32, t->dev, 1, (const int64_t[]){T}), h = v2(t->h, t->dev, T, H);
  DF_TRY(df_embedding_forward(t->ctx, &t->embed, &idv, &h, err));
  if (o->all_hidden) DF_TRY(copy_rows(t, o->all_hidden, t->h, T * H, err));
  for (int64_t l = 0; l < nl; l++) {
    DF_TRY(layer_forward(t, c, l, T, err));
    if (o->all_hidden && l + 1 < nl) DF_TRY(copy_rows(t, o->all_hidden + (l + 1) * T * H, t->h, T * H, err));
    for (int j = 0; j < o->num_capture; j++)
      if (o->capture_ids[j] == l) DF_TRY(capture_rows(t, T, o, j, err));
  }
  df_tensor x = v2(t->x, t->dev, T, H), r = v1(t->rstd, t->dev, T);
  DF_TRY(df_rmsnorm_forward(t->ctx, &h, &t->norm, (float)s->rms_norm_eps, &x, &r, err));
  if (o->all_hidden) DF_TRY(copy_rows(t, o->all_hidden + nl * T * H, t->x, T * H, err));
  if (o->final_hidden) DF_TRY(copy_rows(t, o->final_hidden, t->x, T * H, err));
  if (o->logits || o->argmax) DF_TRY(head_forward(t, T, o, err));
  c->len += T;
  return DF_OK;
}
