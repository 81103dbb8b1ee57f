// Dispatch and validation for the fused DSpark objective over the LM head (df_lmhead_dspark, kernels/ops.h).
// Hidden / teacher rows, the head, the Markov factors and their gradients take the storage dtype (f32 or bf16);
// per-row outputs, weights and confidence logits are fp32.
#include <limits.h>
#include <math.h>

#include "kernels/check.h"

// t is a 2-D [rows, cols] matrix (or any shape holding rows·cols with last dim cols).
static df_status check_matrix(const df_ctx *ctx, const df_tensor *t, const char *name, int64_t rows, int64_t cols,
                              df_dtype st, df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, t, name, st, -1, err));
  if (t->ndim < 1 || df_last_dim(t) != cols || df_numel(t) != rows * cols)
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "tensor '%s' is %s, expected [%lld, %lld]", name,
                   df_tensor_desc(t, d, sizeof d), (long long)rows, (long long)cols);
  return DF_OK;
}

static df_status check_desc(const df_lmhead_dspark_desc *d, df_error *err) {
  if (!d) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_lmhead_dspark_desc", "desc is NULL");
  DF_TRY(df_check_chunked_loss(d->chunk_rows, d->grad_scale, err));
  const float a[3] = {d->alpha_ce, d->alpha_l1, d->alpha_conf};
  const char *names[3] = {"alpha_ce", "alpha_l1", "alpha_conf"};
  for (int i = 0; i < 3; i++)
    if (!(a[i] >= 0) || !isfinite(a[i]))
      return DF_FAIL(err, DF_ERR_INVALID, names[i], "the DSpark loss weights are finite and >= 0", "%s = %g", names[i],
                     (double)a[i]);
  return DF_OK;
}

// head [V, H] with BLAS-sized dims; hidden [R, H].
static df_status check_head(const df_ctx *ctx, const df_lmhead_dspark_in *in, int64_t *R, int64_t *H, int64_t *V,
                            df_dtype *st, df_error *err) {
  char d[96];
  DF_TRY(df_check_storage(in->head, "head", st, err));
  DF_TRY(df_check_tensor(ctx, in->head, "head", *st, 2, err));
  *V = in->head->shape[0], *H = in->head->shape[1];
  if (*V < 1 || *V > INT_MAX || *H < 1 || *H > INT_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "head", NULL, "tensor 'head' is %s: dims must be in [1, INT_MAX]",
                   df_tensor_desc(in->head, d, sizeof d));
  DF_TRY(df_check_tensor(ctx, in->hidden, "hidden", *st, -1, err));
  if (in->hidden->ndim < 1 || df_last_dim(in->hidden) != *H)
    return DF_FAIL(err, DF_ERR_INVALID, "hidden", "hidden rows must be as wide as the head",
                   "tensor 'hidden' is %s, expected last dim %lld", df_tensor_desc(in->hidden, d, sizeof d),
                   (long long)*H);
  *R = df_rows(in->hidden);
  return DF_OK;
}

static df_status check_markov(const df_ctx *ctx, const df_lmhead_dspark_in *in, const df_lmhead_dspark_out *out,
                              int64_t R, int64_t V, df_dtype st, df_error *err) {
  if (!in->markov_u) {
    if (in->markov_w2 || out->du || out->dw2)
      return DF_FAIL(err, DF_ERR_INVALID, "markov_u", "pass markov_u with markov_w2, du and dw2",
                     "markov_w2, du or dw2 given without a Markov latent");
    return DF_OK;
  }
  if (!in->markov_w2)
    return DF_FAIL(err, DF_ERR_INVALID, "markov_w2", "pass the Markov head's W2 [V, r]", "markov_w2 is missing");
  DF_TRY(df_check_tensor(ctx, in->markov_w2, "markov_w2", st, 2, err));
  int64_t r = in->markov_w2->shape[1];
  DF_TRY(df_check_dim(in->markov_w2, "markov_w2", 0, V, err));
  if (r < 1 || r > INT_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "markov_w2", NULL, "markov_w2 has rank %lld", (long long)r);
  DF_TRY(check_matrix(ctx, in->markov_u, "markov_u", R, r, st, err));
  if (!out->dhidden) return DF_OK;
  if (!out->du || !out->dw2)
    return DF_FAIL(err, DF_ERR_INVALID, out->du ? "dw2" : "du", "a backward with a Markov latent needs du and dw2",
                   "missing Markov gradient output");
  DF_TRY(check_matrix(ctx, out->du, "du", R, r, st, err));
  // W2's gradient is fp32 under bf16 storage too (mixed precision's weight gradient; the backends write fp32 there)
  return check_matrix(ctx, out->dw2, "dw2", V, r, DF_F32, err);
}

