// Data parallel inside the trainer (docs/distributed.md): the global-batch view each micro-step's anchors
// replay, the one reduction of an optimizer step (the window's host scalars, the device metric sums, the flat
// gradient buffer in buckets), ZeRO-1, and the resume state handed from rank 0 to every rank. The same code serves
// CPU ranks (MPI, host buffers) and GPU ranks (NCCL, device buffers): collectives on device data run on the
// communicator's own stream, ordered against the context's stream by two events; what the host decides on goes
// through the communicator's host exchanges (df_comm_*_host).
#include <math.h>
#include <string.h>

#include "train/dist/comm.h"
#include "train/trainer/trainer_internal.h"

// The stage the ZeRO-1 moments travel through at a checkpoint or a resume: 25 MiB of fp32.
#define DP_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)

static df_status comm_after_compute(df_trainer *t, df_error *err);
static df_status compute_after_comm(df_trainer *t, df_error *err);

// The layers' all-reduce (base/collective.h): a device buffer in the order of the context's stream (the collective
// starts after what the context queued and the context's next work sees its result), a host buffer through the
// communicator's host exchange.
static df_status coll_sum(void *user, float *buf, int64_t n, df_error *err) {
  df_trainer *t = user;
  DF_TRY(comm_after_compute(t, err));
  DF_TRY(df_comm_all_reduce(t->dp.comm, buf, buf, n, DF_COMM_F32, DF_COMM_SUM, err));
  DF_TRY(compute_after_comm(t, err));
  return df_comm_wait(t->dp.comm, err);
}

static df_status coll_sum_host(void *user, float *buf, int64_t n, df_error *err) {
  return df_comm_all_reduce_host(((df_trainer *)user)->dp.comm, buf, n, DF_COMM_F32, DF_COMM_SUM, err);
}

df_status df_trainer_dp_check(df_trainer *t, df_error *err) {
  if (t->dp.world == 1) return DF_OK;
  // The FFN kind's routing statistics and deferred updates over every rank's rows (MoE), and the ranks' SUM for the
  // kind's loss-term weight.
  t->dp.coll = (df_collective){.sum = coll_sum, .sum_host = coll_sum_host, .user = t, .world_size = t->dp.world};
  df_ffn_set_collective(&t->ffn, &t->dp.coll);
  const bool dev_bufs = !df_ctx_host_addressable(t->ctx);
  if (dev_bufs != df_comm_device_buffers(t->dp.comm))
    return DF_FAIL(err, DF_ERR_INVALID, "training.device",
                   dev_bufs ? "train on the CPU under mpirun, or launch GPU ranks so that NCCL is used"
                            : "train GPU ranks on a CUDA device (training.device: cuda)",
                   "the %s communicator takes %s buffers, but the trainer's context (%s) keeps its state %s",
                   df_comm_backend_name(df_comm_backend_of(t->dp.comm)),
                   df_comm_device_buffers(t->dp.comm) ? "device" : "host", df_ctx_backend_name(t->ctx),
                   dev_bufs ? "on a device" : "in host memory");
  t->dp.bucket_floats = df_trainer_dp_bucket_floats(t);
  if (!dev_bufs) return DF_OK;
  DF_TRY(df_event_create(t->ctx, &t->dp.computed, err));
  return df_event_create(t->ctx, &t->dp.reduced, err);
}

// Device collectives queued after this see everything the context queued before it.
static df_status comm_after_compute(df_trainer *t, df_error *err) {
  if (!t->dp.computed) return DF_OK;
  DF_TRY(df_event_record(t->ctx, t->dp.computed, err));
  return df_comm_after(t->dp.comm, df_event_native(t->dp.computed), err);
}

// Work the context queues after this sees the collectives queued before it.
static df_status compute_after_comm(df_trainer *t, df_error *err) {
  if (!t->dp.reduced) return DF_OK;
  DF_TRY(df_comm_mark(t->dp.comm, df_event_native(t->dp.reduced), err));
  return df_event_wait(t->ctx, t->dp.reduced, err);
}

