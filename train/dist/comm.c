// The communicator dispatcher (train/dist/comm.h): argument checks that name the argument, the in-place rules,
// numbering, payload accounting and the sticky failure state; then the backend's table.
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/dist/comm_impl.h"

size_t df_comm_dtype_size(df_comm_dtype dt) {
  switch (dt) {
  case DF_COMM_F32: return 4;
  case DF_COMM_F64: return 8;
  case DF_COMM_I32: return 4;
  case DF_COMM_I64: return 8;
  case DF_COMM_U8: return 1;
  }
  return 0;
}

const char *df_comm_dtype_name(df_comm_dtype dt) {
  switch (dt) {
  case DF_COMM_F32: return "f32";
  case DF_COMM_F64: return "f64";
  case DF_COMM_I32: return "i32";
  case DF_COMM_I64: return "i64";
  case DF_COMM_U8: return "u8";
  }
  return "?";
}

const char *df_comm_op_name(df_comm_op op) {
  switch (op) {
  case DF_COMM_SUM: return "sum";
  case DF_COMM_AVG: return "avg";
  case DF_COMM_MAX: return "max";
  case DF_COMM_MIN: return "min";
  }
  return "?";
}

const char *df_comm_backend_name(df_comm_backend b) {
  switch (b) {
  case DF_COMM_SINGLE: return "single";
  case DF_COMM_MPI: return "mpi";
  case DF_COMM_NCCL: return "nccl";
  }
  return "?";
}

void df_comm_init_common(df_comm *c, const df_comm_vtable *vt, df_comm_backend b, int rank, int size,
                         bool device_buffers, double timeout_s, void *impl) {
  memset(c, 0, sizeof *c);
  c->vt = vt, c->backend = b, c->rank = rank, c->size = size, c->device_buffers = device_buffers;
  c->timeout_s = timeout_s > 0 ? timeout_s : DF_COMM_DEFAULT_TIMEOUT_S;
  c->impl = impl;
}

double df_comm_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void df_comm_poll_pause(double waited_s, double spin_s, double max_sleep_s) {
  if (waited_s < spin_s) {
    sched_yield();
    return;
  }
  double pause = waited_s * 0.05;
  if (pause > max_sleep_s) pause = max_sleep_s;
  struct timespec ts = {0, (long)(pause * 1e9)};
  nanosleep(&ts, NULL);
}

int df_comm_rank(const df_comm *c) { return c->rank; }
int df_comm_size(const df_comm *c) { return c->size; }
df_comm_backend df_comm_backend_of(const df_comm *c) { return c->backend; }
bool df_comm_device_buffers(const df_comm *c) { return c->device_buffers; }
double df_comm_timeout(const df_comm *c) { return c->timeout_s; }
int64_t df_comm_num_collectives(const df_comm *c) { return c->seq; }
uint64_t df_comm_payload_bytes(const df_comm *c) { return c->bytes; }

// ---- checks --------------------------------------------------------------------------------------------------

static df_status check_comm(df_comm *c, df_error *err) {
  if (!c) return DF_FAIL(err, DF_ERR_INVALID, "comm", NULL, "no communicator");
  if (c->failed) {
    if (err) *err = c->failure;
    return c->failure.status;
  }
  return DF_OK;
}

static df_status check_type(const char *what, int64_t count, df_comm_dtype dt, df_comm_op op, bool reduces,
                            df_error *err) {
  if (df_comm_dtype_size(dt) == 0)
    return DF_FAIL(err, DF_ERR_INVALID, "dtype", NULL, "%s: unknown element type %d", what, (int)dt);
  if (count < 0) return DF_FAIL(err, DF_ERR_INVALID, "count", NULL, "%s: count %lld < 0", what, (long long)count);
  if (!reduces) return DF_OK;
  if ((unsigned)op > DF_COMM_MIN)
    return DF_FAIL(err, DF_ERR_INVALID, "op", NULL, "%s: unknown reduction %d", what, (int)op);
  if (op == DF_COMM_AVG && dt != DF_COMM_F32 && dt != DF_COMM_F64)
    return DF_FAIL(err, DF_ERR_INVALID, "op", "sum the counts and divide where the mean is used",
                   "%s: avg of %s (an integer mean would truncate)", what, df_comm_dtype_name(dt));
  return DF_OK;
}

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
  return na && nb && pa < pb + nb && pb < pa + na;
}

