// The MoE layer: composition of centering, router, routed experts and shared expert over caller memory,
// and the training state (deferred updates, aux loss, metrics).
#include "moe/layer.h"

#include <stdlib.h>
#include <string.h>

// Regions of saved memory, in floats (int32 regions share the 4-byte unit), each a multiple of 16 long.
typedef struct {
  int64_t hdr, logits, scores, indices, weights, counts, slot, token, offsets, gate, up, shared, total;
} saved_layout;

enum { HDR_ELEMS = 16, SAVED_MAGIC = 0x4d6f4521 }; // "MoE!"
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
  REGION(hdr, HDR_ELEMS);
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

// Scratch: forward  = [u (T, H) | sel | experts forward | shared forward]
//          backward = [u (T, H) | du (T, H) | dlogits (T, E) | dweights (T, k) | aux row (E) | experts backward |
//                      shared backward]
static int64_t shared_scratch(const df_moe_layer *L, int64_t T) {
  return L->has_shared ? round16(df_moe_shared_scratch_elems(&L->shared, T)) : 0;
}

static int64_t forward_scratch(const df_moe_layer *L, int64_t T) {
  return round16(T * L->H) + round16(df_moe_router_sel_elems(&L->router, T)) +
         round16(df_moe_experts_forward_scratch_elems(&L->experts, T)) + shared_scratch(L, T);
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
  if (m->aux_loss_coeff > 0.0) DF_TRY(df_moe_aux_loss_get(m->aux_loss_type, &L->aux, err));
  if (m->router_center != DF_MOE_CENTER_NONE) {
    if (m->router_center != DF_MOE_CENTER_SAMPLE)
      return DF_FAIL(err, DF_ERR_INVALID, "moe_router_center", "use \"none\" or \"sample\"",
                     "unknown router centering mode %d", (int)m->router_center);
    if (!(m->router_center_momentum >= 0.0 && m->router_center_momentum < 1.0))
      return DF_FAIL(err, DF_ERR_INVALID, "moe_router_center_momentum", "the momentum must lie in [0, 1)",
                     "moe_router_center_momentum = %g", m->router_center_momentum);
    L->center_stash = calloc((size_t)H, sizeof(float));
    if (!L->center_stash) return DF_FAIL(err, DF_ERR_NOMEM, "gate.input_mean", NULL, "cannot allocate the mean stash");
  }
  L->last_load = calloc((size_t)L->router.E, sizeof(double));
  if (!L->last_load) return DF_FAIL(err, DF_ERR_NOMEM, "router", NULL, "cannot allocate the expert-load record");
  return df_moe_balance_init(&L->balance, m->balance, L->router.E, m->bias_update_rate, err);
}

void df_moe_layer_free(df_moe_layer *L) {
  df_moe_balance_free(&L->balance);
  free(L->center_stash), free(L->last_load), free(L->dp_counts), free(L->dp_buf), free(L->dp_sums);
  L->center_stash = NULL, L->last_load = NULL, L->dp_counts = NULL, L->dp_buf = NULL, L->dp_sums = NULL;
}

// ---- training state ------------------------------------------------------------------------------------

void df_moe_layer_set_training(df_moe_layer *L, bool training) { L->training = training; }
void df_moe_layer_set_rows_per_sample(df_moe_layer *L, int64_t n) { L->rows_per_sample = n; }
void df_moe_layer_set_aux_grad_scale(df_moe_layer *L, float scale) { L->aux_grad_scale = scale; }
void df_moe_layer_set_collective(df_moe_layer *L, const df_moe_collective *c) {
  L->coll = c ? *c : (df_moe_collective){.world_size = 1};
}

double df_moe_layer_aux_loss(const df_moe_layer *L) { return L->last_aux; }

const double *df_moe_layer_load(const df_moe_layer *L) { return L->has_metrics ? L->last_load : NULL; }

bool df_moe_layer_metrics(const df_moe_layer *L, df_moe_metrics *out) {
  if (!L->has_metrics) return false;
  *out = L->last_metrics;
  return true;
}

// μ ← m on the first update, then μ ← ρ·μ + (1 − ρ)·m; m is all-reduce-averaged over ranks first.
static df_status apply_center_update(df_moe_layer *L, df_error *err) {
  if (!L->center_pending) return DF_OK;
  if (!L->input_mean || !L->input_mean_steps)
    return DF_FAIL(err, DF_ERR_INVALID, "gate.input_mean", "bind the layer before its first forward",
                   "the centering buffers are not bound");
  L->center_pending = false;
  DF_TRY(df_moe_allreduce(&L->coll, L->center_stash, L->H, true, err));
  const double rho = L->cfg.router_center_momentum;
  const bool first = *L->input_mean_steps == 0.0f;
  for (int64_t c = 0; c < L->H; c++)
    L->input_mean[c] =
        first ? L->center_stash[c] : (float)(rho * (double)L->input_mean[c] + (1.0 - rho) * (double)L->center_stash[c]);
  *L->input_mean_steps += 1.0f;
  return DF_OK;
}

