// GPU benchmark of one DFlash training step at the Qwen3-8B draft shape (configs/qwen3-8b-dflash.json: 5 layers,
// H 4096, I 12288, 32/8 heads × 128, V 151936, 5 target layers; S 3072 context, 512 anchors × 16, batch 1), bf16
// storage with fp32 masters, moments and weight gradients. The step is composed from the CUDA launchers in the op
// order of modeling/draft_layer.c (it does not go through the trainer, which reaches the GPU only once the op
// table is wired): context fc + hidden_norm, per layer input norm → q/k/v over [context ; block] → q/k norm →
// RoPE → block attention → o_proj + residual → post norm → fused gate/up → SwiGLU → down + residual, final norm,
// the chunked LM head + CE; the backward of all of it; the global norm and one fused AdamW.
//
// FLOPs (model FLOPs, no recompute): every trainable GEMM 2·M·N·K forward and twice that backward (dgrad +
// wgrad; the fc projector has no dgrad: its input is data); the frozen LM head forward + dgrad; attention counted
// AFTER block sparsity: 4·hd FLOPs per visible (query, key) pair per head forward and 8·hd backward, the visible
// pairs counted exactly from the anchors. MFU = FLOPs / time against 989.4 TFLOP/s (H200 dense bf16) and against
// the ≈790 TFLOP/s of an 8192³ bf16 GEMM on the workplace's H200 (its notes; not measured by this project).
// Usage: bench_gpu_step [--steps N] [--anchors N] [--context S]
#include <math.h>
#include <stdint.h>

#include "bench/gpu_util.h"
#include "kernels/ops.h"

enum { L = 5, H = 4096, I = 12288, NH = 32, NKV = 8, HD = 128, V = 151936, KT = 5, BS = 16 };
#define QD  (NH * HD)
#define KVD (NKV * HD)

typedef struct {
  int64_t in_norm, q, k, v, o, q_norm, k_norm, post_norm, w13, w2;
} layer_off;

typedef struct {
  int64_t fc, hidden_norm, norm, total;
  layer_off l[L];
  int64_t decay_spans[64][2];
  uint8_t decay_flag[64];
  int nspan;
} layout;

static int64_t place(layout *p, int64_t n, int decay) {
  const int64_t o = p->total;
  p->decay_spans[p->nspan][0] = o, p->decay_spans[p->nspan][1] = n, p->decay_flag[p->nspan++] = (uint8_t)decay;
  p->total += (n + 63) / 64 * 64; // 128-byte aligned bf16 views
  return o;
}

static layout make_layout(void) {
  layout p;
  memset(&p, 0, sizeof p);
  p.fc = place(&p, (int64_t)H * KT * H, 1);
  p.hidden_norm = place(&p, H, 0);
  for (int i = 0; i < L; i++) {
    layer_off *o = &p.l[i];
    o->in_norm = place(&p, H, 0), o->q = place(&p, (int64_t)QD * H, 1), o->k = place(&p, (int64_t)KVD * H, 1);
    o->v = place(&p, (int64_t)KVD * H, 1), o->o = place(&p, (int64_t)H * QD, 1), o->q_norm = place(&p, HD, 0);
    o->k_norm = place(&p, HD, 0), o->post_norm = place(&p, H, 0), o->w13 = place(&p, (int64_t)2 * I * H, 1);
    o->w2 = place(&p, (int64_t)H * I, 1);
  }
  p.norm = place(&p, H, 0);
  return p;
}

typedef struct {
  void *x, *q_raw, *q, *k_raw, *k, *v, *attn, *h_mid, *y, *gu, *act, *h_out;
  float *rstd_in, *q_rstd, *k_rstd, *lse, *rstd_post;
} layer_acts;

