// The MoE layer: composition of centering, router, routed experts and shared expert over device memory (ops
// only; the host keeps the control state: what the last forward did, what is pending), and the training state
// (deferred updates, aux loss, metrics).
#include "moe/layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Regions of saved memory, in floats (int32 regions share the 4-byte unit), each a multiple of 16 long.
typedef struct {
  int64_t logits, scores, indices, weights, counts, slot, token, offsets, gate, up, shared, total;
} saved_layout;

typedef enum { CENTER_USED_NONE = 0, CENTER_USED_SAMPLE, CENTER_USED_FIXED } center_used;

static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

static saved_layout saved_layout_of(const df_moe_layer *L, int64_t T) {
  const int64_t E = L->router.E, k = L->router.k, Tk = T * k, I = L->experts.I;
  saved_layout s = {0};
  int64_t o = 0;
#define REGION(field, n)                                                                                               \
  do {                                                                                                                 \
    s.field = o;                                                                                                       \
    o += round16(n);                                                                                                   \
  } while (0)
  REGION(logits, T * E);
  REGION(scores, T * E);
  REGION(indices, Tk);
  REGION(weights, Tk);
  REGION(counts, E);
  REGION(slot, Tk);
  REGION(token, Tk);
  REGION(offsets, E + 1);
  REGION(gate, Tk * I);
  REGION(up, Tk * I);
  REGION(shared, L->has_shared ? df_moe_shared_saved_elems(&L->shared, T) : 0);
#undef REGION
  s.total = o;
  return s;
}

// Scratch: forward  = [u (T, H) | experts forward | shared forward]
//          backward = [u (T, H) | du (T, H) | dlogits (T, E) | dweights (T, k) | aux row (E) | experts backward |
//                      shared backward]
static int64_t shared_scratch(const df_moe_layer *L, int64_t T) {
  return L->has_shared ? round16(df_moe_shared_scratch_elems(&L->shared, T)) : 0;
}

static int64_t forward_scratch(const df_moe_layer *L, int64_t T) {
  return round16(T * L->H) + round16(df_moe_experts_forward_scratch_elems(&L->experts, T)) + shared_scratch(L, T);
}

static int64_t backward_scratch(const df_moe_layer *L, int64_t T) {
  return 2 * round16(T * L->H) + round16(T * L->router.E) + round16(T * L->router.k) + round16(L->router.E) +
         round16(df_moe_experts_backward_scratch_elems(&L->experts, T)) + shared_scratch(L, T);
}

int64_t df_moe_layer_saved_elems(const df_moe_layer *L, int64_t T) { return saved_layout_of(L, T).total; }

int64_t df_moe_layer_scratch_elems(const df_moe_layer *L, int64_t T) {
  const int64_t f = forward_scratch(L, T), b = backward_scratch(L, T);
  return f > b ? f : b;
}

static bool name_is(const char *got, const char *want) { return !got || !strcmp(got, want); }

