// libFuzzer target: bytes become a hidden-state shard's attribute values, dataset layout and sample_offsets,
// fed to the pure validators (no HDF5 I/O). Any crash or sanitizer report is a bug, and so is a validator
// accepting something that breaks the invariants the reader relies on (checked below with a trap).
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/data/hs.h"

typedef struct {
  const uint8_t *p;
  size_t n;
} bytes;

static uint64_t take(bytes *b, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; i++) {
    v |= (uint64_t)(b->n ? *b->p : 0) << (8 * i);
    if (b->n) b->p++, b->n--;
  }
  return v;
}

// A string attribute: 0 absent, 1 the right value, 2 the other valid value, else a short raw string.
static const char *take_str(bytes *b, const char *right, const char *other, char *buf, size_t cap) {
  unsigned sel = (unsigned)take(b, 1) % 4;
  if (sel == 0) return NULL;
  if (sel == 1) return right;
  if (sel == 2) return other;
  size_t len = (size_t)take(b, 1) % cap;
  for (size_t i = 0; i < len; i++) buf[i] = (char)take(b, 1);
  buf[len] = 0;
  return buf;
}

#define REQUIRE(c)                                                                                                     \
  do {                                                                                                                 \
    if (!(c)) __builtin_trap();                                                                                        \
  } while (0)

static void fuzz_attrs(bytes *b, int64_t *k, int64_t *h, df_dtype *dt, bool *ok) {
  char fbuf[40], dbuf[40];
  int64_t ids[DF_HS_MAX_LAYERS + 8];
  df_hs_attrs a = {0};
  a.format = take_str(b, DF_HS_FORMAT, "draftforge-hidden-state", fbuf, sizeof fbuf);
  a.has_version = take(b, 1) & 1;
  a.version = (int8_t)take(b, 1);
  a.has_hidden_size = take(b, 1) & 1;
  a.hidden_size = (int32_t)take(b, 4);
  a.num_layers = (int16_t)take(b, 2) % (DF_HS_MAX_LAYERS + 8);
  for (int64_t j = 0; j < a.num_layers && j < DF_HS_MAX_LAYERS + 8; j++) ids[j] = (int32_t)take(b, 2);
  a.layer_ids = take(b, 1) & 1 ? ids : NULL;
  a.dtype = take_str(b, "bfloat16", "float32", dbuf, sizeof dbuf);
  df_error err = {0};
  *ok = df_hs_check_attrs(&a, "fuzz.h5", dt, &err) == DF_OK;
  if (*ok) {
    REQUIRE(*dt == DF_BF16 || *dt == DF_F32);
    REQUIRE(a.version == DF_HS_VERSION && a.hidden_size >= 1 && a.num_layers >= 1 && a.num_layers <= DF_HS_MAX_LAYERS);
    for (int64_t j = 0; j < a.num_layers; j++) REQUIRE(ids[j] >= 0);
  } else {
    REQUIRE(err.status == DF_ERR_FORMAT && strstr(err.msg, "fuzz.h5") && err.where[0]);
  }
  *k = a.num_layers, *h = a.hidden_size;
}

static void take_shape(bytes *b, df_hs_dset_shape *d) {
  d->present = take(b, 1) % 8 != 0; // mostly present
  d->elem = (df_hs_elem)(take(b, 1) % 6);
  d->ndim = (int)(take(b, 1) % 4);
  d->dims[0] = (int16_t)take(b, 2);
  d->dims[1] = (int16_t)take(b, 2);
}

static void fuzz_layout(bytes *b, int64_t k, int64_t h, df_dtype dt) {
  df_hs_layout l;
  take_shape(b, &l.offsets);
  take_shape(b, &l.input_ids);
  take_shape(b, &l.loss_mask);
  take_shape(b, &l.hidden);
  take_shape(b, &l.last_hidden);
  int64_t n = -1, t = -1;
  df_error err = {0};
  if (df_hs_check_layout(&l, k, h, dt, "fuzz.h5", &n, &t, &err) == DF_OK) {
    REQUIRE(n >= 0 && t >= 0 && n == l.offsets.dims[0] - 1 && t == l.input_ids.dims[0]);
    REQUIRE(l.hidden.dims[0] == t && l.hidden.dims[1] == k * h && l.loss_mask.dims[0] == t);
  } else {
    REQUIRE(err.status == DF_ERR_FORMAT && strstr(err.msg, "fuzz.h5"));
  }
}

// Offsets as small signed deltas (mostly increasing, so the valid path is reachable) or raw int64 values.
static void fuzz_index(bytes *b) {
  int64_t count = (int64_t)(take(b, 2) % 4097);
  bool raw = take(b, 1) & 1;
  int64_t *off = malloc((size_t)(count ? count : 1) * sizeof *off);
  if (!off) return;
  int64_t prev = 0;
  for (int64_t i = 0; i < count; i++) {
    if (raw)
      off[i] = (int64_t)take(b, 8);
    else
      off[i] = i ? prev + (int8_t)take(b, 1) : (int8_t)take(b, 1) % 2; // offsets[0] usually 0
    prev = off[i];
  }
  int64_t t = take(b, 1) & 1 ? (count ? off[count - 1] : 0) : (int64_t)take(b, 4);
  df_error err = {0};
  if (df_hs_check_index(off, count, t, "fuzz.h5", &err) == DF_OK) {
    REQUIRE(count >= 1 && off[0] == 0 && off[count - 1] == t);
    for (int64_t i = 0; i + 1 < count; i++) REQUIRE(off[i + 1] > off[i] && off[i + 1] <= t);
  } else {
    REQUIRE(err.status == DF_ERR_FORMAT && strstr(err.where, "sample_offsets"));
  }
  free(off);
}

static void fuzz_bf16(bytes *b) {
  uint16_t bits = (uint16_t)take(b, 2);
  float x = df_hs_bf16_to_f32(bits);
  if (x == x) REQUIRE(df_hs_f32_to_bf16(x) == bits); // bf16 values round-trip exactly
  uint32_t u = (uint32_t)take(b, 4);
  memcpy(&x, &u, sizeof x);
  float y = df_hs_bf16_to_f32(df_hs_f32_to_bf16(x));
  REQUIRE((x != x) == (y != y)); // NaN in, NaN out; nothing else becomes NaN
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bytes b = {data, size};
  int64_t k, h;
  df_dtype dt = DF_BF16;
  bool attrs_ok;
  fuzz_attrs(&b, &k, &h, &dt, &attrs_ok);
  // The layout check runs only on attribute values that passed, as in the reader.
  if (attrs_ok)
    fuzz_layout(&b, k, h, dt);
  else
    fuzz_layout(&b, 2, 3, dt);
  fuzz_index(&b);
  fuzz_bf16(&b);
  return 0;
}
