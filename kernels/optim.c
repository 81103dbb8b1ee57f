// Dispatch and validation for the optimizer ops: AdamW step, global gradient norm, clip by norm.
#include <math.h>
#include <stdio.h>

#include "kernels/check.h"

// Byte ranges of a and b intersect (the CPU kernel declares its buffers restrict).
static bool overlaps(const df_tensor *a, const df_tensor *b) {
  const char *pa = a->data, *pb = b->data;
  size_t na = (size_t)df_numel(a) * df_dtype_size(a->dtype), nb = (size_t)df_numel(b) * df_dtype_size(b->dtype);
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

static df_status check_adamw_buffers(df_ctx *ctx, const df_tensor *param, const df_tensor *grad, const df_tensor *m,
                                     const df_tensor *v, df_error *err) {
  const df_tensor *t[4] = {param, grad, m, v};
  const char *names[4] = {"param", "grad", "m", "v"};
  for (int i = 0; i < 4; i++) DF_TRY(df_check_tensor(ctx, t[i], names[i], DF_F32, -1, err));
  for (int i = 1; i < 4; i++) DF_TRY(df_check_same_numel(param, "param", t[i], names[i], err));
  for (int i = 1; i < 4; i++)
    for (int j = 0; j < i; j++)
      if (overlaps(t[i], t[j]))
        return DF_FAIL(err, DF_ERR_INVALID, names[i], "give param, grad, m and v separate storage",
                       "tensor '%s' overlaps '%s'", names[i], names[j]);
  return DF_OK;
}

// The ranges torch.optim.AdamW accepts (its ValueErrors), plus a finite, positive eps.
static df_status check_adamw_hparams(const df_adamw_hparams *hp, df_error *err) {
  if (!hp) return DF_FAIL(err, DF_ERR_INVALID, "hp", "pass the AdamW hyperparameters", "hp is NULL");
  if (!(hp->lr >= 0.0f && isfinite(hp->lr)))
    return DF_FAIL(err, DF_ERR_INVALID, "hp.lr", "the learning rate must be finite and >= 0", "lr = %g", hp->lr);
  if (!(hp->beta1 >= 0.0f && hp->beta1 < 1.0f))
    return DF_FAIL(err, DF_ERR_INVALID, "hp.beta1", "use 0 <= beta1 < 1 (usually 0.9)", "beta1 = %g", hp->beta1);
  if (!(hp->beta2 >= 0.0f && hp->beta2 < 1.0f))
    return DF_FAIL(err, DF_ERR_INVALID, "hp.beta2", "use 0 <= beta2 < 1 (usually 0.999)", "beta2 = %g", hp->beta2);
  if (!(hp->eps > 0.0f && isfinite(hp->eps)))
    return DF_FAIL(err, DF_ERR_INVALID, "hp.eps", "use a small positive eps (usually 1e-8)", "eps = %g", hp->eps);
  if (!(hp->weight_decay >= 0.0f && isfinite(hp->weight_decay)))
    return DF_FAIL(err, DF_ERR_INVALID, "hp.weight_decay", "use a finite weight decay >= 0", "weight_decay = %g",
                   hp->weight_decay);
  if (hp->step < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "hp.step", "step counts updates from 1 (bias correction uses it)",
                   "step = %lld", (long long)hp->step);
  return DF_OK;
}

df_status df_adamw_step(df_ctx *ctx, df_tensor *param, const df_tensor *grad, df_tensor *m, df_tensor *v,
                        const df_adamw_hparams *hp, df_error *err) {
  DF_TRY(check_adamw_buffers(ctx, param, grad, m, v, err));
  DF_TRY(check_adamw_hparams(hp, err));
  DF_REQUIRE_OP(ctx, DF_OP_ADAMW_STEP, DF_F32, err);
  return ctx->backend->adamw_step(ctx, param, grad, m, v, hp, err);
}

// bufs[0..nbufs) are fp32 tensors on ctx's device; each error names "bufs[i]".
static df_status check_buffer_list(df_ctx *ctx, const df_tensor *bufs, int nbufs, df_error *err) {
  if (nbufs < 0) return DF_FAIL(err, DF_ERR_INVALID, "nbufs", "pass the number of buffers (>= 0)", "nbufs = %d", nbufs);
  if (nbufs > 0 && !bufs)
    return DF_FAIL(err, DF_ERR_INVALID, "bufs", "pass an array of nbufs tensors", "bufs is NULL but nbufs = %d", nbufs);
  char name[32];
  for (int i = 0; i < nbufs; i++) {
    snprintf(name, sizeof name, "bufs[%d]", i);
    DF_TRY(df_check_tensor(ctx, &bufs[i], name, DF_F32, -1, err));
  }
  return DF_OK;
}

df_status df_global_norm(df_ctx *ctx, const df_tensor *bufs, int nbufs, double *norm, df_error *err) {
  DF_TRY(check_buffer_list(ctx, bufs, nbufs, err));
  if (!norm) return DF_FAIL(err, DF_ERR_INVALID, "norm", "pass where to store the norm", "norm is NULL");
  DF_REQUIRE_OP(ctx, DF_OP_GLOBAL_NORM, DF_F32, err);
  return ctx->backend->global_norm(ctx, bufs, nbufs, norm, err);
}

df_status df_clip_by_norm(df_ctx *ctx, df_tensor *bufs, int nbufs, double norm, double max_norm, double *coef,
                          df_error *err) {
  DF_TRY(check_buffer_list(ctx, bufs, nbufs, err));
  if (!coef) return DF_FAIL(err, DF_ERR_INVALID, "coef", "pass where to store the clip coefficient", "coef is NULL");
  if (!(max_norm > 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "max_norm", "use a positive max_norm (recipes use 0.5 or 1.0)", "max_norm = %g",
                   max_norm);
  if (norm < 0.0)
    return DF_FAIL(err, DF_ERR_INVALID, "norm", "pass the result of df_global_norm", "norm = %g < 0", norm);
  // A NaN/Inf norm means a non-finite gradient somewhere: the step must be skipped, not rescaled.
  if (!isfinite(norm))
    return DF_FAIL(err, DF_ERR_NUMERIC, "norm", "skip this optimizer step (zero the gradients and continue)",
                   "gradient norm is %g; buffers left unchanged", norm);
  if (df_ctx_measure_only(ctx)) *coef = 1.0; // what a norm of zeros read back gives
  DF_REQUIRE_OP(ctx, DF_OP_CLIP_BY_NORM, DF_F32, err);
  return ctx->backend->clip_by_norm(ctx, bufs, nbufs, norm, max_norm, coef, err);
}

// ---- the fused flat step -------------------------------------------------------------------------------------

// mask is u8 with one flag byte per element of grad.
static df_status check_mask(df_ctx *ctx, const df_tensor *mask, const df_tensor *like, df_error *err) {
  DF_TRY(df_check_tensor(ctx, mask, "mask", DF_U8, -1, err));
  return df_check_same_numel(like, "grad", mask, "mask", err);
}

static df_status check_norm_stats(df_ctx *ctx, const df_tensor *t, const char *name, df_error *err) {
  return df_check_per_row(ctx, t, name, DF_F64, DF_NORM_STATS, err);
}

df_status df_grad_norm_clip(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad, const df_tensor *mask,
                            const df_tensor *guard, df_tensor *out, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_grad_norm_desc", "desc is NULL");
  if (!isfinite(desc->grad_scale))
    return DF_FAIL(err, DF_ERR_INVALID, "grad_scale", "the window needs a positive loss weight",
                   "grad_scale = %g is not finite", (double)desc->grad_scale);
  if (!(desc->max_norm > 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "max_norm", "use a positive max_norm (recipes use 0.5 or 1.0)", "max_norm = %g",
                   desc->max_norm);
  df_dtype st;
  DF_TRY(df_check_storage(grad, "grad", &st, err));
  DF_TRY(df_check_tensor(ctx, grad, "grad", st, -1, err));
  DF_TRY(check_mask(ctx, mask, grad, err));
  if (guard) DF_TRY(df_check_tensor(ctx, guard, "guard", DF_F64, -1, err));
  DF_TRY(check_norm_stats(ctx, out, "out", err));
  DF_REQUIRE_OP(ctx, DF_OP_GRAD_NORM_CLIP, st, err);
  return ctx->backend->grad_norm_clip(ctx, desc, grad, mask, guard, out, err);
}

df_status df_adamw_fused(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master, const df_tensor *grad,
                         df_tensor *m, df_tensor *v, const df_tensor *mask, const df_tensor *norm_stats,
                         df_tensor *params, df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_adamw_fused_desc", "desc is NULL");
  DF_TRY(check_adamw_hparams(&desc->hp, err));
  if (!isfinite(desc->grad_scale))
    return DF_FAIL(err, DF_ERR_INVALID, "grad_scale", "the window needs a positive loss weight",
                   "grad_scale = %g is not finite", (double)desc->grad_scale);
  df_dtype st;
  DF_TRY(df_check_storage(grad, "grad", &st, err));
  const df_tensor *f32s[3] = {master, m, v};
  const char *names[3] = {"master", "m", "v"};
  for (int i = 0; i < 3; i++) DF_TRY(df_check_tensor(ctx, f32s[i], names[i], DF_F32, -1, err));
  DF_TRY(df_check_tensor(ctx, grad, "grad", st, -1, err));
  for (int i = 1; i < 3; i++) DF_TRY(df_check_same_numel(master, "master", f32s[i], names[i], err));
  DF_TRY(df_check_same_numel(master, "master", grad, "grad", err));
  for (int i = 1; i < 3; i++)
    for (int j = 0; j < i; j++)
      if (overlaps(f32s[i], f32s[j]))
        return DF_FAIL(err, DF_ERR_INVALID, names[i], "give master, m and v separate storage",
                       "tensor '%s' overlaps '%s'", names[i], names[j]);
  DF_TRY(check_mask(ctx, mask, grad, err));
  if (norm_stats) DF_TRY(check_norm_stats(ctx, norm_stats, "norm_stats", err));
  if (params) {
    df_dtype ps;
    DF_TRY(df_check_storage(params, "params", &ps, err));
    DF_TRY(df_check_tensor(ctx, params, "params", ps, -1, err));
    DF_TRY(df_check_same_numel(master, "master", params, "params", err));
    if (overlaps(params, master))
      return DF_FAIL(err, DF_ERR_INVALID, "params", "pass NULL when the masters are the parameters",
                     "tensor 'params' overlaps 'master'");
  }
  DF_REQUIRE_OP(ctx, DF_OP_ADAMW_FUSED, st, err);
  return ctx->backend->adamw_fused(ctx, desc, master, grad, m, v, mask, norm_stats, params, err);
}
