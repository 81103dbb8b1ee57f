// The accounting of kernels/mem_tracker.h: an open-addressing table of live buffers (linear probing, deletion by
// backward shift), running counts and peaks per tag, and the measure mode's address ranges. A context is used by one
// thread at a time (the online target has a context of its own), so nothing here locks.
#include "kernels/mem_tracker.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
  uintptr_t p; // 0: empty slot
  size_t bytes;
  uint8_t tag;
  bool host;
} entry;

// One PROT_NONE range of a measuring context: addresses handed out in order, never reused, never backed.
typedef struct range {
  char *base;
  size_t size, used;
  struct range *next;
} range;

struct df_mem_tracker {
  df_mem_tag tag; // what df_buffer_alloc tags now
  df_mem_stats st;
  entry *slots;
  size_t cap, n; // cap: a power of two
  range *ranges;
};

enum { MEASURE_ALIGN = 256 };                      // cudaMalloc's alignment
static const size_t RANGE_BYTES = (size_t)1 << 40; // address space only: PROT_NONE, never committed

static const char *const TAG_NAMES[DF_MEM_TAGS] = {
    [DF_MEM_OTHER] = "other",         [DF_MEM_WEIGHTS] = "weights",
    [DF_MEM_GRADS] = "grads",         [DF_MEM_MASTERS] = "masters",
    [DF_MEM_OPTIMIZER] = "optimizer", [DF_MEM_ACTIVATIONS] = "activations",
    [DF_MEM_STAGE] = "stage",         [DF_MEM_WORKSPACE] = "workspace",
    [DF_MEM_STATS] = "stats",         [DF_MEM_FFN_STATE] = "ffn_state",
    [DF_MEM_FROZEN] = "frozen",       [DF_MEM_TARGET_WEIGHTS] = "target_weights",
    [DF_MEM_KV_CACHE] = "kv_cache",   [DF_MEM_TARGET_ACTIVATIONS] = "target_activations"};

const char *df_mem_tag_name(df_mem_tag tag) { return tag >= 0 && tag < DF_MEM_TAGS ? TAG_NAMES[tag] : "?"; }

df_mem_tracker *df_mem_tracker_new(void) { return calloc(1, sizeof(df_mem_tracker)); }

void df_mem_tracker_free(df_mem_tracker *m) {
  if (!m) return;
  for (range *r = m->ranges, *next; r; r = next) {
    next = r->next;
    munmap(r->base, r->size);
    free(r);
  }
  free(m->slots);
  free(m);
}

df_mem_tag df_mem_tracker_tag(const df_mem_tracker *m) { return m->tag; }

df_mem_tag df_mem_tracker_set_tag(df_mem_tracker *m, df_mem_tag tag) {
  const df_mem_tag was = m->tag;
  m->tag = tag >= 0 && tag < DF_MEM_TAGS ? tag : DF_MEM_OTHER;
  return was;
}

df_mem_stats df_mem_tracker_stats(const df_mem_tracker *m) { return m->st; }

void df_mem_stats_add(df_mem_stats *into, const df_mem_stats *b) {
  into->device.live += b->device.live, into->device.peak += b->device.peak;
  into->host.live += b->host.live, into->host.peak += b->host.peak;
  for (int i = 0; i < DF_MEM_TAGS; i++) {
    into->tag[i].live += b->tag[i].live, into->tag[i].peak += b->tag[i].peak;
    into->at_peak[i] += b->at_peak[i];
  }
  into->allocs += b->allocs;
}

// ---- the table of live buffers -----------------------------------------------------------------------------------

static size_t home(const df_mem_tracker *m, uintptr_t p) {
  return (size_t)(((uint64_t)p >> 6) * 0x9E3779B97F4A7C15ull) & (m->cap - 1);
}

static bool put(df_mem_tracker *m, entry e);

static bool grow(df_mem_tracker *m) {
  entry *old = m->slots;
  const size_t old_cap = m->cap;
  m->cap = old_cap ? 2 * old_cap : 64;
  m->slots = calloc(m->cap, sizeof *m->slots);
  if (!m->slots) {
    m->slots = old, m->cap = old_cap;
    return false;
  }
  m->n = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].p) put(m, old[i]);
  free(old);
  return true;
}

static bool put(df_mem_tracker *m, entry e) {
  if (2 * (m->n + 1) > m->cap && !grow(m)) return false;
  size_t i = home(m, e.p);
  while (m->slots[i].p) i = (i + 1) & (m->cap - 1);
  m->slots[i] = e;
  m->n++;
  return true;
}

