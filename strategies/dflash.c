// DFlash anchors, block construction and the chunked objective (docs/dflash-step.md §2, §3, §5). D-PACE's
// detached weights are in dpace.c.
#include "strategies/dflash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void df_dflash_sampler_init(df_dflash_sampler *s, uint64_t seed) { df_rng_init(&s->rng, seed, DF_RNG_STREAM_ANCHORS); }

void df_dflash_anchors_free(df_dflash_anchors *a) {
  if (!a) return;
  free(a->anchors), free(a->keep), free(a->candidates);
  memset(a, 0, sizeof *a);
}

static bool anchor_valid(const uint8_t *mask, int64_t S, int64_t p) { return p <= S - 2 && mask[p] && mask[p + 1]; }

typedef struct {
  double key;
  int64_t p;
} anchor_key;

static int cmp_key(const void *x, const void *y) {
  const anchor_key *a = x, *b = y;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return (a->p > b->p) - (a->p < b->p);
}

static int cmp_i32(const void *x, const void *y) {
  int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
  return (a > b) - (a < b);
}

// One sample: S−1 draws, valid positions ordered by (key, p); the first `take` become its sorted anchors.
static void sample_row(df_rng *rng, const uint8_t *mask, int64_t S, int64_t take, anchor_key *scratch,
                       int32_t *anchors) {
  int64_t c = 0;
  for (int64_t p = 0; p + 1 < S; p++) {
    double u = df_rng_uniform(rng);
    if (anchor_valid(mask, S, p)) scratch[c++] = (anchor_key){u, p};
  }
  qsort(scratch, (size_t)c, sizeof *scratch, cmp_key);
  for (int64_t i = 0; i < take; i++) anchors[i] = (int32_t)scratch[i].p;
  qsort(anchors, (size_t)take, sizeof *anchors, cmp_i32);
}

static df_status check_anchor_args(const uint8_t *loss_mask, int64_t B, int64_t S, int64_t num_anchors, df_error *err) {
  if (!loss_mask || B < 1 || S < 1 || S > INT32_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "loss_mask", "pass a (B, S) mask with B, S >= 1",
                   "bad anchor batch: B = %lld, S = %lld", (long long)B, (long long)S);
  if (num_anchors < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.num_anchors", "set training.num_anchors >= 1", "num_anchors = %lld",
                   (long long)num_anchors);
  return DF_OK;
}

static int64_t count_candidates(const uint8_t *mask, int64_t S) {
  int64_t c = 0;
  for (int64_t p = 0; p + 1 < S; p++) c += anchor_valid(mask, S, p);
  return c;
}

df_status df_dflash_sample_anchors(df_dflash_sampler *s, const uint8_t *loss_mask, int64_t B, int64_t S,
                                   int64_t num_anchors, df_dflash_anchors *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_anchor_args(loss_mask, B, S, num_anchors, err));
  int64_t *cand = calloc((size_t)B, sizeof *cand), cmax = 0;
  if (!cand) return DF_FAIL(err, DF_ERR_NOMEM, "anchors", NULL, "out of memory");
  for (int64_t b = 0; b < B; b++) {
    cand[b] = count_candidates(loss_mask + b * S, S);
    if (cand[b] > cmax) cmax = cand[b];
  }
  if (cmax == 0) {
    free(cand);
    return DF_FAIL(err, DF_ERR_INVALID, "loss_mask", "every sample needs two consecutive supervised tokens",
                   "no valid anchor in the batch (B = %lld, S = %lld)", (long long)B, (long long)S);
  }
  int64_t N = num_anchors < cmax ? num_anchors : cmax;
  out->B = B, out->N = N, out->candidates = cand;
  out->anchors = calloc((size_t)(B * N), sizeof *out->anchors);
  out->keep = calloc((size_t)(B * N), 1);
  anchor_key *scratch = malloc((size_t)S * sizeof *scratch);
  if (!out->anchors || !out->keep || !scratch) {
    free(scratch);
    df_dflash_anchors_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "anchors", NULL, "out of memory for %lld anchors", (long long)(B * N));
  }
  for (int64_t b = 0; b < B; b++) {
    int64_t take = cand[b] < N ? cand[b] : N;
    sample_row(&s->rng, loss_mask + b * S, S, take, scratch, out->anchors + b * N);
    memset(out->keep + b * N, 1, (size_t)take);
  }
  free(scratch);
  return DF_OK;
}

