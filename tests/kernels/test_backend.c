// The backend table (kernels/backend.h): missing ops and unsupported storage answer errors naming op and
// backend, the fake device counts every host↔device transfer, device views reach the right backend, and the
// workspace is reused across calls.
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"

Test(backend, tables_name_their_device) {
  cr_expect_str_eq(df_cpu_backend()->name, "cpu");
  cr_expect_eq(df_cpu_backend()->device, DF_DEV_CPU);
  cr_expect(df_cpu_backend()->host_addressable);
  cr_expect_str_eq(df_fake_backend()->name, "fake");
  cr_expect_eq(df_fake_backend()->device, DF_DEV_FAKE);
  cr_expect_not(df_fake_backend()->host_addressable);
  for (int op = 0; op < DF_OP_COUNT; op++) cr_expect_str_neq(df_op_name((df_op)op), "?", "op %d has no name", op);
}

// A table with the axpy slot removed: the dispatcher refuses, naming op and backend, and writes nothing.
Test(backend, missing_op_names_op_and_backend) {
  df_backend lacking = *df_cpu_backend();
  lacking.name = "lacking";
  lacking.axpy = NULL;
  df_ctx *ctx = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_ctx_create_with(&lacking, NULL, &ctx, &err), &err);
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  df_tensor tx = df_f32(x, 4), ty = df_f32(y, 4);
  cr_expect_eq(df_axpy(ctx, 1.0f, &tx, &ty, &err), DF_ERR_NOT_IMPLEMENTED);
  cr_expect_str_eq(err.where, "axpy");
  cr_expect(strstr(err.msg, "axpy") && strstr(err.msg, "lacking"), "%s", err.msg);
  cr_expect(y[0] == 0 && y[3] == 0);
  // the other ops are still there
  float a[4] = {1, 0, 0, 1}, c[4];
  df_tensor ta = df_f32(a, 2, 2), tc = df_f32(c, 2, 2), tb = df_f32(x, 2, 2);
  DF_ASSERT_OK(df_matmul(ctx, &ta, false, &tb, false, 1.0f, 0.0f, &tc, &err), &err);
  cr_expect(c[0] == 1 && c[1] == 2 && c[2] == 3 && c[3] == 4);
  df_ctx_destroy(ctx);
}

Test(backend, fake_device_counts_transfers) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_FAKE, .num_threads = 1};
  DF_ASSERT_OK(df_ctx_create(&o, &ctx, &err), &err);
  cr_expect_str_eq(df_ctx_backend_name(ctx), "fake");
  cr_expect_not(df_ctx_host_addressable(ctx));
  float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0};
  float *dx, *dy;
  DF_ASSERT_OK(df_buffer_alloc(ctx, sizeof host, (void **)&dx, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, sizeof host, (void **)&dy, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, dx, DF_DEV_FAKE, host, DF_DEV_CPU, sizeof host, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, dy, DF_DEV_FAKE, dx, DF_DEV_FAKE, sizeof host, &err), &err); // device to device
  // a host view is refused by an op on the fake device, naming the tensor
  df_tensor hx = df_f32(host, 8), vx = df_f32_on(DF_DEV_FAKE, dx, 8), vy = df_f32_on(DF_DEV_FAKE, dy, 8);
  cr_expect_eq(df_axpy(ctx, 1.0f, &hx, &vy, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  cr_expect(strstr(err.msg, "cpu") && strstr(err.msg, "fake"), "%s", err.msg);
  DF_ASSERT_OK(df_axpy(ctx, 2.0f, &vx, &vy, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, back, DF_DEV_CPU, dy, DF_DEV_FAKE, sizeof back, &err), &err);
  for (int i = 0; i < 8; i++) cr_expect(back[i] == 3 * host[i], "back[%d] = %g", i, back[i]);
  df_transfer_stats s = df_ctx_transfer_stats(ctx);
  cr_expect_eq(s.h2d, 1);
  cr_expect_eq(s.d2h, 1);
  cr_expect_eq(s.h2d_bytes, (int64_t)sizeof host);
  cr_expect_eq(s.d2h_bytes, (int64_t)sizeof back);
  df_ctx_reset_transfer_stats(ctx);
  cr_expect_eq(df_ctx_transfer_stats(ctx).h2d, 0);
  df_buffer_free(ctx, dx), df_buffer_free(ctx, dy);
  df_ctx_destroy(ctx);
}

// The CPU backend never counts: its buffers are host memory.
Test(backend, cpu_copies_are_not_transfers) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  float a[4] = {1, 2, 3, 4}, b[4];
  DF_ASSERT_OK(df_copy(ctx, b, DF_DEV_CPU, a, DF_DEV_CPU, sizeof a, &err), &err);
  cr_expect(b[3] == 4);
  cr_expect_eq(df_ctx_transfer_stats(ctx).h2d + df_ctx_transfer_stats(ctx).d2h, 0);
  // a copy naming another device's memory is refused
  cr_expect_eq(df_copy(ctx, b, DF_DEV_CUDA, a, DF_DEV_CPU, sizeof a, &err), DF_ERR_INVALID);
  df_ctx_destroy(ctx);
}

