// The strict fake device: like kernels/fake/backend.c, but its buffers are handed out as addresses the host
// cannot dereference (host address + 2^62: non-canonical on x86-64, so any load or store faults). Only the table
// turns them back: its copies and its ops (the CPU kernels, called on an inner CPU context) remove the tag. A
// training step that runs on it touches device memory only through the backend — a host loop over device data
// crashes instead of passing silently. Code that still loops on the host (the MoE routing) cannot run on it
// until those loops become ops.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/context.h"

#define TAG ((uintptr_t)1 << 62)

static void *untag(const void *p) { return p ? (void *)((uintptr_t)p - TAG) : NULL; }

static df_tensor u(const df_tensor *t) {
  df_tensor x = *t;
  x.data = untag(t->data);
  return x;
}

// The untagged copy of an optional tensor in *x, or NULL.
static df_tensor *opt(const df_tensor *t, df_tensor *x) {
  if (!t) return NULL;
  *x = u(t);
  return x;
}

// ---- memory ---------------------------------------------------------------------------------------------------

static df_status strict_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  (void)ctx;
  size_t rounded = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "strict fake device: cannot allocate %zu bytes", bytes);
  *out = (void *)((uintptr_t)p + TAG);
  return DF_OK;
}

static void strict_free(df_ctx *ctx, void *p) {
  (void)ctx;
  free(untag(p));
}

static df_status strict_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev,
                             size_t bytes, bool async, df_error *err) {
  (void)ctx, (void)async, (void)err;
  memmove(dst_dev == DF_DEV_CPU ? dst : untag(dst), src_dev == DF_DEV_CPU ? src : untag(src), bytes);
  return DF_OK;
}

// The inner CPU context the ops run on (its workspace is host memory).
static df_status strict_init(df_ctx *ctx, const df_ctx_options *o, df_error *err) {
  df_ctx_options inner = {.device = DF_DEV_CPU, .num_threads = o->num_threads};
  return df_ctx_create(&inner, (df_ctx **)&ctx->state, err);
}

static void strict_destroy(df_ctx *ctx) { df_ctx_destroy(ctx->state); }

static df_ctx *in(df_ctx *ctx) { return ctx->state; }
static const df_backend *cpu(void) { return df_cpu_backend(); }

// ---- ops: untag, then the CPU kernel ---------------------------------------------------------------------------

static df_status s_matmul(df_ctx *ctx, const df_tensor *a, bool ta, const df_tensor *b, bool tb, float alpha,
                          float beta, df_tensor *c, df_error *err) {
  df_tensor A = u(a), B = u(b), C = u(c);
  return cpu()->matmul(in(ctx), &A, ta, &B, tb, alpha, beta, &C, err);
}

static df_status s_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b, df_tensor *y,
                                  df_error *err) {
  df_tensor X = u(x), W = u(w), Bb, Y = u(y);
  return cpu()->linear_forward(in(ctx), &X, &W, opt(b, &Bb), &Y, err);
}

static df_status s_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                   df_tensor *dx, bool acc, df_tensor *dw, df_tensor *db, df_error *err) {
  df_tensor DY = u(dy), X = u(x), W = u(w), DX, DW, DB;
  return cpu()->linear_backward(in(ctx), &DY, &X, &W, opt(dx, &DX), acc, opt(dw, &DW), opt(db, &DB), err);
}

static df_status s_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err) {
  df_tensor X = u(x), Y = u(y);
  return cpu()->axpy(in(ctx), alpha, &X, &Y, err);
}

static df_status s_fill(df_ctx *ctx, df_tensor *t, double value, df_error *err) {
  df_tensor T = u(t);
  return cpu()->fill(in(ctx), &T, value, err);
}

static df_status s_scale(df_ctx *ctx, df_tensor *t, float alpha, df_error *err) {
  df_tensor T = u(t);
  return cpu()->scale(in(ctx), &T, alpha, err);
}

static df_status s_cast(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err) {
  df_tensor S = u(src), D = u(dst);
  return cpu()->cast(in(ctx), &S, &D, err);
}

static df_status s_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                                   df_tensor *rstd, df_error *err) {
  df_tensor X = u(x), W = u(w), Y = u(y), R = u(rstd);
  return cpu()->rmsnorm_forward(in(ctx), &X, &W, eps, &Y, &R, err);
}

