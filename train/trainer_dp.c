// Data parallel inside the trainer (docs/distributed.md): the global-batch view each micro-step's anchors
// replay, the one reduction of an optimizer step (the window's host scalars, the device metric sums, the flat
// gradient buffer in buckets), and the resume state handed from rank 0 to every rank.
#include <string.h>

#include "moe/ffn_moe.h"
#include "train/dist/dist.h"
#include "train/trainer_internal.h"

// A bucket of the flat gradient all-reduce: 25 MiB of fp32 (PyTorch DDP's default bucket_cap_mb).
#define DP_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)

df_status df_trainer_dp_check(df_trainer *t, df_error *err) {
  if (t->world == 1) return DF_OK;
  if (df_dflash_model_is_moe(t->model)) { // routing statistics and deferred updates over every rank's rows
    t->moe_coll = df_dist_moe_collective(t->comm);
    int n = 0;
    df_ffn *const *ffns = df_dflash_model_ffns(t->model, &n);
    df_moe_set_collective(ffns, n, &t->moe_coll);
    t->step_opt.dp_sum = &t->moe_coll;
  }
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

df_status df_trainer_dp_reduce(df_trainer *t, double *scalars, int n_scalars, df_error *err) {
  DF_TRY(df_comm_all_reduce(t->comm, scalars, scalars, n_scalars, DF_COMM_F64, DF_COMM_SUM, err));
  DF_TRY(df_comm_all_reduce(t->comm, t->win_stats.data, t->win_stats.data, t->nstats, DF_COMM_F64, DF_COMM_SUM, err));
  float *g = df_dflash_model_grads(t->model);
  const int64_t n = df_params_numel(t->table);
  for (int64_t off = 0; off < n; off += DP_BUCKET_FLOATS) {
    const int64_t c = n - off < DP_BUCKET_FLOATS ? n - off : DP_BUCKET_FLOATS;
    DF_TRY(df_comm_all_reduce(t->comm, g + off, g + off, c, DF_COMM_F32, DF_COMM_SUM, err));
  }
  return df_comm_wait(t->comm, err);
}

df_status df_trainer_dp_share_state(df_trainer *t, df_error *err) {
  const int64_t n = df_params_numel(t->table);
  float *bufs[3] = {df_dflash_model_weights(t->model), t->exp_avg, t->exp_avg_sq};
  for (int i = 0; i < 3; i++) DF_TRY(df_comm_broadcast(t->comm, bufs[i], n, DF_COMM_F32, 0, err));
  DF_TRY(df_comm_broadcast(t->comm, &t->prog, (int64_t)sizeof t->prog, DF_COMM_U8, 0, err));
  return df_comm_wait(t->comm, err);
}
