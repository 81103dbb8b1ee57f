// Op benchmark: times every CPU op at draft-realistic shapes and prints one table. GEMM-based ops are
// compared with a measured sgemm rate; attention and the fused LM-head CE with the time their implied FLOPs
// would take at that rate (goal: within 2x). Memory-bound ops report GB/s.
// Usage: bench_ops [--threads N] [--reps N] [--quick]
#include "kernels/ops.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"

// Draft shapes (H, S, V, I of the docs; cblas.h's complex.h owns `I`): hidden HID, query/kv heads of HD,
// NANCH anchors × block BS query rows, context CTX, vocab VOCAB, MLP width MLP. ROWS = NANCH·BS is also the
// row count of every per-token op.
enum {
  HID = 1024,
  NH = 8,
  NKV = 2,
  HD = 128,
  NANCH = 64,
  BS = 16,
  CTX = 1024,
  VOCAB = 32000,
  MLP = 3072,
  ROWS = NANCH * BS
};
#define ADAMW_NUMEL ((int64_t)1 << 24) // ~ one HID=1024 draft layer + fc, as fp32 masters
#define NORM_BUFS   8                  // the norm runs over a list of per-tensor gradient buffers

typedef struct {
  int threads, reps;
  bool quick;
} bench_opts;

typedef enum {
  ROW_GEMM,    // rate in GFLOP/s and the fraction of the sgemm rate
  ROW_IMPLIED, // implied FLOPs, their time at the sgemm rate and our time's ratio to it
  ROW_BYTES,   // GB/s
} row_kind;

typedef struct {
  char op[40], shape[40];
  row_kind kind;
  double amount; // FLOPs (ROW_GEMM, ROW_IMPLIED) or bytes moved (ROW_BYTES)
  bench_timing t;
  char error[800]; // when t.st != DF_OK
} bench_row;

enum { MAX_ROWS = 64 };

// Rows are collected and printed at the end, against the best sgemm rate seen (measured first and last: on a
// shared machine one measurement can land in a busy moment).
typedef struct {
  df_ctx *ctx;
  bench_plan plan;
  double sgemm_flops[2]; // measured sgemm rate at the start and the end, flop/s
  bench_row rows[MAX_ROWS];
  int nrows;
} bench_env;

static void print_header(const bench_opts *o, const bench_env *env) {
  const char *coretype = getenv("OPENBLAS_CORETYPE");
  printf("# bench_ops: %d threads (omp_get_max_threads); time = median of "
         "%d..%d reps after %d warm-up\n",
         omp_get_max_threads(), env->plan.min_reps, env->plan.max_reps, env->plan.warmup);
  printf("# OpenBLAS: %s; core %s; OPENBLAS_CORETYPE=%s\n", openblas_get_config(), openblas_get_corename(),
         coretype ? coretype : "(unset)");
  printf("# shapes: H=%d, %d q heads / %d kv heads of %d, %d anchors x block "
         "%d = %d query rows, S=%d, V=%d, I=%d\n",
         HID, NH, NKV, HD, NANCH, BS, ROWS, CTX, VOCAB, MLP);
  printf("# sgemm 2048^3: %.1f GFLOP/s at the start, %.1f at the end; %%peak "
         "and ratio use the best%s\n",
         env->sgemm_flops[0] / 1e9, env->sgemm_flops[1] / 1e9, o->quick ? " (--quick: timings are rough)" : "");
  printf("%-28s %-30s %4s %10s %14s %6s %8s %9s %6s\n", "op", "shape", "reps", "ms", "rate", "%peak", "GFLOP",
         "ms@sgemm", "ratio");
}

