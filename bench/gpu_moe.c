// GPU benchmark of one sparse-MoE FFN layer at the Qwen3.8 DSpark-MoE expert shape (512 experts, top-10, expert
// width 512, a gated shared expert of width 2048, softmax router with per-sample centering) over 8192 tokens of
// H 4096, bf16 storage with fp32 router math and fp32 gradients, composed from the CUDA launchers in the order of
// moe/layer.c. The grouped expert GEMMs need the per-expert counts on the host: one device→host copy per forward,
// included in the timing.
//
// Compared with dense GEMMs of the same FLOPs: the routed experts' 9 GEMM shapes (3 forward, 6 backward) as if all
// T·k rows went to one expert; "grouped / dense" is the rate the grouped path reaches relative to perfect batching.
// The same GEMMs through moe_grouped.cu's device-offset kernels (the backend table's grouped slots) are timed too.
// Usage: bench_gpu_moe [--tokens T] [--reps N]
#include <math.h>

#include "bench/gpu_util.h"

enum { H = 4096, E = 512, K = 10, IW = 512, SW = 2048 };

typedef struct {
  gpu_env e;
  int64_t T;
  void *x, *w1, *w3, *w2, *s1, *s3, *s2, *sg, *y, *dy, *dx;
  float *u, *wr, *logits, *scores, *weights, *dweights, *dlogits, *du, *dwr, *g1, *g3, *g2, *gs1, *gs3, *gs2, *gsg;
  float *z, *aux_row, *batch_mean;
  int32_t *idx, *counts, *h_counts, *offsets, *slot, *token, *pos;
  void *gate, *up, *sgate, *sup, *ws_exp, *ws_sh;
  df_cu_router_spec rs;
} moe;

static df_cu_moe_experts_args experts_args(moe *m) {
  df_cu_moe_experts_args a = {.T = m->T,
                              .H = H,
                              .I = IW,
                              .E = E,
                              .k = K,
                              .dt = DF_BF16,
                              .x = m->x,
                              .w1 = m->w1,
                              .w3 = m->w3,
                              .w2 = m->w2,
                              .g1 = m->g1,
                              .g3 = m->g3,
                              .g2 = m->g2,
                              .indices = m->idx,
                              .weights = m->weights,
                              .counts = m->counts,
                              .h_counts = m->h_counts,
                              .offsets = m->offsets,
                              .slot = m->slot,
                              .token = m->token,
                              .pos = m->pos,
                              .gate = m->gate,
                              .up = m->up};
  return a;
}

static df_cu_moe_shared_args shared_args(moe *m) {
  df_cu_moe_shared_args a = {.T = m->T,
                             .H = H,
                             .S = SW,
                             .gated = true,
                             .dt = DF_BF16,
                             .x = m->x,
                             .w1 = m->s1,
                             .w3 = m->s3,
                             .w2 = m->s2,
                             .wg = m->sg,
                             .g1 = m->gs1,
                             .g3 = m->gs3,
                             .g2 = m->gs2,
                             .gg = m->gsg,
                             .gate = m->sgate,
                             .up = m->sup,
                             .z = m->z};
  return a;
}

