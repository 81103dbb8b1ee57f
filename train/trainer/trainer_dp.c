// Data parallel inside the trainer (docs/distributed.md): the global-batch view each micro-step's anchors
// replay, the one reduction of an optimizer step (the window's host scalars, the device metric sums, the flat
// gradient buffer in buckets), and the resume state handed from rank 0 to every rank.
#include <math.h>
#include <string.h>

#include "moe/ffn_moe.h"
#include "train/dist/dist.h"
#include "train/trainer/trainer_internal.h"

// A bucket of the flat gradient all-reduce: 25 MiB of fp32 (PyTorch DDP's default bucket_cap_mb).
#define DP_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)

df_status df_trainer_dp_check(df_trainer *t, df_error *err) {
  if (t->world == 1) return DF_OK;
  if (df_draft_model_is_moe(t->model)) { // routing statistics and deferred updates over every rank's rows
    t->moe_coll = df_dist_moe_collective(t->comm);
    int n = 0;
    df_ffn *const *ffns = df_draft_model_ffns(t->model, &n);
    df_moe_set_collective(ffns, n, &t->moe_coll);
    t->step_opt.dp_sum = &t->moe_coll;
  }
  if (df_comm_backend_of(t->comm) == DF_COMM_NCCL)
    return DF_FAIL(err, DF_ERR_NOT_IMPLEMENTED, "world size", "train data-parallel on CPU ranks under mpirun for now",
                   "data-parallel training on GPU ranks (NCCL) is not wired into the trainer yet: the anchor and "
                   "resume exchanges still use host buffers (docs/distributed.md)");
  const bool dev_bufs = !df_ctx_host_addressable(t->ctx);
  if (dev_bufs != df_comm_device_buffers(t->comm))
    return DF_FAIL(err, DF_ERR_INVALID, "training.device",
                   dev_bufs ? "train on the CPU under mpirun, or launch GPU ranks so that NCCL is used"
                            : "train GPU ranks on a CUDA device (training.device: cuda)",
                   "the %s communicator takes %s buffers, but the trainer's context (%s) keeps its state %s",
                   df_comm_backend_name(df_comm_backend_of(t->comm)),
                   df_comm_device_buffers(t->comm) ? "device" : "host", df_ctx_backend_name(t->ctx),
                   dev_bufs ? "on a device" : "in host memory");
  return DF_OK;
}

df_status df_trainer_dp_global_batch(df_trainer *t, const df_batch *b, df_error *err) {
  int64_t v[2] = {b->S, df_dflash_max_candidates(b->loss_mask, b->B, b->S)};
  DF_TRY(df_comm_all_reduce(t->comm, v, v, 2, DF_COMM_I64, DF_COMM_MAX, err));
  t->global = (df_dflash_global_batch){.world = t->world, .rank = t->rank, .global_S = v[0], .global_cmax = v[1]};
  return DF_OK;
}

df_status df_trainer_dp_reduce(df_trainer *t, double *scalars, int n_scalars, bool grads, df_error *err) {
  DF_TRY(df_comm_all_reduce(t->comm, scalars, scalars, n_scalars, DF_COMM_F64, DF_COMM_SUM, err));
  DF_TRY(df_comm_all_reduce(t->comm, t->win_stats.data, t->win_stats.data, t->nstats, DF_COMM_F64, DF_COMM_SUM, err));
  if (!grads) return df_comm_wait(t->comm, err);
  float *g = df_draft_model_grads(t->model);
  const int64_t n = df_params_numel(t->table);
  for (int64_t off = 0; off < n; off += DP_BUCKET_FLOATS) {
    const int64_t c = n - off < DP_BUCKET_FLOATS ? n - off : DP_BUCKET_FLOATS;
    DF_TRY(df_comm_all_reduce(t->comm, g + off, g + off, c, DF_COMM_F32, DF_COMM_SUM, err));
  }
  return df_comm_wait(t->comm, err);
}

df_status df_trainer_dp_share_state(df_trainer *t, df_error *err) {
  const int64_t n = df_params_numel(t->table);
  DF_TRY(df_comm_broadcast(t->comm, df_draft_model_weights(t->model), n, DF_COMM_F32, 0, err));
  if (t->zero) { // rank 0 holds the full moments in zero_full (resume); each rank keeps its shard
    for (int i = 0; i < 2; i++) {
      float *full = t->zero_full + i * n, *mine = i ? t->exp_avg_sq : t->exp_avg;
      DF_TRY(df_comm_broadcast(t->comm, full, n, DF_COMM_F32, 0, err));
      memcpy(mine, full + t->shard_off, sizeof(float) * (size_t)t->shard_len);
    }
  } else {
    DF_TRY(df_comm_broadcast(t->comm, t->exp_avg, n, DF_COMM_F32, 0, err));
    DF_TRY(df_comm_broadcast(t->comm, t->exp_avg_sq, n, DF_COMM_F32, 0, err));
  }
  DF_TRY(df_comm_broadcast(t->comm, &t->prog, (int64_t)sizeof t->prog, DF_COMM_U8, 0, err));
  return df_comm_wait(t->comm, err);
}