static df_status s_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                    const df_tensor *rstd, df_tensor *dx, bool acc, df_tensor *dw, df_error *err) {
  df_tensor DY = u(dy), X = u(x), W = u(w), R = u(rstd), DX = u(dx), DW;
  return cpu()->rmsnorm_backward(in(ctx), &DY, &X, &W, &R, &DX, acc, opt(dw, &DW), err);
}

static df_status s_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                                float mscale, df_tensor *y, df_error *err) {
  df_tensor X = u(x), P = u(pos), F = u(inv_freq), Y = u(y);
  return cpu()->rope_forward(in(ctx), &X, &P, &F, mscale, &Y, err);
}

static df_status s_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                                 float mscale, df_tensor *dx, df_error *err) {
  df_tensor DY = u(dy), P = u(pos), F = u(inv_freq), DX = u(dx);
  return cpu()->rope_backward(in(ctx), &DY, &P, &F, mscale, &DX, err);
}

static df_status s_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *uu, float limit, df_tensor *h,
                                  df_error *err) {
  df_tensor G = u(g), U = u(uu), H = u(h);
  return cpu()->swiglu_forward(in(ctx), &G, &U, limit, &H, err);
}

static df_status s_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *uu,
                                   float limit, df_tensor *dg, df_tensor *du, df_error *err) {
  df_tensor DH = u(dh), G = u(g), U = u(uu), DG = u(dg), DU = u(du);
  return cpu()->swiglu_backward(in(ctx), &DH, &G, &U, limit, &DG, &DU, err);
}

static df_status s_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                                     df_error *err) {
  df_tensor T = u(table), I = u(ids), O = u(out);
  return cpu()->embedding_forward(in(ctx), &T, &I, &O, err);
}

static df_status s_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                      df_error *err) {
  df_tensor D = u(dout), I = u(ids), T = u(dtable);
  return cpu()->embedding_backward(in(ctx), &D, &I, &T, err);
}

static df_status s_gather_rows(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out, df_error *err) {
  df_tensor S = u(src), I = u(idx), O = u(out);
  return cpu()->gather_rows(in(ctx), &S, &I, &O, err);
}

static df_status s_copy_2d(df_ctx *ctx, const df_copy_2d_desc *desc, const df_tensor *src, df_tensor *dst,
                           df_error *err) {
  df_tensor S = u(src), D = u(dst);
  return cpu()->copy_2d(in(ctx), desc, &S, &D, err);
}

static df_status s_markov_gate_forward(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate,
                                       df_tensor *uu, df_error *err) {
  df_tensor P = u(pre), E = u(e), G = u(gate), U = u(uu);
  return cpu()->markov_gate_forward(in(ctx), &P, &E, &G, &U, err);
}

static df_status s_markov_gate_backward(df_ctx *ctx, const df_tensor *gate, const df_tensor *e, const df_tensor *du,
                                        df_tensor *de, df_tensor *dpre, df_error *err) {
  df_tensor G = u(gate), E = u(e), DU = u(du), DE = u(de), DP = u(dpre);
  return cpu()->markov_gate_backward(in(ctx), &G, &E, &DU, &DE, &DP, err);
}

static df_status s_markov_rnn_forward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                      const df_tensor *s_prev, df_tensor *s, df_tensor *uu, df_error *err) {
  df_tensor Y = u(y), SP, S = u(s), U = u(uu);
  return cpu()->markov_rnn_forward(in(ctx), desc, &Y, opt(s_prev, &SP), &S, &U, err);
}

static df_status s_markov_rnn_backward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                       const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                       df_error *err) {
  df_tensor Y = u(y), SP, DU, DS = u(ds), DY = u(dy);
  return cpu()->markov_rnn_backward(in(ctx), desc, &Y, opt(s_prev, &SP), opt(du, &DU), &DS, &DY, err);
}

static df_status s_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                      const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                      const df_tensor *keep, df_tensor *out, df_tensor *lse, df_error *err) {
  df_tensor Q = u(q), K = u(k), V = u(v), A = u(anchors), P = u(keep), O = u(out), L = u(lse);
  return cpu()->block_attn_forward(in(ctx), desc, &Q, &K, &V, &A, &P, &O, &L, err);
}

