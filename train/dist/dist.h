// A process's place in a data-parallel job, set up once in main: the launcher's view (launch.h) checked
// against the recipe, and the communicator chosen for it — single process for world size 1, MPI for CPU ranks,
// NCCL for GPU ranks with its id bootstrapped through MPI (under mpirun) or the TCP exchange (tcp_bootstrap.h).
#ifndef DF_TRAIN_DIST_DIST_H
#define DF_TRAIN_DIST_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/collective.h"
#include "train/dist/comm.h"
#include "train/dist/launch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  bool gpu;          // the run keeps its buffers on CUDA devices: NCCL; else MPI on host buffers
  int cuda_device;   // -1: the local rank
  void *cuda_stream; // NCCL's stream (NULL: the default stream)
  double timeout_s;  // training.dist_timeout in seconds (<= 0: DF_COMM_DEFAULT_TIMEOUT_S)
  df_deploy_trainer deploy;
  uint64_t job_key; // the same on every rank of the job (the TCP bootstrap refuses other jobs)
  df_getenv_fn getenv;
  void *getenv_ctx; // tests; NULL getenv reads the process environment
  FILE *log;        // one line saying who this rank is (NULL: quiet)
} df_dist_options;

typedef struct {
  df_launch_info launch;
  df_comm *comm; // the run's collectives
  df_comm *host; // NCCL launched by mpirun: the MPI communicator that bootstrapped it (else NULL)
} df_dist;

// On failure d may hold a communicator already (MPI that bootstrapped NCCL): print the error, then
// df_dist_abort(d), so the other ranks stop too.
df_status df_dist_init(const df_dist_options *o, df_dist *d, df_error *err);
// The orderly end of both communicators; on failure d stays valid for df_dist_abort.
df_status df_dist_finish(df_dist *d, df_error *err);
// Ends the job on every rank (this rank failed): mpirun stops the others; NCCL aborts.
void df_dist_abort(df_dist *d, int exit_code);

// Where the TCP bootstrap listens: DRAFTFORGE_BOOTSTRAP_PORT when set, else the launch's master port — plus
// one under torchrun's elastic agent (TORCHELASTIC_USE_AGENT_STORE=True), whose own store holds MASTER_PORT.
df_status df_dist_bootstrap_port(const df_launch_info *li, df_getenv_fn get, void *ctx, int *port, df_error *err);

// Hands rank 0's blob to every rank: over host (an MPI communicator) when given, else the TCP exchange at the
// launch's master address and df_dist_bootstrap_port.
df_status df_dist_share_blob(const df_launch_info *li, df_comm *host, df_getenv_fn get, void *ctx, uint64_t job_key,
                             double timeout_s, void *blob, size_t len, df_error *err);

// Every rank must hold the same value (a hash of the recipe, the data size, ...): else an error naming `what`
// and the first rank that differs from rank 0. Collective.
df_status df_dist_check_same(df_comm *c, const char *what, uint64_t value, df_error *err);

// The layers' all-reduce hook (base/collective.h: MoE deferred updates and routing statistics, the aux loss's
// global weight) over c: an in-place fp32 SUM. c must outlive it.
df_collective df_dist_collective(df_comm *c);

#ifdef __cplusplus
}
#endif

#endif
