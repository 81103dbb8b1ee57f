// The MPI communicator (host buffers; OpenMPI). Every collective is the non-blocking MPI call followed by a
// timed wait, so a rank that died or hangs cannot stall the others forever: past the timeout the waiting rank
// probes every peer on a second communicator, and peers that are themselves waiting in a collective answer with
// its number. The error then names the ranks that did not answer (docs/distributed.md "Faults").
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/dist/comm_impl.h"

enum { TAG_PROBE = 1, TAG_REPLY_BASE = 100, TAG_REPLY_SPAN = 30000 };
#define CHUNK ((size_t)1 << 30) // elements per MPI call: MPI counts are int
// Polling: every MPI_Test advances the transfer, so a waiting rank spins (yielding the core, as OpenMPI's own
// blocking calls do) for SPIN_S, then sleeps at most SLEEP_S between tests while a slow peer is awaited.
#define SPIN_S  2.0
#define SLEEP_S 50e-6

typedef struct {
  MPI_Comm data, ctl; // collectives; watchdog probes and replies
  bool owns_mpi;      // this communicator initialised MPI, so it finalises it
  MPI_Request probe_rx;
  int64_t probe_in[3];   // {seq, reply tag, rank} of a peer's probe
  int64_t probe_out[3];  // ours
  MPI_Request *reply_tx; // (world) our last reply to each peer
  int64_t *reply_buf;    // (world, 3)
} mpi_impl;

static MPI_Datatype mpi_type(df_comm_dtype dt) {
  switch (dt) {
  case DF_COMM_F32: return MPI_FLOAT;
  case DF_COMM_F64: return MPI_DOUBLE;
  case DF_COMM_I32: return MPI_INT32_T;
  case DF_COMM_I64: return MPI_INT64_T;
  case DF_COMM_U8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(df_comm_op op) {
  switch (op) {
  case DF_COMM_MAX: return MPI_MAX;
  case DF_COMM_MIN: return MPI_MIN;
  default: return MPI_SUM; // avg: sum, then divided here
  }
}

static df_status mpi_error(df_comm *c, int rc, const char *call, df_error *err) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
  return DF_FAIL(err, DF_ERR_IO, "MPI", "check that every rank runs the same build and recipe",
                 "rank %d: %s failed in collective #%lld (%s): %s", c->rank, call, (long long)c->seq, c->what, s);
}

// ---- the watchdog --------------------------------------------------------------------------------------------

// Answers peers' probes while this rank waits in a collective: the reply says which collective it waits in.
static void serve_probes(df_comm *c) {
  mpi_impl *m = c->impl;
  while (m->probe_rx != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&m->probe_rx, &flag, &st) != MPI_SUCCESS || !flag) return;
    int src = st.MPI_SOURCE, tag = (int)m->probe_in[1];
    if (src >= 0 && src < c->size) {
      int done = 1;
      if (m->reply_tx[src] != MPI_REQUEST_NULL) MPI_Test(&m->reply_tx[src], &done, MPI_STATUS_IGNORE);
      if (done) { // else the previous reply is still in flight; that peer will time out on us
        int64_t *r = m->reply_buf + 3 * src;
        r[0] = c->seq, r[1] = 0, r[2] = c->rank;
        MPI_Isend(r, 3, MPI_INT64_T, src, tag, m->ctl, &m->reply_tx[src]);
      }
    }
    if (MPI_Irecv(m->probe_in, 3, MPI_INT64_T, MPI_ANY_SOURCE, TAG_PROBE, m->ctl, &m->probe_rx) != MPI_SUCCESS)
      m->probe_rx = MPI_REQUEST_NULL;
  }
}

static void append_rank(char *buf, size_t n, int r) {
  size_t len = strlen(buf);
  snprintf(buf + len, n - len, "%s%d", len ? ", " : "", r);
}

typedef struct {
  char silent[160], same[160], other[200];
  int first_silent, n_silent;
} probe_report;

