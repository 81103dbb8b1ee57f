// EAGLE-3 chain drafting for speculative decoding (SGLang's EAGLE-3 worker with topk 1): the draft's own KV cache
// holds, for every committed position p < start, the row computed from the target's captured features at p and the
// token at p + 1; a round first extends it over the positions the last verification committed (one batched decode),
// whose last row proposes the first token, then feeds its own layer output (before the final norm) and each proposal
// back for the next. Proposal rows are overwritten by the next round's extension.
#include <stdlib.h>
#include <string.h>

#include "strategies/eagle3/eagle3.h"

void df_eagle3_draft_reset(df_strategy_run *base) { ((eagle3_run *)base)->cached = 0; }

void df_eagle3_spec_free(eagle3_run *r) {
  df_eagle3_cache_free(r->cache);
  r->cache = NULL;
  df_ctx *ctx = r->env.ctx;
  if (r->sd_dids) df_buffer_free(ctx, r->sd_dids);
  if (r->sd_dlogits) df_buffer_free(ctx, r->sd_dlogits);
  if (r->sd_h) df_buffer_free(ctx, r->sd_h);
  free(r->sd_ids), free(r->sd_logits);
  r->sd_ids = r->sd_dids = NULL, r->sd_logits = r->sd_dlogits = r->sd_h = NULL;
}

// The cache and buffers for a sequence of cap positions (a larger cap starts the sequence's cache over).
static df_status spec_buffers(eagle3_run *r, int64_t cap, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  if (!r->sd_ids) {
    int64_t *d2t = malloc(sizeof *d2t * (size_t)r->D);
    uint8_t *t2d = malloc((size_t)r->V);
    r->sd_logits = malloc(sizeof(float) * (size_t)r->D);
    df_status st = d2t && t2d && r->sd_logits ? df_eagle3_run_vocab_read(r, d2t, t2d, err)
                                              : DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
    // sd_ids: [0, cap) the tokens of a decode call, then [cap, cap + D) the draft-to-target map
    r->sd_ids = st == DF_OK ? malloc(sizeof(int32_t) * (size_t)(cap + r->D)) : NULL;
    if (st == DF_OK && !r->sd_ids) st = DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
    for (int64_t d = 0; st == DF_OK && d < r->D; d++) r->sd_ids[cap + d] = (int32_t)(d + d2t[d]);
    free(d2t), free(t2d);
    if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)cap, (void **)&r->sd_dids, err);
    if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(float) * (size_t)r->D, (void **)&r->sd_dlogits, err);
    if (st == DF_OK) st = df_buffer_alloc(ctx, sizeof(float) * (size_t)r->H, (void **)&r->sd_h, err);
    if (st != DF_OK) return st;
    r->cache_cap = cap;
    r->cached = 0;
    return df_eagle3_cache_create(r->m, cap, &r->cache, err);
  }
  if (cap <= r->cache_cap) return DF_OK;
  df_eagle3_spec_free(r);
  return spec_buffers(r, cap, err);
}

// The draft's greedy token (a target id) from the row lm_head reads.
static df_status pick(eagle3_run *r, const float *x, int32_t *tok, df_error *err) {
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  df_tensor w;
  df_eagle3_lm_head(r->m, &w, NULL);
  df_tensor xv = df_view((void *)x, DF_F32, dev, 2, (const int64_t[]){1, r->H});
  df_tensor y = df_view(r->sd_dlogits, DF_F32, dev, 2, (const int64_t[]){1, r->D});
  DF_TRY(df_linear_forward(ctx, &xv, &w, NULL, &y, err));
  DF_TRY(df_copy(ctx, r->sd_logits, DF_DEV_CPU, r->sd_dlogits, dev, sizeof(float) * (size_t)r->D, err));
  int64_t best = 0;
  for (int64_t d = 1; d < r->D; d++)
    if (r->sd_logits[d] > r->sd_logits[best]) best = d;
  *tok = r->sd_ids[r->cache_cap + best];
  return DF_OK;
}

df_status df_eagle3_draft(df_strategy_run *base, const df_draft_round *in, int32_t *props, df_error *err) {
  eagle3_run *r = (eagle3_run *)base;
  df_ctx *ctx = r->env.ctx;
  const df_device dev = df_ctx_device(ctx);
  const int64_t K = base->table->proposals(base), start = in->start;
  if (start < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "prompt", "prompts need at least one token before the first generated one",
                   "an EAGLE-3 draft needs the target's features of the position before the last token");
  DF_TRY(spec_buffers(r, in->cap, err));
  if (start + K > r->cache_cap)
    return DF_FAIL(err, DF_ERR_INVALID, "spec decode", NULL, "the draft cache holds %lld positions, not %lld",
                   (long long)r->cache_cap, (long long)(start + K));
  // Extend over positions cached .. start − 1: the target's features there and the tokens after them.
  const int64_t from = r->cached < start ? r->cached : start - 1, n = start - from;
  memcpy(r->sd_ids, in->seq + from + 1, sizeof(int32_t) * (size_t)n);
  DF_TRY(df_copy(ctx, r->sd_dids, dev, r->sd_ids, DF_DEV_CPU, sizeof(int32_t) * (size_t)n, err));
  const float *h = NULL, *x = NULL;
  DF_TRY(df_eagle3_decode(r->m, r->cache, from, n, in->feats + from * r->W, true, r->sd_dids, in->embed.data,
                          in->embed.shape[0], &h, &x, err));
  r->cached = start;
  DF_TRY(pick(r, x + (n - 1) * r->H, &props[0], err));
  DF_TRY(df_copy(ctx, r->sd_h, dev, h + (n - 1) * r->H, dev, sizeof(float) * (size_t)r->H, err));
  for (int64_t k = 1; k < K; k++) { // the chain: the previous row's layer output and proposal
    r->sd_ids[0] = props[k - 1];
    DF_TRY(df_copy(ctx, r->sd_dids, dev, r->sd_ids, DF_DEV_CPU, sizeof(int32_t), err));
    DF_TRY(df_eagle3_decode(r->m, r->cache, start + k - 1, 1, r->sd_h, false, r->sd_dids, in->embed.data,
                            in->embed.shape[0], &h, &x, err));
    DF_TRY(pick(r, x, &props[k], err));
    DF_TRY(df_copy(ctx, r->sd_h, dev, h, dev, sizeof(float) * (size_t)r->H, err));
  }
  return DF_OK;
}
