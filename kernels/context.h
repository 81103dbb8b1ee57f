// The context behind df_ctx (private to kernels/ and its backends): the backend table, the backend's own state,
// the thread count, the op workspace and the transfer counters.
#ifndef DF_KERNELS_CONTEXT_H
#define DF_KERNELS_CONTEXT_H

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Independent workspace regions: an op that needs scratch of sizes known at different times takes one slot per
// size (kernels/cpu/attention.c: the backward's plan, its partial gradients, the per-thread tiles).
enum { DF_WS_SLOTS = 4 };

struct df_ctx {
  const df_backend *backend;
  df_device device; // = backend->device
  int num_threads;  // CPU worker threads (the CPU kernels' OpenMP team)
  int cuda_device;
  void *state; // the backend's per-context state (CUDA: stream, handles); NULL when it has none
  struct {
    void *p;
    size_t cap;
  } ws[DF_WS_SLOTS];
  df_transfer_stats xfer;
  bool measure;               // df_ctx_options.measure: no backend state, no backend memory, ops measure only
  struct df_mem_tracker *mem; // the accounting of kernels/context.c (live buffers, tags, peaks; measure addresses)
};

// Whether a backend op runs its measure path (the dispatchers let it through only when its table marks it in
// `measures`): request the workspace it would, then return DF_OK before touching data or backend state.
static inline bool df_ctx_measure_only(const df_ctx *ctx) { return ctx->measure; }

// Scratch memory on the context's device for the op running now: at least `bytes`, 64-byte aligned, valid until
// the next request of the same slot. Grown (never shrunk) on demand, freed with the context; accounted as
// DF_MEM_WORKSPACE. Ops that other code may call from inside a parallel region (linear, matmul, swiglu: the MoE
// experts do) must not use it. A request depends on shapes only, never on the data (labels, anchors): a measuring
// context must be able to size it without reading anything.
df_status df_ctx_workspace(df_ctx *ctx, int slot, size_t bytes, void **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