// ---- blocks ------------------------------------------------------------------------------------------------

void df_dflash_blocks_free(df_dflash_blocks *blk) {
  if (!blk) return;
  free(blk->input_ids), free(blk->positions), free(blk->labels), free(blk->binary), free(blk->weights);
  memset(blk, 0, sizeof *blk);
}

static df_status alloc_blocks(df_dflash_blocks *o, int64_t rows, df_error *err) {
  o->input_ids = malloc((size_t)rows * sizeof(int32_t));
  o->positions = malloc((size_t)rows * sizeof(int32_t));
  o->labels = malloc((size_t)rows * sizeof(int32_t));
  o->binary = malloc((size_t)rows);
  o->weights = malloc((size_t)rows * sizeof(float));
  if (o->input_ids && o->positions && o->labels && o->binary && o->weights) return DF_OK;
  df_dflash_blocks_free(o);
  return DF_FAIL(err, DF_ERR_NOMEM, "blocks", NULL, "out of memory for %lld block rows", (long long)rows);
}

// One block of sample b: slot k of anchor a.
static void fill_block(const int32_t *ids, const uint8_t *mask, int64_t S, int32_t anchor, bool keep, int64_t bs,
                       int32_t mask_id, const float *decay, df_dflash_blocks *o, int64_t row0) {
  for (int64_t k = 0; k < bs; k++) {
    int64_t pos = anchor + k, r = row0 + k;
    bool in_range = pos < S;
    bool bin = keep && in_range && k > 0 && mask[pos];
    o->input_ids[r] = (k == 0 && keep) ? ids[anchor] : mask_id;
    o->positions[r] = (int32_t)pos;
    o->labels[r] = bin ? ids[pos] : -1;
    o->binary[r] = bin;
    o->weights[r] = bin ? decay[k] : 0.0f;
  }
}

df_status df_dflash_build_blocks(const int32_t *input_ids, const uint8_t *loss_mask, int64_t S,
                                 const df_dflash_anchors *a, int64_t bs, int64_t mask_token_id, double gamma,
                                 df_dflash_blocks *out, df_error *err) {
  memset(out, 0, sizeof *out);
  if (bs < 2) return DF_FAIL(err, DF_ERR_INVALID, "block_size", "block_size must be >= 2", "bs = %lld", (long long)bs);
  if (mask_token_id < 0 || mask_token_id > INT32_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "mask_token_id", "set model.mask_token_id or dflash_config.mask_token_id",
                   "mask_token_id = %lld", (long long)mask_token_id);
  if (!(gamma >= 0) || !isfinite(gamma))
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_decay_gamma", "use 0 (off) or a positive value",
                   "loss_decay_gamma = %g", gamma);
  int64_t B = a->B, N = a->N;
  DF_TRY(alloc_blocks(out, B * N * bs, err));
  out->B = B, out->N = N, out->bs = bs;
  float *decay = malloc((size_t)bs * sizeof *decay);
  if (!decay) {
    df_dflash_blocks_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "blocks", NULL, "out of memory");
  }
  for (int64_t k = 0; k < bs; k++) decay[k] = gamma > 0 ? (float)exp(-(double)(k - 1) / gamma) : 1.0f;
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++)
      fill_block(input_ids + b * S, loss_mask + b * S, S, a->anchors[b * N + n], a->keep[b * N + n], bs,
                 (int32_t)mask_token_id, decay, out, (b * N + n) * bs);
  free(decay);
  return DF_OK;
}

// ---- objective ---------------------------------------------------------------------------------------------

void df_dflash_metrics_free(df_dflash_metrics *m) {
  if (!m) return;
  free(m->pos_acc_num), free(m->pos_acc_den);
  m->pos_acc_num = m->pos_acc_den = NULL;
}

// Scratch of one objective call: per-row CE, correct flags, D-PACE weights and the row weights fed to the op.
typedef struct {
  float *ce, *dpace, *row_w;
  uint8_t *correct;
} objective_scratch;

