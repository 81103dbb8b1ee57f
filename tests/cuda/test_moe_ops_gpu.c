// The MoE grouped expert GEMMs of the backend table (kernels/ops_moe.h) on a CUDA context against the same ops on a
// CPU context: segments of very different sizes (empty ones, one longer than a 64-row tile, one not a multiple of
// it), forward, backward with dx written and added, dw added to, dx aliasing x, and frozen experts (dw NULL).
// fp32 storage (the MoE layer's storage). Tolerance: 2e-5 of max|ref| (fp32 sums of up to 72 products in another
// order than the CPU's BLAS).
#include <stdlib.h>
#include <string.h>

#include "kernels/ops_moe.h"
#include "tests/cuda/cu_test.h"

static df_tensor dev(df_ctx *gpu, const df_tensor *h) {
  df_error err = {0};
  const size_t bytes = (size_t)df_numel(h) * df_dtype_size(h->dtype);
  void *d = NULL;
  DF_ASSERT_OK(df_buffer_alloc(gpu, bytes, &d, &err), &err);
  DF_ASSERT_OK(df_copy(gpu, d, DF_DEV_CUDA, h->data, DF_DEV_CPU, bytes, &err), &err);
  df_tensor t = *h;
  t.data = d, t.device = DF_DEV_CUDA;
  return t;
}

static void expect_same(df_ctx *gpu, const char *what, const df_tensor *g, const df_tensor *c, double rtol) {
  df_error err = {0};
  const int64_t n = df_numel(c);
  float *h = malloc(sizeof(float) * (size_t)n);
  DF_ASSERT_OK(df_copy(gpu, h, DF_DEV_CPU, g->data, DF_DEV_CUDA, sizeof(float) * (size_t)n, &err), &err);
  df_expect_close(what, h, c->data, n, rtol, 1e-6);
  free(h);
}

static float *rnd(int64_t n, uint64_t seed) {
  float *x = malloc(sizeof(float) * (size_t)n);
  df_test_fill_uniform(x, n, seed, -1, 1);
  return x;
}

Test(cuda_moe_ops, grouped_gemms_forward_backward_fp32) {
  CU_REQUIRE_GPU();
  df_error err = {0};
  df_ctx *cpu = df_test_cpu_ctx(1), *gpu = NULL;
  df_ctx_options o = {.device = DF_DEV_CUDA};
  DF_ASSERT_OK(df_ctx_create(&o, &gpu, &err), &err);
  enum { E = 5, IN = 72, OUT = 40 };
  const int32_t sizes[E] = {0, 130, 7, 0, 64};
  int32_t off[E + 1] = {0};
  for (int e = 0; e < E; e++) off[e + 1] = off[e] + sizes[e];
  const int64_t Tk = off[E];
  float *x = rnd(Tk * IN, 1), *w = rnd((int64_t)E * OUT * IN, 2), *dy = rnd(Tk * OUT, 3);
  float *y = calloc((size_t)(Tk * OUT), 4), *dx = rnd(Tk * IN, 4), *dw = rnd((int64_t)E * OUT * IN, 5);
  df_tensor tx = df_f32(x, Tk, IN), tw = df_f32(w, E, OUT, IN), tdy = df_f32(dy, Tk, OUT), ty = df_f32(y, Tk, OUT);
  df_tensor tdx = df_f32(dx, Tk, IN), tdw = df_f32(dw, E, OUT, IN), toff = df_i32(off, E + 1);
  df_tensor gx = dev(gpu, &tx), gw = dev(gpu, &tw), gdy = dev(gpu, &tdy), gy = dev(gpu, &ty), gdx = dev(gpu, &tdx);
  df_tensor gdw = dev(gpu, &tdw), goff = dev(gpu, &toff);
  DF_ASSERT_OK(df_moe_grouped_forward(cpu, &tx, &tw, &toff, &ty, &err), &err);
  DF_ASSERT_OK(df_moe_grouped_forward(gpu, &gx, &gw, &goff, &gy, &err), &err);
  expect_same(gpu, "y", &gy, &ty, 2e-5);
  // dx added to, dw added to.
  DF_ASSERT_OK(df_moe_grouped_backward(cpu, &tdy, &tx, &tw, &toff, &tdx, true, &tdw, &err), &err);
  DF_ASSERT_OK(df_moe_grouped_backward(gpu, &gdy, &gx, &gw, &goff, &gdx, true, &gdw, &err), &err);
  expect_same(gpu, "dx (added)", &gdx, &tdx, 2e-5);
  expect_same(gpu, "dw (added)", &gdw, &tdw, 2e-5);
  // dx written over x itself (the weight gradient reads x first); frozen experts (no dw).
  DF_ASSERT_OK(df_moe_grouped_backward(cpu, &tdy, &tx, &tw, &toff, &tx, false, &tdw, &err), &err);
  DF_ASSERT_OK(df_moe_grouped_backward(gpu, &gdy, &gx, &gw, &goff, &gx, false, &gdw, &err), &err);
  expect_same(gpu, "dx (aliasing x)", &gx, &tx, 2e-5);
  expect_same(gpu, "dw (x read before it was overwritten)", &gdw, &tdw, 2e-5);
  DF_ASSERT_OK(df_moe_grouped_backward(cpu, &tdy, &tx, &tw, &toff, &tdx, false, NULL, &err), &err);
  DF_ASSERT_OK(df_moe_grouped_backward(gpu, &gdy, &gx, &gw, &goff, &gdx, false, NULL, &err), &err);
  expect_same(gpu, "dx (frozen experts)", &gdx, &tdx, 2e-5);
  df_tensor *all[] = {&gx, &gw, &gdy, &gy, &gdx, &gdw, &goff};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) df_buffer_free(gpu, all[i]->data);
  free(x), free(w), free(dy), free(y), free(dx), free(dw);
  df_ctx_destroy(gpu), df_ctx_destroy(cpu);
}
