// The CUDA emulator's runtime core: the lock, fatal reports, statistics, the emulated devices (DF_EMU_DEVICES,
// default 1: draftforge then sees one Hopper GPU), error strings and the sticky last error.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cuda/emu/internal.h"

namespace df_emu {

namespace {
__thread int g_device;
__thread cudaError_t g_last_error = cudaSuccess;
df_emu_stats g_stats;
std::recursive_mutex g_lock;
} // namespace

std::recursive_mutex &lock() { return g_lock; }

// DF_EMU_STATS=1: one line of counters when the last stream goes and at exit (what a run cost the emulator).
void print_stats() {
  const char *e = getenv("DF_EMU_STATS");
  if (!e || !*e || *e == '0') return;
  const df_emu_stats &s = g_stats;
  fprintf(stderr,
          "df-emu [pid %d]: %llu launches, %llu blocks, %llu threads, %llu switches; %llu drains (%llu mprotect calls, "
          "%.3f s); %llu GEMMs, %llu copies\n",
          (int)getpid(), (unsigned long long)s.launches, (unsigned long long)s.blocks, (unsigned long long)s.threads,
          (unsigned long long)s.switches, (unsigned long long)s.drains, (unsigned long long)s.protect_calls,
          s.drain_seconds, (unsigned long long)s.gemms, (unsigned long long)s.copies);
}
namespace {
struct stats_at_exit {
  stats_at_exit() { atexit(print_stats); }
} g_stats_at_exit;
} // namespace

void fatal(const char *hint, const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "df-emu: %s\n", msg);
  if (hint) fprintf(stderr, "HINT: %s\n", hint);
  fflush(stderr);
  abort();
}

void warn(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "df-emu: warning: %s\n", msg);
}

void count_stat(uint64_t df_emu_stats::*field, uint64_t n) {
  __atomic_fetch_add(&(g_stats.*field), n, __ATOMIC_RELAXED);
}

void count_drain_seconds(double s) { g_stats.drain_seconds += s; }

int device_count() {
  static int n = -1;
  if (n < 0) {
    const char *e = getenv("DF_EMU_DEVICES");
    n = e && *e ? atoi(e) : 1;
    if (n < 0) n = 0;
  }
  return n;
}

int current_device() { return g_device; }

void set_last_error(cudaError_t e) {
  if (e != cudaSuccess) g_last_error = e;
}

} // namespace df_emu

using namespace df_emu;

extern "C" void df_emu_get_stats(df_emu_stats *out) {
  std::lock_guard<std::recursive_mutex> g(lock());
  *out = g_stats;
}

extern "C" const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
  case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
  case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
  case cudaErrorNoDevice: return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady: return "cudaErrorNotReady";
  case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
  case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
  case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  case cudaErrorNotSupported: return "cudaErrorNotSupported";
  default: return "cudaErrorUnknown";
  }
}

extern "C" const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInvalidDeviceFunction: return "invalid device function";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  case cudaErrorMisalignedAddress: return "misaligned address";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotSupported: return "operation not supported";
  default: return "unknown error";
  }
}

extern "C" cudaError_t cudaGetLastError(void) {
  cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

extern "C" cudaError_t cudaGetDeviceCount(int *n) {
  if (!n) return cudaErrorInvalidValue;
  *n = device_count();
  return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

extern "C" cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  g_device = device;
  return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device) {
  if (!device) return cudaErrorInvalidValue;
  *device = g_device;
  return cudaSuccess;
}

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  std::lock_guard<std::recursive_mutex> g(lock());
  const size_t total = (size_t)141 << 30; // an H200's 141 GB
  const size_t live = live_device_bytes();
  if (total_bytes) *total_bytes = total;
  if (free_bytes) *free_bytes = live < total ? total - live : 0;
  return cudaSuccess;
}
