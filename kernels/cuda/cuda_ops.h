// CUDA backend entry points, same signatures as kernels/ops.h. Built from kernels/cuda/*.cu when nvcc is
// found; otherwise kernels/cuda/cuda_absent.c provides only the lifetime hooks (every CUDA context fails)
// and DF_DISPATCH routes ops to df_no_cuda_backend.
#ifndef DF_KERNELS_CUDA_OPS_H
#define DF_KERNELS_CUDA_OPS_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Backend lifetime: the context owns these handles (cuBLAS/cuBLASLt, stream).
df_status df_cuda_ctx_init(int device, void **backend, df_error *err);
void df_cuda_ctx_free(void *backend);
int df_cuda_device_count(void);
df_status df_cuda_alloc(void *backend, size_t bytes, void **out, df_error *err);
void df_cuda_free(void *backend, void *p);
// kind: 0 host→device, 1 device→host, 2 device→device
df_status df_cuda_memcpy(void *backend, void *dst, const void *src, size_t bytes, int kind, df_error *err);
df_status df_cuda_sync(void *backend, df_error *err);

df_status df_cuda_matmul(df_ctx *ctx, const df_tensor *a, bool trans_a, const df_tensor *b, bool trans_b, float alpha,
                         float beta, df_tensor *c, df_error *err);
df_status df_cuda_linear_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, const df_tensor *b, df_tensor *y,
                                 df_error *err);
df_status df_cuda_linear_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                  df_tensor *dx, bool accumulate_dx, df_tensor *dw, df_tensor *db, df_error *err);
df_status df_cuda_axpy(df_ctx *ctx, float alpha, const df_tensor *x, df_tensor *y, df_error *err);
df_status df_cuda_rmsnorm_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *w, float eps, df_tensor *y,
                                  df_tensor *rstd, df_error *err);
df_status df_cuda_rmsnorm_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *x, const df_tensor *w,
                                   const df_tensor *rstd, df_tensor *dx, bool accumulate_dx, df_tensor *dw,
                                   df_error *err);
df_status df_cuda_rope_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *pos, const df_tensor *inv_freq,
                               float mscale, df_tensor *y, df_error *err);
df_status df_cuda_rope_backward(df_ctx *ctx, const df_tensor *dy, const df_tensor *pos, const df_tensor *inv_freq,
                                float mscale, df_tensor *dx, df_error *err);
df_status df_cuda_swiglu_forward(df_ctx *ctx, const df_tensor *g, const df_tensor *u, float limit, df_tensor *h,
                                 df_error *err);
df_status df_cuda_swiglu_backward(df_ctx *ctx, const df_tensor *dh, const df_tensor *g, const df_tensor *u, float limit,
                                  df_tensor *dg, df_tensor *du, df_error *err);
df_status df_cuda_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                                    df_error *err);
df_status df_cuda_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                     df_error *err);
df_status df_cuda_block_attn_forward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                     const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                     const df_tensor *keep, df_tensor *out, df_tensor *lse, df_error *err);
df_status df_cuda_block_attn_backward(df_ctx *ctx, const df_block_attn_desc *desc, const df_tensor *q,
                                      const df_tensor *k, const df_tensor *v, const df_tensor *anchors,
                                      const df_tensor *keep, const df_tensor *out, const df_tensor *lse,
                                      const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv,
                                      df_error *err);
df_status df_cuda_lmhead_ce(df_ctx *ctx, const df_lmhead_ce_desc *desc, const df_tensor *hidden, const df_tensor *head,
                            const df_tensor *labels, const df_tensor *weights, df_tensor *loss, df_tensor *correct,
                            df_tensor *dhidden, df_error *err);
df_status df_cuda_softmax_l1_forward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, df_tensor *l1, df_error *err);
df_status df_cuda_softmax_l1_backward(df_ctx *ctx, const df_tensor *p, const df_tensor *q, const df_tensor *dl1,
                                      df_tensor *dp, df_error *err);
df_status df_cuda_bce_logits_forward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, df_tensor *loss,
                                     df_error *err);
df_status df_cuda_bce_logits_backward(df_ctx *ctx, const df_tensor *x, const df_tensor *t, const df_tensor *dloss,
                                      df_tensor *dx, df_error *err);
df_status df_cuda_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                                const df_lmhead_dspark_out *out, df_error *err);
df_status df_cuda_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                             const df_adamw_hparams *hp, df_error *err);
df_status df_cuda_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err);
df_status df_cuda_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                               df_error *err);

#ifdef __cplusplus
}
#endif

#endif
