// Pieces the draft models share (modeling/model_util.h).
#include "modeling/model_util.h"

#include <stdlib.h>

#include "modeling/draft_layer.h"

df_status df_rope_upload(const df_rope_config *rope, int64_t hd, df_ctx *ctx, float **inv_freq, float *mscale,
                         df_error *err) {
  const size_t bytes = sizeof(float) * (size_t)(hd / 2);
  float *host = malloc(bytes);
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, "rope", NULL, "cannot allocate the RoPE table");
  df_status st = dflash_rope_table(rope, host, mscale, err);
  if (st == DF_OK) st = df_buffer_alloc(ctx, bytes, (void **)inv_freq, err);
  if (st == DF_OK) st = df_copy(ctx, *inv_freq, df_ctx_device(ctx), host, DF_DEV_CPU, bytes, err);
  free(host);
  return st;
}

df_status df_cols_copy(df_ctx *ctx, df_dtype dt, int64_t rows, int64_t cols, const void *src, int64_t s_off,
                       int64_t s_ld, void *dst, int64_t d_off, int64_t d_ld, bool add, df_error *err) {
  const df_copy_2d_desc d = {.rows = rows,
                             .cols = cols,
                             .src_offset = s_off,
                             .src_stride = s_ld,
                             .dst_offset = d_off,
                             .dst_stride = d_ld,
                             .accumulate = add};
  const df_device dev = df_ctx_device(ctx);
  df_tensor s = df_view((void *)src, dt, dev, 1, (const int64_t[]){rows * s_ld});
  df_tensor t = df_view(dst, dt, dev, 1, (const int64_t[]){rows * d_ld});
  return df_copy_2d(ctx, &d, &s, &t, err);
}

static df_tensor mat(df_ctx *ctx, df_dtype dt, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, dt, df_ctx_device(ctx), 2, (const int64_t[]){rows, cols});
}

df_status df_llama_tail_forward(df_ctx *ctx, const df_llama_tail *t, int64_t R, const void *res,
                                const df_llama_tail_acts *a, df_error *err) {
  const int64_t H = t->H, I = t->I;
  const df_dtype dt = t->dt;
  df_tensor at = mat(ctx, dt, a->attn, R, t->qd), hm = mat(ctx, dt, a->h_mid, R, H), rs = mat(ctx, dt, res, R, H);
  DF_TRY(df_linear_forward(ctx, &at, &t->o->w, NULL, &hm, err));
  DF_TRY(df_axpy(ctx, 1.0f, &rs, &hm, err));
  df_tensor y = mat(ctx, dt, a->y, R, H), g = mat(ctx, dt, a->g, R, I), u = mat(ctx, dt, a->u, R, I);
  df_tensor act = mat(ctx, dt, a->a, R, I), ho = mat(ctx, dt, a->h_out, R, H);
  df_tensor rp = df_view(a->rstd_p, DF_F32, df_ctx_device(ctx), 1, (const int64_t[]){R});
  DF_TRY(df_rmsnorm_forward(ctx, &hm, &t->post_norm->w, t->eps, &y, &rp, err));
  DF_TRY(df_linear_forward(ctx, &y, &t->gate->w, NULL, &g, err));
  DF_TRY(df_linear_forward(ctx, &y, &t->up->w, NULL, &u, err));
  DF_TRY(df_swiglu_forward(ctx, &g, &u, 0.0f, &act, err));
  DF_TRY(df_linear_forward(ctx, &act, &t->down->w, NULL, &ho, err));
  return df_axpy(ctx, 1.0f, &hm, &ho, err);
}

df_status df_llama_tail_backward(df_ctx *ctx, const df_llama_tail *t, int64_t R, const df_llama_tail_acts *a, void *dh,
                                 void *dattn, void *da, void *dg, void *du, void *dy, df_error *err) {
  const int64_t H = t->H, I = t->I;
  const df_dtype dt = t->dt;
  df_tensor dhv = mat(ctx, dt, dh, R, H), act = mat(ctx, dt, a->a, R, I), dav = mat(ctx, dt, da, R, I);
  df_tensor g = mat(ctx, dt, a->g, R, I), u = mat(ctx, dt, a->u, R, I), dgv = mat(ctx, dt, dg, R, I);
  df_tensor duv = mat(ctx, dt, du, R, I), y = mat(ctx, dt, a->y, R, H), dyv = mat(ctx, dt, dy, R, H);
  df_tensor hm = mat(ctx, dt, a->h_mid, R, H);
  df_tensor rp = df_view(a->rstd_p, DF_F32, df_ctx_device(ctx), 1, (const int64_t[]){R});
  df_pview *down = t->down, *gate = t->gate, *up = t->up, *post = t->post_norm, *o = t->o;
  DF_TRY(df_linear_backward(ctx, &dhv, &act, &down->w, &dav, false, &down->g, NULL, err));
  DF_TRY(df_swiglu_backward(ctx, &dav, &g, &u, 0.0f, &dgv, &duv, err));
  DF_TRY(df_linear_backward(ctx, &dgv, &y, &gate->w, &dyv, false, &gate->g, NULL, err));
  DF_TRY(df_linear_backward(ctx, &duv, &y, &up->w, &dyv, true, &up->g, NULL, err));
  DF_TRY(df_rmsnorm_backward(ctx, &dyv, &hm, &post->w, &rp, &dhv, true, &post->g, err));
  df_tensor at = mat(ctx, dt, a->attn, R, t->qd), dat = mat(ctx, dt, dattn, R, t->qd);
  return df_linear_backward(ctx, &dhv, &at, &o->w, &dat, false, &o->g, NULL, err);
}
