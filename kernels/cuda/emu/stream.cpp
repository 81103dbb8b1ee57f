// Streams, events, copies and launches of the CUDA emulator. Nothing queued runs when it is queued: a stream's items
// run (a drain) only when the host synchronises on it (stream / event / device synchronisation, a query, a
// synchronous copy on the legacy stream, cudaFree), so code that reads results without the synchronisation it needs
// gets wrong values every time, not now and then. The legacy default stream synchronises implicitly with blocking
// streams (cudaStreamCreate) and never with non-blocking ones (cudaStreamNonBlocking), as CUDA's does. An async copy
// into host memory fills its destination with NaN bytes when it is queued. Copies and launches are checked when they
// are made: the copy kind against the pointers, the bytes against the allocation, every pointer argument of a kernel
// against the live allocations, the launch shape and shared memory against what a Hopper GPU accepts.
#include <deque>
#include <map>
#include <set>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <vector>

#include "kernels/cuda/emu/internal.h"

namespace df_emu {

struct item {
  uint64_t gseq;
  const char *what;
  std::function<void()> fn;
  stream_rec *wait_on; // a cudaStreamWaitEvent: drain wait_on through wait_pos first
  uint64_t wait_pos;
};

struct stream_rec {
  int device;
  unsigned flags;
  bool legacy, live;
  std::deque<item *> q;
  uint64_t enq, done; // items ever queued, items run
};

struct event_rec {
  unsigned flags;
  stream_rec *s;
  uint64_t pos; // complete once s->done >= pos
  bool recorded, live;
  unsigned gen; // the record whose marker may set t
  double t_ms;
  int refs;
};

namespace {

enum { kMaxDevices = 64 };
stream_rec g_legacy[kMaxDevices];
std::set<stream_rec *> g_streams; // live created streams
std::set<event_rec *> g_events;   // live events
std::map<const void *, int> g_optin;
uint64_t g_gseq;
int g_depth;   // nesting of drains
bool g_opened; // the outermost drain opened device memory

double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

stream_rec *legacy_of(int device) {
  stream_rec *r = &g_legacy[device];
  r->legacy = r->live = true, r->device = device;
  return r;
}

const char *site(const char *file) { return file ? file : "?"; }

double g_drain_t0;

// Opens device memory for the outermost drain, once it has work to run.
struct drain_scope {
  drain_scope() { g_depth++; }
  ~drain_scope() {
    if (--g_depth == 0 && g_opened) {
      g_opened = false;
      memory_close();
      count_drain_seconds(now_ms() * 1e-3 - g_drain_t0);
    }
  }
};

void run_item(item *it) {
  if (!g_opened) {
    g_opened = true;
    g_drain_t0 = now_ms() * 1e-3;
    memory_open();
    count_stat(&df_emu_stats::drains, 1);
  }
  if (it->fn) it->fn();
}

void drain(stream_rec *s, uint64_t upto);

// Runs s's items queued before global sequence number g (the legacy stream's implicit synchronisation).
void drain_before(stream_rec *s, uint64_t g) {
  while (!s->q.empty() && s->q.front()->gseq < g) drain(s, s->done + 1);
}

void drain(stream_rec *s, uint64_t upto) {
  drain_scope scope;
  while (s->done < upto && !s->q.empty()) {
    item *it = s->q.front();
    if (s->legacy) {
      for (stream_rec *b : g_streams)
        if (b->device == s->device && !(b->flags & cudaStreamNonBlocking)) drain_before(b, it->gseq);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
      drain_before(legacy_of(s->device), it->gseq);
    }
    if (it->wait_on) drain(it->wait_on, it->wait_pos);
    s->q.pop_front();
    run_item(it);
    s->done++;
    delete it;
  }
}

void drain_all(stream_rec *s) { drain(s, s->enq); }

void push(stream_rec *r, item *it) {
  it->gseq = ++g_gseq;
  r->q.push_back(it);
  r->enq++;
}

event_rec *event_of(cudaEvent_t e, const char *call) {
  event_rec *r = (event_rec *)e;
  if (!g_events.count(r))
    fatal("create events with cudaEventCreate and use them until cudaEventDestroy", "%s: event %p is not a live event",
          call, (void *)e);
  return r;
}

void event_release(event_rec *e) {
  if (--e->refs == 0) delete e;
}

const char *kind_name(cudaMemcpyKind k) {
  switch (k) {
  case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
  case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
  case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
  case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
  default: return "cudaMemcpyDefault";
  }
}

// One side of a copy or memset: device memory where the kind says so, host memory elsewhere, bytes in bounds.
void check_side(const char *call, const char *file, int line, const char *role, const void *p, size_t n, bool device,
                const char *kind) {
  const allocation *a = NULL;
  const ptr_kind k = classify(p, &a);
  char desc[600] = "";
  if (a) describe_allocation(a, desc, sizeof desc);
  if (k == PTR_DEVICE_DEAD) {
    describe_device_address((uintptr_t)p, desc, sizeof desc);
    fatal("a device pointer must come from cudaMalloc and stay allocated until the work using it has run",
          "%s at %s:%d: the %s %p is not in a live device allocation: %s", call, site(file), line, role, p, desc);
  }
  if (device && k != PTR_DEVICE)
    fatal("pass the kind that matches the pointers (or cudaMemcpyDefault)",
          "%s at %s:%d: %s names the %s %p as device memory, but it is %s", call, site(file), line, kind, role, p,
          k == PTR_PINNED ? desc : "host memory (not from cudaMalloc)");
  if (!device && k == PTR_DEVICE)
    fatal("pass the kind that matches the pointers (or cudaMemcpyDefault)",
          "%s at %s:%d: %s names the %s %p as host memory, but it is the %s", call, site(file), line, kind, role, p,
          desc);
  if (a && (uintptr_t)p + n > a->base + a->size)
    fatal("check the byte count and the offset into the buffer",
          "%s at %s:%d: %zu bytes at the %s %p run %zu bytes past the end of the %s", call, site(file), line, n, role,
          p, (size_t)((uintptr_t)p + n - a->base - a->size), desc);
}

// Checks a copy and resolves cudaMemcpyDefault; false for a kind CUDA does not know.
bool check_copy(const char *call, const char *file, int line, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                cudaMemcpyKind *out) {
  if ((int)kind < 0 || (int)kind > 4) return false;
  if (kind == cudaMemcpyDefault) {
    const bool dd = classify(dst, NULL) != PTR_HOST && classify(dst, NULL) != PTR_PINNED;
    const bool sd = classify(src, NULL) != PTR_HOST && classify(src, NULL) != PTR_PINNED;
    kind = sd ? (dd ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
              : (dd ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  const char *kn = kind_name(kind);
  check_side(call, file, line, "destination", dst, n,
             kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice, kn);
  check_side(call, file, line, "source", src, n, kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice,
             kn);
  *out = kind;
  return true;
}

item *copy_item(void *dst, const void *src, size_t n) {
  item *it = new item();
  it->what = "memcpy";
  it->fn = [dst, src, n] {
    memmove(dst, src, n);
    count_stat(&df_emu_stats::copies, 1);
  };
  return it;
}

item *memset_item(void *dst, int v, size_t n) {
  item *it = new item();
  it->what = "memset";
  it->fn = [dst, v, n] {
    memset(dst, v, n);
    count_stat(&df_emu_stats::copies, 1);
  };
  return it;
}

void check_memset_target(const char *call, const char *file, int line, void *dst, size_t n) {
  const allocation *a = NULL;
  const ptr_kind k = classify(dst, &a);
  if (k == PTR_HOST)
    fatal("cudaMemset fills device memory; use memset for host memory",
          "%s at %s:%d: %p is host memory, not a device allocation", call, site(file), line, dst);
  check_side(call, file, line, "destination", dst, n, k != PTR_PINNED, "the fill");
}

} // namespace

stream_rec *stream_of(cudaStream_t s, const char *call) {
  if (s == NULL || s == cudaStreamLegacy || s == (cudaStream_t)0x2) return legacy_of(current_device());
  stream_rec *r = (stream_rec *)s;
  if (!g_streams.count(r))
    fatal("create streams with cudaStreamCreate[WithFlags] and use them until cudaStreamDestroy",
          "%s: stream %p is not a live stream (destroyed, or never created)", call, (void *)s);
  return r;
}

void enqueue(cudaStream_t s, const char *what, std::function<void()> fn) {
  stream_rec *r = stream_of(s, what);
  item *it = new item();
  it->what = what, it->fn = std::move(fn);
  push(r, it);
}

void sync_all() {
  drain_scope scope;
  for (int d = 0; d < device_count() && d < kMaxDevices; d++) drain_all(legacy_of(d));
  std::vector<stream_rec *> all(g_streams.begin(), g_streams.end());
  for (stream_rec *r : all) drain_all(r);
}

int dynamic_smem_optin(const void *fn) {
  auto it = g_optin.find(fn);
  return it == g_optin.end() ? 0 : it->second;
}

// ---- launches ----------------------------------------------------------------------------------------------------

void enqueue_kernel(const kernel_info &k, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void *closure,
                    closure_fn run, closure_fn destroy, const uintptr_t *ptrs, const int *ptr_index, int nptr) {
  std::lock_guard<std::recursive_mutex> g(lock());
  const char *hint = "a Hopper GPU takes blocks of 1..1024 threads (x, y <= 1024, z <= 64) and grids of x < 2^31, "
                     "y, z <= 65535";
  const uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024)
    fatal(hint, "kernel %s launched at %s:%d: block (%u, %u, %u) = %llu threads is refused by the GPU", k.name,
          site(k.file), k.line, block.x, block.y, block.z, (unsigned long long)threads);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    fatal(hint, "kernel %s launched at %s:%d: grid (%u, %u, %u) is refused by the GPU", k.name, site(k.file), k.line,
          grid.x, grid.y, grid.z);
  const int optin = dynamic_smem_optin(k.fn);
  if (smem > kSmemDefault && (size_t)optin < smem)
    fatal("call cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) before the launch",
          "kernel %s launched at %s:%d: %zu bytes of dynamic shared memory exceed the 48 KiB a kernel gets without "
          "opting in (its MaxDynamicSharedMemorySize is %d)",
          k.name, site(k.file), k.line, smem, optin);
  if (smem > kSmemOptinMax)
    fatal("a Hopper GPU gives a block at most 227 KiB of shared memory",
          "kernel %s launched at %s:%d: %zu bytes of dynamic shared memory", k.name, site(k.file), k.line, smem);
  for (int i = 0; i < nptr; i++) {
    const void *p = (const void *)ptrs[i];
    if (!p) continue;
    const ptr_kind pk = classify(p, NULL);
    if (pk == PTR_DEVICE || pk == PTR_PINNED) continue;
    char desc[600] = "host memory (not from cudaMalloc or cudaMallocHost)";
    if (pk == PTR_DEVICE_DEAD) describe_device_address((uintptr_t)p, desc, sizeof desc);
    fatal("kernels read device memory (cudaMalloc) or pinned host memory (cudaMallocHost) only",
          "kernel %s launched at %s:%d: pointer argument #%d is %p, %s", k.name, site(k.file), k.line, ptr_index[i], p,
          desc);
  }
  stream_rec *r = stream_of(s, k.name);
  launch_rec *L = new launch_rec();
  L->k = k, L->grid = grid, L->block = block, L->smem = smem, L->smem_optin = (size_t)optin;
  L->closure = closure, L->run = run, L->destroy = destroy;
  item *it = new item();
  it->what = "kernel";
  it->fn = [L] {
    run_launch(L);
    L->destroy(L->closure);
    delete L;
  };
  push(r, it);
}

} // namespace df_emu

using namespace df_emu;

#define LOCKED std::lock_guard<std::recursive_mutex> guard_(lock())

// ---- streams -----------------------------------------------------------------------------------------------------

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  LOCKED;
  if (!s) return cudaErrorInvalidValue;
  if (device_count() == 0) return cudaErrorNoDevice;
  stream_rec *r = new stream_rec();
  r->device = current_device(), r->flags = flags, r->live = true;
  g_streams.insert(r);
  *s = (cudaStream_t)r;
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
  LOCKED;
  stream_rec *r = stream_of(s, "cudaStreamDestroy");
  if (r->legacy) return cudaErrorInvalidResourceHandle;
  drain_all(r); // CUDA finishes a destroyed stream's work; the emulator does it now
  g_streams.erase(r);
  r->live = false; // kept (never freed), so a later use of the handle is reported, not undefined
  if (g_streams.empty()) print_stats();
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  LOCKED;
  drain_all(stream_of(s, "cudaStreamSynchronize"));
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) {
  LOCKED;
  drain_all(stream_of(s, "cudaStreamQuery")); // a query may finish the work: the emulator always does
  return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  LOCKED;
  stream_rec *r = stream_of(s, "cudaStreamWaitEvent");
  event_rec *ev = event_of(e, "cudaStreamWaitEvent");
  if (!ev->recorded) return cudaSuccess;
  item *it = new item();
  it->what = "wait event", it->wait_on = ev->s, it->wait_pos = ev->pos;
  push(r, it);
  return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
  LOCKED;
  sync_all();
  return cudaSuccess;
}

// ---- events ------------------------------------------------------------------------------------------------------

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  LOCKED;
  if (!e) return cudaErrorInvalidValue;
  event_rec *r = new event_rec();
  r->flags = flags, r->live = true, r->refs = 1;
  g_events.insert(r);
  *e = (cudaEvent_t)r;
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  LOCKED;
  event_rec *ev = event_of(e, "cudaEventRecord");
  stream_rec *r = stream_of(s, "cudaEventRecord");
  ev->s = r, ev->pos = r->enq + 1, ev->recorded = true;
  const unsigned gen = ++ev->gen;
  ev->refs++;
  item *it = new item();
  it->what = "event";
  it->fn = [ev, gen] {
    if (ev->gen == gen) ev->t_ms = now_ms();
    event_release(ev);
  };
  push(r, it);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  LOCKED;
  event_rec *ev = event_of(e, "cudaEventSynchronize");
  if (ev->recorded) drain(ev->s, ev->pos);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  LOCKED;
  event_rec *a = event_of(start, "cudaEventElapsedTime"), *b = event_of(end, "cudaEventElapsedTime");
  if (!ms) return cudaErrorInvalidValue;
  if ((a->flags | b->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
  drain(a->s, a->pos), drain(b->s, b->pos);
  *ms = (float)(b->t_ms - a->t_ms);
  return cudaSuccess;
}

extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
  LOCKED;
  event_rec *ev = event_of(e, "cudaEventDestroy");
  g_events.erase(ev);
  ev->live = false;
  event_release(ev);
  return cudaSuccess;
}

// ---- memory ------------------------------------------------------------------------------------------------------

extern "C" cudaError_t df_emu_cudaMalloc(void **p, size_t bytes, const char *file, int line) {
  LOCKED;
  if (device_count() == 0) return cudaErrorNoDevice;
  return device_malloc(p, bytes, file, line);
}

extern "C" cudaError_t df_emu_cudaFree(void *p, const char *file, int line) {
  LOCKED;
  if (!p) return cudaSuccess;
  sync_all(); // cudaFree waits for the device: queued work may still use p
  return device_free(p, file, line);
}

extern "C" cudaError_t df_emu_cudaMallocHost(void **p, size_t bytes, const char *file, int line) {
  LOCKED;
  return pinned_malloc(p, bytes, file, line);
}

extern "C" cudaError_t df_emu_cudaFreeHost(void *p, const char *file, int line) {
  LOCKED;
  if (!p) return cudaSuccess;
  sync_all();
  return pinned_free(p, file, line);
}

extern "C" cudaError_t df_emu_cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *file,
                                         int line) {
  LOCKED;
  if (n == 0) return cudaSuccess;
  cudaMemcpyKind k;
  if (!check_copy("cudaMemcpy", file, line, dst, src, n, kind, &k)) return cudaErrorInvalidMemcpyDirection;
  stream_rec *r = legacy_of(current_device());
  if (k == cudaMemcpyHostToHost) {
    memmove(dst, src, n);
    return cudaSuccess;
  }
  push(r, copy_item(dst, src, n));
  if (k != cudaMemcpyDeviceToDevice) drain_all(r); // synchronous for the host; never drains non-blocking streams
  return cudaSuccess;
}

