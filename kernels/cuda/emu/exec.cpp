// The block executor of the CUDA emulator. A launch runs its whole grid; blocks are spread over the OpenMP threads
// (each block on one CPU thread from start to end, so results never depend on the thread count). Inside a block,
// every CUDA thread is a coroutine, run lazily: threads run one after another on the current stack, and only a
// thread that blocks (at __syncthreads or a warp collective, warp.cpp) keeps that stack as its own fiber while the
// block goes on on a fresh pooled stack, so kernels that never block cost no switch at all. The checks here say which
// kernel, launch, block and thread broke which rule: threads that exit before a barrier others wait at, threads at
// different barriers, a block that cannot go on, WMMA calls that differ between lanes, shared memory over the limits.
#include "kernels/cuda/emu/exec.h"

#include <algorithm>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unordered_map>
#include <vector>

namespace df_emu {

__thread thread_coords tls;

static uint64_t g_launch_switches;  // switches of the launch running now (all CPU threads)
static __thread block_exec *g_exec; // this CPU thread's executor
__thread block_exec *g_cur;         // set while it runs a block

bool same_site(const char *fa, int la, const char *fb, int lb) {
  return la == lb && (fa == fb || (fa && fb && !strcmp(fa, fb)));
}

void tid_of(const block_exec *b, int i, unsigned *x, unsigned *y, unsigned *z) {
  *x = i % b->bdim.x, *y = i / b->bdim.x % b->bdim.y, *z = i / (b->bdim.x * b->bdim.y);
}

// "kernel K launched at F:L, block (x, y, z), thread (x, y, z)".
static void where(const block_exec *b, int i, char *out, size_t n) {
  unsigned x, y, z;
  tid_of(b, i, &x, &y, &z);
  snprintf(out, n,
           "kernel %s launched at %s:%d, block (%u, %u, %u) of (%u, %u, %u), thread (%u, %u, %u) (warp %d, lane "
           "%d)",
           b->L->k.name, b->L->k.file, b->L->k.line, b->bid.x, b->bid.y, b->bid.z, b->L->grid.x, b->L->grid.y,
           b->L->grid.z, x, y, z, i / 32, i % 32);
}

[[noreturn]] __attribute__((format(printf, 3, 4))) void kfatal(const block_exec *b, const char *hint, const char *fmt,
                                                               ...) {
  char w[700], msg[2000];
  where(b, b->running, w, sizeof w);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fatal(hint, "%s:\n  %s", w, msg);
}

block_exec *cur(const char *what) {
  block_exec *b = g_cur;
  if (!b) fatal(NULL, "%s outside a kernel (no block is running on this thread)", what);
  return b;
}

static void set_coords(block_exec *b, int i) {
  if (b->bdim.y == 1 && b->bdim.z == 1) // y and z were zeroed at block start
    tls.tid.x = (unsigned)i;
  else
    tid_of(b, i, &tls.tid.x, &tls.tid.y, &tls.tid.z);
  b->running = i;
}

// ---- stacks ------------------------------------------------------------------------------------------------------

static char *get_stack(block_exec *b) {
  char *s;
  if (!b->stacks_free.empty()) {
    s = b->stacks_free.back();
    b->stacks_free.pop_back();
  } else {
    s = (char *)mmap(NULL, kStack + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) fatal(NULL, "cannot map a fiber stack");
    mprotect(s, kPage, PROT_NONE); // the guard below the stack
  }
  b->stacks_used.push_back(s);
  return s;
}

// ---- scheduling ----------------------------------------------------------------------------------------------------

static int rq_pop(block_exec *b) {
  const int i = b->rq[b->rq_head];
  b->rq_head = (b->rq_head + 1) & 1023, b->rq_count--;
  return i;
}

static void switch_to_thread(block_exec *b, fiber_ctx *from, int i) {
  b->th[i].state = T_RUNNING;
  set_coords(b, i);
  b->switches++;
  df_emu_switch(from, &b->th[i].ctx);
}

static void sched_loop(block_exec *b, bool root);
static void fiber_entry(void *arg) { sched_loop((block_exec *)arg, false); }

[[noreturn]] static void deadlock(block_exec *b) {
  char msg[3000];
  int len = snprintf(msg, sizeof msg, "the block cannot go on: ");
  int waiting = 0;
  for (int i = 0; i < b->next_fresh && len < (int)sizeof msg - 200; i++) {
    const ethread *t = &b->th[i];
    if (t->state != T_WAITING) continue;
    if (waiting++ < 6) {
      unsigned x, y, z;
      tid_of(b, i, &x, &y, &z);
      len += snprintf(msg + len, sizeof msg - len, "thread (%u, %u, %u) waits at %s at %s:%d; ", x, y, z,
                      t->wait == W_BARRIER ? "__syncthreads" : kind_name(t->wkind), t->wfile, t->wline);
    }
  }
  snprintf(msg + len, sizeof msg - len, "%d threads wait, %d have exited, %d never started", waiting, b->ndone,
           b->n - b->next_fresh);
  kfatal(b,
         "every thread of the block must reach each __syncthreads, and every lane a mask names each warp "
         "operation, at the same place",
         "%s", msg);
}

// The running thread waits: hand the CPU to a runnable thread, an idle scheduler loop, or a new loop on a fresh stack.
void block_wait(block_exec *b, ethread *t) {
  t->state = T_WAITING;
  if (b->rq_count) return switch_to_thread(b, &t->ctx, rq_pop(b));
  fiber_ctx *to = NULL;
  if (b->nidle)
    to = b->idle[--b->nidle];
  else if (b->root_idle)
    to = b->root_ctx, b->root_idle = false;
  if (to) {
    b->switches++;
    return df_emu_switch(&t->ctx, to);
  }
  if (b->next_fresh < b->n) {
    // Each new fiber starts at another cache-line offset in its page: stacks are page-aligned, and the suspended
    // frames of a warp's 32 fibers would otherwise all fall into the same few L1 sets and evict one another.
    const size_t color = (size_t)(b->fibers_started++ * 7 % 64) * 64;
    fiber_ctx fresh = {NULL};
    fiber_init(&fresh, get_stack(b) + kPage, kStack - color, fiber_entry, b);
    b->switches++;
    return df_emu_switch(&t->ctx, &fresh);
  }
  deadlock(b);
}

static void thread_exit(block_exec *b, int i) {
  ethread *t = &b->th[i];
  t->state = T_DONE;
  b->ndone++;
  const int lane = i & 31;
  ewarp *w = &b->warps[i >> 5];
  w->exited |= 1u << lane;
  if (w->arrived && (w->mask >> lane & 1))
    kfatal(b, "every lane a warp operation's mask names must reach it",
           "the thread exited while lanes 0x%08x of its "
           "warp wait for it at %s at %s:%d (mask 0x%08x)",
           w->arrived, kind_name(w->kind), w->file, w->line, w->mask);
  if (b->bar_arrived)
    kfatal(b, "every thread of the block must reach each __syncthreads (return only after the last one)",
           "the thread exited while %d threads of the block wait at __syncthreads at %s:%d", b->bar_arrived,
           b->bar_file, b->bar_line);
}

static void run_body(block_exec *b, int i) {
  ethread *t = &b->th[i];
  t->state = T_RUNNING, t->wait = 0, t->wmma_ops = 0, t->wmma_file = NULL;
  set_coords(b, i);
  b->L->run(b->L->closure);
  thread_exit(b, i);
}

// A scheduler loop (on the worker's stack: root; on a pooled stack otherwise). Runnable threads first, so a warp
// finishes before the next starts and few stacks are live.
static void sched_loop(block_exec *b, bool root) {
  fiber_ctx self = {NULL};
  for (;;) {
    if (b->rq_count) {
      const int i = rq_pop(b);
      if (root)
        b->root_ctx = &self, b->root_idle = true;
      else
        b->idle[b->nidle++] = &self;
      switch_to_thread(b, &self, i);
      continue;
    }
    if (b->next_fresh < b->n) {
      run_body(b, b->next_fresh++);
      continue;
    }
    if (b->ndone == b->n) {
      if (root) return;
      if (!b->root_idle) fatal(NULL, "internal error: the block finished away from its root loop");
      b->root_idle = false, b->switches++;
      fiber_ctx gone = {NULL};
      df_emu_switch(&gone, b->root_ctx); // this stack is abandoned (it goes back to the pool)
      __builtin_unreachable();
    }
    deadlock(b);
  }
}

static block_exec *executor() {
  if (g_exec) return g_exec;
  block_exec *b = new block_exec();
  // Dynamic shared memory ends at a guard page: a kernel writing past its bytes faults, named.
  const size_t dyn = (kSmemOptinMax + kPage - 1) / kPage * kPage + kPage;
  b->dyn_region = (char *)mmap(NULL, dyn + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (b->dyn_region == MAP_FAILED) fatal(NULL, "cannot map shared memory");
  mprotect(b->dyn_region + dyn, kPage, PROT_NONE);
  b->arena = (char *)aligned_alloc(1024, kArena);
  ensure_signal_stack();
  g_exec = b;
  return b;
}

static void check_wmma_counts(block_exec *b) {
  for (int w = 0; w < b->nwarps; w++) {
    const int lo = w * 32, hi = lo + 32 < b->n ? lo + 32 : b->n;
    for (int i = lo + 1; i < hi; i++)
      if (b->th[i].wmma_ops != b->th[lo].wmma_ops) {
        b->running = i;
        kfatal(b, "all 32 lanes of a warp must make the same WMMA calls (load, store, fill, mma)",
               "lane %d made %u WMMA steps (the last at %s:%d), lane 0 made %u (the last at %s:%d)", i % 32,
               b->th[i].wmma_ops, b->th[i].wmma_file ? b->th[i].wmma_file : "-", b->th[i].wmma_line, b->th[lo].wmma_ops,
               b->th[lo].wmma_file ? b->th[lo].wmma_file : "-", b->th[lo].wmma_line);
      }
  }
}

static void run_block(block_exec *b, const launch_rec *L, uint64_t blk) {
  b->L = L;
  b->bid.x = (unsigned)(blk % L->grid.x), b->bid.y = (unsigned)(blk / L->grid.x % L->grid.y);
  b->bid.z = (unsigned)(blk / ((uint64_t)L->grid.x * L->grid.y));
  b->bdim.x = L->block.x, b->bdim.y = L->block.y, b->bdim.z = L->block.z;
  b->n = (int)(L->block.x * L->block.y * L->block.z), b->nwarps = (b->n + 31) / 32;
  for (int w = 0; w < b->nwarps; w++) {
    ewarp *e = &b->warps[w];
    e->arrived = e->exited = 0;
    const int lanes = b->n - 32 * w < 32 ? b->n - 32 * w : 32;
    e->valid = lanes == 32 ? kFull : (1u << lanes) - 1;
  }
  b->next_fresh = b->ndone = b->rq_head = b->rq_count = b->bar_arrived = b->nidle = b->nsites = 0;
  b->root_idle = false, b->stat_used = 0, b->switches = 0;
  const size_t dyn_end = (kSmemOptinMax + kPage - 1) / kPage * kPage + kPage;
  b->dyn = b->dyn_region + ((dyn_end - L->smem) & ~(size_t)255);
  memset(b->dyn, 0xFF, L->smem); // NaN bytes until the kernel writes them
  tls.bid = b->bid, tls.bdim = b->bdim, tls.tid.y = tls.tid.z = 0;
  tls.gdim.x = L->grid.x, tls.gdim.y = L->grid.y, tls.gdim.z = L->grid.z;
  g_cur = b;
  sched_loop(b, true);
  check_wmma_counts(b);
  g_cur = NULL;
  for (char *s : b->stacks_used) b->stacks_free.push_back(s);
  b->stacks_used.clear();
  count_stat(&df_emu_stats::switches, b->switches);
  __atomic_fetch_add(&g_launch_switches, b->switches, __ATOMIC_RELAXED);
}

// ---- the device-side entry points (kernels/cuda/emu/device.h, mma.h) -----------------------------------------------

void syncthreads(const char *file, int line) {
  block_exec *b = cur("__syncthreads");
  const int i = b->running;
  if (b->ndone) {
    int first = 0;
    while (first < b->n && b->th[first].state != T_DONE) first++;
    unsigned x, y, z;
    tid_of(b, first, &x, &y, &z);
    kfatal(b, "every thread of the block must reach each __syncthreads (no early return before it)",
           "__syncthreads at %s:%d, but %d threads of the block have already exited without reaching it (the first: "
           "thread (%u, %u, %u))",
           file, line, b->ndone, x, y, z);
  }
  if (b->n == 1) return;
  const ewarp *w = &b->warps[i >> 5];
  if (w->arrived && (w->mask >> (i & 31) & 1))
    kfatal(b, "every lane a warp operation's mask names must reach it before anything else",
           "__syncthreads at %s:%d while lanes 0x%08x of its warp wait for this lane at %s at %s:%d", file, line,
           w->arrived, kind_name(w->kind), w->file, w->line);
  if (b->bar_arrived == 0) {
    b->bar_file = file, b->bar_line = line;
  } else if (!same_site(b->bar_file, b->bar_line, file, line)) {
    kfatal(b, "threads of a block must meet at the same __syncthreads (not one in each branch)",
           "__syncthreads at %s:%d while %d threads of the block wait at the __syncthreads at %s:%d", file, line,
           b->bar_arrived, b->bar_file, b->bar_line);
  }
  if (++b->bar_arrived == b->n) {
    b->bar_arrived = 0;
    for (int j = 0; j < b->n; j++)
      if (j != i) b->th[j].state = T_RUNNABLE, rq_push(b, j);
    return;
  }
  ethread *t = &b->th[i];
  t->wait = W_BARRIER, t->wfile = file, t->wline = line;
  block_wait(b, t);
}

void *shared_var(uint64_t key, const char *fn, size_t bytes, size_t align, const char *name) {
  block_exec *b = cur("a __shared__ variable");
  for (int k = 0; k < b->nsites; k++)
    if (b->sites[k].key == key && b->sites[k].fn == fn) return b->sites[k].p;
  const size_t off = (b->stat_used + align - 1) / align * align;
  if (off + bytes > kSmemDefault)
    kfatal(b, "static shared memory is limited to 48 KiB per block (use dynamic shared memory beyond)",
           "__shared__ %s (%zu bytes) brings the block's static shared memory to %zu bytes", name, bytes, off + bytes);
  const size_t limit = b->L->smem_optin ? kSmemOptinMax : kSmemDefault;
  const size_t dyn = b->L->smem_optin > b->L->smem ? b->L->smem_optin : b->L->smem;
  if (off + bytes + dyn > limit)
    kfatal(b, "static plus dynamic shared memory must fit the block's limit (48 KiB, 227 KiB with the opt-in)",
           "__shared__ %s brings static shared memory to %zu bytes, with %zu dynamic: more than %zu", name, off + bytes,
           dyn, limit);
  if (b->nsites == 64) kfatal(b, NULL, "more than 64 __shared__ variables in one kernel");
  void *p = b->arena + off;
  memset(p, 0xFF, bytes); // NaN bytes until written
  b->stat_used = off + bytes;
  b->sites[b->nsites++] = shared_site{key, fn, p, bytes};
  return p;
}

void *dyn_smem(size_t align) {
  block_exec *b = cur("extern __shared__ memory");
  if (align > 256) kfatal(b, NULL, "dynamic shared memory aligned to %zu bytes (the emulator gives 256)", align);
  return b->dyn;
}

// For the fault handler: the kernel running on this CPU thread, and what the address is to it.
bool exec_describe_fault(uintptr_t addr, char *out, size_t n) {
  block_exec *b = g_cur;
  if (!b) return false;
  char w[700];
  where(b, b->running, w, sizeof w);
  const size_t dyn_end = (kSmemOptinMax + kPage - 1) / kPage * kPage + kPage;
  const uintptr_t guard = (uintptr_t)b->dyn_region + dyn_end;
  if (addr >= guard && addr < guard + kPage) {
    snprintf(out, n, "%s ran past the end of its %zu bytes of dynamic shared memory", w, b->L->smem);
    return true;
  }
  for (char *s : b->stacks_used)
    if (addr >= (uintptr_t)s && addr < (uintptr_t)s + kPage) {
      snprintf(out, n, "%s overflowed its %zu KiB fiber stack (large local arrays?)", w, kStack / 1024);
      return true;
    }
  snprintf(out, n, "%s faulted", w);
  return true;
}

namespace {

// DF_EMU_PROFILE=1: per kernel (as written at its launches), launches, blocks, threads, switches and time, at exit.
struct kernel_profile {
  const char *name;
  uint64_t launches, blocks, threads, switches;
  double seconds;
};
std::vector<kernel_profile> *g_profile;

double now_s() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void print_profile() {
  std::vector<kernel_profile> &p = *g_profile;
  std::sort(p.begin(), p.end(), [](const kernel_profile &a, const kernel_profile &b) { return a.seconds > b.seconds; });
  fprintf(stderr, "df-emu profile: %-48s %8s %10s %12s %14s %9s\n", "kernel", "launches", "blocks", "threads",
          "switches", "seconds");
  for (const kernel_profile &k : p)
    fprintf(stderr, "df-emu profile: %-48.48s %8llu %10llu %12llu %14llu %9.3f\n", k.name,
            (unsigned long long)k.launches, (unsigned long long)k.blocks, (unsigned long long)k.threads,
            (unsigned long long)k.switches, k.seconds);
}

void profile_add(const launch_rec *L, uint64_t blocks, uint64_t threads, uint64_t switches, double seconds) {
  if (!g_profile) {
    const char *e = getenv("DF_EMU_PROFILE");
    if (!e || !*e || *e == '0') return;
    g_profile = new std::vector<kernel_profile>();
    atexit(print_profile);
  }
  for (kernel_profile &k : *g_profile)
    if (!strcmp(k.name, L->k.name)) {
      k.launches++, k.blocks += blocks, k.threads += threads, k.switches += switches, k.seconds += seconds;
      return;
    }
  g_profile->push_back(kernel_profile{L->k.name, 1, blocks, threads, switches, seconds});
}

// Seconds per block of each kernel so far. The OpenMP team is woken only for a launch whose remaining blocks are worth
// it (on a busy machine a wake-up can cost a scheduler tick); a kernel seen for the first time runs its first block
// alone to be timed. The choice never changes results.
std::unordered_map<const void *, std::pair<double, uint64_t>> g_block_cost;
const double kParallelSeconds = 300e-6;

} // namespace

static void run_grid(launch_rec *L, uint64_t nblocks);

void run_launch(launch_rec *L) {
  const double t0 = now_s();
  g_launch_switches = 0;
  const uint64_t nblocks = (uint64_t)L->grid.x * L->grid.y * L->grid.z;
  count_stat(&df_emu_stats::launches, 1);
  count_stat(&df_emu_stats::blocks, nblocks);
  count_stat(&df_emu_stats::threads, nblocks * L->block.x * L->block.y * L->block.z);
  run_grid(L, nblocks);
  const double dt = now_s() - t0;
  std::pair<double, uint64_t> &c = g_block_cost[L->k.fn];
  c.first += dt, c.second += nblocks;
  profile_add(L, nblocks, nblocks * L->block.x * L->block.y * L->block.z, g_launch_switches, dt);
}

static void run_grid(launch_rec *L, uint64_t nblocks) {
  const int nt = omp_get_max_threads();
  block_exec *b = executor();
  uint64_t first = 0;
  double per_block = 0.0;
  auto it = g_block_cost.find(L->k.fn);
  if (it != g_block_cost.end() && it->second.second > 0) {
    per_block = it->second.first / (double)it->second.second;
  } else { // never seen: time its first block
    const double t0 = now_s();
    run_block(b, L, 0);
    per_block = now_s() - t0, first = 1;
  }
  const uint64_t rest = nblocks - first;
  if (nt < 2 || rest < 2 || per_block * (double)rest < kParallelSeconds) {
    for (uint64_t blk = first; blk < nblocks; blk++) run_block(b, L, blk);
    return;
  }
  const int64_t chunk = (int64_t)(rest / ((uint64_t)nt * 16)) + 1;
#pragma omp parallel num_threads((int)(rest < (uint64_t)nt ? rest : (uint64_t)nt))
  {
    block_exec *e = executor();
#pragma omp for schedule(dynamic, chunk)
    for (int64_t blk = (int64_t)first; blk < (int64_t)nblocks; blk++) run_block(e, L, (uint64_t)blk);
  }
}

} // namespace df_emu
