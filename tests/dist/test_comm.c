// The communicator dispatcher and the single-process backend: identity results (every reduction of one rank is
// its value), in-place forms, the argument checks that name the argument, numbering and payload accounting.
#include <criterion/criterion.h>
#include <string.h>

#include "tests/common/fixture.h"
#include "train/dist/comm.h"

static df_comm *single(bool device) {
  df_comm *c = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_comm_create_single(device, &c, &err), &err);
  return c;
}

static void finish(df_comm *c) {
  df_error err = {0};
  DF_ASSERT_OK(df_comm_finish(c, &err), &err);
}

Test(comm, names_and_sizes) {
  cr_expect_eq(df_comm_dtype_size(DF_COMM_F32), 4);
  cr_expect_eq(df_comm_dtype_size(DF_COMM_F64), 8);
  cr_expect_eq(df_comm_dtype_size(DF_COMM_I32), 4);
  cr_expect_eq(df_comm_dtype_size(DF_COMM_I64), 8);
  cr_expect_eq(df_comm_dtype_size(DF_COMM_U8), 1);
  cr_expect_str_eq(df_comm_op_name(DF_COMM_AVG), "avg");
  cr_expect_str_eq(df_comm_backend_name(DF_COMM_NCCL), "nccl");
  cr_expect(df_comm_backend_available(DF_COMM_SINGLE));
}

Test(comm, single_is_identity_for_every_collective) {
  df_comm *c = single(false);
  cr_expect(df_comm_rank(c) == 0 && df_comm_size(c) == 1 && df_comm_backend_of(c) == DF_COMM_SINGLE);
  cr_expect_eq(df_comm_timeout(c), DF_COMM_DEFAULT_TIMEOUT_S);
  df_error err = {0};
  float x[5] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f}, y[5] = {0};
  for (int op = DF_COMM_SUM; op <= DF_COMM_MIN; op++) {
    memset(y, 0, sizeof y);
    DF_ASSERT_OK(df_comm_all_reduce(c, x, y, 5, DF_COMM_F32, (df_comm_op)op, &err), &err);
    cr_expect_arr_eq(x, y, sizeof x, "op %s", df_comm_op_name((df_comm_op)op));
  }
  int64_t k[3] = {1, 1ll << 40, -3}, k2[3] = {1, 1ll << 40, -3};
  DF_ASSERT_OK(df_comm_all_reduce(c, k, k, 3, DF_COMM_I64, DF_COMM_SUM, &err), &err); // in place
  cr_expect_arr_eq(k, k2, sizeof k);
  double d[4] = {1, 2, 3, 4}, e[4] = {0};
  DF_ASSERT_OK(df_comm_reduce_scatter(c, d, e, 4, DF_COMM_F64, DF_COMM_AVG, &err), &err);
  cr_expect_arr_eq(d, e, sizeof d);
  memset(e, 0, sizeof e);
  DF_ASSERT_OK(df_comm_all_gather(c, d, e, 4, DF_COMM_F64, &err), &err);
  cr_expect_arr_eq(d, e, sizeof d);
  DF_ASSERT_OK(df_comm_broadcast(c, d, 4, DF_COMM_F64, 0, &err), &err);
  cr_expect(d[0] == 1 && d[3] == 4);
  DF_ASSERT_OK(df_comm_reduce(c, d, 4, DF_COMM_F64, DF_COMM_SUM, 0, &err), &err);
  cr_expect(d[0] == 1 && d[1] == 2 && d[2] == 3 && d[3] == 4, "a reduce over one rank is its own buffer");
  DF_ASSERT_OK(df_comm_barrier(c, &err), &err);
  DF_ASSERT_OK(df_comm_wait(c, &err), &err);
  // 4 all-reduces + the in-place one, reduce-scatter, all-gather, broadcast, reduce, barrier
  cr_expect_eq(df_comm_num_collectives(c), 10);
  cr_expect_eq(df_comm_payload_bytes(c), 4 * 20 + 24 + 32 + 32 + 32 + 32);
  finish(c);
}

Test(comm, arguments_are_checked_and_named) {
  df_comm *c = single(false);
  df_error err = {0};
  int32_t a[4] = {1, 2, 3, 4}, b[4];
  cr_expect_eq(df_comm_all_reduce(c, a, b, 4, DF_COMM_I32, DF_COMM_AVG, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "op");
  cr_expect(strstr(err.msg, "avg of i32") != NULL, "%s", err.msg);
  cr_expect_eq(df_comm_all_reduce(c, a, b, -1, DF_COMM_I32, DF_COMM_SUM, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "count");
  cr_expect_eq(df_comm_all_reduce(c, a, b, 4, (df_comm_dtype)42, DF_COMM_SUM, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dtype");
  cr_expect_eq(df_comm_all_reduce(c, a, NULL, 4, DF_COMM_I32, DF_COMM_SUM, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "recv");
  cr_expect_eq(df_comm_all_reduce(c, a, a + 1, 3, DF_COMM_I32, DF_COMM_SUM, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "overlap but are not the in-place form") != NULL, "%s", err.msg);
  cr_expect_eq(df_comm_broadcast(c, a, 4, DF_COMM_I32, 1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "root");
  cr_expect_eq(df_comm_reduce(c, a, 4, DF_COMM_I32, DF_COMM_SUM, -1, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "root");
  cr_expect_eq(df_comm_reduce(c, a, 4, DF_COMM_I32, DF_COMM_AVG, 0, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "op");
  // Nothing moved: zero counts with NULL buffers are fine.
  DF_ASSERT_OK(df_comm_all_reduce(c, NULL, NULL, 0, DF_COMM_F32, DF_COMM_SUM, &err), &err);
  // A refused call is not a collective: only the zero-count one was issued, and the communicator is healthy.
  cr_expect_eq(df_comm_num_collectives(c), 1);
  DF_ASSERT_OK(df_comm_barrier(c, &err), &err);
  finish(c);
}

Test(comm, single_on_device_buffers_only_in_place) {
  df_comm *c = single(true);
  df_error err = {0};
  float g[8] = {0}, h[8];
  DF_ASSERT_OK(df_comm_all_reduce(c, g, g, 8, DF_COMM_F32, DF_COMM_AVG, &err), &err);
  DF_ASSERT_OK(df_comm_reduce_scatter(c, g, g, 8, DF_COMM_F32, DF_COMM_SUM, &err), &err);
  DF_ASSERT_OK(df_comm_all_gather(c, g, g, 8, DF_COMM_F32, &err), &err);
  cr_expect_eq(df_comm_all_reduce(c, g, h, 8, DF_COMM_F32, DF_COMM_SUM, &err), DF_ERR_UNSUPPORTED);
  cr_expect(strstr(err.msg, "makes no device copies") != NULL, "%s", err.msg);
  finish(c);
}

Test(comm, nccl_needs_a_valid_request) {
  df_comm *c = (df_comm *)1;
  df_error err = {0};
  df_comm_nccl_options o = {.rank = 1, .world_size = 1, .device = 0};
  df_status st = df_comm_create_nccl(&o, &c, &err);
  cr_expect_null(c);
  if (df_comm_backend_available(DF_COMM_NCCL)) {
    cr_expect_eq(st, DF_ERR_INVALID);
    cr_expect(strstr(err.msg, "rank 1 of 1") != NULL, "%s", err.msg);
  } else {
    cr_expect_eq(st, DF_ERR_UNSUPPORTED);
    cr_expect(strstr(err.msg, "built without NCCL") != NULL, "%s", err.msg);
  }
}
