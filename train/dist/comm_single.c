// The single-process communicator: world size 1, so every collective is the identity. Out-of-place calls on
// host buffers copy send to recv; on device buffers only the in-place form is accepted (comm.c checks it).
#include <stdlib.h>
#include <string.h>

#include "train/dist/comm_impl.h"

static void copy(const void *send, void *recv, size_t bytes) {
  if (bytes && send != recv) memmove(recv, send, bytes);
}

static df_status single_all_reduce(df_comm *c, const void *send, void *recv, size_t count, df_comm_dtype dt,
                                   df_comm_op op, df_error *err) {
  copy(send, recv, count * df_comm_dtype_size(dt)); // sum, avg, max and min of one value are the value
  return DF_OK;
}

static df_status single_reduce_scatter(df_comm *c, const void *send, void *recv, size_t recv_count, df_comm_dtype dt,
                                       df_comm_op op, df_error *err) {
  copy(send, recv, recv_count * df_comm_dtype_size(dt));
  return DF_OK;
}

static df_status single_all_gather(df_comm *c, const void *send, void *recv, size_t send_count, df_comm_dtype dt,
                                   df_error *err) {
  copy(send, recv, send_count * df_comm_dtype_size(dt));
  return DF_OK;
}

static df_status single_broadcast(df_comm *c, void *buf, size_t count, df_comm_dtype dt, int root, df_error *err) {
  return DF_OK;
}

static df_status single_reduce(df_comm *c, void *buf, size_t count, df_comm_dtype dt, df_comm_op op, int root,
                               df_error *err) {
  return DF_OK; // the op over one rank is its own value
}

static df_status single_nothing(df_comm *c, df_error *err) { return DF_OK; }
static void single_abort(df_comm *c, int exit_code) {}
static void single_release(df_comm *c) {}

static const df_comm_vtable SINGLE = {.all_reduce = single_all_reduce,
                                      .reduce_scatter = single_reduce_scatter,
                                      .all_gather = single_all_gather,
                                      .broadcast = single_broadcast,
                                      .reduce = single_reduce,
                                      .barrier = single_nothing,
                                      .wait = single_nothing,
                                      .finish = single_nothing,
                                      .abort = single_abort,
                                      .release = single_release};

df_status df_comm_create_single(bool device_buffers, df_comm **out, df_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out) return DF_FAIL(err, DF_ERR_NOMEM, "comm", NULL, "out of memory");
  df_comm_init_common(*out, &SINGLE, DF_COMM_SINGLE, 0, 1, device_buffers, 0, NULL);
  return DF_OK;
}