static void report_probes(const df_comm *c, const bool *got, const int64_t *ans, probe_report *p) {
  memset(p, 0, sizeof *p);
  p->first_silent = -1;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank) continue;
    if (!got[r]) {
      append_rank(p->silent, sizeof p->silent, r);
      if (p->first_silent < 0) p->first_silent = r;
      p->n_silent++;
    } else if (ans[3 * r] == c->seq) {
      append_rank(p->same, sizeof p->same, r);
    } else {
      size_t len = strlen(p->other);
      snprintf(p->other + len, sizeof p->other - len, "%srank %d is in collective #%lld", len ? ", " : "", r,
               (long long)ans[3 * r]);
    }
  }
}

static df_status diagnose_message(df_comm *c, int mpi_rc, const probe_report *p, df_error *err) {
  char cause[MPI_MAX_ERROR_STRING + 32] = "";
  if (mpi_rc != MPI_SUCCESS) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(mpi_rc, s, &len);
    snprintf(cause, sizeof cause, " (MPI: %s)", s);
  }
  char where[32] = "";
  if (p->first_silent >= 0) snprintf(where, sizeof where, "rank %d", p->first_silent);
  char tail[400] = "";
  if (p->same[0]) snprintf(tail, sizeof tail, "; waiting in it too: rank %s", p->same);
  if (p->other[0]) {
    size_t len = strlen(tail);
    snprintf(tail + len, sizeof tail - len, "; %s (the ranks issued different collectives: a bug)", p->other);
  }
  const char *hint = "look at that rank's own output; if it was busy on purpose (a long checkpoint or eval), raise "
                     "training.dist_timeout (minutes)";
  if (p->n_silent)
    return DF_FAIL(err, DF_ERR_IO, where, hint,
                   "rank %d: collective #%lld (%s) did not finish within %.0f s%s: rank%s %s did not answer (dead, "
                   "or hung outside any collective)%s",
                   c->rank, (long long)c->seq, c->what, c->timeout_s, cause, p->n_silent > 1 ? "s" : "", p->silent,
                   tail);
  return DF_FAIL(err, DF_ERR_IO, "MPI", "check that every rank runs the same build and recipe",
                 "rank %d: collective #%lld (%s) did not finish within %.0f s%s; every rank answered%s", c->rank,
                 (long long)c->seq, c->what, c->timeout_s, cause, tail);
}

