// The block strategies' micro-batch stage (strategies/dflash/stage.h): host build and checks, one packed asynchronous
// upload per micro-batch into one of two alternating slots, and the step's device scratch.
#include "strategies/dflash/stage.h"

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

void *df_carve(df_carver *c, int64_t bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += ((size_t)(bytes > 0 ? bytes : 0) + 63) & ~(size_t)63;
  return p;
}

typedef struct {
  df_stage_dims d;
  int64_t KH, H;
  bool teacher; // the batch's last hidden states are staged
} dims;

// The shared arrays of the upload, in slot order (th and last only when they are copied).
typedef struct {
  float *th, *last;
  int32_t *anchors, *pos_q, *pos_kv, *ids;
  uint8_t *keep;
} packed;

static void pack_layout(df_carver *c, const dims *d, bool copy_features, packed *p) {
  const int64_t R = d->d.R, BN = d->d.B * d->d.N, S = d->d.S, i4 = 4, f4 = 4;
  *p = (packed){0};
  if (copy_features) p->th = df_carve(c, d->d.B * S * d->KH * f4);
  if (copy_features && d->teacher) p->last = df_carve(c, d->d.B * S * d->H * f4);
  p->anchors = df_carve(c, BN * i4);
  p->keep = df_carve(c, BN);
  p->pos_q = df_carve(c, R * i4);
  p->pos_kv = df_carve(c, d->d.B * (S + d->d.N * d->d.bs) * i4);
  p->ids = df_carve(c, R * i4);
}

// The shared device scratch: block embeddings, d(hidden).
static void scratch_layout(df_carver *c, const dims *d, df_dtype dt, df_device dev, df_staged *o) {
  const int64_t R = d->d.R, H = d->H, e = (int64_t)df_dtype_size(dt);
  o->block_embed = df_view_on(dt, dev, df_carve(c, R * H * e), R, H);
  o->dhidden = df_view_on(dt, dev, df_carve(c, R * H * e), R, H);
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

df_status df_stage_check_ids(const char *what, const int32_t *v, int64_t R, int64_t per_sample, int64_t vocab,
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
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_STAGE, bytes, &sl->dev, err));
  sl->cap = bytes;
  return DF_OK;
}

static df_status grow_scratch(df_stage *s, size_t bytes, df_error *err) {
  if (bytes <= s->scratch_cap) return DF_OK;
  df_buffer_free(s->ctx, s->scratch);
  s->scratch = NULL, s->scratch_cap = 0;
  bytes = bytes + bytes / 4;
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_STAGE, bytes, &s->scratch, err));
  s->scratch_cap = bytes;
  return DF_OK;
}

// Block input ids: the anchor token at slot 0 of a kept block, the mask token elsewhere (docs/dflash-step.md §3).
static df_status build_ids(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, int32_t *ids,
                           df_error *err) {
  const int64_t bs = s->spec.block_size, per = a->N * bs;
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t n = 0; n < a->N; n++) {
      const int64_t blk = b * a->N + n;
      for (int64_t k = 0; k < bs; k++)
        ids[blk * bs + k] =
            a->keep[blk] && k == 0 ? bt->input_ids[b * bt->S + a->anchors[blk]] : (int32_t)s->spec.mask_token_id;
    }
  return df_stage_check_ids("block input_ids", ids, a->B * per, per, s->spec.vocab, err);
}

// Writes the shared arrays at p (host memory: the pinned copy, or the slot itself when direct).
static df_status fill(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, const dims *d, const packed *p,
                      df_error *err) {
  const int64_t BN = d->d.B * d->d.N;
  if (p->th) memcpy(p->th, bt->hidden, sizeof(float) * (size_t)(d->d.B * d->d.S * d->KH));
  if (p->last) memcpy(p->last, bt->last_hidden, sizeof(float) * (size_t)(d->d.B * d->d.S * d->H));
  memcpy(p->anchors, a->anchors, sizeof(int32_t) * (size_t)BN);
  memcpy(p->keep, a->keep, (size_t)BN);
  df_draft_fill_positions(d->d.B, d->d.S, d->d.N, d->d.bs, a->anchors, a->keep, p->pos_q, p->pos_kv);
  return build_ids(s, bt, a, p->ids, err);
}

// Device views of the shared arrays (p: their device addresses) and the batch's features.
static void views(const df_stage *s, const df_batch *bt, const dims *d, const packed *p, df_staged *o) {
  const df_device dev = s->dev;
  const int64_t R = d->d.R, BN = d->d.B * d->d.N;
  const float *th = p->th ? p->th : bt->hidden, *last = p->last ? p->last : (d->teacher ? bt->last_hidden : NULL);
  o->B = d->d.B, o->S = d->d.S, o->N = d->d.N, o->R = R;
  o->model = (df_draft_batch){.B = d->d.B,
                              .S = d->d.S,
                              .N = d->d.N,
                              .target_hidden = th,
                              .block_embed = o->block_embed.data,
                              .anchors = p->anchors,
                              .keep = p->keep,
                              .pos_q = p->pos_q,
                              .pos_kv = p->pos_kv,
                              .on_device = true};
  o->block_ids = df_i32_on(dev, p->ids, R);
  o->keep = df_u8_on(dev, p->keep, BN);
  o->last_hidden = df_f32_on(dev, last, d->d.B * d->d.S, d->H);
}

