// Memory accounting and measure mode (kernels/context.c, kernels/mem_tracker.c): every buffer a context allocates is
// counted by tag — live, peak, the split at the device peak — on the CPU and the fake devices alike, workspace and
// pinned host memory apart; a measuring context hands out addresses nothing may touch (a load faults), runs no op,
// reads back zeros, and still sizes each op's workspace exactly as the backend would (the same ops, run for real on
// the fake device, take the same workspace).
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/context.h"
#include "kernels/eagle3.h"
#include "tests/common/fixture.h"

static df_ctx *make(const df_ctx_options *o) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_ctx_create(o, &ctx, &err), &err);
  return ctx;
}

// Weights then grads then a workspace: the peak's split, each tag's own peak, frees, host memory kept apart.
static void accounting_on(const df_ctx_options *o) {
  df_ctx *ctx = make(o);
  df_error err = {0};
  void *w, *g, *a, *h, *ws;
  DF_ASSERT_OK(df_buffer_alloc_as(ctx, DF_MEM_WEIGHTS, 1000, &w, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc_as(ctx, DF_MEM_GRADS, 1000, &g, &err), &err);
  cr_expect_eq(df_ctx_set_mem_tag(ctx, DF_MEM_ACTIVATIONS), DF_MEM_OTHER, "the default tag is other");
  DF_ASSERT_OK(df_buffer_alloc(ctx, 5000, &a, &err), &err); // the context's tag
  cr_expect_eq(df_ctx_set_mem_tag(ctx, DF_MEM_OTHER), DF_MEM_ACTIVATIONS);
  DF_ASSERT_OK(df_host_alloc(ctx, 300, &h, &err), &err);
  df_mem_stats s = df_ctx_mem_stats(ctx);
  cr_expect_eq(s.device.live, 7000);
  cr_expect_eq(s.device.peak, 7000);
  cr_expect_eq(s.tag[DF_MEM_ACTIVATIONS].live, 5000);
  cr_expect_eq(s.host.live, 300, "pinned host memory is not device memory");
  df_buffer_free(ctx, a);
  DF_ASSERT_OK(df_ctx_workspace(ctx, 0, 100, &ws, &err), &err); // rounded to whole pages
  s = df_ctx_mem_stats(ctx);
  cr_expect_eq(s.tag[DF_MEM_WORKSPACE].live, 4096);
  cr_expect_eq(s.device.live, 2000 + 4096);
  cr_expect_eq(s.device.peak, 7000);
  cr_expect_eq(s.at_peak[DF_MEM_ACTIVATIONS], 5000, "the split of the peak is the moment of the peak");
  cr_expect_eq(s.at_peak[DF_MEM_WORKSPACE], 0);
  cr_expect_eq(s.tag[DF_MEM_ACTIVATIONS].peak, 5000);
  cr_expect_eq(s.tag[DF_MEM_ACTIVATIONS].live, 0);
  DF_ASSERT_OK(df_ctx_workspace(ctx, 0, 10000, &ws, &err), &err); // regrowth: the old region goes first
  s = df_ctx_mem_stats(ctx);
  cr_expect_eq(s.tag[DF_MEM_WORKSPACE].live, 12288);
  cr_expect_eq(s.device.peak, 2000 + 12288);
  cr_expect_eq(s.at_peak[DF_MEM_WORKSPACE], 12288);
  cr_expect_eq(s.at_peak[DF_MEM_ACTIVATIONS], 0);
  int64_t sum = 0;
  for (int i = 0; i < DF_MEM_TAGS; i++) sum += s.at_peak[i];
  cr_expect_eq(sum, s.device.peak, "the split adds up to the peak");
  df_buffer_free(ctx, w), df_buffer_free(ctx, g), df_host_free(ctx, h);
  s = df_ctx_mem_stats(ctx);
  cr_expect_eq(s.device.live, 12288);
  cr_expect_eq(s.host.live, 0);
  cr_expect_eq(s.host.peak, 300);
  df_ctx_destroy(ctx);
}

Test(mem_accounting, cpu) { accounting_on(&(df_ctx_options){.device = DF_DEV_CPU, .num_threads = 1}); }
Test(mem_accounting, fake) { accounting_on(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = 1}); }
Test(mem_accounting, strict_fake) {
  accounting_on(&(df_ctx_options){.num_threads = 1, .backend = df_fake_strict_backend()});
}
Test(mem_accounting, measuring) { accounting_on(&(df_ctx_options){.device = DF_DEV_CPU, .measure = true}); }

