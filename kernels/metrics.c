// Dispatch and validation for the block-objective ops: D-PACE weights and the DFlash / DSpark block metric sums.
#include <math.h>

#include "kernels/check.h"

// rows = nblocks·bs; bs >= 1 and rows a multiple of it.
static df_status check_blocks(int64_t bs, int64_t rows, df_error *err) {
  if (bs < 1) return DF_FAIL(err, DF_ERR_INVALID, "bs", "pass the block size (>= 1)", "bs = %lld", (long long)bs);
  if (rows < 0 || rows % bs)
    return DF_FAIL(err, DF_ERR_INVALID, "rows", "rows are whole blocks of bs slots",
                   "%lld rows are not a multiple of bs = %lld", (long long)rows, (long long)bs);
  return DF_OK;
}

static df_status check_stats(const df_ctx *ctx, const df_tensor *stats, int64_t need, df_error *err) {
  char d[96];
  DF_TRY(df_check_tensor(ctx, stats, "stats", DF_F64, -1, err));
  if (df_numel(stats) < need)
    return DF_FAIL(err, DF_ERR_INVALID, "stats", "size it with DF_BLOCK_STATS / DF_DSPARK_STATS (bs)",
                   "tensor 'stats' %s holds fewer than %lld sums", df_tensor_desc(stats, d, sizeof d), (long long)need);
  return DF_OK;
}

df_status df_dpace_weights(df_ctx *ctx, df_dpace_mode mode, double alpha, int64_t bs, const df_tensor *ce,
                           const df_tensor *w, df_tensor *out, df_tensor *row_w, df_error *err) {
  if ((unsigned)mode > DF_DPACE_RATIO)
    return DF_FAIL(err, DF_ERR_INVALID, "mode", NULL, "unknown D-PACE mode %d", (int)mode);
  if (!(alpha >= 0 && alpha <= 1))
    return DF_FAIL(err, DF_ERR_INVALID, "alpha", "use dpace_alpha in [0, 1]", "alpha = %g", alpha);
  DF_TRY(df_check_tensor(ctx, ce, "ce", DF_F32, -1, err));
  DF_TRY(check_blocks(bs, df_numel(ce), err));
  DF_TRY(df_check_per_row(ctx, w, "w", DF_F32, df_numel(ce), err));
  DF_TRY(df_check_per_row(ctx, out, "out", DF_F32, df_numel(ce), err));
  if (row_w) DF_TRY(df_check_per_row(ctx, row_w, "row_w", DF_F32, df_numel(ce), err));
  DF_REQUIRE_OP(ctx, DF_OP_DPACE_WEIGHTS, DF_F32, err);
  return ctx->backend->dpace_weights(ctx, mode, alpha, bs, ce, w, out, row_w, err);
}

df_status df_block_metrics(df_ctx *ctx, int64_t bs, const df_tensor *ce, const df_tensor *correct, const df_tensor *lw,
                           const df_tensor *valid, const df_tensor *keep, df_tensor *stats, df_error *err) {
  DF_TRY(df_check_tensor(ctx, ce, "ce", DF_F32, -1, err));
  const int64_t R = df_numel(ce);
  DF_TRY(check_blocks(bs, R, err));
  DF_TRY(df_check_per_row(ctx, correct, "correct", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, lw, "lw", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, valid, "valid", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, keep, "keep", DF_U8, R / bs, err));
  DF_TRY(check_stats(ctx, stats, DF_BLOCK_STATS(bs), err));
  DF_REQUIRE_OP(ctx, DF_OP_BLOCK_METRICS, DF_F32, err);
  return ctx->backend->block_metrics(ctx, bs, ce, correct, lw, valid, keep, stats, err);
}

df_status df_dspark_block_metrics(df_ctx *ctx, int64_t bs, const df_dspark_metrics_in *in, df_tensor *stats,
                                  df_error *err) {
  if (!in) return DF_FAIL(err, DF_ERR_INVALID, "in", NULL, "NULL argument to df_dspark_block_metrics");
  DF_TRY(df_check_tensor(ctx, in->ce, "ce", DF_F32, -1, err));
  const int64_t R = df_numel(in->ce);
  DF_TRY(check_blocks(bs, R, err));
  DF_TRY(df_check_per_row(ctx, in->correct, "correct", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, in->draft_top1, "draft_top1", DF_F32, R, err));
  const bool teacher = in->l1 || in->agree || in->teacher_top1;
  if (teacher) {
    DF_TRY(df_check_per_row(ctx, in->l1, "l1", DF_F32, R, err));
    DF_TRY(df_check_per_row(ctx, in->agree, "agree", DF_U8, R, err));
    DF_TRY(df_check_per_row(ctx, in->teacher_top1, "teacher_top1", DF_F32, R, err));
  }
  if (in->bce || in->conf) {
    if (!teacher)
      return DF_FAIL(err, DF_ERR_INVALID, "bce", "pass l1, agree and teacher_top1 with the confidence terms",
                     "the confidence error is measured against the teacher's acceptance");
    DF_TRY(df_check_per_row(ctx, in->bce, "bce", DF_F32, R, err));
    DF_TRY(df_check_per_row(ctx, in->conf, "conf", DF_F32, R, err));
  }
  DF_TRY(df_check_per_row(ctx, in->valid, "valid", DF_U8, R, err));
  DF_TRY(df_check_per_row(ctx, in->weights, "weights", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, in->keep, "keep", DF_U8, R / bs, err));
  DF_TRY(check_stats(ctx, stats, DF_DSPARK_STATS(bs), err));
  DF_REQUIRE_OP(ctx, DF_OP_DSPARK_BLOCK_METRICS, DF_F32, err);
  return ctx->backend->dspark_block_metrics(ctx, bs, in, stats, err);
}
