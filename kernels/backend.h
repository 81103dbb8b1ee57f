// The backend table: everything a device offers the op interface, as one struct of function pointers.
// kernels/cpu/ exports one (df_cpu_backend), kernels/cuda/ another (df_cuda_backend), kernels/fake/ a
// test device (df_fake_backend). The dispatchers in kernels/*.c validate their arguments, ask the table
// (df_backend_require), then call ctx->backend-><op>; model code above kernels/ never sees this header.
//
// Adding an op: one DF_OP_* value and its row in kernels/backend.c, one df_<op>_fn typedef and slot below, one
// dispatcher in kernels/<family>.c, and one file per backend (kernels/cpu/<family>.c and, when written,
// kernels/cuda/<family>.cu) whose df_<backend>_register_<family> sets the slot. A slot left NULL is an op
// the backend lacks: the dispatcher answers DF_ERR_NOT_IMPLEMENTED naming the op and the backend.
//
// Where each op lives: one file per family per backend, the same name on both sides.
//   kernels/cpu/linear.c        ↔ kernels/cuda/linear.cu         matmul, linear_forward/backward, axpy
//   kernels/cpu/elementwise.c   ↔ kernels/cuda/elementwise.cu    fill, scale, cast
//   kernels/cpu/rmsnorm.c       ↔ kernels/cuda/rmsnorm.cu        rmsnorm_forward/backward
//   kernels/cpu/rope.c          ↔ kernels/cuda/rope.cu           rope_forward/backward
//   kernels/cpu/swiglu.c        ↔ kernels/cuda/swiglu.cu         swiglu_forward/backward
//   kernels/cpu/embedding.c     ↔ kernels/cuda/embedding.cu      embedding_forward/backward
//   kernels/cpu/gather.c        ↔ kernels/cuda/gather.cu         gather_rows, copy_2d
//   kernels/cpu/attention.c     ↔ kernels/cuda/attention.cu      block_attn_forward/backward
//   kernels/cpu/causal_attn.c   ↔ kernels/cuda/causal_attn.cu    causal_attn_forward (the target's KV cache)
//   kernels/cpu/lmhead_ce.c     ↔ kernels/cuda/lmhead_ce.cu      lmhead_ce
//   kernels/cpu/dspark_loss.c   ↔ kernels/cuda/dspark_loss.cu    softmax_l1_*, bce_logits_*
//   kernels/cpu/lmhead_dspark.c ↔ kernels/cuda/lmhead_dspark.cu  lmhead_dspark
//   kernels/cpu/markov.c        ↔ kernels/cuda/markov.cu         markov_gate_*, markov_rnn_* (DSpark's heads)
//   kernels/cpu/metrics.c       ↔ kernels/cuda/metrics.cu        dpace_weights, block_metrics, dspark_block_metrics
//   kernels/cpu/optim.c         ↔ kernels/cuda/optim.cu          adamw_step, global_norm, clip_by_norm
//   kernels/cpu/adamw_fused.c   ↔ kernels/cuda/adamw_fused.cu    grad_norm_clip, adamw_fused
//   kernels/cpu/moe_router.c    ↔ kernels/cuda/moe_router.cu     moe_scores_*, moe_select, moe_select_backward
//   kernels/cpu/moe_dispatch.c  ↔ kernels/cuda/moe_dispatch.cu   moe_plan, moe_scale_rows, moe_gate_backward,
//                                                                moe_sigmoid_scale
//   kernels/cpu/moe_aux.c       ↔ kernels/cuda/moe_aux.cu        moe_center_*, moe_route_stats, moe_aux_backward,
//                                                                moe_center_ema, moe_noaux_update
//   kernels/cpu/moe_experts.c   ↔ kernels/cuda/moe_experts.cu    moe_grouped_forward/backward
//   kernels/cpu/gru.c           ↔ kernels/cuda/gru.cu            gru_forward/backward (Domino's prefix GRU)
//   kernels/cpu/lmhead_domino.c ↔ kernels/cuda/lmhead_domino.cu  lmhead_domino
//   kernels/cpu/domino_metrics.c ↔ kernels/cuda/domino_metrics.cu masked_silu_*, domino_block_metrics
//   kernels/cpu/ttt_attn.c      ↔ kernels/cuda/ttt_attn.cu       ttt_attn_forward/backward (EAGLE-3)
//   kernels/cpu/eagle3_loss.c   ↔ kernels/cuda/eagle3_loss.cu    lmhead_lse_argmax, eagle3_teacher, eagle3_loss_*,
//                                                                eagle3_step_sums, eagle3_accept
// kernels/cuda/ fills every slot but the ones docs/gpu-training.md lists; kernels/cuda/backend.h holds the state
// every .cu file shares.
#ifndef DF_KERNELS_BACKEND_H
#define DF_KERNELS_BACKEND_H