df_status df_moe_layer_init(df_moe_layer *L, const df_moe_config *m, int64_t H, int64_t layer, df_error *err) {
  *L = (df_moe_layer){.cfg = *m, .layer = layer, .H = H, .training = true, .aux_grad_scale = 1.0f};
  L->coll.world_size = 1;
  L->router = df_moe_router_spec_from(m, H);
  DF_TRY(df_moe_router_spec_check(&L->router, err));
  if (m->moe_intermediate_size <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_intermediate_size", "set moe_intermediate_size > 0",
                   "moe_intermediate_size = %lld", (long long)m->moe_intermediate_size);
  if (!(m->swiglu_limit >= 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "swiglu_limit", "use 0 (no clamp) or a positive limit", "swiglu_limit = %g",
                   m->swiglu_limit);
  if (!name_is(m->router, "topk") || !name_is(m->experts_backend, "grouped") || !name_is(m->shared_expert, "swiglu"))
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "router", "this build has router topk, experts grouped, shared swiglu",
                   "unsupported MoE components: router %s, experts %s, shared %s", m->router ? m->router : "-",
                   m->experts_backend ? m->experts_backend : "-", m->shared_expert ? m->shared_expert : "-");
  L->experts = (df_moe_experts_spec){.H = H,
                                     .I = m->moe_intermediate_size,
                                     .E = L->router.E,
                                     .k = L->router.k,
                                     .swiglu_limit = (float)m->swiglu_limit};
  L->has_shared = m->n_shared_experts > 0;
  if (L->has_shared && m->shared_expert_intermediate_size <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "shared_expert_intermediate_size", "set a positive shared expert width",
                   "shared_expert_intermediate_size = %lld", (long long)m->shared_expert_intermediate_size);
  L->shared = (df_moe_shared_spec){.H = H,
                                   .S = m->shared_expert_intermediate_size,
                                   .gated = m->shared_expert_gate == DF_MOE_SHARED_GATE_SIGMOID,
                                   .swiglu_limit = (float)m->swiglu_limit};
  if (!(m->aux_loss_coeff >= 0.0))
    return DF_FAIL(err, DF_ERR_INVALID, "moe_aux_loss_coeff", "use a coefficient >= 0 (0 disables the loss)",
                   "moe_aux_loss_coeff = %g", m->aux_loss_coeff);
  if (m->aux_loss_coeff > 0.0) {
    const char *name;
    DF_TRY(df_moe_aux_loss_name(m->aux_loss_type, &name, err));
    L->aux = true;
  }
  if (m->router_center != DF_MOE_CENTER_NONE) {
    if (m->router_center != DF_MOE_CENTER_SAMPLE)
      return DF_FAIL(err, DF_ERR_INVALID, "moe_router_center", "use \"none\" or \"sample\"",
                     "unknown router centering mode %d", (int)m->router_center);
    if (!(m->router_center_momentum >= 0.0 && m->router_center_momentum < 1.0))
      return DF_FAIL(err, DF_ERR_INVALID, "moe_router_center_momentum", "the momentum must lie in [0, 1)",
                     "moe_router_center_momentum = %g", m->router_center_momentum);
  }
  L->host_record = calloc((size_t)DF_MOE_STATS(L->router.E), sizeof(double));
  if (!L->host_record) return DF_FAIL(err, DF_ERR_NOMEM, "router", NULL, "cannot allocate the statistics record");
  return df_moe_balance_init(&L->balance, m->balance, L->router.E, m->bias_update_rate, err);
}

void df_moe_layer_free(df_moe_layer *L) {
  free(L->host_record), free(L->owned_state), free(L->dp_counts), free(L->dp_buf), free(L->dp_sums);
  L->host_record = NULL, L->owned_state = NULL, L->dp_counts = NULL, L->dp_buf = NULL, L->dp_sums = NULL;
  if (L->dp_counts_dev && L->ctx) df_buffer_free(L->ctx, L->dp_counts_dev);
  free(L->dp_scores), free(L->dp_local), free(L->dp_stats), free(L->dp_bias);
  L->dp_counts_dev = NULL, L->dp_scores = NULL, L->dp_local = NULL, L->dp_stats = NULL, L->dp_bias = NULL;
  L->dp_scores_cap = 0;
}

// State: [record (DF_MOE_STATS(E) f64) | count stash (E) | centering stash (H)], each region 16-float aligned.
int64_t df_moe_layer_state_elems(const df_moe_layer *L) {
  return round16(2 * DF_MOE_STATS(L->router.E)) + round16(L->router.E) + round16(L->H);
}

void df_moe_layer_bind_state(df_moe_layer *L, float *mem) {
  L->record = (double *)mem;
  L->balance.stash = mem + round16(2 * DF_MOE_STATS(L->router.E));
  L->center_stash = L->balance.stash + round16(L->router.E);
}