df_status df_trainer_dp_global_batch(df_trainer *t, const df_batch *b, df_error *err) {
  int64_t v[2] = {b->S, df_dflash_max_candidates(b->loss_mask, b->B, b->S)};
  DF_TRY(df_comm_all_reduce_host(t->dp.comm, v, 2, DF_COMM_I64, DF_COMM_MAX, err));
  t->dp.global_S = v[0], t->dp.global_cmax = v[1];
  return DF_OK;
}

// ---- the gradient reduction in buckets ----------------------------------------------------------------------------
// Bucket k covers [n − (k+1)·B, n − k·B) (the first bucket starts at 0), B = training.dp_bucket_mb: counted from the
// end of the flat buffer, whose gradient the backward completes first. Every rank issues bucket 0, 1, ... in that
// order and always all of them before the window's other sums, so the collectives match across ranks and the sums do
// not depend on when a bucket was issued. On GPU ranks the draft model reports each completed suffix during the
// window's last backward (df_draft_model_on_grads_ready) and the buckets inside it start on the communicator's
// stream then, overlapping the lower layers' backward; the rest start after the backward.
// A bucket is all-reduced (replicated AdamW), or under ZeRO-1 on GPU ranks reduced to the owner of each shard it
// overlaps, in rank order (ZeRO-1 on CPU ranks reduce-scatters at the boundary instead: MPI calls block, so buckets
// would overlap nothing).

static bool zero_buckets(const df_trainer *t) { return t->optim.zero && t->dp.computed; }

bool df_trainer_dp_grads_in_buckets(const df_trainer *t) { return !t->optim.zero || zero_buckets(t); }

// The shard of a rank: [*off, *off + *len).
static void shard_of(const df_trainer *t, int r, int64_t *off, int64_t *len) {
  const int64_t n = df_params_numel(t->table), S = t->optim.shard_size;
  *off = r * S;
  *len = r == t->dp.world - 1 ? n - *off : S;
}

static df_status reduce_bucket(df_trainer *t, float *g, int64_t lo, int64_t hi, df_error *err) {
  if (!t->optim.zero) return df_comm_all_reduce(t->dp.comm, g + lo, g + lo, hi - lo, DF_COMM_F32, DF_COMM_SUM, err);
  for (int r = 0; r < t->dp.world; r++) {
    int64_t off, len;
    shard_of(t, r, &off, &len);
    const int64_t a = lo > off ? lo : off, b = hi < off + len ? hi : off + len;
    if (a < b) DF_TRY(df_comm_reduce(t->dp.comm, g + a, b - a, DF_COMM_F32, DF_COMM_SUM, r, err));
  }
  return DF_OK;
}

int64_t df_trainer_dp_bucket_floats(const df_trainer *t) {
  const double f = t->recipe->training.dp_bucket_mb * 1024.0 * 1024.0 / 4.0;
  return f < 1.0 ? 1 : (int64_t)f;
}

// Issues the next buckets while they lie inside [from, n).
static df_status issue_buckets(df_trainer *t, int64_t from, df_error *err) {
  const int64_t n = df_params_numel(t->table), B = t->dp.bucket_floats;
  float *g = df_draft_model_grads(t->model);
  bool ordered = false;
  for (;;) {
    const int64_t hi = n - t->dp.buckets_issued * B;
    if (hi <= 0) return DF_OK;
    const int64_t lo = hi > B ? hi - B : 0;
    if (lo < from) return DF_OK;
    if (!ordered) { // one point in the compute stream covers every bucket issued now
      DF_TRY(comm_after_compute(t, err));
      ordered = true;
    }
    DF_TRY(reduce_bucket(t, g, lo, hi, err));
    t->dp.buckets_issued++;
  }
}

static df_status on_grads_ready(void *user, int64_t from, df_error *err) { return issue_buckets(user, from, err); }

