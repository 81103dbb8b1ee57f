// Op names and the table check every dispatcher runs before it calls a backend.
#include "kernels/context.h"

static const char *const op_names[DF_OP_COUNT] = {
    [DF_OP_MATMUL] = "matmul",
    [DF_OP_LINEAR_FORWARD] = "linear_forward",
    [DF_OP_LINEAR_BACKWARD] = "linear_backward",
    [DF_OP_AXPY] = "axpy",
    [DF_OP_FILL] = "fill",
    [DF_OP_SCALE] = "scale",
    [DF_OP_CAST] = "cast",
    [DF_OP_RMSNORM_FORWARD] = "rmsnorm_forward",
    [DF_OP_RMSNORM_BACKWARD] = "rmsnorm_backward",
    [DF_OP_ROPE_FORWARD] = "rope_forward",
    [DF_OP_ROPE_BACKWARD] = "rope_backward",
    [DF_OP_SWIGLU_FORWARD] = "swiglu_forward",
    [DF_OP_SWIGLU_BACKWARD] = "swiglu_backward",
    [DF_OP_EMBEDDING_FORWARD] = "embedding_forward",
    [DF_OP_EMBEDDING_BACKWARD] = "embedding_backward",
    [DF_OP_GATHER_ROWS] = "gather_rows",
    [DF_OP_BLOCK_ATTN_FORWARD] = "block_attn_forward",
    [DF_OP_BLOCK_ATTN_BACKWARD] = "block_attn_backward",
    [DF_OP_LMHEAD_CE] = "lmhead_ce",
    [DF_OP_SOFTMAX_L1_FORWARD] = "softmax_l1_forward",
    [DF_OP_SOFTMAX_L1_BACKWARD] = "softmax_l1_backward",
    [DF_OP_BCE_LOGITS_FORWARD] = "bce_logits_forward",
    [DF_OP_BCE_LOGITS_BACKWARD] = "bce_logits_backward",
    [DF_OP_LMHEAD_DSPARK] = "lmhead_dspark",
    [DF_OP_DPACE_WEIGHTS] = "dpace_weights",
    [DF_OP_BLOCK_METRICS] = "block_metrics",
    [DF_OP_DSPARK_BLOCK_METRICS] = "dspark_block_metrics",
    [DF_OP_ADAMW_STEP] = "adamw_step",
    [DF_OP_GLOBAL_NORM] = "global_norm",
    [DF_OP_CLIP_BY_NORM] = "clip_by_norm",
    [DF_OP_GRAD_NORM_CLIP] = "grad_norm_clip",
    [DF_OP_ADAMW_FUSED] = "adamw_fused",
};

const char *df_op_name(df_op op) { return op >= 0 && op < DF_OP_COUNT && op_names[op] ? op_names[op] : "?"; }

df_status df_backend_require(const df_ctx *ctx, df_op op, bool present, df_dtype storage, df_error *err) {
  const df_backend *be = ctx->backend;
  if (!present)
    return DF_FAIL(err, DF_ERR_NOT_IMPLEMENTED, df_op_name(op), "run this op on the CPU backend (--device cpu)",
                   "op %s is not implemented by the %s backend", df_op_name(op), be->name);
  bool ok = be->supports_op ? be->supports_op(ctx, op, storage) : storage == DF_F32;
  if (!ok)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, df_op_name(op),
                   storage == DF_BF16 && be->device == DF_DEV_CPU
                       ? "the CPU backend computes in fp32 (it is the oracle): pass fp32 tensors"
                       : "pass fp32 tensors",
                   "op %s on the %s backend does not take %s storage", df_op_name(op), be->name,
                   df_dtype_name(storage));
  return DF_OK;
}
