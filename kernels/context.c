// The context: picks the backend table for the requested device, and routes memory, copies, events and the
// workspace through it. Host↔device copies and every buffer's bytes are counted here, for every backend alike; in
// measure mode (df_ctx_options.measure) the backend is never asked for memory or state at all.
#include "kernels/context.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/mem_tracker.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct df_event {
  void *impl; // the backend's event
};

static df_status backend_for(df_device dev, const df_backend **out, df_error *err) {
  switch (dev) {
  case DF_DEV_CPU: *out = df_cpu_backend(); break;
  case DF_DEV_CUDA: *out = df_cuda_backend(); break;
  case DF_DEV_FAKE: *out = df_fake_backend(); break;
  default: *out = NULL;
  }
  if (*out) return DF_OK;
  if (dev == DF_DEV_CUDA)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "device", "rebuild with the CUDA toolkit (nvcc on PATH) or use the CPU",
                   "this build of draftforge has no CUDA backend");
  return DF_FAIL(err, DF_ERR_INVALID, "device", "use DF_DEV_CPU or DF_DEV_CUDA", "unknown device %d", (int)dev);
}

df_status df_ctx_create(const df_ctx_options *opt, df_ctx **out, df_error *err) {
  *out = NULL;
  const df_backend *be = opt ? opt->backend : NULL;
  if (!be) DF_TRY(backend_for(opt ? opt->device : DF_DEV_CPU, &be, err));
  return df_ctx_create_with(be, opt, out, err);
}

// Measure mode: the backend's state is not created, but the device memory its init would take is accounted.
static df_status measure_init(df_ctx *ctx, df_error *err) {
  if (!ctx->backend->state_device_bytes) return DF_OK;
  void *p;
  return df_mem_alloc(ctx, DF_MEM_WORKSPACE, ctx->backend->state_device_bytes, false, &p, err);
}

df_status df_ctx_create_with(const df_backend *be, const df_ctx_options *opt, df_ctx **out, df_error *err) {
  *out = NULL;
  df_ctx_options o = opt ? *opt : (df_ctx_options){.device = DF_DEV_CPU};
  if (o.num_threads < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "num_threads", "use 0 for the OpenMP default", "num_threads = %d < 0",
                   o.num_threads);
  df_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx || !(ctx->mem = df_mem_tracker_new())) {
    free(ctx);
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot allocate a context");
  }
  ctx->backend = be;
  ctx->device = be->device;
  ctx->cuda_device = o.cuda_device;
  ctx->measure = o.measure;
#ifdef _OPENMP
  ctx->num_threads = o.num_threads > 0 ? o.num_threads : omp_get_max_threads();
#else
  ctx->num_threads = 1;
#endif
  df_status st = ctx->measure ? measure_init(ctx, err) : be->init ? be->init(ctx, &o, err) : DF_OK;
  if (st != DF_OK) {
    df_mem_tracker_free(ctx->mem);
    free(ctx);
    return st;
  }
  *out = ctx;
  return DF_OK;
}

void df_ctx_destroy(df_ctx *ctx) {
  if (!ctx) return;
  for (int i = 0; i < DF_WS_SLOTS; i++)
    if (ctx->ws[i].p) df_mem_free(ctx, ctx->ws[i].p);
  if (!ctx->measure && ctx->backend->destroy) ctx->backend->destroy(ctx);
  df_mem_tracker_free(ctx->mem); // a measuring context's address ranges go with it
  free(ctx);
}

df_device df_ctx_device(const df_ctx *ctx) { return ctx->device; }
int df_ctx_num_threads(const df_ctx *ctx) { return ctx->num_threads; }
const char *df_ctx_backend_name(const df_ctx *ctx) { return ctx->backend->name; }
bool df_ctx_host_addressable(const df_ctx *ctx) { return ctx->backend->host_addressable && !ctx->measure; }
bool df_ctx_measuring(const df_ctx *ctx) { return ctx->measure; }

bool df_cuda_built(void) { return df_cuda_backend() != NULL; }

bool df_cuda_available(void) {
  const df_backend *be = df_cuda_backend();
  return be && be->device_count && be->device_count() > 0;
}

df_status df_buffer_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  return df_mem_alloc(ctx, df_mem_tracker_tag(ctx->mem), bytes, false, out, err);
}

df_status df_buffer_alloc_as(df_ctx *ctx, df_mem_tag tag, size_t bytes, void **out, df_error *err) {
  return df_mem_alloc(ctx, tag, bytes, false, out, err);
}

void df_buffer_free(df_ctx *ctx, void *p) {
  if (p) df_mem_free(ctx, p);
}

df_status df_host_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  return df_mem_alloc(ctx, DF_MEM_OTHER, bytes, true, out, err);
}

void df_host_free(df_ctx *ctx, void *p) {
  if (p) df_mem_free(ctx, p);
}

df_mem_tag df_ctx_set_mem_tag(df_ctx *ctx, df_mem_tag tag) { return df_mem_tracker_set_tag(ctx->mem, tag); }
df_mem_stats df_ctx_mem_stats(const df_ctx *ctx) { return df_mem_tracker_stats(ctx->mem); }

