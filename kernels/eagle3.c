// Dispatch and validation for EAGLE-3's ops (kernels/eagle3.h). Storage is fp32 (the statistics of these ops are the
// model's activations); every argument is checked here, so the backends see valid input only.
#include "kernels/eagle3.h"

#include <math.h>

#include "kernels/check.h"

// ---- TTT attention ------------------------------------------------------------------------------------------------

static df_status check_ttt(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                           const df_tensor *v, const df_tensor *lengths, const df_tensor *out, const df_tensor *lse,
                           df_error *err) {
  if (!desc) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_ttt_attn_desc", "attention desc is missing");
  if (!(desc->scale > 0.0f) || isinf(desc->scale))
    return DF_FAIL(err, DF_ERR_INVALID, "desc.scale", "use 1/sqrt(head_dim)", "bad scale %g", (double)desc->scale);
  DF_TRY(df_check_tensor(ctx, q, "q", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, k, "k", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, v, "v", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, out, "out", DF_F32, 4, err));
  const int64_t B = q->shape[0], S = q->shape[1], nH = q->shape[2], hd = q->shape[3];
  const int64_t nKV = k->shape[2], T = B > 0 ? k->shape[0] / B : 0;
  if (B < 1 || k->shape[0] % B)
    return DF_FAIL(err, DF_ERR_INVALID, "k", "the cache is [T·B, S, nKV, hd]: its first dimension a multiple of B",
                   "k's first dimension %lld is not a multiple of the batch %lld", (long long)k->shape[0],
                   (long long)B);
  if (desc->step < 0 || desc->step >= T)
    return DF_FAIL(err, DF_ERR_INVALID, "desc.step", "0 <= step < T (k's first dimension)",
                   "step %lld outside the cache's %lld steps", (long long)desc->step, (long long)T);
  if (nKV < 1 || nH % nKV)
    return DF_FAIL(err, DF_ERR_INVALID, "k", "num_attention_heads must be a multiple of num_key_value_heads",
                   "k has %lld kv heads, which does not divide q's %lld heads", (long long)nKV, (long long)nH);
  const int64_t kv_shape[4] = {T * B, S, nKV, hd};
  for (int d = 0; d < 4; d++) {
    DF_TRY(df_check_dim(k, "k", d, kv_shape[d], err));
    DF_TRY(df_check_dim(v, "v", d, kv_shape[d], err));
  }
  for (int d = 0; d < 4; d++) DF_TRY(df_check_dim(out, "out", d, q->shape[d], err));
  DF_TRY(df_check_per_row(ctx, lengths, "lengths", DF_I32, B, err));
  return df_check_per_row(ctx, lse, "lse", DF_F32, B * S * nH, err);
}

df_status df_ttt_attn_forward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                              const df_tensor *v, const df_tensor *lengths, df_tensor *out, df_tensor *lse,
                              df_error *err) {
  DF_TRY(check_ttt(ctx, desc, q, k, v, lengths, out, lse, err));
  DF_REQUIRE_OP(ctx, DF_OP_TTT_ATTN_FORWARD, DF_F32, err);
  if (df_numel(q) == 0) return DF_OK;
  return ctx->backend->ttt_attn_forward(ctx, desc, q, k, v, lengths, out, lse, err);
}

df_status df_ttt_attn_backward(df_ctx *ctx, const df_ttt_attn_desc *desc, const df_tensor *q, const df_tensor *k,
                               const df_tensor *v, const df_tensor *lengths, const df_tensor *out, const df_tensor *lse,
                               const df_tensor *dout, df_tensor *dq, df_tensor *dk, df_tensor *dv, df_error *err) {
  DF_TRY(check_ttt(ctx, desc, q, k, v, lengths, out, lse, err));
  DF_TRY(df_check_tensor(ctx, dout, "dout", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, dq, "dq", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, dk, "dk", DF_F32, 4, err));
  DF_TRY(df_check_tensor(ctx, dv, "dv", DF_F32, 4, err));
  for (int d = 0; d < 4; d++) {
    DF_TRY(df_check_dim(dout, "dout", d, q->shape[d], err));
    DF_TRY(df_check_dim(dq, "dq", d, q->shape[d], err));
  }
  for (int d = 0; d < 4; d++) {
    DF_TRY(df_check_dim(dk, "dk", d, k->shape[d], err));
    DF_TRY(df_check_dim(dv, "dv", d, k->shape[d], err));
  }
  DF_REQUIRE_OP(ctx, DF_OP_TTT_ATTN_BACKWARD, DF_F32, err);
  if (df_numel(q) == 0) return DF_OK;
  return ctx->backend->ttt_attn_backward(ctx, desc, q, k, v, lengths, out, lse, dout, dq, dk, dv, err);
}