// Out of place: disjoint buffers; in place: exactly the given position. NULL only with nothing to move.
// in_place_at: where send must start for the in-place form (an address, compared as a number).
static df_status check_bufs(const df_comm *c, const char *what, const void *send, size_t ns, const void *recv,
                            size_t nr, uintptr_t in_place_at, df_error *err) {
  if ((ns && !send) || (nr && !recv))
    return DF_FAIL(err, DF_ERR_INVALID, send ? "recv" : "send", NULL, "%s: NULL buffer", what);
  bool in_place = (uintptr_t)send == in_place_at && ns && nr;
  if (!in_place && overlap(send, ns, recv, nr))
    return DF_FAIL(err, DF_ERR_INVALID, "recv", "use disjoint buffers, or the in-place form (comm.h)",
                   "%s: send and recv overlap but are not the in-place form", what);
  if (c->device_buffers && c->backend == DF_COMM_SINGLE && !in_place && ns && nr)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "recv", "call it in place (comm.h)",
                   "%s: the single-process communicator makes no device copies", what);
  return DF_OK;
}

// Numbers the call and records what it is; the backend's failure (if any) becomes the sticky failure.
static void begin(df_comm *c, const char *kind, int64_t count, df_comm_dtype dt, uint64_t bytes) {
  c->seq++;
  c->bytes += bytes;
  snprintf(c->what, sizeof c->what, "%s of %lld %s", kind, (long long)count, df_comm_dtype_name(dt));
}

static df_status end(df_comm *c, df_status st, df_error *err) {
  if (st != DF_OK && !c->failed) {
    c->failed = true;
    if (err)
      c->failure = *err;
    else
      DF_FAIL(&c->failure, st, "comm", NULL, "collective #%lld (%s) failed", (long long)c->seq, c->what);
  }
  return st;
}

// ---- collectives ---------------------------------------------------------------------------------------------

df_status df_comm_all_reduce(df_comm *c, const void *send, void *recv, int64_t count, df_comm_dtype dt, df_comm_op op,
                             df_error *err) {
  DF_TRY(check_comm(c, err));
  DF_TRY(check_type("all-reduce", count, dt, op, true, err));
  size_t n = (size_t)count * df_comm_dtype_size(dt);
  DF_TRY(check_bufs(c, "all-reduce", send, n, recv, n, (uintptr_t)recv, err));
  begin(c, "all-reduce", count, dt, n);
  return end(c, c->vt->all_reduce(c, send, recv, (size_t)count, dt, op, err), err);
}

df_status df_comm_reduce_scatter(df_comm *c, const void *send, void *recv, int64_t recv_count, df_comm_dtype dt,
                                 df_comm_op op, df_error *err) {
  DF_TRY(check_comm(c, err));
  DF_TRY(check_type("reduce-scatter", recv_count, dt, op, true, err));
  size_t nr = (size_t)recv_count * df_comm_dtype_size(dt), ns = nr * (size_t)c->size;
  uintptr_t in_place = (uintptr_t)recv - (uintptr_t)c->rank * nr;
  DF_TRY(check_bufs(c, "reduce-scatter", send, ns, recv, nr, in_place, err));
  begin(c, "reduce-scatter", recv_count, dt, ns);
  return end(c, c->vt->reduce_scatter(c, send, recv, (size_t)recv_count, dt, op, err), err);
}

df_status df_comm_all_gather(df_comm *c, const void *send, void *recv, int64_t send_count, df_comm_dtype dt,
                             df_error *err) {
  DF_TRY(check_comm(c, err));
  DF_TRY(check_type("all-gather", send_count, dt, DF_COMM_SUM, false, err));
  size_t ns = (size_t)send_count * df_comm_dtype_size(dt), nr = ns * (size_t)c->size;
  uintptr_t in_place = (uintptr_t)recv + (uintptr_t)c->rank * ns;
  DF_TRY(check_bufs(c, "all-gather", send, ns, recv, nr, in_place, err));
  begin(c, "all-gather", send_count, dt, ns);
  return end(c, c->vt->all_gather(c, send, recv, (size_t)send_count, dt, err), err);
}

// The checks of an in-place collective with a root (broadcast, reduce), then its numbering.
static df_status begin_rooted(df_comm *c, const char *what, void *buf, int64_t count, df_comm_dtype dt, df_comm_op op,
                              bool reduces, int root, df_error *err) {
  DF_TRY(check_comm(c, err));
  DF_TRY(check_type(what, count, dt, op, reduces, err));
  if (root < 0 || root >= c->size)
    return DF_FAIL(err, DF_ERR_INVALID, "root", NULL, "%s: root %d is not a rank of %d", what, root, c->size);
  size_t n = (size_t)count * df_comm_dtype_size(dt);
  if (n && !buf) return DF_FAIL(err, DF_ERR_INVALID, "buf", NULL, "%s: NULL buffer", what);
  begin(c, what, count, dt, n);
  return DF_OK;
}

df_status df_comm_broadcast(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, int root, df_error *err) {
  DF_TRY(begin_rooted(c, "broadcast", buf, count, dt, DF_COMM_SUM, false, root, err));
  return end(c, c->vt->broadcast(c, buf, (size_t)count, dt, root, err), err);
}