df_status df_moe_layer_apply_pending(df_moe_layer *L, df_error *err) {
  DF_TRY(apply_center_update(L, err));
  return df_moe_balance_apply_pending(&L->balance, &L->coll, err);
}

// ---- forward -------------------------------------------------------------------------------------------

typedef struct {
  int32_t magic, T, rows_per_sample, center, aux_on;
} saved_header;

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

// Data parallel: this rank's counts, score column sums (double, in row order) and rows, summed over the ranks
// in one fp32 all-reduce (counts stay exact below 2^24 rows) into dp_counts, dp_sums and dp_T.
static df_status reduce_routing(df_moe_layer *L, int64_t T, int64_t E, const float *scores, const int32_t *counts,
                                df_error *err) {
  if (!L->dp_counts) L->dp_counts = malloc(sizeof(int32_t) * (size_t)E);
  if (!L->dp_buf) L->dp_buf = malloc(sizeof(float) * (size_t)(2 * E + 1));
  if (!L->dp_sums) L->dp_sums = malloc(sizeof(double) * (size_t)E);
  if (!L->dp_counts || !L->dp_buf || !L->dp_sums) return DF_FAIL(err, DF_ERR_NOMEM, "moe", NULL, "out of memory");
  float *b = L->dp_buf;
  for (int64_t e = 0; e < E; e++) {
    double p = 0.0;
    for (int64_t t = 0; t < T; t++) p += scores[t * E + e];
    b[e] = (float)counts[e], b[E + e] = (float)p;
  }
  b[2 * E] = (float)T;
  DF_TRY(df_moe_allreduce(&L->coll, b, 2 * E + 1, false, err));
  for (int64_t e = 0; e < E; e++) L->dp_counts[e] = (int32_t)b[e], L->dp_sums[e] = (double)b[E + e];
  L->dp_T = (int64_t)b[2 * E];
  return DF_OK;
}

// The router input: x itself, x minus each sample's mean (training), or x minus the running mean (eval).
static df_status router_input(df_moe_layer *L, df_ctx *ctx, const float *x, int64_t T, center_used mode, int64_t rps,
                              float *u_buf, float *batch_mean, const float **u, df_error *err) {
  switch (mode) {
  case CENTER_USED_NONE: *u = x; return DF_OK;
  case CENTER_USED_SAMPLE: DF_TRY(df_moe_center_sample_forward(ctx, x, T, L->H, rps, u_buf, batch_mean, err)); break;
  case CENTER_USED_FIXED: df_moe_center_fixed(ctx, x, L->input_mean, T, L->H, u_buf); break;
  }
  *u = u_buf;
  return DF_OK;
}

