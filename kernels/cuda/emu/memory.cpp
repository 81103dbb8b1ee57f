// Device and pinned memory of the CUDA emulator. Device memory comes from one reserved PROT_NONE region: every
// allocation gets its own pages, its data ending where a guard page begins (rounded to 256 bytes, cudaMalloc's
// alignment), so a kernel running past the end faults at once. The pages are readable and writable only while a
// drain runs queued work (kernels, copies, library calls); a host access at any other time faults, and the handler
// names the allocation and the cudaMalloc call that made it. Fresh memory is NaN bytes (0xFF), as cu_test poisons it.
// Where the kernel has lightweight guard regions (MADV_GUARD_INSTALL, Linux 6.13), guard pages and freed memory
// carry guard markers that survive mprotect, so a drain opens the whole used region with one mprotect and closes it
// with another; elsewhere each live allocation is opened and closed on its own (two calls per allocation). Big
// allocations (workspaces and caches sized for the worst case) take their NaN bytes from a copy-on-write mapping of
// a 0xFF template, so the poison costs neither memory nor page-table work until a page is written.
#include <execinfo.h>
#include <fcntl.h>
#include <map>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#ifndef MADV_GUARD_INSTALL // Linux 6.13
#define MADV_GUARD_INSTALL 102
#define MADV_GUARD_REMOVE  103
#endif
#include <unistd.h>

#include "kernels/cuda/emu/internal.h"

