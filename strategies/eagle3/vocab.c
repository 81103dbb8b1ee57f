// EAGLE-3's draft vocabulary by SpecForge's rules (strategies/eagle3/vocab.h), including the emulation of CPython's
// set iteration order that decides which missing tokens pad a small vocabulary (tools/reference/eagle3_vocab.py's
// _SetSim, checked there against real sets on 20 000 cases).
#include "strategies/eagle3/vocab.h"

#include <stdlib.h>
#include <string.h>

df_status df_eagle3_counter_init(df_eagle3_counter *c, int64_t vocab, df_error *err) {
  memset(c, 0, sizeof *c);
  c->vocab = vocab;
  c->count = calloc((size_t)vocab, sizeof *c->count);
  c->order = malloc(sizeof *c->order * (size_t)vocab);
  c->mark = calloc((size_t)vocab, sizeof *c->mark);
  c->sample = malloc(sizeof *c->sample * (size_t)vocab);
  if (vocab > 0 && c->count && c->order && c->mark && c->sample) return DF_OK;
  df_eagle3_counter_free(c);
  return DF_FAIL(err, DF_ERR_NOMEM, "vocabulary", NULL, "cannot count %lld tokens", (long long)vocab);
}

void df_eagle3_counter_free(df_eagle3_counter *c) {
  free(c->count), free(c->order), free(c->mark), free(c->sample);
  memset(c, 0, sizeof *c);
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

df_status df_eagle3_counter_add(df_eagle3_counter *c, const int32_t *ids, const uint8_t *mask, int64_t len,
                                int64_t sample, df_error *err) {
  int64_t n = 0;
  for (int64_t p = 0; p < len; p++) {
    if (!mask[p]) continue;
    const int32_t t = ids[p];
    if (t < 0 || t >= c->vocab) {
      for (int64_t k = 0; k < n; k++) c->mark[c->sample[k]] = 0;
      return DF_FAIL(err, DF_ERR_INVALID, "input_ids", "the data's tokens must be ids of the target's vocabulary",
                     "sample %lld: token %d at position %lld is outside the vocabulary of %lld", (long long)sample, t,
                     (long long)p, (long long)c->vocab);
    }
    if (!c->mark[t]++) c->sample[n++] = t;
  }
  qsort(c->sample, (size_t)n, sizeof *c->sample, cmp_i64); // torch.unique: ascending
  for (int64_t k = 0; k < n; k++) {
    const int64_t t = c->sample[k];
    if (c->count[t] == 0) c->order[c->n++] = t;
    c->count[t] += c->mark[t];
    c->mark[t] = 0;
  }
  return DF_OK;
}

// ---- CPython 3.11's set table for small non-negative ints (hash(i) = i) ------------------------------------------

enum { LINEAR_PROBES = 9, PERTURB_SHIFT = 5, MINSIZE = 8 };
#define SLOT_EMPTY (-1)
#define SLOT_DUMMY (-2)

typedef struct {
  int64_t mask, fill, used;
  int64_t *table;
} set_sim;

typedef struct {
  int64_t mask, i, j, n;
  uint64_t perturb;
} probe_it;

// The slots setobject.c visits for key: runs of LINEAR_PROBES + 1 while they fit, then the perturbed jump.
static probe_it probe_start(const set_sim *s, int64_t key) {
  probe_it p = {.mask = s->mask, .i = key & s->mask, .perturb = (uint64_t)key};
  p.n = p.i + LINEAR_PROBES <= p.mask ? LINEAR_PROBES + 1 : 1;
  return p;
}

static int64_t probe_next(probe_it *p) {
  if (p->j == p->n) {
    p->perturb >>= PERTURB_SHIFT;
    p->i = (int64_t)(((uint64_t)p->i * 5 + 1 + p->perturb) & (uint64_t)p->mask);
    p->j = 0;
    p->n = p->i + LINEAR_PROBES <= p->mask ? LINEAR_PROBES + 1 : 1;
  }
  return p->i + p->j++;
}

static bool set_alloc(set_sim *s, int64_t size) {
  int64_t *t = malloc(sizeof *t * (size_t)size);
  if (!t) return false;
  for (int64_t k = 0; k < size; k++) t[k] = SLOT_EMPTY;
  free(s->table);
  s->table = t, s->mask = size - 1;
  return true;
}

static bool set_init(set_sim *s) {
  memset(s, 0, sizeof *s);
  return set_alloc(s, MINSIZE);
}

static void insert_clean(set_sim *s, int64_t key) {
  probe_it p = probe_start(s, key);
  for (;;) {
    const int64_t k = probe_next(&p);
    if (s->table[k] == SLOT_EMPTY) {
      s->table[k] = key;
      return;
    }
  }
}

// set_table_resize: the live keys, in table order, re-inserted into the smallest power of two above minused.
static bool set_resize(set_sim *s, int64_t minused) {
  int64_t size = MINSIZE;
  while (size <= minused) size <<= 1;
  int64_t *old = s->table, old_n = s->mask + 1;
  s->table = NULL;
  if (!set_alloc(s, size)) {
    s->table = old;
    return false;
  }
  s->fill = 0;
  for (int64_t k = 0; k < old_n; k++)
    if (old[k] >= 0) insert_clean(s, old[k]), s->fill++;
  free(old);
  return true;
}

static bool set_add(set_sim *s, int64_t key) {
  probe_it p = probe_start(s, key);
  int64_t free_slot = -1, k;
  for (;;) {
    k = probe_next(&p);
    const int64_t e = s->table[k];
    if (e == SLOT_EMPTY) break;
    if (e == SLOT_DUMMY) {
      if (free_slot < 0) free_slot = k;
    } else if (e == key) {
      return true;
    }
  }
  if (free_slot >= 0) {
    s->table[free_slot] = key;
    s->used++;
    return true;
  }
  s->table[k] = key;
  s->fill++, s->used++;
  if (s->fill * 5 >= s->mask * 3) return set_resize(s, s->used > 50000 ? s->used * 2 : s->used * 4);
  return true;
}

static void set_discard(set_sim *s, int64_t key) {
  probe_it p = probe_start(s, key);
  for (;;) {
    const int64_t k = probe_next(&p), e = s->table[k];
    if (e == SLOT_EMPTY) return;
    if (e == key) {
      s->table[k] = SLOT_DUMMY;
      s->used--;
      return;
    }
  }
}

// set_copy: set_merge into an empty set (a table of the same size and no dummies is copied as it is).
static bool set_copy(const set_sim *src, set_sim *dst) {
  if (!set_init(dst)) return false;
  if (src->used * 5 >= dst->mask * 3 && !set_resize(dst, src->used * 2)) return false;
  if (dst->mask == src->mask && src->fill == src->used) {
    memcpy(dst->table, src->table, sizeof *dst->table * (size_t)(src->mask + 1));
    dst->fill = src->fill, dst->used = src->used;
    return true;
  }
  dst->fill = dst->used = src->used;
  for (int64_t k = 0; k <= src->mask; k++)
    if (src->table[k] >= 0) insert_clean(dst, src->table[k]);
  return true;
}

int64_t df_eagle3_missing_fill_order(const int64_t *counted, int64_t n, int64_t D, int64_t *out) {
  uint8_t *in_other = calloc((size_t)(D > 0 ? D : 1), 1);
  int64_t w = 0;
  set_sim whole, result;
  memset(&result, 0, sizeof result);
  if (!in_other || !set_init(&whole)) return free(in_other), -1;
  const int64_t distinct = n; // len(other): the counted tokens are the Counter's keys, distinct
  for (int64_t k = 0; k < n; k++)
    if (counted[k] >= 0 && counted[k] < D) in_other[counted[k]] = 1;
  bool ok = true;
  for (int64_t k = 0; k < D && ok; k++) ok = set_add(&whole, k);
  if (ok && (D >> 2) > distinct) {
    ok = set_copy(&whole, &result);
    for (int64_t k = 0; ok && k < D; k++)
      if (in_other[k]) set_discard(&result, k);
    if (ok && result.fill - result.used > result.mask / 4)
      ok = set_resize(&result, result.used > 50000 ? result.used * 2 : result.used * 4);
  } else if (ok) {
    ok = set_init(&result);
    for (int64_t k = 0; ok && k <= whole.mask; k++)
      if (whole.table[k] >= 0 && !in_other[whole.table[k]]) ok = set_add(&result, whole.table[k]);
  }
  for (int64_t k = 0; ok && k <= result.mask; k++)
    if (result.table[k] >= 0) out[w++] = result.table[k];
  free(whole.table), free(result.table), free(in_other);
  return ok ? w : -1;
}

// ---- the mapping -------------------------------------------------------------------------------------------------

typedef struct {
  int64_t token, count, rank; // rank: insertion order
} entry;

static int cmp_common(const void *a, const void *b) {
  const entry *x = a, *y = b;
  if (x->count != y->count) return x->count > y->count ? -1 : 1; // most_common: count descending
  return (x->rank > y->rank) - (x->rank < y->rank);              // heapq.nlargest is stable: earlier first
}

df_status df_eagle3_vocab_from_counts(const df_eagle3_counter *c, int64_t D, int64_t *d2t, uint8_t *t2d,
                                      int64_t *padding, int64_t *npad, df_error *err) {
  if (D < 1) return DF_FAIL(err, DF_ERR_INVALID, "draft_vocab_size", NULL, "draft_vocab_size %lld < 1", (long long)D);
  const int64_t total = c->n < D ? D : c->n;
  entry *e = malloc(sizeof *e * (size_t)total);
  int64_t *fill = malloc(sizeof *fill * (size_t)D), *used = malloc(sizeof *used * (size_t)D);
  df_status st = e && fill && used ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "vocabulary", NULL, "out of memory");
  int64_t n = 0, added = 0;
  for (int64_t k = 0; st == DF_OK && k < c->n; k++, n++)
    e[n] = (entry){.token = c->order[k], .count = c->count[c->order[k]], .rank = n};
  if (st == DF_OK && n < D) {
    const int64_t nf = df_eagle3_missing_fill_order(c->order, c->n, D, fill);
    if (nf < 0) st = DF_FAIL(err, DF_ERR_NOMEM, "vocabulary", NULL, "out of memory");
    for (int64_t k = 0; st == DF_OK && k < nf && n < D; k++, n++) {
      e[n] = (entry){.token = fill[k], .count = 0, .rank = n};
      if (padding) padding[added] = fill[k];
      added++;
    }
  }
  if (npad) *npad = added;
  if (st == DF_OK && n < D)
    st = DF_FAIL(err, DF_ERR_INVALID, "draft_vocab_size", NULL, "only %lld tokens for a draft vocabulary of %lld",
                 (long long)n, (long long)D);
  if (st == DF_OK) {
    qsort(e, (size_t)n, sizeof *e, cmp_common);
    for (int64_t k = 0; k < D; k++) used[k] = e[k].token;
    qsort(used, (size_t)D, sizeof *used, cmp_i64);
    if (used[D - 1] >= c->vocab)
      st = DF_FAIL(err, DF_ERR_INVALID, "draft_vocab_size", "use a draft vocabulary no larger than the target's",
                   "token %lld is outside the target vocabulary of %lld", (long long)used[D - 1], (long long)c->vocab);
  }
  if (st == DF_OK) {
    memset(t2d, 0, (size_t)c->vocab);
    for (int64_t k = 0; k < D; k++) d2t[k] = used[k] - k, t2d[used[k]] = 1;
  }
  free(e), free(fill), free(used);
  return st;
}
