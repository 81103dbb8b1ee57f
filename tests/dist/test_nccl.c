// The NCCL communicator at world size 1 on one GPU: every collective on device buffers must give what the
// single-process communicator gives on the same host data (the identity), out of place and in place. Skipped
// with the reason in a build without NCCL or on a machine without a CUDA device. Multi-GPU NCCL is not run here.
#include <criterion/criterion.h>
#include <string.h>

#include "tests/common/fixture.h"
#include "train/dist/comm.h"

#ifdef DF_HAVE_NCCL
#include <cuda_runtime_api.h>

static void need_device(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) cr_skip_test("no CUDA device: the NCCL communicator is not run");
}

static df_comm *nccl_world1(void) {
  df_nccl_id id;
  df_error err = {0};
  DF_ASSERT_OK(df_comm_nccl_new_id(&id, &err), &err);
  df_comm_nccl_options o = {.rank = 0, .world_size = 1, .device = 0, .id = &id, .timeout_s = 60};
  df_comm *c = NULL;
  DF_ASSERT_OK(df_comm_create_nccl(&o, &c, &err), &err);
  cr_assert(df_comm_device_buffers(c) && df_comm_size(c) == 1 && df_comm_backend_of(c) == DF_COMM_NCCL);
  return c;
}

enum { N = 4099 };

static void host_data(float *x) {
  for (int i = 0; i < N; i++) x[i] = (float)((i * 7919) % 1000) * 0.001f - 0.5f;
}

Test(nccl, world_one_equals_the_single_communicator) {
  need_device();
  df_comm *c = nccl_world1(), *s = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_comm_create_single(false, &s, &err), &err);
  static float x[N], want[N], got[N];
  host_data(x);
  float *dx, *dy;
  cr_assert_eq(cudaMalloc((void **)&dx, N * sizeof(float)), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dy, N * sizeof(float)), cudaSuccess);
  for (int op = DF_COMM_SUM; op <= DF_COMM_MIN; op++) {
    DF_ASSERT_OK(df_comm_all_reduce(s, x, want, N, DF_COMM_F32, (df_comm_op)op, &err), &err);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    DF_ASSERT_OK(df_comm_all_reduce(c, dx, dy, N, DF_COMM_F32, (df_comm_op)op, &err), &err);
    DF_ASSERT_OK(df_comm_all_reduce(c, dx, dx, N, DF_COMM_F32, (df_comm_op)op, &err), &err); // in place
    DF_ASSERT_OK(df_comm_wait(c, &err), &err);
    cudaMemcpy(got, dy, sizeof got, cudaMemcpyDeviceToHost);
    cr_expect_arr_eq(got, want, sizeof got, "all-reduce %s", df_comm_op_name((df_comm_op)op));
    cudaMemcpy(got, dx, sizeof got, cudaMemcpyDeviceToHost);
    cr_expect_arr_eq(got, want, sizeof got, "in-place all-reduce %s", df_comm_op_name((df_comm_op)op));
  }
  cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
  DF_ASSERT_OK(df_comm_reduce_scatter(c, dx, dy, N, DF_COMM_F32, DF_COMM_AVG, &err), &err);
  DF_ASSERT_OK(df_comm_all_gather(c, dy, dx, N, DF_COMM_F32, &err), &err);
  DF_ASSERT_OK(df_comm_broadcast(c, dx, N, DF_COMM_F32, 0, &err), &err);
  DF_ASSERT_OK(df_comm_barrier(c, &err), &err);
  cudaMemcpy(got, dx, sizeof got, cudaMemcpyDeviceToHost);
  DF_ASSERT_OK(df_comm_reduce_scatter(s, x, want, N, DF_COMM_F32, DF_COMM_AVG, &err), &err);
  cr_expect_arr_eq(got, want, sizeof got, "reduce-scatter, all-gather, broadcast");
  int64_t k[3] = {5, -7, 1ll << 40}, kg[3];
  int64_t *dk;
  cr_assert_eq(cudaMalloc((void **)&dk, sizeof k), cudaSuccess);
  cudaMemcpy(dk, k, sizeof k, cudaMemcpyHostToDevice);
  DF_ASSERT_OK(df_comm_all_reduce(c, dk, dk, 3, DF_COMM_I64, DF_COMM_SUM, &err), &err);
  DF_ASSERT_OK(df_comm_wait(c, &err), &err);
  cudaMemcpy(kg, dk, sizeof kg, cudaMemcpyDeviceToHost);
  cr_expect_arr_eq(kg, k, sizeof k, "i64 sum");
  cudaFree(dx), cudaFree(dy), cudaFree(dk);
  DF_ASSERT_OK(df_comm_finish(c, &err), &err);
  DF_ASSERT_OK(df_comm_finish(s, &err), &err);
}

#else

Test(nccl, world_one_equals_the_single_communicator) {
  cr_skip_test("this build has no NCCL (CUDA toolkit with nccl.h and libnccl): nothing to run");
}

#endif