// The state on a context that did not bind one: host memory, allowed only where host memory is device memory.
static df_status ensure_state(df_moe_layer *L, df_ctx *ctx, df_error *err) {
  if (L->record) return DF_OK;
  if (!df_ctx_host_addressable(ctx))
    return DF_FAIL(err, DF_ERR_INVALID, "state", "create the FFN through the model (it binds the device state)",
                   "layer %lld MoE FFN: no device state bound on the %s context", (long long)L->layer,
                   df_ctx_backend_name(ctx));
  L->owned_state = aligned_alloc(64, sizeof(float) * (size_t)round16(df_moe_layer_state_elems(L)));
  if (!L->owned_state) return DF_FAIL(err, DF_ERR_NOMEM, "state", NULL, "cannot allocate the MoE layer state");
  memset(L->owned_state, 0, sizeof(float) * (size_t)df_moe_layer_state_elems(L));
  df_moe_layer_bind_state(L, L->owned_state);
  return DF_OK;
}

// ---- training state ------------------------------------------------------------------------------------

void df_moe_layer_set_training(df_moe_layer *L, bool training) { L->training = training; }
void df_moe_layer_set_rows_per_sample(df_moe_layer *L, int64_t n) { L->rows_per_sample = n; }
void df_moe_layer_set_aux_grad_scale(df_moe_layer *L, float scale) { L->aux_grad_scale = scale; }
void df_moe_layer_set_collective(df_moe_layer *L, const df_collective *c) {
  L->coll = c ? *c : (df_collective){.world_size = 1};
}

void df_moe_layer_set_stats(df_moe_layer *L, double *sink, double den) { L->sink = sink, L->sink_den = den; }

// The record, read into host_record.
static const double *read_record(df_moe_layer *L) {
  const size_t bytes = sizeof(double) * (size_t)DF_MOE_STATS(L->router.E);
  if (df_ctx_host_addressable(L->ctx)) return memcpy(L->host_record, L->record, bytes);
  df_error err = {0};
  if (df_copy(L->ctx, L->host_record, DF_DEV_CPU, L->record, df_ctx_device(L->ctx), bytes, &err) != DF_OK)
    for (int64_t i = 0; i < DF_MOE_STATS(L->router.E); i++) L->host_record[i] = NAN;
  return L->host_record;
}

double df_moe_layer_aux_loss(df_moe_layer *L) { return L->aux_valid ? read_record(L)[DF_MOE_STAT_AUX] : 0.0; }

const double *df_moe_layer_load(df_moe_layer *L) { return L->has_metrics ? read_record(L) + DF_MOE_STAT_LOAD : NULL; }

df_moe_metrics df_moe_metrics_of(const double *st) {
  return (df_moe_metrics){.load_max_ratio = st[DF_MOE_STAT_LOAD_MAX],
                          .load_min_ratio = st[DF_MOE_STAT_LOAD_MIN],
                          .experts_unused_frac = st[DF_MOE_STAT_UNUSED],
                          .aux_loss = st[DF_MOE_STAT_AUX],
                          .bias_abs_max = st[DF_MOE_STAT_BIAS_ABS_MAX]};
}

bool df_moe_layer_metrics(df_moe_layer *L, df_moe_metrics *out) {
  if (!L->has_metrics) return false;
  *out = df_moe_metrics_of(read_record(L));
  return true;
}

// μ ← m on the first update, then μ ← ρ·μ + (1 − ρ)·m (df_moe_center_ema); m is all-reduce-averaged over ranks
// first.
static df_status apply_center_update(df_moe_layer *L, df_error *err) {
  if (!L->center_pending) return DF_OK;
  if (!L->input_mean || !L->input_mean_steps)
    return DF_FAIL(err, DF_ERR_INVALID, "gate.input_mean", "bind the layer before its first forward",
                   "the centering buffers are not bound");
  L->center_pending = false;
  const df_device d = df_ctx_device(L->ctx);
  df_tensor stash = df_f32_on(d, L->center_stash, L->H), mu = df_f32_on(d, L->input_mean, L->H);
  DF_TRY(df_allreduce(&L->coll, L->center_stash, L->H, false, err)); // the sum, then the mean on the device
  if (L->coll.sum && L->coll.world_size > 1) DF_TRY(df_scale(L->ctx, &stash, 1.0f / (float)L->coll.world_size, err));
  df_tensor steps = df_f32_on(d, L->input_mean_steps, 1);
  return df_moe_center_ema(L->ctx, L->cfg.router_center_momentum, &stash, &mu, &steps, err);
}