#include "kernels/causal_attn.h"
#include "kernels/eagle3.h"
#include "kernels/ops.h"
#include "kernels/ops_domino.h"
#include "kernels/ops_moe.h"

#ifdef __cplusplus
extern "C" {
#endif

// Every op of kernels/ops.h that a backend implements; the names (df_op_name) are the ones errors print.
typedef enum {
  DF_OP_MATMUL,
  DF_OP_LINEAR_FORWARD,
  DF_OP_LINEAR_BACKWARD,
  DF_OP_AXPY,
  DF_OP_FILL,
  DF_OP_SCALE,
  DF_OP_CAST,
  DF_OP_RMSNORM_FORWARD,
  DF_OP_RMSNORM_BACKWARD,
  DF_OP_ROPE_FORWARD,
  DF_OP_ROPE_BACKWARD,
  DF_OP_SWIGLU_FORWARD,
  DF_OP_SWIGLU_BACKWARD,
  DF_OP_EMBEDDING_FORWARD,
  DF_OP_EMBEDDING_BACKWARD,
  DF_OP_GATHER_ROWS,
  DF_OP_COPY_2D,
  DF_OP_BLOCK_ATTN_FORWARD,
  DF_OP_BLOCK_ATTN_BACKWARD,
  DF_OP_CAUSAL_ATTN_FORWARD,
  DF_OP_LMHEAD_CE,
  DF_OP_SOFTMAX_L1_FORWARD,
  DF_OP_SOFTMAX_L1_BACKWARD,
  DF_OP_BCE_LOGITS_FORWARD,
  DF_OP_BCE_LOGITS_BACKWARD,
  DF_OP_LMHEAD_DSPARK,
  DF_OP_MARKOV_GATE_FORWARD,
  DF_OP_MARKOV_GATE_BACKWARD,
  DF_OP_MARKOV_RNN_FORWARD,
  DF_OP_MARKOV_RNN_BACKWARD,
  DF_OP_DPACE_WEIGHTS,
  DF_OP_BLOCK_METRICS,
  DF_OP_DSPARK_BLOCK_METRICS,
  DF_OP_ADAMW_STEP,
  DF_OP_GLOBAL_NORM,
  DF_OP_CLIP_BY_NORM,
  DF_OP_GRAD_NORM_CLIP,
  DF_OP_ADAMW_FUSED,
  DF_OP_MOE_SCORES_FORWARD,
  DF_OP_MOE_SCORES_BACKWARD,
  DF_OP_MOE_SELECT,
  DF_OP_MOE_SELECT_BACKWARD,
  DF_OP_MOE_CENTER_FORWARD,
  DF_OP_MOE_CENTER_BACKWARD,
  DF_OP_MOE_PLAN,
  DF_OP_MOE_SCALE_ROWS,
  DF_OP_MOE_GATE_BACKWARD,
  DF_OP_MOE_SIGMOID_SCALE,
  DF_OP_MOE_ROUTE_STATS,
  DF_OP_MOE_AUX_BACKWARD,
  DF_OP_MOE_CENTER_EMA,
  DF_OP_MOE_NOAUX_UPDATE,
  DF_OP_MOE_GROUPED_FORWARD,
  DF_OP_MOE_GROUPED_BACKWARD,
  DF_OP_GRU_FORWARD,
  DF_OP_GRU_BACKWARD,
  DF_OP_MASKED_SILU_FORWARD,
  DF_OP_MASKED_SILU_BACKWARD,
  DF_OP_LMHEAD_DOMINO,
  DF_OP_DOMINO_BLOCK_METRICS,
  DF_OP_TTT_ATTN_FORWARD,
  DF_OP_TTT_ATTN_BACKWARD,
  DF_OP_LMHEAD_LSE_ARGMAX,
  DF_OP_EAGLE3_TEACHER,
  DF_OP_EAGLE3_LOSS_FORWARD,
  DF_OP_EAGLE3_LOSS_BACKWARD,
  DF_OP_EAGLE3_STEP_SUMS,
  DF_OP_EAGLE3_ACCEPT,
  DF_OP_COUNT
} df_op;

const char *df_op_name(df_op op);

// ---- op signatures: the parameters of the df_<op> of the same name in kernels/ops.h ----------------------------
// A backend op is called only after its dispatcher validated every argument (dtypes, devices, shapes,
// contiguity) and the table accepted the storage dtype; it may assume valid input.

typedef df_status df_matmul_fn(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b,
                               float alpha, float beta, df_tensor *c, df_error *err);
typedef df_status df_linear_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b,
                                       df_tensor *y, df_error *err);