static void scratch_free(objective_scratch *s) { free(s->ce), free(s->dpace), free(s->row_w), free(s->correct); }

static df_status scratch_alloc(objective_scratch *s, int64_t R, bool dpace, df_error *err) {
  memset(s, 0, sizeof *s);
  s->ce = malloc((size_t)R * sizeof(float));
  s->correct = malloc((size_t)R);
  if (dpace) {
    s->dpace = malloc((size_t)R * sizeof(float));
    s->row_w = malloc((size_t)R * sizeof(float));
  }
  if (s->ce && s->correct && (!dpace || (s->dpace && s->row_w))) return DF_OK;
  scratch_free(s);
  return DF_FAIL(err, DF_ERR_NOMEM, "objective", NULL, "out of memory for %lld rows", (long long)R);
}

static df_status check_objective(const df_dflash_loss_options *opt, const df_tensor *hidden,
                                 const df_dflash_blocks *blk, const df_dflash_anchors *a, df_error *err) {
  if (!opt || !hidden || !blk || !a)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dflash_objective");
  if (blk->B != a->B || blk->N != a->N)
    return DF_FAIL(err, DF_ERR_INVALID, "blocks", "build the blocks from these anchors",
                   "blocks are (%lld, %lld) but anchors (%lld, %lld)", (long long)blk->B, (long long)blk->N,
                   (long long)a->B, (long long)a->N);
  int64_t rows = blk->B * blk->N * blk->bs;
  if (rows <= 0 || hidden->ndim < 2 || df_numel(hidden) != rows * hidden->shape[hidden->ndim - 1])
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "pass the draft output (B·N·bs, H)",
                   "hidden does not hold B·N·bs = %lld rows", (long long)rows);
  if ((unsigned)opt->type > DF_LOSS_DPACE_CONTVALUE)
    return DF_FAIL(err, DF_ERR_INVALID, "training.loss_type", NULL, "unknown loss type %d", (int)opt->type);
  if (!(opt->dpace_alpha >= 0 && opt->dpace_alpha <= 1))
    return DF_FAIL(err, DF_ERR_INVALID, "training.dpace_alpha", "use a value in [0, 1]", "dpace_alpha = %g",
                   opt->dpace_alpha);
  if (opt->chunk_blocks < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "training.objective_chunk_blocks", "use 0 (one pass) or a positive count",
                   "objective_chunk_blocks = %lld", (long long)opt->chunk_blocks);
  return DF_OK;
}

// One pass of the fused LM head + CE over all rows, chunk_blocks·bs rows at a time.
static df_status lmhead_pass(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                             const df_tensor *head, const df_dflash_blocks *blk, const float *row_w, float grad_scale,
                             objective_scratch *s, float *dhidden, df_error *err) {
  int64_t R = blk->B * blk->N * blk->bs, H = hidden->shape[hidden->ndim - 1];
  df_tensor labels = df_i32(blk->labels, R), loss = df_f32(s->ce, R), correct = df_u8(s->correct, R);
  df_tensor weights = df_f32((float *)row_w, R), dh = df_f32(dhidden, R, H);
  df_lmhead_ce_desc desc = {.chunk_rows = opt->chunk_blocks * blk->bs, .grad_scale = grad_scale};
  return df_lmhead_ce(ctx, &desc, hidden, head, &labels, row_w ? &weights : NULL, &loss, &correct, dhidden ? &dh : NULL,
                      err);
}

static double weight_sum(const float *w, int64_t R) {
  double s = 0;
  for (int64_t r = 0; r < R; r++) s += w[r];
  return s;
}

// DFlash: loss_num = Σ CE·w, loss_den = Σ w, one pass with row weights w and grad_scale 1/Σw.
static df_status objective_dflash(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                                  const df_tensor *head, const df_dflash_blocks *blk, objective_scratch *s,
                                  float *dhidden, df_dflash_metrics *out, df_error *err) {
  int64_t R = blk->B * blk->N * blk->bs;
  out->loss_den = weight_sum(blk->weights, R);
  float scale = out->loss_den > 0 ? (float)(1.0 / out->loss_den) : 0.0f;
  DF_TRY(lmhead_pass(ctx, opt, hidden, head, blk, blk->weights, scale, s, dhidden, err));
  for (int64_t r = 0; r < R; r++) out->loss_num += (double)s->ce[r] * blk->weights[r];
  return DF_OK;
}

