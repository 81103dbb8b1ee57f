// The target model: a parameter table of HF names loaded strictly into one flat fp32 buffer on the context's
// device, per-sequence KV caches, and the forward of T new tokens through the op interface only.
#include "modeling/target/target_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/causal_attn.h"
#include "modeling/draft_layer.h"
#include "modeling/param_table.h"
#include "modeling/safetensors.h"
#include "modeling/strict_load.h"
#include "modeling/target/target_internal.h"

// ---- parameters ----------------------------------------------------------------------------------------

static df_status add(df_params *p, const char *name, df_param_role role, int64_t d0, int64_t d1, df_error *err) {
  return df_params_add_f32(p, name, role, d1 ? 2 : 1, d0, d1, err);
}

static df_status add_layer(const df_target_spec *s, df_params *p, int64_t i, df_error *err) {
  const int64_t H = s->hidden, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
  char n[128];
#define NAME(fmt) (snprintf(n, sizeof n, "model.layers.%lld." fmt, (long long)i), n)
  DF_TRY(add(p, NAME("input_layernorm.weight"), DF_ROLE_NORM, H, 0, err));
  DF_TRY(add(p, NAME("self_attn.q_proj.weight"), DF_ROLE_WEIGHT, qd, H, err));
  if (s->qkv_bias) DF_TRY(add(p, NAME("self_attn.q_proj.bias"), DF_ROLE_BIAS, qd, 0, err));
  DF_TRY(add(p, NAME("self_attn.k_proj.weight"), DF_ROLE_WEIGHT, kvd, H, err));
  if (s->qkv_bias) DF_TRY(add(p, NAME("self_attn.k_proj.bias"), DF_ROLE_BIAS, kvd, 0, err));
  DF_TRY(add(p, NAME("self_attn.v_proj.weight"), DF_ROLE_WEIGHT, kvd, H, err));
  if (s->qkv_bias) DF_TRY(add(p, NAME("self_attn.v_proj.bias"), DF_ROLE_BIAS, kvd, 0, err));
  DF_TRY(add(p, NAME("self_attn.o_proj.weight"), DF_ROLE_WEIGHT, H, qd, err));
  if (s->o_bias) DF_TRY(add(p, NAME("self_attn.o_proj.bias"), DF_ROLE_BIAS, H, 0, err));
  if (s->qk_norm) {
    DF_TRY(add(p, NAME("self_attn.q_norm.weight"), DF_ROLE_NORM, s->head_dim, 0, err));
    DF_TRY(add(p, NAME("self_attn.k_norm.weight"), DF_ROLE_NORM, s->head_dim, 0, err));
  }
  DF_TRY(add(p, NAME("post_attention_layernorm.weight"), DF_ROLE_NORM, H, 0, err));
  DF_TRY(add(p, NAME("mlp.gate_proj.weight"), DF_ROLE_WEIGHT, s->intermediate, H, err));
  DF_TRY(add(p, NAME("mlp.up_proj.weight"), DF_ROLE_WEIGHT, s->intermediate, H, err));
  DF_TRY(add(p, NAME("mlp.down_proj.weight"), DF_ROLE_WEIGHT, H, s->intermediate, err));
#undef NAME
  return DF_OK;
}

static df_status build_table(df_target *t, df_error *err) {
  const df_target_spec *s = &t->spec;
  DF_TRY(df_params_new(&t->params, err));
  DF_TRY(add(t->params, "model.embed_tokens.weight", DF_ROLE_EMBED, s->vocab, s->hidden, err));
  for (int64_t i = 0; i < s->num_layers; i++) DF_TRY(add_layer(s, t->params, i, err));
  DF_TRY(add(t->params, "model.norm.weight", DF_ROLE_NORM, s->hidden, 0, err));
  if (!s->tied) DF_TRY(add(t->params, "lm_head.weight", DF_ROLE_WEIGHT, s->vocab, s->hidden, err));
  return df_params_finalize(t->params, err);
}

