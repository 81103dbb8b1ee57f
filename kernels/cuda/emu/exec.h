// Private to the block executor: the state of the block a CPU thread runs (exec.cpp: blocks, scheduling,
// __syncthreads, shared memory) and what the warp collectives and WMMA (warp.cpp) need of it.
#ifndef DF_KERNELS_CUDA_EMU_EXEC_H
#define DF_KERNELS_CUDA_EMU_EXEC_H

#include <stdint.h>
#include <vector>

#include "kernels/cuda/emu/fiber.h"
#include "kernels/cuda/emu/internal.h"

namespace df_emu {

enum : uint8_t { T_RUNNING = 1, T_RUNNABLE, T_WAITING, T_DONE };
enum : uint8_t { W_BARRIER = 1, W_WARP };
enum { K_SYNCWARP = 20, K_MMA = 21 };

const size_t kStack = 256 * 1024, kPage = 4096, kArena = 64 * 1024;
const unsigned kFull = 0xffffffffu;

struct ethread {
  fiber_ctx ctx;
  uint8_t state, wait;
  int wkind;
  const char *wfile;
  int wline;
  uint32_t wmma_ops; // WMMA steps made (all lanes of a warp must make the same ones)
  const char *wmma_file;
  int wmma_line;
  uint64_t wres; // this lane's result of the last warp collective
};

struct ewarp {
  unsigned arrived, mask, exited, valid;
  int kind;
  const char *file;
  int line;
  uint32_t wmma_ref;
  bool uniform; // every lane so far passed the same argument and width (arg0, width0: the first lane's)
  int arg0, width0;
  uint64_t val[32];
  int arg[32], width[32];
  void *mma[32][4];
};

struct shared_site {
  uint64_t key;
  const char *fn;
  void *p;
  size_t bytes;
};

struct block_exec {
  const launch_rec *L;
  uint3 bid, bdim;
  int n, nwarps;
  ethread th[1024];
  ewarp warps[32];
  int next_fresh, ndone, running;
  int rq[1024], rq_head, rq_count; // runnable threads, oldest first
  int bar_arrived;
  const char *bar_file;
  int bar_line;
  fiber_ctx *idle[1100]; // suspended scheduler loops on spare stacks
  int nidle;
  fiber_ctx *root_ctx; // the loop on the worker's own stack, when suspended
  bool root_idle;
  std::vector<char *> stacks_free, stacks_used;
  char *dyn_region, *dyn; // dynamic shared memory, ending at a guard page
  char *arena;            // static shared memory
  size_t stat_used;
  shared_site sites[64];
  int nsites;
  uint64_t switches;
  unsigned fibers_started;
};

extern __thread block_exec *g_cur; // set while this CPU thread runs a block

// The name of a warp operation kind (SHFL_*, VOTE_*, K_SYNCWARP, K_MMA) for messages.
const char *kind_name(int k);
bool same_site(const char *fa, int la, const char *fb, int lb);
void tid_of(const block_exec *b, int i, unsigned *x, unsigned *y, unsigned *z);
// Stops the run naming the kernel, its launch, the block and the running thread (never returns).
[[noreturn]] void kfatal(const block_exec *b, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The block this CPU thread runs; outside a kernel, `what` is reported and the run stops.
block_exec *cur(const char *what);
// The running thread waits (at a barrier or a collective) until another makes it runnable.
void block_wait(block_exec *b, ethread *t);
inline void rq_push(block_exec *b, int i) { b->rq[(b->rq_head + b->rq_count++) & 1023] = i; }

} // namespace df_emu

#endif // DF_KERNELS_CUDA_EMU_EXEC_H