// Past the timeout (or after an MPI error): probe every peer for a grace period, then name the silent ones.
// Returns DF_OK only when the collective completed during the grace period after all.
static df_status diagnose(df_comm *c, MPI_Request *req, int mpi_rc, df_error *err) {
  mpi_impl *m = c->impl;
  int W = c->size;
  int64_t *ans = calloc((size_t)W * 3, sizeof *ans);
  MPI_Request *rx = malloc((size_t)W * sizeof *rx), *tx = malloc((size_t)W * sizeof *tx);
  bool *got = calloc((size_t)W, sizeof *got);
  if (!ans || !rx || !tx || !got) {
    free(ans), free(rx), free(tx), free(got);
    return DF_FAIL(err, DF_ERR_NOMEM, "MPI", NULL, "rank %d: collective #%lld timed out (and no memory to probe)",
                   c->rank, (long long)c->seq);
  }
  int tag = TAG_REPLY_BASE + (int)(c->seq % TAG_REPLY_SPAN);
  m->probe_out[0] = c->seq, m->probe_out[1] = tag, m->probe_out[2] = c->rank;
  for (int p = 0; p < W; p++) {
    rx[p] = tx[p] = MPI_REQUEST_NULL;
    if (p == c->rank) continue;
    MPI_Irecv(ans + 3 * p, 3, MPI_INT64_T, p, tag, m->ctl, &rx[p]);
    MPI_Isend(m->probe_out, 3, MPI_INT64_T, p, TAG_PROBE, m->ctl, &tx[p]);
  }
  double grace = c->timeout_s * 0.25;
  grace = grace < 1.0 ? 1.0 : grace > 30.0 ? 30.0 : grace;
  double t0 = df_comm_now_s();
  bool finished = false;
  while (df_comm_now_s() - t0 < grace) {
    int done = 0;
    if (mpi_rc == MPI_SUCCESS && *req != MPI_REQUEST_NULL && MPI_Test(req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
        done) {
      finished = true;
      break;
    }
    serve_probes(c);
    int answered = 1;
    for (int p = 0; p < W; p++) {
      int f = 0;
      if (p != c->rank && !got[p] && rx[p] != MPI_REQUEST_NULL &&
          MPI_Test(&rx[p], &f, MPI_STATUS_IGNORE) == MPI_SUCCESS)
        got[p] = f;
      answered += got[p];
    }
    if (answered == W && mpi_rc != MPI_SUCCESS) break;
    df_comm_poll_pause(1.0, 0.0, 1e-3);
  }
  for (int p = 0; p < W; p++) { // ans is freed below: no receive may stay posted into it
    if (rx[p] != MPI_REQUEST_NULL) MPI_Cancel(&rx[p]), MPI_Wait(&rx[p], MPI_STATUS_IGNORE);
    if (tx[p] != MPI_REQUEST_NULL) MPI_Request_free(&tx[p]);
  }
  df_status st = DF_OK;
  if (!finished) {
    probe_report pr;
    report_probes(c, got, ans, &pr);
    st = diagnose_message(c, mpi_rc, &pr, err);
  }
  free(ans), free(rx), free(tx), free(got);
  return st;
}

// The timed wait around one non-blocking collective.
static df_status wait_req(df_comm *c, MPI_Request *req, df_error *err) {
  double t0 = df_comm_now_s(), deadline = t0 + c->timeout_s;
  for (;;) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return diagnose(c, req, rc, err);
    if (done) return DF_OK;
    serve_probes(c);
    double now = df_comm_now_s();
    if (now >= deadline) return diagnose(c, req, MPI_SUCCESS, err);
    df_comm_poll_pause(now - t0, SPIN_S, SLEEP_S);
  }
}

// ---- collectives ---------------------------------------------------------------------------------------------

static void divide_by_world(void *buf, size_t count, df_comm_dtype dt, int world) {
  if (dt == DF_COMM_F32)
    for (size_t i = 0; i < count; i++) ((float *)buf)[i] /= (float)world;
  else
    for (size_t i = 0; i < count; i++) ((double *)buf)[i] /= (double)world;
}

static df_status mpi_all_reduce(df_comm *c, const void *send, void *recv, size_t count, df_comm_dtype dt, df_comm_op op,
                                df_error *err) {
  mpi_impl *m = c->impl;
  size_t sz = df_comm_dtype_size(dt);
  for (size_t off = 0; off < count; off += CHUNK) {
    int n = (int)(count - off < CHUNK ? count - off : CHUNK);
    const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * sz;
    MPI_Request req;
    int rc = MPI_Iallreduce(s, (char *)recv + off * sz, n, mpi_type(dt), mpi_op(op), m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Iallreduce", err);
    DF_TRY(wait_req(c, &req, err));
  }
  if (op == DF_COMM_AVG) divide_by_world(recv, count, dt, c->size);
  return DF_OK;
}

static df_status count_fits(df_comm *c, size_t count, df_error *err) {
  if (count <= INT_MAX) return DF_OK;
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "count", "use more ranks or split the buffer",
                 "%s: %zu elements per rank is more than one MPI call takes (%d)", c->what, count, INT_MAX);
}

static df_status mpi_reduce_scatter(df_comm *c, const void *send, void *recv, size_t recv_count, df_comm_dtype dt,
                                    df_comm_op op, df_error *err) {
  mpi_impl *m = c->impl;
  DF_TRY(count_fits(c, recv_count, err));
  size_t bytes = recv_count * df_comm_dtype_size(dt);
  bool in_place = (const char *)send + (size_t)c->rank * bytes == (const char *)recv;
  MPI_Request req;
  // MPI's in-place form reads the whole input from the receive buffer and leaves the result at its start.
  int rc = in_place ? MPI_Ireduce_scatter_block(MPI_IN_PLACE, (void *)send, (int)recv_count, mpi_type(dt), mpi_op(op),
                                                m->data, &req)
                    : MPI_Ireduce_scatter_block(send, recv, (int)recv_count, mpi_type(dt), mpi_op(op), m->data, &req);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Ireduce_scatter_block", err);
  DF_TRY(wait_req(c, &req, err));
  if (in_place && c->rank != 0) memmove(recv, send, bytes);
  if (op == DF_COMM_AVG) divide_by_world(recv, recv_count, dt, c->size);
  return DF_OK;
}