static dims dims_of(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a) {
  const df_stage_spec *sp = &s->spec;
  dims d = {.d = {.B = bt->B, .S = bt->S, .N = a->N, .bs = sp->block_size}, .KH = bt->width, .H = sp->hidden};
  d.d.R = d.d.B * d.d.N * d.d.bs;
  d.teacher = sp->last_hidden && bt->last_hidden;
  return d;
}

static df_status check_batch(const df_stage *s, const df_batch *bt, const df_dflash_anchors *a, df_error *err) {
  if (!bt || !a || !a->anchors || !a->keep || a->B != bt->B || a->N < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "anchors", "sample the anchors from this batch",
                   "anchors do not fit the batch");
  if (s->spec.last_hidden && bt->last_hidden && bt->hidden_size != s->spec.hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states", "capture the data with this target",
                   "the batch's last hidden states are %lld wide, the LM head reads %lld", (long long)bt->hidden_size,
                   (long long)s->spec.hidden);
  for (int64_t i = 0; i < a->B * a->N; i++)
    if (a->keep[i] && (a->anchors[i] < 0 || a->anchors[i] >= bt->S))
      return DF_FAIL(err, DF_ERR_INVALID, "anchors", "anchors of kept blocks index the context: 0 <= anchor < S",
                     "anchor %d of block %lld is outside [0, %lld)", a->anchors[i], (long long)i, (long long)bt->S);
  return DF_OK;
}

// Sizes of the upload (the shared arrays, then the strategy's) and of the scratch.
static void measure(const df_stage *s, const dims *d, const df_stage_rows *rows, size_t *up, size_t *scratch) {
  df_carver cu = {0}, cs = {0};
  packed p;
  df_staged tmp;
  pack_layout(&cu, d, !s->direct, &p);
  scratch_layout(&cs, d, s->spec.storage, s->dev, &tmp);
  rows->layout(rows->self, DF_STAGE_MEASURE, &cu, &cs, &d->d, s->dev, NULL);
  *up = cu.off, *scratch = cs.off;
}

df_status df_stage_prepare(df_stage *s, const df_batch *bt, const df_dflash_anchors *a, const df_stage_rows *rows,
                           df_staged *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(check_batch(s, bt, a, err));
  const dims d = dims_of(s, bt, a);
  slot *sl = &s->slots[s->next];
  df_status st = rows->build(rows->self, bt, a, d.d.bs, s->spec.vocab, &out->loss_den, err);
  if (st != DF_OK) return rows->release(rows->self), st;    // what a failed build made is freed too
  if (sl->pending) st = df_event_wait(s->ctx, sl->ev, err); // its last upload has landed
  sl->pending = false;
  size_t up = 0, scratch = 0;
  measure(s, &d, rows, &up, &scratch);
  if (st == DF_OK) st = grow(s, sl, up, err);
  if (st == DF_OK) st = grow_scratch(s, scratch, err);
  packed p;
  df_carver ch = {.base = s->direct ? sl->dev : sl->host}, none = {0};
  if (st == DF_OK) {
    pack_layout(&ch, &d, !s->direct, &p);
    st = fill(s, bt, a, &d, &p, err);
  }
  if (st == DF_OK) rows->layout(rows->self, DF_STAGE_FILL, &ch, &none, &d.d, s->dev, NULL);
  rows->release(rows->self);
  if (st != DF_OK) return st;
  s->next ^= 1;
  for (int64_t i = 0; i < d.d.B * d.d.N; i++) out->num_blocks += a->keep[i] != 0;
  if (!s->direct) {
    DF_TRY(df_copy_async(s->ctx, sl->dev, s->dev, sl->host, DF_DEV_CPU, up, err));
    DF_TRY(df_event_record(s->ctx, sl->ev, err));
    sl->pending = true;
    out->upload_bytes = (int64_t)up;
  }
  df_carver cd = {.base = sl->dev}, cc = {.base = s->scratch};
  pack_layout(&cd, &d, !s->direct, &p);
  scratch_layout(&cc, &d, s->spec.storage, s->dev, out);
  views(s, bt, &d, &p, out);
  rows->layout(rows->self, DF_STAGE_BIND, &cd, &cc, &d.d, s->dev, &out->keep);
  return DF_OK;
}

df_status df_stage_forward(df_ctx *ctx, df_draft_model *m, const df_frozen *fz, df_staged *st, df_tensor *hidden,
                           df_error *err) {
  const int64_t H = st->block_embed.shape[1];
  const df_dtype dt = df_draft_model_storage(m);
  if (fz->dtype != dt)
    return DF_FAIL(err, DF_ERR_INVALID, "frozen target pieces",
                   "place them in the draft's dtype (df_run_resources_place_as)",
                   "the embedding is %s, the draft stores %s", df_dtype_name(fz->dtype), df_dtype_name(dt));
  df_tensor table = df_view_on(dt, df_ctx_device(ctx), fz->embed, fz->vocab, H);
  DF_TRY(df_embedding_forward(ctx, &table, &st->block_ids, &st->block_embed, err));
  const float *out = NULL;
  DF_TRY(df_draft_model_forward(m, &st->model, &out, err));
  *hidden = df_view_on(dt, df_ctx_device(ctx), out, st->R, H);
  return DF_OK;
}