static df_status check_teacher_conf(const df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                                    const df_lmhead_dspark_out *out, int64_t R, int64_t H, df_dtype st, df_error *err) {
  if (in->teacher) {
    DF_TRY(check_matrix(ctx, in->teacher, "teacher", R, H, st, err));
  } else {
    if (desc->alpha_l1 > 0 || in->conf)
      return DF_FAIL(err, DF_ERR_INVALID, "teacher", "pass the teacher hidden rows (target_last_hidden_states)",
                     "the L1 term (alpha_l1 = %g) and the confidence BCE need the teacher distribution",
                     (double)desc->alpha_l1);
    if (out->l1 || out->agree || out->teacher_top1)
      return DF_FAIL(err, DF_ERR_INVALID, "teacher", "drop l1, agree and teacher_top1, or pass the teacher",
                     "teacher outputs requested without a teacher");
  }
  if (!in->conf) {
    if (out->bce || out->dconf)
      return DF_FAIL(err, DF_ERR_INVALID, "conf", "pass the confidence logits", "bce or dconf without conf");
    return DF_OK;
  }
  DF_TRY(df_check_per_row(ctx, in->conf, "conf", DF_F32, R, err));
  if (out->dhidden && !out->dconf)
    return DF_FAIL(err, DF_ERR_INVALID, "dconf", "a backward with confidence logits needs dconf", "dconf missing");
  return DF_OK;
}

static df_status check_outputs(const df_ctx *ctx, const df_lmhead_dspark_out *out, int64_t R, int64_t H, df_dtype st,
                               df_error *err) {
  DF_TRY(df_check_per_row(ctx, out->ce, "ce", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, out->correct, "correct", DF_U8, R, err));
  if (out->draft_top1) DF_TRY(df_check_per_row(ctx, out->draft_top1, "draft_top1", DF_F32, R, err));
  if (out->l1) DF_TRY(df_check_per_row(ctx, out->l1, "l1", DF_F32, R, err));
  if (out->agree) DF_TRY(df_check_per_row(ctx, out->agree, "agree", DF_U8, R, err));
  if (out->teacher_top1) DF_TRY(df_check_per_row(ctx, out->teacher_top1, "teacher_top1", DF_F32, R, err));
  if (out->bce) DF_TRY(df_check_per_row(ctx, out->bce, "bce", DF_F32, R, err));
  if (out->dconf) DF_TRY(df_check_per_row(ctx, out->dconf, "dconf", DF_F32, R, err));
  if (out->dhidden) DF_TRY(check_matrix(ctx, out->dhidden, "dhidden", R, H, st, err));
  return DF_OK;
}

df_status df_lmhead_dspark(df_ctx *ctx, const df_lmhead_dspark_desc *desc, const df_lmhead_dspark_in *in,
                           const df_lmhead_dspark_out *out, df_error *err) {
  DF_TRY(check_desc(desc, err));
  if (!in || !out) return DF_FAIL(err, DF_ERR_INVALID, in ? "out" : "in", NULL, "NULL argument to df_lmhead_dspark");
  int64_t R = 0, H = 0, V = 0;
  df_dtype st;
  DF_TRY(check_head(ctx, in, &R, &H, &V, &st, err));
  DF_TRY(df_check_per_row(ctx, in->labels, "labels", DF_I32, R, err));
  if (in->weights) DF_TRY(df_check_per_row(ctx, in->weights, "weights", DF_F32, R, err));
  DF_TRY(check_markov(ctx, in, out, R, V, st, err));
  DF_TRY(check_teacher_conf(ctx, desc, in, out, R, H, st, err));
  DF_TRY(check_outputs(ctx, out, R, H, st, err));
  // Label values live on the op's device: the backend range-checks them before writing anything.
  DF_REQUIRE_OP(ctx, DF_OP_LMHEAD_DSPARK, st, err);
  return ctx->backend->lmhead_dspark(ctx, desc, in, out, err);
}