// Many buffers freed in a scrambled order: the table keeps every one (deletion by backward shift).
Test(mem_accounting, many_buffers_any_order) {
  df_ctx *ctx = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = 1});
  df_error err = {0};
  enum { N = 500 };
  void *p[N];
  int64_t total = 0;
  for (int i = 0; i < N; i++) {
    DF_ASSERT_OK(df_buffer_alloc_as(ctx, (df_mem_tag)(i % DF_MEM_TAGS), (size_t)(i + 1), &p[i], &err), &err);
    total += i + 1;
  }
  cr_expect_eq(df_ctx_mem_stats(ctx).device.live, total);
  for (int k = 0; k < N; k++) {
    const int i = (k * 211) % N; // 211 is prime to N: every buffer once
    df_buffer_free(ctx, p[i]);
    total -= i + 1;
    cr_assert_eq(df_ctx_mem_stats(ctx).device.live, total, "after freeing buffer %d", i);
  }
  const df_mem_stats s = df_ctx_mem_stats(ctx);
  for (int t = 0; t < DF_MEM_TAGS; t++) cr_expect_eq(s.tag[t].live, 0, "%s", df_mem_tag_name((df_mem_tag)t));
  cr_expect_eq(s.allocs, N);
  df_ctx_destroy(ctx);
}

Test(mem_accounting, stats_of_two_contexts_add) {
  df_mem_stats a = {.device = {10, 20}, .host = {1, 2}, .allocs = 3}, b = {.device = {5, 7}, .host = {0, 4}};
  a.tag[DF_MEM_WEIGHTS] = (df_mem_count){10, 20}, a.at_peak[DF_MEM_WEIGHTS] = 20;
  b.tag[DF_MEM_KV_CACHE] = (df_mem_count){5, 7}, b.at_peak[DF_MEM_KV_CACHE] = 7;
  df_mem_stats_add(&a, &b);
  cr_expect(a.device.live == 15 && a.device.peak == 27 && a.host.peak == 6 && a.allocs == 3);
  cr_expect(a.at_peak[DF_MEM_WEIGHTS] == 20 && a.at_peak[DF_MEM_KV_CACHE] == 7 && a.tag[DF_MEM_KV_CACHE].peak == 7);
  cr_expect_str_eq(df_mem_tag_name(DF_MEM_TARGET_ACTIVATIONS), "target_activations");
}

// ---- measure mode ------------------------------------------------------------------------------------------------

// A measured buffer is address space only: the host cannot read it. (Not under AddressSanitizer, which turns the fault
// into its own report and an abort.)
#ifndef __SANITIZE_ADDRESS__
Test(mem_measure, buffers_fault_on_access, .signal = SIGSEGV) {
  df_ctx *ctx = make(&(df_ctx_options){.device = DF_DEV_CPU, .measure = true});
  df_error err = {0};
  volatile float *p;
  DF_ASSERT_OK(df_buffer_alloc(ctx, 4096, (void **)&p, &err), &err);
  cr_expect_not(df_ctx_host_addressable(ctx), "a measuring context is never host-addressable");
  (void)p[7];
  df_ctx_destroy(ctx);
}
#endif

