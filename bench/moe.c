// MoE layer benchmark: one MoE FFN layer forward and backward (router, grouped routed experts, random
// routing inputs) at CPU shapes, against dense GEMMs of the same active FLOPs, and prints one table.
//
// Active FLOPs of one forward+backward: the routed experts run 3 GEMMs of (T·k rows) × H × I forward and 6
// backward (dx and dw of each): 18·T·k·H·I; the router 3 GEMMs of T × H × E: 6·T·H·E. The dense reference
// runs the same 9 expert-GEMM shapes as if every one of the T·k rows went to a single expert (one weight per
// projection, no dispatch, no SwiGLU): the rate the grouped path would reach with perfect batching.
// Usage: bench_moe [--threads N] [--reps N] [--tokens T] [--shared S]
#include <cblas.h>
#undef I // complex.h's, from cblas.h: I is the expert width here
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "moe/ffn_moe.h"
#include "moe/params.h"

enum { HID = 1024, EXPERTS = 64, TOPK = 6, WIDTH = 256, TOKENS = 2048, ROWS_PER_SAMPLE = 256 };

typedef struct {
  df_ctx *ctx;
  df_ffn *ffn;
  int64_t T, H;
  float *x, *y, *dy, *dx, *saved, *scratch;
} moe_state;

static df_status moe_fwd(void *s, df_error *err) {
  moe_state *m = s;
  df_tensor x = df_f32(m->x, m->T, m->H), y = df_f32(m->y, m->T, m->H);
  return m->ffn->vt->forward(m->ffn, m->ctx, &x, &y, m->saved, m->scratch, err);
}

static df_status moe_bwd(void *s, df_error *err) {
  moe_state *m = s;
  df_tensor x = df_f32(m->x, m->T, m->H), dy = df_f32(m->dy, m->T, m->H), dx = df_f32(m->dx, m->T, m->H);
  return m->ffn->vt->backward(m->ffn, m->ctx, &x, &dy, &dx, false, m->saved, m->scratch, err);
}

static df_status moe_fwd_bwd(void *s, df_error *err) {
  DF_TRY(moe_fwd(s, err));
  return moe_bwd(s, err);
}

// The dense reference: forward g = x·w1ᵀ, u = x·w3ᵀ, o = a·w2ᵀ; backward the dx and dw of each.
typedef struct {
  df_ctx *ctx;
  int64_t R, H, I;
  float *x, *w1, *w3, *w2, *g1, *g3, *g2, *g, *u, *a, *o, *dg, *dx;
} dense_state;

static df_status dense_fwd_bwd(void *s, df_error *err) {
  dense_state *d = s;
  df_tensor x = df_f32(d->x, d->R, d->H), o = df_f32(d->o, d->R, d->H), dx = df_f32(d->dx, d->R, d->H);
  df_tensor g = df_f32(d->g, d->R, d->I), u = df_f32(d->u, d->R, d->I), a = df_f32(d->a, d->R, d->I);
  df_tensor dg = df_f32(d->dg, d->R, d->I);
  df_tensor w1 = df_f32(d->w1, d->I, d->H), w3 = df_f32(d->w3, d->I, d->H), w2 = df_f32(d->w2, d->H, d->I);
  df_tensor g1 = df_f32(d->g1, d->I, d->H), g3 = df_f32(d->g3, d->I, d->H), g2 = df_f32(d->g2, d->H, d->I);
  DF_TRY(df_linear_forward(d->ctx, &x, &w1, NULL, &g, err));
  DF_TRY(df_linear_forward(d->ctx, &x, &w3, NULL, &u, err));
  DF_TRY(df_linear_forward(d->ctx, &a, &w2, NULL, &o, err));
  DF_TRY(df_linear_backward(d->ctx, &o, &a, &w2, &dg, false, &g2, NULL, err));
  DF_TRY(df_linear_backward(d->ctx, &dg, &x, &w1, &dx, false, &g1, NULL, err));
  return df_linear_backward(d->ctx, &dg, &x, &w3, &dx, true, &g3, NULL, err);
}