static df_status s_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                       const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                       const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                       const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                       df_error *err) {
  df_tensor Q = u(q), K = u(k), V = u(v), A = u(anchors), P = u(keep), O = u(out), L = u(lse), DO = u(dout);
  df_tensor DQ = u(dq), DK = u(dk), DV = u(dv);
  return cpu()->block_attn_backward(in(ctx), desc, &Q, &K, &V, &A, &P, &O, &L, &DO, &DQ, &DK, &DV, err);
}

static df_status s_causal_attn_forward(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q,
                                       const df_tensor *k, const df_tensor *v, df_tensor *out, df_error *err) {
  df_tensor Q = u(q), K = u(k), V = u(v), O = u(out);
  return cpu()->causal_attn_forward(in(ctx), desc, &Q, &K, &V, &O, err);
}

static df_status s_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden, const df_tensor *head,
                             const df_tensor *labels, const df_tensor *weights, df_tensor *loss, df_tensor *correct,
                             df_tensor *dhidden, df_error *err) {
  df_tensor H = u(hidden), W = u(head), L = u(labels), R, LO = u(loss), C = u(correct), D;
  return cpu()->lmhead_ce(in(ctx), desc, &H, &W, &L, opt(weights, &R), &LO, &C, opt(dhidden, &D), err);
}

static df_status s_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1,
                                      df_error *err) {
  df_tensor P = u(p), Q = u(q), L = u(l1);
  return cpu()->softmax_l1_forward(in(ctx), &P, &Q, &L, err);
}

static df_status s_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                       df_tensor *dp, df_error *err) {
  df_tensor P = u(p), Q = u(q), L = u(dl1), D = u(dp);
  return cpu()->softmax_l1_backward(in(ctx), &P, &Q, &L, &D, err);
}

static df_status s_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss,
                                      df_error *err) {
  df_tensor X = u(x), T = u(t), L = u(loss);
  return cpu()->bce_logits_forward(in(ctx), &X, &T, &L, err);
}

static df_status s_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                       df_tensor *dx, df_error *err) {
  df_tensor X = u(x), T = u(t), L = u(dloss), D = u(dx);
  return cpu()->bce_logits_backward(in(ctx), &X, &T, &L, &D, err);
}

static df_status s_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in_,
                                 const df_lmhead_dspark_out *out, df_error *err) {
  df_tensor t[8], o[11];
  df_lmhead_dspark_in i = {.hidden = opt(in_->hidden, &t[0]),
                           .head = opt(in_->head, &t[1]),
                           .markov_u = opt(in_->markov_u, &t[2]),
                           .markov_w2 = opt(in_->markov_w2, &t[3]),
                           .teacher = opt(in_->teacher, &t[4]),
                           .labels = opt(in_->labels, &t[5]),
                           .weights = opt(in_->weights, &t[6]),
                           .conf = opt(in_->conf, &t[7])};
  df_lmhead_dspark_out w = {.ce = opt(out->ce, &o[0]),
                            .correct = opt(out->correct, &o[1]),
                            .draft_top1 = opt(out->draft_top1, &o[2]),
                            .l1 = opt(out->l1, &o[3]),
                            .agree = opt(out->agree, &o[4]),
                            .teacher_top1 = opt(out->teacher_top1, &o[5]),
                            .bce = opt(out->bce, &o[6]),
                            .dhidden = opt(out->dhidden, &o[7]),
                            .du = opt(out->du, &o[8]),
                            .dw2 = opt(out->dw2, &o[9]),
                            .dconf = opt(out->dconf, &o[10])};
  return cpu()->lmhead_dspark(in(ctx), desc, &i, &w, err);
}

static df_status s_dpace_weights(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                                 const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err) {
  df_tensor C = u(ce), W = u(w), O = u(out), R;
  return cpu()->dpace_weights(in(ctx), mode, alpha, bs, &C, &W, &O, opt(row_w, &R), err);
}