// ---- the compact teacher ------------------------------------------------------------------------------------------

df_status df_lmhead_lse_argmax(df_ctx *ctx, int64_t chunk_rows, const df_tensor *hidden, const df_tensor *head,
                               df_tensor *lse, df_tensor *argmax, df_error *err) {
  if (chunk_rows < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "chunk_rows", "0 (the default) or a positive row count", "chunk_rows %lld < 0",
                   (long long)chunk_rows);
  df_dtype st; // hidden and head share a storage dtype (bf16: fp32 accumulation and statistics)
  DF_TRY(df_check_storage(head, "head", &st, err));
  DF_TRY(df_check_tensor(ctx, hidden, "hidden", st, 2, err));
  DF_TRY(df_check_tensor(ctx, head, "head", st, 2, err));
  DF_TRY(df_check_dim(head, "head", 1, hidden->shape[1], err));
  const int64_t R = hidden->shape[0];
  DF_TRY(df_check_per_row(ctx, lse, "lse", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, argmax, "argmax", DF_I32, R, err));
  if (head->shape[0] < 1) return DF_FAIL(err, DF_ERR_INVALID, "head", NULL, "the LM head has no rows");
  DF_REQUIRE_OP(ctx, DF_OP_LMHEAD_LSE_ARGMAX, st, err);
  if (R == 0) return DF_OK;
  return ctx->backend->lmhead_lse_argmax(ctx, chunk_rows, hidden, head, lse, argmax, err);
}

df_status df_eagle3_teacher(df_ctx *ctx, df_tensor *logits, const df_tensor *lse_v, const df_tensor *argmax,
                            const df_tensor *t2d, const df_tensor *loss_mask, df_tensor *ratio, df_tensor *pm,
                            df_error *err) {
  DF_TRY(df_check_tensor(ctx, logits, "logits", DF_F32, 2, err));
  const int64_t R = logits->shape[0];
  if (logits->shape[1] < 1) return DF_FAIL(err, DF_ERR_INVALID, "logits", NULL, "an empty draft vocabulary");
  DF_TRY(df_check_per_row(ctx, lse_v, "lse_v", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, argmax, "argmax", DF_I32, R, err));
  DF_TRY(df_check_tensor(ctx, t2d, "t2d", DF_U8, 1, err));
  DF_TRY(df_check_per_row(ctx, loss_mask, "loss_mask", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, ratio, "ratio", DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, pm, "pm", DF_F32, R, err));
  DF_REQUIRE_OP(ctx, DF_OP_EAGLE3_TEACHER, DF_F32, err);
  if (R == 0) return DF_OK;
  return ctx->backend->eagle3_teacher(ctx, logits, lse_v, argmax, t2d, loss_mask, ratio, pm, err);
}

// ---- the per-step objective ---------------------------------------------------------------------------------------

static df_status check_teacher_rows(df_ctx *ctx, const df_eagle3_teacher_rows *t, int64_t *R, int64_t *D,
                                    df_error *err) {
  if (!t || !t->target_p || !t->ratio || !t->pm || !t->loss_mask || !t->tokens || !t->d2t)
    return DF_FAIL(err, DF_ERR_INVALID, "teacher", "fill every df_eagle3_teacher_rows field", "incomplete teacher");
  DF_TRY(df_check_tensor(ctx, t->target_p, "target_p", DF_F32, 2, err));
  *R = t->target_p->shape[0], *D = t->target_p->shape[1];
  DF_TRY(df_check_per_row(ctx, t->ratio, "ratio", DF_F32, *R, err));
  DF_TRY(df_check_per_row(ctx, t->pm, "pm", DF_F32, *R, err));
  DF_TRY(df_check_per_row(ctx, t->loss_mask, "loss_mask", DF_F32, *R, err));
  DF_TRY(df_check_per_row(ctx, t->tokens, "tokens", DF_I32, *R, err));
  return df_check_per_row(ctx, t->d2t, "d2t", DF_I32, *D, err);
}

