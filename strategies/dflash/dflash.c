// DFlash anchors, block construction and the chunked objective (docs/dflash-step.md §2, §3, §5). D-PACE's
// detached weights are in dpace.c.
#include "strategies/dflash/dflash.h"

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

// One sample: draws = S_pad − 1 uniforms for a row padded to S_pad ≥ S (positions past the sample's padded row
// are padding, never valid), valid positions ordered by (key, p); the first `take` become its sorted anchors.
static void sample_row(df_rng *rng, const uint8_t *mask, int64_t S, int64_t draws, int64_t take, anchor_key *scratch,
                       int32_t *anchors) {
  int64_t c = 0;
  for (int64_t p = 0; p < draws; p++) {
    double u = df_rng_uniform(rng);
    if (p + 1 < S && anchor_valid(mask, S, p)) scratch[c++] = (anchor_key){u, p};
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

int64_t df_dflash_max_candidates(const uint8_t *loss_mask, int64_t B, int64_t S) {
  int64_t cmax = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t c = count_candidates(loss_mask + b * S, S);
    if (c > cmax) cmax = c;
  }
  return cmax;
}

df_status df_dflash_sample_anchors_global(df_dflash_sampler *s, const uint8_t *loss_mask, int64_t B, int64_t S,
                                          int64_t num_anchors, const df_dflash_global_batch *g, df_dflash_anchors *out,
                                          df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_anchor_args(loss_mask, B, S, num_anchors, err));
  if (g->world < 1 || g->rank < 0 || g->rank >= g->world || g->global_S < S)
    return DF_FAIL(err, DF_ERR_INVALID, "anchors", NULL, "bad global batch: rank %d of %d, global S %lld < S %lld",
                   g->rank, g->world, (long long)g->global_S, (long long)S);
  int64_t *cand = calloc((size_t)B, sizeof *cand);
  if (!cand) return DF_FAIL(err, DF_ERR_NOMEM, "anchors", NULL, "out of memory");
  for (int64_t b = 0; b < B; b++) cand[b] = count_candidates(loss_mask + b * S, S);
  if (g->global_cmax == 0) {
    free(cand);
    return DF_FAIL(err, DF_ERR_INVALID, "loss_mask", "every sample needs two consecutive supervised tokens",
                   "no valid anchor in the batch (B = %lld, S = %lld)", (long long)(B * g->world),
                   (long long)g->global_S);
  }
  int64_t N = num_anchors < g->global_cmax ? num_anchors : g->global_cmax;
  out->B = B, out->N = N, out->candidates = cand;
  out->anchors = calloc((size_t)(B * N), sizeof *out->anchors);
  out->keep = calloc((size_t)(B * N), 1);
  anchor_key *scratch = malloc((size_t)S * sizeof *scratch);
  if (!out->anchors || !out->keep || !scratch) {
    free(scratch);
    df_dflash_anchors_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "anchors", NULL, "out of memory for %lld anchors", (long long)(B * N));
  }
  const int64_t draws = g->global_S - 1;
  for (int64_t j = 0; j < B * g->world; j++) { // global slot j belongs to rank j mod world
    if (j % g->world != g->rank) {
      for (int64_t p = 0; p < draws; p++) (void)df_rng_next_u64(&s->rng);
      continue;
    }
    int64_t b = j / g->world, take = cand[b] < N ? cand[b] : N;
    sample_row(&s->rng, loss_mask + b * S, S, draws, take, scratch, out->anchors + b * N);
    memset(out->keep + b * N, 1, (size_t)take);
  }
  free(scratch);
  return DF_OK;
}

df_status df_dflash_sample_anchors(df_dflash_sampler *s, const uint8_t *loss_mask, int64_t B, int64_t S,
                                   int64_t num_anchors, df_dflash_anchors *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_anchor_args(loss_mask, B, S, num_anchors, err));
  df_dflash_global_batch g = {
      .world = 1, .rank = 0, .global_S = S, .global_cmax = df_dflash_max_candidates(loss_mask, B, S)};
  return df_dflash_sample_anchors_global(s, loss_mask, B, S, num_anchors, &g, out, err);
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

static df_status check_options(const df_dflash_loss_options *opt, df_error *err) {
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

static df_status check_rows_hidden(const df_tensor *hidden, int64_t rows, df_error *err) {
  if (rows <= 0 || !hidden || hidden->ndim < 2 || df_numel(hidden) != rows * hidden->shape[hidden->ndim - 1])
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "pass the draft output (B·N·bs, H)",
                   "hidden does not hold B·N·bs = %lld rows", (long long)rows);
  return DF_OK;
}