static df_status s_block_metrics(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct,
                                 const df_tensor *lw, const df_tensor *valid, const df_tensor *keep, df_tensor *stats,
                                 df_error *err) {
  df_tensor C = u(ce), K = u(correct), L = u(lw), V = u(valid), P = u(keep), S = u(stats);
  return cpu()->block_metrics(in(ctx), bs, &C, &K, &L, &V, &P, &S, err);
}

static df_status s_dspark_block_metrics(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *m, df_tensor *stats,
                                        df_error *err) {
  df_tensor t[11], S = u(stats);
  df_dspark_metrics_in i = {.ce = opt(m->ce, &t[0]),
                            .correct = opt(m->correct, &t[1]),
                            .draft_top1 = opt(m->draft_top1, &t[2]),
                            .l1 = opt(m->l1, &t[3]),
                            .agree = opt(m->agree, &t[4]),
                            .teacher_top1 = opt(m->teacher_top1, &t[5]),
                            .bce = opt(m->bce, &t[6]),
                            .conf = opt(m->conf, &t[7]),
                            .valid = opt(m->valid, &t[8]),
                            .weights = opt(m->weights, &t[9]),
                            .keep = opt(m->keep, &t[10])};
  return cpu()->dspark_block_metrics(in(ctx), bs, &i, &S, err);
}

static df_status s_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                              const df_adamw_hparams *hp, df_error *err) {
  df_tensor P = u(param), G = u(grad), M = u(m), V = u(v);
  return cpu()->adamw_step(in(ctx), &P, &G, &M, &V, hp, err);
}

// The untagged copy of a tensor list (freed by the caller).
static df_tensor *untag_list(const df_tensor *bufs, int n, df_error *err) {
  df_tensor *x = malloc(sizeof *x * (size_t)(n > 0 ? n : 1));
  if (!x) return DF_FAIL(err, DF_ERR_NOMEM, "bufs", NULL, "out of memory"), NULL;
  for (int i = 0; i < n; i++) x[i] = u(&bufs[i]);
  return x;
}

static df_status s_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err) {
  df_tensor *x = untag_list(bufs, nbufs, err);
  if (!x) return DF_ERR_NOMEM;
  df_status st = cpu()->global_norm(in(ctx), x, nbufs, norm, err);
  free(x);
  return st;
}

static df_status s_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                                df_error *err) {
  df_tensor *x = untag_list(bufs, nbufs, err);
  if (!x) return DF_ERR_NOMEM;
  df_status st = cpu()->clip_by_norm(in(ctx), x, nbufs, norm, max_norm, coef, err);
  free(x);
  return st;
}

static df_status s_grad_norm_clip(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad,
                                  const df_tensor *mask, const df_tensor *guard, df_tensor *out, df_error *err) {
  df_tensor G = u(grad), M = u(mask), GU, O = u(out);
  return cpu()->grad_norm_clip(in(ctx), desc, &G, &M, opt(guard, &GU), &O, err);
}

static df_status s_adamw_fused(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master, const df_tensor *grad,
                               df_tensor *m, df_tensor *v, const df_tensor *mask, const df_tensor *norm_stats,
                               df_tensor *params, df_error *err) {
  df_tensor P = u(master), G = u(grad), M = u(m), V = u(v), K = u(mask), N, Q;
  return cpu()->adamw_fused(in(ctx), desc, &P, &G, &M, &V, &K, opt(norm_stats, &N), opt(params, &Q), err);
}

// ---- MoE ops --------------------------------------------------------------------------------------------------

static df_status s_moe_scores_forward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores,
                                      df_error *err) {
  df_tensor L = u(logits), S = u(scores);
  return cpu()->moe_scores_forward(in(ctx), f, &L, &S, err);
}

static df_status s_moe_scores_backward(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits,
                                       const df_tensor *scores, const df_tensor *dscores, df_tensor *dlogits,
                                       df_error *err) {
  df_tensor L = u(logits), S = u(scores), DS = u(dscores), DL = u(dlogits);
  return cpu()->moe_scores_backward(in(ctx), f, &L, &S, &DS, &DL, err);
}

static df_status s_moe_select(df_ctx *ctx, const df_moe_route_desc *d, const df_tensor *scores,
                              const df_tensor *sel_shift, df_tensor *indices, df_tensor *weights, df_tensor *counts,
                              df_error *err) {
  df_tensor S = u(scores), SH, I = u(indices), W = u(weights), C = u(counts);
  return cpu()->moe_select(in(ctx), d, &S, opt(sel_shift, &SH), &I, &W, &C, err);
}

