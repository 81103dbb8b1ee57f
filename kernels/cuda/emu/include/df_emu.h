// What the CUDA emulator (DF_CUDA=EMU) tells its tests beyond CUDA's own API: device memory still allocated (leak
// checks after a context or stream is gone) and counters of what the runtime did (launches, blocks, fiber switches,
// queue drains and the mprotect calls they cost). C-compatible; only EMU builds have it (DF_CUDA_EMU=1).
#ifndef DF_EMU_DF_EMU_H
#define DF_EMU_DF_EMU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bytes and allocations of device memory (cudaMalloc) not yet freed, on every emulated device.
size_t df_emu_live_device_bytes(void);
int df_emu_live_device_allocations(void);
// One line per live allocation: base, size and the cudaMalloc call's file:line.
void df_emu_print_live(FILE *f);

typedef struct {
  uint64_t launches, blocks, threads, switches; // kernels run, their blocks and threads, fiber context switches
  uint64_t drains, protect_calls;               // queue drains, and the mprotect calls that opened / closed memory
  uint64_t gemms, copies;                       // cuBLAS(Lt) products and memcpy / memset items executed
  double drain_seconds;                         // wall time spent running queued work
} df_emu_stats;

void df_emu_get_stats(df_emu_stats *out);

#ifdef __cplusplus
}
#endif

#endif
