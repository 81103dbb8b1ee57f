// The coroutine switch of the CUDA emulator: on x86-64 a hand-written swap of the callee-saved registers and the stack
// pointer (no system call, unlike glibc's swapcontext, which sets the signal mask at every switch); elsewhere
// ucontext. The floating-point control words (MXCSR, x87) are not switched: every coroutine of a CPU thread runs
// with that thread's, and kernels never change them (fldcw alone would cost as much as the rest of a switch).
#include "kernels/cuda/emu/fiber.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)

// df_emu_switch(from, to): save this context into *from, continue the one in *to.
// df_emu_fiber_start: the first "return address" of a new context; calls entry(arg) from r13 / r12.
asm(R"(
  .text
  .globl df_emu_switch
  .type df_emu_switch, @function
  .p2align 4
df_emu_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq (%rsi), %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size df_emu_switch, .-df_emu_switch

  .globl df_emu_fiber_start
  .type df_emu_fiber_start, @function
  .p2align 4
df_emu_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size df_emu_fiber_start, .-df_emu_fiber_start
)");

extern "C" void df_emu_fiber_start(void);

namespace df_emu {

void fiber_init(fiber_ctx *c, void *stack, size_t bytes, void (*entry)(void *), void *arg) {
  uintptr_t top = ((uintptr_t)stack + bytes) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)(top - 72); // after the 6 pops and the ret, rsp = top - 16: aligned for the call
  sp[0] = 0;                             // r15
  sp[1] = 0;                             // r14
  sp[2] = (uint64_t)(void *)entry;       // r13
  sp[3] = (uint64_t)arg;                 // r12
  sp[4] = 0;                             // rbx
  sp[5] = 0;                             // rbp
  sp[6] = (uint64_t)(void *)df_emu_fiber_start;
  sp[7] = 0;
  c->sp = sp;
}

} // namespace df_emu

#else

#include <ucontext.h>

namespace df_emu {

void fiber_init(fiber_ctx *c, void *stack, size_t bytes, void (*entry)(void *), void *arg) {
  ucontext_t *u = new ucontext_t();
  getcontext(u);
  u->uc_stack.ss_sp = stack, u->uc_stack.ss_size = bytes, u->uc_link = NULL;
  makecontext(u, (void (*)(void))entry, 1, arg); // one pointer-sized argument (LP64 ABIs pass it whole)
  c->sp = u;
}

} // namespace df_emu

extern "C" void df_emu_switch(df_emu::fiber_ctx *from, df_emu::fiber_ctx *to) {
  if (!from->sp) from->sp = new ucontext_t();
  swapcontext((ucontext_t *)from->sp, (ucontext_t *)to->sp);
}

#endif