// Measure mode: a buffer of a measure range is device memory whatever the views say (a measuring CPU-table context
// labels both sides DF_DEV_CPU). Reads back give zeros; host to host is real.
static void measure_copy(df_ctx *ctx, void *dst, const void *src, size_t bytes) {
  const bool dst_dev = df_mem_is_measured(ctx->mem, dst), src_dev = df_mem_is_measured(ctx->mem, src);
  if (!dst_dev && src_dev) memset(dst, 0, bytes);
  if (!dst_dev && !src_dev) memmove(dst, src, bytes);
}

static df_status copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                      bool async, df_error *err) {
  if (bytes == 0) return DF_OK;
  if (dst_dev == DF_DEV_CPU && src_dev == DF_DEV_CPU && ctx->device != DF_DEV_CPU && !ctx->measure) {
    memmove(dst, src, bytes); // host to host: no transfer, whatever the backend
    return DF_OK;
  }
  if ((dst_dev != DF_DEV_CPU && dst_dev != ctx->device) || (src_dev != DF_DEV_CPU && src_dev != ctx->device))
    return DF_FAIL(err, DF_ERR_INVALID, "device", "copy through a context of the buffer's device",
                   "a %s context cannot copy %s memory to %s memory", ctx->backend->name, df_device_name(src_dev),
                   df_device_name(dst_dev));
  if (ctx->measure)
    measure_copy(ctx, dst, src, bytes);
  else
    DF_TRY(ctx->backend->copy(ctx, dst, dst_dev, src, src_dev, bytes, async, err));
  if (ctx->device != DF_DEV_CPU && src_dev == DF_DEV_CPU && dst_dev != DF_DEV_CPU)
    ctx->xfer.h2d++, ctx->xfer.h2d_bytes += (int64_t)bytes;
  if (ctx->device != DF_DEV_CPU && src_dev != DF_DEV_CPU && dst_dev == DF_DEV_CPU)
    ctx->xfer.d2h++, ctx->xfer.d2h_bytes += (int64_t)bytes;
  return DF_OK;
}

df_status df_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                  df_error *err) {
  return copy(ctx, dst, dst_dev, src, src_dev, bytes, false, err);
}

df_status df_copy_async(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                        df_error *err) {
  return copy(ctx, dst, dst_dev, src, src_dev, bytes, true, err);
}

// Measure mode: events and sync have nothing to wait for (no backend state exists).
df_status df_event_create(df_ctx *ctx, df_event **out, df_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out) return DF_FAIL(err, DF_ERR_NOMEM, "event", NULL, "cannot allocate an event");
  if (ctx->measure) return DF_OK;
  df_status st = ctx->backend->event_create(ctx, &(*out)->impl, err);
  if (st != DF_OK) free(*out), *out = NULL;
  return st;
}

df_status df_event_record(df_ctx *ctx, df_event *ev, df_error *err) {
  return ctx->measure ? DF_OK : ctx->backend->event_record(ctx, ev->impl, err);
}

df_status df_event_wait(df_ctx *ctx, df_event *ev, df_error *err) {
  return ctx->measure ? DF_OK : ctx->backend->event_wait(ctx, ev->impl, err);
}

void df_event_destroy(df_ctx *ctx, df_event *ev) {
  if (!ev) return;
  if (!ctx->measure) ctx->backend->event_destroy(ctx, ev->impl);
  free(ev);
}

void *df_event_native(const df_event *ev) { return ev ? ev->impl : NULL; }

df_status df_sync(df_ctx *ctx, df_error *err) { return ctx->measure ? DF_OK : ctx->backend->sync(ctx, err); }

df_transfer_stats df_ctx_transfer_stats(const df_ctx *ctx) { return ctx->xfer; }
void df_ctx_reset_transfer_stats(df_ctx *ctx) { memset(&ctx->xfer, 0, sizeof ctx->xfer); }

df_status df_ctx_workspace(df_ctx *ctx, int slot, size_t bytes, void **out, df_error *err) {
  *out = NULL;
  if (slot < 0 || slot >= DF_WS_SLOTS)
    return DF_FAIL(err, DF_ERR_INVALID, "workspace", NULL, "workspace slot %d outside [0, %d)", slot, DF_WS_SLOTS);
  if (bytes > ctx->ws[slot].cap || !ctx->ws[slot].p) {
    // Work queued earlier may still read the old region: let it finish before the region goes away.
    if (ctx->ws[slot].p) {
      DF_TRY(df_sync(ctx, err));
      df_mem_free(ctx, ctx->ws[slot].p);
    }
    ctx->ws[slot].p = NULL, ctx->ws[slot].cap = 0;
    size_t want = (bytes + 4095) / 4096 * 4096;
    DF_TRY(df_mem_alloc(ctx, DF_MEM_WORKSPACE, want ? want : 4096, false, &ctx->ws[slot].p, err));
    ctx->ws[slot].cap = want;
  }
  *out = ctx->ws[slot].p;
  return DF_OK;
}