static df_status mpi_all_gather(df_comm *c, const void *send, void *recv, size_t send_count, df_comm_dtype dt,
                                df_error *err) {
  mpi_impl *m = c->impl;
  DF_TRY(count_fits(c, send_count, err));
  size_t bytes = send_count * df_comm_dtype_size(dt);
  bool in_place = (const char *)recv + (size_t)c->rank * bytes == (const char *)send;
  MPI_Request req;
  int n = (int)send_count;
  int rc = in_place ? MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, n, mpi_type(dt), m->data, &req)
                    : MPI_Iallgather(send, n, mpi_type(dt), recv, n, mpi_type(dt), m->data, &req);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Iallgather", err);
  return wait_req(c, &req, err);
}

static df_status mpi_broadcast(df_comm *c, void *buf, size_t count, df_comm_dtype dt, int root, df_error *err) {
  mpi_impl *m = c->impl;
  size_t sz = df_comm_dtype_size(dt);
  for (size_t off = 0; off < count; off += CHUNK) {
    int n = (int)(count - off < CHUNK ? count - off : CHUNK);
    MPI_Request req;
    int rc = MPI_Ibcast((char *)buf + off * sz, n, mpi_type(dt), root, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Ibcast", err);
    DF_TRY(wait_req(c, &req, err));
  }
  return DF_OK;
}

static df_status mpi_reduce(df_comm *c, void *buf, size_t count, df_comm_dtype dt, df_comm_op op, int root,
                            df_error *err) {
  mpi_impl *m = c->impl;
  size_t sz = df_comm_dtype_size(dt);
  const bool at_root = c->rank == root;
  for (size_t off = 0; off < count; off += CHUNK) {
    int n = (int)(count - off < CHUNK ? count - off : CHUNK);
    char *p = (char *)buf + off * sz;
    MPI_Request req;
    int rc =
        MPI_Ireduce(at_root ? MPI_IN_PLACE : p, at_root ? p : NULL, n, mpi_type(dt), mpi_op(op), root, m->data, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Ireduce", err);
    DF_TRY(wait_req(c, &req, err));
  }
  if (at_root && op == DF_COMM_AVG) divide_by_world(buf, count, dt, c->size);
  return DF_OK;
}

static df_status mpi_barrier(df_comm *c, df_error *err) {
  mpi_impl *m = c->impl;
  MPI_Request req;
  int rc = MPI_Ibarrier(m->data, &req);
  if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Ibarrier", err);
  return wait_req(c, &req, err);
}

static df_status mpi_wait(df_comm *c, df_error *err) { return DF_OK; } // every call above completed

// ---- life cycle ----------------------------------------------------------------------------------------------

static void mpi_release(df_comm *c) {
  mpi_impl *m = c->impl;
  if (!m) return;
  free(m->reply_tx), free(m->reply_buf);
  free(m);
  c->impl = NULL;
}

static df_status mpi_finish(df_comm *c, df_error *err) {
  mpi_impl *m = c->impl;
  DF_TRY(mpi_barrier(c, err)); // nobody finalises while a peer may still be inside a collective
  if (m->probe_rx != MPI_REQUEST_NULL) MPI_Cancel(&m->probe_rx), MPI_Wait(&m->probe_rx, MPI_STATUS_IGNORE);
  for (int p = 0; p < c->size; p++)
    if (m->reply_tx[p] != MPI_REQUEST_NULL) MPI_Request_free(&m->reply_tx[p]);
  MPI_Comm_free(&m->ctl);
  MPI_Comm_free(&m->data);
  if (m->owns_mpi) MPI_Finalize();
  return DF_OK;
}

static void mpi_abort(df_comm *c, int exit_code) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

static const df_comm_vtable MPI_TABLE = {.all_reduce = mpi_all_reduce,
                                         .reduce_scatter = mpi_reduce_scatter,
                                         .all_gather = mpi_all_gather,
                                         .broadcast = mpi_broadcast,
                                         .reduce = mpi_reduce,
                                         .barrier = mpi_barrier,
                                         .wait = mpi_wait,
                                         .finish = mpi_finish,
                                         .abort = mpi_abort,
                                         .release = mpi_release};

static df_status mpi_start(bool *owns, df_error *err) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (fin)
    return DF_FAIL(err, DF_ERR_INVALID, "MPI", "create one MPI communicator per process",
                   "MPI was already finalised in this process");
  *owns = !inited;
  if (inited) return DF_OK;
  int provided = 0; // the data feed's reader thread never calls MPI; OpenMP threads neither
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS)
    return DF_FAIL(err, DF_ERR_IO, "MPI", "launch with mpirun (or srun --mpi=pmix) and check the MPI installation",
                   "MPI_Init_thread failed (code %d)", rc);
  return DF_OK;
}

