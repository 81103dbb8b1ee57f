// Data parallel inside the trainer (docs/distributed.md): the global-batch view each micro-step's anchors
// replay, the one reduction of an optimizer step (the window's host scalars, the device metric sums, the flat
// gradient buffer in buckets), and the resume state handed from rank 0 to every rank.
#include <math.h>
#include <string.h>

#include "train/dist/dist.h"
#include "train/trainer/trainer_internal.h"

// A bucket of the flat gradient all-reduce: 25 MiB of fp32 (PyTorch DDP's default bucket_cap_mb).
#define DP_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)

df_status df_trainer_dp_check(df_trainer *t, df_error *err) {
  if (t->dp.world == 1) return DF_OK;
  // The FFN kind's routing statistics and deferred updates over every rank's rows (MoE), and the ranks' SUM for the
  // kind's loss-term weight.
  t->dp.coll = df_dist_collective(t->dp.comm);
  df_ffn_set_collective(&t->ffn, &t->dp.coll);
  if (df_comm_backend_of(t->dp.comm) == DF_COMM_NCCL)
    return DF_FAIL(err, DF_ERR_NOT_IMPLEMENTED, "world size", "train data-parallel on CPU ranks under mpirun for now",
                   "data-parallel training on GPU ranks (NCCL) is not wired into the trainer yet: the anchor and "
                   "resume exchanges still use host buffers (docs/distributed.md)");
  const bool dev_bufs = !df_ctx_host_addressable(t->ctx);
  if (dev_bufs != df_comm_device_buffers(t->dp.comm))
    return DF_FAIL(err, DF_ERR_INVALID, "training.device",
                   dev_bufs ? "train on the CPU under mpirun, or launch GPU ranks so that NCCL is used"
                            : "train GPU ranks on a CUDA device (training.device: cuda)",
                   "the %s communicator takes %s buffers, but the trainer's context (%s) keeps its state %s",
                   df_comm_backend_name(df_comm_backend_of(t->dp.comm)),
                   df_comm_device_buffers(t->dp.comm) ? "device" : "host", df_ctx_backend_name(t->ctx),
                   dev_bufs ? "on a device" : "in host memory");
  return DF_OK;
}

df_status df_trainer_dp_global_batch(df_trainer *t, const df_batch *b, df_error *err) {
  int64_t v[2] = {b->S, df_dflash_max_candidates(b->loss_mask, b->B, b->S)};
  DF_TRY(df_comm_all_reduce(t->dp.comm, v, v, 2, DF_COMM_I64, DF_COMM_MAX, err));
  t->dp.global_S = v[0], t->dp.global_cmax = v[1];
  return DF_OK;
}

df_status df_trainer_dp_reduce(df_trainer *t, double *scalars, int n_scalars, bool grads, df_error *err) {
  DF_TRY(df_comm_all_reduce(t->dp.comm, scalars, scalars, n_scalars, DF_COMM_F64, DF_COMM_SUM, err));
  DF_TRY(
      df_comm_all_reduce(t->dp.comm, t->stats.win.data, t->stats.win.data, t->stats.n, DF_COMM_F64, DF_COMM_SUM, err));
  if (!grads) return df_comm_wait(t->dp.comm, err);
  float *g = df_draft_model_grads(t->model);
  const int64_t n = df_params_numel(t->table);
  for (int64_t off = 0; off < n; off += DP_BUCKET_FLOATS) {
    const int64_t c = n - off < DP_BUCKET_FLOATS ? n - off : DP_BUCKET_FLOATS;
    DF_TRY(df_comm_all_reduce(t->dp.comm, g + off, g + off, c, DF_COMM_F32, DF_COMM_SUM, err));
  }
  return df_comm_wait(t->dp.comm, err);
}

df_status df_trainer_dp_share_state(df_trainer *t, df_error *err) {
  const int64_t n = df_params_numel(t->table);
  DF_TRY(df_comm_broadcast(t->dp.comm, df_draft_model_weights(t->model), n, DF_COMM_F32, 0, err));
  if (t->optim.zero) { // rank 0 holds the full moments in zero_full (resume); each rank keeps its shard
    for (int i = 0; i < 2; i++) {
      float *full = t->optim.zero_full + i * n, *mine = i ? t->optim.exp_avg_sq : t->optim.exp_avg;
      DF_TRY(df_comm_broadcast(t->dp.comm, full, n, DF_COMM_F32, 0, err));
      memcpy(mine, full + t->optim.shard_off, sizeof(float) * (size_t)t->optim.shard_len);
    }
  } else {
    DF_TRY(df_comm_broadcast(t->dp.comm, t->optim.exp_avg, n, DF_COMM_F32, 0, err));
    DF_TRY(df_comm_broadcast(t->dp.comm, t->optim.exp_avg_sq, n, DF_COMM_F32, 0, err));
  }
  DF_TRY(df_comm_broadcast(t->dp.comm, &t->prog, (int64_t)sizeof t->prog, DF_COMM_U8, 0, err));
  return df_comm_wait(t->dp.comm, err);
}

// ---- ZeRO-1 ------------------------------------------------------------------------------------------------

