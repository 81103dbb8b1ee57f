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
};

// Scratch memory on the context's device for the op running now: at least `bytes`, 64-byte aligned, valid until
// the next request of the same slot. Grown (never shrunk) on demand, freed with the context. Ops that other code
// may call from inside a parallel region (linear, matmul, swiglu: the MoE experts do) must not use it.
df_status df_ctx_workspace(df_ctx *ctx, int slot, size_t bytes, void **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
