// Grouped routed experts. Gather and scatter-add are the embedding ops (a row gather by int32 ids and its
// ordered scatter-add), the GEMMs and SwiGLU are ops too; only the dispatch sort and the per-row
// combine-weight scaling and dots are plain loops here. Each token receives its k expert outputs in
// sorted-position order (expert id, then slot), so the routed sum is the same for any thread count.
#include "moe/experts.h"

#include <omp.h>
#include <string.h>

#define EXPERTS_PAR_MIN 32768

static df_tensor mat(const float *p, df_device dev, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, dev, 2, (const int64_t[]){rows, cols});
}

// Expert e's (out, in) slice of a stacked (E, out, in) weight.
static df_tensor expert_slice(const df_tensor *w, int64_t e) {
  const int64_t out = w->shape[1], in = w->shape[2];
  return mat((float *)w->data + e * out * in, w->device, out, in);
}

void df_moe_slots_plan(const df_moe_experts_spec *s, int64_t T, const int32_t *indices, const int32_t *counts,
                       df_moe_slots *d) {
  const int64_t E = s->E, k = s->k, Tk = T * k;
  int32_t *off = d->offsets;
  d->T = T;
  off[0] = 0;
  for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
  // Counting sort, stable: slots fill their expert's segment in increasing slot order, with off[e] as the
  // cursor; afterwards off[e] = start of e + 1, so one shift restores the starts.
  for (int64_t i = 0; i < Tk; i++) {
    const int32_t pos = off[indices[i]]++;
    d->slot[pos] = (int32_t)i;
    d->token[pos] = (int32_t)(i / k);
  }
  for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];
  off[0] = 0;
}

int64_t df_moe_experts_forward_scratch_elems(const df_moe_experts_spec *s, int64_t T) {
  const int64_t Tk = T * s->k;
  return Tk * s->H + Tk * s->I; // rows (then expert outputs) (Tk, H); activations (Tk, I)
}

int64_t df_moe_experts_backward_scratch_elems(const df_moe_experts_spec *s, int64_t T) {
  const int64_t Tk = T * s->k;
  return 2 * Tk * s->H + 3 * Tk * s->I; // rows, d(outputs) then d(rows) (Tk, H); act, d(act), d(up) (Tk, I)
}

// h[pos] *= w[slot[pos]] over (Tk, I) rows.
static void scale_rows(df_ctx *ctx, float *h, const float *w, const int32_t *slot, int64_t Tk, int64_t I) {
#pragma omp parallel for num_threads(df_ctx_num_threads(ctx)) if (Tk * I > EXPERTS_PAR_MIN) schedule(static)
  for (int64_t p = 0; p < Tk; p++) {
    const float c = w[slot[p]];
    for (int64_t i = 0; i < I; i++) h[p * I + i] *= c;
  }
}

static df_status check_cpu(const df_tensor *x, df_error *err) {
  if (x->device == DF_DEV_CUDA) // the dispatch loops over host-backed memory (CPU, the fake test device)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "experts", "run the MoE FFN on a CPU context for now",
                   "the grouped experts' dispatch runs on host memory only");
  return DF_OK;
}

// Everything one expert's GEMMs need: the slot plan and the sorted-row buffers of one pass.
typedef struct {
  const df_moe_experts_spec *s;
  const df_moe_experts_params *p;
  const df_moe_slots *d;
  df_device dev;
  float *rows;  // (Tk, H) gathered x rows; forward: then the expert outputs
  float *drows; // (Tk, H) backward: gathered dy rows, then d(rows)
  float *act;   // (Tk, I) forward: scaled activations; backward: unscaled, then d(gate)
  float *dact;  // (Tk, I) backward: scaled activations, then d(act)
  float *dup;   // (Tk, I) backward: d(up)
} expert_job;

// One expert's part of a pass, on its segment [o, o + n) of the sorted positions.
typedef df_status (*expert_step)(df_ctx *ctx, const expert_job *j, int64_t e, int64_t o, int64_t n, df_error *err);