static df_status check_expected(const df_comm_mpi_options *o, int rank, int size, df_error *err) {
  if ((o->expect_world < 0 || o->expect_world == size) && (o->expect_rank < 0 || o->expect_rank == rank)) return DF_OK;
  return DF_FAIL(err, DF_ERR_INVALID, o->vars ? o->vars : "MPI",
                 "start every rank with the same launcher: mpirun -np N, or srun --mpi=pmix (a process MPI cannot see "
                 "as part of the job runs as a world of its own)",
                 "MPI says rank %d of %d, but the launcher's variables (%s) say rank %d of %d", rank, size,
                 o->vars ? o->vars : "environment", o->expect_rank, o->expect_world);
}

df_status df_comm_create_mpi(const df_comm_mpi_options *opt, df_comm **out, df_error *err) {
  *out = NULL;
  df_comm_mpi_options o = opt ? *opt : (df_comm_mpi_options){.expect_rank = -1, .expect_world = -1};
  bool owns = false;
  DF_TRY(mpi_start(&owns, err));
  mpi_impl *m = calloc(1, sizeof *m);
  df_comm *c = calloc(1, sizeof *c);
  if (!m || !c) {
    free(m), free(c);
    return DF_FAIL(err, DF_ERR_NOMEM, "MPI", NULL, "out of memory");
  }
  m->owns_mpi = owns;
  MPI_Comm_dup(MPI_COMM_WORLD, &m->data);
  MPI_Comm_dup(MPI_COMM_WORLD, &m->ctl);
  MPI_Comm_set_errhandler(m->data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(m->ctl, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(m->data, &rank);
  MPI_Comm_size(m->data, &size);
  df_comm_init_common(c, &MPI_TABLE, DF_COMM_MPI, rank, size, false, o.timeout_s, m);
  df_status st = check_expected(&o, rank, size, err);
  m->reply_tx = malloc((size_t)size * sizeof *m->reply_tx);
  m->reply_buf = calloc((size_t)size * 3, sizeof *m->reply_buf);
  if (st == DF_OK && (!m->reply_tx || !m->reply_buf)) st = DF_FAIL(err, DF_ERR_NOMEM, "MPI", NULL, "out of memory");
  if (st != DF_OK) {
    MPI_Comm_free(&m->ctl);
    MPI_Comm_free(&m->data);
    if (owns) MPI_Finalize();
    mpi_release(c);
    free(c);
    return st;
  }
  for (int p = 0; p < size; p++) m->reply_tx[p] = MPI_REQUEST_NULL;
  if (MPI_Irecv(m->probe_in, 3, MPI_INT64_T, MPI_ANY_SOURCE, TAG_PROBE, m->ctl, &m->probe_rx) != MPI_SUCCESS)
    m->probe_rx = MPI_REQUEST_NULL;
  *out = c;
  return DF_OK;
}