double df_dflash_loss_den(const df_dflash_loss_options *opt, const df_dflash_blocks *blk) {
  if (df_dflash_loss_type_is_dpace(opt->type)) return (double)blk->B;
  double s = 0;
  for (int64_t r = 0; r < blk->B * blk->N * blk->bs; r++) s += blk->weights[r];
  return s;
}

// One pass of the fused LM head + CE over all rows, chunk_blocks·bs rows at a time.
static df_status lmhead_pass(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                             const df_tensor *head, const df_dflash_rows *rows, const df_tensor *row_w,
                             float grad_scale, df_dflash_work *w, df_tensor *dhidden, df_error *err) {
  df_lmhead_ce_desc desc = {.chunk_rows = opt->chunk_blocks * rows->bs, .grad_scale = grad_scale};
  return df_lmhead_ce(ctx, &desc, hidden, head, &rows->labels, row_w, &w->ce, &w->correct, dhidden, err);
}

df_status df_dflash_objective_rows(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                                   const df_tensor *head, const df_dflash_rows *rows, df_dflash_work *w,
                                   df_tensor *dhidden, df_tensor *stats, df_error *err) {
  if (!opt || !rows || !w || !stats)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dflash_objective_rows");
  DF_TRY(check_options(opt, err));
  DF_TRY(check_rows_hidden(hidden, rows->B * rows->N * rows->bs, err));
  if (!df_dflash_loss_type_is_dpace(opt->type)) {
    // DFlash: loss_num = Σ CE·w, loss_den = Σ w; one pass with row weights w and grad_scale 1/Σw.
    float scale = rows->loss_den > 0 ? (float)(1.0 / rows->loss_den) : 0.0f;
    DF_TRY(lmhead_pass(ctx, opt, hidden, head, rows, &rows->weights, scale, w, dhidden, err));
    return df_block_metrics(ctx, rows->bs, &w->ce, &w->correct, &rows->weights, &rows->binary, &rows->keep, stats, err);
  }
  // D-PACE: CE forward-only, detached weights per block from it, then (for the gradient) a second pass with row
  // weights binary·weight and grad_scale 1/B; loss_num = Σ CE·binary·weight, loss_den = B. As in SpecForge,
  // D-PACE weighs slots by the binary weight: loss_decay_gamma does not apply to it.
  DF_TRY(lmhead_pass(ctx, opt, hidden, head, rows, NULL, 1.0f, w, NULL, err));
  DF_TRY(df_dpace_weights(ctx, df_dflash_dpace_mode(opt->type), opt->dpace_alpha, rows->bs, &w->ce, &rows->binary_f,
                          &w->dpace, &w->row_w, err));
  DF_TRY(df_block_metrics(ctx, rows->bs, &w->ce, &w->correct, &w->row_w, &rows->binary, &rows->keep, stats, err));
  if (!dhidden) return DF_OK;
  return lmhead_pass(ctx, opt, hidden, head, rows, &w->row_w, (float)(1.0 / rows->loss_den), w, dhidden, err);
}

df_status df_dflash_metrics_from_stats(const double *st, int64_t bs, double loss_den, df_dflash_metrics *out,
                                       df_error *err) {
  memset(out, 0, sizeof *out);
  out->bs = bs;
  out->loss_num = st[DF_BSTAT_LOSS_NUM], out->loss_den = loss_den;
  out->acc_num = st[DF_BSTAT_ACC_NUM], out->acc_den = st[DF_BSTAT_ACC_DEN];
  out->accept_len_sum = st[DF_BSTAT_ACCEPT_SUM], out->num_blocks = (int64_t)st[DF_BSTAT_BLOCKS];
  out->pos_acc_num = malloc((size_t)bs * sizeof(double));
  out->pos_acc_den = malloc((size_t)bs * sizeof(double));
  if (!out->pos_acc_num || !out->pos_acc_den) {
    df_dflash_metrics_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  }
  memcpy(out->pos_acc_num, st + DF_BSTAT_POS, (size_t)bs * sizeof(double));
  memcpy(out->pos_acc_den, st + DF_BSTAT_POS + bs, (size_t)bs * sizeof(double));
  return DF_OK;
}

// ---- the objective on host arrays --------------------------------------------------------------------------

// Device buffers of the host-array entry point (one allocation, carved).
typedef struct {
  void *buf;
  df_dflash_rows rows;
  df_dflash_work work;
  df_tensor stats;
} host_objective;

