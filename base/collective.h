// The data-parallel all-reduce the layers below train/ need, as a hook: train/dist/ fills it from the job's
// communicator, and modeling/, moe/ and strategies/ reduce through it without knowing MPI or NCCL.
#ifndef DF_BASE_COLLECTIVE_H
#define DF_BASE_COLLECTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// In-place SUM all-reduce of n fp32 values over the data-parallel ranks (buf: memory on the model's device). A NULL
// function means one rank.
typedef df_status (*df_allreduce_fn)(void *user, float *buf, int64_t n, df_error *err);

typedef struct {
  df_allreduce_fn sum; // NULL: world size 1, nothing to reduce
  // The same for host memory whatever the model's device (GPU ranks stage it through the device); NULL: sum.
  df_allreduce_fn sum_host;
  void *user;
  int world_size; // the mean of a reduced sum divides by this (1 when sum is NULL)
} df_collective;

// Reduces buf (n) over ranks (SUM), then divides by the world size when `mean` (a host loop: `mean` only for host
// buffers; device buffers are reduced with mean false and scaled on the device).
df_status df_allreduce(const df_collective *c, float *buf, int64_t n, bool mean, df_error *err);
// The same on host memory (counters and statistics the host computes), on any device.
df_status df_allreduce_host(const df_collective *c, float *buf, int64_t n, bool mean, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