df_status df_trainer_dp_overlap(df_trainer *t, bool on) {
  t->dp.buckets_issued = 0;
  // GPU ranks only: host collectives block.
  const bool use = on && t->dp.world > 1 && t->dp.computed;
  df_draft_model_on_grads_ready(t->model, use ? on_grads_ready : NULL, t);
  return DF_OK;
}

df_status df_trainer_dp_reduce(df_trainer *t, double *scalars, int n_scalars, bool grads, df_error *err) {
  df_draft_model_on_grads_ready(t->model, NULL, NULL);
  const int64_t early = t->dp.buckets_issued;
  if (grads) DF_TRY(issue_buckets(t, 0, err)); // those the backward did not start
  if (grads && !t->dp.reported && t->log) {
    fprintf(t->log, "  gradient %s: %lld bucket(s) of %.3g MiB, %lld started during the backward\n",
            t->optim.zero ? "reduce to the ZeRO-1 shard owners" : "all-reduce", (long long)t->dp.buckets_issued,
            t->recipe->training.dp_bucket_mb, (long long)early);
    t->dp.reported = true;
  }
  t->dp.buckets_issued = 0;
  DF_TRY(df_comm_all_reduce_host(t->dp.comm, scalars, n_scalars, DF_COMM_F64, DF_COMM_SUM, err));
  DF_TRY(comm_after_compute(t, err));
  DF_TRY(
      df_comm_all_reduce(t->dp.comm, t->stats.win.data, t->stats.win.data, t->stats.n, DF_COMM_F64, DF_COMM_SUM, err));
  DF_TRY(compute_after_comm(t, err));
  return df_comm_wait(t->dp.comm, err); // within the timeout, never a hang on a dead rank
}

// ---- ZeRO-1 ------------------------------------------------------------------------------------------------
// Rank r owns [r·S, r·S + len_r) of the flat buffer: S = ⌊n / world⌋ rounded down to 16 elements, and the last rank
// also owns the tail [world·S, n). The gradient is reduce-scattered in place in the model's own gradient buffer
// (the tail all-reduced beside it), the parameters all-gathered in place in the model's weights (the tail
// broadcast by its owner): no padded copy of either exists.

void df_trainer_dp_zero_plan(df_trainer *t) {
  const int64_t n = df_params_numel(t->table), W = t->dp.world;
  const df_shard_kind k = t->recipe->training.fsdp_sharding;
  t->optim.zero = W > 1 && (k == DF_SHARD_GRAD_OP || k == DF_SHARD_FULL);
  if (!t->optim.zero) return;
  t->optim.shard_size = n / W / 16 * 16;
  t->optim.shard_off = t->dp.rank * t->optim.shard_size;
  t->optim.shard_len = t->dp.rank == W - 1 ? n - t->optim.shard_off : t->optim.shard_size;
}

// The global norm from the shards' squared sums, the clip coefficient and the go/no-go flag into t->stats.norm,
// from this rank's df_grad_norm_clip of its shard (norm in stats.norm) and the reduced window sums.
static df_status zero_norm(df_trainer *t, const df_grad_norm_desc *nd, df_error *err) {
  const df_device dev = df_ctx_device(t->ctx);
  const size_t bytes = sizeof(double) * (size_t)(t->stats.n + DF_NORM_STATS);
  double *h = t->stats.host, *ns = h + t->stats.n;
  DF_TRY(df_copy(t->ctx, h, DF_DEV_CPU, t->stats.buf, dev, bytes, err));
  double sq = t->optim.shard_len > 0 ? ns[DF_NORM_VALUE] * ns[DF_NORM_VALUE] : 0.0;
  DF_TRY(df_comm_all_reduce_host(t->dp.comm, &sq, 1, DF_COMM_F64, DF_COMM_SUM, err));
  const double norm = sqrt(sq);
  bool ok = isfinite(norm);
  for (int64_t i = 0; i < t->stats.n; i++) ok = ok && isfinite(h[i]);
  ns[DF_NORM_VALUE] = norm;
  ns[DF_NORM_COEF] = fmin(1.0, nd->max_norm / (norm + 1e-6));
  ns[DF_NORM_OK] = ok ? 1.0 : 0.0;
  return df_copy(t->ctx, t->stats.norm.data, dev, ns, DF_DEV_CPU, sizeof(double) * DF_NORM_STATS, err);
}