static df_status bind(const df_target *t, const char *fmt, int64_t i, df_tensor *out, df_error *err) {
  char n[128];
  snprintf(n, sizeof n, fmt, (long long)i);
  const df_param *e = df_params_find(t->params, n);
  if (!e) return DF_FAIL(err, DF_ERR_INVALID, n, NULL, "target parameter '%s' is not in the table", n);
  *out = df_view(t->weights + e->offset, DF_F32, t->dev, e->ndim, e->shape);
  return DF_OK;
}

static df_status bind_layer(df_target *t, int64_t i, df_error *err) {
  target_layer *L = &t->layers[i];
  const df_target_spec *s = &t->spec;
  DF_TRY(bind(t, "model.layers.%lld.input_layernorm.weight", i, &L->in_norm, err));
  DF_TRY(bind(t, "model.layers.%lld.post_attention_layernorm.weight", i, &L->post_norm, err));
  DF_TRY(bind(t, "model.layers.%lld.self_attn.q_proj.weight", i, &L->q_w, err));
  DF_TRY(bind(t, "model.layers.%lld.self_attn.k_proj.weight", i, &L->k_w, err));
  DF_TRY(bind(t, "model.layers.%lld.self_attn.v_proj.weight", i, &L->v_w, err));
  DF_TRY(bind(t, "model.layers.%lld.self_attn.o_proj.weight", i, &L->o_w, err));
  if (s->qkv_bias) {
    DF_TRY(bind(t, "model.layers.%lld.self_attn.q_proj.bias", i, &L->q_b, err));
    DF_TRY(bind(t, "model.layers.%lld.self_attn.k_proj.bias", i, &L->k_b, err));
    DF_TRY(bind(t, "model.layers.%lld.self_attn.v_proj.bias", i, &L->v_b, err));
  }
  if (s->o_bias) DF_TRY(bind(t, "model.layers.%lld.self_attn.o_proj.bias", i, &L->o_b, err));
  if (s->qk_norm) {
    DF_TRY(bind(t, "model.layers.%lld.self_attn.q_norm.weight", i, &L->q_norm, err));
    DF_TRY(bind(t, "model.layers.%lld.self_attn.k_norm.weight", i, &L->k_norm, err));
  }
  DF_TRY(bind(t, "model.layers.%lld.mlp.gate_proj.weight", i, &L->gate_w, err));
  DF_TRY(bind(t, "model.layers.%lld.mlp.up_proj.weight", i, &L->up_w, err));
  return bind(t, "model.layers.%lld.mlp.down_proj.weight", i, &L->down_w, err);
}

// ---- load ----------------------------------------------------------------------------------------------

// Strict load into a host buffer, then (CUDA) one copy to the device. Without `read`, only the device buffer (a
// memory plan: nothing is read).
static df_status load_weights(df_target *t, const char *dir, bool read, df_error *err) {
  const int64_t n = df_params_numel(t->params);
  const size_t bytes = sizeof(float) * (size_t)n;
  if (!read) return df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_WEIGHTS, bytes, (void **)&t->weights, err);
  float *host = calloc((size_t)n, sizeof(float));
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, dir, "the target needs 4 bytes per parameter", "out of memory");
  df_st_model *m = NULL;
  df_status st = df_st_model_open(dir, &m, err);
  // RoPE tables are recomputed; a tied model's lm_head is the embedding (transformers ignores a stored copy).
  const char *ignore[] = {"rotary_emb.inv_freq", "lm_head.weight"};
  df_load_options lo = {.ignore_suffixes = ignore, .n_ignore = t->spec.tied ? 2 : 1};
  if (st == DF_OK) st = df_params_load_strict(t->params, host, m, &lo, NULL, err);
  df_st_model_close(m);
  if (st == DF_OK) st = df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_WEIGHTS, bytes, (void **)&t->weights, err);
  if (st == DF_OK) st = df_copy(t->ctx, t->weights, t->dev, host, DF_DEV_CPU, bytes, err);
  free(host);
  return st;
}

static df_status build_rope(df_target *t, df_error *err) {
  const size_t bytes = sizeof(float) * (size_t)(t->spec.head_dim / 2);
  float *host = malloc(bytes);
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "rope", NULL, "cannot allocate the RoPE table");
  df_status st = dflash_rope_table(&t->spec.rope, host, &t->mscale, err);
  if (st == DF_OK) st = df_buffer_alloc_as(t->ctx, DF_MEM_TARGET_WEIGHTS, bytes, (void **)&t->inv_freq, err);
  if (st == DF_OK) st = df_copy(t->ctx, t->inv_freq, t->dev, host, DF_DEV_CPU, bytes, err);
  free(host);
  return st;
}

