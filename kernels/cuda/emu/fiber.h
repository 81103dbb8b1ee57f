// Coroutines for the CUDA emulator's threads (kernels/cuda/emu/fiber.cpp): a context is a saved stack pointer.
#ifndef DF_KERNELS_CUDA_EMU_FIBER_H
#define DF_KERNELS_CUDA_EMU_FIBER_H

#include <stddef.h>

namespace df_emu {

struct fiber_ctx {
  void *sp;
};

// A context that, switched to, runs entry(arg) on the given stack (entry must never return).
void fiber_init(fiber_ctx *c, void *stack, size_t bytes, void (*entry)(void *), void *arg);

} // namespace df_emu

extern "C" void df_emu_switch(df_emu::fiber_ctx *from, df_emu::fiber_ctx *to);

#endif
