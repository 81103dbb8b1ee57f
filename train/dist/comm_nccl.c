// The NCCL communicator (device buffers). The communicator is non-blocking (ncclConfig_t.blocking = 0), so no
// NCCL call can hang the host: set-up, every call that answers ncclInProgress, and df_comm_wait poll
// ncclCommGetAsyncError against the timeout and abort the communicator past it. Collectives are queued on
// the caller's stream, or on a non-blocking stream of the communicator's own (the second stream beside the
// compute context's, ordered against it with events: df_comm_after / df_comm_mark); completion is stream-ordered
// (docs/distributed.md). Host buffers travel through a device stage and a pinned bounce buffer.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/dist/comm_impl.h"

_Static_assert(sizeof(ncclUniqueId) == DF_NCCL_ID_BYTES, "df_nccl_id must hold an ncclUniqueId");

typedef struct {
  ncclComm_t comm; // NULL once aborted
  cudaStream_t stream;
  bool own_stream; // created here (no stream in the options), destroyed with the communicator
  int device;
  int *scratch; // one device int for the barrier
  void *stage;  // device bytes for host exchanges (df_comm_*_host), grown on demand
  // Pinned host bytes, twice the stage: [0, cap) carries host → stage, [cap, 2·cap) stage → host (one half may
  // still be read by a queued copy while the other is written).
  char *bounce;
  size_t stage_cap;
} nccl_impl;

#define NCCL_HINT "set NCCL_DEBUG=WARN on every rank and look for the first rank that reports a problem"

static ncclDataType_t nccl_type(df_comm_dtype dt) {
  switch (dt) {
  case DF_COMM_F32: return ncclFloat32;
  case DF_COMM_F64: return ncclFloat64;
  case DF_COMM_I32: return ncclInt32;
  case DF_COMM_I64: return ncclInt64;
  case DF_COMM_U8: return ncclUint8;
  }
  return ncclFloat32;
}

static ncclRedOp_t nccl_op(df_comm_op op) {
  switch (op) {
  case DF_COMM_SUM: return ncclSum;
  case DF_COMM_AVG: return ncclAvg;
  case DF_COMM_MAX: return ncclMax;
  case DF_COMM_MIN: return ncclMin;
  }
  return ncclSum;
}

static void nccl_abort_comm(nccl_impl *m) {
  if (m->comm) ncclCommAbort(m->comm);
  m->comm = NULL;
}

static df_status nccl_error(df_comm *c, ncclResult_t r, const char *call, df_error *err) {
  nccl_impl *m = c->impl;
  const char *last = m->comm ? ncclGetLastError(m->comm) : NULL;
  df_status st =
      DF_FAIL(err, DF_ERR_IO, "NCCL", NCCL_HINT, "rank %d: %s failed in collective #%lld (%s): %s%s%s", c->rank, call,
              (long long)c->seq, c->what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
  nccl_abort_comm(m);
  return st;
}

static df_status cuda_error(df_comm *c, cudaError_t e, const char *call, df_error *err) {
  return DF_FAIL(err, DF_ERR_IO, "CUDA", "check the device (nvidia-smi) and CUDA_VISIBLE_DEVICES",
                 "rank %d: %s failed on device %d: %s", c->rank, call, ((nccl_impl *)c->impl)->device,
                 cudaGetErrorString(e));
}

static df_status nccl_timeout(df_comm *c, const char *what, df_error *err) {
  nccl_abort_comm(c->impl);
  return DF_FAIL(err, DF_ERR_IO, "NCCL",
                 "look for the rank whose own output stops first (NCCL cannot name it); if it was busy on purpose, "
                 "raise training.dist_timeout (minutes)",
                 "rank %d: %s did not finish within %.0f s: a peer rank is dead or hung (world %d)", c->rank, what,
                 c->timeout_s, c->size);
}

// A call on the non-blocking communicator may answer ncclInProgress: it has finished when the async error
// leaves that state.
static df_status settle(df_comm *c, ncclResult_t r, const char *call, df_error *err) {
  nccl_impl *m = c->impl;
  double t0 = df_comm_now_s();
  while (r == ncclInProgress) {
    double waited = df_comm_now_s() - t0;
    if (waited > c->timeout_s) return nccl_timeout(c, call, err);
    df_comm_poll_pause(waited, 1e-3, 200e-6);
    ncclResult_t a = ncclSuccess, q = ncclCommGetAsyncError(m->comm, &a);
    r = q != ncclSuccess ? q : a;
  }
  return r == ncclSuccess ? DF_OK : nccl_error(c, r, call, err);
}

static df_status nccl_all_reduce(df_comm *c, const void *send, void *recv, size_t count, df_comm_dtype dt,
                                 df_comm_op op, df_error *err) {
  nccl_impl *m = c->impl;
  return settle(c, ncclAllReduce(send, recv, count, nccl_type(dt), nccl_op(op), m->comm, m->stream), "ncclAllReduce",
                err);
}

static df_status nccl_reduce_scatter(df_comm *c, const void *send, void *recv, size_t recv_count, df_comm_dtype dt,
                                     df_comm_op op, df_error *err) {
  nccl_impl *m = c->impl;
  return settle(c, ncclReduceScatter(send, recv, recv_count, nccl_type(dt), nccl_op(op), m->comm, m->stream),
                "ncclReduceScatter", err);
}

static df_status nccl_all_gather(df_comm *c, const void *send, void *recv, size_t send_count, df_comm_dtype dt,
                                 df_error *err) {
  nccl_impl *m = c->impl;
  return settle(c, ncclAllGather(send, recv, send_count, nccl_type(dt), m->comm, m->stream), "ncclAllGather", err);
}

static df_status nccl_broadcast(df_comm *c, void *buf, size_t count, df_comm_dtype dt, int root, df_error *err) {
  nccl_impl *m = c->impl;
  return settle(c, ncclBroadcast(buf, buf, count, nccl_type(dt), root, m->comm, m->stream), "ncclBroadcast", err);
}

static df_status nccl_reduce(df_comm *c, void *buf, size_t count, df_comm_dtype dt, df_comm_op op, int root,
                             df_error *err) {
  nccl_impl *m = c->impl;
  return settle(c, ncclReduce(buf, buf, count, nccl_type(dt), nccl_op(op), root, m->comm, m->stream), "ncclReduce",
                err);
}

// Polls the stream: done, a CUDA error, NCCL's async error, or the timeout (then the communicator is aborted).
static df_status nccl_wait(df_comm *c, df_error *err) {
  nccl_impl *m = c->impl;
  double t0 = df_comm_now_s();
  for (;;) {
    cudaError_t e = cudaStreamQuery(m->stream);
    if (e == cudaSuccess) return DF_OK;
    if (e != cudaErrorNotReady) return cuda_error(c, e, "cudaStreamQuery", err);
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(m->comm, &a) == ncclSuccess && a != ncclSuccess && a != ncclInProgress)
      return nccl_error(c, a, "a queued collective", err);
    double waited = df_comm_now_s() - t0;
    if (waited > c->timeout_s) return nccl_timeout(c, "the collectives queued on the stream", err);
    df_comm_poll_pause(waited, 1e-3, 200e-6);
  }
}