static void print_row(const bench_row *r, double peak) {
  printf("%-28s %-30s ", r->op, r->shape);
  if (r->t.st != DF_OK) {
    printf("%s\n", r->error);
    return;
  }
  double s = r->t.median_s;
  printf("%4d %10.3f ", r->t.reps, 1e3 * s);
  if (r->kind == ROW_BYTES) {
    printf("%9.1f GB/s\n", r->amount / s / 1e9);
    return;
  }
  printf("%8.1f GF/s %5.0f%% ", r->amount / s / 1e9, 100.0 * r->amount / s / peak);
  if (r->kind == ROW_GEMM) {
    printf("\n");
    return;
  }
  double at_peak = r->amount / peak;
  printf("%8.2f %9.3f %5.2fx\n", r->amount / 1e9, 1e3 * at_peak, s / at_peak);
}

static void print_table(const bench_opts *o, const bench_env *env) {
  double peak = env->sgemm_flops[0] > env->sgemm_flops[1] ? env->sgemm_flops[0] : env->sgemm_flops[1];
  print_header(o, env);
  for (int i = 0; i < env->nrows; i++) print_row(&env->rows[i], peak);
}

// Times fn and records a row (a failing op is recorded with its error, and the run goes on).
static void run_row(bench_env *env, const char *op, const char *shape, bench_fn fn, void *state, row_kind kind,
                    double amount) {
  if (env->nrows == MAX_ROWS) return;
  bench_row *r = &env->rows[env->nrows++];
  df_error err = {0};
  snprintf(r->op, sizeof r->op, "%s", op);
  snprintf(r->shape, sizeof r->shape, "%s", shape);
  r->kind = kind;
  r->amount = amount;
  // Progress on a terminal only: the table itself comes at the end.
  if (isatty(STDERR_FILENO)) fprintf(stderr, "\r%-60s", op);
  r->t = bench_time(fn, state, &env->plan, &err);
  if (r->t.st != DF_OK)
    snprintf(r->error, sizeof r->error, "error (%s): %s [%s]", df_status_name(r->t.st), err.msg, err.where);
}

// ---- sgemm peak ----------------------------------------------------------------------------------
typedef struct {
  int n;
  float *a, *b, *c;
} sgemm_state;

static df_status sgemm_call(void *p, df_error *err) {
  (void)err;
  sgemm_state *s = p;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->n, s->n, s->n, 1.0f, s->a, s->n, s->b, s->n, 0.0f, s->c,
              s->n);
  return DF_OK;
}

// The best of a few square sgemms (flop/s): the rate every GEMM-bound op is compared with.
static double measure_sgemm(bool quick) {
  sgemm_state s = {.n = 2048};
  int64_t nn = (int64_t)s.n * s.n;
  s.a = bench_alloc(nn), s.b = bench_alloc(nn), s.c = bench_alloc(nn);
  bench_fill(s.a, nn, 1, -1, 1);
  bench_fill(s.b, nn, 2, -1, 1);
  bench_plan plan = {.warmup = 1, .min_reps = quick ? 1 : 3, .max_reps = quick ? 1 : 5, .budget_s = 1.0};
  df_error err = {0};
  bench_timing t = bench_time(sgemm_call, &s, &plan, &err);
  free(s.a), free(s.b), free(s.c);
  return 2.0 * s.n * (double)s.n * s.n / t.best_s;
}

// ---- linear --------------------------------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_tensor x, w, y, dy, dx, dw;
} linear_state;

static df_status linear_fwd(void *p, df_error *err) {
  linear_state *s = p;
  return df_linear_forward(s->ctx, &s->x, &s->w, NULL, &s->y, err);
}

static df_status linear_bwd(void *p, df_error *err) {
  linear_state *s = p;
  return df_linear_backward(s->ctx, &s->dy, &s->x, &s->w, &s->dx, false, &s->dw, NULL, err);
}