void df_trainer_dp_zero_plan(df_trainer *t) {
  const int64_t n = df_params_numel(t->table);
  const df_shard_kind k = t->recipe->training.fsdp_sharding;
  t->optim.zero = t->dp.world > 1 && (k == DF_SHARD_GRAD_OP || k == DF_SHARD_FULL);
  if (!t->optim.zero) return;
  t->optim.shard_size = ((n + t->dp.world - 1) / t->dp.world + 15) / 16 * 16;
  t->optim.shard_off = t->dp.rank * t->optim.shard_size;
  const int64_t left = n - t->optim.shard_off;
  t->optim.shard_len = left < 0 ? 0 : (left < t->optim.shard_size ? left : t->optim.shard_size);
}

df_status df_trainer_dp_zero_step(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                  df_error *err) {
  const int64_t n = df_params_numel(t->table), S = t->optim.shard_size, W = t->dp.world;
  const df_device dev = df_ctx_device(t->ctx);
  float *buf = t->optim.zero_buf, *w = df_draft_model_weights(t->model);
  // The gradient, padded to world shards, reduce-scattered in place: this rank's shard at buf + rank·S.
  memcpy(buf, df_draft_model_grads(t->model), sizeof(float) * (size_t)n);
  memset(buf + n, 0, sizeof(float) * (size_t)(W * S - n));
  float *mine = buf + t->optim.shard_off;
  DF_TRY(df_comm_reduce_scatter(t->dp.comm, buf, mine, S, DF_COMM_F32, DF_COMM_SUM, err));
  // The global norm: Σ g² of every shard (the fused kernel's norm of this shard, squared), summed over the ranks.
  double *ns = t->stats.norm.data;
  double sq = 0.0;
  if (t->optim.shard_len > 0) {
    df_tensor g = df_f32_on(dev, mine, t->optim.shard_len),
              mk = df_u8_on(dev, t->optim.mask + t->optim.shard_off, t->optim.shard_len);
    DF_TRY(df_grad_norm_clip(t->ctx, nd, &g, &mk, &t->stats.win, &t->stats.norm, err));
    sq = ns[DF_NORM_VALUE] * ns[DF_NORM_VALUE];
  }
  DF_TRY(df_comm_all_reduce(t->dp.comm, &sq, &sq, 1, DF_COMM_F64, DF_COMM_SUM, err));
  const double norm = sqrt(sq);
  bool ok = isfinite(norm);
  for (int64_t i = 0; i < t->stats.n; i++) ok = ok && isfinite(((const double *)t->stats.win.data)[i]);
  ns[DF_NORM_VALUE] = norm;
  ns[DF_NORM_COEF] = fmin(1.0, nd->max_norm / (norm + 1e-6));
  ns[DF_NORM_OK] = ok ? 1.0 : 0.0;
  // AdamW on this shard (a skipped step leaves it as it was), then every rank's shard to every rank.
  if (t->optim.shard_len > 0) {
    df_tensor p = df_f32_on(dev, w + t->optim.shard_off, t->optim.shard_len),
              g = df_f32_on(dev, mine, t->optim.shard_len);
    df_tensor m = df_f32_on(dev, t->optim.exp_avg, t->optim.shard_len),
              v = df_f32_on(dev, t->optim.exp_avg_sq, t->optim.shard_len);
    df_tensor mk = df_u8_on(dev, t->optim.mask + t->optim.shard_off, t->optim.shard_len);
    DF_TRY(df_adamw_fused(t->ctx, ad, &p, &g, &m, &v, &mk, &t->stats.norm, NULL, err));
  }
  memcpy(mine, w + t->optim.shard_off, sizeof(float) * (size_t)t->optim.shard_len);
  DF_TRY(df_comm_all_gather(t->dp.comm, mine, buf, S, DF_COMM_F32, err));
  memcpy(w, buf, sizeof(float) * (size_t)n);
  return DF_OK;
}

df_status df_trainer_dp_zero_shard_ops(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                       df_error *err) {
  if (t->optim.shard_len == 0) return DF_OK;
  const df_device dev = df_ctx_device(t->ctx);
  const int64_t off = t->optim.shard_off, len = t->optim.shard_len;
  df_tensor g = df_f32_on(dev, df_draft_model_grads(t->model) + off, len);
  df_tensor p = df_f32_on(dev, df_draft_model_weights(t->model) + off, len);
  df_tensor m = df_f32_on(dev, t->optim.exp_avg, len), v = df_f32_on(dev, t->optim.exp_avg_sq, len);
  df_tensor mk = df_u8_on(dev, t->optim.mask + off, len);
  DF_TRY(df_grad_norm_clip(t->ctx, nd, &g, &mk, &t->stats.win, &t->stats.norm, err));
  return df_adamw_fused(t->ctx, ad, &p, &g, &m, &v, &mk, &t->stats.norm, NULL, err);
}

df_status df_trainer_dp_gather_moments(df_trainer *t, float *m_full, float *v_full, df_error *err) {
  const int64_t n = df_params_numel(t->table), S = t->optim.shard_size;
  float *buf = t->optim.zero_buf;
  for (int i = 0; i < 2; i++) {
    memset(buf + t->optim.shard_off, 0, sizeof(float) * (size_t)S);
    memcpy(buf + t->optim.shard_off, i ? t->optim.exp_avg_sq : t->optim.exp_avg,
           sizeof(float) * (size_t)t->optim.shard_len);
    DF_TRY(df_comm_all_gather(t->dp.comm, buf + t->optim.shard_off, buf, S, DF_COMM_F32, err));
    memcpy(i ? v_full : m_full, buf, sizeof(float) * (size_t)n);
  }
  return DF_OK;
}