static df_status host_objective_stage(df_ctx *ctx, const df_dflash_loss_options *opt, const df_dflash_blocks *blk,
                                      const df_dflash_anchors *a, host_objective *h, df_error *err) {
  const int64_t R = blk->B * blk->N * blk->bs, nb = blk->B * blk->N, ns = DF_BLOCK_STATS(blk->bs);
  const df_device dev = df_ctx_device(ctx);
  // layout: stats f64 | labels i32 | weights, binary_f, ce, dpace, row_w f32 | binary, correct u8 | keep u8
  const size_t bytes = (size_t)ns * 8 + (size_t)R * (4 * 6 + 2) + (size_t)nb;
  DF_TRY(df_buffer_alloc(ctx, bytes, &h->buf, err));
  char *p = h->buf;
  h->stats = df_f64_on(dev, p, ns), p += ns * 8;
  int32_t *labels = (int32_t *)p;
  h->rows.labels = df_i32_on(dev, p, R), p += R * 4;
  h->rows.weights = df_f32_on(dev, p, R), p += R * 4;
  h->rows.binary_f = df_f32_on(dev, p, R), p += R * 4;
  h->work.ce = df_f32_on(dev, p, R), p += R * 4;
  h->work.dpace = df_f32_on(dev, p, R), p += R * 4;
  h->work.row_w = df_f32_on(dev, p, R), p += R * 4;
  h->rows.binary = df_u8_on(dev, p, R), p += R;
  h->work.correct = df_u8_on(dev, p, R), p += R;
  h->rows.keep = df_u8_on(dev, p, nb);
  h->rows.B = blk->B, h->rows.N = blk->N, h->rows.bs = blk->bs;
  h->rows.loss_den = df_dflash_loss_den(opt, blk);
  float *bf = malloc((size_t)R * sizeof(float));
  if (!bf) return DF_FAIL(err, DF_ERR_NOMEM, "objective", NULL, "out of memory for %lld rows", (long long)R);
  for (int64_t r = 0; r < R; r++) bf[r] = blk->binary[r];
  df_status st = df_copy(ctx, labels, dev, blk->labels, DF_DEV_CPU, (size_t)R * 4, err);
  if (st == DF_OK) st = df_copy(ctx, h->rows.weights.data, dev, blk->weights, DF_DEV_CPU, (size_t)R * 4, err);
  if (st == DF_OK) st = df_copy(ctx, h->rows.binary_f.data, dev, bf, DF_DEV_CPU, (size_t)R * 4, err);
  if (st == DF_OK) st = df_copy(ctx, h->rows.binary.data, dev, blk->binary, DF_DEV_CPU, (size_t)R, err);
  if (st == DF_OK) st = df_copy(ctx, h->rows.keep.data, dev, a->keep, DF_DEV_CPU, (size_t)nb, err);
  free(bf);
  if (st == DF_OK) st = df_fill(ctx, &h->stats, 0.0, err);
  return st;
}

static df_status check_objective(const df_dflash_loss_options *opt, const df_tensor *hidden,
                                 const df_dflash_blocks *blk, const df_dflash_anchors *a, df_error *err) {
  if (!opt || !hidden || !blk || !a)
    return DF_FAIL(err, DF_ERR_INVALID, "objective", NULL, "NULL argument to df_dflash_objective");
  if (blk->B != a->B || blk->N != a->N)
    return DF_FAIL(err, DF_ERR_INVALID, "blocks", "build the blocks from these anchors",
                   "blocks are (%lld, %lld) but anchors (%lld, %lld)", (long long)blk->B, (long long)blk->N,
                   (long long)a->B, (long long)a->N);
  DF_TRY(check_rows_hidden(hidden, blk->B * blk->N * blk->bs, err));
  return check_options(opt, err);
}

df_status df_dflash_objective(df_ctx *ctx, const df_dflash_loss_options *opt, const df_tensor *hidden,
                              const df_tensor *head, const df_dflash_blocks *blk, const df_dflash_anchors *a,
                              float *dhidden, df_dflash_metrics *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_objective(opt, hidden, blk, a, err));
  host_objective h = {0};
  const int64_t R = blk->B * blk->N * blk->bs, ns = DF_BLOCK_STATS(blk->bs);
  double *st_host = malloc((size_t)ns * sizeof(double));
  df_status st = st_host ? host_objective_stage(ctx, opt, blk, a, &h, err)
                         : DF_FAIL(err, DF_ERR_NOMEM, "objective", NULL, "out of memory");
  df_tensor dh = df_f32_on(df_ctx_device(ctx), dhidden, R, hidden->shape[hidden->ndim - 1]);
  if (st == DF_OK)
    st = df_dflash_objective_rows(ctx, opt, hidden, head, &h.rows, &h.work, dhidden ? &dh : NULL, &h.stats, err);
  if (st == DF_OK) st = df_copy(ctx, st_host, DF_DEV_CPU, h.stats.data, df_ctx_device(ctx), (size_t)ns * 8, err);
  if (st == DF_OK) st = df_dflash_metrics_from_stats(st_host, blk->bs, h.rows.loss_den, out, err);
  free(st_host);
  df_buffer_free(ctx, h.buf);
  return st;
}
