// P-EAGLE parallel drafting for speculative decoding (eval --spec-decode): one forward proposes the whole round. The
// draft's cache holds, per layer, the keys of every committed position p < start (the row from the target's features
// at p and the token at p + 1); a round extends it over the positions the last verification committed and appends
// the K − 1 mask rows of the last anchor right after it, at positions start .. start + K − 2. Causal attention over
// that is P-EAGLE's mask for the anchor (the depth-0 rows up to it, and the mask rows of lower depth): the anchor's row
// proposes the first token, mask row d the token d further. The next round's extension overwrites the mask rows.
#include <stdlib.h>
#include <string.h>

#include "strategies/peagle/peagle.h"

void df_peagle_draft_reset(df_strategy_run *base) { ((peagle_run *)base)->cached = 0; }

void df_peagle_spec_free(peagle_run *r) {
  df_peagle_cache_free(r->cache);
  r->cache = NULL;
  df_ctx *ctx = r->e.env.ctx;
  if (r->sd_dids) df_buffer_free(ctx, r->sd_dids);
  if (r->sd_dlogits) df_buffer_free(ctx, r->sd_dlogits);
  free(r->sd_ids), free(r->sd_logits);
  r->sd_ids = r->sd_dids = NULL, r->sd_logits = r->sd_dlogits = NULL;
}

// The cache and buffers for a sequence of cap positions with K proposals a round (a larger cap starts over).
static df_status spec_buffers(peagle_run *r, int64_t cap, int64_t K, df_error *err) {
  df_ctx *ctx = r->e.env.ctx;
  const int64_t D = r->e.D, V = r->e.V;
  if (r->sd_ids && cap <= r->cache_cap) return DF_OK;
  df_peagle_spec_free(r);
  int64_t *d2t = malloc(sizeof *d2t * (size_t)D);
  uint8_t *t2d = malloc((size_t)V);
  r->sd_logits = malloc(sizeof(float) * (size_t)(K * D));
  r->sd_ids = malloc(sizeof(int32_t) * (size_t)(cap + D)); // [0, cap) a decode's tokens, then the draft-to-target map
  df_status st = d2t && t2d && r->sd_logits && r->sd_ids ? df_eagle3_run_vocab_read(&r->e, d2t, t2d, err)
                                                         : DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "oom");
  for (int64_t d = 0; st == DF_OK && d < D; d++) r->sd_ids[cap + d] = (int32_t)(d + d2t[d]);
  free(d2t), free(t2d);
  if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)cap, (void **)&r->sd_dids, err);
  if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(float) * (size_t)(K * D), (void **)&r->sd_dlogits, err);
  if (st != DF_OK) return st;
  r->cache_cap = cap, r->cached = 0;
  return df_peagle_cache_create(r->m, cap, &r->cache, err);
}

df_status df_peagle_draft(df_strategy_run *base, const df_draft_round *in, int32_t *props, df_error *err) {
  peagle_run *r = (peagle_run *)base;
  df_ctx *ctx = r->e.env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t K = base->table->proposals(base), start = in->start, D = r->e.D, H = r->e.H;
  if (start < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "prompt", "prompts need at least one token before the first generated one",
                   "a P-EAGLE draft needs the target's features of the position before the last token");
  DF_TRY(spec_buffers(r, in->cap, K, err));
  if (start + K > r->cache_cap)
    return DF_FAIL(err, DF_ERR_INVALID, "spec decode", NULL, "the draft cache holds %lld positions, not %lld",
                   (long long)r->cache_cap, (long long)(start + K));
  // depth-0 rows over positions cached .. start − 1 (the target's features there, the tokens after them), then the
  // anchor start − 1's mask rows
  const int64_t from = r->cached < start ? r->cached : start - 1, n0 = start - from, n = n0 + K - 1;
  memcpy(r->sd_ids, in->seq + from + 1, sizeof(int32_t) * (size_t)n0);
  for (int64_t j = n0; j < n; j++) r->sd_ids[j] = r->mask_id;
  DF_TRY(df_copy(ctx, r->sd_dids, dev, r->sd_ids, DF_DEV_CPU, sizeof(int32_t) * (size_t)n, err));
  const float *out = NULL;
  DF_TRY(df_peagle_decode(r->m, r->cache, from, n, n0, in->feats + from * r->e.W, r->sd_dids, &out, err));
  r->cached = start;
  df_tensor w;
  df_peagle_lm_head(r->m, &w, NULL);
  df_tensor x = df_view((void *)(out + (n0 - 1) * H), DF_F32, dev, 2, (const int64_t[]){K, H});
  df_tensor y = df_view(r->sd_dlogits, DF_F32, dev, 2, (const int64_t[]){K, D});
  DF_TRY(df_linear_forward(ctx, &x, &w, NULL, &y, err));
  DF_TRY(df_copy(ctx, r->sd_logits, DF_DEV_CPU, r->sd_dlogits, dev, sizeof(float) * (size_t)(K * D), err));
  for (int64_t k = 0; k < K; k++) { // greedy: the first maximum
    const float *z = r->sd_logits + k * D;
    int64_t best = 0;
    for (int64_t d = 1; d < D; d++)
      if (z[d] > z[best]) best = d;
    props[k] = r->sd_ids[r->cache_cap + best];
  }
  return DF_OK;
}
