// NCCL of the CUDA emulator, served by MPI. A communicator is a split of MPI_COMM_WORLD by the unique id (so every
// rank must be an MPI process: mpirun); a world of one needs no MPI. Collectives are queued on the caller's stream
// like kernels and run, with MPI, when that stream drains; the buffers are the emulated device memory, which lives
// on the host. Non-blocking communicators complete every call at once (never ncclInProgress).
#include <mpi.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <vector>

#include "kernels/cuda/emu/internal.h"

using namespace df_emu;

struct ncclComm {
  MPI_Comm comm; // MPI_COMM_NULL for a world of one
  int rank, size, device;
  ncclResult_t async;
  char last[512];
};

namespace {

const char kIdMagic[8] = {'D', 'F', 'E', 'M', 'U', 'N', 'C', 'L'};
char g_last[512];

ncclResult_t fail(ncclComm *c, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(ncclComm *c, ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c ? c->last : g_last, sizeof g_last, fmt, ap);
  va_end(ap);
  warn("NCCL: %s", c ? c->last : g_last);
  return r;
}

bool mpi_type(ncclDataType_t t, MPI_Datatype *out, size_t *size) {
  switch (t) {
  case ncclInt8: *out = MPI_INT8_T, *size = 1; return true;
  case ncclUint8: *out = MPI_UINT8_T, *size = 1; return true;
  case ncclInt32: *out = MPI_INT32_T, *size = 4; return true;
  case ncclUint32: *out = MPI_UINT32_T, *size = 4; return true;
  case ncclInt64: *out = MPI_INT64_T, *size = 8; return true;
  case ncclUint64: *out = MPI_UINT64_T, *size = 8; return true;
  case ncclFloat32: *out = MPI_FLOAT, *size = 4; return true;
  case ncclFloat64: *out = MPI_DOUBLE, *size = 8; return true;
  default: return false;
  }
}

bool mpi_op(ncclRedOp_t op, MPI_Op *out) {
  switch (op) {
  case ncclSum:
  case ncclAvg: *out = MPI_SUM; return true; // avg: the sum, divided afterwards
  case ncclProd: *out = MPI_PROD; return true;
  case ncclMax: *out = MPI_MAX; return true;
  case ncclMin: *out = MPI_MIN; return true;
  default: return false;
  }
}

template <typename T> void divide(void *p, size_t n, int by) {
  T *x = (T *)p;
  for (size_t i = 0; i < n; i++) x[i] = (T)(x[i] / (T)by);
}

void average(void *p, size_t n, ncclDataType_t t, int size) {
  switch (t) {
  case ncclInt8: divide<int8_t>(p, n, size); break;
  case ncclUint8: divide<uint8_t>(p, n, size); break;
  case ncclInt32: divide<int32_t>(p, n, size); break;
  case ncclUint32: divide<uint32_t>(p, n, size); break;
  case ncclInt64: divide<int64_t>(p, n, size); break;
  case ncclUint64: divide<uint64_t>(p, n, size); break;
  case ncclFloat32: divide<float>(p, n, size); break;
  default: divide<double>(p, n, size); break;
  }
}

// Device buffers of the emulator (or pinned host memory, as NCCL accepts registered buffers): bytes in bounds.
void check_buffer(const char *call, const char *what, const void *p, size_t bytes) {
  if (bytes == 0) return;
  const allocation *a = NULL;
  const ptr_kind k = classify(p, &a);
  if (k != PTR_DEVICE && k != PTR_PINNED)
    fatal("NCCL collectives take device buffers", "%s: %s %p is not device memory", call, what, p);
  if ((uintptr_t)p + bytes > a->base + a->size)
    fatal("check the element count", "%s: %s needs %zu bytes at %p, past the end of its allocation", call, what, bytes,
          p);
}

bool comm_ok(ncclComm *c) { return c && c->async == ncclSuccess; }

} // namespace