// y[M, N] = x[M, K] · w[N, K]ᵀ: forward 2MNK flops, backward (dx and dw) 4MNK.
static void bench_linear(bench_env *env, const char *name, int m, int k, int n) {
  float *x = bench_alloc((int64_t)m * k), *w = bench_alloc((int64_t)n * k), *y = bench_alloc((int64_t)m * n);
  float *dy = bench_alloc((int64_t)m * n), *dx = bench_alloc((int64_t)m * k), *dw = bench_alloc((int64_t)n * k);
  bench_fill(x, (int64_t)m * k, 3, -1, 1);
  bench_fill(w, (int64_t)n * k, 4, -0.05f, 0.05f);
  bench_fill(dy, (int64_t)m * n, 5, -1, 1);
  linear_state s = {env->ctx,         df_f32(x, m, k),  df_f32(w, n, k), df_f32(y, m, n),
                    df_f32(dy, m, n), df_f32(dx, m, k), df_f32(dw, n, k)};
  char op[64], shape[64];
  snprintf(shape, sizeof shape, "[%d,%d]x[%d,%d]^T", m, k, n, k);
  double flops = 2.0 * m * (double)n * k;
  snprintf(op, sizeof op, "linear fwd %s", name);
  run_row(env, op, shape, linear_fwd, &s, ROW_GEMM, flops);
  snprintf(op, sizeof op, "linear bwd %s", name);
  run_row(env, op, shape, linear_bwd, &s, ROW_GEMM, 2 * flops);
  free(x), free(w), free(y), free(dy), free(dx), free(dw);
}

// ---- block attention -----------------------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_block_attn_desc desc;
  df_tensor q, k, v, anchors, keep, out, lse, dout, dq, dk, dv;
} attn_state;

static df_status attn_fwd(void *p, df_error *err) {
  attn_state *s = p;
  return df_block_attn_forward(s->ctx, &s->desc, &s->q, &s->k, &s->v, &s->anchors, &s->keep, &s->out, &s->lse, err);
}

static df_status attn_fwd_bwd(void *p, df_error *err) {
  attn_state *s = p;
  DF_TRY(attn_fwd(p, err));
  return df_block_attn_backward(s->ctx, &s->desc, &s->q, &s->k, &s->v, &s->anchors, &s->keep, &s->out, &s->lse,
                                &s->dout, &s->dq, &s->dk, &s->dv, err);
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

// Keys each query sees under ops.h's mask, summed over all queries (the attention FLOP count's factor).
static double attn_visible_keys(const int32_t *anchors, int64_t window) {
  double sum = 0;
  for (int n = 0; n < NANCH; n++)
    for (int o = 0; o < BS; o++) {
      int64_t a = anchors[n], lo = window > 0 ? a + o - (window - 1) : 0;
      sum += (double)(a - (lo > 0 ? lo : 0)) + (window > 0 ? o + 1 : BS);
    }
  return sum;
}

static void bench_attention_case(bench_env *env, attn_state *s, const int32_t *anchors, int64_t window) {
  s->desc.window = window;
  double fwd = 4.0 * HD * NH * attn_visible_keys(anchors, window);
  char op[64], shape[64];
  const char *mask = window > 0 ? "window 256" : "full";
  snprintf(shape, sizeof shape, "q[%d,%d,%d] kv[%d,%d,%d]", ROWS, NH, HD, CTX + ROWS, NKV, HD);
  snprintf(op, sizeof op, "attn fwd %s", mask);
  run_row(env, op, shape, attn_fwd, s, ROW_IMPLIED, fwd);
  snprintf(op, sizeof op, "attn fwd+bwd %s", mask);
  run_row(env, op, shape, attn_fwd_bwd, s, ROW_IMPLIED, 3.5 * fwd);
}

// One sample: N anchors uniform in [0, CTX−2], sorted, all kept.
static void bench_attention(bench_env *env) {
  const int64_t nq = (int64_t)ROWS * NH * HD, nkv = (int64_t)(CTX + ROWS) * NKV * HD;
  float *q = bench_alloc(nq), *k = bench_alloc(nkv), *v = bench_alloc(nkv), *out = bench_alloc(nq);
  float *lse = bench_alloc((int64_t)NH * ROWS), *dout = bench_alloc(nq), *dq = bench_alloc(nq);
  float *dk = bench_alloc(nkv), *dv = bench_alloc(nkv), u[NANCH];
  int32_t anchors[NANCH];
  uint8_t keep[NANCH];
  bench_fill(q, nq, 6, -1, 1);
  bench_fill(k, nkv, 7, -1, 1);
  bench_fill(v, nkv, 8, -1, 1);
  bench_fill(dout, nq, 9, -1, 1);
  bench_fill(u, NANCH, 10, 0, 1);
  for (int n = 0; n < NANCH; n++) anchors[n] = (int32_t)(u[n] * (CTX - 1)), keep[n] = 1;
  qsort(anchors, NANCH, sizeof anchors[0], cmp_i32);
  attn_state s = {
      .ctx = env->ctx,
      .desc = {.context_len = CTX, .block_size = BS, .scale = 1.0f / sqrtf((float)HD)},
      .q = df_f32(q, 1, ROWS, NH, HD),
      .k = df_f32(k, 1, CTX + ROWS, NKV, HD),
      .v = df_f32(v, 1, CTX + ROWS, NKV, HD),
      .anchors = df_i32(anchors, 1, NANCH),
      .keep = df_u8(keep, 1, NANCH),
      .out = df_f32(out, 1, ROWS, NH, HD),
      .lse = df_f32(lse, 1, NH, ROWS),
      .dout = df_f32(dout, 1, ROWS, NH, HD),
      .dq = df_f32(dq, 1, ROWS, NH, HD),
      .dk = df_f32(dk, 1, CTX + ROWS, NKV, HD),
      .dv = df_f32(dv, 1, CTX + ROWS, NKV, HD),
  };
  bench_attention_case(env, &s, anchors, 0);
  bench_attention_case(env, &s, anchors, 256);
  free(q), free(k), free(v), free(out), free(lse), free(dout), free(dq), free(dk), free(dv);
}

// ---- fused LM head + CE --------------------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_lmhead_ce_desc desc;
  df_tensor hidden, head, labels, loss, correct, dhidden;
} ce_state;