// NCCL has no barrier: a one-int all-reduce, waited for on the host.
static df_status nccl_barrier(df_comm *c, df_error *err) {
  nccl_impl *m = c->impl;
  DF_TRY(settle(c, ncclAllReduce(m->scratch, m->scratch, 1, ncclInt32, ncclSum, m->comm, m->stream), "barrier", err));
  return nccl_wait(c, err);
}

// ---- host exchanges and stream ordering ------------------------------------------------------------------------

static df_status nccl_stage(df_comm *c, size_t bytes, void **dev, df_error *err) {
  nccl_impl *m = c->impl;
  if (bytes > m->stage_cap) {
    DF_TRY(nccl_wait(c, err)); // nothing queued may still read the old stage
    if (m->stage) cudaFree(m->stage), m->stage = NULL;
    if (m->bounce) cudaFreeHost(m->bounce), m->bounce = NULL;
    m->stage_cap = 0;
    size_t cap = bytes < 4096 ? 4096 : bytes;
    cudaError_t e = cudaMalloc(&m->stage, cap);
    if (e != cudaSuccess) return cuda_error(c, e, "cudaMalloc (host exchange stage)", err);
    e = cudaMallocHost((void **)&m->bounce, 2 * cap);
    if (e != cudaSuccess) return cuda_error(c, e, "cudaMallocHost (host exchange stage)", err);
    m->stage_cap = cap;
  }
  *dev = m->stage;
  return DF_OK;
}

static df_status nccl_stage_in(df_comm *c, void *dev, const void *host, size_t bytes, df_error *err) {
  nccl_impl *m = c->impl;
  if (!bytes) return DF_OK;
  DF_TRY(nccl_wait(c, err)); // an earlier host → stage copy may still read this half
  memcpy(m->bounce, host, bytes);
  cudaError_t e = cudaMemcpyAsync(dev, m->bounce, bytes, cudaMemcpyHostToDevice, m->stream);
  return e == cudaSuccess ? DF_OK : cuda_error(c, e, "cudaMemcpyAsync (host → stage)", err);
}

static df_status nccl_stage_out(df_comm *c, void *host, const void *dev, size_t bytes, df_error *err) {
  nccl_impl *m = c->impl;
  if (bytes) {
    cudaError_t e = cudaMemcpyAsync(m->bounce + m->stage_cap, dev, bytes, cudaMemcpyDeviceToHost, m->stream);
    if (e != cudaSuccess) return cuda_error(c, e, "cudaMemcpyAsync (stage → host)", err);
  }
  DF_TRY(nccl_wait(c, err));
  if (bytes) memcpy(host, m->bounce + m->stage_cap, bytes);
  return DF_OK;
}

