// The device side of the CUDA emulator, as the rewritten kernels see it (kernels/cuda/emu/prelude.h includes it):
// the per-thread built-ins, block barriers and warp collectives (each one a meeting point of the block's or warp's
// coroutines, checked), __shared__ storage per block, atomics, and the launch that the rewriter
// (kernels/cuda/emu/cu_rewrite.c) puts where `kernel<<<grid, block, smem, stream>>>(args)` was: the arguments are
// converted as a call converts them, copied into a closure and queued on the stream with the launch's file:line.
#ifndef DF_KERNELS_CUDA_EMU_DEVICE_H
#define DF_KERNELS_CUDA_EMU_DEVICE_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

namespace df_emu {

// The current CUDA thread's coordinates; the scheduler rewrites them at every switch between coroutines.
struct thread_coords {
  uint3 tid, bid, bdim, gdim;
};
extern __thread thread_coords tls;

// ---- barriers (kernels/cuda/emu/exec.cpp) and warp collectives (warp.cpp) ----------------------------------------

enum { SHFL_IDX = 0, SHFL_UP, SHFL_DOWN, SHFL_XOR, VOTE_BALLOT, VOTE_ANY, VOTE_ALL };

void syncthreads(const char *file, int line);
void syncwarp(const char *file, int line, unsigned mask = 0xffffffffu);
uint64_t shfl(const char *file, int line, int kind, unsigned mask, uint64_t v, int arg, int width);
unsigned vote(const char *file, int line, int kind, unsigned mask, int pred);

template <int kind, typename T>
inline T shfl_at(const char *file, int line, unsigned mask, T v, int arg, int width = 32) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "__shfl_*_sync takes values of 8 bytes at most");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof v);
  u = shfl(file, line, kind, mask, u, arg, width);
  T r;
  memcpy(&r, &u, sizeof r);
  return r;
}

// ---- shared memory -----------------------------------------------------------------------------------------------

// A `__shared__` variable of the current block (allocated, NaN-poisoned, on its first use in the block); one per
// declaration (key) and function instantiation (fn: its __PRETTY_FUNCTION__), as CUDA has one per template instance.
void *shared_var(uint64_t key, const char *fn, size_t bytes, size_t align, const char *name);
// The block's dynamic shared memory (`extern __shared__`), NaN-poisoned at block start.
void *dyn_smem(size_t align);

template <typename T> inline T &shared(uint64_t key, const char *fn, const char *name, size_t align) {
  return *static_cast<T *>(shared_var(key, fn, sizeof(T), align > alignof(T) ? align : alignof(T), name));
}

// ---- launches ------------------------------------------------------------------------------------------------------

struct kernel_info {
  const void *fn;
  const char *name, *file; // the kernel expression as written, and the launch's file
  int line;
};

typedef void (*closure_fn)(void *closure);

// Queues a launch (never runs it here); pointer arguments are checked now (kernels/cuda/emu/stream.cpp).
void enqueue_kernel(const kernel_info &k, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void *closure,
                    closure_fn run, closure_fn destroy, const uintptr_t *ptrs, const int *ptr_index, int nptr);

template <typename... P> struct closure {
  void (*fn)(P...);
  std::tuple<std::decay_t<P>...> args;
  static void run(void *c) { // one CUDA thread: the kernel on its own copy of the parameters
    closure *self = (closure *)c;
    std::apply(self->fn, self->args);
  }
  static void destroy(void *c) { delete (closure *)c; }
};

template <typename T> inline void collect_ptr(const T &v, int i, uintptr_t *vals, int *idx, int &n) {
  if constexpr (std::is_pointer<T>::value) vals[n] = (uintptr_t)v, idx[n++] = i;
}

template <typename... P> struct configured_launch {
  void (*fn)(P...);
  kernel_info info;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  void operator()(P... a) const { // the call converts the arguments as CUDA's launch does
    closure<P...> *c = new closure<P...>{fn, std::tuple<std::decay_t<P>...>(a...)};
    uintptr_t vals[sizeof...(P) + 1];
    int idx[sizeof...(P) + 1], n = 0;
    std::apply(
        [&](const auto &...x) {
          int i = 0;
          (collect_ptr(x, i++, vals, idx, n), ...);
        },
        c->args);
    enqueue_kernel(info, grid, block, smem, stream, c, &closure<P...>::run, &closure<P...>::destroy, vals, idx, n);
  }
};

template <typename... P> struct kernel_ref {
  void (*fn)(P...);
  kernel_info info;
  configured_launch<P...> cfg(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t s = 0) const {
    return configured_launch<P...>{fn, info, grid, block, smem, s};
  }
};

// `kernel<<<g, b, smem, s>>>(args)` → `::df_emu::launch(kernel, "kernel", "file.cu", line).cfg(g, b, smem, s)(args)`.
template <typename... P>
inline kernel_ref<P...> launch(void (*fn)(P...), const char *name, const char *file, int line) {
  return kernel_ref<P...>{fn, kernel_info{(const void *)fn, name, file, line}};
}

// ---- atomics (blocks run on several CPU threads) -----------------------------------------------------------------

template <typename T> inline T atomic_add_int(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

template <typename F, typename U> inline F atomic_add_fp(F *p, F v) {
  static_assert(sizeof(F) == sizeof(U), "bit width");
  U old = __atomic_load_n((U *)p, __ATOMIC_RELAXED), want;
  F f;
  do {
    memcpy(&f, &old, sizeof f);
    F g = f + v;
    memcpy(&want, &g, sizeof want);
  } while (!__atomic_compare_exchange_n((U *)p, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return f;
}

} // namespace df_emu

static inline int atomicAdd(int *p, int v) { return df_emu::atomic_add_int(p, v); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return df_emu::atomic_add_int(p, v); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return df_emu::atomic_add_int(p, v);
}
static inline float atomicAdd(float *p, float v) { return df_emu::atomic_add_fp<float, uint32_t>(p, v); }
static inline double atomicAdd(double *p, double v) { return df_emu::atomic_add_fp<double, uint64_t>(p, v); }
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline int atomicMax(int *p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
static inline int atomicMin(int *p, int v) {
  int old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
static inline int atomicCAS(int *p, int cmp, int v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return cmp;
}

#endif
