// KV-cache causal attention (kernels/causal_attn.h) against a direct double-precision evaluation of its
// definition: full and sliding window, a non-zero past, GQA; bitwise the same for 1 and 2 threads; argument
// errors; the backend table (the strict fake device, a missing slot); and the CUDA twin against the CPU
// (skipped without a device).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/causal_attn.h"
#include "tests/common/fixture.h"

enum { B = 2, T = 37, PAST = 11, C = 64, NH = 4, NKV = 2, HD = 16 };

static void reference(const float *q, const float *k, const float *v, int64_t past, int64_t W, float *out) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        const int g = h / (NH / NKV), pos = (int)past + t, lo = W > 0 ? (int)(pos - W + 1 > 0 ? pos - W + 1 : 0) : 0;
        const float *qp = q + ((b * T + t) * NH + h) * HD;
        double s[C], m = -INFINITY, z = 0;
        for (int j = lo; j <= pos; j++) {
          double d = 0;
          for (int x = 0; x < HD; x++) d += (double)qp[x] * k[((b * C + j) * NKV + g) * HD + x];
          s[j] = d / sqrt((double)HD);
          m = s[j] > m ? s[j] : m;
        }
        for (int j = lo; j <= pos; j++) z += exp(s[j] - m);
        for (int x = 0; x < HD; x++) {
          double acc = 0;
          for (int j = lo; j <= pos; j++) acc += exp(s[j] - m) / z * v[((b * C + j) * NKV + g) * HD + x];
          out[((b * T + t) * NH + h) * HD + x] = (float)acc;
        }
      }
}

typedef struct {
  float *q, *k, *v, *out, *want;
} bufs;

static bufs make(void) {
  bufs x = {malloc(sizeof(float) * B * T * NH * HD), malloc(sizeof(float) * B * C * NKV * HD),
            malloc(sizeof(float) * B * C * NKV * HD), malloc(sizeof(float) * B * T * NH * HD),
            malloc(sizeof(float) * B * T * NH * HD)};
  df_test_fill_uniform(x.q, B * T * NH * HD, 1, -2, 2);
  df_test_fill_uniform(x.k, B * C * NKV * HD, 2, -2, 2);
  df_test_fill_uniform(x.v, B * C * NKV * HD, 3, -1, 1);
  return x;
}

static void drop(bufs x) { free(x.q), free(x.k), free(x.v), free(x.out), free(x.want); }

static df_status run(df_ctx *ctx, bufs x, int64_t past, int64_t W, df_error *err) {
  df_tensor q = df_f32(x.q, B, T, NH, HD), k = df_f32(x.k, B, C, NKV, HD), v = df_f32(x.v, B, C, NKV, HD);
  df_tensor o = df_f32(x.out, B, T, NH, HD);
  df_causal_attn_desc d = {.past = past, .window = W, .scale = 1.0f / sqrtf((float)HD)};
  return df_causal_attn_forward(ctx, &d, &q, &k, &v, &o, err);
}

Test(causal_attn, matches_the_definition_full_and_windowed) {
  const int64_t windows[] = {0, 5, 1};
  for (size_t i = 0; i < 3; i++) {
    bufs x = make();
    df_error err = {0};
    df_ctx *ctx = df_test_cpu_ctx(2);
    DF_ASSERT_OK(run(ctx, x, PAST, windows[i], &err), &err);
    reference(x.q, x.k, x.v, PAST, windows[i], x.want);
    df_expect_close_elementwise("causal attention", x.out, x.want, B * T * NH * HD, 1e-5, 1e-6);
    df_ctx_destroy(ctx);
    drop(x);
  }
}

Test(causal_attn, bitwise_the_same_for_any_thread_count) {
  bufs x = make();
  df_error err = {0};
  df_ctx *one = df_test_cpu_ctx(1), *two = df_test_cpu_ctx(2);
  DF_ASSERT_OK(run(one, x, PAST, 0, &err), &err);
  memcpy(x.want, x.out, sizeof(float) * B * T * NH * HD);
  DF_ASSERT_OK(run(two, x, PAST, 0, &err), &err);
  cr_assert_eq(memcmp(x.want, x.out, sizeof(float) * B * T * NH * HD), 0);
  df_ctx_destroy(one), df_ctx_destroy(two);
  drop(x);
}

