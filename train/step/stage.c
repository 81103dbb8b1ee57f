// The micro-batch stage (train/step/stage.h): host build and checks, one packed asynchronous upload per micro-batch
// into one of two alternating slots, and the step's device scratch.
#include "train/step/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  void *host;   // page-locked staging copy (NULL when the backend is host-addressable)
  void *dev;    // the slot on the device
  size_t cap;   // bytes of each
  df_event *ev; // recorded after the slot's last upload
  bool pending; // an upload was queued since the last wait
} slot;

struct df_stage {
  df_ctx *ctx;
  df_device dev;
  df_stage_spec spec;
  bool direct; // host-addressable backend: build in place, read the batch's features where they are
  slot slots[2];
  int next;
  void *scratch;
  size_t scratch_cap;
};

// Hands out 64-byte aligned pieces of a region; with base NULL it only measures.
typedef struct {
  char *base;
  size_t off;
} carver;

static void *carve(carver *c, int64_t bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += ((size_t)(bytes > 0 ? bytes : 0) + 63) & ~(size_t)63;
  return p;
}

typedef struct {
  int64_t B, S, N, bs, R, KH, H;
  bool dspark, teacher;
} dims;

// The uploaded arrays, in slot order (th and last only when they are copied).
typedef struct {
  float *th, *last;
  int32_t *anchors, *pos_q, *pos_kv, *ids, *labels;
  uint8_t *keep, *binary;
  float *weights, *binary_f;
  int32_t *dlabels, *prev, *tidx;
  uint8_t *valid;
  float *dweights;
} packed;

static void pack_layout(carver *c, const dims *d, bool copy_features, packed *p) {
  const int64_t R = d->R, BN = d->B * d->N, i4 = 4, f4 = 4;
  *p = (packed){0};
  if (copy_features) p->th = carve(c, d->B * d->S * d->KH * f4);
  if (copy_features && d->teacher) p->last = carve(c, d->B * d->S * d->H * f4);
  p->anchors = carve(c, BN * i4);
  p->keep = carve(c, BN);
  p->pos_q = carve(c, R * i4);
  p->pos_kv = carve(c, d->B * (d->S + d->N * d->bs) * i4);
  p->ids = carve(c, R * i4);
  if (d->dspark) {
    p->dlabels = carve(c, R * i4), p->prev = carve(c, R * i4), p->tidx = carve(c, R * i4);
    p->valid = carve(c, R), p->dweights = carve(c, R * f4);
  } else {
    p->labels = carve(c, R * i4), p->weights = carve(c, R * f4), p->binary_f = carve(c, R * f4);
    p->binary = carve(c, R);
  }
}

// The device scratch: block embeddings, d(hidden), stats, and the kind's objective buffers.
static void scratch_layout(carver *c, const dims *d, int64_t rank, df_device dev, df_staged *o) {
  const int64_t R = d->R, H = d->H, ns = DF_DSPARK_STATS(d->bs);
  o->block_embed = df_f32_on(dev, carve(c, R * H * 4), R, H);
  o->dhidden = df_f32_on(dev, carve(c, R * H * 4), R, H);
  o->stats = df_f64_on(dev, carve(c, ns * 8), ns);
  if (!d->dspark) {
    df_dflash_work *w = &o->dflash_w;
    w->ce = df_f32_on(dev, carve(c, R * 4), R), w->dpace = df_f32_on(dev, carve(c, R * 4), R);
    w->row_w = df_f32_on(dev, carve(c, R * 4), R), w->correct = df_u8_on(dev, carve(c, R), R);
    return;
  }
  df_dspark_work *w = &o->dspark_w;
  df_tensor *f32s[] = {&w->ce, &w->top1, &w->l1, &w->ttop1, &w->bce, &w->dconf};
  for (size_t i = 0; i < sizeof f32s / sizeof *f32s; i++) *f32s[i] = df_f32_on(dev, carve(c, R * 4), R);
  w->correct = df_u8_on(dev, carve(c, R), R), w->agree = df_u8_on(dev, carve(c, R), R);
  w->du = df_f32_on(dev, carve(c, R * (rank > 0 ? rank : 1) * 4), R, rank > 0 ? rank : 1);
  w->teacher = df_f32_on(dev, carve(c, (d->teacher ? R * H : 1) * 4), d->teacher ? R : 1, H);
}

