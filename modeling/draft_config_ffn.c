// The draft config's FFN kind, resolved through the listed kinds (modeling/ffn.h; the MoE kind's config is
// moe/config.c's work), and the parameter count of the whole draft, which is where a sparse draft's total and
// active sizes come from.
#include "modeling/draft_config_internal.h"
#include "modeling/ffn.h"

df_status df_draft_parse_ffn_kind(const df_cj *c, const json_t *root, df_draft_config_owned *o) {
  for (int i = 0; i < df_ffn_num_kinds; i++) {
    const df_ffn_kind *k = df_ffn_kinds[i];
    void *cfg = NULL;
    DF_TRY(k->config_resolve(root, c->source, &cfg, c->err));
    if (!cfg) continue;
    o->ffn_cfg = cfg;
    o->pub.ffn_kind = k;
    o->pub.moe = cfg;
    return DF_OK;
  }
  return DF_OK;
}

// The DSpark heads (dflash-dspark.md 2.1): Markov W1 Embedding(V, r) and W2 Linear(r → V), plus the gated
// head's gate_proj Linear(H + r → r) or the rnn head's joint_proj Linear(2r + H → 3r); the confidence head
// Linear(H [+ r] → 1) with bias.
static int64_t dspark_head_params(const df_draft_config *cfg) {
  const df_dflash_config *d = &cfg->dflash;
  const int64_t H = cfg->hidden_size, V = cfg->vocab_size, r = d->markov_rank;
  int64_t n = 0;
  if (r > 0) {
    n += 2 * V * r;
    if (d->markov_head_type == DF_MARKOV_GATED) n += (H + r) * r + r;
    if (d->markov_head_type == DF_MARKOV_RNN) n += (2 * r + H) * 3 * r + 3 * r;
  }
  if (d->enable_confidence_head) n += H + (d->confidence_head_with_markov ? r : 0) + 1;
  return n;
}

// One decoder layer without its FFN: q/k/v/o projections (+ biases), q_norm and k_norm, the two RMSNorms.
static int64_t attention_layer_params(const df_draft_config *cfg) {
  const int64_t H = cfg->hidden_size, d = cfg->head_dim;
  const int64_t q = cfg->num_attention_heads * d, kv = cfg->num_key_value_heads * d;
  int64_t n = H * q + 2 * H * kv + q * H + 2 * d + 2 * H;
  if (cfg->attention_bias) n += q + 2 * kv + H;
  return n;
}

void df_draft_config_param_counts(const df_draft_config *cfg, int64_t *total, int64_t *active) {
  if (df_draft_is_eagle(cfg)) {
    *total = *active = df_eagle3_param_count(cfg);
    return;
  }
  const int64_t H = cfg->hidden_size, K = cfg->dflash.num_target_layer_ids;
  // fc (K·H → H, no bias), hidden_norm, the final norm, and the heads.
  // Domino's head: prefix_gru (3G·H + 3G·G) and embed_proj (E·(H + G) + V·E), no biases.
  const int64_t E = cfg->dflash.emb_dim, G = cfg->dflash.gru_hidden_dim;
  const int64_t domino = cfg->kind == DF_DRAFT_DOMINO ? 3 * G * (H + G) + E * (H + G) + cfg->vocab_size * E : 0;
  int64_t shared = K * H * H + 2 * H + dspark_head_params(cfg) + domino;
  int64_t ffn_total = 3 * H * cfg->intermediate_size, ffn_active = ffn_total;
  if (cfg->ffn_kind) cfg->ffn_kind->param_counts(cfg->moe, H, &ffn_total, &ffn_active);
  const int64_t n = cfg->num_hidden_layers, attn = attention_layer_params(cfg);
  *total = shared + n * (attn + ffn_total);
  *active = shared + n * (attn + ffn_active);
}