static void alloc_moe(moe *m) {
  gpu_env *e = &m->e;
  const int64_t T = m->T, Tk = T * K;
  m->x = gpu_alloc(e, 2 * T * H), m->y = gpu_alloc(e, 2 * T * H), m->dy = gpu_alloc(e, 2 * T * H);
  m->dx = gpu_alloc(e, 4 * T * H);
  m->w1 = gpu_alloc(e, 2 * (size_t)E * IW * H), m->w3 = gpu_alloc(e, 2 * (size_t)E * IW * H);
  m->w2 = gpu_alloc(e, 2 * (size_t)E * H * IW);
  m->s1 = gpu_alloc(e, 2 * SW * H), m->s3 = gpu_alloc(e, 2 * SW * H), m->s2 = gpu_alloc(e, 2 * H * SW);
  m->sg = gpu_alloc(e, 2 * H);
  gpu_fill_random(e, m->x, T * H, DF_BF16, 1.0f, 11), gpu_fill_random(e, m->dy, T * H, DF_BF16, 1.0f, 12);
  gpu_fill_random(e, m->w1, (int64_t)E * IW * H, DF_BF16, 0.02f, 13);
  gpu_fill_random(e, m->w3, (int64_t)E * IW * H, DF_BF16, 0.02f, 14);
  gpu_fill_random(e, m->w2, (int64_t)E * H * IW, DF_BF16, 0.02f, 15);
  gpu_fill_random(e, m->s1, SW * H, DF_BF16, 0.02f, 16), gpu_fill_random(e, m->s3, SW * H, DF_BF16, 0.02f, 17);
  gpu_fill_random(e, m->s2, H * SW, DF_BF16, 0.02f, 18), gpu_fill_random(e, m->sg, H, DF_BF16, 0.02f, 19);
  m->u = gpu_alloc(e, 4 * T * H), m->wr = gpu_alloc(e, 4 * E * H), m->logits = gpu_alloc(e, 4 * T * E);
  gpu_fill_random(e, m->wr, E * H, DF_F32, 0.02f, 20);
  m->scores = gpu_alloc(e, 4 * T * E), m->weights = gpu_alloc(e, 4 * Tk), m->dweights = gpu_alloc(e, 4 * Tk);
  m->dlogits = gpu_alloc(e, 4 * T * E), m->du = gpu_alloc(e, 4 * T * H), m->dwr = gpu_alloc(e, 4 * E * H);
  m->g1 = gpu_alloc(e, 4 * (size_t)E * IW * H), m->g3 = gpu_alloc(e, 4 * (size_t)E * IW * H);
  m->g2 = gpu_alloc(e, 4 * (size_t)E * H * IW);
  m->gs1 = gpu_alloc(e, 4 * SW * H), m->gs3 = gpu_alloc(e, 4 * SW * H), m->gs2 = gpu_alloc(e, 4 * H * SW);
  m->gsg = gpu_alloc(e, 4 * H), m->z = gpu_alloc(e, 4 * T), m->aux_row = gpu_alloc(e, 4 * E);
  m->batch_mean = gpu_alloc(e, 4 * H);
  m->idx = gpu_alloc(e, 4 * Tk), m->counts = gpu_alloc(e, 4 * E), m->offsets = gpu_alloc(e, 4 * (E + 1));
  m->slot = gpu_alloc(e, 4 * Tk), m->token = gpu_alloc(e, 4 * Tk), m->pos = gpu_alloc(e, 4 * Tk);
  m->gate = gpu_alloc(e, 2 * Tk * IW), m->up = gpu_alloc(e, 2 * Tk * IW);
  m->sgate = gpu_alloc(e, 2 * T * SW), m->sup = gpu_alloc(e, 2 * T * SW);
  GPU_CHECK(cudaMallocHost((void **)&m->h_counts, 4 * E));
  m->rs = (df_cu_router_spec){.E = E,
                              .k = K,
                              .score = DF_CU_SCORE_SOFTMAX,
                              .norm_topk_prob = true,
                              .routed_scaling_factor = 1.0f,
                              .n_group = 1,
                              .topk_group = 1};
  df_cu_moe_experts_args ea = experts_args(m);
  const size_t wf = df_cu_moe_experts_fwd_workspace(&ea), wb = df_cu_moe_experts_bwd_workspace(&ea);
  m->ws_exp = gpu_alloc(e, wf > wb ? wf : wb);
  df_cu_moe_shared_args sa = shared_args(m);
  m->ws_sh = gpu_alloc(e, df_cu_moe_shared_workspace(&sa));
  GPU_CHECK(cudaStreamSynchronize(e->s));
}

static df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t Kd, const void *A, int64_t lda,
                            const void *B, int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g;
  memset(&g, 0, sizeof g);
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = Kd, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

static void router_fwd(moe *m) {
  gpu_env *e = &m->e;
  const int64_t T = m->T;
  GPU_TRY(df_cu_cast(e->s, m->du, DF_F32, m->x, DF_BF16, T * H, &err_)); // fp32 router input
  GPU_TRY(df_cu_moe_center_sample_fwd(e->s, m->du, T, H, T, m->u, m->batch_mean, &err_));
  df_cu_gemm_args g = gemm(false, true, T, E, H, m->u, H, m->wr, H, DF_F32, m->logits, E, DF_F32, 0.0f);
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  GPU_TRY(df_cu_moe_scores_fwd(e->s, DF_CU_SCORE_SOFTMAX, T, E, m->logits, m->scores, &err_));
  GPU_TRY(df_cu_moe_select(e->s, &m->rs, T, m->scores, NULL, m->idx, m->weights, m->counts, &err_));
  GPU_CHECK(cudaMemcpyAsync(m->h_counts, m->counts, 4 * E, cudaMemcpyDeviceToHost, e->s));
  GPU_CHECK(cudaStreamSynchronize(e->s)); // the grouped GEMMs' sizes: the layer's one host round trip
}