df_status df_stage_create(df_ctx *ctx, const df_stage_spec *spec, df_stage **out, df_error *err) {
  *out = NULL;
  if (spec->block_size < 2 || spec->vocab < 1 || spec->hidden < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "stage", NULL, "bad stage spec: bs %lld, vocab %lld, hidden %lld",
                   (long long)spec->block_size, (long long)spec->vocab, (long long)spec->hidden);
  df_stage *s = calloc(1, sizeof *s);
  if (!s) return DF_FAIL(err, DF_ERR_NOMEM, "stage", NULL, "out of memory");
  s->ctx = ctx, s->dev = df_ctx_device(ctx), s->spec = *spec, s->direct = df_ctx_host_addressable(ctx);
  for (int i = 0; i < 2; i++) {
    df_status st = df_event_create(ctx, &s->slots[i].ev, err);
    if (st != DF_OK) return df_stage_free(s), st;
  }
  *out = s;
  return DF_OK;
}

void df_stage_free(df_stage *s) {
  if (!s) return;
  df_error ignored = {0};
  df_sync(s->ctx, &ignored); // nothing queued may still read the slots
  for (int i = 0; i < 2; i++) {
    df_host_free(s->ctx, s->slots[i].host);
    df_buffer_free(s->ctx, s->slots[i].dev);
    df_event_destroy(s->ctx, s->slots[i].ev);
  }
  df_buffer_free(s->ctx, s->scratch);
  free(s);
}

// Every id the device will look up, checked where it was built: the ops assume valid input.
static df_status check_ids(const char *what, const int32_t *v, int64_t R, int64_t per_sample, int64_t vocab,
                           df_error *err) {
  for (int64_t r = 0; r < R; r++) {
    if (v[r] < vocab) continue; // labels use −1 for "no target"; ids are never negative
    char where[96];
    snprintf(where, sizeof where, "%s[sample %lld, row %lld]", what, (long long)(r / per_sample),
             (long long)(r % per_sample));
    return DF_FAIL(err, DF_ERR_INVALID, where, "the data must be tokenized for this target (check its vocab_size)",
                   "token id %d is outside the target's vocabulary [0, %lld)", v[r], (long long)vocab);
  }
  return DF_OK;
}

static df_status grow(df_stage *s, slot *sl, size_t bytes, df_error *err) {
  if (bytes <= sl->cap) return DF_OK;
  df_host_free(s->ctx, sl->host), df_buffer_free(s->ctx, sl->dev);
  sl->host = sl->dev = NULL, sl->cap = 0;
  bytes = bytes + bytes / 4; // room for the next, slightly longer batch
  if (!s->direct) DF_TRY(df_host_alloc(s->ctx, bytes, &sl->host, err));
  DF_TRY(df_buffer_alloc(s->ctx, bytes, &sl->dev, err));
  sl->cap = bytes;
  return DF_OK;
}

static df_status grow_scratch(df_stage *s, size_t bytes, df_error *err) {
  if (bytes <= s->scratch_cap) return DF_OK;
  df_buffer_free(s->ctx, s->scratch);
  s->scratch = NULL, s->scratch_cap = 0;
  bytes = bytes + bytes / 4;
  DF_TRY(df_buffer_alloc(s->ctx, bytes, &s->scratch, err));
  s->scratch_cap = bytes;
  return DF_OK;
}

// The host arrays of one micro-batch (strategies/ builders), freed after packing.
typedef struct {
  df_dflash_blocks blk;
  df_dspark_labels lab;
} built;

static void built_free(built *b) {
  df_dflash_blocks_free(&b->blk);
  df_dspark_labels_free(&b->lab);
}

static df_status build(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, built *b, df_error *err) {
  const df_stage_spec *sp = &s->spec;
  memset(b, 0, sizeof *b);
  DF_TRY(df_dflash_build_blocks(bt->input_ids, bt->loss_mask, bt->S, a, sp->block_size, sp->mask_token_id,
                                sp->loss_decay_gamma, &b->blk, err));
  const int64_t R = a->B * a->N * sp->block_size, per = a->N * sp->block_size;
  DF_TRY(check_ids("block input_ids", b->blk.input_ids, R, per, sp->vocab, err));
  if (sp->kind != DF_DRAFT_DSPARK) return check_ids("labels", b->blk.labels, R, per, sp->vocab, err);
  DF_TRY(df_dspark_build_labels(bt->input_ids, bt->loss_mask, bt->S, a, sp->block_size, sp->loss_decay_gamma, &b->lab,
                                err));
  DF_TRY(check_ids("labels", b->lab.labels, R, per, sp->vocab, err));
  return check_ids("previous tokens", b->lab.prev, R, per, sp->vocab, err);
}

