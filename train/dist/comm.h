// Collective communication between the ranks of a data-parallel job (docs/distributed.md): one interface, three
// backends — single process (no-op), MPI (host buffers) and NCCL (device buffers, queued on a CUDA stream).
#ifndef DF_TRAIN_DIST_COMM_H
#define DF_TRAIN_DIST_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_comm df_comm;

typedef enum { DF_COMM_SINGLE = 0, DF_COMM_MPI = 1, DF_COMM_NCCL = 2 } df_comm_backend;

// Element types: fp32 for gradients and parameters, fp64 for norms and loss sums, integers for counts, bytes
// for ids and hashes.
typedef enum { DF_COMM_F32 = 0, DF_COMM_F64, DF_COMM_I32, DF_COMM_I64, DF_COMM_U8 } df_comm_dtype;

// AVG is SUM divided by the world size, for floating types only (an integer mean would truncate: sum counts).
typedef enum { DF_COMM_SUM = 0, DF_COMM_AVG, DF_COMM_MAX, DF_COMM_MIN } df_comm_op;

size_t df_comm_dtype_size(df_comm_dtype dt);
const char *df_comm_dtype_name(df_comm_dtype dt);
const char *df_comm_op_name(df_comm_op op);
const char *df_comm_backend_name(df_comm_backend b);
// Whether this build has the backend (single: always; MPI: built with OpenMPI; NCCL: built with CUDA + NCCL).
bool df_comm_backend_available(df_comm_backend b);

// The default time a collective may take before the job is declared hung (training.dist_timeout's default).
#define DF_COMM_DEFAULT_TIMEOUT_S 600.0

// ---- creating a communicator -------------------------------------------------------------------------------------

// World size 1. device_buffers: the buffers are device pointers (then only in-place calls are accepted, since
// the no-op backend does no device copies).
df_status df_comm_create_single(bool device_buffers, df_comm **out, df_error *err);

typedef struct {
  double timeout_s; // a collective (and the final barrier) not done in this time fails, naming the silent ranks
  // The launcher's view, checked against MPI's once it is initialised (-1: not checked); vars names the
  // environment variables it came from, for the message ("OMPI_COMM_WORLD_RANK/SIZE").
  int expect_rank, expect_world;
  const char *vars;
} df_comm_mpi_options;

// Initialises MPI (unless the process already did) and duplicates MPI_COMM_WORLD. Without MPI in the build:
// DF_ERR_UNSUPPORTED naming the missing package.
df_status df_comm_create_mpi(const df_comm_mpi_options *opt, df_comm **out, df_error *err);

#define DF_NCCL_ID_BYTES 128 // NCCL_UNIQUE_ID_BYTES
typedef struct {
  unsigned char bytes[DF_NCCL_ID_BYTES];
} df_nccl_id;

// Rank 0 makes the id (ncclGetUniqueId: it honours NCCL_COMM_ID); every rank must then hold the same bytes.
df_status df_comm_nccl_new_id(df_nccl_id *id, df_error *err);

typedef struct {
  int rank, world_size;
  int device; // CUDA device ordinal (the launcher's local rank, usually)
  const df_nccl_id *id;
  void *stream;     // cudaStream_t the collectives are queued on (NULL: the legacy default stream)
  double timeout_s; // communicator set-up and df_comm_wait
} df_comm_nccl_options;

// Without CUDA/NCCL in the build: DF_ERR_UNSUPPORTED. Without a device: the CUDA error, naming the device.
df_status df_comm_create_nccl(const df_comm_nccl_options *opt, df_comm **out, df_error *err);

// ---- what it is ----------------------------------------------------------------------------------------------

int df_comm_rank(const df_comm *c);
int df_comm_size(const df_comm *c);
df_comm_backend df_comm_backend_of(const df_comm *c);
bool df_comm_device_buffers(const df_comm *c);
double df_comm_timeout(const df_comm *c);
int64_t df_comm_num_collectives(const df_comm *c); // issued so far (collective #k in messages is the k-th)
// Payload bytes this rank handed to collectives so far: count · element size of every all-reduce, broadcast and
// all-gather send, recv_count · world · size of every reduce-scatter (what bench/ compares with the parameters).
uint64_t df_comm_payload_bytes(const df_comm *c);