static df_status nccl_after(df_comm *c, void *event, df_error *err) {
  nccl_impl *m = c->impl;
  cudaError_t e = cudaStreamWaitEvent(m->stream, (cudaEvent_t)event, 0);
  return e == cudaSuccess ? DF_OK : cuda_error(c, e, "cudaStreamWaitEvent", err);
}

static df_status nccl_mark(df_comm *c, void *event, df_error *err) {
  nccl_impl *m = c->impl;
  cudaError_t e = cudaEventRecord((cudaEvent_t)event, m->stream);
  return e == cudaSuccess ? DF_OK : cuda_error(c, e, "cudaEventRecord", err);
}

static int nccl_device(const df_comm *c) { return ((const nccl_impl *)c->impl)->device; }

static df_status nccl_finish(df_comm *c, df_error *err) {
  nccl_impl *m = c->impl;
  DF_TRY(nccl_barrier(c, err));
  DF_TRY(settle(c, ncclCommFinalize(m->comm), "ncclCommFinalize", err));
  ncclCommDestroy(m->comm);
  m->comm = NULL;
  return DF_OK;
}

static void nccl_abort(df_comm *c, int exit_code) { nccl_abort_comm(c->impl); }

static void nccl_release(df_comm *c) {
  nccl_impl *m = c->impl;
  if (!m) return;
  nccl_abort_comm(m);
  if (m->scratch) cudaFree(m->scratch);
  if (m->stage) cudaFree(m->stage);
  if (m->bounce) cudaFreeHost(m->bounce);
  if (m->own_stream && m->stream) cudaStreamDestroy(m->stream);
  free(m);
  c->impl = NULL;
}

static const df_comm_vtable NCCL_TABLE = {.all_reduce = nccl_all_reduce,
                                          .reduce_scatter = nccl_reduce_scatter,
                                          .all_gather = nccl_all_gather,
                                          .broadcast = nccl_broadcast,
                                          .reduce = nccl_reduce,
                                          .barrier = nccl_barrier,
                                          .wait = nccl_wait,
                                          .finish = nccl_finish,
                                          .abort = nccl_abort,
                                          .release = nccl_release,
                                          .stage = nccl_stage,
                                          .stage_in = nccl_stage_in,
                                          .stage_out = nccl_stage_out,
                                          .after = nccl_after,
                                          .mark = nccl_mark,
                                          .device = nccl_device};

df_status df_comm_nccl_new_id(df_nccl_id *id, df_error *err) {
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess)
    return DF_FAIL(err, DF_ERR_IO, "NCCL", "check the network interfaces (NCCL_SOCKET_IFNAME) or NCCL_COMM_ID",
                   "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
  memcpy(id->bytes, &uid, sizeof uid);
  return DF_OK;
}

static df_status nccl_setup(df_comm *c, const df_comm_nccl_options *o, df_error *err) {
  nccl_impl *m = c->impl;
  cudaError_t e = cudaSetDevice(o->device);
  if (e != cudaSuccess) return cuda_error(c, e, "cudaSetDevice", err);
  if (!m->stream) {
    e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_error(c, e, "cudaStreamCreateWithFlags", err);
    m->own_stream = true;
  }
  e = cudaMalloc((void **)&m->scratch, sizeof(int));
  if (e != cudaSuccess) return cuda_error(c, e, "cudaMalloc", err);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclUniqueId uid;
  memcpy(&uid, o->id->bytes, sizeof uid);
  snprintf(c->what, sizeof c->what, "communicator set-up");
  return settle(c, ncclCommInitRankConfig(&m->comm, o->world_size, uid, o->rank, &cfg), "ncclCommInitRankConfig", err);
}

df_status df_comm_create_nccl(const df_comm_nccl_options *opt, df_comm **out, df_error *err) {
  *out = NULL;
  if (!opt || !opt->id || opt->world_size < 1 || opt->rank < 0 || opt->rank >= opt->world_size || opt->device < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "NCCL", NULL, "NCCL communicator: rank %d of %d on device %d, id %s",
                   opt ? opt->rank : -1, opt ? opt->world_size : 0, opt ? opt->device : -1,
                   opt && opt->id ? "given" : "missing");
  nccl_impl *m = calloc(1, sizeof *m);
  df_comm *c = calloc(1, sizeof *c);
  if (!m || !c) {
    free(m), free(c);
    return DF_FAIL(err, DF_ERR_NOMEM, "NCCL", NULL, "out of memory");
  }
  m->stream = (cudaStream_t)opt->stream, m->device = opt->device;
  df_comm_init_common(c, &NCCL_TABLE, DF_COMM_NCCL, opt->rank, opt->world_size, true, opt->timeout_s, m);
  df_status st = nccl_setup(c, opt, err);
  if (st != DF_OK) {
    nccl_release(c);
    free(c);
    return st;
  }
  *out = c;
  return DF_OK;
}