Test(causal_attn, rejects_a_short_cache_and_bad_heads) {
  bufs x = make();
  df_error err = {0};
  df_ctx *ctx = df_test_cpu_ctx(1);
  cr_assert_eq(run(ctx, x, C - T + 1, 0, &err), DF_ERR_INVALID);
  cr_assert(strstr(err.msg, "past + T"), "%s", err.msg);
  df_tensor q = df_f32(x.q, B, T, 3, HD), k = df_f32(x.k, B, C, NKV, HD), v = df_f32(x.v, B, C, NKV, HD);
  df_tensor o = df_f32(x.out, B, T, 3, HD);
  df_causal_attn_desc d = {.scale = 0.25f};
  cr_assert_eq(df_causal_attn_forward(ctx, &d, &q, &k, &v, &o, &err), DF_ERR_INVALID);
  cr_assert_str_eq(err.where, "k");
  df_ctx_destroy(ctx);
  drop(x);
}

// x.q, x.k, x.v copied to the device of ctx, attention there (past PAST, window 5), the output copied into x.want.
static void run_on_device(df_ctx *ctx, df_device dev, bufs x) {
  df_error err = {0};
  const size_t nq = sizeof(float) * B * T * NH * HD, nk = sizeof(float) * B * C * NKV * HD;
  void *dq, *dk, *dv, *dout;
  DF_ASSERT_OK(df_buffer_alloc(ctx, nq, &dq, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, nk, &dk, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, nk, &dv, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, nq, &dout, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, dq, dev, x.q, DF_DEV_CPU, nq, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, dk, dev, x.k, DF_DEV_CPU, nk, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, dv, dev, x.v, DF_DEV_CPU, nk, &err), &err);
  const int64_t qs[4] = {B, T, NH, HD}, ks[4] = {B, C, NKV, HD};
  df_tensor q = df_view(dq, DF_F32, dev, 4, qs), k = df_view(dk, DF_F32, dev, 4, ks);
  df_tensor v = df_view(dv, DF_F32, dev, 4, ks), o = df_view(dout, DF_F32, dev, 4, qs);
  df_causal_attn_desc d = {.past = PAST, .window = 5, .scale = 1.0f / sqrtf((float)HD)};
  DF_ASSERT_OK(df_causal_attn_forward(ctx, &d, &q, &k, &v, &o, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, x.want, DF_DEV_CPU, dout, dev, nq, &err), &err);
  df_buffer_free(ctx, dq), df_buffer_free(ctx, dk), df_buffer_free(ctx, dv), df_buffer_free(ctx, dout);
}

Test(causal_attn, cuda_matches_cpu) {
  if (!df_cuda_available()) cr_skip_test("no CUDA device visible (or CUDA backend not built): GPU test skipped");
  bufs x = make();
  df_error err = {0};
  df_ctx *cpu = df_test_cpu_ctx(1), *gpu = NULL;
  df_ctx_options go = {.device = DF_DEV_CUDA};
  DF_ASSERT_OK(df_ctx_create(&go, &gpu, &err), &err);
  DF_ASSERT_OK(run(cpu, x, PAST, 5, &err), &err);
  run_on_device(gpu, DF_DEV_CUDA, x);
  df_expect_close_elementwise("cuda vs cpu", x.want, x.out, B * T * NH * HD, 1e-5, 1e-6);
  df_ctx_destroy(gpu), df_ctx_destroy(cpu);
  drop(x);
}

// Through the backend table: the strict fake device (memory the host cannot touch) gives the CPU's bits, and a
// table without the slot answers with an error naming op and backend.
Test(causal_attn, on_the_backend_table) {
  bufs x = make();
  df_error err = {0};
  df_ctx *cpu = df_test_cpu_ctx(1), *strict = NULL, *lacking_ctx = NULL;
  df_ctx_options so = {.device = DF_DEV_FAKE, .num_threads = 1, .backend = df_fake_strict_backend()};
  DF_ASSERT_OK(df_ctx_create(&so, &strict, &err), &err);
  DF_ASSERT_OK(run(cpu, x, PAST, 5, &err), &err);
  run_on_device(strict, DF_DEV_FAKE, x);
  cr_expect_eq(memcmp(x.want, x.out, sizeof(float) * B * T * NH * HD), 0, "strict fake device differs from the CPU");
  df_backend lacking = *df_cpu_backend();
  lacking.name = "lacking";
  lacking.causal_attn_forward = NULL;
  DF_ASSERT_OK(df_ctx_create_with(&lacking, NULL, &lacking_ctx, &err), &err);
  cr_expect_eq(run(lacking_ctx, x, PAST, 0, &err), DF_ERR_NOT_IMPLEMENTED);
  cr_expect(strstr(err.msg, "causal_attn_forward") && strstr(err.msg, "lacking"), "%s", err.msg);
  df_ctx_destroy(lacking_ctx), df_ctx_destroy(strict), df_ctx_destroy(cpu);
  drop(x);
}