static df_status check_loss_desc(const df_ctx *ctx, const df_eagle3_loss_desc *d, const df_tensor *z, int64_t R,
                                 int64_t D, df_error *err) {
  if (!d) return DF_FAIL(err, DF_ERR_INVALID, "desc", "pass a df_eagle3_loss_desc", "loss desc is missing");
  if (d->S < 1 || R % d->S || d->positions != R || d->step < 0 || d->lk < DF_LK_NONE || d->lk > DF_LK_LAMBDA)
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "S divides the rows, positions = rows, step >= 0, a known LK type",
                   "bad loss desc: S %lld, positions %lld for %lld rows, step %lld", (long long)d->S,
                   (long long)d->positions, (long long)R, (long long)d->step);
  if (z->shape[1] != D)
    return DF_FAIL(err, DF_ERR_INVALID, "z", "the logits are over the draft vocabulary", "z has %lld columns, not %lld",
                   (long long)z->shape[1], (long long)D);
  if (d->rows) { // P-EAGLE's mapped rows: one per chunk row, each a teacher row or −1
    DF_TRY(df_check_tensor(ctx, d->rows, "desc.rows", DF_I32, 1, err));
    return df_check_dim(d->rows, "desc.rows", 0, z->shape[0], err);
  }
  if (d->row0 < 0 || d->row0 + z->shape[0] > R)
    return DF_FAIL(err, DF_ERR_INVALID, "desc.row0", "the chunk lies inside the micro-batch's rows",
                   "rows %lld .. %lld outside [0, %lld)", (long long)d->row0, (long long)(d->row0 + z->shape[0]),
                   (long long)R);
  if (!isfinite(d->weight) || !isfinite(d->kl_scale) || !isfinite(d->kl_decay))
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "finite weight, kl_scale and kl_decay", "non-finite loss settings");
  return DF_OK;
}

df_status df_eagle3_loss_forward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                 const df_eagle3_teacher_rows *t, const df_eagle3_row_terms *out, df_error *err) {
  int64_t R = 0, D = 0;
  DF_TRY(df_check_tensor(ctx, z, "z", DF_F32, 2, err));
  DF_TRY(check_teacher_rows(ctx, t, &R, &D, err));
  DF_TRY(check_loss_desc(ctx, desc, z, R, D, err));
  if (!out || !out->kl || !out->alpha || !out->log_alpha || !out->pm || !out->correct || !out->mask)
    return DF_FAIL(err, DF_ERR_INVALID, "out", "fill every df_eagle3_row_terms field", "incomplete row terms");
  const int64_t c = z->shape[0];
  df_tensor *const o[] = {out->kl, out->alpha, out->log_alpha, out->pm, out->correct, out->mask};
  const char *const names[] = {"kl", "alpha", "log_alpha", "pm", "correct", "mask"};
  for (int i = 0; i < 6; i++) DF_TRY(df_check_per_row(ctx, o[i], names[i], DF_F32, c, err));
  DF_REQUIRE_OP(ctx, DF_OP_EAGLE3_LOSS_FORWARD, DF_F32, err);
  if (c == 0) return DF_OK;
  return ctx->backend->eagle3_loss_forward(ctx, desc, z, t, out, err);
}