// Ops validate, then do nothing: on the buffers above any op that ran would fault. Copies: uploads and device copies
// move nothing, reads give zeros, host to host is real; transfers are still counted.
Test(mem_measure, ops_do_not_run_and_reads_are_zero) {
  df_ctx *ctx = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = 1, .measure = true});
  df_error err = {0};
  float *dx, *dy, host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {9, 9, 9, 9, 9, 9, 9, 9}, h2[8];
  DF_ASSERT_OK(df_buffer_alloc(ctx, sizeof host, (void **)&dx, &err), &err);
  DF_ASSERT_OK(df_buffer_alloc(ctx, sizeof host, (void **)&dy, &err), &err);
  cr_expect_neq(dx, dy, "every buffer has its own address");
  df_tensor vx = df_f32_on(DF_DEV_FAKE, dx, 8), vy = df_f32_on(DF_DEV_FAKE, dy, 8), hx = df_f32(host, 8);
  DF_ASSERT_OK(df_copy(ctx, dx, DF_DEV_FAKE, host, DF_DEV_CPU, sizeof host, &err), &err);
  DF_ASSERT_OK(df_fill(ctx, &vy, 1.0, &err), &err);
  DF_ASSERT_OK(df_axpy(ctx, 2.0f, &vx, &vy, &err), &err);
  cr_expect_eq(df_axpy(ctx, 1.0f, &hx, &vy, &err), DF_ERR_INVALID, "arguments are still checked");
  DF_ASSERT_OK(df_copy(ctx, dy, DF_DEV_FAKE, dx, DF_DEV_FAKE, sizeof host, &err), &err);
  DF_ASSERT_OK(df_copy(ctx, back, DF_DEV_CPU, dy, DF_DEV_FAKE, sizeof back, &err), &err);
  for (int i = 0; i < 8; i++) cr_expect(back[i] == 0.0f, "a read back gives zeros, back[%d] = %g", i, back[i]);
  DF_ASSERT_OK(df_copy(ctx, h2, DF_DEV_CPU, host, DF_DEV_CPU, sizeof host, &err), &err);
  cr_expect_arr_eq(h2, host, sizeof host);
  const df_transfer_stats t = df_ctx_transfer_stats(ctx);
  cr_expect(t.h2d == 1 && t.d2h == 1);
  df_event *ev;
  DF_ASSERT_OK(df_event_create(ctx, &ev, &err), &err);
  DF_ASSERT_OK(df_event_record(ctx, ev, &err), &err);
  DF_ASSERT_OK(df_event_wait(ctx, ev, &err), &err);
  df_event_destroy(ctx, ev);
  DF_ASSERT_OK(df_sync(ctx, &err), &err);
  double norm = 5.0;
  DF_ASSERT_OK(df_global_norm(ctx, &vx, 1, &norm, &err), &err);
  cr_expect(norm == 0.0, "the norm of zeros");
  df_buffer_free(ctx, dx), df_buffer_free(ctx, dy);
  df_ctx_destroy(ctx);
}

// The ops that take workspace (attention forward and backward, the fused LM head, the fused norm) on real data on the
// fake device, then on a measuring context of the same table and threads: the same workspace, to the byte.
typedef struct {
  float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *hid, *head, *loss, *dh, *g;
  int32_t *an, *lab;
  uint8_t *keep, *corr, *mask;
} op_bufs;

enum { B = 2, S = 40, N = 3, BS = 4, NH = 4, NKV = 1, HD = 16, Q = N * BS, KV = S + Q, R = B * Q, H = 32, V = 70 };

// The op tests' buffers, freed together once the ops have run (the peaks are kept).
static void *devs[32];
static int ndevs;

static void *dev(df_ctx *ctx, size_t bytes, const void *init) {
  void *p;
  df_error err = {0};
  cr_assert_lt(ndevs, 32);
  DF_ASSERT_OK(df_buffer_alloc(ctx, bytes, &p, &err), &err);
  if (init) DF_ASSERT_OK(df_copy(ctx, p, df_ctx_device(ctx), init, DF_DEV_CPU, bytes, &err), &err);
  return devs[ndevs++] = p;
}

static void free_devs(df_ctx *ctx) {
  while (ndevs > 0) df_buffer_free(ctx, devs[--ndevs]);
}