extern "C" cudaError_t df_emu_cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s,
                                              const char *file, int line) {
  LOCKED;
  stream_rec *r = stream_of(s, "cudaMemcpyAsync");
  if (n == 0) return cudaSuccess;
  cudaMemcpyKind k;
  if (!check_copy("cudaMemcpyAsync", file, line, dst, src, n, kind, &k)) return cudaErrorInvalidMemcpyDirection;
  if (k == cudaMemcpyHostToHost) { // synchronous for the host, in stream order
    drain_all(r);
    memmove(dst, src, n);
    return cudaSuccess;
  }
  if (k == cudaMemcpyDeviceToHost) memset(dst, 0xFF, n); // read before the stream is synchronised: NaN
  push(r, copy_item(dst, src, n));
  return cudaSuccess;
}

extern "C" cudaError_t df_emu_cudaMemset(void *dst, int value, size_t n, const char *file, int line) {
  LOCKED;
  if (n == 0) return cudaSuccess;
  check_memset_target("cudaMemset", file, line, dst, n);
  stream_rec *r = legacy_of(current_device());
  push(r, memset_item(dst, value, n));
  if (classify(dst, NULL) == PTR_PINNED) drain_all(r); // synchronous for pinned host memory
  return cudaSuccess;
}

extern "C" cudaError_t df_emu_cudaMemsetAsync(void *dst, int value, size_t n, cudaStream_t s, const char *file,
                                              int line) {
  LOCKED;
  stream_rec *r = stream_of(s, "cudaMemsetAsync");
  if (n == 0) return cudaSuccess;
  check_memset_target("cudaMemsetAsync", file, line, dst, n);
  push(r, memset_item(dst, value, n));
  return cudaSuccess;
}

extern "C" cudaError_t df_emu_cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
  LOCKED;
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || (size_t)value > kSmemOptinMax) return cudaErrorInvalidValue;
    g_optin[func] = value;
  }
  return cudaSuccess;
}