static df_status ce_fwd(void *p, df_error *err) {
  ce_state *s = p;
  return df_lmhead_ce(s->ctx, &s->desc, &s->hidden, &s->head, &s->labels, NULL, &s->loss, &s->correct, NULL, err);
}

static df_status ce_fwd_bwd(void *p, df_error *err) {
  ce_state *s = p;
  return df_lmhead_ce(s->ctx, &s->desc, &s->hidden, &s->head, &s->labels, NULL, &s->loss, &s->correct, &s->dhidden,
                      err);
}

// Implied FLOPs: the logits GEMM 2·R·V·H, plus the dhidden GEMM 2·R·V·H with the gradient.
static void bench_lmhead_ce(bench_env *env) {
  float *hidden = bench_alloc((int64_t)ROWS * HID), *head = bench_alloc((int64_t)VOCAB * HID),
        *loss = bench_alloc(ROWS);
  float *dhidden = bench_alloc((int64_t)ROWS * HID), u[ROWS];
  int32_t labels[ROWS];
  uint8_t correct[ROWS];
  bench_fill(hidden, (int64_t)ROWS * HID, 11, -1, 1);
  bench_fill(head, (int64_t)VOCAB * HID, 12, -0.05f, 0.05f);
  bench_fill(u, ROWS, 13, 0, 1);
  for (int r = 0; r < ROWS; r++) labels[r] = (int32_t)(u[r] * (VOCAB - 1));
  ce_state s = {env->ctx,
                {.grad_scale = 1.0f / ROWS},
                df_f32(hidden, ROWS, HID),
                df_f32(head, VOCAB, HID),
                df_i32(labels, ROWS),
                df_f32(loss, ROWS),
                df_u8(correct, ROWS),
                df_f32(dhidden, ROWS, HID)};
  const int chunks[2] = {1024, 256};
  double fwd = 2.0 * ROWS * (double)VOCAB * HID;
  char op[64], shape[64];
  snprintf(shape, sizeof shape, "[%d,%d]x[%d,%d]^T", ROWS, HID, VOCAB, HID);
  for (int i = 0; i < 2; i++) {
    s.desc.chunk_rows = chunks[i];
    snprintf(op, sizeof op, "lmhead_ce fwd chunk %d", chunks[i]);
    run_row(env, op, shape, ce_fwd, &s, ROW_IMPLIED, fwd);
    snprintf(op, sizeof op, "lmhead_ce fwd+bwd chunk %d", chunks[i]);
    run_row(env, op, shape, ce_fwd_bwd, &s, ROW_IMPLIED, 2 * fwd);
  }
  free(hidden), free(head), free(loss), free(dhidden);
}