static df_status load(df_target *t, const char *dir, bool read, df_error *err) {
  DF_TRY(df_target_spec_from_dir(dir, &t->spec, err));
  t->layers = calloc((size_t)t->spec.num_layers, sizeof *t->layers);
  if (!t->layers) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
  DF_TRY(build_table(t, err));
  DF_TRY(load_weights(t, dir, read, err));
  DF_TRY(bind(t, "model.embed_tokens.weight", 0, &t->embed, err));
  DF_TRY(bind(t, "model.norm.weight", 0, &t->norm, err));
  if (t->spec.tied)
    t->lm_head = t->embed;
  else
    DF_TRY(bind(t, "lm_head.weight", 0, &t->lm_head, err));
  for (int64_t i = 0; i < t->spec.num_layers; i++) DF_TRY(bind_layer(t, i, err));
  return build_rope(t, err);
}

static df_status open_target(const char *dir, df_ctx *ctx, bool read, df_target **out, df_error *err) {
  *out = NULL;
  df_target *t = calloc(1, sizeof *t);
  if (!t) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
  t->ctx = ctx;
  t->dev = df_ctx_device(ctx);
  df_status st = load(t, dir, read, err);
  if (st != DF_OK) {
    df_target_free(t);
    return st;
  }
  *out = t;
  return DF_OK;
}

df_status df_target_load(const char *dir, df_ctx *ctx, df_target **out, df_error *err) {
  return open_target(dir, ctx, true, out, err);
}

df_status df_target_create(const char *dir, df_ctx *ctx, df_target **out, df_error *err) {
  return open_target(dir, ctx, false, out, err);
}

void df_target_free(df_target *t) {
  if (!t) return;
  df_buffer_free(t->ctx, t->weights);
  df_buffer_free(t->ctx, t->inv_freq);
  df_buffer_free(t->ctx, t->scratch);
  df_params_free(t->params);
  free(t->layers);
  free(t);
}

const df_target_spec *df_target_get_spec(const df_target *t) { return &t->spec; }
df_ctx *df_target_ctx(const df_target *t) { return t->ctx; }
df_tensor df_target_embed(const df_target *t) { return t->embed; }
df_tensor df_target_lm_head(const df_target *t) { return t->lm_head; }

// ---- KV cache ------------------------------------------------------------------------------------------

df_status df_target_cache_create(df_target *t, int64_t capacity, df_target_cache **out, df_error *err) {
  *out = NULL;
  if (capacity < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "capacity", "a cache holds at least one position", "capacity %lld",
                   (long long)capacity);
  df_target_cache *c = calloc(1, sizeof *c);
  if (!c) return DF_FAIL(err, DF_ERR_NOMEM, "kv cache", NULL, "out of memory");
  const df_target_spec *s = &t->spec;
  const size_t n = (size_t)(s->num_layers * 2 * capacity * s->kv_heads * s->head_dim);
  df_status st = df_buffer_alloc_as(t->ctx, DF_MEM_KV_CACHE, n * sizeof(float), (void **)&c->kv, err);
  if (st != DF_OK) {
    free(c);
    return st;
  }
  c->t = t;
  c->capacity = capacity;
  *out = c;
  return DF_OK;
}

void df_target_cache_free(df_target_cache *c) {
  if (!c) return;
  df_buffer_free(c->t->ctx, c->kv);
  free(c);
}

int64_t df_target_cache_len(const df_target_cache *c) { return c->len; }
int64_t df_target_cache_capacity(const df_target_cache *c) { return c->capacity; }

df_status df_target_cache_truncate(df_target_cache *c, int64_t len, df_error *err) {
  if (len < 0 || len > c->len)
    return DF_FAIL(err, DF_ERR_INVALID, "len", "truncate to a length the cache already has",
                   "cannot truncate a cache of %lld positions to %lld", (long long)c->len, (long long)len);
  c->len = len;
  return DF_OK;
}