// Runs step on every non-empty segment, the experts spread over the GEMM thread budget (the OpenMP default
// team, which is also what OpenBLAS would use for one GEMM). Inside the parallel region each GEMM runs on its
// calling thread (the OpenMP OpenBLAS), which beats threading each small GEMM; with a budget of one thread
// there is no region and OpenBLAS runs single-threaded too. Either way every segment's GEMMs run
// single-threaded, so the results are bitwise independent of thread counts; segments are disjoint, so the
// schedule does not matter. The error reported is the one of the lowest failing expert id.
static df_status for_each_expert(df_ctx *ctx, const expert_job *j, expert_step step, df_error *err) {
  const int64_t E = j->s->E;
  const int team = omp_get_max_threads();
  int64_t bad = E;
  df_error first = {0};
#pragma omp parallel for num_threads(team) if (team > 1) schedule(dynamic, 1)
  for (int64_t e = 0; e < E; e++) {
    const int64_t o = j->d->offsets[e], n = j->d->offsets[e + 1] - o;
    df_error mine = {0};
    if (n == 0 || step(ctx, j, e, o, n, &mine) == DF_OK) continue;
#pragma omp critical(df_moe_expert_error)
    if (e < bad) {
      bad = e;
      first = mine;
    }
  }
  if (bad == E) return DF_OK;
  if (err) *err = first;
  return first.status;
}

// gate = x_e·w1[e]ᵀ, up = x_e·w3[e]ᵀ.
static df_status up_forward(df_ctx *ctx, const expert_job *j, int64_t e, int64_t o, int64_t n, df_error *err) {
  const int64_t H = j->s->H, I = j->s->I;
  df_tensor xe = mat(j->rows + o * H, j->dev, n, H);
  df_tensor ge = mat(j->d->gate + o * I, j->dev, n, I), ue = mat(j->d->up + o * I, j->dev, n, I);
  df_tensor w1 = expert_slice(&j->p->w1, e), w3 = expert_slice(&j->p->w3, e);
  DF_TRY(df_linear_forward(ctx, &xe, &w1, NULL, &ge, err));
  return df_linear_forward(ctx, &xe, &w3, NULL, &ue, err);
}

// out_e = h_e·w2[e]ᵀ (h already scaled by the combine weights).
static df_status down_forward(df_ctx *ctx, const expert_job *j, int64_t e, int64_t o, int64_t n, df_error *err) {
  const int64_t H = j->s->H, I = j->s->I;
  df_tensor he = mat(j->act + o * I, j->dev, n, I), ye = mat(j->rows + o * H, j->dev, n, H);
  df_tensor w2 = expert_slice(&j->p->w2, e);
  return df_linear_forward(ctx, &he, &w2, NULL, &ye, err);
}

// dw2[e] += dy_eᵀ·h_e, then dh_e = dy_e·w2[e] overwrites h_e.
static df_status down_backward(df_ctx *ctx, const expert_job *j, int64_t e, int64_t o, int64_t n, df_error *err) {
  const int64_t H = j->s->H, I = j->s->I;
  df_tensor dye = mat(j->drows + o * H, j->dev, n, H), he = mat(j->dact + o * I, j->dev, n, I);
  df_tensor w2 = expert_slice(&j->p->w2, e);
  if (!j->p->frozen) {
    df_tensor g2 = expert_slice(&j->p->g2, e);
    DF_TRY(df_linear_backward(ctx, &dye, &he, &w2, NULL, false, &g2, NULL, err));
  }
  return df_matmul(ctx, &dye, false, &w2, false, 1.0f, 0.0f, &he, err);
}

// d(rows)_e = dgate_e·w1[e] + dup_e·w3[e] (into the dead dy rows); dw1[e], dw3[e] += ...ᵀ·x_e.
static df_status up_backward(df_ctx *ctx, const expert_job *j, int64_t e, int64_t o, int64_t n, df_error *err) {
  const int64_t H = j->s->H, I = j->s->I;
  df_tensor xe = mat(j->rows + o * H, j->dev, n, H), dxe = mat(j->drows + o * H, j->dev, n, H);
  df_tensor dge = mat(j->act + o * I, j->dev, n, I), due = mat(j->dup + o * I, j->dev, n, I);
  df_tensor w1 = expert_slice(&j->p->w1, e), w3 = expert_slice(&j->p->w3, e);
  df_tensor g1 = expert_slice(&j->p->g1, e), g3 = expert_slice(&j->p->g3, e);
  const bool fr = j->p->frozen;
  DF_TRY(df_linear_backward(ctx, &dge, &xe, &w1, &dxe, false, fr ? NULL : &g1, NULL, err));
  return df_linear_backward(ctx, &due, &xe, &w3, &dxe, true, fr ? NULL : &g3, NULL, err);
}