typedef df_status df_linear_backward_fn(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                        df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err);
typedef df_status df_axpy_fn(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err);
typedef df_status df_fill_fn(df_ctx *ctx, df_tensor *t, double value, df_error *err);
typedef df_status df_scale_fn(df_ctx *ctx, df_tensor *t, float alpha, df_error *err);
typedef df_status df_cast_fn(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err);
typedef df_status df_rmsnorm_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                                        df_tensor *rstd, df_error *err);
typedef df_status df_rmsnorm_backward_fn(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                         const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                         df_error *err);
typedef df_status df_rope_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                                     float mscale, df_tensor *y, df_error *err);
typedef df_status df_rope_backward_fn(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                                      float mscale, df_tensor *dx, df_error *err);
typedef df_status df_swiglu_forward_fn(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                                       df_error *err);
typedef df_status df_swiglu_backward_fn(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u,
                                        float limit, df_tensor *dg, df_tensor *du, df_error *err);
typedef df_status df_embedding_forward_fn(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                                          df_error *err);
typedef df_status df_embedding_backward_fn(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                           df_error *err);
typedef df_status df_gather_rows_fn(df_ctx *ctx, const df_tensor *src, const df_tensor *idx, df_tensor *out,
                                    df_error *err);
typedef df_status df_copy_2d_fn(df_ctx *ctx, const df_copy_2d_desc *desc, const df_tensor *src, df_tensor *dst,
                                df_error *err);
typedef df_status df_block_attn_forward_fn(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                           const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                           const df_tensor *keep, df_tensor *out, df_tensor *lse, df_error *err);
typedef df_status df_block_attn_backward_fn(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                            const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                            const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                            const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                            df_error *err);
typedef df_status df_causal_attn_forward_fn(df_ctx *ctx, const df_causal_attn_desc *desc, const df_tensor *q,
                                            const df_tensor *k, const df_tensor *v, df_tensor *out, df_error *err);
typedef df_status df_lmhead_ce_fn(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden,
                                  const df_tensor *head, const df_tensor *labels, const df_tensor *weights,
                                  df_tensor *loss, df_tensor *correct, df_tensor *dhidden, df_error *err);