df_status df_trainer_dp_zero_step(df_trainer *t, const df_adamw_fused_desc *ad, const df_grad_norm_desc *nd,
                                  df_error *err) {
  const int64_t n = df_params_numel(t->table), S = t->optim.shard_size, W = t->dp.world, tail = n - W * S;
  const df_device dev = df_ctx_device(t->ctx);
  float *g = df_draft_model_grads(t->model), *w = df_draft_model_weights(t->model);
  float *mine = g + t->optim.shard_off;
  if (!zero_buckets(t)) { // else the buckets already reduced each shard to its owner (df_trainer_dp_reduce)
    DF_TRY(comm_after_compute(t, err));
    if (S > 0) DF_TRY(df_comm_reduce_scatter(t->dp.comm, g, mine, S, DF_COMM_F32, DF_COMM_SUM, err));
    if (tail > 0) DF_TRY(df_comm_all_reduce(t->dp.comm, g + W * S, g + W * S, tail, DF_COMM_F32, DF_COMM_SUM, err));
    DF_TRY(compute_after_comm(t, err));
    DF_TRY(df_comm_wait(t->dp.comm, err));
  }
  if (t->optim.shard_len > 0) {
    df_tensor gs = df_f32_on(dev, mine, t->optim.shard_len),
              mk = df_u8_on(dev, t->optim.mask + t->optim.shard_off, t->optim.shard_len);
    DF_TRY(df_grad_norm_clip(t->ctx, nd, &gs, &mk, &t->stats.win, &t->stats.norm, err));
  }
  DF_TRY(zero_norm(t, nd, err));
  // AdamW on this shard (a skipped step leaves it as it was), then every rank's shard to every rank.
  if (t->optim.shard_len > 0) {
    df_tensor p = df_f32_on(dev, w + t->optim.shard_off, t->optim.shard_len),
              gs = df_f32_on(dev, mine, t->optim.shard_len);
    df_tensor m = df_f32_on(dev, t->optim.exp_avg, t->optim.shard_len),
              v = df_f32_on(dev, t->optim.exp_avg_sq, t->optim.shard_len);
    df_tensor mk = df_u8_on(dev, t->optim.mask + t->optim.shard_off, t->optim.shard_len);
    DF_TRY(df_adamw_fused(t->ctx, ad, &p, &gs, &m, &v, &mk, &t->stats.norm, NULL, err));
  }
  DF_TRY(comm_after_compute(t, err));
  if (S > 0) DF_TRY(df_comm_all_gather(t->dp.comm, w + t->optim.shard_off, w, S, DF_COMM_F32, err));
  if (tail > 0) DF_TRY(df_comm_broadcast(t->dp.comm, w + W * S, tail, DF_COMM_F32, (int)W - 1, err));
  DF_TRY(compute_after_comm(t, err));
  DF_TRY(df_comm_wait(t->dp.comm, err));
  return df_draft_model_sync_params(t->model, err); // every shard's update into the forward's bf16 copy
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

// ---- the moments' way to and from rank 0 ------------------------------------------------------------------------
// In pieces of at most DP_BUCKET_FLOATS through t->dp.stage (on the context's device): a checkpoint gathers every
// rank's shard to rank 0's host copy, a resume hands rank 0's host copy out to the shards' owners. Only broadcasts,
// so every element arrives bit for bit.

// gather: every shard to rank 0's host copy (m_full, v_full); else rank 0's host copy out to the shards' owners. The
// host copies are NULL on the other ranks.
static df_status move_moments(df_trainer *t, float *m_full, float *v_full, bool gather, df_error *err) {
  const df_device dev = df_ctx_device(t->ctx);
  const int me = t->dp.rank;
  float *stage = t->dp.stage;
  for (int i = 0; i < 2; i++) {
    float *mine = i ? t->optim.exp_avg_sq : t->optim.exp_avg, *full = i ? v_full : m_full;
    for (int r = 0; r < t->dp.world; r++) {
      int64_t off, len;
      shard_of(t, r, &off, &len);
      const int from = gather ? r : 0, to = gather ? 0 : r; // the rank whose copy goes out, the one that keeps it
      for (int64_t c = 0; c < len; c += DP_BUCKET_FLOATS) {
        const int64_t k = len - c < DP_BUCKET_FLOATS ? len - c : DP_BUCKET_FLOATS;
        const size_t bytes = sizeof(float) * (size_t)k;
        if (me == from)
          DF_TRY(gather ? df_copy(t->ctx, stage, dev, mine + c, dev, bytes, err)
                        : df_copy(t->ctx, stage, dev, full + off + c, DF_DEV_CPU, bytes, err));
        DF_TRY(df_comm_broadcast(t->dp.comm, stage, k, DF_COMM_F32, from, err));
        DF_TRY(df_comm_wait(t->dp.comm, err));
        if (me == to)
          DF_TRY(gather ? df_copy(t->ctx, full + off + c, DF_DEV_CPU, stage, dev, bytes, err)
                        : df_copy(t->ctx, mine + c, dev, stage, dev, bytes, err));
      }
    }
  }
  return DF_OK;
}

df_status df_trainer_dp_gather_moments(df_trainer *t, float *m_full, float *v_full, df_error *err) {
  return move_moments(t, m_full, v_full, true, err);
}

df_status df_trainer_dp_share_state(df_trainer *t, df_error *err) {
  const int64_t n = df_params_numel(t->table);
  DF_TRY(comm_after_compute(t, err));
  DF_TRY(df_comm_broadcast(t->dp.comm, df_draft_model_weights(t->model), n, DF_COMM_F32, 0, err));
  if (!t->optim.zero) {
    DF_TRY(df_comm_broadcast(t->dp.comm, t->optim.exp_avg, n, DF_COMM_F32, 0, err));
    DF_TRY(df_comm_broadcast(t->dp.comm, t->optim.exp_avg_sq, n, DF_COMM_F32, 0, err));
  }
  DF_TRY(compute_after_comm(t, err));
  DF_TRY(df_comm_wait(t->dp.comm, err));
  if (t->optim.zero) // rank 0 holds the full moments in zero_full; each rank keeps its shard
    DF_TRY(move_moments(t, t->optim.zero_full, t->optim.zero_full ? t->optim.zero_full + n : NULL, false, err));
  return df_comm_broadcast_host(t->dp.comm, &t->prog, (int64_t)sizeof t->prog, DF_COMM_U8, 0, err);
}

df_status df_trainer_dp_alloc(df_trainer *t, df_error *err) {
  if (!t->optim.zero) return DF_OK;
  const int64_t n = df_params_numel(t->table);
  const int64_t k = n < DP_BUCKET_FLOATS ? (n > 0 ? n : 1) : DP_BUCKET_FLOATS;
  return df_buffer_alloc_as(t->ctx, DF_MEM_STAGE, sizeof(float) * (size_t)k, &t->dp.stage, err);
}

void df_trainer_dp_free(df_trainer *t) {
  if (t->dp.stage) df_buffer_free(t->ctx, t->dp.stage);
  df_event_destroy(t->ctx, t->dp.computed), df_event_destroy(t->ctx, t->dp.reduced);
  t->dp.stage = NULL, t->dp.computed = t->dp.reduced = NULL;
}
