#include "kernels/check.h"

#include <math.h>

df_status df_check_tensor(const df_ctx *ctx, const df_tensor *t, const char *name, df_dtype dt, int ndim,
                          df_error *err) {
  char d[96];
  if (!t) return DF_FAIL(err, DF_ERR_INVALID, name, "pass a tensor view", "tensor '%s' is missing", name);
  if (t->dtype != dt)
    return DF_FAIL(err, DF_ERR_INVALID, name, "convert the tensor before calling the op",
                   "tensor '%s' is %s, expected dtype %s", name, df_tensor_desc(t, d, sizeof d), df_dtype_name(dt));
  if (t->device != ctx->device)
    return DF_FAIL(err, DF_ERR_INVALID, name, "move the tensor to the context's device",
                   "tensor '%s' is on %s but the context runs on %s", name, df_device_name(t->device),
                   df_device_name(ctx->device));
  if (ndim >= 0 && t->ndim != ndim)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s, expected %d dims", name,
                   df_tensor_desc(t, d, sizeof d), ndim);
  if (!df_is_contiguous(t))
    return DF_FAIL(err, DF_ERR_INVALID, name, "make a contiguous copy", "tensor '%s' is not contiguous", name);
  if (!t->data && df_numel(t) > 0) return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' has no data", name);
  return DF_OK;
}

df_status df_check_storage(const df_tensor *t, const char *name, df_dtype *storage, df_error *err) {
  char d[96];
  if (!t) return DF_FAIL(err, DF_ERR_INVALID, name, "pass a tensor view", "tensor '%s' is missing", name);
  if (t->dtype != DF_F32 && t->dtype != DF_BF16)
    return DF_FAIL(err, DF_ERR_INVALID, name, "store activations, weights and gradients as f32 or bf16",
                   "tensor '%s' is %s", name, df_tensor_desc(t, d, sizeof d));
  *storage = t->dtype;
  return DF_OK;
}

df_dtype df_grad_dtype(const df_tensor *g, df_dtype st) {
  return st == DF_BF16 && g && g->dtype == DF_F32 ? DF_F32 : st;
}

df_status df_check_dim(const df_tensor *t, const char *name, int dim, int64_t expect, df_error *err) {
  char d[96];
  if (dim >= t->ndim || t->shape[dim] != expect)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s, expected dim %d = %lld", name,
                   df_tensor_desc(t, d, sizeof d), dim, (long long)expect);
  return DF_OK;
}

df_status df_check_same_numel(const df_tensor *a, const char *an, const df_tensor *b, const char *bn, df_error *err) {
  char da[96], db[96];
  if (df_numel(a) != df_numel(b))
    return DF_FAIL(err, DF_ERR_INVALID, bn, NULL, "tensor '%s' %s does not match '%s' %s", bn,
                   df_tensor_desc(b, db, sizeof db), an, df_tensor_desc(a, da, sizeof da));
  return DF_OK;
}

df_status df_check_per_row(const df_ctx *ctx, const df_tensor *t, const char *name, df_dtype dt, int64_t rows,
                           df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, t, name, dt, -1, err));
  if (df_numel(t) != rows)
    return DF_FAIL(err, DF_ERR_INVALID, name, "pass one value per row", "tensor '%s' is %s, expected %lld elements",
                   name, df_tensor_desc(t, d, sizeof d), (long long)rows);
  return DF_OK;
}

df_status df_check_chunked_loss(int64_t chunk_rows, float grad_scale, df_error *err) {
  if (chunk_rows < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "chunk_rows", "use 0 for a single chunk", "chunk_rows = %lld < 0",
                   (long long)chunk_rows);
  if (!isfinite(grad_scale))
    return DF_FAIL(err, DF_ERR_INVALID, "grad_scale", "check the loss normalizer (Σw may be 0)",
                   "grad_scale = %g is not finite", (double)grad_scale);
  return DF_OK;
}

int64_t df_last_dim(const df_tensor *t) { return t->ndim > 0 ? t->shape[t->ndim - 1] : 1; }

int64_t df_rows(const df_tensor *t) {
  int64_t last = df_last_dim(t);
  return last > 0 ? df_numel(t) / last : 0;
}