df_status df_moe_layer_apply_pending(df_moe_layer *L, df_error *err) {
  if (!L->ctx) return DF_OK; // no forward yet: nothing is pending
  DF_TRY(apply_center_update(L, err));
  return df_moe_balance_apply_pending(&L->balance, L->ctx, &L->coll, err);
}

// ---- forward -------------------------------------------------------------------------------------------

static df_moe_routing routing_at(const df_moe_layer *L, const saved_layout *s, float *saved, int64_t T) {
  return (df_moe_routing){.T = T,
                          .logits = saved + s->logits,
                          .scores = saved + s->scores,
                          .indices = (int32_t *)(saved + s->indices),
                          .weights = saved + s->weights,
                          .counts = (int32_t *)(saved + s->counts)};
}

df_moe_routing df_moe_layer_saved_routing(const df_moe_layer *L, const float *saved, int64_t T) {
  const saved_layout s = saved_layout_of(L, T);
  return routing_at(L, &s, (float *)saved, T);
}

static df_moe_slots slots_at(const saved_layout *s, float *saved, int64_t T) {
  return (df_moe_slots){.T = T,
                        .slot = (int32_t *)(saved + s->slot),
                        .token = (int32_t *)(saved + s->token),
                        .offsets = (int32_t *)(saved + s->offsets),
                        .gate = saved + s->gate,
                        .up = saved + s->up};
}

static df_tensor mat(const float *p, df_device dev, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, dev, 2, (const int64_t[]){rows, cols});
}

// ---- data parallel: the routing statistics over every rank's rows -------------------------------------------

// This rank's counts, score column sums (double, in row order) and rows, summed over the ranks in one fp32
// all-reduce (counts stay exact below 2^24 rows) into dp_counts, dp_sums and dp_T. The sums are formed on the host: a
// device context reads its counts and scores back first and gets the reduced counts written to dp_counts_dev.
static df_status reduce_routing(df_moe_layer *L, df_ctx *ctx, int64_t T, const df_moe_routing *r, df_error *err) {
  const int64_t E = L->router.E;
  const bool host = df_ctx_host_addressable(ctx);
  const df_device dev = df_ctx_device(ctx);
  if (!L->dp_counts) L->dp_counts = malloc(sizeof(int32_t) * (size_t)E);
  if (!L->dp_buf) L->dp_buf = malloc(sizeof(float) * (size_t)(2 * E + 1));
  if (!L->dp_sums) L->dp_sums = malloc(sizeof(double) * (size_t)E);
  if (!L->dp_counts || !L->dp_buf || !L->dp_sums) return DF_FAIL(err, DF_ERR_NOMEM, "moe", NULL, "out of memory");
  const float *scores = r->scores;
  const int32_t *counts = r->counts;
  if (!host) {
    if (!L->dp_local) L->dp_local = malloc(sizeof(int32_t) * (size_t)E);
    if (!L->dp_counts_dev) DF_TRY(df_buffer_alloc(ctx, sizeof(int32_t) * (size_t)E, (void **)&L->dp_counts_dev, err));
    if (T * E > L->dp_scores_cap) {
      free(L->dp_scores);
      L->dp_scores = malloc(sizeof(float) * (size_t)(T * E));
      L->dp_scores_cap = L->dp_scores ? T * E : 0;
    }
    if (!L->dp_local || !L->dp_scores) return DF_FAIL(err, DF_ERR_NOMEM, "moe", NULL, "out of memory");
    DF_TRY(df_copy(ctx, L->dp_scores, DF_DEV_CPU, r->scores, dev, sizeof(float) * (size_t)(T * E), err));
    DF_TRY(df_copy(ctx, L->dp_local, DF_DEV_CPU, r->counts, dev, sizeof(int32_t) * (size_t)E, err));
    scores = L->dp_scores, counts = L->dp_local;
  }
  float *b = L->dp_buf;
  for (int64_t e = 0; e < E; e++) {
    double p = 0.0;
    for (int64_t t = 0; t < T; t++) p += scores[t * E + e];
    b[e] = (float)counts[e], b[E + e] = (float)p;
  }
  b[2 * E] = (float)T;
  DF_TRY(df_allreduce_host(&L->coll, b, 2 * E + 1, false, err));
  for (int64_t e = 0; e < E; e++) L->dp_counts[e] = (int32_t)b[e], L->dp_sums[e] = (double)b[E + e];
  L->dp_T = (int64_t)b[2 * E];
  if (!host) DF_TRY(df_copy(ctx, L->dp_counts_dev, dev, L->dp_counts, DF_DEV_CPU, sizeof(int32_t) * (size_t)E, err));
  return DF_OK;
}