// ---- ZeRO-1 ------------------------------------------------------------------------------------------------

void df_trainer_dp_zero_plan(df_trainer *t) {
  const int64_t n = df_params_numel(t->table);
  const df_shard_kind k = t->recipe->training.fsdp_sharding;
  t->zero = t->world > 1 && (k == DF_SHARD_GRAD_OP || k == DF_SHARD_FULL);
  if (!t->zero) return;
  t->shard_size = ((n + t->world - 1) / t->world + 15) / 16 * 16;
  t->shard_off = t->rank * t->shard_size;
  const int64_t left = n - t->shard_off;
  t->shard_len = left < 0 ? 0 : (left < t->shard_size ? left : t->shard_size);
}

df_status df_trainer_dp_zero_step(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                  df_error *err) {
  const int64_t n = df_params_numel(t->table), S = t->shard_size, W = t->world;
  const df_device dev = df_ctx_device(t->ctx);
  float *buf = t->zero_buf, *w = df_draft_model_weights(t->model);
  // The gradient, padded to world shards, reduce-scattered in place: this rank's shard at buf + rank·S.
  memcpy(buf, df_draft_model_grads(t->model), sizeof(float) * (size_t)n);
  memset(buf + n, 0, sizeof(float) * (size_t)(W * S - n));
  float *mine = buf + t->shard_off;
  DF_TRY(df_comm_reduce_scatter(t->comm, buf, mine, S, DF_COMM_F32, DF_COMM_SUM, err));
  // The global norm: Σ g² of every shard (the fused kernel's norm of this shard, squared), summed over the ranks.
  double *ns = t->norm_stats.data;
  double sq = 0.0;
  if (t->shard_len > 0) {
    df_tensor g = df_f32_on(dev, mine, t->shard_len), mk = df_u8_on(dev, t->mask + t->shard_off, t->shard_len);
    DF_TRY(df_grad_norm_clip(t->ctx, nd, &g, &mk, &t->win_stats, &t->norm_stats, err));
    sq = ns[DF_NORM_VALUE] * ns[DF_NORM_VALUE];
  }
  DF_TRY(df_comm_all_reduce(t->comm, &sq, &sq, 1, DF_COMM_F64, DF_COMM_SUM, err));
  const double norm = sqrt(sq);
  bool ok = isfinite(norm);
  for (int64_t i = 0; i < t->nstats; i++) ok = ok && isfinite(((const double *)t->win_stats.data)[i]);
  ns[DF_NORM_VALUE] = norm;
  ns[DF_NORM_COEF] = fmin(1.0, nd->max_norm / (norm + 1e-6));
  ns[DF_NORM_OK] = ok ? 1.0 : 0.0;
  // AdamW on this shard (a skipped step leaves it as it was), then every rank's shard to every rank.
  if (t->shard_len > 0) {
    df_tensor p = df_f32_on(dev, w + t->shard_off, t->shard_len), g = df_f32_on(dev, mine, t->shard_len);
    df_tensor m = df_f32_on(dev, t->exp_avg, t->shard_len), v = df_f32_on(dev, t->exp_avg_sq, t->shard_len);
    df_tensor mk = df_u8_on(dev, t->mask + t->shard_off, t->shard_len);
    DF_TRY(df_adamw_fused(t->ctx, ad, &p, &g, &m, &v, &mk, &t->norm_stats, NULL, err));
  }
  memcpy(mine, w + t->shard_off, sizeof(float) * (size_t)t->shard_len);
  DF_TRY(df_comm_all_gather(t->comm, mine, buf, S, DF_COMM_F32, err));
  memcpy(w, buf, sizeof(float) * (size_t)n);
  return DF_OK;
}

df_status df_trainer_dp_gather_moments(df_trainer *t, float *m_full, float *v_full, df_error *err) {
  const int64_t n = df_params_numel(t->table), S = t->shard_size;
  float *buf = t->zero_buf;
  for (int i = 0; i < 2; i++) {
    memset(buf + t->shard_off, 0, sizeof(float) * (size_t)S);
    memcpy(buf + t->shard_off, i ? t->exp_avg_sq : t->exp_avg, sizeof(float) * (size_t)t->shard_len);
    DF_TRY(df_comm_all_gather(t->comm, buf + t->shard_off, buf, S, DF_COMM_F32, err));
    memcpy(i ? v_full : m_full, buf, sizeof(float) * (size_t)n);
  }
  return DF_OK;
}