// ---- DSpark losses -------------------------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_tensor p, q, l1, dl1, dp, x, t, loss, dloss, dx;
} dspark_state;

static df_status l1_fwd(void *p, df_error *err) {
  dspark_state *s = p;
  return df_softmax_l1_forward(s->ctx, &s->p, &s->q, &s->l1, err);
}

static df_status l1_bwd(void *p, df_error *err) {
  dspark_state *s = p;
  return df_softmax_l1_backward(s->ctx, &s->p, &s->q, &s->dl1, &s->dp, err);
}

static df_status bce_fwd(void *p, df_error *err) {
  dspark_state *s = p;
  return df_bce_logits_forward(s->ctx, &s->x, &s->t, &s->loss, err);
}

static df_status bce_bwd(void *p, df_error *err) {
  dspark_state *s = p;
  return df_bce_logits_backward(s->ctx, &s->x, &s->t, &s->dloss, &s->dx, err);
}

// softmax L1 over draft and target logits [ROWS, VOCAB]; BCE over one confidence logit per row.
static void bench_dspark(bench_env *env) {
  const int64_t n = (int64_t)ROWS * VOCAB;
  float *p = bench_alloc(n), *q = bench_alloc(n), *dp = bench_alloc(n), *l1 = bench_alloc(ROWS),
        *dl1 = bench_alloc(ROWS);
  float *x = bench_alloc(ROWS), *t = bench_alloc(ROWS), *loss = bench_alloc(ROWS), *dloss = bench_alloc(ROWS),
        *dx = bench_alloc(ROWS);
  bench_fill(p, n, 14, -4, 4);
  bench_fill(q, n, 15, -4, 4);
  bench_fill(dl1, ROWS, 16, 0, 1);
  bench_fill(x, ROWS, 17, -3, 3);
  bench_fill(t, ROWS, 18, 0, 1);
  bench_fill(dloss, ROWS, 19, 0, 1);
  dspark_state s = {env->ctx,           df_f32(p, ROWS, VOCAB),  df_f32(q, ROWS, VOCAB), df_f32(l1, ROWS),
                    df_f32(dl1, ROWS),  df_f32(dp, ROWS, VOCAB), df_f32(x, ROWS),        df_f32(t, ROWS),
                    df_f32(loss, ROWS), df_f32(dloss, ROWS),     df_f32(dx, ROWS)};
  char shape[64];
  snprintf(shape, sizeof shape, "p,q [%d,%d]", ROWS, VOCAB);
  run_row(env, "softmax_l1 fwd", shape, l1_fwd, &s, ROW_BYTES, 2.0 * n * 4);
  run_row(env, "softmax_l1 bwd", shape, l1_bwd, &s, ROW_BYTES, 3.0 * n * 4);
  snprintf(shape, sizeof shape, "[%d]", ROWS);
  run_row(env, "bce_logits fwd", shape, bce_fwd, &s, ROW_BYTES, 3.0 * ROWS * 4);
  run_row(env, "bce_logits bwd", shape, bce_bwd, &s, ROW_BYTES, 4.0 * ROWS * 4);
  free(p), free(q), free(dp), free(l1), free(dl1), free(x), free(t), free(loss), free(dloss), free(dx);
}

// ---- RMSNorm, RoPE, SwiGLU, embedding ------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_tensor x, w, y, rstd, dy, dx, dw;
} rmsnorm_state;