df_status df_comm_reduce(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, df_comm_op op, int root,
                         df_error *err) {
  DF_TRY(begin_rooted(c, "reduce", buf, count, dt, op, true, root, err));
  return end(c, c->vt->reduce(c, buf, (size_t)count, dt, op, root, err), err);
}

df_status df_comm_barrier(df_comm *c, df_error *err) {
  DF_TRY(check_comm(c, err));
  begin(c, "barrier", 0, DF_COMM_U8, 0);
  snprintf(c->what, sizeof c->what, "barrier");
  return end(c, c->vt->barrier(c, err), err);
}

df_status df_comm_wait(df_comm *c, df_error *err) {
  DF_TRY(check_comm(c, err));
  return end(c, c->vt->wait(c, err), err);
}

// ---- host memory on any backend -------------------------------------------------------------------------------

// A device backend's staged call: host → stage, the collective in place on the stage, stage → host.
static bool staged(const df_comm *c) { return c->device_buffers && c->vt->stage; }

df_status df_comm_all_reduce_host(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, df_comm_op op,
                                  df_error *err) {
  DF_TRY(check_comm(c, err));
  if (!staged(c)) return df_comm_all_reduce(c, buf, buf, count, dt, op, err);
  const size_t n = (size_t)(count > 0 ? count : 0) * df_comm_dtype_size(dt);
  void *d = NULL;
  DF_TRY(end(c, c->vt->stage(c, n, &d, err), err));
  DF_TRY(end(c, c->vt->stage_in(c, d, buf, n, err), err));
  DF_TRY(df_comm_all_reduce(c, d, d, count, dt, op, err));
  return end(c, c->vt->stage_out(c, buf, d, n, err), err);
}

df_status df_comm_broadcast_host(df_comm *c, void *buf, int64_t count, df_comm_dtype dt, int root, df_error *err) {
  DF_TRY(check_comm(c, err));
  if (!staged(c)) return df_comm_broadcast(c, buf, count, dt, root, err);
  const size_t n = (size_t)(count > 0 ? count : 0) * df_comm_dtype_size(dt);
  void *d = NULL;
  DF_TRY(end(c, c->vt->stage(c, n, &d, err), err));
  DF_TRY(end(c, c->vt->stage_in(c, d, buf, n, err), err));
  DF_TRY(df_comm_broadcast(c, d, count, dt, root, err));
  return end(c, c->vt->stage_out(c, buf, d, n, err), err);
}

df_status df_comm_all_gather_host(df_comm *c, const void *send, void *recv, int64_t send_count, df_comm_dtype dt,
                                  df_error *err) {
  DF_TRY(check_comm(c, err));
  if (!staged(c)) return df_comm_all_gather(c, send, recv, send_count, dt, err);
  const size_t ns = (size_t)(send_count > 0 ? send_count : 0) * df_comm_dtype_size(dt), nr = ns * (size_t)c->size;
  void *d = NULL;
  DF_TRY(end(c, c->vt->stage(c, nr, &d, err), err));
  char *mine = (char *)d + (size_t)c->rank * ns; // the in-place form
  DF_TRY(end(c, c->vt->stage_in(c, mine, send, ns, err), err));
  DF_TRY(df_comm_all_gather(c, mine, d, send_count, dt, err));
  return end(c, c->vt->stage_out(c, recv, d, nr, err), err);
}

// ---- ordering against a compute stream ------------------------------------------------------------------------

df_status df_comm_after(df_comm *c, void *event, df_error *err) {
  DF_TRY(check_comm(c, err));
  return c->vt->after && event ? end(c, c->vt->after(c, event, err), err) : DF_OK;
}

df_status df_comm_mark(df_comm *c, void *event, df_error *err) {
  DF_TRY(check_comm(c, err));
  return c->vt->mark && event ? end(c, c->vt->mark(c, event, err), err) : DF_OK;
}

int df_comm_device(const df_comm *c) { return c && c->vt->device ? c->vt->device(c) : -1; }

// ---- ending --------------------------------------------------------------------------------------------------

df_status df_comm_finish(df_comm *c, df_error *err) {
  if (!c) return DF_OK;
  DF_TRY(check_comm(c, err));
  snprintf(c->what, sizeof c->what, "final barrier");
  c->seq++;
  df_status st = end(c, c->vt->finish(c, err), err);
  if (st != DF_OK) return st;
  c->vt->release(c);
  free(c);
  return DF_OK;
}

void df_comm_abort(df_comm *c, int exit_code) {
  if (!c) return;
  c->vt->abort(c, exit_code);
  c->vt->release(c);
  free(c);
}

bool df_comm_backend_available(df_comm_backend b) {
  switch (b) {
  case DF_COMM_SINGLE: return true;
#ifdef DF_HAVE_MPI
  case DF_COMM_MPI: return true;
#endif
#ifdef DF_HAVE_NCCL
  case DF_COMM_NCCL: return true;
#endif
  default: return false;
  }
}