typedef struct {
  gpu_env e;
  layout lay;
  int64_t S, N, Q, KVn;
  void *P;              // bf16 params
  float *G, *M, *m, *v; // fp32 grads, masters, moments
  void *target, *embed, *head, *ctx_raw, *ctx, *h0, *hf;
  float *rstd_ctx, *rstd_f;
  int32_t *ids, *pos_q, *pos_kv, *anchors, *labels;
  uint8_t *keep, *correct;
  float *inv_freq, *loss, *grad_scale;
  double *norm;
  layer_acts a[L];
  // backward scratch
  void *dh[2], *dact, *dgu, *dy, *dattn, *dq, *dk, *dv, *dctx_raw;
  float *dx_f, *dctx;
  void *ws_attn, *ws_rms, *ws_ce, *ws_norm;
  df_cu_optim_plan plan;
} bench;

static void *P(bench *b, int64_t off) { return (uint16_t *)b->P + off; }
static float *G(bench *b, int64_t off) { return b->G + off; }

static df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                            const void *B, int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g;
  memset(&g, 0, sizeof g);
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

static void run_gemm(bench *b, df_cu_gemm_args g) { GPU_TRY(df_cu_gemm(b->e.g, b->e.s, &g, &err_)); }

// y [rows, N] = x [rows, K] · W[N, K]ᵀ (+ residual C when not NULL), all bf16.
static void linear(bench *b, const void *x, int64_t rows, int64_t K, const void *W, int64_t N, void *y,
                   const void *residual) {
  df_cu_gemm_args g = gemm(false, true, rows, N, K, x, K, W, K, DF_BF16, y, N, DF_BF16, residual ? 1.0f : 0.0f);
  g.C = residual, g.ldc = N;
  run_gemm(b, g);
}

// dx [rows, K] (= or +=, dt) = dy [rows, N] · W [N, K]; dW [N, K] (fp32) += dyᵀ · x.
static void linear_bwd(bench *b, const void *dy, const void *x, int64_t rows, int64_t K, const void *W, int64_t N,
                       void *dx, df_dtype dx_dt, bool acc, float *dW) {
  if (dx) run_gemm(b, gemm(false, false, rows, K, N, dy, N, W, K, DF_BF16, dx, K, dx_dt, acc ? 1.0f : 0.0f));
  if (dW) run_gemm(b, gemm(true, false, N, K, rows, dy, N, x, K, DF_BF16, dW, K, DF_F32, 1.0f));
}

