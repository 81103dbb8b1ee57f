#include "kernels/context.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

df_status df_ctx_create(const df_ctx_options *opt, df_ctx **out, df_error *err) {
  *out = NULL;
  df_ctx_options o = opt ? *opt : (df_ctx_options){.device = DF_DEV_CPU};
  if (o.num_threads < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "num_threads", "use 0 for the OpenMP default", "num_threads = %d < 0",
                   o.num_threads);
  df_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot allocate a context");
  ctx->device = o.device;
  ctx->cuda_device = o.cuda_device;
#ifdef _OPENMP
  ctx->num_threads = o.num_threads > 0 ? o.num_threads : omp_get_max_threads();
#else
  ctx->num_threads = 1;
#endif
  if (o.device == DF_DEV_CUDA) {
    df_status st = df_cuda_ctx_init(o.cuda_device, &ctx->cuda, err);
    if (st != DF_OK) {
      free(ctx);
      return st;
    }
  }
  *out = ctx;
  return DF_OK;
}

void df_ctx_destroy(df_ctx *ctx) {
  if (!ctx) return;
  for (int i = 0; i < DF_WS_SLOTS; i++) df_buffer_free(ctx, ctx->ws[i].p);
  if (ctx->cuda) df_cuda_ctx_free(ctx->cuda);
  free(ctx);
}

df_device df_ctx_device(const df_ctx *ctx) { return ctx->device; }

int df_ctx_num_threads(const df_ctx *ctx) { return ctx->num_threads; }

bool df_cuda_available(void) { return df_cuda_device_count() > 0; }

df_status df_buffer_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  *out = NULL;
  if (ctx->device == DF_DEV_CUDA) return df_cuda_alloc(ctx->cuda, bytes, out, err);
  size_t rounded = (bytes + 63) / 64 * 64;
  *out = aligned_alloc(64, rounded ? rounded : 64);
  if (!*out)
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, "reduce the batch or sequence length", "cannot allocate %zu bytes", bytes);
  return DF_OK;
}

void df_buffer_free(df_ctx *ctx, void *p) {
  if (!p) return;
  if (ctx->device == DF_DEV_CUDA)
    df_cuda_free(ctx->cuda, p);
  else
    free(p);
}

df_status df_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                  df_error *err) {
  if (dst_dev == DF_DEV_CPU && src_dev == DF_DEV_CPU) {
    memmove(dst, src, bytes);
    return DF_OK;
  }
  if (!ctx->cuda)
    return DF_FAIL(err, DF_ERR_INVALID, "device", "copy through a CUDA context",
                   "a copy involving CUDA memory needs a CUDA context");
  int kind = src_dev == DF_DEV_CPU ? 0 : (dst_dev == DF_DEV_CPU ? 1 : 2);
  return df_cuda_memcpy(ctx->cuda, dst, src, bytes, kind, err);
}

df_status df_sync(df_ctx *ctx, df_error *err) { return ctx->cuda ? df_cuda_sync(ctx->cuda, err) : DF_OK; }

df_status df_ctx_workspace(df_ctx *ctx, int slot, size_t bytes, void **out, df_error *err) {
  *out = NULL;
  if (slot < 0 || slot >= DF_WS_SLOTS)
    return DF_FAIL(err, DF_ERR_INVALID, "workspace", NULL, "workspace slot %d outside [0, %d)", slot, DF_WS_SLOTS);
  if (bytes > ctx->ws[slot].cap || !ctx->ws[slot].p) {
    if (ctx->ws[slot].p) DF_TRY(df_sync(ctx, err)); // queued work may still read the old region
    df_buffer_free(ctx, ctx->ws[slot].p);
    ctx->ws[slot].p = NULL, ctx->ws[slot].cap = 0;
    size_t want = (bytes + 4095) / 4096 * 4096;
    DF_TRY(df_buffer_alloc(ctx, want ? want : 4096, &ctx->ws[slot].p, err));
    ctx->ws[slot].cap = want;
  }
  *out = ctx->ws[slot].p;
  return DF_OK;
}
