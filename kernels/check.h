// Argument validation shared by the op dispatchers: every check names the argument it rejects.
#ifndef DF_KERNELS_CHECK_H
#define DF_KERNELS_CHECK_H

#include "kernels/context.h"

#ifdef __cplusplus
extern "C" {
#endif

// A dispatcher's last step before the backend: the table has the op and takes the storage dtype
// (df_backend_require); on a measuring context (df_ctx_options.measure) the op then ends here, doing nothing, unless
// its table marks a measure path for it (df_backend.measures: ops that take workspace).
#define DF_REQUIRE_OP(ctx, op, storage, err)                                                                           \
  do {                                                                                                                 \
    DF_TRY(df_backend_require((ctx), (op), (storage), (err)));                                                         \
    if ((ctx)->measure && !(ctx)->backend->measures[(op)]) return DF_OK;                                               \
  } while (0)

// t is present, has dtype dt, lives on ctx's device, is contiguous and (if ndim >= 0) has ndim dims.
df_status df_check_tensor(const df_ctx *ctx, const df_tensor *t, const char *name, df_dtype dt, int ndim,
                          df_error *err);
// The storage dtype of an op's activation / weight / gradient tensors, read from t: fp32 or bf16 (anything else
// is an error naming t). The op's other storage tensors are then checked against it with df_check_tensor;
// statistics (rstd, lse, losses, row weights, norms, moments) stay fp32 whatever the storage.
df_status df_check_storage(const df_tensor *t, const char *name, df_dtype *storage, df_error *err);
// The dtype a weight-gradient tensor g must have under storage st: st, or f32 when st is bf16 and g is f32 (mixed
// precision's fp32 weight gradients). Checked by the caller with df_check_tensor.
df_dtype df_grad_dtype(const df_tensor *g, df_dtype st);
// t->shape[dim] == expect.
df_status df_check_dim(const df_tensor *t, const char *name, int dim, int64_t expect, df_error *err);
// a and b have the same number of elements (views of one shape under different splits are fine).
df_status df_check_same_numel(const df_tensor *a, const char *an, const df_tensor *b, const char *bn, df_error *err);
// t has dtype dt and holds exactly `rows` elements (any shape: [R], [B, N·bs], ...).
df_status df_check_per_row(const df_ctx *ctx, const df_tensor *t, const char *name, df_dtype dt, int64_t rows,
                           df_error *err);
// The chunking fields the fused LM-head losses share: chunk_rows >= 0 and a finite grad_scale.
df_status df_check_chunked_loss(int64_t chunk_rows, float grad_scale, df_error *err);
// Rows when t is viewed as [R, last]: numel / shape[ndim-1].
int64_t df_rows(const df_tensor *t);
int64_t df_last_dim(const df_tensor *t);

#ifdef __cplusplus
}
#endif

#endif