static void alloc_all(bench *b) {
  gpu_env *e = &b->e;
  const int64_t S = b->S, Q = b->Q, KVn = b->KVn;
  b->lay = make_layout();
  const int64_t n = b->lay.total;
  b->P = gpu_alloc(e, 2 * n), b->G = gpu_alloc(e, 4 * n), b->M = gpu_alloc(e, 4 * n);
  b->m = gpu_alloc(e, 4 * n), b->v = gpu_alloc(e, 4 * n);
  gpu_fill_random(e, b->M, n, DF_F32, 0.02f, 1);
  GPU_TRY(df_cu_cast(e->s, b->P, DF_BF16, b->M, DF_F32, n, &err_));
  GPU_TRY(df_cu_fill(e->s, b->m, DF_F32, n, 0.0f, &err_));
  GPU_TRY(df_cu_fill(e->s, b->v, DF_F32, n, 0.0f, &err_));
  b->target = gpu_alloc(e, 2 * (size_t)S * KT * H), b->embed = gpu_alloc(e, 2 * (size_t)V * H);
  b->head = gpu_alloc(e, 2 * (size_t)V * H);
  gpu_fill_random(e, b->target, S * KT * H, DF_BF16, 1.0f, 2);
  gpu_fill_random(e, b->embed, (int64_t)V * H, DF_BF16, 0.02f, 3);
  gpu_fill_random(e, b->head, (int64_t)V * H, DF_BF16, 0.02f, 4);
  b->ctx_raw = gpu_alloc(e, 2 * S * H), b->ctx = gpu_alloc(e, 2 * S * H), b->h0 = gpu_alloc(e, 2 * Q * H);
  b->hf = gpu_alloc(e, 2 * Q * H), b->rstd_ctx = gpu_alloc(e, 4 * S), b->rstd_f = gpu_alloc(e, 4 * Q);
  for (int i = 0; i < L; i++) {
    layer_acts *a = &b->a[i];
    a->x = gpu_alloc(e, 2 * Q * H), a->q_raw = gpu_alloc(e, 2 * Q * QD), a->q = gpu_alloc(e, 2 * Q * QD);
    a->k_raw = gpu_alloc(e, 2 * KVn * KVD), a->k = gpu_alloc(e, 2 * KVn * KVD), a->v = gpu_alloc(e, 2 * KVn * KVD);
    a->attn = gpu_alloc(e, 2 * Q * QD), a->h_mid = gpu_alloc(e, 2 * Q * H), a->y = gpu_alloc(e, 2 * Q * H);
    a->gu = gpu_alloc(e, 2 * Q * 2 * I), a->act = gpu_alloc(e, 2 * Q * I), a->h_out = gpu_alloc(e, 2 * Q * H);
    a->rstd_in = gpu_alloc(e, 4 * Q), a->q_rstd = gpu_alloc(e, 4 * Q * NH), a->k_rstd = gpu_alloc(e, 4 * KVn * NKV);
    a->lse = gpu_alloc(e, 4 * Q * NH), a->rstd_post = gpu_alloc(e, 4 * Q);
  }
  b->dh[0] = gpu_alloc(e, 2 * Q * H), b->dh[1] = gpu_alloc(e, 2 * Q * H), b->dact = gpu_alloc(e, 2 * Q * I);
  b->dgu = gpu_alloc(e, 2 * Q * 2 * I), b->dy = gpu_alloc(e, 2 * Q * H), b->dattn = gpu_alloc(e, 2 * Q * QD);
  b->dq = gpu_alloc(e, 2 * Q * QD), b->dk = gpu_alloc(e, 2 * KVn * KVD), b->dv = gpu_alloc(e, 2 * KVn * KVD);
  b->dctx_raw = gpu_alloc(e, 2 * S * H), b->dx_f = gpu_alloc(e, 4 * Q * H), b->dctx = gpu_alloc(e, 4 * S * H);
  // Inputs: block ids (mask token plus the anchor token), positions, sorted anchors spread over the context.
  int32_t *ids = malloc(4 * Q), *pq = malloc(4 * Q), *pkv = malloc(4 * KVn), *an = malloc(4 * b->N),
          *lab = malloc(4 * Q);
  uint8_t *kp = malloc((size_t)b->N);
  for (int64_t n2 = 0; n2 < b->N; n2++) {
    an[n2] = (int32_t)(1 + n2 * (S - 1) / b->N), kp[n2] = 1;
    for (int o = 0; o < BS; o++) {
      const int64_t t = n2 * BS + o;
      ids[t] = o == 0 ? (int32_t)((t * 7919) % V) : 151669, pq[t] = an[n2] + o,
      lab[t] = o == 0 ? -1 : (int32_t)((t * 31) % V);
    }
  }
  for (int64_t j = 0; j < S; j++) pkv[j] = (int32_t)j;
  for (int64_t t = 0; t < Q; t++) pkv[S + t] = pq[t];
  float inv[HD / 2];
  df_rope_default_inv_freq(1e6, HD, inv);
  b->ids = gpu_alloc(e, 4 * Q), b->pos_q = gpu_alloc(e, 4 * Q), b->pos_kv = gpu_alloc(e, 4 * KVn);
  b->anchors = gpu_alloc(e, 4 * b->N), b->labels = gpu_alloc(e, 4 * Q), b->keep = gpu_alloc(e, (size_t)b->N);
  b->inv_freq = gpu_alloc(e, sizeof inv), b->loss = gpu_alloc(e, 4 * Q), b->correct = gpu_alloc(e, (size_t)Q);
  b->grad_scale = gpu_alloc(e, 4), b->norm = gpu_alloc(e, 8);
  const float gs = 1.0f / (float)(Q - b->N);
  GPU_CHECK(cudaMemcpy(b->ids, ids, 4 * Q, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->pos_q, pq, 4 * Q, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->pos_kv, pkv, 4 * KVn, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->anchors, an, 4 * b->N, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->labels, lab, 4 * Q, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->keep, kp, (size_t)b->N, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->inv_freq, inv, sizeof inv, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemcpy(b->grad_scale, &gs, 4, cudaMemcpyHostToDevice));
  free(ids), free(pq), free(pkv), free(an), free(lab), free(kp);
  // Workspaces.
  df_cu_attn_args aa = {.B = 1, .N = b->N, .bs = BS, .nH = NH};
  b->ws_attn = gpu_alloc(e, df_cu_block_attn_bwd_workspace(&aa));
  b->ws_rms = gpu_alloc(e, df_cu_rmsnorm_bwd_workspace(KVn * NKV > Q * NH ? KVn * NKV : Q * NH, H));
  df_cu_lmhead_ce_args ca = {.R = Q, .H = H, .V = V, .dt = DF_BF16, .dhidden = b->hf};
  b->ws_ce = gpu_alloc(e, df_cu_lmhead_ce_workspace(&ca));
  int64_t offs[64], lens[64];
  for (int i = 0; i < b->lay.nspan; i++) offs[i] = b->lay.decay_spans[i][0], lens[i] = b->lay.decay_spans[i][1];
  GPU_TRY(df_cu_optim_plan_make(offs, lens, b->lay.decay_flag, b->lay.nspan, &b->plan, &err_));
  void *dch = gpu_alloc(e, sizeof(df_cu_optim_chunk) * (size_t)b->plan.nchunks);
  GPU_CHECK(
      cudaMemcpy(dch, b->plan.h_chunks, sizeof(df_cu_optim_chunk) * (size_t)b->plan.nchunks, cudaMemcpyHostToDevice));
  b->plan.d_chunks = dch;
  b->ws_norm = gpu_alloc(e, df_cu_optim_norm_workspace(&b->plan));
  GPU_CHECK(cudaStreamSynchronize(e->s));
}

static df_cu_attn_args attn_args(bench *b, layer_acts *a) {
  df_cu_attn_args x = {.B = 1,
                       .N = b->N,
                       .bs = BS,
                       .S = b->S,
                       .nH = NH,
                       .nKV = NKV,
                       .hd = HD,
                       .window = 0,
                       .scale = (float)(1.0 / sqrt((double)HD)),
                       .q = a->q,
                       .k = a->k,
                       .v = a->v,
                       .in_dt = DF_BF16,
                       .anchors = b->anchors,
                       .keep = b->keep,
                       .out = a->attn,
                       .out_dt = DF_BF16,
                       .lse = a->lse,
                       .dout = b->dattn,
                       .dq = b->dq,
                       .dk = b->dk,
                       .dv = b->dv,
                       .grad_dt = DF_BF16};
  return x;
}

static void forward(bench *b) {
  gpu_env *e = &b->e;
  const int64_t S = b->S, Q = b->Q, KVn = b->KVn;
  nvtxRangePushA("forward");
  linear(b, b->target, S, KT * H, P(b, b->lay.fc), H, b->ctx_raw, NULL); // context fc
  GPU_TRY(df_cu_rmsnorm_fwd(e->s, b->ctx_raw, DF_BF16, P(b, b->lay.hidden_norm), DF_BF16, 1e-6f, b->ctx, DF_BF16,
                            b->rstd_ctx, S, H, &err_));
  GPU_TRY(df_cu_embedding_fwd(e->s, b->embed, DF_BF16, b->ids, b->h0, DF_BF16, Q, V, H, &err_));
  const void *h_in = b->h0;
  for (int i = 0; i < L; i++) {
    layer_acts *a = &b->a[i];
    const layer_off *o = &b->lay.l[i];
    GPU_TRY(df_cu_rmsnorm_fwd(e->s, h_in, DF_BF16, P(b, o->in_norm), DF_BF16, 1e-6f, a->x, DF_BF16, a->rstd_in, Q, H,
                              &err_));
    linear(b, a->x, Q, H, P(b, o->q), QD, a->q_raw, NULL);
    GPU_TRY(df_cu_rmsnorm_fwd(e->s, a->q_raw, DF_BF16, P(b, o->q_norm), DF_BF16, 1e-6f, a->q, DF_BF16, a->q_rstd,
                              Q * NH, HD, &err_));
    GPU_TRY(df_cu_rope(e->s, a->q, DF_BF16, b->pos_q, b->inv_freq, 1.0f, 1.0f, a->q, DF_BF16, Q, NH, HD, &err_));
    // k, v over [context ; block]: two GEMMs each into one buffer.
    linear(b, b->ctx, S, H, P(b, o->k), KVD, a->k_raw, NULL);
    linear(b, a->x, Q, H, P(b, o->k), KVD, (uint16_t *)a->k_raw + S * KVD, NULL);
    linear(b, b->ctx, S, H, P(b, o->v), KVD, a->v, NULL);
    linear(b, a->x, Q, H, P(b, o->v), KVD, (uint16_t *)a->v + S * KVD, NULL);
    GPU_TRY(df_cu_rmsnorm_fwd(e->s, a->k_raw, DF_BF16, P(b, o->k_norm), DF_BF16, 1e-6f, a->k, DF_BF16, a->k_rstd,
                              KVn * NKV, HD, &err_));
    GPU_TRY(df_cu_rope(e->s, a->k, DF_BF16, b->pos_kv, b->inv_freq, 1.0f, 1.0f, a->k, DF_BF16, KVn, NKV, HD, &err_));
    df_cu_attn_args aa = attn_args(b, a);
    GPU_TRY(df_cu_block_attn_fwd(e->s, &aa, &err_));
    linear(b, a->attn, Q, QD, P(b, o->o), H, a->h_mid, h_in); // o_proj + residual (epilogue)
    GPU_TRY(df_cu_rmsnorm_fwd(e->s, a->h_mid, DF_BF16, P(b, o->post_norm), DF_BF16, 1e-6f, a->y, DF_BF16, a->rstd_post,
                              Q, H, &err_));
    linear(b, a->y, Q, H, P(b, o->w13), 2 * I, a->gu, NULL); // fused gate/up
    df_cu_swiglu_in sw = {Q, I, a->gu, (uint16_t *)a->gu + I, 2 * I, 2 * I, DF_BF16, 0.0f};
    GPU_TRY(df_cu_swiglu_fwd(e->s, &sw, a->act, DF_BF16, I, &err_));
    linear(b, a->act, Q, I, P(b, o->w2), H, a->h_out, a->h_mid); // down + residual
    h_in = a->h_out;
  }
  GPU_TRY(df_cu_rmsnorm_fwd(e->s, h_in, DF_BF16, P(b, b->lay.norm), DF_BF16, 1e-6f, b->hf, DF_BF16, b->rstd_f, Q, H,
                            &err_));
  nvtxRangePop();
}

static void lmhead(bench *b) {
  nvtxRangePushA("lmhead_ce");
  df_cu_lmhead_ce_args ca = {.R = b->Q,
                             .H = H,
                             .V = V,
                             .hidden = b->hf,
                             .head = b->head,
                             .dt = DF_BF16,
                             .labels = b->labels,
                             .grad_scale = 1.0f,
                             .loss = b->loss,
                             .correct = b->correct,
                             .dhidden = b->dh[0],
                             .dh_dt = DF_BF16};
  GPU_TRY(df_cu_lmhead_ce(b->e.g, b->e.s, &ca, b->ws_ce, &err_));
  nvtxRangePop();
}

static void backward(bench *b) {
  gpu_env *e = &b->e;
  const int64_t S = b->S, Q = b->Q, KVn = b->KVn;
  nvtxRangePushA("backward");
  GPU_TRY(df_cu_fill(e->s, b->G, DF_F32, b->lay.total, 0.0f, &err_)); // one zeroing per step
  int cur = 0;                                                        // dh[cur]: d(hf), then d(h_out) of each layer
  const void *h_last = b->a[L - 1].h_out;
  GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dh[0], DF_BF16, h_last, DF_BF16, P(b, b->lay.norm), DF_BF16, b->rstd_f, b->dh[1],
                            DF_BF16, false, G(b, b->lay.norm), DF_F32, Q, H, b->ws_rms, &err_));
  cur = 1;
  for (int i = L - 1; i >= 0; i--) {
    layer_acts *a = &b->a[i];
    const layer_off *o = &b->lay.l[i];
    const void *h_in = i > 0 ? b->a[i - 1].h_out : b->h0;
    void *dh_out = b->dh[cur], *dh_mid = b->dh[1 - cur];
    // FFN: dact = dh_out·w2, dw2 += dh_outᵀ·act; SwiGLU; dy = dgu·w13, dw13 += dguᵀ·y.
    linear_bwd(b, dh_out, a->act, Q, I, P(b, o->w2), H, b->dact, DF_BF16, false, G(b, o->w2));
    df_cu_swiglu_in sw = {Q, I, a->gu, (uint16_t *)a->gu + I, 2 * I, 2 * I, DF_BF16, 0.0f};
    GPU_TRY(df_cu_swiglu_bwd(e->s, &sw, b->dact, DF_BF16, I, b->dgu, (uint16_t *)b->dgu + I, DF_BF16, 2 * I, &err_));
    linear_bwd(b, b->dgu, a->y, Q, H, P(b, o->w13), 2 * I, b->dy, DF_BF16, false, G(b, o->w13));
    // dh_mid = dh_out + post_norm backward of dy.
    GPU_TRY(df_cu_cast(e->s, dh_mid, DF_BF16, dh_out, DF_BF16, Q * H, &err_));
    GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dy, DF_BF16, a->h_mid, DF_BF16, P(b, o->post_norm), DF_BF16, a->rstd_post,
                              dh_mid, DF_BF16, true, G(b, o->post_norm), DF_F32, Q, H, b->ws_rms, &err_));
    // Attention: dattn = dh_mid·wo; block attention backward; RoPE and q/k norm backward in place.
    linear_bwd(b, dh_mid, a->attn, Q, QD, P(b, o->o), H, b->dattn, DF_BF16, false, G(b, o->o));
    df_cu_attn_args aa = attn_args(b, a);
    GPU_TRY(df_cu_block_attn_bwd(e->s, &aa, b->ws_attn, &err_));
    GPU_TRY(df_cu_rope(e->s, b->dq, DF_BF16, b->pos_q, b->inv_freq, 1.0f, -1.0f, b->dq, DF_BF16, Q, NH, HD, &err_));
    GPU_TRY(df_cu_rope(e->s, b->dk, DF_BF16, b->pos_kv, b->inv_freq, 1.0f, -1.0f, b->dk, DF_BF16, KVn, NKV, HD, &err_));
    GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dq, DF_BF16, a->q_raw, DF_BF16, P(b, o->q_norm), DF_BF16, a->q_rstd, b->dq,
                              DF_BF16, false, G(b, o->q_norm), DF_F32, Q * NH, HD, b->ws_rms, &err_));
    GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dk, DF_BF16, a->k_raw, DF_BF16, P(b, o->k_norm), DF_BF16, a->k_rstd, b->dk,
                              DF_BF16, false, G(b, o->k_norm), DF_F32, KVn * NKV, HD, b->ws_rms, &err_));
    // Projections: dx (fp32) = dq·wq + dk_blk·wk + dv_blk·wv; dctx (fp32) += dk_ctx·wk + dv_ctx·wv; weight grads.
    const void *dk_blk = (uint16_t *)b->dk + S * KVD, *dv_blk = (uint16_t *)b->dv + S * KVD;
    linear_bwd(b, b->dq, a->x, Q, H, P(b, o->q), QD, b->dx_f, DF_F32, false, G(b, o->q));
    linear_bwd(b, dk_blk, a->x, Q, H, P(b, o->k), KVD, b->dx_f, DF_F32, true, G(b, o->k));
    linear_bwd(b, dv_blk, a->x, Q, H, P(b, o->v), KVD, b->dx_f, DF_F32, true, G(b, o->v));
    linear_bwd(b, b->dk, b->ctx, S, H, P(b, o->k), KVD, b->dctx, DF_F32, i < L - 1, G(b, o->k));
    linear_bwd(b, b->dv, b->ctx, S, H, P(b, o->v), KVD, b->dctx, DF_F32, true, G(b, o->v));
    // dh_in = dh_mid + input_layernorm backward of dx (into dh_out's buffer, free now).
    GPU_TRY(df_cu_cast(e->s, dh_out, DF_BF16, dh_mid, DF_BF16, Q * H, &err_));
    GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dx_f, DF_F32, h_in, DF_BF16, P(b, o->in_norm), DF_BF16, a->rstd_in, dh_out,
                              DF_BF16, true, G(b, o->in_norm), DF_F32, Q, H, b->ws_rms, &err_));
  }
  // The context: hidden_norm backward, then the fc weight gradient (its input is data: no dgrad).
  GPU_TRY(df_cu_rmsnorm_bwd(e->s, b->dctx, DF_F32, b->ctx_raw, DF_BF16, P(b, b->lay.hidden_norm), DF_BF16, b->rstd_ctx,
                            b->dctx_raw, DF_BF16, false, G(b, b->lay.hidden_norm), DF_F32, S, H, b->ws_rms, &err_));
  linear_bwd(b, b->dctx_raw, b->target, S, KT * H, P(b, b->lay.fc), H, NULL, DF_BF16, false, G(b, b->lay.fc));
  nvtxRangePop();
}