extern "C" ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, kIdMagic, sizeof kIdMagic);
  if (getrandom(id->internal + 8, 16, 0) != 16) {
    const long pid = getpid();
    memcpy(id->internal + 8, &pid, sizeof pid);
  }
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                               ncclConfig_t *config) {
  (void)config; // blocking or not: the emulated set-up completes at once
  if (!out) return ncclInvalidArgument;
  *out = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(NULL, ncclInvalidArgument, "rank %d of %d is not a rank of the communicator", rank, nranks);
  if (memcmp(id.internal, kIdMagic, sizeof kIdMagic))
    return fail(NULL, ncclInvalidArgument, "the unique id did not come from ncclGetUniqueId");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device_count() == 0)
    return fail(NULL, ncclUnhandledCudaError, "no CUDA device for rank %d", rank);
  ncclComm *c = new ncclComm();
  c->comm = MPI_COMM_NULL, c->rank = rank, c->size = nranks, c->device = device, c->async = ncclSuccess;
  if (nranks > 1) {
    int init = 0, fin = 0;
    MPI_Initialized(&init), MPI_Finalized(&fin);
    if (!init || fin) {
      delete c;
      return fail(NULL, ncclSystemError,
                  "the emulated NCCL connects ranks through MPI, and this process has no MPI "
                  "world (start the ranks with mpirun)");
    }
    uint32_t h = 2166136261u; // the id picks the split's colour: ranks with one id meet
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ (uint8_t)id.internal[i]) * 16777619u;
    MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x7fffffff), rank, &c->comm);
    int size = 0, r = 0;
    MPI_Comm_size(c->comm, &size), MPI_Comm_rank(c->comm, &r);
    if (size != nranks || r != rank) {
      MPI_Comm_free(&c->comm);
      delete c;
      return fail(NULL, ncclInvalidUsage, "rank %d of %d: the MPI processes holding this id are %d (this one rank %d)",
                  rank, nranks, size, r);
    }
  }
  *out = c;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

extern "C" ncclResult_t ncclCommFinalize(ncclComm_t c) { return c ? ncclSuccess : ncclInvalidArgument; }

static void release(ncclComm_t c) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (c->comm != MPI_COMM_NULL && !fin) MPI_Comm_free(&c->comm);
  delete c;
}

extern "C" ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  cudaDeviceSynchronize(); // its queued collectives run first
  release(c);
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  release(c);
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err) return ncclInvalidArgument;
  *err = c->async;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!c || !count) return ncclInvalidArgument;
  *count = c->size;
  return ncclSuccess;
}

extern "C" ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!c || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

extern "C" const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

extern "C" const char *ncclGetLastError(ncclComm_t c) { return c ? c->last : g_last; }

extern "C" ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
extern "C" ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

// A reduction's communicator, type and op as MPI sees them (ncclSuccess), or the failure.
static ncclResult_t reduction_of(ncclComm_t c, const char *call, ncclDataType_t t, ncclRedOp_t op, MPI_Datatype *mt,
                                 MPI_Op *mo, size_t *es) {
  if (!comm_ok(c)) return ncclInvalidArgument;
  if (!mpi_type(t, mt, es) || !mpi_op(op, mo))
    return fail(c, ncclInvalidArgument, "%s: type %d / op %d (the emulator reduces 8-, 32- and 64-bit types)", call,
                (int)t, (int)op);
  return ncclSuccess;
}

extern "C" ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                      ncclComm_t c, cudaStream_t s) {
  MPI_Datatype mt = MPI_DATATYPE_NULL;
  MPI_Op mo = MPI_OP_NULL;
  size_t es = 0;
  if (ncclResult_t r = reduction_of(c, "ncclAllReduce", t, op, &mt, &mo, &es)) return r;
  std::lock_guard<std::recursive_mutex> g(lock());
  check_buffer("ncclAllReduce", "sendbuff", send, count * es),
      check_buffer("ncclAllReduce", "recvbuff", recv, count * es);
  enqueue(s, "ncclAllReduce", [=] {
    if (c->size == 1) {
      if (send != recv) memmove(recv, send, count * es);
    } else {
      MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mt, mo, c->comm);
      if (op == ncclAvg) average(recv, count, t, c->size);
    }
  });
  return ncclSuccess;
}