typedef struct {
  int threads, reps;
  int64_t tokens, shared;
} opts;

static int parse(int argc, char **argv, opts *o) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      o->threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      o->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
      o->tokens = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--shared") && i + 1 < argc)
      o->shared = atoll(argv[++i]);
    else
      return 0;
  }
  return o->threads >= 0 && o->reps >= 1 && o->tokens > 0 && o->tokens % ROWS_PER_SAMPLE == 0 && o->shared >= 0;
}

// Rates from the best time (the machine may be shared; the median is printed beside it).
static void row(const char *op, const bench_timing *t, double flops, double dense_rate) {
  const double rate = flops / t->best_s * 1e-9;
  printf("%-30s %9.2f %9.2f %9.2f %9.1f %9.2f\n", op, t->median_s * 1e3, t->best_s * 1e3, flops * 1e-9, rate,
         dense_rate > 0 ? rate / dense_rate : 1.0);
}

int main(int argc, char **argv) {
  opts o = {.threads = 0, .reps = 5, .tokens = TOKENS, .shared = 0};
  if (!parse(argc, argv, &o)) {
    fprintf(stderr, "usage: %s [--threads N] [--reps N] [--tokens T (multiple of %d)] [--shared S]\n", argv[0],
            ROWS_PER_SAMPLE);
    return 2;
  }
  if (o.threads > 0) omp_set_num_threads(o.threads), openblas_set_num_threads(o.threads);
  df_error err = {0};
  df_ctx *ctx = NULL;
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = o.threads};
  if (df_ctx_create(&co, &ctx, &err) != DF_OK) return df_error_print(&err), 1;

  const int64_t T = o.tokens, H = HID, E = EXPERTS, k = TOPK, I = WIDTH, Tk = T * k;
  const df_moe_config m = {.preset = "bench",
                           .n_routed_experts = E,
                           .num_experts_per_tok = k,
                           .moe_intermediate_size = I,
                           .n_shared_experts = o.shared > 0,
                           .shared_expert_intermediate_size = o.shared > 0 ? o.shared : I,
                           .scoring_func = DF_MOE_SCORE_SOFTMAX,
                           .norm_topk_prob = true,
                           .routed_scaling_factor = 1.0,
                           .n_group = 1,
                           .topk_group = 1,
                           .shared_expert_gate = DF_MOE_SHARED_GATE_SIGMOID,
                           .aux_loss_coeff = 0.001,
                           .router_center = DF_MOE_CENTER_SAMPLE,
                           .router_center_momentum = 0.99};
  df_params *p = NULL;
  moe_state ms = {.ctx = ctx, .T = T, .H = H};
  if (df_params_new(&p, &err) || df_ffn_moe_create_from(&m, H, 0, p, &ms.ffn, &err) || df_params_finalize(p, &err))
    return df_error_print(&err), 1;
  float *weights = bench_alloc(df_params_numel(p)), *grads = bench_alloc(df_params_numel(p));
  bench_fill(weights, df_params_numel(p), 1, -0.03f, 0.03f);
  if (ms.ffn->vt->bind(ms.ffn, p, weights, grads, DF_DEV_CPU, &err)) return df_error_print(&err), 1;
  df_moe_layer_set_rows_per_sample(df_ffn_moe_layer(ms.ffn), ROWS_PER_SAMPLE);
  ms.x = bench_alloc(T * H), ms.y = bench_alloc(T * H), ms.dy = bench_alloc(T * H), ms.dx = bench_alloc(T * H);
  bench_fill(ms.x, T * H, 2, -1.0f, 1.0f);
  bench_fill(ms.dy, T * H, 3, -1.0f, 1.0f);
  ms.saved = bench_alloc(ms.ffn->vt->saved_elems(ms.ffn, T));
  ms.scratch = bench_alloc(ms.ffn->vt->scratch_elems(ms.ffn, T));

  dense_state ds = {.ctx = ctx, .R = Tk, .H = H, .I = I};
  float **bufs[] = {&ds.x, &ds.o, &ds.dx};
  for (size_t i = 0; i < 3; i++) *bufs[i] = bench_alloc(Tk * H);
  float **ibufs[] = {&ds.g, &ds.u, &ds.a, &ds.dg};
  for (size_t i = 0; i < 4; i++) *ibufs[i] = bench_alloc(Tk * I);
  float **wbufs[] = {&ds.w1, &ds.w3, &ds.w2, &ds.g1, &ds.g3, &ds.g2};
  for (size_t i = 0; i < 6; i++) *wbufs[i] = bench_alloc(H * I);
  bench_fill(ds.x, Tk * H, 4, -1.0f, 1.0f);
  bench_fill(ds.a, Tk * I, 5, -1.0f, 1.0f);
  bench_fill(ds.w1, H * I, 6, -0.03f, 0.03f);
  bench_fill(ds.w3, H * I, 7, -0.03f, 0.03f);
  bench_fill(ds.w2, H * I, 8, -0.03f, 0.03f);

  const bench_plan plan = {.warmup = 1, .min_reps = o.reps, .max_reps = 4 * o.reps, .budget_s = 20.0};
  const double expert_flops = 18.0 * (double)Tk * H * I, router_flops = 6.0 * (double)T * H * E;
  const double shared_flops = o.shared > 0 ? 18.0 * (double)T * H * o.shared + 6.0 * (double)T * H : 0.0;
  const double total = expert_flops + router_flops + shared_flops;
  const bench_timing td = bench_time(dense_fwd_bwd, &ds, &plan, &err);
  if (td.st) return df_error_print(&err), 1;
  const bench_timing tf = bench_time(moe_fwd, &ms, &plan, &err);
  if (tf.st) return df_error_print(&err), 1;
  const bench_timing tb = bench_time(moe_bwd, &ms, &plan, &err); // on the last forward's saved state
  if (tb.st) return df_error_print(&err), 1;
  const bench_timing tfb = bench_time(moe_fwd_bwd, &ms, &plan, &err);
  if (tfb.st) return df_error_print(&err), 1;
  const double dense_rate = expert_flops / td.best_s * 1e-9;

  df_moe_metrics mt = {0};
  df_moe_layer_metrics(df_ffn_moe_layer(ms.ffn), &mt);
  printf("# bench_moe: one MoE layer, H=%lld E=%lld k=%lld I=%lld T=%lld (samples of %d rows), shared %lld; "
         "%d threads; median of >= %d reps\n",
         (long long)H, (long long)E, (long long)k, (long long)I, (long long)T, ROWS_PER_SAMPLE, (long long)o.shared,
         omp_get_max_threads(), o.reps);
  printf("# routing: load_max_ratio %.2f, load_min_ratio %.2f, unused %.3f\n", mt.load_max_ratio, mt.load_min_ratio,
         mt.experts_unused_frac);
  printf("# dense = the 9 expert GEMM shapes on all T·k = %lld rows with one weight (18·Tk·H·I FLOPs)\n",
         (long long)Tk);
  printf("%-30s %9s %9s %9s %9s %9s\n", "op", "median ms", "best ms", "GFLOP", "GFLOP/s", "vs dense");
  row("dense fwd+bwd (same FLOPs)", &td, expert_flops, dense_rate);
  row("moe forward", &tf, total / 3.0, dense_rate);
  row("moe backward", &tb, total * 2.0 / 3.0, dense_rate);
  row("moe forward+backward", &tfb, total, dense_rate);

  ms.ffn->vt->destroy(ms.ffn);
  df_params_free(p);
  free(weights), free(grads), free(ms.x), free(ms.y), free(ms.dy), free(ms.dx), free(ms.saved), free(ms.scratch);
  for (size_t i = 0; i < 3; i++) free(*bufs[i]);
  for (size_t i = 0; i < 4; i++) free(*ibufs[i]);
  for (size_t i = 0; i < 6; i++) free(*wbufs[i]);
  df_ctx_destroy(ctx);
  return 0;
}