static void run_ops(df_ctx *ctx) {
  const df_device d = df_ctx_device(ctx);
  static float fq[B * Q * NH * HD], fk[B * KV * NKV * HD], fh[R * H], fw[V * H];
  df_test_fill_uniform(fq, B * Q * NH * HD, 1, -1, 1), df_test_fill_uniform(fk, B * KV * NKV * HD, 2, -1, 1);
  df_test_fill_uniform(fh, R * H, 3, -1, 1), df_test_fill_uniform(fw, V * H, 4, -1, 1);
  const int32_t an[B * N] = {5, 17, 30, 2, 11, 39};
  const uint8_t kp[B * N] = {1, 1, 1, 1, 0, 1};
  int32_t lab[R];
  static uint8_t mk[R * H]; // the gradient's element mask, one byte per element of g
  for (int r = 0; r < R; r++) lab[r] = r % 3 ? (r * 7) % V : -1;
  memset(mk, 1, sizeof mk);
  op_bufs o = {.q = dev(ctx, sizeof fq, fq), .k = dev(ctx, sizeof fk, fk), .v = dev(ctx, sizeof fk, fk)};
  o.out = dev(ctx, sizeof fq, NULL), o.lse = dev(ctx, sizeof(float) * B * NH * Q, NULL);
  o.dout = dev(ctx, sizeof fq, fq), o.dq = dev(ctx, sizeof fq, NULL);
  o.dk = dev(ctx, sizeof fk, NULL), o.dv = dev(ctx, sizeof fk, NULL);
  o.an = dev(ctx, sizeof an, an), o.keep = dev(ctx, sizeof kp, kp);
  o.hid = dev(ctx, sizeof fh, fh), o.head = dev(ctx, sizeof fw, fw), o.lab = dev(ctx, sizeof lab, lab);
  o.loss = dev(ctx, sizeof(float) * R, NULL), o.corr = dev(ctx, R, NULL), o.dh = dev(ctx, sizeof fh, NULL);
  o.g = dev(ctx, sizeof fh, fh), o.mask = dev(ctx, sizeof mk, mk);
  df_tensor q = df_f32_on(d, o.q, B, Q, NH, HD), k = df_f32_on(d, o.k, B, KV, NKV, HD),
            v = df_f32_on(d, o.v, B, KV, NKV, HD), out = df_f32_on(d, o.out, B, Q, NH, HD),
            lse = df_f32_on(d, o.lse, B, NH, Q), dout = df_f32_on(d, o.dout, B, Q, NH, HD),
            dq = df_f32_on(d, o.dq, B, Q, NH, HD), dk = df_f32_on(d, o.dk, B, KV, NKV, HD),
            dv = df_f32_on(d, o.dv, B, KV, NKV, HD), ta = df_i32_on(d, o.an, B, N), tk = df_u8_on(d, o.keep, B, N);
  const df_block_attn_desc ad = {.context_len = S, .block_size = BS, .scale = 0.25f};
  df_error err = {0};
  DF_ASSERT_OK(df_block_attn_forward(ctx, &ad, &q, &k, &v, &ta, &tk, &out, &lse, &err), &err);
  DF_ASSERT_OK(df_block_attn_backward(ctx, &ad, &q, &k, &v, &ta, &tk, &out, &lse, &dout, &dq, &dk, &dv, &err), &err);
  df_tensor hid = df_f32_on(d, o.hid, R, H), head = df_f32_on(d, o.head, V, H), tl = df_i32_on(d, o.lab, R),
            loss = df_f32_on(d, o.loss, R), corr = df_u8_on(d, o.corr, R), dh = df_f32_on(d, o.dh, R, H);
  const df_lmhead_ce_desc ld = {.chunk_rows = 10, .grad_scale = 1.0f};
  DF_ASSERT_OK(df_lmhead_ce(ctx, &ld, &hid, &head, &tl, NULL, &loss, &corr, &dh, &err), &err);
  df_tensor g = df_f32_on(d, o.g, R * H), m = df_u8_on(d, o.mask, R * H);
  void *ns = dev(ctx, sizeof(double) * DF_NORM_STATS, NULL);
  df_tensor nt = df_f64_on(d, ns, DF_NORM_STATS);
  const df_grad_norm_desc nd = {.grad_scale = 1.0f, .max_norm = 1.0};
  DF_ASSERT_OK(df_grad_norm_clip(ctx, &nd, &g, &m, NULL, &nt, &err), &err);
  free_devs(ctx);
}

Test(mem_measure, workspace_equals_what_the_ops_take) {
  for (int threads = 1; threads <= 3; threads += 2) {
    df_ctx *real = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = threads});
    df_ctx *meas = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = threads, .measure = true});
    run_ops(real), run_ops(meas);
    const df_mem_stats a = df_ctx_mem_stats(real), b = df_ctx_mem_stats(meas);
    cr_expect_gt(a.tag[DF_MEM_WORKSPACE].peak, 0);
    cr_expect_eq(b.tag[DF_MEM_WORKSPACE].peak, a.tag[DF_MEM_WORKSPACE].peak,
                 "%d threads: workspace %lld measured, %lld taken", threads, (long long)b.tag[DF_MEM_WORKSPACE].peak,
                 (long long)a.tag[DF_MEM_WORKSPACE].peak);
    cr_expect_eq(b.device.peak, a.device.peak);
    df_ctx_destroy(real), df_ctx_destroy(meas);
  }
}

// EAGLE-3's ops that take workspace (the TTT attention forward and backward, the compact teacher's lse/argmax), on
// real data and on a measuring context of the same table and threads: the same workspace, to the byte.
enum { ET = 3, EL = 10, EV = 300 }; // TTT steps, positions per sample, target vocabulary (two vocabulary blocks)