static void optimizer(bench *b, int64_t step) {
  nvtxRangePushA("optimizer");
  const df_cu_adamw_coefs c = df_cu_adamw_coefs_of(6e-4f, 0.9f, 0.95f, 1e-8f, 0.01f, step);
  const df_cu_adamw_coefs c0 = df_cu_adamw_coefs_of(6e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, step);
  GPU_TRY(df_cu_global_norm(b->e.s, &b->plan, b->G, b->grad_scale, b->ws_norm, b->norm, &err_));
  GPU_TRY(df_cu_adamw(b->e.s, &b->plan, b->M, b->P, DF_BF16, b->G, b->m, b->v, &c, &c0, b->grad_scale, b->norm, 1.0,
                      &err_));
  nvtxRangePop();
}

// Model FLOPs of one step (see the header).
static double step_flops(const bench *b, double *attn_out) {
  const double S = (double)b->S, Q = (double)b->Q, KVn = (double)b->KVn;
  double layer = 2 * Q * H * QD + 2 * 2 * KVn * H * KVD + 2 * Q * QD * H + 2 * Q * H * 2.0 * I + 2 * Q * I * H;
  double gemm = 3 * L * layer + 2 * (2 * S * KT * H * H) + 2 * (2 * Q * H * (double)V);
  double pairs = 0; // visible (query, key) pairs of one head
  for (int64_t n = 0; n < b->N; n++) pairs += BS * (double)(1 + n * (b->S - 1) / b->N) + BS * (double)BS;
  const double attn = L * NH * pairs * (4.0 * HD + 8.0 * HD);
  *attn_out = attn;
  return gemm + attn;
}