static df_status s_moe_select_backward(df_ctx *ctx, const df_moe_route_desc *d, const df_tensor *scores,
                                       const df_tensor *indices, const df_tensor *weights, const df_tensor *dweights,
                                       const df_tensor *aux_row, df_tensor *dscores, df_error *err) {
  df_tensor S = u(scores), I = u(indices), W = u(weights), DW, A, DS = u(dscores);
  return cpu()->moe_select_backward(in(ctx), d, &S, &I, &W, opt(dweights, &DW), opt(aux_row, &A), &DS, err);
}

static df_status s_moe_center_forward(df_ctx *ctx, int64_t rps, const df_tensor *x, const df_tensor *mu, df_tensor *u_,
                                      df_tensor *batch_mean, df_error *err) {
  df_tensor X = u(x), M, U = u(u_), B;
  return cpu()->moe_center_forward(in(ctx), rps, &X, opt(mu, &M), &U, opt(batch_mean, &B), err);
}

static df_status s_moe_center_backward(df_ctx *ctx, int64_t rps, const df_tensor *du, df_tensor *dx, bool acc,
                                       df_error *err) {
  df_tensor DU = u(du), DX = u(dx);
  return cpu()->moe_center_backward(in(ctx), rps, &DU, &DX, acc, err);
}

static df_status s_moe_plan(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts,
                            df_tensor *offsets, df_tensor *slot, df_tensor *token, df_error *err) {
  df_tensor I = u(indices), C = u(counts), O = u(offsets), S = u(slot), T = u(token);
  return cpu()->moe_plan(in(ctx), k, &I, &C, &O, &S, &T, err);
}

static df_status s_moe_scale_rows(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx, df_error *err) {
  df_tensor H = u(h), W = u(w), I;
  return cpu()->moe_scale_rows(in(ctx), &H, &W, opt(idx, &I), err);
}

static df_status s_moe_gate_backward(df_ctx *ctx, bool sig, df_tensor *dh, const df_tensor *act, const df_tensor *w,
                                     const df_tensor *idx, df_tensor *out, df_error *err) {
  df_tensor DH = u(dh), A = u(act), W = u(w), I, O = u(out);
  return cpu()->moe_gate_backward(in(ctx), sig, &DH, &A, &W, opt(idx, &I), &O, err);
}

static df_status s_moe_sigmoid_scale(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err) {
  df_tensor Z = u(z), A = u(a);
  return cpu()->moe_sigmoid_scale(in(ctx), &Z, &A, err);
}

static df_status s_moe_route_stats(df_ctx *ctx, const df_moe_stats_desc *d, const df_tensor *scores,
                                   const df_tensor *counts, const df_tensor *bias, df_tensor *stats, bool acc,
                                   df_tensor *count_stash, df_error *err) {
  df_tensor S = u(scores), C = u(counts), B, ST = u(stats), CS;
  return cpu()->moe_route_stats(in(ctx), d, &S, &C, opt(bias, &B), &ST, acc, opt(count_stash, &CS), err);
}

static df_status s_moe_aux_backward(df_ctx *ctx, const df_moe_stats_desc *d, int64_t T, const df_tensor *counts,
                                    double upstream, df_tensor *row, df_error *err) {
  df_tensor C = u(counts), R = u(row);
  return cpu()->moe_aux_backward(in(ctx), d, T, &C, upstream, &R, err);
}

static df_status s_moe_center_ema(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps,
                                  df_error *err) {
  df_tensor S = u(stash), M = u(mu), N = u(steps);
  return cpu()->moe_center_ema(in(ctx), rho, &S, &M, &N, err);
}

static df_status s_moe_noaux_update(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias, df_error *err) {
  df_tensor L = u(load), B = u(bias);
  return cpu()->moe_noaux_update(in(ctx), rate, &L, &B, err);
}

static df_status s_moe_grouped_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *offsets,
                                       df_tensor *y, df_error *err) {
  df_tensor X = u(x), W = u(w), O = u(offsets), Y = u(y);
  return cpu()->moe_grouped_forward(in(ctx), &X, &W, &O, &Y, err);
}