// The statistics block (DF_MOE_STATS(E), as df_moe_route_stats lays it out) of the reduced routing: the switch
// aux loss coeff·E·Σ_e (counts_e / T)·(Σ_t s_te / T), the load ratios and shares over all ranks' T·k slots, and
// max |bias| (bias: host memory, the same on every rank). den weights DF_MOE_STAT_AUX_NUM.
static void global_stats(const df_moe_layer *L, double coeff, double den, const float *bias, double *v) {
  const int64_t E = L->router.E, k = L->router.k, T = L->dp_T;
  const int32_t *c = L->dp_counts;
  for (int64_t i = 0; i < DF_MOE_STATS(E); i++) v[i] = 0.0;
  if (T <= 0) return;
  if (coeff > 0) {
    switch (L->cfg.aux_loss_type) {
    case DF_MOE_AUX_SWITCH: {
      double loss = 0.0;
      for (int64_t e = 0; e < E; e++) loss += ((double)c[e] / (double)T) * (L->dp_sums[e] / (double)T);
      v[DF_MOE_STAT_AUX] = coeff * (double)E * loss;
    } break;
    }
  }
  v[DF_MOE_STAT_AUX_NUM] = den > 0 ? v[DF_MOE_STAT_AUX] * den : 0.0;
  int32_t mx = c[0], mn = c[0];
  int64_t unused = 0;
  for (int64_t e = 0; e < E; e++) {
    mx = c[e] > mx ? c[e] : mx;
    mn = c[e] < mn ? c[e] : mn;
    unused += c[e] == 0;
  }
  const double uniform = (double)T * (double)k / (double)E;
  v[DF_MOE_STAT_LOAD_MAX] = mx / uniform;
  v[DF_MOE_STAT_LOAD_MIN] = mn / uniform;
  v[DF_MOE_STAT_UNUSED] = (double)unused / (double)E;
  if (bias) {
    float m = 0.0f;
    for (int64_t e = 0; e < E; e++) m = fabsf(bias[e]) > m ? fabsf(bias[e]) : m;
    v[DF_MOE_STAT_BIAS_ABS_MAX] = m;
  }
  for (int64_t e = 0; e < E; e++) v[DF_MOE_STAT_LOAD + e] = (double)c[e] / (double)(T * k);
}