df_status df_moe_experts_forward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                 const df_tensor *x, const int32_t *indices, const float *weights,
                                 const int32_t *counts, df_moe_slots *d, float *scratch, df_tensor *y, df_error *err) {
  DF_TRY(check_cpu(x, err));
  const df_device dev = x->device;
  const int64_t H = s->H, I = s->I, T = df_numel(x) / H, Tk = T * s->k;
  memset(y->data, 0, sizeof(float) * (size_t)(T * H));
  df_moe_slots_plan(s, T, indices, counts, d);
  if (Tk == 0) return DF_OK;
  const expert_job j = {.s = s, .p = p, .d = d, .dev = dev, .rows = scratch, .act = scratch + Tk * H};
  df_tensor x2 = mat(x->data, dev, T, H), xs = mat(j.rows, dev, Tk, H);
  df_tensor tok = df_view(d->token, DF_I32, dev, 1, (const int64_t[]){Tk});
  DF_TRY(df_embedding_forward(ctx, &x2, &tok, &xs, err));
  DF_TRY(for_each_expert(ctx, &j, up_forward, err));
  df_tensor g = mat(d->gate, dev, Tk, I), u = mat(d->up, dev, Tk, I), h = mat(j.act, dev, Tk, I);
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &h, err));
  scale_rows(ctx, j.act, weights, d->slot, Tk, I);     // the combine weight, before the down projection
  DF_TRY(for_each_expert(ctx, &j, down_forward, err)); // expert outputs replace the gathered rows
  df_tensor ys = mat(j.rows, dev, Tk, H), y2 = mat(y->data, dev, T, H);
  return df_embedding_backward(ctx, &ys, &tok, &y2, err);
}

df_status df_moe_experts_backward(df_ctx *ctx, const df_moe_experts_spec *s, const df_moe_experts_params *p,
                                  const df_tensor *x, const df_tensor *dy, const float *weights, const df_moe_slots *d,
                                  float *scratch, float *dweights, df_tensor *dx, df_error *err) {
  DF_TRY(check_cpu(x, err));
  const df_device dev = x->device;
  const int64_t H = s->H, I = s->I, T = d->T, Tk = T * s->k;
  if (Tk == 0) return DF_OK;
  expert_job j = {.s = s, .p = p, .d = d, .dev = dev, .rows = scratch, .drows = scratch + Tk * H};
  j.act = j.drows + Tk * H, j.dact = j.act + Tk * I, j.dup = j.dact + Tk * I;
  df_tensor tok = df_view(d->token, DF_I32, dev, 1, (const int64_t[]){Tk});
  df_tensor x2 = mat(x->data, dev, T, H), dy2 = mat(dy->data, dev, T, H);
  df_tensor xs = mat(j.rows, dev, Tk, H), dys = mat(j.drows, dev, Tk, H);
  DF_TRY(df_embedding_forward(ctx, &x2, &tok, &xs, err));
  DF_TRY(df_embedding_forward(ctx, &dy2, &tok, &dys, err));
  df_tensor g = mat(d->gate, dev, Tk, I), u = mat(d->up, dev, Tk, I), a = mat(j.act, dev, Tk, I);
  DF_TRY(df_swiglu_forward(ctx, &g, &u, s->swiglu_limit, &a, err)); // unscaled activations
  memcpy(j.dact, j.act, sizeof(float) * (size_t)(Tk * I));
  scale_rows(ctx, j.dact, weights, d->slot, Tk, I); // h = w·a, the down projection's input
  DF_TRY(for_each_expert(ctx, &j, down_backward, err));
  // h = w·a: ∂w = dh·a (the dot with the unscaled activation), ∂a = w·dh.
#pragma omp parallel for num_threads(df_ctx_num_threads(ctx)) if (Tk * I > EXPERTS_PAR_MIN) schedule(static)
  for (int64_t q = 0; q < Tk; q++) {
    const float *ar = j.act + q * I;
    float *dr = j.dact + q * I;
    double dot = 0.0;
    for (int64_t i = 0; i < I; i++) dot += (double)dr[i] * ar[i];
    dweights[d->slot[q]] = (float)dot;
    const float c = weights[d->slot[q]];
    for (int64_t i = 0; i < I; i++) dr[i] *= c;
  }
  df_tensor da = mat(j.dact, dev, Tk, I), dg = mat(j.act, dev, Tk, I), du = mat(j.dup, dev, Tk, I);
  DF_TRY(df_swiglu_backward(ctx, &da, &g, &u, s->swiglu_limit, &dg, &du, err));
  DF_TRY(for_each_expert(ctx, &j, up_backward, err)); // d(rows) replace the gathered dy rows
  df_tensor dx2 = mat(dx->data, dev, T, H);
  return df_embedding_backward(ctx, &dys, &tok, &dx2, err);
}