static df_status s_moe_grouped_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                        const df_tensor *offsets, df_tensor *dx, bool acc, df_tensor *dw,
                                        df_error *err) {
  df_tensor DY = u(dy), X = u(x), W = u(w), O = u(offsets), DX, DW;
  return cpu()->moe_grouped_backward(in(ctx), &DY, &X, &W, &O, opt(dx, &DX), acc, opt(dw, &DW), err);
}

// Domino's ops (kernels/ops_domino.h).
static df_status s_gru_forward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh,
                               df_tensor *s, df_tensor *gates, df_error *err) {
  df_tensor GI = u(gi), W = u(w_hh), S = u(s), GT;
  return cpu()->gru_forward(in(ctx), desc, &GI, &W, &S, opt(gates, &GT), err);
}

static df_status s_gru_backward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                                const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh,
                                df_error *err) {
  df_tensor W = u(w_hh), S = u(s), GT = u(gates), DS = u(ds), DG = u(dgi), DW = u(dw_hh);
  return cpu()->gru_backward(in(ctx), desc, &W, &S, &GT, &DS, &DG, &DW, err);
}

static df_status s_masked_silu_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y,
                                       df_error *err) {
  df_tensor X = u(x), M = u(mask), Y = u(y);
  return cpu()->masked_silu_forward(in(ctx), &X, &M, &Y, err);
}

static df_status s_masked_silu_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, const df_tensor *dy,
                                        df_tensor *dx, df_error *err) {
  df_tensor X = u(x), M = u(mask), DY = u(dy), DX = u(dx);
  return cpu()->masked_silu_backward(in(ctx), &X, &M, &DY, &DX, err);
}

static df_status s_lmhead_domino(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in_,
                                 const df_lmhead_domino_out *out, df_error *err) {
  df_tensor t[6], o[7];
  df_lmhead_domino_in i = {.hidden = opt(in_->hidden, &t[0]),
                           .head = opt(in_->head, &t[1]),
                           .corr = opt(in_->corr, &t[2]),
                           .w2 = opt(in_->w2, &t[3]),
                           .labels = opt(in_->labels, &t[4]),
                           .weights = opt(in_->weights, &t[5])};
  df_lmhead_domino_out w = {.ce_final = opt(out->ce_final, &o[0]),
                            .ce_base = opt(out->ce_base, &o[1]),
                            .correct_final = opt(out->correct_final, &o[2]),
                            .correct_base = opt(out->correct_base, &o[3]),
                            .dhidden = opt(out->dhidden, &o[4]),
                            .dcorr = opt(out->dcorr, &o[5]),
                            .dw2 = opt(out->dw2, &o[6])};
  return cpu()->lmhead_domino(in(ctx), desc, &i, &w, err);
}

static df_status s_domino_block_metrics(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in_, df_tensor *stats,
                                        df_error *err) {
  df_tensor t[7], S = u(stats);
  df_domino_metrics_in i = *in_;
  i.ce_final = opt(in_->ce_final, &t[0]), i.ce_base = opt(in_->ce_base, &t[1]);
  i.correct_final = opt(in_->correct_final, &t[2]), i.correct_base = opt(in_->correct_base, &t[3]);
  i.valid = opt(in_->valid, &t[4]), i.weights = opt(in_->weights, &t[5]), i.keep = opt(in_->keep, &t[6]);
  return cpu()->domino_block_metrics(in(ctx), bs, &i, &S, err);
}

// ---- EAGLE-3 (kernels/eagle3.h) --------------------------------------------------------------------------------

static df_status s_ttt_attn_forward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                    const df_tensor *v, const df_tensor *lengths, df_tensor *out, df_tensor *lse,
                                    df_error *err) {
  df_tensor Q = u(q), K = u(k), V = u(v), L = u(lengths), O = u(out), S = u(lse);
  return cpu()->ttt_attn_forward(in(ctx), desc, &Q, &K, &V, &L, &O, &S, err);
}