static void run_eagle3_ops(df_ctx *ctx, bool teacher) { // teacher: the lse/argmax, else the TTT attention
  const df_device d = df_ctx_device(ctx);
  static float fq[B * EL * NH * HD], fk[ET * B * EL * NKV * HD], fh[B * EL * H], fw[EV * H];
  df_test_fill_uniform(fq, B * EL * NH * HD, 5, -1, 1), df_test_fill_uniform(fk, ET * B * EL * NKV * HD, 6, -1, 1);
  df_test_fill_uniform(fh, B * EL * H, 7, -1, 1), df_test_fill_uniform(fw, EV * H, 8, -1, 1);
  const int32_t len[B] = {EL, EL - 3};
  df_tensor q = df_f32_on(d, dev(ctx, sizeof fq, fq), B, EL, NH, HD),
            k = df_f32_on(d, dev(ctx, sizeof fk, fk), ET * B, EL, NKV, HD),
            v = df_f32_on(d, dev(ctx, sizeof fk, fk), ET * B, EL, NKV, HD),
            lengths = df_i32_on(d, dev(ctx, sizeof len, len), B),
            out = df_f32_on(d, dev(ctx, sizeof fq, NULL), B, EL, NH, HD),
            lse = df_f32_on(d, dev(ctx, sizeof(float) * B * EL * NH, NULL), B * EL * NH),
            dout = df_f32_on(d, dev(ctx, sizeof fq, fq), B, EL, NH, HD),
            dq = df_f32_on(d, dev(ctx, sizeof fq, NULL), B, EL, NH, HD),
            dk = df_f32_on(d, dev(ctx, sizeof fk, NULL), ET * B, EL, NKV, HD),
            dv = df_f32_on(d, dev(ctx, sizeof fk, NULL), ET * B, EL, NKV, HD);
  const df_ttt_attn_desc td = {.step = 1, .scale = 0.25f};
  df_error err = {0};
  if (!teacher) {
    DF_ASSERT_OK(df_ttt_attn_forward(ctx, &td, &q, &k, &v, &lengths, &out, &lse, &err), &err);
    DF_ASSERT_OK(df_ttt_attn_backward(ctx, &td, &q, &k, &v, &lengths, &out, &lse, &dout, &dq, &dk, &dv, &err), &err);
  } else {
    df_tensor hid = df_f32_on(d, dev(ctx, sizeof fh, fh), B * EL, H),
              head = df_f32_on(d, dev(ctx, sizeof fw, fw), EV, H),
              tl = df_f32_on(d, dev(ctx, sizeof(float) * B * EL, NULL), B * EL),
              ta = df_i32_on(d, dev(ctx, sizeof(int32_t) * B * EL, NULL), B * EL);
    DF_ASSERT_OK(df_lmhead_lse_argmax(ctx, 7, &hid, &head, &tl, &ta, &err), &err);
  }
  free_devs(ctx);
}

Test(mem_measure, eagle3_workspace_equals_what_the_ops_take) {
  for (int run = 0; run < 4; run++) {
    const int threads = run % 2 ? 3 : 1;
    const bool teacher = run >= 2;
    df_ctx *real = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = threads});
    df_ctx *meas = make(&(df_ctx_options){.device = DF_DEV_FAKE, .num_threads = threads, .measure = true});
    run_eagle3_ops(real, teacher), run_eagle3_ops(meas, teacher);
    const df_mem_stats a = df_ctx_mem_stats(real), b = df_ctx_mem_stats(meas);
    cr_expect_gt(a.tag[DF_MEM_WORKSPACE].peak, 0);
    cr_expect_eq(b.tag[DF_MEM_WORKSPACE].peak, a.tag[DF_MEM_WORKSPACE].peak,
                 "%s, %d threads: workspace %lld measured, %lld taken", teacher ? "lse/argmax" : "TTT attention",
                 threads, (long long)b.tag[DF_MEM_WORKSPACE].peak, (long long)a.tag[DF_MEM_WORKSPACE].peak);
    cr_expect_eq(b.device.peak, a.device.peak);
    df_ctx_destroy(real), df_ctx_destroy(meas);
  }
}

// The CUDA table measures without a GPU: no device is touched, and the context accounts the cuBLASLt workspace its
// init would take, and the fused LM head's chunk buffer.
Test(mem_measure, cuda_table_without_a_gpu) {
  if (!df_cuda_built()) cr_skip_test("this build has no CUDA backend");
  df_ctx *ctx = make(&(df_ctx_options){.device = DF_DEV_CUDA, .measure = true});
  const df_mem_stats s0 = df_ctx_mem_stats(ctx);
  cr_expect_eq(s0.tag[DF_MEM_WORKSPACE].live, (int64_t)df_cuda_backend()->state_device_bytes);
  cr_expect_gt(s0.tag[DF_MEM_WORKSPACE].live, 0);
  run_ops(ctx);
  const df_mem_stats s = df_ctx_mem_stats(ctx);
  cr_expect_gt(s.tag[DF_MEM_WORKSPACE].peak, s0.tag[DF_MEM_WORKSPACE].peak, "the ops' workspace is accounted");
  df_ctx_destroy(ctx);
}