// ---- collectives ---------------------------------------------------------------------------------------------
// Every rank calls the same collectives in the same order with the same counts. Host backends return when
// the result is in recv; NCCL queues the work on its stream (df_comm_wait, or any later sync, completes it).
// A collective that does not finish within the timeout fails with the silent rank(s) named; the communicator
// is then failed and every later call repeats that error. Buffers of the out-of-place form must not overlap.

// recv[i] = op over ranks of send[i], i < count. In place: send == recv.
df_status df_comm_all_reduce(df_comm *c, const void *send, void *recv, int64_t count, df_comm_dtype dt, df_comm_op op,
                             df_error *err);
// send holds world · recv_count elements; rank r receives op over ranks of send[r·recv_count + i]. In place:
// recv == send + rank · recv_count (NCCL's convention); the rest of send is then undefined.
df_status df_comm_reduce_scatter(df_comm *c, const void *send, void *recv, int64_t recv_count, df_comm_dtype dt,
                                 df_comm_op op, df_error *err);
// recv holds world · send_count elements: rank r's send at recv[r·send_count]. In place: send == recv + rank ·
// send_count.
df_status df_comm_all_gather(df_comm *c, const void *send, void *recv, int64_t send_count, df_comm_dtype dt,
                             df_error *err);
// buf (count elements) on every rank becomes root's.
df_status df_comm_broadcast(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, int root, df_error *err);
// In place: root's buf[i] becomes op over ranks of buf[i], i < count; the other ranks' buf is undefined afterwards
// (NCCL leaves it, MPI too; do not rely on either). ZeRO-1's gradient buckets: each shard's part to its owner.
df_status df_comm_reduce(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, df_comm_op op, int root,
                         df_error *err);
df_status df_comm_barrier(df_comm *c, df_error *err);
// Completes what was queued (NCCL: the stream, polled against the timeout and NCCL's async error); host
// backends: nothing is pending.
df_status df_comm_wait(df_comm *c, df_error *err);

// ---- host memory on any backend --------------------------------------------------------------------------------
// Small exchanges the host decides on (counters, flags, the resume progress, hashes), in place in host memory
// whatever the backend: a device backend stages the bytes through a device buffer of its own and returns once
// the result is back on the host (a synchronous round trip, bounded by the timeout like df_comm_wait).
df_status df_comm_all_reduce_host(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, df_comm_op op, df_error *err);
df_status df_comm_broadcast_host(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, int root, df_error *err);
// recv (host, world · send_count elements) gathers every rank's send (host).
df_status df_comm_all_gather_host(df_comm *c, const void *send, void *recv, int64_t send_count, df_comm_dtype dt,
                                  df_error *err);

// ---- ordering against a compute stream (device backends) -------------------------------------------------------
// The NCCL communicator queues its collectives on a stream of its own (unless df_comm_nccl_options.stream names
// one), so they can overlap the compute stream's work. event: a cudaEvent_t of the communicator's device (the
// backend handle of a df_event, df_event_native). after: collectives queued from now on start only once event
// (recorded by the caller on its stream) has completed. mark: records event on the communicator's stream behind
// everything queued there, for the caller's stream to wait on. Host backends: no-ops (calls complete in place).
df_status df_comm_after(df_comm *c, void *event, df_error *err);
df_status df_comm_mark(df_comm *c, void *event, df_error *err);
// The CUDA device ordinal of a device-buffer communicator (NCCL), else -1.
int df_comm_device(const df_comm *c);

// ---- ending --------------------------------------------------------------------------------------------------

// The orderly end: a timed barrier, then MPI_Finalize / ncclCommDestroy, and c is freed. When the barrier fails
// (a rank is gone) the error says so and c is NOT freed: print it, then df_comm_abort.
df_status df_comm_finish(df_comm *c, df_error *err);
// Ends the whole job after this rank failed: MPI_Abort (mpirun then stops every rank; this process ends too,
// so print the error first) or ncclCommAbort (returns); frees c. Single process: frees c.
void df_comm_abort(df_comm *c, int exit_code);

#ifdef __cplusplus
}
#endif

#endif
