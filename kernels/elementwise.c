// Dispatch and validation for fill, scale and cast: the small elementwise ops that keep gradient zeroing,
// rescaling and precision changes on the device.
#include <math.h>

#include "kernels/check.h"

// t is present, on the context's device and contiguous; any dtype.
static df_status check_any(const df_ctx *ctx, const df_tensor *t, const char *name, df_error *err) {
  if (!t) return DF_FAIL(err, DF_ERR_INVALID, name, "pass a tensor view", "tensor '%s' is missing", name);
  return df_check_tensor(ctx, t, name, t->dtype, -1, err);
}

df_status df_fill(df_ctx *ctx, df_tensor *t, double value, df_error *err) {
  DF_TRY(check_any(ctx, t, "t", err));
  if (isnan(value) && t->dtype != DF_F32 && t->dtype != DF_F64 && t->dtype != DF_BF16)
    return DF_FAIL(err, DF_ERR_INVALID, "value", "fill integer tensors with a number", "NaN for a %s tensor",
                   df_dtype_name(t->dtype));
  // Integer and flag fills are storage-agnostic: the table is asked with the float storage it always has.
  const df_dtype st = t->dtype == DF_BF16 ? DF_BF16 : DF_F32;
  DF_REQUIRE_OP(ctx, DF_OP_FILL, st, err);
  return ctx->backend->fill(ctx, t, value, err);
}

df_status df_scale(df_ctx *ctx, df_tensor *t, float alpha, df_error *err) {
  df_dtype st;
  DF_TRY(df_check_storage(t, "t", &st, err));
  DF_TRY(df_check_tensor(ctx, t, "t", st, -1, err));
  if (!isfinite(alpha))
    return DF_FAIL(err, DF_ERR_INVALID, "alpha", "check the scale (a loss normaliser of 0?)", "alpha = %g",
                   (double)alpha);
  DF_REQUIRE_OP(ctx, DF_OP_SCALE, st, err);
  return ctx->backend->scale(ctx, t, alpha, err);
}

df_status df_cast(df_ctx *ctx, const df_tensor *src, df_tensor *dst, df_error *err) {
  df_dtype ss, ds;
  DF_TRY(df_check_storage(src, "src", &ss, err));
  DF_TRY(df_check_storage(dst, "dst", &ds, err));
  DF_TRY(df_check_tensor(ctx, src, "src", ss, -1, err));
  DF_TRY(df_check_tensor(ctx, dst, "dst", ds, -1, err));
  DF_TRY(df_check_same_numel(src, "src", dst, "dst", err));
  // The table is asked about the narrower side: a backend without bf16 cannot cast to or from it either.
  DF_REQUIRE_OP(ctx, DF_OP_CAST, ss == DF_BF16 ? ss : ds, err);
  return ctx->backend->cast(ctx, src, dst, err);
}