typedef df_status df_softmax_l1_forward_fn(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1,
                                           df_error *err);
typedef df_status df_softmax_l1_backward_fn(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                            df_tensor *dp, df_error *err);
typedef df_status df_bce_logits_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss,
                                           df_error *err);
typedef df_status df_bce_logits_backward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                            df_tensor *dx, df_error *err);
typedef df_status df_lmhead_dspark_fn(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                                      const df_lmhead_dspark_out *out, df_error *err);
typedef df_status df_markov_gate_forward_fn(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate,
                                            df_tensor *u, df_error *err);
typedef df_status df_markov_gate_backward_fn(df_ctx *ctx, const df_tensor *gate, const df_tensor *e,
                                             const df_tensor *du, df_tensor *de, df_tensor *dpre, df_error *err);
typedef df_status df_markov_rnn_forward_fn(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                           const df_tensor *s_prev, df_tensor *s, df_tensor *u, df_error *err);
typedef df_status df_markov_rnn_backward_fn(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                            const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                            df_error *err);
typedef df_status df_dpace_weights_fn(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                                      const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err);
typedef df_status df_block_metrics_fn(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct,
                                      const df_tensor *lw, const df_tensor *valid, const df_tensor *keep,
                                      df_tensor *stats, df_error *err);
typedef df_status df_dspark_block_metrics_fn(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *in, df_tensor *stats,
                                             df_error *err);
typedef df_status df_adamw_step_fn(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                                   const df_adamw_hparams *hp, df_error *err);
typedef df_status df_global_norm_fn(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err);
typedef df_status df_clip_by_norm_fn(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm,
                                     double *coef, df_error *err);
typedef df_status df_grad_norm_clip_fn(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad,
                                       const df_tensor *mask, const df_tensor *guard, df_tensor *out, df_error *err);
typedef df_status df_adamw_fused_fn(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master,
                                    const df_tensor *grad, df_tensor *m, df_tensor *v, const df_tensor *mask,
                                    const df_tensor *norm_stats, df_tensor *params, df_error *err);

typedef df_status df_moe_scores_forward_fn(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits, df_tensor *scores,
                                           df_error *err);
typedef df_status df_moe_scores_backward_fn(df_ctx *ctx, df_moe_score_func f, const df_tensor *logits,
                                            const df_tensor *scores, const df_tensor *dscores, df_tensor *dlogits,
                                            df_error *err);
typedef df_status df_moe_select_fn(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores,
                                   const df_tensor *sel_shift, df_tensor *indices, df_tensor *weights,
                                   df_tensor *counts, df_error *err);
typedef df_status df_moe_select_backward_fn(df_ctx *ctx, const df_moe_route_desc *desc, const df_tensor *scores,
                                            const df_tensor *indices, const df_tensor *weights,
                                            const df_tensor *dweights, const df_tensor *aux_row, df_tensor *dscores,
                                            df_error *err);
typedef df_status df_moe_center_forward_fn(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *x,
                                           const df_tensor *mu, df_tensor *u, df_tensor *batch_mean, df_error *err);
typedef df_status df_moe_center_backward_fn(df_ctx *ctx, int64_t rows_per_sample, const df_tensor *du, df_tensor *dx,
                                            bool accumulate, df_error *err);
typedef df_status df_moe_plan_fn(df_ctx *ctx, int64_t k, const df_tensor *indices, const df_tensor *counts,
                                 df_tensor *offsets, df_tensor *slot, df_tensor *token, df_error *err);
typedef df_status df_moe_scale_rows_fn(df_ctx *ctx, df_tensor *h, const df_tensor *w, const df_tensor *idx,
                                       df_error *err);
typedef df_status df_moe_gate_backward_fn(df_ctx *ctx, bool sigmoid, df_tensor *dh, const df_tensor *act,
                                          const df_tensor *w, const df_tensor *idx, df_tensor *out, df_error *err);
