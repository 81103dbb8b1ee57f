// The block strategies' shared micro-step (strategies/dflash/family.h; docs/dflash-step.md): anchors from the
// run's stream (or per-sample streams in eval), the stage, the backbone forward, the strategy's objective, the FFN
// kind's loss term and the backward.
#include "strategies/dflash/family.h"

#include <stdlib.h>
#include <string.h>

df_status df_block_open(df_block_run *b, const df_strategy *table, const df_strategy_env *env, const df_block_hooks *h,
                        bool last_hidden, int64_t stats_len, df_error *err) {
  b->base.table = table, b->base.ctx = env->ctx;
  b->env = *env;
  b->hooks = *h;
  b->stats_len = stats_len;
  const df_stage_spec spec = {.block_size = env->cfg->block_size,
                              .vocab = env->frozen.vocab,
                              .hidden = env->frozen.hidden,
                              .mask_token_id = env->mask_token_id,
                              .last_hidden = last_hidden,
                              .storage = df_draft_model_storage(env->model)};
  return df_stage_create(env->ctx, &spec, &b->stage, err);
}

void df_block_close(df_block_run *b) {
  if (!b) return;
  df_stage_free(b->stage);
  df_ctx *ctx = b->env.ctx;
  if (b->dids) df_buffer_free(ctx, b->dids);
  if (b->dints) df_buffer_free(ctx, b->dints);
  if (b->block_embed) df_buffer_free(ctx, b->block_embed);
  if (b->dkeep) df_buffer_free(ctx, b->dkeep);
  free(b->ids), free(b->ints);
}

df_tensor df_block_head(const df_block_run *b) {
  const df_frozen *fz = &b->env.frozen;
  return df_view_on(fz->dtype, df_ctx_device(b->env.ctx), fz->lm_head, fz->vocab, fz->hidden);
}

int32_t df_block_argmax(const float *z, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; v++)
    if (z[v] > z[best]) best = v;
  return (int32_t)best;
}

// ---- anchors -------------------------------------------------------------------------------------------------------

// Training: the run's stream, replayed over the global batch on several ranks (strategies/dflash/dflash.h). The
// stream's state is a df_dflash_sampler, whose one member is the df_rng the checkpoint saves.
static df_status train_anchors(const df_block_run *b, const df_micro_args *a, df_dflash_anchors *out, df_error *err) {
  const df_batch *bt = a->batch;
  df_dflash_sampler *s = (df_dflash_sampler *)a->anchor_rng;
  if (a->world > 1) {
    const df_dflash_global_batch g = {
        .world = a->world, .rank = a->rank, .global_S = a->global_S, .global_cmax = a->global_cmax};
    return df_dflash_sample_anchors_global(s, bt->loss_mask, bt->B, bt->S, b->env.num_anchors, &g, out, err);
  }
  return df_dflash_sample_anchors(s, bt->loss_mask, bt->B, bt->S, b->env.num_anchors, out, err);
}

// Eval: sample i's anchors come from df_dflash_sampler_init(seed + its dataset index), so a sample's blocks depend
// neither on the batch it lands in nor on the padding, and the report is the same for every batch size. Rows are
// padded to the batch's largest block count with keep = 0 blocks; out->N = 0 when no sample has a candidate.
static df_status eval_anchors(const df_block_run *b, const df_micro_args *a, df_dflash_anchors *out, int64_t *skipped,
                              df_error *err) {
  const df_batch *bt = a->batch;
  const int64_t na = b->env.num_anchors;
  memset(out, 0, sizeof *out);
  out->B = bt->B;
  if (!(out->candidates = calloc((size_t)bt->B, sizeof *out->candidates)))
    return DF_FAIL(err, DF_ERR_NOMEM, "eval anchors", NULL, "out of memory");
  for (int64_t i = 0; i < bt->B; i++) {
    out->candidates[i] = df_dflash_max_candidates(bt->loss_mask + i * bt->S, 1, bt->length[i]);
    const int64_t n = out->candidates[i] < na ? out->candidates[i] : na;
    if (n > out->N) out->N = n;
    *skipped += out->candidates[i] == 0;
  }
  if (out->N == 0) return DF_OK;
  out->anchors = calloc((size_t)(bt->B * out->N), sizeof *out->anchors);
  out->keep = calloc((size_t)(bt->B * out->N), 1);
  if (!out->anchors || !out->keep) return DF_FAIL(err, DF_ERR_NOMEM, "eval anchors", NULL, "out of memory");
  for (int64_t i = 0; i < bt->B; i++) {
    if (!out->candidates[i]) continue;
    df_dflash_sampler s;
    df_dflash_sampler_init(&s, a->eval_seed + (uint64_t)bt->index[i]);
    df_dflash_anchors one;
    DF_TRY(df_dflash_sample_anchors(&s, bt->loss_mask + i * bt->S, 1, bt->length[i], na, &one, err));
    memcpy(out->anchors + i * out->N, one.anchors, (size_t)one.N * sizeof *one.anchors);
    memcpy(out->keep + i * out->N, one.keep, (size_t)one.N);
    df_dflash_anchors_free(&one);
  }
  return DF_OK;
}