// Data parallel: the record gets the global batch's statistics; the sink gets them divided by the world size
// (the trainer sums its stats vector over the ranks) except the aux numerator, weighted by this rank's own
// loss_den (the ranks' numerators add to aux·Σ loss_den). On a device context the statistics are formed on the host
// and the record and sink written back (one small copy each way).
static df_status dp_stats(df_moe_layer *L, df_ctx *ctx, int64_t T, const df_moe_routing *r, double coeff,
                          df_error *err) {
  DF_TRY(reduce_routing(L, ctx, T, r, err));
  const int64_t n = DF_MOE_STATS(L->router.E), E = L->router.E;
  const bool host = df_ctx_host_addressable(ctx);
  const df_device dev = df_ctx_device(ctx);
  const bool noaux = L->cfg.balance == DF_MOE_BALANCE_NOAUX_TC && L->balance.bias;
  const float *bias = noaux ? L->balance.bias : NULL;
  double *rec = L->record, *sink = L->sink;
  if (!host) {
    if (!L->dp_stats) L->dp_stats = malloc(sizeof(double) * (size_t)(2 * n));
    if (noaux && !L->dp_bias) L->dp_bias = malloc(sizeof(float) * (size_t)E);
    if (!L->dp_stats || (noaux && !L->dp_bias)) return DF_FAIL(err, DF_ERR_NOMEM, "moe", NULL, "out of memory");
    if (noaux) DF_TRY(df_copy(ctx, L->dp_bias, DF_DEV_CPU, L->balance.bias, dev, sizeof(float) * (size_t)E, err));
    bias = noaux ? L->dp_bias : NULL;
    rec = L->dp_stats, sink = L->sink ? L->dp_stats + n : NULL;
    if (sink) DF_TRY(df_copy(ctx, sink, DF_DEV_CPU, L->sink, dev, sizeof(double) * (size_t)n, err));
  }
  global_stats(L, coeff, 0.0, bias, rec);
  if (sink) {
    const double w = 1.0 / (double)L->coll.world_size;
    for (int64_t i = 0; i < n; i++)
      sink[i] += i == DF_MOE_STAT_AUX_NUM ? (L->sink_den > 0 ? rec[DF_MOE_STAT_AUX] * L->sink_den : 0.0) : rec[i] * w;
  }
  if (host) return DF_OK;
  DF_TRY(df_copy(ctx, L->record, dev, rec, DF_DEV_CPU, sizeof(double) * (size_t)n, err));
  return sink ? df_copy(ctx, L->sink, dev, sink, DF_DEV_CPU, sizeof(double) * (size_t)n, err) : DF_OK;
}

// The router input: x itself, x minus each sample's mean (training), or x minus the running mean (eval).
static df_status router_input(df_moe_layer *L, df_ctx *ctx, const float *x, int64_t T, center_used mode, int64_t rps,
                              float *u_buf, float *batch_mean, const float **u, df_error *err) {
  switch (mode) {
  case CENTER_USED_NONE: *u = x; return DF_OK;
  case CENTER_USED_SAMPLE: DF_TRY(df_moe_center_sample_forward(ctx, x, T, L->H, rps, u_buf, batch_mean, err)); break;
  case CENTER_USED_FIXED: DF_TRY(df_moe_center_fixed(ctx, x, L->input_mean, T, L->H, u_buf, err)); break;
  }
  *u = u_buf;
  return DF_OK;
}

static df_status check_rows(const df_moe_layer *L, const df_tensor *t, const char *name, df_error *err) {
  if (t->dtype != DF_F32 || t->ndim < 2 || t->ndim > 3 || t->shape[t->ndim - 1] != L->H || !df_is_contiguous(t))
    return DF_FAIL(err, DF_ERR_INVALID, name, "pass contiguous fp32 rows (T, H) or (B, Q, H)",
                   "layer %lld MoE FFN: '%s' must be fp32 [.., %lld]", (long long)L->layer, name, (long long)L->H);
  return DF_OK;
}

