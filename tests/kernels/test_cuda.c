// CUDA backend vs the CPU oracle. Every test skips cleanly where no CUDA device is visible (or the build
// has no CUDA backend); on a GPU machine each op with a CUDA twin is compared with its CPU result.
#include <criterion/criterion.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"

typedef struct {
  df_ctx *cpu, *gpu;
} ctx_pair;

static ctx_pair open_pair(void) {
  if (!df_cuda_available()) cr_skip_test("no CUDA device visible (or CUDA backend not built): GPU test skipped");
  ctx_pair p = {df_test_cpu_ctx(1), NULL};
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_CUDA, .cuda_device = 0};
  DF_ASSERT_OK(df_ctx_create(&o, &p.gpu, &err), &err);
  return p;
}

static void close_pair(ctx_pair p) {
  df_ctx_destroy(p.gpu);
  df_ctx_destroy(p.cpu);
}

// A device copy of host data as a df_tensor view with the given shape.
static df_tensor to_device(ctx_pair p, const float *host, int ndim, const int64_t *shape) {
  df_error err = {0};
  df_tensor h = df_view((void *)host, DF_F32, DF_DEV_CPU, ndim, shape);
  size_t bytes = (size_t)df_numel(&h) * sizeof(float);
  void *d = NULL;
  DF_ASSERT_OK(df_buffer_alloc(p.gpu, bytes, &d, &err), &err);
  DF_ASSERT_OK(df_copy(p.gpu, d, DF_DEV_CUDA, host, DF_DEV_CPU, bytes, &err), &err);
  return df_view(d, DF_F32, DF_DEV_CUDA, ndim, shape);
}

static float *to_host(ctx_pair p, const df_tensor *t) {
  df_error err = {0};
  size_t bytes = (size_t)df_numel(t) * sizeof(float);
  float *h = malloc(bytes);
  DF_ASSERT_OK(df_copy(p.gpu, h, DF_DEV_CPU, t->data, DF_DEV_CUDA, bytes, &err), &err);
  return h;
}

Test(cuda, context_without_device_is_an_error) {
  if (df_cuda_available()) cr_skip_test("a CUDA device is visible: the no-device path cannot be exercised");
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_CUDA};
  cr_expect_eq(df_ctx_create(&o, &ctx, &err), DF_ERR_UNSUPPORTED);
  cr_expect_null(ctx);
  cr_expect_str_eq(err.where, "device");
}

Test(cuda, linear_matches_cpu) {
  ctx_pair p = open_pair();
  enum { M = 67, K = 96, N = 45 };
  static float x[M * K], w[N * K], b[N], dy[M * N];
  static float y[M * N], dx[M * K], dw[N * K], db[N];
  df_test_fill_uniform(x, M * K, 11, -1, 1);
  df_test_fill_uniform(w, N * K, 12, -1, 1);
  df_test_fill_uniform(b, N, 13, -1, 1);
  df_test_fill_uniform(dy, M * N, 14, -1, 1);
  df_error err = {0};
  df_tensor tx = df_f32(x, M, K), tw = df_f32(w, N, K), tb = df_f32(b, N), tdy = df_f32(dy, M, N);
  df_tensor ty = df_f32(y, M, N), tdx = df_f32(dx, M, K), tdw = df_f32(dw, N, K), tdb = df_f32(db, N);
  DF_ASSERT_OK(df_linear_forward(p.cpu, &tx, &tw, &tb, &ty, &err), &err);
  DF_ASSERT_OK(df_linear_backward(p.cpu, &tdy, &tx, &tw, &tdx, false, &tdw, &tdb, &err), &err);

  df_tensor gx = to_device(p, x, 2, tx.shape), gw = to_device(p, w, 2, tw.shape), gb = to_device(p, b, 1, tb.shape);
  df_tensor gdy = to_device(p, dy, 2, tdy.shape), gy = to_device(p, y, 2, ty.shape);
  float zeros_k[M * K] = {0}, zeros_w[N * K] = {0}, zeros_b[N] = {0};
  df_tensor gdx = to_device(p, zeros_k, 2, tdx.shape), gdw = to_device(p, zeros_w, 2, tdw.shape),
            gdb = to_device(p, zeros_b, 1, tdb.shape);
  DF_ASSERT_OK(df_linear_forward(p.gpu, &gx, &gw, &gb, &gy, &err), &err);
  DF_ASSERT_OK(df_linear_backward(p.gpu, &gdy, &gx, &gw, &gdx, false, &gdw, &gdb, &err), &err);
  DF_ASSERT_OK(df_sync(p.gpu, &err), &err);
  // fp32 on both sides; only the summation order differs (TF32 is not enabled).
  float *hy = to_host(p, &gy), *hdx = to_host(p, &gdx), *hdw = to_host(p, &gdw), *hdb = to_host(p, &gdb);
  df_expect_close("y", hy, y, M * N, 1e-5, 1e-6);
  df_expect_close("dx", hdx, dx, M * K, 1e-5, 1e-6);
  df_expect_close("dw", hdw, dw, N * K, 1e-5, 1e-6);
  df_expect_close("db", hdb, db, N, 1e-5, 1e-6);
  free(hy), free(hdx), free(hdw), free(hdb);
  df_tensor *dev[] = {&gx, &gw, &gb, &gdy, &gy, &gdx, &gdw, &gdb};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) df_buffer_free(p.gpu, dev[i]->data);
  close_pair(p);
}

// Every op of kernels/backend.h has a CUDA slot, so training.device: auto picks the GPU when one is visible
// (train/recipe/device.c asks df_backend_complete). Runs without a device: the table is built, nothing is launched.
Test(cuda, table_is_complete) {
  const df_backend *be = df_cuda_backend();
  if (!be) cr_skip_test("this build has no CUDA backend");
  const char *missing = NULL;
  cr_expect(df_backend_complete(be, &missing), "the cuda backend lacks %s", missing ? missing : "?");
}