static void layer_fwd(moe *m) {
  router_fwd(m);
  df_cu_moe_experts_args ea = experts_args(m);
  GPU_TRY(df_cu_moe_experts_fwd(m->e.g, m->e.s, &ea, m->y, DF_BF16, m->ws_exp, &err_));
  df_cu_moe_shared_args sa = shared_args(m);
  GPU_TRY(df_cu_moe_shared_fwd(m->e.g, m->e.s, &sa, m->y, DF_BF16, m->ws_sh, &err_));
}

static void layer_bwd(moe *m) {
  gpu_env *e = &m->e;
  const int64_t T = m->T;
  GPU_TRY(df_cu_fill(e->s, m->dx, DF_F32, T * H, 0.0f, &err_));
  df_cu_moe_experts_args ea = experts_args(m);
  GPU_TRY(df_cu_moe_experts_bwd(e->g, e->s, &ea, m->dy, DF_BF16, m->dweights, m->dx, DF_F32, m->ws_exp, &err_));
  df_cu_moe_shared_args sa = shared_args(m);
  GPU_TRY(df_cu_moe_shared_bwd(e->g, e->s, &sa, m->dy, DF_BF16, m->dx, DF_F32, m->ws_sh, &err_));
  GPU_TRY(df_cu_moe_switch_grad_row(e->s, 1e-3, T, E, m->counts, 1.0, m->aux_row, &err_));
  GPU_TRY(df_cu_moe_weights_bwd(e->s, &m->rs, T, m->scores, m->idx, m->weights, m->dweights, m->aux_row, m->dlogits,
                                &err_));
  GPU_TRY(df_cu_moe_scores_bwd(e->s, DF_CU_SCORE_SOFTMAX, T, E, m->logits, m->scores, m->dlogits, m->dlogits, &err_));
  df_cu_gemm_args g = gemm(true, false, E, H, T, m->dlogits, E, m->u, H, DF_F32, m->dwr, H, DF_F32, 1.0f);
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  g = gemm(false, false, T, H, E, m->dlogits, E, m->wr, H, DF_F32, m->du, H, DF_F32, 0.0f);
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  GPU_TRY(df_cu_moe_center_sample_bwd(e->s, m->du, T, H, T, m->dx, true, &err_));
}

// The dense reference: the 9 expert GEMM shapes over all T·k rows with one weight per projection.
static void dense_equivalent(moe *m, void *A, void *Bw, void *C, float *Cw) {
  gpu_env *e = &m->e;
  const int64_t R = m->T * K;
  df_cu_gemm_args g;
  for (int p = 0; p < 2; p++) { // gate and up: [R, H] · [I, H]ᵀ, and their dgrad and wgrad
    g = gemm(false, true, R, IW, H, A, H, Bw, H, DF_BF16, C, IW, DF_BF16, 0.0f);
    GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
    g = gemm(false, false, R, H, IW, C, IW, Bw, H, DF_BF16, A, H, DF_BF16, 0.0f);
    GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
    g = gemm(true, false, IW, H, R, C, IW, A, H, DF_BF16, Cw, H, DF_F32, 1.0f);
    GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  }
  g = gemm(false, true, R, H, IW, C, IW, Bw, IW, DF_BF16, A, H, DF_BF16, 0.0f); // down
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  g = gemm(false, false, R, IW, H, A, H, Bw, IW, DF_BF16, C, IW, DF_BF16, 0.0f);
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
  g = gemm(true, false, H, IW, R, A, H, C, IW, DF_BF16, Cw, IW, DF_F32, 1.0f);
  GPU_TRY(df_cu_gemm(e->g, e->s, &g, &err_));
}

