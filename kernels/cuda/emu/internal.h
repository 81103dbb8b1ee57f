// Private to the CUDA emulator's runtime (kernels/cuda/emu/*.cpp): the fatal-report helper, device and pinned
// memory with its protection, the stream queues and their drains, and the block executor. One lock guards the
// runtime's state; the host calls in with it free, and everything queued runs (drains) with it held.
#ifndef DF_KERNELS_CUDA_EMU_INTERNAL_H
#define DF_KERNELS_CUDA_EMU_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <functional>
#include <mutex>
#include <stdint.h>

#include "kernels/cuda/emu/device.h"

namespace df_emu {

// Prints "df-emu: <message>" and "HINT: <hint>" to stderr and aborts: a checker found a rule broken.
[[noreturn]] void fatal(const char *hint, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The same as a warning line (nothing stops).
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

std::recursive_mutex &lock();

// ---- memory (memory.cpp) ------------------------------------------------------------------------------------------

struct allocation {
  uintptr_t base;
  size_t size;
  uintptr_t span;    // first page of the mapping (device) or of the pinned block
  size_t span_bytes; // the data pages (device: the guard page after them is not counted)
  int device;        // -1: pinned host memory
  const char *file;  // the cudaMalloc / cudaMallocHost call
  int line;
  void *frames[8]; // the host stack at the call
  int nframes;
  bool template_mapped; // its NaN bytes come from the copy-on-write template (memory.cpp)
};

enum ptr_kind { PTR_HOST, PTR_PINNED, PTR_DEVICE, PTR_DEVICE_DEAD };

// What p points into; *a is the allocation when there is one (the end of an allocation belongs to it).
ptr_kind classify(const void *p, const allocation **a);
// Where a device address lies: inside a live allocation, just past one, or in freed memory (for reports).
void describe_device_address(uintptr_t addr, char *out, size_t n);
void describe_allocation(const allocation *a, char *out, size_t n);

cudaError_t device_malloc(void **p, size_t bytes, const char *file, int line);
cudaError_t device_free(void *p, const char *file, int line);
cudaError_t pinned_malloc(void **p, size_t bytes, const char *file, int line);
cudaError_t pinned_free(void *p, const char *file, int line);
size_t live_device_bytes();

// Device memory is PROT_NONE outside drains; a drain opens the live allocations (one mprotect per run of pages)
// and closes them again when the outermost drain ends.
void memory_open();
void memory_close();
bool memory_is_open();
void install_fault_handler();
void ensure_signal_stack(); // an alternate signal stack for this thread (fiber stack overflows are reported)

// ---- streams and drains (stream.cpp) ------------------------------------------------------------------------------

struct stream_rec;

// Queues work on s (0 or cudaStreamLegacy: the current device's legacy stream); it runs when a drain reaches it.
void enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
// The stream record of a handle (aborts on a destroyed or unknown handle, naming the call).
stream_rec *stream_of(cudaStream_t s, const char *call);
int current_device();
int device_count();
void set_last_error(cudaError_t e);
void sync_all(); // every stream of every device, to the end of its queue (cudaDeviceSynchronize)

// ---- kernels (exec.cpp) -------------------------------------------------------------------------------------------

struct launch_rec {
  kernel_info k;
  dim3 grid, block;
  size_t smem, smem_optin; // dynamic bytes of this launch; the kernel's MaxDynamicSharedMemorySize (0: none)
  void *closure;
  closure_fn run, destroy;
};

void run_launch(launch_rec *L); // the whole grid, blocks spread over the OpenMP threads
int dynamic_smem_optin(const void *fn);

// Column-major D = alpha·op(A)·op(B) + beta·C (+ bias[m] per row) with fp32 arithmetic: bf16 operands widened, the
// product on the CPU GEMM (kernels/cpu/gemm.h), D rounded to its type. beta = 0 never reads C (cublas.cpp).
struct gemm_problem {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
  const void *A, *B, *C, *bias;
  void *D;
  cudaDataType_t at, bt, ct, dt, bias_t; // (cudaDataType_t from cublas_v2.h)
  int64_t lda, ldb, ldc, ldd;
};
void gemm_run(const gemm_problem &p);

void count_stat(uint64_t df_emu_stats::*field, uint64_t n);
void print_stats(); // with DF_EMU_STATS set
void count_drain_seconds(double s);

enum : size_t {
  kSmemDefault = 48 * 1024, // dynamic shared memory without opt-in, and the static limit
  kSmemOptinMax = 232448,   // Hopper: 227 KiB per block with cudaFuncAttributeMaxDynamicSharedMemorySize
};

} // namespace df_emu

#endif