static df_status rmsnorm_fwd(void *p, df_error *err) {
  rmsnorm_state *s = p;
  return df_rmsnorm_forward(s->ctx, &s->x, &s->w, 1e-6f, &s->y, &s->rstd, err);
}

static df_status rmsnorm_bwd(void *p, df_error *err) {
  rmsnorm_state *s = p;
  return df_rmsnorm_backward(s->ctx, &s->dy, &s->x, &s->w, &s->rstd, &s->dx, false, &s->dw, err);
}

// x viewed as [rows, d]: forward reads x, writes y; backward reads dy and x, writes dx.
static void bench_rmsnorm(bench_env *env, const char *name, int rows, int d) {
  const int64_t n = (int64_t)rows * d;
  float *x = bench_alloc(n), *w = bench_alloc(d), *y = bench_alloc(n), *rstd = bench_alloc(rows);
  float *dy = bench_alloc(n), *dx = bench_alloc(n), *dw = bench_alloc(d);
  bench_fill(x, n, 20, -1, 1);
  bench_fill(w, d, 21, 0.5f, 1.5f);
  bench_fill(dy, n, 22, -1, 1);
  rmsnorm_state s = {env->ctx,           df_f32(x, rows, d),  df_f32(w, d),        df_f32(y, rows, d),
                     df_f32(rstd, rows), df_f32(dy, rows, d), df_f32(dx, rows, d), df_f32(dw, d)};
  char op[64], shape[64];
  snprintf(shape, sizeof shape, "[%d,%d]", rows, d);
  snprintf(op, sizeof op, "rmsnorm fwd %s", name);
  run_row(env, op, shape, rmsnorm_fwd, &s, ROW_BYTES, 2.0 * n * 4);
  snprintf(op, sizeof op, "rmsnorm bwd %s", name);
  run_row(env, op, shape, rmsnorm_bwd, &s, ROW_BYTES, 3.0 * n * 4);
  free(x), free(w), free(y), free(rstd), free(dy), free(dx), free(dw);
}

typedef struct {
  df_ctx *ctx;
  df_tensor x, pos, inv_freq, y;
} rope_state;

static df_status rope_fwd(void *p, df_error *err) {
  rope_state *s = p;
  return df_rope_forward(s->ctx, &s->x, &s->pos, &s->inv_freq, 1.0f, &s->y, err);
}

static df_status rope_bwd(void *p, df_error *err) {
  rope_state *s = p;
  return df_rope_backward(s->ctx, &s->x, &s->pos, &s->inv_freq, 1.0f, &s->y, err);
}

// x [T, heads, HD] at block positions anchor + offset: reads x, writes y.
static void bench_rope(bench_env *env, const char *name, int tokens, int heads) {
  const int64_t n = (int64_t)tokens * heads * HD;
  float *x = bench_alloc(n), *y = bench_alloc(n), inv_freq[HD / 2];
  int32_t *pos = malloc(sizeof(int32_t) * (size_t)tokens);
  bench_fill(x, n, 23, -1, 1);
  for (int t = 0; t < tokens; t++) pos[t] = (t / BS) * 13 + t % BS;
  df_rope_default_inv_freq(1e6, HD, inv_freq);
  rope_state s = {env->ctx, df_f32(x, tokens, heads, HD), df_i32(pos, tokens), df_f32(inv_freq, HD / 2),
                  df_f32(y, tokens, heads, HD)};
  char op[64], shape[64];
  snprintf(shape, sizeof shape, "[%d,%d,%d]", tokens, heads, HD);
  snprintf(op, sizeof op, "rope fwd %s", name);
  run_row(env, op, shape, rope_fwd, &s, ROW_BYTES, 2.0 * n * 4);
  snprintf(op, sizeof op, "rope bwd %s", name);
  run_row(env, op, shape, rope_bwd, &s, ROW_BYTES, 2.0 * n * 4);
  free(x), free(y), free(pos);
}

typedef struct {
  df_ctx *ctx;
  df_tensor g, u, h, dh, dg, du;
} swiglu_state;