df_status df_moe_layer_forward(df_moe_layer *L, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved,
                               float *scratch, df_error *err) {
  DF_TRY(check_rows(L, x, "x", err));
  DF_TRY(check_rows(L, y, "y", err));
  const int64_t H = L->H, T = df_numel(x) / H, E = L->router.E, k = L->router.k;
  if (df_numel(y) != T * H)
    return DF_FAIL(err, DF_ERR_INVALID, "y", NULL, "y has %lld elements, x has %lld", (long long)df_numel(y),
                   (long long)(T * H));
  if (L->ctx && L->ctx != ctx && df_ctx_device(L->ctx) != df_ctx_device(ctx))
    return DF_FAIL(err, DF_ERR_INVALID, "ctx", "run every forward of a model on one device",
                   "layer %lld MoE FFN: a %s forward after %s ones", (long long)L->layer, df_ctx_backend_name(ctx),
                   df_ctx_backend_name(L->ctx));
  DF_TRY(ensure_state(L, ctx, err));
  if (L->training) DF_TRY(df_moe_layer_apply_pending(L, err));
  L->ctx = ctx;

  const saved_layout s = saved_layout_of(L, T);
  int64_t rps = x->ndim == 3 ? x->shape[1] : (L->rows_per_sample > 0 ? L->rows_per_sample : T);
  center_used mode = CENTER_USED_NONE;
  if (L->cfg.router_center == DF_MOE_CENTER_SAMPLE) mode = L->training ? CENTER_USED_SAMPLE : CENTER_USED_FIXED;
  const bool aux_on = L->training && L->aux;
  const bool dp = L->training && L->coll.sum && L->coll.world_size > 1;
  L->fwd.valid = false;

  // Router (fp32) on the centered rows.
  float *u_buf = scratch, *ex_scratch = u_buf + round16(T * H);
  float *sh_scratch = ex_scratch + round16(df_moe_experts_forward_scratch_elems(&L->experts, T));
  const float *u = NULL;
  DF_TRY(router_input(L, ctx, x->data, T, mode, rps, u_buf, L->training ? L->center_stash : NULL, &u, err));
  df_moe_routing r = routing_at(L, &s, saved, T);
  df_tensor ut = mat(u, x->device, T, H);
  DF_TRY(df_moe_router_forward(ctx, &L->router, &ut, &L->w_router, L->cfg.moe_router_bias ? &L->logit_bias : NULL,
                               df_moe_balance_shift(&L->balance), &r, err));

  // Training only: stash (overwrite) for the deferred updates; aux loss and statistics into the record (and the
  // sink when one is set).
  if (L->training) {
    const df_device d = x->device;
    const bool noaux = L->cfg.balance == DF_MOE_BALANCE_NOAUX_TC;
    df_moe_stats_desc sd = {.aux = L->cfg.aux_loss_type, .coeff = aux_on ? L->cfg.aux_loss_coeff : 0.0, .k = k};
    df_tensor sc = mat(r.scores, d, T, E), cn = df_i32_on(d, r.counts, E);
    df_tensor bias = df_f32_on(d, L->balance.bias, E), rec = df_f64_on(d, L->record, DF_MOE_STATS(E));
    df_tensor stash = df_f32_on(d, L->balance.stash, E);
    DF_TRY(df_moe_route_stats(ctx, &sd, &sc, &cn, noaux ? &bias : NULL, &rec, false, noaux ? &stash : NULL, err));
    if (dp) {
      DF_TRY(dp_stats(L, ctx, T, &r, sd.coeff, err));
    } else if (L->sink) {
      df_tensor sink = df_f64_on(d, L->sink, DF_MOE_STATS(E));
      sd.den = L->sink_den;
      DF_TRY(df_moe_route_stats(ctx, &sd, &sc, &cn, noaux ? &bias : NULL, &sink, true, NULL, err));
    }
    L->center_pending = mode == CENTER_USED_SAMPLE;
    L->balance.pending = noaux;
    L->has_metrics = true;
  }
  L->aux_valid = aux_on;

  // Routed experts into y (fp32, written), then the shared expert added: one sum, no intermediate cast.
  df_moe_slots d = slots_at(&s, saved, T);
  DF_TRY(df_moe_experts_forward(ctx, &L->experts, &L->ep, x, r.indices, r.weights, r.counts, &d, ex_scratch, y, err));
  if (L->has_shared) {
    df_moe_shared_saved sv = df_moe_shared_saved_at(&L->shared, T, saved + s.shared);
    DF_TRY(df_moe_shared_forward(ctx, &L->shared, &L->sp, x, &sv, sh_scratch, y, err));
  }
  L->fwd.T = T, L->fwd.rows_per_sample = rps, L->fwd.center = mode, L->fwd.aux_on = aux_on;
  L->fwd.dp = dp;
  L->fwd.valid = true;
  return DF_OK;
}