Test(backend, events_and_async_copies) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_FAKE};
  DF_ASSERT_OK(df_ctx_create(&o, &ctx, &err), &err);
  float *pinned, *dev;
  DF_ASSERT_OK(df_host_alloc(ctx, 64, (void **)&pinned, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, 64, (void **)&dev, &err), &err);
  for (int i = 0; i < 16; i++) pinned[i] = (float)i;
  df_event *ev;
  DF_ASSERT_OK(df_event_create(ctx, &ev, &err), &err);
  DF_ASSERT_OK(df_copy_async(ctx, dev, DF_DEV_FAKE, pinned, DF_DEV_CPU, 64, &err), &err);
  DF_ASSERT_OK(df_event_record(ctx, ev, &err), &err);
  DF_ASSERT_OK(df_event_wait(ctx, ev, &err), &err);
  memset(pinned, 0, 64);
  DF_ASSERT_OK(df_copy(ctx, pinned, DF_DEV_CPU, dev, DF_DEV_FAKE, 64, &err), &err);
  cr_expect(pinned[15] == 15.0f);
  DF_ASSERT_OK(df_sync(ctx, &err), &err);
  df_event_destroy(ctx, ev);
  df_host_free(ctx, pinned);
  df_buffer_free(ctx, dev);
  df_ctx_destroy(ctx);
}

// bf16 storage passes validation, and the CPU table refuses it naming op, backend and dtype; a mixed pair is an
// argument error naming the odd tensor.
Test(backend, bf16_storage_is_refused_by_the_cpu) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  uint16_t x[8] = {0}, w[8] = {0}, y[4] = {0};
  float wf[8] = {0};
  df_tensor tx = df_view(x, DF_BF16, DF_DEV_CPU, 2, DF_SHAPE(2, 4)),
            tw = df_view(w, DF_BF16, DF_DEV_CPU, 2, DF_SHAPE(2, 4));
  df_tensor ty = df_view(y, DF_BF16, DF_DEV_CPU, 2, DF_SHAPE(2, 2)), twf = df_f32(wf, 2, 4);
  cr_expect_eq(df_linear_forward(ctx, &tx, &tw, NULL, &ty, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "linear_forward");
  cr_expect(strstr(err.msg, "cpu") && strstr(err.msg, "bf16"), "%s", err.msg);
  cr_expect(strstr(err.hint, "fp32"), "%s", err.hint);
  cr_expect_eq(df_linear_forward(ctx, &tx, &twf, NULL, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  // integer storage is not a float format at all
  int32_t ids[4] = {0};
  df_tensor ti = df_i32(ids, 4), tf = df_f32(wf, 4);
  cr_expect_eq(df_axpy(ctx, 1.0f, &tf, &ti, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "y");
  df_ctx_destroy(ctx);
}

// The strict fake device: copies and ops reach its memory, the host cannot.
static df_ctx *strict_ctx(void) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_FAKE, .num_threads = 1, .backend = df_fake_strict_backend()};
  DF_ASSERT_OK(df_ctx_create(&o, &ctx, &err), &err);
  return ctx;
}

Test(backend, strict_fake_device_runs_ops_through_the_table) {
  df_ctx *ctx = strict_ctx();
  cr_expect_str_eq(df_ctx_backend_name(ctx), "fake-strict");
  df_error err = {0};
  float host[4] = {1, 2, 3, 4}, back[4];
  float *d;
  DF_ASSERT_OK(df_buffer_alloc(ctx, sizeof host, (void **)&d, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, d, DF_DEV_FAKE, host, DF_DEV_CPU, sizeof host, &err), &err);
  df_tensor t = df_f32_on(DF_DEV_FAKE, d, 4);
  DF_ASSERT_OK(df_scale(ctx, &t, 2.0f, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, back, DF_DEV_CPU, d, DF_DEV_FAKE, sizeof back, &err), &err);
  for (int i = 0; i < 4; i++) cr_expect_eq(back[i], 2 * host[i]);
  df_buffer_free(ctx, d);
  df_ctx_destroy(ctx);
}

// (Not under AddressSanitizer, which turns the fault into its own report and an abort.)
#ifndef __SANITIZE_ADDRESS__
Test(backend, strict_fake_memory_faults_on_host_access, .signal = SIGSEGV) {
  df_ctx *ctx = strict_ctx();
  df_error err = {0};
  volatile float *d;
  DF_ASSERT_OK(df_buffer_alloc(ctx, 16, (void **)&d, &err), &err);
  d[0] = 1.0f; // a host store into device memory
}
#endif