static df_status s_ttt_attn_backward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                                     const df_tensor *v, const df_tensor *lengths, const df_tensor *out,
                                     const df_tensor *lse, const df_tensor *dout, df_tensor *dq, df_tensor *dk,
                                     df_tensor *dv, df_error *err) {
  df_tensor Q = u(q), K = u(k), V = u(v), L = u(lengths), O = u(out), S = u(lse), DO = u(dout), DQ = u(dq);
  df_tensor DK = u(dk), DV = u(dv);
  return cpu()->ttt_attn_backward(in(ctx), desc, &Q, &K, &V, &L, &O, &S, &DO, &DQ, &DK, &DV, err);
}

static df_status s_lmhead_lse_argmax(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden, const df_tensor *head,
                                     df_tensor *lse, df_tensor *argmax, df_error *err) {
  df_tensor X = u(hidden), W = u(head), L = u(lse), A = u(argmax);
  return cpu()->lmhead_lse_argmax(in(ctx), chunk_rows, &X, &W, &L, &A, err);
}

static df_status s_eagle3_teacher(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                                  const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio, df_tensor *pm,
                                  df_error *err) {
  df_tensor Z = u(logits), L = u(lse_v), A = u(argmax), T = u(t2d), M = u(loss_mask), R = u(ratio), P = u(pm);
  return cpu()->eagle3_teacher(in(ctx), &Z, &L, &A, &T, &M, &R, &P, err);
}

// The teacher rows with every tensor untagged (views in the caller's storage).
typedef struct {
  df_tensor tp, ratio, pm, lm, tok, d2t;
  df_eagle3_teacher_rows rows;
} s_teacher;

static void s_teacher_of(const df_eagle3_teacher_rows *t, s_teacher *s) {
  s->tp = u(t->target_p), s->ratio = u(t->ratio), s->pm = u(t->pm), s->lm = u(t->loss_mask);
  s->tok = u(t->tokens), s->d2t = u(t->d2t);
  s->rows = (df_eagle3_teacher_rows){&s->tp, &s->ratio, &s->pm, &s->lm, &s->tok, &s->d2t};
}

typedef struct {
  df_tensor t[6];
  df_eagle3_row_terms terms;
} s_terms;

static void s_terms_of(const df_eagle3_row_terms *r, s_terms *s) {
  df_tensor *const in_t[6] = {r->kl, r->alpha, r->log_alpha, r->pm, r->correct, r->mask};
  for (int i = 0; i < 6; i++) s->t[i] = u(in_t[i]);
  s->terms = (df_eagle3_row_terms){&s->t[0], &s->t[1], &s->t[2], &s->t[3], &s->t[4], &s->t[5]};
}

static df_status s_eagle3_loss_forward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                       const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out, df_error *err) {
  df_tensor Z = u(z);
  s_teacher st;
  s_terms so;
  s_teacher_of(t, &st), s_terms_of(out, &so);
  return cpu()->eagle3_loss_forward(in(ctx), desc, &Z, &st.rows, &so.terms, err);
}

static df_status s_eagle3_loss_backward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                        const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                        df_error *err) {
  df_tensor Z = u(z), L = u(local), D = u(dz);
  s_teacher st;
  s_teacher_of(t, &st);
  return cpu()->eagle3_loss_backward(in(ctx), desc, &Z, &st.rows, &L, &D, err);
}

static df_status s_eagle3_step_sums(df_ctx *ctx, const df_eagle3_sums_desc *desc, const df_eagle3_row_terms *rows,
                                    df_tensor *local, df_tensor *stats, df_error *err) {
  df_tensor L = u(local), S = u(stats);
  s_terms so;
  s_terms_of(rows, &so);
  return cpu()->eagle3_step_sums(in(ctx), desc, &so.terms, &L, &S, err);
}

static df_status s_eagle3_accept(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                                 int64_t blocks, df_tensor *stats, df_error *err) {
  df_tensor C = u(correct), M = u(mask), S = u(stats);
  return cpu()->eagle3_accept(in(ctx), &C, &M, accept_sum, blocks, &S, err);
}

// ---- the table -------------------------------------------------------------------------------------------------

static df_backend strict_table;
static pthread_once_t strict_once = PTHREAD_ONCE_INIT;