// ---- backward ------------------------------------------------------------------------------------------

df_status df_moe_layer_backward(df_moe_layer *L, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                                bool accumulate_dx, const float *saved_c, float *scratch, df_error *err) {
  DF_TRY(check_rows(L, x, "x", err));
  DF_TRY(check_rows(L, dy, "dy", err));
  DF_TRY(check_rows(L, dx, "dx", err));
  const int64_t H = L->H, T = df_numel(x) / H, E = L->router.E, k = L->router.k;
  float *saved = (float *)saved_c; // the layout views are typed for both directions; nothing is written
  const saved_layout s = saved_layout_of(L, T);
  if (!L->fwd.valid || L->fwd.T != T)
    return DF_FAIL(err, DF_ERR_INVALID, "saved", "run the forward on the same rows before the backward",
                   "layer %lld MoE FFN: no saved forward of %lld rows", (long long)L->layer, (long long)T);
  if (df_numel(dy) != T * H || df_numel(dx) != T * H)
    return DF_FAIL(err, DF_ERR_INVALID, "dy", NULL, "dy and dx must have the %lld elements of x", (long long)(T * H));

  const df_device dev = x->device;
  float *u_buf = scratch, *du = u_buf + round16(T * H), *dlogits = du + round16(T * H);
  float *dweights = dlogits + round16(T * E), *aux_row = dweights + round16(T * k);
  float *ex_scratch = aux_row + round16(E);
  float *sh_scratch = ex_scratch + round16(df_moe_experts_backward_scratch_elems(&L->experts, T));
  df_tensor dx2 = mat(dx->data, dev, T, H);
  if (!accumulate_dx) DF_TRY(df_fill(ctx, &dx2, 0.0, err));

  // Routed experts: dx += ..., d(combine weights); shared expert: dx += ...
  const df_moe_routing r = routing_at(L, &s, saved, T);
  const df_moe_slots d = slots_at(&s, saved, T);
  DF_TRY(df_moe_experts_backward(ctx, &L->experts, &L->ep, x, dy, r.weights, &d, ex_scratch, dweights, dx, err));
  if (L->has_shared) {
    const df_moe_shared_saved sv = df_moe_shared_saved_at(&L->shared, T, saved + s.shared);
    DF_TRY(df_moe_shared_backward(ctx, &L->shared, &L->sp, x, dy, &sv, sh_scratch, dx, err));
  }

  // Router: the combine weights' gradient plus the aux loss's (linear in the scores, counts detached).
  const bool aux_on = L->fwd.aux_on;
  if (aux_on) {
    const df_moe_stats_desc sd = {.aux = L->cfg.aux_loss_type, .coeff = L->cfg.aux_loss_coeff, .k = k};
    // Data parallel: the global counts and rows of the forward (the reduced routing).
    const bool dp = L->fwd.dp;
    const int32_t *cnt = !dp ? r.counts : (df_ctx_host_addressable(ctx) ? L->dp_counts : L->dp_counts_dev);
    df_tensor cn = df_i32_on(dev, cnt, E), row = df_f32_on(dev, aux_row, E);
    DF_TRY(df_moe_aux_backward(ctx, &sd, dp ? L->dp_T : T, &cn, (double)L->aux_grad_scale, &row, err));
  }
  const float *u = NULL;
  const int64_t rps = L->fwd.rows_per_sample;
  DF_TRY(router_input(L, ctx, x->data, T, (center_used)L->fwd.center, rps, u_buf, NULL, &u, err));
  df_tensor ut = mat(u, dev, T, H), dut = mat(du, dev, T, H);
  DF_TRY(df_moe_router_backward(ctx, &L->router, &r, &ut, &L->w_router, &L->g_router, dweights, aux_on ? aux_row : NULL,
                                dlogits, &dut, err));
  if (L->fwd.center == CENTER_USED_SAMPLE)
    return df_moe_center_sample_backward(ctx, du, T, H, rps, dx->data, true, err);
  return df_axpy(ctx, 1.0f, &dut, &dx2, err);
}