// D-PACE: CE forward-only, detached weights per block, then (for the gradient) a second pass with row weights
// binary·weight and grad_scale 1/B. loss_num = Σ CE·binary·weight, loss_den = B.
static df_status objective_dpace(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                                 const df_tensor *head, const df_dflash_blocks *blk, objective_scratch *s,
                                 float *dhidden, df_dflash_metrics *out, df_error *err) {
  int64_t R = blk->B * blk->N * blk->bs;
  DF_TRY(lmhead_pass(ctx, opt, hidden, head, blk, NULL, 1.0f, s, NULL, err));
  // As in SpecForge, D-PACE weighs slots by the binary weight: loss_decay_gamma does not apply to it.
  for (int64_t r = 0; r < R; r++) s->row_w[r] = blk->binary[r];
  DF_TRY(df_dpace_weights(opt->type, opt->dpace_alpha, s->ce, s->row_w, blk->B * blk->N, blk->bs, s->dpace, err));
  for (int64_t r = 0; r < R; r++) {
    out->loss_num += (double)s->ce[r] * s->row_w[r] * s->dpace[r];
    s->row_w[r] *= s->dpace[r];
  }
  out->loss_den = (double)blk->B;
  if (!dhidden) return DF_OK;
  return lmhead_pass(ctx, opt, hidden, head, blk, s->row_w, (float)(1.0 / out->loss_den), s, dhidden, err);
}

// 1 + the leading run of correct slots k >= 1; slots without weight are skipped, not counted.
static int64_t accept_len(const uint8_t *binary, const uint8_t *correct, int64_t bs) {
  int64_t run = 0;
  for (int64_t k = 1; k < bs; k++) {
    if (!binary[k]) continue;
    if (!correct[k]) break;
    run++;
  }
  return 1 + run;
}

static df_status collect_metrics(const df_dflash_blocks *blk, const df_dflash_anchors *a, const uint8_t *correct,
                                 df_dflash_metrics *out, df_error *err) {
  int64_t bs = blk->bs, nb = blk->B * blk->N;
  out->bs = bs;
  out->pos_acc_num = calloc((size_t)bs, sizeof(double));
  out->pos_acc_den = calloc((size_t)bs, sizeof(double));
  if (!out->pos_acc_num || !out->pos_acc_den) {
    df_dflash_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  for (int64_t i = 0; i < nb; i++) {
    const uint8_t *bin = blk->binary + i * bs, *cor = correct + i * bs;
    for (int64_t k = 0; k < bs; k++) {
      out->pos_acc_num[k] += bin[k] && cor[k];
      out->pos_acc_den[k] += bin[k];
    }
    if (!a->keep[i]) continue;
    out->num_blocks++;
    out->accept_len_sum += (double)accept_len(bin, cor, bs);
  }
  for (int64_t k = 0; k < bs; k++) out->acc_num += out->pos_acc_num[k], out->acc_den += out->pos_acc_den[k];
  return DF_OK;
}

df_status df_dflash_objective(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                              const df_tensor *head, const df_dflash_blocks *blk, const df_dflash_anchors *a,
                              float *dhidden, df_dflash_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_objective(opt, hidden, blk, a, err));
  bool dpace = df_dflash_loss_type_is_dpace(opt->type);
  objective_scratch s;
  DF_TRY(scratch_alloc(&s, blk->B * blk->N * blk->bs, dpace, err));
  df_status st = dpace ? objective_dpace(ctx, opt, hidden, head, blk, &s, dhidden, out, err)
                       : objective_dflash(ctx, opt, hidden, head, blk, &s, dhidden, out, err);
  if (st == DF_OK) st = collect_metrics(blk, a, s.correct, out, err);
  scratch_free(&s);
  if (st != DF_OK) df_dflash_metrics_free(out);
  return st;
}
