// The backend context behind df_ctx (private to kernels/): device, thread count, backend handles, op workspace.
#ifndef DF_KERNELS_CONTEXT_H
#define DF_KERNELS_CONTEXT_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Independent workspace regions: an op that needs scratch of sizes known at different times takes one slot per
// size.
enum { DF_WS_SLOTS = 4 };

struct df_ctx {
  df_device device;
  int num_threads;
  int cuda_device;
  void *cuda; // CUDA backend state (handles, stream); NULL on the CPU
  struct {
    void *p;
    size_t cap;
  } ws[DF_WS_SLOTS];
};

// Scratch memory on the context's device for the op running now: at least `bytes`, 64-byte aligned, valid until
// the next request of the same slot. Grown (never shrunk) on demand, freed with the context, so a step's ops
// stop faulting in fresh pages. Ops that other code may call from inside a parallel region (linear, matmul,
// swiglu: the MoE experts do) must not use it.
df_status df_ctx_workspace(df_ctx *ctx, int slot, size_t bytes, void **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