typedef df_status df_moe_sigmoid_scale_fn(df_ctx *ctx, df_tensor *z, df_tensor *a, df_error *err);
typedef df_status df_moe_route_stats_fn(df_ctx *ctx, const df_moe_stats_desc *desc, const df_tensor *scores,
                                        const df_tensor *counts, const df_tensor *bias, df_tensor *stats,
                                        bool accumulate, df_tensor *count_stash, df_error *err);
typedef df_status df_moe_aux_backward_fn(df_ctx *ctx, const df_moe_stats_desc *desc, int64_t T, const df_tensor *counts,
                                         double upstream, df_tensor *row, df_error *err);
typedef df_status df_moe_center_ema_fn(df_ctx *ctx, double rho, const df_tensor *stash, df_tensor *mu, df_tensor *steps,
                                       df_error *err);
typedef df_status df_moe_noaux_update_fn(df_ctx *ctx, float rate, const df_tensor *load, df_tensor *bias,
                                         df_error *err);
typedef df_status df_moe_grouped_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *w,
                                            const df_tensor *offsets, df_tensor *y, df_error *err);
typedef df_status df_moe_grouped_backward_fn(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                             const df_tensor *offsets, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                             df_error *err);
typedef df_status df_gru_forward_fn(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh,
                                    df_tensor *s, df_tensor *gates, df_error *err);
typedef df_status df_gru_backward_fn(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                                     const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh,
                                     df_error *err);
typedef df_status df_masked_silu_forward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *mask, df_tensor *y,
                                            df_error *err);
typedef df_status df_masked_silu_backward_fn(df_ctx *ctx, const df_tensor *x, const df_tensor *mask,
                                             const df_tensor *dy, df_tensor *dx, df_error *err);
typedef df_status df_lmhead_domino_fn(df_ctx *ctx, const df_lmhead_domino_desc *desc, const df_lmhead_domino_in *in,
                                      const df_lmhead_domino_out *out, df_error *err);
typedef df_status df_domino_block_metrics_fn(df_ctx *ctx, int64_t bs, const df_domino_metrics_in *in, df_tensor *stats,
                                             df_error *err);
typedef df_status df_ttt_attn_forward_fn(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q,
                                         const df_tensor *k, const df_tensor *v, const df_tensor *lengths,
                                         df_tensor *out, df_tensor *lse, df_error *err);
typedef df_status df_ttt_attn_backward_fn(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q,
                                          const df_tensor *k, const df_tensor *v, const df_tensor *lengths,
                                          const df_tensor *out, const df_tensor *lse, const df_tensor *dout,
                                          df_tensor *dq, df_tensor *dk, df_tensor *dv, df_error *err);
typedef df_status df_lmhead_lse_argmax_fn(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden,
                                          const df_tensor *head, df_tensor *lse, df_tensor *argmax, df_error *err);
typedef df_status df_eagle3_teacher_fn(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                                       const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio,
                                       df_tensor *pm, df_error *err);
typedef df_status df_eagle3_loss_forward_fn(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                            const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out,
                                            df_error *err);
typedef df_status df_eagle3_loss_backward_fn(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                             const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                             df_error *err);
typedef df_status df_eagle3_step_sums_fn(df_ctx *ctx, const df_eagle3_sums_desc *desc, const df_eagle3_row_terms *rows,
                                         df_tensor *local, df_tensor *stats, df_error *err);
typedef df_status df_eagle3_accept_fn(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                                      int64_t blocks, df_tensor *stats, df_error *err);

// ---- the table -------------------------------------------------------------------------------------------------