static df_status check_rows(const df_moe_layer *L, const df_tensor *t, const char *name, df_error *err) {
  if (t->dtype != DF_F32 || t->ndim < 2 || t->ndim > 3 || t->shape[t->ndim - 1] != L->H || !df_is_contiguous(t))
    return DF_FAIL(err, DF_ERR_INVALID, name, "pass contiguous fp32 rows (T, H) or (B, Q, H)",
                   "layer %lld MoE FFN: '%s' must be fp32 [.., %lld]", (long long)L->layer, name, (long long)L->H);
  if (t->device == DF_DEV_CUDA) // routing and dispatch loop over host-backed memory (CPU, the fake test device)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, name, "run the MoE FFN on a CPU context for now",
                   "layer %lld: the MoE FFN's routing and dispatch run on host memory only", (long long)L->layer);
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
  if (L->training) DF_TRY(df_moe_layer_apply_pending(L, err));

  const saved_layout s = saved_layout_of(L, T);
  int64_t rps = x->ndim == 3 ? x->shape[1] : (L->rows_per_sample > 0 ? L->rows_per_sample : T);
  center_used mode = CENTER_USED_NONE;
  if (L->cfg.router_center == DF_MOE_CENTER_SAMPLE) mode = L->training ? CENTER_USED_SAMPLE : CENTER_USED_FIXED;
  const bool aux_on = L->training && L->aux != NULL;
  saved_header *hdr = (saved_header *)(saved + s.hdr);
  *hdr = (saved_header){
      .magic = SAVED_MAGIC, .T = (int32_t)T, .rows_per_sample = (int32_t)rps, .center = mode, .aux_on = aux_on};

  // Router (fp32) on the centered rows.
  float *u_buf = scratch, *sel = u_buf + round16(T * H);
  float *ex_scratch = sel + round16(df_moe_router_sel_elems(&L->router, T));
  float *sh_scratch = ex_scratch + round16(df_moe_experts_forward_scratch_elems(&L->experts, T));
  const float *u = NULL;
  DF_TRY(router_input(L, ctx, x->data, T, mode, rps, u_buf, L->training ? L->center_stash : NULL, &u, err));
  df_moe_routing r = routing_at(L, &s, saved, T);
  df_tensor ut = mat(u, x->device, T, H);
  DF_TRY(df_moe_router_forward(ctx, &L->router, &ut, &L->w_router, L->cfg.moe_router_bias ? &L->logit_bias : NULL,
                               df_moe_balance_shift(&L->balance), sel, &r, err));

  // Training only: stash (overwrite) for the deferred updates; aux loss and metrics (over every rank's rows).
  if (L->training) {
    if (mode == CENTER_USED_SAMPLE) L->center_pending = true;
    df_moe_balance_observe(&L->balance, r.counts);
    const int32_t *counts = r.counts;
    int64_t Tg = T;
    if (L->coll.world_size > 1) {
      DF_TRY(reduce_routing(L, T, E, r.scores, r.counts, err));
      counts = L->dp_counts, Tg = L->dp_T;
      L->last_aux = aux_on ? L->aux->value_from_sums(L->cfg.aux_loss_coeff, Tg, E, k, L->dp_sums, counts) : 0.0;
    } else {
      L->last_aux = aux_on ? L->aux->value(L->cfg.aux_loss_coeff, T, E, k, r.scores, r.counts) : 0.0;
    }
    const df_moe_load_stats st = df_moe_load_stats_of(counts, E, Tg, k);
    L->last_metrics = (df_moe_metrics){.load_max_ratio = st.load_max_ratio,
                                       .load_min_ratio = st.load_min_ratio,
                                       .experts_unused_frac = st.experts_unused_frac,
                                       .aux_loss = L->last_aux,
                                       .bias_abs_max = df_moe_balance_bias_abs_max(&L->balance)};
    for (int64_t e = 0; e < E; e++) L->last_load[e] = Tg * k > 0 ? (double)counts[e] / (double)(Tg * k) : 0.0;
    L->has_metrics = true;
  } else {
    L->last_aux = 0.0;
  }

  // Routed experts into y (fp32, written), then the shared expert added: one sum, no intermediate cast.
  df_moe_slots d = slots_at(&s, saved, T);
  DF_TRY(df_moe_experts_forward(ctx, &L->experts, &L->ep, x, r.indices, r.weights, r.counts, &d, ex_scratch, y, err));
  if (!L->has_shared) return DF_OK;
  df_moe_shared_saved sv = df_moe_shared_saved_at(&L->shared, T, saved + s.shared);
  return df_moe_shared_forward(ctx, &L->shared, &L->sp, x, &sv, sh_scratch, y, err);
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
  const saved_header hdr = *(const saved_header *)(saved + s.hdr);
  if (hdr.magic != SAVED_MAGIC || hdr.T != T)
    return DF_FAIL(err, DF_ERR_INVALID, "saved", "run the forward on the same rows before the backward",
                   "layer %lld MoE FFN: no saved forward of %lld rows", (long long)L->layer, (long long)T);
  if (df_numel(dy) != T * H || df_numel(dx) != T * H)
    return DF_FAIL(err, DF_ERR_INVALID, "dy", NULL, "dy and dx must have the %lld elements of x", (long long)(T * H));

  float *u_buf = scratch, *du = u_buf + round16(T * H), *dlogits = du + round16(T * H);
  float *dweights = dlogits + round16(T * E), *aux_row = dweights + round16(T * k);
  float *ex_scratch = aux_row + round16(E);
  float *sh_scratch = ex_scratch + round16(df_moe_experts_backward_scratch_elems(&L->experts, T));
  if (!accumulate_dx) memset(dx->data, 0, sizeof(float) * (size_t)(T * H));

  // Routed experts: dx += ..., d(combine weights); shared expert: dx += ...
  const df_moe_routing r = routing_at(L, &s, saved, T);
  const df_moe_slots d = slots_at(&s, saved, T);
  DF_TRY(df_moe_experts_backward(ctx, &L->experts, &L->ep, x, dy, r.weights, &d, ex_scratch, dweights, dx, err));
  if (L->has_shared) {
    const df_moe_shared_saved sv = df_moe_shared_saved_at(&L->shared, T, saved + s.shared);
    DF_TRY(df_moe_shared_backward(ctx, &L->shared, &L->sp, x, dy, &sv, sh_scratch, dx, err));
  }

  // Router: the combine weights' gradient plus the aux loss's (linear in the scores, counts detached).
  const bool dp = L->coll.world_size > 1 && L->dp_counts; // the global counts and rows of the forward
  if (hdr.aux_on)
    L->aux->score_grad_row(L->cfg.aux_loss_coeff, dp ? L->dp_T : T, E, k, dp ? L->dp_counts : r.counts,
                           (double)L->aux_grad_scale, aux_row);
  const float *u = NULL;
  DF_TRY(router_input(L, ctx, x->data, T, (center_used)hdr.center, hdr.rows_per_sample, u_buf, NULL, &u, err));
  df_tensor ut = mat(u, x->device, T, H), dut = mat(du, x->device, T, H);
  DF_TRY(df_moe_router_backward(ctx, &L->router, &r, &ut, &L->w_router, &L->g_router, dweights,
                                hdr.aux_on ? aux_row : NULL, dlogits, &dut, err));
  if (hdr.center == CENTER_USED_SAMPLE) {
    df_moe_center_sample_backward(ctx, du, T, H, hdr.rows_per_sample, dx->data, true);
    return DF_OK;
  }
  df_tensor dx2 = mat(dx->data, x->device, T, H);
  return df_axpy(ctx, 1.0f, &dut, &dx2, err);
}
