// Internal to modeling/target/: the model and cache structs shared by loading (target_model.c) and the
// forward (target_forward.c).
#ifndef DF_MODELING_TARGET_INTERNAL_H
#define DF_MODELING_TARGET_INTERNAL_H

#include "modeling/param_table.h"
#include "modeling/target/target_model.h"

typedef struct {
  df_tensor in_norm, post_norm;   // [H]
  df_tensor q_w, k_w, v_w, o_w;   // [nH·hd, H], [nKV·hd, H], [nKV·hd, H], [H, nH·hd]
  df_tensor q_b, k_b, v_b, o_b;   // biases (qkv_bias / o_bias)
  df_tensor q_norm, k_norm;       // [hd] (qk_norm)
  df_tensor gate_w, up_w, down_w; // [I, H], [I, H], [H, I]
} target_layer;

struct df_target {
  df_target_spec spec;
  df_ctx *ctx;
  df_device dev;
  df_params *params;
  float *weights; // flat, on dev
  df_tensor embed, lm_head, norm;
  target_layer *layers;
  float *inv_freq; // (hd/2) on dev
  float mscale;
  // Forward scratch for up to `rows` tokens (grown on demand), on dev.
  float *scratch;
  int64_t rows;
  float *h, *x, *q, *attn, *tmp, *gate, *up, *rstd;
  int32_t *ids, *pos;
};

struct df_target_cache {
  df_target *t;
  int64_t capacity, len;
  float *kv; // (L, 2, capacity, nKV, hd) on dev
};

#endif