typedef struct df_backend {
  const char *name;      // "cpu", "cuda", "fake": errors name it
  df_device device;      // the device its buffers live on
  bool host_addressable; // host code may read and write its buffers directly (the CPU only)

  // Devices of this kind the process can see (NULL: always one).
  int (*device_count)(void);
  // Lifetime: init builds the backend's per-context state in ctx->state (NULL: none); destroy frees it.
  df_status (*init)(df_ctx *ctx, const df_ctx_options *opt, df_error *err);
  void (*destroy)(df_ctx *ctx);
  // Whether op runs with tensors of storage dtype `storage` (the dtype of its activation / weight / gradient
  // tensors; statistics are always fp32). NULL: fp32 only. A NULL op slot is never supported.
  bool (*supports_op)(const df_ctx *ctx, df_op op, df_dtype storage);

  // Memory on the device (alloc(0) returns a valid, freeable pointer) and page-locked host memory for staging.
  df_status (*alloc)(df_ctx *ctx, size_t bytes, void **out, df_error *err);
  void (*free)(df_ctx *ctx, void *p);
  df_status (*host_alloc)(df_ctx *ctx, size_t bytes, void **out, df_error *err);
  void (*host_free)(df_ctx *ctx, void *p);
  // A copy between any two of {host, this device}, queued on the context's stream. With async false it has
  // completed when copy returns; with async true the host side must stay untouched until an event recorded
  // after it has completed (df_event_*). kernels/context.c counts host↔device transfers around this call.
  df_status (*copy)(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                    bool async, df_error *err);
  // Events mark a point in the context's queue: record places it, wait blocks the host until the queue
  // reaches it. Backends that run ops synchronously implement both as no-ops.
  df_status (*event_create)(df_ctx *ctx, void **event, df_error *err);
  df_status (*event_record)(df_ctx *ctx, void *event, df_error *err);
  df_status (*event_wait)(df_ctx *ctx, void *event, df_error *err);
  void (*event_destroy)(df_ctx *ctx, void *event);
  // Blocks until everything queued on the context has run; reports an asynchronous failure, if any.
  df_status (*sync)(df_ctx *ctx, df_error *err);

  // Measure mode (df_ctx_options.measure; kernels/context.c). state_device_bytes: the device memory init allocates
  // for the context's own state (through df_buffer_alloc_as, DF_MEM_WORKSPACE), which a measuring context — it never
  // calls init — accounts instead. measures[op]: the op takes workspace, and its implementation has a measure path
  // (df_ctx_measure_only): on a measuring context it requests that workspace and returns before touching data or
  // state. Every other op ends in its dispatcher there (DF_REQUIRE_OP, kernels/check.h). The file that sets an op's
  // slot sets its flag.
  size_t state_device_bytes;
  bool measures[DF_OP_COUNT];

  // Ops (NULL: not implemented by this backend), by name and, for generic checks, by df_op (kernels/backend.c
  // asserts at compile time that the two orders agree).
  union {
    struct {
      df_matmul_fn *matmul;
      df_linear_forward_fn *linear_forward;
      df_linear_backward_fn *linear_backward;
      df_axpy_fn *axpy;
      df_fill_fn *fill;
      df_scale_fn *scale;
      df_cast_fn *cast;
      df_rmsnorm_forward_fn *rmsnorm_forward;
      df_rmsnorm_backward_fn *rmsnorm_backward;
      df_rope_forward_fn *rope_forward;
      df_rope_backward_fn *rope_backward;
      df_swiglu_forward_fn *swiglu_forward;
      df_swiglu_backward_fn *swiglu_backward;
      df_embedding_forward_fn *embedding_forward;
      df_embedding_backward_fn *embedding_backward;
      df_gather_rows_fn *gather_rows;
      df_copy_2d_fn *copy_2d;
      df_block_attn_forward_fn *block_attn_forward;
      df_block_attn_backward_fn *block_attn_backward;
      df_causal_attn_forward_fn *causal_attn_forward;
      df_lmhead_ce_fn *lmhead_ce;
      df_softmax_l1_forward_fn *softmax_l1_forward;
      df_softmax_l1_backward_fn *softmax_l1_backward;
      df_bce_logits_forward_fn *bce_logits_forward;
      df_bce_logits_backward_fn *bce_logits_backward;
      df_lmhead_dspark_fn *lmhead_dspark;
      df_markov_gate_forward_fn *markov_gate_forward;
      df_markov_gate_backward_fn *markov_gate_backward;
      df_markov_rnn_forward_fn *markov_rnn_forward;
      df_markov_rnn_backward_fn *markov_rnn_backward;
      df_dpace_weights_fn *dpace_weights;
      df_block_metrics_fn *block_metrics;
      df_dspark_block_metrics_fn *dspark_block_metrics;
      df_adamw_step_fn *adamw_step;
      df_global_norm_fn *global_norm;
      df_clip_by_norm_fn *clip_by_norm;
      df_grad_norm_clip_fn *grad_norm_clip;
      df_adamw_fused_fn *adamw_fused;
      df_moe_scores_forward_fn *moe_scores_forward;
      df_moe_scores_backward_fn *moe_scores_backward;
      df_moe_select_fn *moe_select;
      df_moe_select_backward_fn *moe_select_backward;
      df_moe_center_forward_fn *moe_center_forward;
      df_moe_center_backward_fn *moe_center_backward;
      df_moe_plan_fn *moe_plan;
      df_moe_scale_rows_fn *moe_scale_rows;
      df_moe_gate_backward_fn *moe_gate_backward;
      df_moe_sigmoid_scale_fn *moe_sigmoid_scale;
      df_moe_route_stats_fn *moe_route_stats;
      df_moe_aux_backward_fn *moe_aux_backward;
      df_moe_center_ema_fn *moe_center_ema;
      df_moe_noaux_update_fn *moe_noaux_update;
      df_moe_grouped_forward_fn *moe_grouped_forward;
      df_moe_grouped_backward_fn *moe_grouped_backward;
      df_gru_forward_fn *gru_forward;
      df_gru_backward_fn *gru_backward;
      df_masked_silu_forward_fn *masked_silu_forward;
      df_masked_silu_backward_fn *masked_silu_backward;
      df_lmhead_domino_fn *lmhead_domino;
      df_domino_block_metrics_fn *domino_block_metrics;
      df_ttt_attn_forward_fn *ttt_attn_forward;
      df_ttt_attn_backward_fn *ttt_attn_backward;
      df_lmhead_lse_argmax_fn *lmhead_lse_argmax;
      df_eagle3_teacher_fn *eagle3_teacher;
      df_eagle3_loss_forward_fn *eagle3_loss_forward;
      df_eagle3_loss_backward_fn *eagle3_loss_backward;
      df_eagle3_step_sums_fn *eagle3_step_sums;
      df_eagle3_accept_fn *eagle3_accept;
    };
    void (*slot[DF_OP_COUNT])(void);
  };
} df_backend;

// The tables. df_cuda_backend() is NULL in a build without the CUDA backend.
const df_backend *df_cpu_backend(void);
const df_backend *df_cuda_backend(void);
const df_backend *df_fake_backend(void);
// The fake device with untouchable memory (kernels/fake/strict.c): any host dereference of its buffers faults.
const df_backend *df_fake_strict_backend(void);

// A context on an explicit table (tests: a table with a slot removed, a counting wrapper). The table must
// outlive the context; opt->device is ignored (the table's device is used).
df_status df_ctx_create_with(const df_backend *be, const df_ctx_options *opt, df_ctx **out, df_error *err);

// For dispatchers: DF_OK when ctx's backend has the op and takes the storage dtype; otherwise an error naming the
// op, the backend and the dtype.
df_status df_backend_require(const df_ctx *ctx, df_op op, df_dtype storage, df_error *err);
// Whether a table has every op (the commands' device: auto picks a backend only then); *missing: the first it lacks.
bool df_backend_complete(const df_backend *be, const char **missing);

#ifdef __cplusplus
}
#endif

#endif