extern "C" ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                                          ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  MPI_Datatype mt = MPI_DATATYPE_NULL;
  MPI_Op mo = MPI_OP_NULL;
  size_t es = 0;
  if (ncclResult_t r = reduction_of(c, "ncclReduceScatter", t, op, &mt, &mo, &es)) return r;
  std::lock_guard<std::recursive_mutex> g(lock());
  check_buffer("ncclReduceScatter", "sendbuff", send, recvcount * es * c->size);
  check_buffer("ncclReduceScatter", "recvbuff", recv, recvcount * es);
  enqueue(s, "ncclReduceScatter", [=] {
    if (c->size == 1) {
      if (send != recv) memmove(recv, send, recvcount * es);
      return;
    }
    std::vector<char> in((const char *)send, (const char *)send + recvcount * es * c->size); // recv may lie inside send
    MPI_Reduce_scatter_block(in.data(), recv, (int)recvcount, mt, mo, c->comm);
    if (op == ncclAvg) average(recv, recvcount, t, c->size);
  });
  return ncclSuccess;
}

extern "C" ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                                      cudaStream_t s) {
  MPI_Datatype mt;
  size_t es;
  if (!comm_ok(c)) return ncclInvalidArgument;
  if (!mpi_type(t, &mt, &es)) return fail(c, ncclInvalidArgument, "ncclAllGather: type %d", (int)t);
  std::lock_guard<std::recursive_mutex> g(lock());
  check_buffer("ncclAllGather", "sendbuff", send, sendcount * es);
  check_buffer("ncclAllGather", "recvbuff", recv, sendcount * es * c->size);
  enqueue(s, "ncclAllGather", [=] {
    char *mine = (char *)recv + (size_t)c->rank * sendcount * es;
    if (c->size == 1) {
      if (send != recv) memmove(recv, send, sendcount * es);
      return;
    }
    if (send == mine)
      MPI_Allgather(MPI_IN_PLACE, 0, mt, recv, (int)sendcount, mt, c->comm);
    else
      MPI_Allgather(send, (int)sendcount, mt, recv, (int)sendcount, mt, c->comm);
  });
  return ncclSuccess;
}

extern "C" ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                                      ncclComm_t c, cudaStream_t s) {
  MPI_Datatype mt;
  size_t es;
  if (!comm_ok(c)) return ncclInvalidArgument;
  if (!mpi_type(t, &mt, &es)) return fail(c, ncclInvalidArgument, "ncclBroadcast: type %d", (int)t);
  if (root < 0 || root >= c->size) return fail(c, ncclInvalidArgument, "ncclBroadcast: root %d of %d", root, c->size);
  std::lock_guard<std::recursive_mutex> g(lock());
  if (c->rank == root) check_buffer("ncclBroadcast", "sendbuff", send, count * es);
  check_buffer("ncclBroadcast", "recvbuff", recv, count * es);
  enqueue(s, "ncclBroadcast", [=] {
    if (c->rank == root && send != recv) memmove(recv, send, count * es);
    if (c->size > 1) MPI_Bcast(recv, (int)count, mt, root, c->comm);
  });
  return ncclSuccess;
}

extern "C" ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                   int root, ncclComm_t c, cudaStream_t s) {
  MPI_Datatype mt = MPI_DATATYPE_NULL;
  MPI_Op mo = MPI_OP_NULL;
  size_t es = 0;
  if (ncclResult_t r = reduction_of(c, "ncclReduce", t, op, &mt, &mo, &es)) return r;
  if (root < 0 || root >= c->size) return fail(c, ncclInvalidArgument, "ncclReduce: root %d of %d", root, c->size);
  std::lock_guard<std::recursive_mutex> g(lock());
  check_buffer("ncclReduce", "sendbuff", send, count * es);
  if (c->rank == root) check_buffer("ncclReduce", "recvbuff", recv, count * es);
  enqueue(s, "ncclReduce", [=] {
    const bool at_root = c->rank == root;
    if (c->size == 1) {
      if (send != recv) memmove(recv, send, count * es);
      return;
    }
    if (at_root)
      MPI_Reduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mt, mo, root, c->comm);
    else
      MPI_Reduce(send, NULL, (int)count, mt, mo, root, c->comm);
    if (at_root && op == ncclAvg) average(recv, count, t, c->size);
  });
  return ncclSuccess;
}