// The same 9 GEMMs as grouped GEMMs over the routed segments of the last forward (host counts from it).
static void grouped_only(moe *m, void *A, void *C) {
  gpu_env *e = &m->e;
  int32_t off[E], acc = 0;
  for (int x = 0; x < E; x++) off[x] = acc, acc += m->h_counts[x];
  void *ptrs = (char *)m->ws_exp + (size_t)2 * m->T * K * H * 2; // past the two row buffers
  for (int p = 0; p < 2; p++) {
    df_cu_grouped_args f = {.E = E,
                            .h_rows = m->h_counts,
                            .h_offsets = off,
                            .N = IW,
                            .K = H,
                            .X = A,
                            .ldx = H,
                            .W = p ? m->w3 : m->w1,
                            .stride_w = IW * H,
                            .trans_w = true,
                            .D = C,
                            .ldd = IW,
                            .ab_dt = DF_BF16,
                            .d_dt = DF_BF16};
    GPU_TRY(df_cu_gemm_grouped(e->g, e->s, &f, ptrs, &err_));
    df_cu_grouped_args d = {.E = E,
                            .h_rows = m->h_counts,
                            .h_offsets = off,
                            .N = H,
                            .K = IW,
                            .X = C,
                            .ldx = IW,
                            .W = p ? m->w3 : m->w1,
                            .stride_w = IW * H,
                            .trans_w = false,
                            .D = A,
                            .ldd = H,
                            .ab_dt = DF_BF16,
                            .d_dt = DF_BF16};
    GPU_TRY(df_cu_gemm_grouped(e->g, e->s, &d, ptrs, &err_));
    df_cu_grouped_wgrad_args w = {.E = E,
                                  .h_rows = m->h_counts,
                                  .h_offsets = off,
                                  .N = IW,
                                  .K = H,
                                  .dY = C,
                                  .lddy = IW,
                                  .X = A,
                                  .ldx = H,
                                  .dW = p ? m->g3 : m->g1,
                                  .stride_dw = IW * H,
                                  .ab_dt = DF_BF16};
    GPU_TRY(df_cu_gemm_grouped_wgrad(e->g, e->s, &w, ptrs, &err_));
  }
  df_cu_grouped_args f = {.E = E,
                          .h_rows = m->h_counts,
                          .h_offsets = off,
                          .N = H,
                          .K = IW,
                          .X = C,
                          .ldx = IW,
                          .W = m->w2,
                          .stride_w = H * IW,
                          .trans_w = true,
                          .D = A,
                          .ldd = H,
                          .ab_dt = DF_BF16,
                          .d_dt = DF_BF16};
  GPU_TRY(df_cu_gemm_grouped(e->g, e->s, &f, ptrs, &err_));
  df_cu_grouped_args d = {.E = E,
                          .h_rows = m->h_counts,
                          .h_offsets = off,
                          .N = IW,
                          .K = H,
                          .X = A,
                          .ldx = H,
                          .W = m->w2,
                          .stride_w = H * IW,
                          .trans_w = false,
                          .D = C,
                          .ldd = IW,
                          .ab_dt = DF_BF16,
                          .d_dt = DF_BF16};
  GPU_TRY(df_cu_gemm_grouped(e->g, e->s, &d, ptrs, &err_));
  df_cu_grouped_wgrad_args w = {.E = E,
                                .h_rows = m->h_counts,
                                .h_offsets = off,
                                .N = H,
                                .K = IW,
                                .dY = A,
                                .lddy = H,
                                .X = C,
                                .ldx = IW,
                                .dW = m->g2,
                                .stride_dw = H * IW,
                                .ab_dt = DF_BF16};
  GPU_TRY(df_cu_gemm_grouped_wgrad(e->g, e->s, &w, ptrs, &err_));
}

// The same 9 GEMMs through the device-offset kernels of moe_grouped.cu (what the backend table's grouped slots use:
// no host counts). Their weight gradients have the storage dtype, so they go into w3 (overwritten: nothing after
// this reads it).
static void device_offset_grouped(moe *m, void *A, void *C) {
  gpu_env *e = &m->e;
  const int64_t Tk = m->T * K;
  void *A2 = (char *)A + (size_t)Tk * H * 2;
  for (int p = 0; p < 2; p++) {
    GPU_TRY(df_cu_moe_grouped_fwd(e->s, DF_BF16, A, m->w1, m->offsets, C, Tk, E, H, IW, &err_));
    GPU_TRY(df_cu_moe_grouped_bwd(e->s, DF_BF16, C, A, m->w1, m->offsets, A2, p == 1, m->w3, Tk, E, H, IW, &err_));
  }
  GPU_TRY(df_cu_moe_grouped_fwd(e->s, DF_BF16, C, m->w2, m->offsets, A2, Tk, E, IW, H, &err_));
  GPU_TRY(df_cu_moe_grouped_bwd(e->s, DF_BF16, A2, C, m->w2, m->offsets, m->up, false, m->w3, Tk, E, IW, H, &err_));
}