static void strict_build(void) {
  strict_table = *df_cpu_backend(); // events, sync, supports_op
  strict_table.name = "fake-strict";
  strict_table.device = DF_DEV_FAKE;
  strict_table.host_addressable = false;
  strict_table.init = strict_init;
  strict_table.destroy = strict_destroy;
  strict_table.alloc = strict_alloc;
  strict_table.free = strict_free;
  strict_table.copy = strict_copy;
  df_backend *t = &strict_table;
  memset(t->slot, 0, sizeof t->slot); // an op without a wrapper below is "not implemented", never a raw CPU call
  t->matmul = s_matmul, t->linear_forward = s_linear_forward, t->linear_backward = s_linear_backward;
  t->axpy = s_axpy, t->fill = s_fill, t->scale = s_scale, t->cast = s_cast;
  t->rmsnorm_forward = s_rmsnorm_forward, t->rmsnorm_backward = s_rmsnorm_backward;
  t->rope_forward = s_rope_forward, t->rope_backward = s_rope_backward;
  t->swiglu_forward = s_swiglu_forward, t->swiglu_backward = s_swiglu_backward;
  t->embedding_forward = s_embedding_forward, t->embedding_backward = s_embedding_backward;
  t->gather_rows = s_gather_rows, t->copy_2d = s_copy_2d;
  t->block_attn_forward = s_block_attn_forward, t->block_attn_backward = s_block_attn_backward;
  t->causal_attn_forward = s_causal_attn_forward;
  t->lmhead_ce = s_lmhead_ce;
  t->softmax_l1_forward = s_softmax_l1_forward, t->softmax_l1_backward = s_softmax_l1_backward;
  t->bce_logits_forward = s_bce_logits_forward, t->bce_logits_backward = s_bce_logits_backward;
  t->lmhead_dspark = s_lmhead_dspark;
  t->markov_gate_forward = s_markov_gate_forward, t->markov_gate_backward = s_markov_gate_backward;
  t->markov_rnn_forward = s_markov_rnn_forward, t->markov_rnn_backward = s_markov_rnn_backward;
  t->dpace_weights = s_dpace_weights, t->block_metrics = s_block_metrics;
  t->dspark_block_metrics = s_dspark_block_metrics;
  t->adamw_step = s_adamw_step, t->global_norm = s_global_norm, t->clip_by_norm = s_clip_by_norm;
  t->grad_norm_clip = s_grad_norm_clip, t->adamw_fused = s_adamw_fused;
  t->moe_scores_forward = s_moe_scores_forward, t->moe_scores_backward = s_moe_scores_backward;
  t->moe_select = s_moe_select, t->moe_select_backward = s_moe_select_backward;
  t->moe_center_forward = s_moe_center_forward, t->moe_center_backward = s_moe_center_backward;
  t->moe_plan = s_moe_plan, t->moe_scale_rows = s_moe_scale_rows, t->moe_gate_backward = s_moe_gate_backward;
  t->moe_sigmoid_scale = s_moe_sigmoid_scale, t->moe_route_stats = s_moe_route_stats;
  t->moe_aux_backward = s_moe_aux_backward, t->moe_center_ema = s_moe_center_ema;
  t->moe_noaux_update = s_moe_noaux_update;
  t->moe_grouped_forward = s_moe_grouped_forward, t->moe_grouped_backward = s_moe_grouped_backward;
  t->gru_forward = s_gru_forward, t->gru_backward = s_gru_backward;
  t->masked_silu_forward = s_masked_silu_forward, t->masked_silu_backward = s_masked_silu_backward;
  t->lmhead_domino = s_lmhead_domino, t->domino_block_metrics = s_domino_block_metrics;
  t->ttt_attn_forward = s_ttt_attn_forward, t->ttt_attn_backward = s_ttt_attn_backward;
  t->lmhead_lse_argmax = s_lmhead_lse_argmax, t->eagle3_teacher = s_eagle3_teacher;
  t->eagle3_loss_forward = s_eagle3_loss_forward, t->eagle3_loss_backward = s_eagle3_loss_backward;
  t->eagle3_step_sums = s_eagle3_step_sums, t->eagle3_accept = s_eagle3_accept;
}

const df_backend *df_fake_strict_backend(void) {
  pthread_once(&strict_once, strict_build);
  return &strict_table;
}
