// Op names and the table check every dispatcher runs before it calls a backend.
#include <stddef.h>

#include "kernels/context.h"

// Every op once: its name, and a compile-time check that its named slot sits at slot[DF_OP_*] of the table.
#define DF_OPS(OP)                                                                                                     \
  OP(MATMUL, matmul)                                                                                                   \
  OP(LINEAR_FORWARD, linear_forward)                                                                                   \
  OP(LINEAR_BACKWARD, linear_backward)                                                                                 \
  OP(AXPY, axpy)                                                                                                       \
  OP(FILL, fill)                                                                                                       \
  OP(SCALE, scale)                                                                                                     \
  OP(CAST, cast)                                                                                                       \
  OP(RMSNORM_FORWARD, rmsnorm_forward)                                                                                 \
  OP(RMSNORM_BACKWARD, rmsnorm_backward)                                                                               \
  OP(ROPE_FORWARD, rope_forward)                                                                                       \
  OP(ROPE_BACKWARD, rope_backward)                                                                                     \
  OP(SWIGLU_FORWARD, swiglu_forward)                                                                                   \
  OP(SWIGLU_BACKWARD, swiglu_backward)                                                                                 \
  OP(EMBEDDING_FORWARD, embedding_forward)                                                                             \
  OP(EMBEDDING_BACKWARD, embedding_backward)                                                                           \
  OP(GATHER_ROWS, gather_rows)                                                                                         \
  OP(COPY_2D, copy_2d)                                                                                                 \
  OP(BLOCK_ATTN_FORWARD, block_attn_forward)                                                                           \
  OP(BLOCK_ATTN_BACKWARD, block_attn_backward)                                                                         \
  OP(CAUSAL_ATTN_FORWARD, causal_attn_forward)                                                                         \
  OP(LMHEAD_CE, lmhead_ce)                                                                                             \
  OP(SOFTMAX_L1_FORWARD, softmax_l1_forward)                                                                           \
  OP(SOFTMAX_L1_BACKWARD, softmax_l1_backward)                                                                         \
  OP(BCE_LOGITS_FORWARD, bce_logits_forward)                                                                           \
  OP(BCE_LOGITS_BACKWARD, bce_logits_backward)                                                                         \
  OP(LMHEAD_DSPARK, lmhead_dspark)                                                                                     \
  OP(MARKOV_GATE_FORWARD, markov_gate_forward)                                                                         \
  OP(MARKOV_GATE_BACKWARD, markov_gate_backward)                                                                       \
  OP(MARKOV_RNN_FORWARD, markov_rnn_forward)                                                                           \
  OP(MARKOV_RNN_BACKWARD, markov_rnn_backward)                                                                         \
  OP(DPACE_WEIGHTS, dpace_weights)                                                                                     \
  OP(BLOCK_METRICS, block_metrics)                                                                                     \
  OP(DSPARK_BLOCK_METRICS, dspark_block_metrics)                                                                       \
  OP(ADAMW_STEP, adamw_step)                                                                                           \
  OP(GLOBAL_NORM, global_norm)                                                                                         \
  OP(CLIP_BY_NORM, clip_by_norm)                                                                                       \
  OP(GRAD_NORM_CLIP, grad_norm_clip)                                                                                   \
  OP(ADAMW_FUSED, adamw_fused)                                                                                         \
  OP(MOE_SCORES_FORWARD, moe_scores_forward)                                                                           \
  OP(MOE_SCORES_BACKWARD, moe_scores_backward)                                                                         \
  OP(MOE_SELECT, moe_select)                                                                                           \
  OP(MOE_SELECT_BACKWARD, moe_select_backward)                                                                         \
  OP(MOE_CENTER_FORWARD, moe_center_forward)                                                                           \
  OP(MOE_CENTER_BACKWARD, moe_center_backward)                                                                         \
  OP(MOE_PLAN, moe_plan)                                                                                               \
  OP(MOE_SCALE_ROWS, moe_scale_rows)                                                                                   \
  OP(MOE_GATE_BACKWARD, moe_gate_backward)                                                                             \
  OP(MOE_SIGMOID_SCALE, moe_sigmoid_scale)                                                                             \
  OP(MOE_ROUTE_STATS, moe_route_stats)                                                                                 \
  OP(MOE_AUX_BACKWARD, moe_aux_backward)                                                                               \
  OP(MOE_CENTER_EMA, moe_center_ema)                                                                                   \
  OP(MOE_NOAUX_UPDATE, moe_noaux_update)                                                                               \
  OP(MOE_GROUPED_FORWARD, moe_grouped_forward)                                                                         \
  OP(MOE_GROUPED_BACKWARD, moe_grouped_backward)                                                                       \
  OP(GRU_FORWARD, gru_forward)                                                                                         \
  OP(GRU_BACKWARD, gru_backward)                                                                                       \
  OP(MASKED_SILU_FORWARD, masked_silu_forward)                                                                         \
  OP(MASKED_SILU_BACKWARD, masked_silu_backward)                                                                       \
  OP(LMHEAD_DOMINO, lmhead_domino)                                                                                     \
  OP(DOMINO_BLOCK_METRICS, domino_block_metrics)                                                                       \
  OP(TTT_ATTN_FORWARD, ttt_attn_forward)                                                                               \
  OP(TTT_ATTN_BACKWARD, ttt_attn_backward)                                                                             \
  OP(LMHEAD_LSE_ARGMAX, lmhead_lse_argmax)                                                                             \
  OP(EAGLE3_TEACHER, eagle3_teacher)                                                                                   \
  OP(EAGLE3_LOSS_FORWARD, eagle3_loss_forward)                                                                         \
  OP(EAGLE3_LOSS_BACKWARD, eagle3_loss_backward)                                                                       \
  OP(EAGLE3_STEP_SUMS, eagle3_step_sums)                                                                               \
  OP(EAGLE3_ACCEPT, eagle3_accept)

#define OP_NAME(id, field) [DF_OP_##id] = #field,
static const char *const op_names[DF_OP_COUNT] = {DF_OPS(OP_NAME)};

#define OP_SLOT_CHECK(id, field)                                                                                       \
  _Static_assert(offsetof(df_backend, field) == offsetof(df_backend, slot) + DF_OP_##id * sizeof(void (*)(void)),      \
                 "the slot of " #field " is not slot[DF_OP_" #id "]");
DF_OPS(OP_SLOT_CHECK)
_Static_assert(sizeof(((df_backend *)0)->slot) == DF_OP_COUNT * sizeof(void (*)(void)), "one slot per op");

const char *df_op_name(df_op op) { return op >= 0 && op < DF_OP_COUNT && op_names[op] ? op_names[op] : "?"; }

df_status df_backend_require(const df_ctx *ctx, df_op op, df_dtype storage, df_error *err) {
  const df_backend *be = ctx->backend;
  if (!be->slot[op])
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

bool df_backend_complete(const df_backend *be, const char **missing) {
  for (int op = 0; op < DF_OP_COUNT; op++)
    if (!be->slot[op]) {
      if (missing) *missing = df_op_name((df_op)op);
      return false;
    }
  if (missing) *missing = NULL;
  return true;
}