// Writes the packed arrays at p (host memory: the pinned copy, or the slot itself when direct).
static void fill(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, const built *b, const dims *d,
                 const packed *p, double *loss_den) {
  const int64_t R = d->R, BN = d->B * d->N;
  if (p->th) memcpy(p->th, bt->hidden, sizeof(float) * (size_t)(d->B * d->S * d->KH));
  if (p->last) memcpy(p->last, bt->last_hidden, sizeof(float) * (size_t)(d->B * d->S * d->H));
  memcpy(p->anchors, a->anchors, sizeof(int32_t) * (size_t)BN);
  memcpy(p->keep, a->keep, (size_t)BN);
  df_draft_fill_positions(d->B, d->S, d->N, d->bs, a->anchors, a->keep, p->pos_q, p->pos_kv);
  memcpy(p->ids, b->blk.input_ids, sizeof(int32_t) * (size_t)R);
  if (d->dspark) {
    memcpy(p->dlabels, b->lab.labels, sizeof(int32_t) * (size_t)R);
    memcpy(p->prev, b->lab.prev, sizeof(int32_t) * (size_t)R);
    memcpy(p->valid, b->lab.valid, (size_t)R);
    memcpy(p->dweights, b->lab.weights, sizeof(float) * (size_t)R);
    df_dspark_teacher_index(&b->lab, d->S, p->tidx);
    *loss_den = df_dspark_loss_den(&b->lab);
    return;
  }
  memcpy(p->labels, b->blk.labels, sizeof(int32_t) * (size_t)R);
  memcpy(p->weights, b->blk.weights, sizeof(float) * (size_t)R);
  memcpy(p->binary, b->blk.binary, (size_t)R);
  for (int64_t r = 0; r < R; r++) p->binary_f[r] = b->blk.binary[r];
  df_dflash_loss_options lo = {.type = s->spec.loss_type};
  *loss_den = df_dflash_loss_den(&lo, &b->blk);
}

// Device views of the packed arrays (p: their device addresses) and the batch's features.
static void views(const df_stage *s, const df_batch *bt, const dims *d, const packed *p, df_staged *o) {
  const df_device dev = s->dev;
  const int64_t R = d->R, BN = d->B * d->N;
  const float *th = p->th ? p->th : bt->hidden, *last = p->last ? p->last : (d->teacher ? bt->last_hidden : NULL);
  o->B = d->B, o->S = d->S, o->N = d->N, o->R = R;
  o->model = (df_draft_batch){.B = d->B,
                               .S = d->S,
                               .N = d->N,
                               .target_hidden = th,
                               .block_embed = o->block_embed.data,
                               .anchors = p->anchors,
                               .keep = p->keep,
                               .pos_q = p->pos_q,
                               .pos_kv = p->pos_kv,
                               .on_device = true};
  o->block_ids = df_i32_on(dev, p->ids, R);
  o->last_hidden = df_f32_on(dev, last, d->B * d->S, d->H);
  df_tensor keep = df_u8_on(dev, p->keep, BN);
  if (d->dspark) {
    o->dspark = (df_dspark_rows){.B = d->B,
                                 .N = d->N,
                                 .bs = d->bs,
                                 .labels = df_i32_on(dev, p->dlabels, R),
                                 .valid = df_u8_on(dev, p->valid, R),
                                 .prev = df_i32_on(dev, p->prev, R),
                                 .weights = df_f32_on(dev, p->dweights, R),
                                 .teacher_idx = df_i32_on(dev, p->tidx, R),
                                 .keep = keep,
                                 .loss_den = o->loss_den};
    return;
  }
  o->dflash = (df_dflash_rows){.B = d->B,
                               .N = d->N,
                               .bs = d->bs,
                               .labels = df_i32_on(dev, p->labels, R),
                               .weights = df_f32_on(dev, p->weights, R),
                               .binary = df_u8_on(dev, p->binary, R),
                               .binary_f = df_f32_on(dev, p->binary_f, R),
                               .keep = keep,
                               .loss_den = o->loss_den};
}