namespace df_emu {

bool exec_describe_fault(uintptr_t addr, char *out, size_t n); // exec.cpp: the kernel and thread running here

namespace {

const size_t kPage = 4096;
const size_t kRegion = (size_t)256 << 30; // address space reserved for device memory (never committed up front)

uintptr_t g_base, g_top; // the region, and its first never-used byte
bool g_guards;           // lightweight guard regions available: guard pages and holes carry markers
std::map<uintptr_t, allocation *> g_dev, g_pinned; // by base
std::map<uintptr_t, size_t> g_holes;               // freed spans (data + guard), coalesced, by start
size_t g_live_bytes;
int g_open;

// The last freed allocations, to name them when a stale pointer is used.
enum { kFreed = 64 };
allocation g_freed[kFreed];
const char *g_freed_file[kFreed];
int g_freed_line[kFreed], g_nfreed;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void protect(uintptr_t p, size_t n, int prot) {
  if (mprotect((void *)p, n, prot) != 0) fatal(NULL, "mprotect of emulated device memory failed: %s", strerror(errno));
  count_stat(&df_emu_stats::protect_calls, 1);
}

void reserve() {
  if (g_base) return;
  void *p = mmap(NULL, kRegion, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fatal("raise the address-space limit (ulimit -v)", "cannot reserve the emulated device memory");
  g_base = (uintptr_t)p;
  g_top = g_base + kPage; // the region's first page stays a guard
  const char *e = getenv("DF_EMU_GUARD_REGIONS");
  g_guards = !(e && *e == '0') && madvise(p, kPage, MADV_GUARD_INSTALL) == 0;
  install_fault_handler();
}

// The 0xFF template (a memfd of kTemplate bytes), mapped copy-on-write over big allocations.
const size_t kTemplate = (size_t)32 << 20;
int g_template = -1;

void map_fixed(uintptr_t p, size_t n, int prot, int flags, int fd) {
  if (mmap((void *)p, n, prot, flags | MAP_FIXED, fd, 0) == MAP_FAILED)
    fatal(NULL, "cannot map emulated device memory: %s", strerror(errno));
}

// The data pages [p, p + n) read as NaN bytes (0xFF) without being written.
void map_poison(uintptr_t p, size_t n, int prot) {
  if (g_template < 0) {
    g_template = memfd_create("df-emu-nan", MFD_CLOEXEC);
    if (g_template < 0 || ftruncate(g_template, (off_t)kTemplate) != 0) fatal(NULL, "cannot create the NaN template");
    void *t = mmap(NULL, kTemplate, PROT_READ | PROT_WRITE, MAP_SHARED, g_template, 0);
    if (t == MAP_FAILED) fatal(NULL, "cannot map the NaN template");
    memset(t, 0xFF, kTemplate);
    munmap(t, kTemplate);
  }
  for (size_t o = 0; o < n; o += kTemplate)
    map_fixed(p + o, n - o < kTemplate ? n - o : kTemplate, prot, MAP_PRIVATE, g_template);
}

void guard(uintptr_t p, size_t n, bool on) {
  if (madvise((void *)p, n, on ? MADV_GUARD_INSTALL : MADV_GUARD_REMOVE) != 0)
    fatal(NULL, "madvise(%s) of emulated device memory failed: %s", on ? "MADV_GUARD_INSTALL" : "MADV_GUARD_REMOVE",
          strerror(errno));
}

// A span of total bytes (data pages and the guard page after them); with guard regions, the data pages come
// without markers and the guard page with one.
uintptr_t take_span(size_t total) {
  for (auto it = g_holes.begin(); it != g_holes.end(); ++it)
    if (it->second >= total) {
      const uintptr_t s = it->first;
      const size_t len = it->second;
      g_holes.erase(it);
      if (len > total) g_holes[s + total] = len - total;
      if (g_guards) guard(s, total - kPage, false); // the guard page keeps its marker
      return s;
    }
  if (g_top + total > g_base + kRegion) return 0;
  const uintptr_t s = g_top;
  g_top += total;
  if (g_guards) guard(s + total - kPage, kPage, true);
  return s;
}

void give_span(uintptr_t s, size_t total) {
  auto next = g_holes.lower_bound(s);
  if (next != g_holes.end() && s + total == next->first) total += next->second, g_holes.erase(next);
  auto prev = g_holes.lower_bound(s);
  if (prev != g_holes.begin()) {
    --prev;
    if (prev->first + prev->second == s) {
      prev->second += total;
      return;
    }
  }
  g_holes[s] = total;
}

allocation *find_in(std::map<uintptr_t, allocation *> &m, uintptr_t x) {
  auto it = m.upper_bound(x);
  if (it == m.begin()) return NULL;
  return (--it)->second;
}

const char *site_or(const char *file) { return file ? file : "?"; }

} // namespace

void describe_allocation(const allocation *a, char *out, size_t n) {
  snprintf(out, n, "%s allocation [%p, +%zu bytes) made by %s at %s:%d", a->device < 0 ? "pinned host" : "device",
           (void *)a->base, a->size, a->device < 0 ? "cudaMallocHost" : "cudaMalloc", site_or(a->file), a->line);
}

ptr_kind classify(const void *p, const allocation **out) {
  const uintptr_t x = (uintptr_t)p;
  const allocation *a = NULL;
  ptr_kind k = PTR_HOST;
  if (g_base && x >= g_base && x < g_base + kRegion) {
    a = find_in(g_dev, x);
    if (a && x <= a->base + a->size)
      k = PTR_DEVICE;
    else
      k = PTR_DEVICE_DEAD, a = NULL;
  } else {
    a = find_in(g_pinned, x);
    if (a && x <= a->base + a->size)
      k = PTR_PINNED;
    else
      a = NULL;
  }
  if (out) *out = a;
  return k;
}

void describe_device_address(uintptr_t addr, char *out, size_t n) {
  char what[400];
  const allocation *a = find_in(g_dev, addr);
  if (a && addr < a->base + a->size) {
    describe_allocation(a, what, sizeof what);
    snprintf(out, n, "byte %zu of the %s", (size_t)(addr - a->base), what);
    return;
  }
  if (a && addr < a->span + a->span_bytes + kPage) {
    describe_allocation(a, what, sizeof what);
    snprintf(out, n, "%zu bytes past the end of the %s", (size_t)(addr - a->base - a->size), what);
    return;
  }
  for (int i = 0; i < g_nfreed && i < kFreed; i++) {
    const allocation *f = &g_freed[i];
    if (addr >= f->span && addr < f->span + f->span_bytes + kPage) {
      describe_allocation(f, what, sizeof what);
      snprintf(out, n, "memory freed by cudaFree at %s:%d (it was the %s)", site_or(g_freed_file[i]), g_freed_line[i],
               what);
      return;
    }
  }
  snprintf(out, n, "emulated device memory that no live allocation covers");
}

cudaError_t device_malloc(void **p, size_t bytes, const char *file, int line) {
  if (!p) return cudaErrorInvalidValue;
  *p = NULL;
  if (bytes == 0) return cudaSuccess;
  reserve();
  const size_t need = round_up(bytes, 256), data = round_up(need, kPage);
  const uintptr_t span = take_span(data + kPage);
  if (!span) return cudaErrorMemoryAllocation;
  allocation *a = new allocation();
  a->span = span, a->span_bytes = data, a->base = span + data - need, a->size = bytes;
  a->device = current_device(), a->file = file, a->line = line;
  a->nframes = backtrace(a->frames, 8);
  // NaN bytes: an element a kernel forgets to write fails every comparison.
  if (data >= kTemplate) {
    a->template_mapped = true;
    map_poison(span, data, g_open ? PROT_READ | PROT_WRITE : PROT_NONE);
  } else {
    if (!g_open) protect(span, data, PROT_READ | PROT_WRITE);
    memset((void *)a->base, 0xFF, need);
    if (!g_open) protect(span, data, PROT_NONE);
  }
  g_dev[a->base] = a;
  g_live_bytes += bytes;
  *p = (void *)a->base;
  const char *e = getenv("DF_EMU_STATS");
  if (e && *e && *e != '0' && bytes >= ((size_t)256 << 20)) { // big allocations, and who made them
    fprintf(stderr, "df-emu: cudaMalloc of %zu MiB at %s:%d from:\n", bytes >> 20, file ? file : "?", line);
    backtrace_symbols_fd(a->frames, a->nframes, 2);
  }
  return cudaSuccess;
}

cudaError_t device_free(void *p, const char *file, int line) {
  if (!p) return cudaSuccess;
  auto it = g_dev.find((uintptr_t)p);
  if (it == g_dev.end()) {
    char where[600];
    describe_device_address((uintptr_t)p, where, sizeof where);
    fatal("free each pointer cudaMalloc returned exactly once",
          "cudaFree(%p) at %s:%d: not the start of a live device "
          "allocation (%s)",
          p, site_or(file), line, where);
  }
  allocation *a = it->second;
  g_dev.erase(it);
  g_live_bytes -= a->size;
  if (a->template_mapped) // back to plain anonymous memory
    map_fixed(a->span, a->span_bytes, g_open && !g_guards ? PROT_READ | PROT_WRITE : PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1);
  if (g_guards) {
    guard(a->span, a->span_bytes, true); // drops the pages, and the memory faults until it is allocated again
  } else {
    if (g_open) protect(a->span, a->span_bytes, PROT_NONE);
    madvise((void *)a->span, a->span_bytes, MADV_DONTNEED);
  }
  give_span(a->span, a->span_bytes + kPage);
  const int k = g_nfreed++ % kFreed;
  g_freed[k] = *a, g_freed_file[k] = file, g_freed_line[k] = line;
  delete a;
  return cudaSuccess;
}

cudaError_t pinned_malloc(void **p, size_t bytes, const char *file, int line) {
  if (!p) return cudaErrorInvalidValue;
  *p = NULL;
  if (bytes == 0) return cudaSuccess;
  const size_t span = round_up(bytes, kPage);
  void *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  allocation *a = new allocation();
  a->span = a->base = (uintptr_t)m, a->span_bytes = span, a->size = bytes, a->device = -1, a->file = file,
  a->line = line;
  a->nframes = backtrace(a->frames, 8);
  g_pinned[a->base] = a;
  *p = m;
  return cudaSuccess;
}

cudaError_t pinned_free(void *p, const char *file, int line) {
  if (!p) return cudaSuccess;
  auto it = g_pinned.find((uintptr_t)p);
  if (it == g_pinned.end())
    fatal("free each pointer cudaMallocHost returned exactly once",
          "cudaFreeHost(%p) at %s:%d: not a live pinned "
          "allocation",
          p, site_or(file), line);
  allocation *a = it->second;
  g_pinned.erase(it);
  munmap((void *)a->span, a->span_bytes);
  delete a;
  return cudaSuccess;
}

size_t live_device_bytes() { return g_live_bytes; }

void memory_open() {
  if (g_open++ || !g_base) return;
  if (g_guards)
    protect(g_base, g_top - g_base, PROT_READ | PROT_WRITE); // guard markers keep guards and holes faulting
  else
    for (auto &kv : g_dev) protect(kv.second->span, kv.second->span_bytes, PROT_READ | PROT_WRITE);
}

void memory_close() {
  if (--g_open || !g_base) return;
  if (g_guards)
    protect(g_base, g_top - g_base, PROT_NONE);
  else
    for (auto &kv : g_dev) protect(kv.second->span, kv.second->span_bytes, PROT_NONE);
}

bool memory_is_open() { return g_open > 0; }

// ---- the fault handler -----------------------------------------------------------------------------------------

namespace {

struct sigaction g_prev_segv, g_prev_bus;

void say(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

void on_fault(int sig, siginfo_t *si, void *ucv) {
  const uintptr_t addr = (uintptr_t)si->si_addr;
  char msg[2048], where[700], kernel[700];
  const bool in_region = g_base && addr >= g_base && addr < g_base + kRegion;
  const bool in_kernel = exec_describe_fault(addr, kernel, sizeof kernel);
  if (!in_region && !in_kernel) { // not ours: let the previous disposition have it
    sigaction(sig, sig == SIGBUS ? &g_prev_bus : &g_prev_segv, NULL);
    return;
  }
  bool write_access = false;
#if defined(__x86_64__)
  write_access = (((ucontext_t *)ucv)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#endif
  if (in_region) describe_device_address(addr, where, sizeof where);
  if (in_kernel)
    snprintf(msg, sizeof msg, "df-emu: %s\n  %s address %p%s%s\n", kernel, write_access ? "wrote" : "read",
             (void *)addr, in_region ? ": " : "", in_region ? where : "");
  else if (g_open)
    snprintf(msg, sizeof msg, "df-emu: queued work (a copy, memset or library call) %s device address %p: %s\n",
             write_access ? "wrote" : "read", (void *)addr, where);
  else
    snprintf(msg, sizeof msg,
             "df-emu: host code %s device memory at %p: %s\n"
             "HINT: device memory is only for kernels and copies; copy it to the host (cudaMemcpy after the stream "
             "is synchronised) before reading it there\n",
             write_access ? "wrote" : "read", (void *)addr, where);
  say(msg);
  if (in_region) {
    const allocation *a = find_in(g_dev, addr);
    if (a && addr < a->span + a->span_bytes + kPage && a->nframes > 0) {
      say("  the allocation was made here:\n");
      backtrace_symbols_fd(a->frames, a->nframes, 2);
    }
  }
  say("  the faulting code:\n");
  void *frames[24];
  backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
  say("  (function+offset: resolve with addr2line -f -e BINARY OFFSET)\n");
  signal(SIGABRT, SIG_DFL);
  abort();
}

} // namespace

void ensure_signal_stack() {
  static __thread bool done;
  if (done) return;
  done = true;
  stack_t ss;
  ss.ss_size = 64 * 1024;
  ss.ss_sp = mmap(NULL, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ss.ss_flags = 0;
  if (ss.ss_sp != MAP_FAILED) sigaltstack(&ss, NULL);
}

void install_fault_handler() {
  static bool done;
  if (done) return;
  done = true;
  ensure_signal_stack();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
  sigaction(SIGBUS, &sa, &g_prev_bus);
}

} // namespace df_emu

// ---- the emulator's own queries (df_emu.h) -------------------------------------------------------------------------

extern "C" size_t df_emu_live_device_bytes(void) {
  std::lock_guard<std::recursive_mutex> g(df_emu::lock());
  return df_emu::g_live_bytes;
}

extern "C" int df_emu_live_device_allocations(void) {
  std::lock_guard<std::recursive_mutex> g(df_emu::lock());
  return (int)df_emu::g_dev.size();
}

extern "C" void df_emu_print_live(FILE *f) {
  std::lock_guard<std::recursive_mutex> g(df_emu::lock());
  for (auto &kv : df_emu::g_dev) {
    char line[600];
    df_emu::describe_allocation(kv.second, line, sizeof line);
    fprintf(f, "  live: %s\n", line);
  }
}
