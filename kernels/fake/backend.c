// The fake device: the CPU kernels behind a table whose memory counts as device memory (DF_DEV_FAKE). Host
// code must reach it through df_copy like a GPU's, so kernels/context.c counts every host↔device transfer,
// and a test can prove that a training step moves only its batch up and one scalar block down.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/context.h"

static df_status fake_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  (void)ctx;
  size_t rounded = (bytes + 63) / 64 * 64;
  *out = aligned_alloc(64, rounded ? rounded : 64);
  if (!*out) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "fake device: cannot allocate %zu bytes", bytes);
  return DF_OK;
}

static void fake_free(df_ctx *ctx, void *p) {
  (void)ctx;
  free(p);
}

static df_status fake_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                           bool async, df_error *err) {
  (void)ctx, (void)dst_dev, (void)src_dev, (void)async, (void)err;
  memmove(dst, src, bytes);
  return DF_OK;
}

static df_backend fake_table;
static pthread_once_t fake_once = PTHREAD_ONCE_INIT;

static void fake_build(void) {
  fake_table = *df_cpu_backend(); // the CPU ops, events and sync
  fake_table.name = "fake";
  fake_table.device = DF_DEV_FAKE;
  fake_table.host_addressable = false;
  fake_table.alloc = fake_alloc;
  fake_table.free = fake_free;
  fake_table.copy = fake_copy;
}

const df_backend *df_fake_backend(void) {
  pthread_once(&fake_once, fake_build);
  return &fake_table;
}