static dims dims_of(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a) {
  const df_stage_spec *sp = &s->spec;
  dims d = {.B = bt->B, .S = bt->S, .N = a->N, .bs = sp->block_size, .KH = bt->width, .H = sp->hidden};
  d.R = d.B * d.N * d.bs;
  d.dspark = sp->kind == DF_DRAFT_DSPARK;
  d.teacher = d.dspark && sp->teacher && bt->last_hidden;
  return d;
}

static df_status check_batch(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, df_error *err) {
  if (!bt || !a || !a->anchors || !a->keep || a->B != bt->B || a->N < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "anchors", "sample the anchors from this batch",
                   "anchors do not fit the batch");
  if (s->spec.kind == DF_DRAFT_DSPARK && s->spec.teacher && bt->last_hidden && bt->hidden_size != s->spec.hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states", "capture the data with this target",
                   "the batch's last hidden states are %lld wide, the LM head reads %lld", (long long)bt->hidden_size,
                   (long long)s->spec.hidden);
  for (int64_t i = 0; i < a->B * a->N; i++)
    if (a->keep[i] && (a->anchors[i] < 0 || a->anchors[i] >= bt->S))
      return DF_FAIL(err, DF_ERR_INVALID, "anchors", "anchors of kept blocks index the context: 0 <= anchor < S",
                     "anchor %d of block %lld is outside [0, %lld)", a->anchors[i], (long long)i, (long long)bt->S);
  return DF_OK;
}

df_status df_stage_prepare(df_stage *s, const df_batch *bt, const df_dflash_anchors *a, df_staged *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_batch(s, bt, a, err));
  const dims d = dims_of(s, bt, a);
  built b;
  df_status st = build(s, bt, a, &b, err);
  slot *sl = &s->slots[s->next];
  if (st == DF_OK && sl->pending) st = df_event_wait(s->ctx, sl->ev, err); // its last upload has landed
  sl->pending = false;
  carver measure = {0};
  packed p;
  pack_layout(&measure, &d, !s->direct, &p);
  if (st == DF_OK) st = grow(s, sl, measure.off, err);
  carver cs = {0};
  scratch_layout(&cs, &d, s->spec.markov_rank, s->dev, out);
  if (st == DF_OK) st = grow_scratch(s, cs.off, err);
  if (st != DF_OK) return built_free(&b), st;
  s->next ^= 1;
  carver ch = {.base = s->direct ? sl->dev : sl->host};
  pack_layout(&ch, &d, !s->direct, &p);
  fill(s, bt, a, &b, &d, &p, &out->loss_den);
  built_free(&b);
  for (int64_t i = 0; i < d.B * d.N; i++) out->num_blocks += a->keep[i] != 0;
  if (!s->direct) {
    st = df_copy_async(s->ctx, sl->dev, s->dev, sl->host, DF_DEV_CPU, measure.off, err);
    if (st == DF_OK) st = df_event_record(s->ctx, sl->ev, err);
    if (st != DF_OK) return st;
    sl->pending = true;
    out->upload_bytes = (int64_t)measure.off;
  }
  carver cd = {.base = sl->dev};
  pack_layout(&cd, &d, !s->direct, &p);
  carver cc = {.base = s->scratch};
  scratch_layout(&cc, &d, s->spec.markov_rank, s->dev, out);
  views(s, bt, &d, &p, out);
  return DF_OK;
}

df_status df_stage_forward(df_ctx *ctx, df_draft_model *m, const float *embed, int64_t vocab, df_staged *st,
                           df_tensor *hidden, df_error *err) {
  const int64_t H = st->block_embed.shape[1];
  df_tensor table = df_f32_on(df_ctx_device(ctx), embed, vocab, H);
  DF_TRY(df_embedding_forward(ctx, &table, &st->block_ids, &st->block_embed, err));
  const float *out = NULL;
  DF_TRY(df_draft_model_forward(m, &st->model, &out, err));
  *hidden = df_f32_on(df_ctx_device(ctx), out, st->R, H);
  return DF_OK;
}
