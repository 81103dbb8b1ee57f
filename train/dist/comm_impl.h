// Internal to train/dist/comm*.c: the communicator object and the table of functions a backend fills. The
// dispatcher (comm.c) validates every call, numbers it and keeps the failure state; backends see valid calls.
#ifndef DF_TRAIN_DIST_COMM_IMPL_H
#define DF_TRAIN_DIST_COMM_IMPL_H

#include "train/dist/comm.h"

typedef struct {
  df_status (*all_reduce)(df_comm *c, const void *send, void *recv, size_t count, df_comm_dtype dt, df_comm_op op,
                          df_error *err);
  df_status (*reduce_scatter)(df_comm *c, const void *send, void *recv, size_t recv_count, df_comm_dtype dt,
                              df_comm_op op, df_error *err);
  df_status (*all_gather)(df_comm *c, const void *send, void *recv, size_t send_count, df_comm_dtype dt, df_error *err);
  df_status (*broadcast)(df_comm *c, void *buf, size_t count, df_comm_dtype dt, int root, df_error *err);
  df_status (*reduce)(df_comm *c, void *buf, size_t count, df_comm_dtype dt, df_comm_op op, int root, df_error *err);
  df_status (*barrier)(df_comm *c, df_error *err);
  df_status (*wait)(df_comm *c, df_error *err);
  df_status (*finish)(df_comm *c, df_error *err); // orderly close of the backend state (not freed on failure)
  void (*abort)(df_comm *c, int exit_code);       // may not return
  void (*release)(df_comm *c);                    // frees the backend state
  // Device backends only (NULL elsewhere). stage: a device buffer of at least `bytes` owned by the backend;
  // stage_in / stage_out: host → stage and stage → host in stream order (stage_out returns once the bytes are
  // in host memory, waiting as `wait` does); after / mark: the stream ordering of comm.h.
  df_status (*stage)(df_comm *c, size_t bytes, void **dev, df_error *err);
  df_status (*stage_in)(df_comm *c, void *dev, const void *host, size_t bytes, df_error *err);
  df_status (*stage_out)(df_comm *c, void *host, const void *dev, size_t bytes, df_error *err);
  df_status (*after)(df_comm *c, void *event, df_error *err);
  df_status (*mark)(df_comm *c, void *event, df_error *err);
  int (*device)(const df_comm *c);
} df_comm_vtable;

struct df_comm {
  const df_comm_vtable *vt;
  df_comm_backend backend;
  int rank, size;
  bool device_buffers;
  double timeout_s;
  int64_t seq;    // collectives issued; the current one is #seq
  uint64_t bytes; // payload bytes handed in
  char what[96];  // the current collective, for messages: "all-reduce of 1000 f32"
  bool failed;    // a collective failed; later calls repeat `failure`
  df_error failure;
  void *impl;
};

// Fills c's common fields (rank, size, timeout; seq 0).
void df_comm_init_common(df_comm *c, const df_comm_vtable *vt, df_comm_backend b, int rank, int size,
                         bool device_buffers, double timeout_s, void *impl);
double df_comm_now_s(void);
// One pause of a polling loop that has waited waited_s: a yield while waited_s < spin_s, then a sleep of 5 % of
// the wait, at most max_sleep_s. MPI needs the polling to progress a transfer (no progress thread), so it
// spins long; NCCL progresses on its own, so its polls can sleep early.
void df_comm_poll_pause(double waited_s, double spin_s, double max_sleep_s);

#endif