// ---- the FFN kind's loss term (docs/training.md "MoE drafts") -------------------------------------------------------

// After the objective of a training forward, before the backward. The kind's term A (the MoE routers' aux loss,
// coefficient-scaled; 0 for dense drafts) joins the ratio objective as
//   loss_num += A·loss_den,  so loss = loss_num / loss_den = objective ratio + A,
// and the layers' backward adds A's gradient times ∂(what this backward differentiates)/∂A:
// - grad_scale 0 differentiates loss_num / loss_den: the scale is 1;
// - grad_scale g > 0 (the trainer) differentiates g·loss_num and divides the window's sum by Σ_i loss_den_i at the
//   optimizer boundary: the scale is g·loss_den, so the window's gradient is that of Σ_i (num_i + A_i·den_i) /
//   Σ_i den_i — each micro-batch's term weighted like its objective.
// A micro-batch with no loss weight (loss_den = 0) adds nothing and back-propagates nothing. Data parallel: the term
// is the global batch's (the layers reduce the routing), and its weight the micro-batch's global loss_den — each rank
// adds A·(its own loss_den) to the FFN sums, so the ranks' sums add to A·Σden, and the gradient's scale is
// grad_scale·Σden. With ffn_stats the term reaches loss_num on the device (the layers add A·loss_den into the sums)
// and nothing is read here; otherwise it is read from the layers' records into *term.
static df_status ffn_term(df_block_run *b, const df_micro_args *a, double loss_den, double *term, df_error *err) {
  const df_ffn_set fs = df_draft_model_ffn_set(b->env.model);
  *term = 0.0;
  if (!df_ffn_set_active(&fs)) return DF_OK;
  double den = loss_den;
  if (a->world > 1 && a->dp_sum) {
    float d = (float)loss_den;
    DF_TRY(df_allreduce_host(a->dp_sum, &d, 1, false, err));
    den = d;
  }
  *term = den > 0 && !a->ffn_stats ? df_ffn_set_loss_term(&fs) : 0.0;
  const double scale = den > 0 ? (a->grad_scale > 0 ? a->grad_scale * den : 1.0) : 0.0;
  df_ffn_set_loss_term_grad(&fs, (float)scale);
  return DF_OK;
}

// ---- the micro-step
// --------------------------------------------------------------------------------------------------

static df_status staged_step(df_block_run *b, const df_micro_args *a, const df_dflash_anchors *an, df_micro_info *info,
                             df_error *err) {
  const df_strategy_env *e = &b->env;
  df_staged st;
  DF_TRY(df_stage_prepare(b->stage, a->batch, an, &b->hooks.rows, &st, err));
  info->loss_den = st.loss_den, info->num_blocks = st.num_blocks, info->upload_bytes = st.upload_bytes;
  if (!e->eval) st.model.ffn_stats = a->ffn_stats, st.model.ffn_stats_den = st.loss_den;
  df_tensor hidden;
  DF_TRY(df_stage_forward(e->ctx, e->model, &e->frozen, &st, &hidden, err));
  if (e->eval) return b->hooks.objective(b->hooks.self, b, &st, &hidden, 0.0, NULL, a->stats, err);
  if (!a->accumulate) df_draft_model_zero_grads(e->model); // the heads add their gradients in the objective
  DF_TRY(b->hooks.objective(b->hooks.self, b, &st, &hidden, a->grad_scale, &st.dhidden, a->stats, err));
  DF_TRY(ffn_term(b, a, st.loss_den, &info->ffn_loss, err));
  return df_draft_model_backward(e->model, st.dhidden.data, err);
}