df_status df_eagle3_loss_backward(df_ctx *ctx, const df_eagle3_loss_desc *desc, const df_tensor *z,
                                  const df_eagle3_teacher_rows *t, const df_tensor *local, df_tensor *dz,
                                  df_error *err) {
  int64_t R = 0, D = 0;
  DF_TRY(df_check_tensor(ctx, z, "z", DF_F32, 2, err));
  DF_TRY(check_teacher_rows(ctx, t, &R, &D, err));
  DF_TRY(check_loss_desc(ctx, desc, z, R, D, err));
  DF_TRY(df_check_per_row(ctx, local, "local", DF_F64, DF_EAGLE3_STEP_LOCAL, err));
  DF_TRY(df_check_tensor(ctx, dz, "dz", DF_F32, 2, err));
  DF_TRY(df_check_dim(dz, "dz", 0, z->shape[0], err));
  DF_TRY(df_check_dim(dz, "dz", 1, D, err));
  DF_REQUIRE_OP(ctx, DF_OP_EAGLE3_LOSS_BACKWARD, DF_F32, err);
  if (z->shape[0] == 0) return DF_OK;
  return ctx->backend->eagle3_loss_backward(ctx, desc, z, t, local, dz, err);
}

df_status df_eagle3_step_sums(df_ctx *ctx, const df_eagle3_sums_desc *desc, const df_eagle3_row_terms *rows,
                              df_tensor *local, df_tensor *stats, df_error *err) {
  if (!desc || !rows || !rows->kl || !rows->alpha || !rows->log_alpha || !rows->pm || !rows->correct || !rows->mask)
    return DF_FAIL(err, DF_ERR_INVALID, "rows", "pass the desc and every row term", "incomplete step sums");
  DF_TRY(df_check_tensor(ctx, rows->kl, "kl", DF_F32, -1, err));
  const int64_t R = df_numel(rows->kl);
  const df_tensor *const r[] = {rows->alpha, rows->log_alpha, rows->pm, rows->correct, rows->mask};
  const char *const names[] = {"alpha", "log_alpha", "pm", "correct", "mask"};
  for (int i = 0; i < 5; i++) DF_TRY(df_check_per_row(ctx, r[i], names[i], DF_F32, R, err));
  DF_TRY(df_check_per_row(ctx, local, "local", DF_F64, DF_EAGLE3_STEP_LOCAL, err));
  DF_TRY(df_check_tensor(ctx, stats, "stats", DF_F64, -1, err));
  const int64_t ns = df_numel(stats);
  const int64_t slots[] = {desc->loss_num, desc->acc_num, desc->acc_den, desc->step_block,
                           desc->step_block + DF_EAGLE3_STEP_STATS - 1};
  for (int i = 0; i < 5; i++)
    if (slots[i] < 0 || slots[i] >= ns)
      return DF_FAIL(err, DF_ERR_INVALID, "desc", "stats slots inside the stats vector", "slot %lld outside [0, %lld)",
                     (long long)slots[i], (long long)ns);
  if (desc->positions < 1 || desc->lk < DF_LK_NONE || desc->lk > DF_LK_LAMBDA)
    return DF_FAIL(err, DF_ERR_INVALID, "desc", "positions >= 1 and a known LK type", "bad step-sums desc");
  DF_REQUIRE_OP(ctx, DF_OP_EAGLE3_STEP_SUMS, DF_F32, err);
  return ctx->backend->eagle3_step_sums(ctx, desc, rows, local, stats, err);
}

df_status df_eagle3_accept(df_ctx *ctx, const df_tensor *correct, const df_tensor *mask, int64_t accept_sum,
                           int64_t blocks, df_tensor *stats, df_error *err) {
  DF_TRY(df_check_tensor(ctx, correct, "correct", DF_F32, 2, err));
  DF_TRY(df_check_per_row(ctx, mask, "mask", DF_F32, correct->shape[1], err));
  DF_TRY(df_check_tensor(ctx, stats, "stats", DF_F64, -1, err));
  const int64_t ns = df_numel(stats);
  if (accept_sum < 0 || accept_sum >= ns || blocks < 0 || blocks >= ns)
    return DF_FAIL(err, DF_ERR_INVALID, "stats", "slots inside the stats vector", "slot outside [0, %lld)",
                   (long long)ns);
  DF_REQUIRE_OP(ctx, DF_OP_EAGLE3_ACCEPT, DF_F32, err);
  return ctx->backend->eagle3_accept(ctx, correct, mask, accept_sum, blocks, stats, err);
}