// Removes p's entry into *out; false when p is not tracked.
static bool take(df_mem_tracker *m, uintptr_t p, entry *out) {
  if (!m->cap) return false;
  size_t i = home(m, p);
  while (m->slots[i].p && m->slots[i].p != p) i = (i + 1) & (m->cap - 1);
  if (!m->slots[i].p) return false;
  *out = m->slots[i];
  m->slots[i].p = 0;
  m->n--;
  // Backward shift: later entries of the probe run move into the hole when their home allows it.
  for (size_t j = (i + 1) & (m->cap - 1); m->slots[j].p; j = (j + 1) & (m->cap - 1)) {
    const size_t h = home(m, m->slots[j].p);
    const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
    if (!movable) continue;
    m->slots[i] = m->slots[j];
    m->slots[j].p = 0;
    i = j;
  }
  return true;
}

// ---- counts ------------------------------------------------------------------------------------------------------

static void count_add(df_mem_stats *s, const entry *e) {
  const int64_t b = (int64_t)e->bytes;
  if (e->host) {
    s->host.live += b;
    if (s->host.live > s->host.peak) s->host.peak = s->host.live;
    return;
  }
  s->allocs++;
  df_mem_count *t = &s->tag[e->tag];
  t->live += b;
  if (t->live > t->peak) t->peak = t->live;
  s->device.live += b;
  if (s->device.live <= s->device.peak) return;
  s->device.peak = s->device.live;
  for (int i = 0; i < DF_MEM_TAGS; i++) s->at_peak[i] = s->tag[i].live;
}

static void count_remove(df_mem_stats *s, const entry *e) {
  const int64_t b = (int64_t)e->bytes;
  if (e->host) {
    s->host.live -= b;
    return;
  }
  s->tag[e->tag].live -= b;
  s->device.live -= b;
}

// ---- measure ranges ----------------------------------------------------------------------------------------------

static df_status measure_address(df_mem_tracker *m, size_t bytes, void **out, df_error *err) {
  const size_t need = bytes ? (bytes + MEASURE_ALIGN - 1) / MEASURE_ALIGN * MEASURE_ALIGN : MEASURE_ALIGN;
  range *r = m->ranges;
  if (!r || r->size - r->used < need) {
    const size_t size = need > RANGE_BYTES ? need : RANGE_BYTES;
    void *base = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED || !(r = calloc(1, sizeof *r))) {
      if (base != MAP_FAILED) munmap(base, size);
      return DF_FAIL(err, DF_ERR_NOMEM, "measure", "a memory plan reserves address space only: check ulimit -v",
                     "cannot reserve %zu bytes of address space for a measured buffer", size);
    }
    *r = (range){.base = base, .size = size, .next = m->ranges};
    m->ranges = r;
  }
  *out = r->base + r->used;
  r->used += need;
  return DF_OK;
}

bool df_mem_is_measured(const df_mem_tracker *m, const void *p) {
  for (const range *r = m->ranges; r; r = r->next)
    if ((const char *)p >= r->base && (const char *)p < r->base + r->size) return true;
  return false;
}

// ---- allocation --------------------------------------------------------------------------------------------------

static df_status raw_alloc(df_ctx *ctx, size_t bytes, bool host, void **out, df_error *err) {
  if (!ctx->measure) return (host ? ctx->backend->host_alloc : ctx->backend->alloc)(ctx, bytes, out, err);
  if (!host) return measure_address(ctx->mem, bytes, out, err);
  // Host staging stays real: host code writes it (the stage packs the batch there).
  *out = aligned_alloc(64, bytes ? (bytes + 63) / 64 * 64 : 64);
  return *out ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot allocate %zu bytes of host memory", bytes);
}

static void raw_free(df_ctx *ctx, void *p, bool host) {
  if (ctx->measure) {
    if (host) free(p); // a measure range is unmapped with the tracker
    return;
  }
  (host ? ctx->backend->host_free : ctx->backend->free)(ctx, p);
}

df_status df_mem_alloc(df_ctx *ctx, df_mem_tag tag, size_t bytes, bool host, void **out, df_error *err) {
  *out = NULL;
  DF_TRY(raw_alloc(ctx, bytes, host, out, err));
  const entry e = {
      .p = (uintptr_t)*out, .bytes = bytes, .tag = (uint8_t)(tag >= 0 && tag < DF_MEM_TAGS ? tag : 0), .host = host};
  if (!put(ctx->mem, e)) {
    raw_free(ctx, *out, host);
    *out = NULL;
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot grow the memory accounting table");
  }
  count_add(&ctx->mem->st, &e);
  return DF_OK;
}

void df_mem_free(df_ctx *ctx, void *p) {
  entry e;
  if (!take(ctx->mem, (uintptr_t)p, &e)) return; // never handed out by this context: nothing to free here
  count_remove(&ctx->mem->st, &e);
  raw_free(ctx, p, e.host);
}