int main(int argc, char **argv) {
  moe m;
  memset(&m, 0, sizeof m);
  m.T = 8192;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tokens"))
      m.T = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps"))
      reps = atoi(argv[i + 1]);
  }
  if (!gpu_visible()) {
    printf("bench_gpu_moe: no CUDA device visible; nothing measured\n");
    return 0;
  }
  if (reps > 32) reps = 32;
  m.e = gpu_env_open();
  alloc_moe(&m);
  gpu_timer t = gpu_timer_make();
  double tf[32], tb[32], td[32], tg[32], to[32];
  for (int it = -1; it < reps; it++) {
    gpu_timer_start(&t, m.e.s);
    layer_fwd(&m);
    const double f = gpu_timer_stop(&t, m.e.s);
    gpu_timer_start(&t, m.e.s);
    layer_bwd(&m);
    const double b = gpu_timer_stop(&t, m.e.s);
    if (it >= 0) tf[it] = f, tb[it] = b;
  }
  // Dense reference buffers: reuse the expert gradient and activation buffers (sizes suffice).
  void *A = m.ws_exp, *C = m.gate;
  for (int it = -1; it < reps; it++) {
    gpu_timer_start(&t, m.e.s);
    dense_equivalent(&m, A, m.w1, C, m.g1);
    const double d = gpu_timer_stop(&t, m.e.s);
    gpu_timer_start(&t, m.e.s);
    grouped_only(&m, A, C);
    const double gq = gpu_timer_stop(&t, m.e.s);
    if (it >= 0) td[it] = d, tg[it] = gq;
  }
  for (int it = -1; it < reps; it++) {
    gpu_timer_start(&t, m.e.s);
    device_offset_grouped(&m, A, C);
    const double o = gpu_timer_stop(&t, m.e.s);
    if (it >= 0) to[it] = o;
  }
  const double Tk = (double)m.T * K, expert_flops = 18.0 * Tk * H * IW;
  const double shared_flops = 18.0 * m.T * H * SW + 6.0 * m.T * H, router_flops = 6.0 * m.T * H * E;
  const double fwd = gpu_median(tf, reps), bwd = gpu_median(tb, reps), dense = gpu_median(td, reps);
  const double grouped = gpu_median(tg, reps), devoff = gpu_median(to, reps);
  const double layer_flops = expert_flops + shared_flops + router_flops;
  printf("\nbench_gpu_moe: %lld tokens, H %d, %d experts top-%d width %d, gated shared expert %d, bf16, "
         "%d reps (median)\n",
         (long long)m.T, H, E, K, IW, SW, reps);
  printf("| what | ms | TFLOP/s |\n|---|---|---|\n");
  printf("| layer forward (router, counts copy, experts, shared) | %.2f | |\n", fwd);
  printf("| layer backward | %.2f | |\n", bwd);
  printf("| layer forward + backward | %.2f | %.1f |\n", fwd + bwd, layer_flops / ((fwd + bwd) / 1e3) / 1e12);
  printf("| the routed experts' 9 grouped GEMMs | %.2f | %.1f |\n", grouped, expert_flops / (grouped / 1e3) / 1e12);
  printf("| dense GEMMs of the same 9 shapes over all rows | %.2f | %.1f |\n", dense,
         expert_flops / (dense / 1e3) / 1e12);
  printf("| the same 9 through moe_grouped.cu (device offsets, the table's slots) | %.2f | %.1f |\n", devoff,
         expert_flops / (devoff / 1e3) / 1e12);
  printf("grouped GEMM rate / dense GEMM rate (same FLOPs) = %.1f%%\n", 100.0 * dense / grouped);
  printf("routed-expert FLOPs %.3f TFLOP; layer %.3f TFLOP; layer rate / dense expert-GEMM rate = %.1f%%\n",
         expert_flops / 1e12, layer_flops / 1e12, 100.0 * (layer_flops / (fwd + bwd)) / (expert_flops / dense));
  printf("MFU of the layer %.1f%% of %.1f TFLOP/s\n",
         100.0 * layer_flops / ((fwd + bwd) / 1e3) / (GPU_PEAK_BF16_TFLOPS * 1e12), GPU_PEAK_BF16_TFLOPS);
  printf("memory: %.2f GiB allocated by the bench, %.2f GiB in use on the device\n",
         (double)m.e.allocated / (double)(1u << 30), gpu_used_gib());
  printf(
      "GPU_MOE_SUMMARY fwd_bwd_ms=%.2f grouped_ms=%.2f dense_ms=%.2f grouped_vs_dense=%.1f%% device_offset_ms=%.2f\n",
      fwd + bwd, grouped, dense, 100.0 * dense / grouped, devoff);
  gpu_env_close(&m.e);
  return 0;
}