int main(int argc, char **argv) {
  int steps = 3;
  bench b;
  memset(&b, 0, sizeof b);
  b.S = 3072, b.N = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--steps"))
      steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--anchors"))
      b.N = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--context"))
      b.S = atoi(argv[i + 1]);
  }
  if (!gpu_visible()) {
    printf("bench_gpu_step: no CUDA device visible; nothing measured\n");
    return 0;
  }
  b.Q = b.N * BS, b.KVn = b.S + b.Q;
  b.e = gpu_env_open();
  alloc_all(&b);
  gpu_timer t = gpu_timer_make();
  double fwd[16], ce[16], bwd[16], opt[16], tot[16];
  if (steps > 16) steps = 16;
  for (int it = -1; it < steps; it++) { // it = −1: warm-up (descriptor cache, heuristics, module load)
    gpu_timer_start(&t, b.e.s);
    forward(&b);
    const double f = gpu_timer_stop(&t, b.e.s);
    gpu_timer_start(&t, b.e.s);
    lmhead(&b);
    const double c = gpu_timer_stop(&t, b.e.s);
    gpu_timer_start(&t, b.e.s);
    backward(&b);
    const double bw = gpu_timer_stop(&t, b.e.s);
    gpu_timer_start(&t, b.e.s);
    optimizer(&b, it + 2);
    const double o = gpu_timer_stop(&t, b.e.s);
    double norm = 0;
    GPU_CHECK(cudaMemcpy(&norm, b.norm, 8, cudaMemcpyDeviceToHost)); // the one scalar read per optimizer step
    if (it >= 0) fwd[it] = f, ce[it] = c, bwd[it] = bw, opt[it] = o, tot[it] = f + c + bw + o;
    if (it == 0 && !isfinite(norm)) printf("warning: non-finite gradient norm %g\n", norm);
  }
  double attn = 0;
  const double flops = step_flops(&b, &attn), ms = gpu_median(tot, steps);
  printf("\nbench_gpu_step: DFlash Qwen3-8B draft, %d layers, H %d, I %d, %d/%d heads x %d, V %d, S %lld, %lld x %d "
         "block tokens, bf16 + fp32 masters, %d timed steps (median)\n",
         L, H, I, NH, NKV, HD, V, (long long)b.S, (long long)b.N, BS, steps);
  printf("| phase | ms |\n|---|---|\n| forward | %.2f |\n| LM head + CE (fwd+bwd) | %.2f |\n| backward | %.2f |\n"
         "| norm + AdamW | %.2f |\n| step | %.2f |\n",
         gpu_median(fwd, steps), gpu_median(ce, steps), gpu_median(bwd, steps), gpu_median(opt, steps), ms);
  printf("model FLOPs per step %.2f TFLOP (attention after block sparsity %.2f TFLOP)\n", flops / 1e12, attn / 1e12);
  printf("tokens/s %.0f (block tokens), samples/s %.2f\n", (double)b.Q / (ms / 1e3), 1e3 / ms);
  printf("MFU %.1f%% of %.1f TFLOP/s bf16 dense peak; %.1f%% of the %.0f TFLOP/s measured bf16 GEMM rate\n",
         100 * flops / (ms / 1e3) / (GPU_PEAK_BF16_TFLOPS * 1e12), GPU_PEAK_BF16_TFLOPS,
         100 * flops / (ms / 1e3) / (GPU_MEASURED_GEMM_TFLOPS * 1e12), GPU_MEASURED_GEMM_TFLOPS);
  printf("memory: %.2f GiB allocated by the bench, %.2f GiB in use on the device\n",
         (double)b.e.allocated / (double)(1u << 30), gpu_used_gib());
  printf("GPU_STEP_SUMMARY ms=%.2f mfu=%.1f tokens_per_s=%.0f\n", ms,
         100 * flops / (ms / 1e3) / (GPU_PEAK_BF16_TFLOPS * 1e12), (double)b.Q / (ms / 1e3));
  gpu_env_close(&b.e);
  return 0;
}