static df_status swiglu_fwd(void *p, df_error *err) {
  swiglu_state *s = p;
  return df_swiglu_forward(s->ctx, &s->g, &s->u, 0.0f, &s->h, err);
}

static df_status swiglu_bwd(void *p, df_error *err) {
  swiglu_state *s = p;
  return df_swiglu_backward(s->ctx, &s->dh, &s->g, &s->u, 0.0f, &s->dg, &s->du, err);
}

// g, u, h [ROWS, MLP]: forward moves 3 arrays, backward 5.
static void bench_swiglu(bench_env *env) {
  const int64_t n = (int64_t)ROWS * MLP;
  float *g = bench_alloc(n), *u = bench_alloc(n), *h = bench_alloc(n), *dh = bench_alloc(n), *dg = bench_alloc(n),
        *du = bench_alloc(n);
  bench_fill(g, n, 24, -4, 4);
  bench_fill(u, n, 25, -4, 4);
  bench_fill(dh, n, 26, -1, 1);
  swiglu_state s = {env->ctx,
                    df_f32(g, ROWS, MLP),
                    df_f32(u, ROWS, MLP),
                    df_f32(h, ROWS, MLP),
                    df_f32(dh, ROWS, MLP),
                    df_f32(dg, ROWS, MLP),
                    df_f32(du, ROWS, MLP)};
  char shape[64];
  snprintf(shape, sizeof shape, "[%d,%d]", ROWS, MLP);
  run_row(env, "swiglu fwd", shape, swiglu_fwd, &s, ROW_BYTES, 3.0 * n * 4);
  run_row(env, "swiglu bwd", shape, swiglu_bwd, &s, ROW_BYTES, 5.0 * n * 4);
  free(g), free(u), free(h), free(dh), free(dg), free(du);
}

typedef struct {
  df_ctx *ctx;
  df_tensor table, ids, out;
} embedding_state;

static df_status embedding_fwd(void *p, df_error *err) {
  embedding_state *s = p;
  return df_embedding_forward(s->ctx, &s->table, &s->ids, &s->out, err);
}

static df_status embedding_bwd(void *p, df_error *err) {
  embedding_state *s = p;
  return df_embedding_backward(s->ctx, &s->out, &s->ids, &s->table, err);
}

// ROWS ids into a [VOCAB, HID] table: forward reads and writes ROWS·HID floats; backward reads dout and
// updates ROWS rows.
static void bench_embedding(bench_env *env) {
  float *table = bench_alloc((int64_t)VOCAB * HID), *out = bench_alloc((int64_t)ROWS * HID), u[ROWS];
  int32_t ids[ROWS];
  bench_fill(table, (int64_t)VOCAB * HID, 27, -1, 1);
  bench_fill(u, ROWS, 28, 0, 1);
  for (int r = 0; r < ROWS; r++) ids[r] = (int32_t)(u[r] * (VOCAB - 1));
  embedding_state s = {env->ctx, df_f32(table, VOCAB, HID), df_i32(ids, ROWS), df_f32(out, ROWS, HID)};
  char shape[64];
  snprintf(shape, sizeof shape, "ids[%d] table[%d,%d]", ROWS, VOCAB, HID);
  run_row(env, "embedding fwd", shape, embedding_fwd, &s, ROW_BYTES, 2.0 * ROWS * HID * 4);
  run_row(env, "embedding bwd", shape, embedding_bwd, &s, ROW_BYTES, 3.0 * ROWS * HID * 4);
  free(table), free(out);
}

// ---- optimizer -----------------------------------------------------------------------------------
typedef struct {
  df_ctx *ctx;
  df_tensor p, g, m, v, bufs[NORM_BUFS];
  df_adamw_hparams hp;
  double norm;
} optim_state;

static df_status adamw(void *p, df_error *err) {
  optim_state *s = p;
  return df_adamw_step(s->ctx, &s->p, &s->g, &s->m, &s->v, &s->hp, err);
}

static df_status global_norm(void *p, df_error *err) {
  optim_state *s = p;
  return df_global_norm(s->ctx, s->bufs, NORM_BUFS, &s->norm, err);
}