df_status df_block_micro(df_block_run *b, const df_micro_args *a, df_micro_info *info, df_error *err) {
  memset(info, 0, sizeof *info);
  if (!a->batch || !a->stats || (!b->env.eval && !a->anchor_rng))
    return DF_FAIL(err, DF_ERR_INVALID, "micro-step", NULL,
                   "a micro-step needs a batch, a stats vector and, to train, "
                   "the anchor stream");
  df_dflash_anchors an = {0};
  df_status st = b->env.eval ? eval_anchors(b, a, &an, &info->skipped, err) : train_anchors(b, a, &an, err);
  info->N = an.N;
  if (st == DF_OK && an.N > 0) st = staged_step(b, a, &an, info, err);
  df_dflash_anchors_free(&an);
  return st;
}

// ---- speculative decoding ------------------------------------------------------------------------------------------

// Buffers for a context of S rows (grown, never shrunk).
static df_status draft_buffers(df_block_run *b, int64_t S, df_error *err) {
  const int64_t bs = b->env.cfg->block_size, need = 1 + bs + S + bs, H = b->env.frozen.hidden;
  df_ctx *ctx = b->env.ctx;
  if (!b->ids) {
    if (!(b->ids = malloc(sizeof(int32_t) * (size_t)bs)))
      return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
    DF_TRY(df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)bs, (void **)&b->dids, err));
    DF_TRY(df_buffer_alloc(ctx, sizeof(float) * (size_t)(bs * H), (void **)&b->block_embed, err));
    DF_TRY(df_buffer_alloc(ctx, 1, (void **)&b->dkeep, err));
    const uint8_t keep = 1;
    DF_TRY(df_copy(ctx, b->dkeep, df_ctx_device(ctx), &keep, DF_DEV_CPU, 1, err));
  }
  if (need <= b->ints_cap) return DF_OK;
  const int64_t cap = 2 * need;
  free(b->ints);
  if (b->dints) df_buffer_free(ctx, b->dints), b->dints = NULL;
  if (!(b->ints = malloc(sizeof(int32_t) * (size_t)cap)))
    return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
  DF_TRY(df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)cap, (void **)&b->dints, err));
  b->ints_cap = cap;
  return DF_OK;
}

df_status df_block_draft(df_strategy_run *r, const df_draft_round *in, int32_t *props, df_error *err) {
  df_block_run *b = (df_block_run *)r;
  const df_strategy_env *e = &b->env;
  const df_device dev = df_ctx_device(e->ctx);
  const int64_t bs = e->cfg->block_size, S = in->start + 1, H = e->frozen.hidden;
  const int64_t W = (int64_t)e->cfg->dflash.num_target_layer_ids * H;
  DF_TRY(draft_buffers(b, S, err));
  b->ids[0] = in->seq[in->start];
  for (int64_t k = 1; k < bs; k++) b->ids[k] = (int32_t)e->mask_token_id;
  // two uploads: the block's ids, and [anchor, pos_q, pos_kv]
  const uint8_t keep = 1;
  b->ints[0] = (int32_t)in->start;
  df_draft_fill_positions(1, S, 1, bs, b->ints, &keep, b->ints + 1, b->ints + 1 + bs);
  DF_TRY(df_copy(e->ctx, b->dids, dev, b->ids, DF_DEV_CPU, sizeof(int32_t) * (size_t)bs, err));
  DF_TRY(df_copy(e->ctx, b->dints, dev, b->ints, DF_DEV_CPU, sizeof(int32_t) * (size_t)(1 + bs + S + bs), err));
  df_tensor ids = df_view(b->dids, DF_I32, dev, 1, (const int64_t[]){bs});
  df_tensor out = df_view(b->block_embed, DF_F32, dev, 2, (const int64_t[]){bs, H});
  DF_TRY(df_embedding_forward(e->ctx, &in->embed, &ids, &out, err));
  // Row `start` of the context is masked (keys j < anchor), so any value serves; it holds zeros.
  df_tensor row = df_view(in->feats + in->start * W, DF_F32, dev, 1, (const int64_t[]){W});
  DF_TRY(df_fill(e->ctx, &row, 0.0, err));
  df_draft_batch db = {.B = 1,
                       .S = S,
                       .N = 1,
                       .target_hidden = in->feats,
                       .block_embed = b->block_embed,
                       .anchors = b->dints,
                       .keep = b->dkeep,
                       .pos_q = b->dints + 1,
                       .pos_kv = b->dints + 1 + bs,
                       .on_device = true};
  const float *hidden = NULL;
  DF_TRY(df_draft_model_forward(e->model, &db, &hidden, err));
  const df_propose_in pin = {.hidden = hidden, .anchor_token = in->seq[in->start], .lm_head = in->lm_head};
  return r->table->propose(r, &pin, props, err);
}