// coef 0.999 per call: repeated calls keep the grads far from denormals.
static df_status clip(void *p, df_error *err) {
  optim_state *s = p;
  double coef;
  return df_clip_by_norm(s->ctx, s->bufs, NORM_BUFS, 1.0, 0.999, &coef, err);
}

// AdamW reads p, g, m, v and writes p, m, v (28 B/element); the norm reads the grads, clip rewrites them.
static void bench_optim(bench_env *env) {
  const int64_t n = ADAMW_NUMEL, per = n / NORM_BUFS;
  float *p = bench_alloc(n), *g = bench_alloc(n), *m = bench_alloc(n), *v = bench_alloc(n);
  bench_fill(p, n, 29, -1, 1);
  bench_fill(g, n, 30, -1e-3f, 1e-3f);
  optim_state s = {.ctx = env->ctx,
                   .p = df_f32(p, n),
                   .g = df_f32(g, n),
                   .m = df_f32(m, n),
                   .v = df_f32(v, n),
                   .hp = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 100}};
  for (int b = 0; b < NORM_BUFS; b++) s.bufs[b] = df_f32(g + b * per, per);
  char shape[64];
  snprintf(shape, sizeof shape, "%lld params", (long long)n);
  run_row(env, "adamw_step", shape, adamw, &s, ROW_BYTES, 28.0 * n);
  snprintf(shape, sizeof shape, "%d bufs x %lld", NORM_BUFS, (long long)per);
  run_row(env, "global_norm", shape, global_norm, &s, ROW_BYTES, 4.0 * n);
  run_row(env, "clip_by_norm (clipping)", shape, clip, &s, ROW_BYTES, 8.0 * n);
  free(p), free(g), free(m), free(v);
}

// ---- main ----------------------------------------------------------------------------------------
static int usage(const char *prog) {
  fprintf(stderr, "usage: %s [--threads N] [--reps N] [--quick]\n", prog);
  return 2;
}

static bool parse_opts(int argc, char **argv, bench_opts *o) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick"))
      o->quick = true;
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      o->threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      o->reps = atoi(argv[++i]);
    else
      return false;
  }
  return o->threads >= 0 && o->reps >= 1;
}

int main(int argc, char **argv) {
  bench_opts o = {.threads = 0, .reps = 5};
  if (!parse_opts(argc, argv, &o)) return usage(argv[0]);
  if (o.quick) o.reps = 1;
  if (o.threads > 0) omp_set_num_threads(o.threads), openblas_set_num_threads(o.threads);
  bench_env env = {
      .plan = {.warmup = o.quick ? 0 : 1, .min_reps = o.reps < 3 ? o.reps : 3, .max_reps = o.reps, .budget_s = 1.0}};
  df_error err = {0};
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = o.threads};
  if (df_ctx_create(&co, &env.ctx, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  env.sgemm_flops[0] = measure_sgemm(o.quick);
  bench_linear(&env, "q_proj", ROWS, HID, HID);
  bench_linear(&env, "k_proj", ROWS, HID, NKV * HD);
  bench_linear(&env, "gate/up", ROWS, HID, MLP);
  bench_linear(&env, "down/fc", ROWS, MLP, HID);
  bench_attention(&env);
  bench_lmhead_ce(&env);
  bench_dspark(&env);
  bench_rmsnorm(&env, "hidden", ROWS, HID);
  bench_rmsnorm(&env, "q_norm", ROWS * NH, HD);
  bench_rope(&env, "q", ROWS, NH);
  bench_rope(&env, "k", CTX + ROWS, NKV);
  bench_swiglu(&env);
  bench_embedding(&env);
  bench_optim(&env);
  env.sgemm_flops[1] = measure_sgemm(o.quick);
  if (isatty(STDERR_FILENO)) fprintf(stderr, "\r%-60s\r", "");
  print_table(&o, &env);
  df_ctx_destroy(env.ctx);
  return 0;
}
