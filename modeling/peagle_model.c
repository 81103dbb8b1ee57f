// The P-EAGLE draft (modeling/peagle_model.h): parameter entries in SpecForge's order, views into the draft model's
// flat buffers, the dense [depth, sample, position] forward of every layer (each depth's queries through the
// training-time-test attention over all of the layer's keys), the backward in reverse layer order, and the causal
// decode of parallel drafting.
#include "modeling/peagle_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/causal_attn.h"
#include "kernels/eagle3.h"
#include "modeling/model_util.h"

typedef df_pview pview;

// One decoder layer's weights; hidden_norm only in layer 0.
typedef struct {
  pview in_norm, hidden_norm, q, k, v, o, post_norm, gate, up, down;
  int64_t win;        // q/k/v input width: 2H in layer 0, H after
  df_llama_tail tail; // o_proj, the residual, the MLP (modeling/model_util.h)
} layer_w;

// One layer's activations over the Rt = T·R rows (storage dtype, statistics fp32).
typedef struct {
  float *x;               // (Rt, win) the q/k/v input
  float *rstd_a, *rstd_b; // (Rt) input_layernorm, and layer 0's hidden_norm
  float *q;               // (Rt, qd) rotated
  float *kc, *vc;         // (Rt, kvd) fp32 rotated keys and values: the attention island's cache, depth-major
  float *lse;             // (Rt·nH)
  df_llama_tail_acts t;   // attn (Rt, qd), h_mid, y, g, u, a, h_out (storage dtype), rstd_p
} layer_acts;

struct df_peagle_model {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_device dev;
  const df_params *params;
  float *weights;
  int64_t L, H, Ht, nH, nKV, hd, qd, kvd, I, D, V;
  float eps, mscale;
  bool nbr;        // norm_before_residual
  df_dtype dt;     // storage dtype of the activations (the weight views')
  size_t es;       // its element size
  float *inv_freq; // (hd/2) on the device
  pview embed, fc, mask_hidden, norm, lm_head;
  layer_w *lw; // [L]
  // the micro-batch
  df_peagle_batch b;
  int64_t R, Rt;
  void *arena;
  size_t arena_cap, arena_used;
  int32_t *zeros;      // (Rt) 0: broadcasts and sums of the mask rows through the embedding ops
  float *emb;          // (Rt, H) embed_tokens(ids)
  float *h0;           // (Rt, H) fc(aux) on depth 0, fc(mask_hidden) on the mask rows
  float *hn;           // (Rt, H) layer 0's hidden_norm(h0)
  float *hm;           // (1, H) fc(mask_hidden)
  float *out, *rstd_o; // (Rt, H) norm(h_L), (Rt)
  layer_acts *acts;    // [L]
  // backward scratch
  float *dh, *dtmp, *dy, *dg, *du, *da, *dattn, *dq, *dx, *dk, *dv, *dkc, *dvc, *dsum, *dsum_s, *dmh, *dmh32;
  // mixed precision only: the attention island's fp32 staging and the k / v rows in the storage dtype
  float *q32, *o32, *do32, *dq32, *ks, *vs;
  bool have_forward;
};

// ---- parameters ----------------------------------------------------------------------------------------------

static df_status add_layer(const df_draft_config *cfg, int i, df_params *p, df_error *err) {
  const int64_t H = cfg->hidden_size, hd = cfg->head_dim, I = cfg->intermediate_size;
  const int64_t qd = cfg->num_attention_heads * hd, kvd = cfg->num_key_value_heads * hd, win = i == 0 ? 2 * H : H;
  char n[96];
#define NAME(s) (snprintf(n, sizeof n, "layers.%d.%s", i, s), n)
  DF_TRY(df_params_add_f32(p, NAME("input_layernorm.weight"), DF_ROLE_NORM, 1, H, 0, err));
  if (i == 0) DF_TRY(df_params_add_f32(p, NAME("hidden_norm.weight"), DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, NAME("self_attn.q_proj.weight"), DF_ROLE_WEIGHT, 2, qd, win, err));
  DF_TRY(df_params_add_f32(p, NAME("self_attn.k_proj.weight"), DF_ROLE_WEIGHT, 2, kvd, win, err));
  DF_TRY(df_params_add_f32(p, NAME("self_attn.v_proj.weight"), DF_ROLE_WEIGHT, 2, kvd, win, err));
  DF_TRY(df_params_add_f32(p, NAME("self_attn.o_proj.weight"), DF_ROLE_WEIGHT, 2, H, qd, err));
  DF_TRY(df_params_add_f32(p, NAME("post_attention_layernorm.weight"), DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, NAME("mlp.gate_proj.weight"), DF_ROLE_WEIGHT, 2, I, H, err));
  DF_TRY(df_params_add_f32(p, NAME("mlp.up_proj.weight"), DF_ROLE_WEIGHT, 2, I, H, err));
  DF_TRY(df_params_add_f32(p, NAME("mlp.down_proj.weight"), DF_ROLE_WEIGHT, 2, H, I, err));
#undef NAME
  return DF_OK;
}

df_status df_peagle_add_params(const df_draft_config *cfg, df_params *p, df_error *err) {
  const int64_t H = cfg->hidden_size, W = 3 * cfg->eagle3.target_hidden_size;
  DF_TRY(df_params_add_f32(p, "embed_tokens.weight", DF_ROLE_EMBED, 2, cfg->vocab_size, H, err));
  DF_TRY(df_params_add_f32(p, "fc.weight", DF_ROLE_WEIGHT, 2, H, W, err));
  const int64_t mshape[3] = {1, 1, W};
  const df_param_spec ms = {.name = "mask_hidden",
                            .role = DF_ROLE_WEIGHT,
                            .ndim = 3,
                            .shape = mshape,
                            .dtype = DF_F32,
                            .trainable = true,
                            .weight_decay = true};
  DF_TRY(df_params_add(p, &ms, err));
  for (int i = 0; i < cfg->num_hidden_layers; i++) DF_TRY(add_layer(cfg, i, p, err));
  DF_TRY(df_params_add_f32(p, "norm.weight", DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, "lm_head.weight", DF_ROLE_WEIGHT, 2, cfg->eagle3.draft_vocab_size, H, err));
  DF_TRY(df_params_add_buffer(p, "t2d", DF_BOOL, cfg->vocab_size, err));
  return df_params_add_buffer(p, "d2t", DF_I64, cfg->eagle3.draft_vocab_size, err);
}

double df_peagle_init_std(const df_draft_config *cfg, const char *name) {
  return cfg->kind == DF_DRAFT_PEAGLE && !strcmp(name, "mask_hidden") ? 1.0 : 0.0;
}

static df_status bind(df_peagle_model *m, float *grads, const char *name, pview *v, df_error *err) {
  return df_params_bind(m->params, name, m->weights, grads, m->dev, &v->w, &v->g, err);
}

static df_status bind_all(df_peagle_model *m, float *grads, df_error *err) {
  DF_TRY(bind(m, grads, "embed_tokens.weight", &m->embed, err));
  DF_TRY(bind(m, grads, "fc.weight", &m->fc, err));
  DF_TRY(bind(m, grads, "mask_hidden", &m->mask_hidden, err));
  DF_TRY(bind(m, grads, "norm.weight", &m->norm, err));
  DF_TRY(bind(m, grads, "lm_head.weight", &m->lm_head, err));
  for (int i = 0; i < m->L; i++) {
    layer_w *w = &m->lw[i];
    w->win = i == 0 ? 2 * m->H : m->H;
    const char *names[] = {"input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                           "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                           "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
                           "hidden_norm.weight"};
    pview *views[] = {&w->in_norm,   &w->q,    &w->k,  &w->v,    &w->o,
                      &w->post_norm, &w->gate, &w->up, &w->down, &w->hidden_norm};
    for (int j = 0; j < (i == 0 ? 10 : 9); j++) {
      char n[96];
      snprintf(n, sizeof n, "layers.%d.%s", i, names[j]);
      DF_TRY(bind(m, grads, n, views[j], err));
    }
  }
  if (!df_params_find(m->params, "t2d") || !df_params_find(m->params, "d2t"))
    return DF_FAIL(err, DF_ERR_INVALID, "t2d", NULL, "the P-EAGLE vocabulary buffers are missing");
  return DF_OK;
}

df_status df_peagle_model_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_peagle_model **out, df_error *err) {
  *out = NULL;
  df_peagle_model *m = calloc(1, sizeof *m);
  if (!m) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate the P-EAGLE model");
  m->cfg = cfg, m->ctx = ctx, m->dev = df_ctx_device(ctx), m->params = p, m->weights = weights;
  m->L = cfg->num_hidden_layers, m->H = cfg->hidden_size, m->Ht = cfg->eagle3.target_hidden_size;
  m->nH = cfg->num_attention_heads, m->nKV = cfg->num_key_value_heads, m->hd = cfg->head_dim;
  m->qd = m->nH * m->hd, m->kvd = m->nKV * m->hd, m->I = cfg->intermediate_size;
  m->D = cfg->eagle3.draft_vocab_size, m->V = cfg->vocab_size, m->eps = (float)cfg->rms_norm_eps;
  m->nbr = cfg->eagle3.norm_before_residual;
  m->lw = calloc((size_t)m->L, sizeof *m->lw);
  df_status st = m->lw ? bind_all(m, grads, err) : DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "out of memory");
  if (st == DF_OK) m->dt = m->fc.w.dtype, m->es = df_dtype_size(m->dt);
  for (int64_t l = 0; st == DF_OK && l < m->L; l++) {
    layer_w *w = &m->lw[l];
    w->tail = df_llama_tail_of(&w->o, &w->post_norm, &w->gate, &w->up, &w->down, m->H, m->I, m->qd, m->eps, m->dt);
  }
  if (st == DF_OK) st = df_rope_upload(&cfg->rope, m->hd, ctx, &m->inv_freq, &m->mscale, err);
  if (st != DF_OK) {
    df_peagle_model_free(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

void df_peagle_model_free(df_peagle_model *m) {
  if (!m) return;
  df_buffer_free(m->ctx, m->inv_freq);
  df_buffer_free(m->ctx, m->arena);
  free(m->acts);
  free(m->lw);
  free(m);
}

const df_draft_config *df_peagle_config(const df_peagle_model *m) { return m->cfg; }
df_dtype df_peagle_storage(const df_peagle_model *m) { return m->dt; }
int64_t df_peagle_activation_bytes(const df_peagle_model *m) { return (int64_t)m->arena_used; }
void df_peagle_lm_head(df_peagle_model *m, df_tensor *w, df_tensor *g) {
  if (w) *w = m->lm_head.w;
  if (g) *g = m->lm_head.g;
}
void df_peagle_embedding(df_peagle_model *m, df_tensor *w) { *w = m->embed.w; }

// ---- views -----------------------------------------------------------------------------------------------------

static df_tensor mat(const df_peagle_model *m, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, m->dt, m->dev, 2, (const int64_t[]){rows, cols});
}
static df_tensor fmat(const df_peagle_model *m, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, DF_F32, m->dev, 2, (const int64_t[]){rows, cols});
}
static df_tensor fvec(const df_peagle_model *m, const void *p, int64_t n) {
  return df_view((void *)p, DF_F32, m->dev, 1, (const int64_t[]){n});
}
static df_tensor ivec(const df_peagle_model *m, const int32_t *p, int64_t n) {
  return df_view((void *)p, DF_I32, m->dev, 1, (const int64_t[]){n});
}
// An activation's element offset as a pointer (storage dtype).
static float *at(const df_peagle_model *m, const float *p, int64_t elems) {
  return (float *)((char *)p + (size_t)elems * m->es);
}

// Copies cols columns between two row-major matrices of the storage dtype (strides in elements), or adds them.
static df_status cols_copy(const df_peagle_model *m, int64_t rows, int64_t cols, const float *src, int64_t s_off,
                           int64_t s_ld, float *dst, int64_t d_off, int64_t d_ld, bool add, df_error *err) {
  return df_cols_copy(m->ctx, m->dt, rows, cols, src, s_off, s_ld, dst, d_off, d_ld, add, err);
}

static df_status cast(df_peagle_model *m, df_dtype from, const void *src, df_dtype to, void *dst, int64_t n,
                      df_error *err) {
  df_tensor a = df_view((void *)src, from, m->dev, 1, (const int64_t[]){n}),
            b = df_view(dst, to, m->dev, 1, (const int64_t[]){n});
  return df_cast(m->ctx, &a, &b, err);
}

// ---- the activation arena -----------------------------------------------------------------------------------

typedef df_carver carver;

static float *carve_b(carver *c, size_t bytes) { return df_carve(c, bytes); }
static float *carve(carver *c, int64_t floats) { return carve_b(c, (size_t)floats * sizeof(float)); }
static float *carve_s(carver *c, const df_peagle_model *m, int64_t n) { return carve_b(c, (size_t)n * m->es); }

static void layout(carver *c, df_peagle_model *m) {
  const int64_t Rt = m->Rt, H = m->H, I = m->I, qd = m->qd, kvd = m->kvd;
  const bool mixed = m->dt != DF_F32;
  m->zeros = (int32_t *)carve(c, Rt);
  m->emb = carve_s(c, m, Rt * H), m->h0 = carve_s(c, m, Rt * H), m->hn = carve_s(c, m, Rt * H);
  m->hm = carve_s(c, m, H), m->out = carve_s(c, m, Rt * H), m->rstd_o = carve(c, Rt);
  for (int64_t l = 0; l < m->L; l++) {
    layer_acts *a = &m->acts[l];
    a->x = carve_s(c, m, Rt * m->lw[l].win), a->rstd_a = carve(c, Rt), a->rstd_b = carve(c, Rt);
    a->q = carve_s(c, m, Rt * qd), a->kc = carve(c, Rt * kvd), a->vc = carve(c, Rt * kvd);
    a->t.attn = carve_s(c, m, Rt * qd), a->lse = carve(c, Rt * m->nH);
    a->t.h_mid = carve_s(c, m, Rt * H), a->t.y = carve_s(c, m, Rt * H), a->t.rstd_p = carve(c, Rt);
    a->t.g = carve_s(c, m, Rt * I), a->t.u = carve_s(c, m, Rt * I), a->t.a = carve_s(c, m, Rt * I);
    a->t.h_out = carve_s(c, m, Rt * H);
  }
  m->dh = carve_s(c, m, Rt * H), m->dtmp = carve_s(c, m, Rt * H);
  m->dy = carve_s(c, m, Rt * H);
  m->dg = carve_s(c, m, Rt * I), m->du = carve_s(c, m, Rt * I), m->da = carve_s(c, m, Rt * I);
  m->dattn = carve_s(c, m, Rt * qd), m->dq = carve_s(c, m, Rt * qd), m->dx = carve_s(c, m, Rt * 2 * H);
  m->dk = carve_s(c, m, Rt * kvd), m->dv = carve_s(c, m, Rt * kvd);
  m->dkc = carve(c, Rt * kvd), m->dvc = carve(c, Rt * kvd); // fp32: summed over the later depths
  m->dsum = carve(c, H), m->dsum_s = carve_s(c, m, H), m->dmh = carve_s(c, m, 3 * m->Ht);
  m->dmh32 = carve(c, 3 * m->Ht);
  m->q32 = carve(c, mixed ? Rt * qd : 0), m->o32 = carve(c, mixed ? Rt * qd : 0);
  m->do32 = carve(c, mixed ? Rt * qd : 0), m->dq32 = carve(c, mixed ? Rt * qd : 0);
  m->ks = carve_s(c, m, mixed ? Rt * kvd : 0), m->vs = carve_s(c, m, mixed ? Rt * kvd : 0);
}

static df_status ensure_arena(df_peagle_model *m, df_error *err) {
  if (!m->acts && !(m->acts = calloc((size_t)m->L, sizeof *m->acts)))
    return DF_FAIL(err, DF_ERR_NOMEM, "draft", NULL, "out of memory");
  carver measure = {0};
  layout(&measure, m);
  if (measure.off > m->arena_cap) {
    df_buffer_free(m->ctx, m->arena);
    m->arena = NULL, m->arena_cap = 0;
    DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_ACTIVATIONS, measure.off, &m->arena, err));
    m->arena_cap = measure.off;
  }
  carver c = {.base = m->arena};
  layout(&c, m);
  m->arena_used = c.off;
  df_tensor z = ivec(m, m->zeros, m->Rt);
  return df_fill(m->ctx, &z, 0.0, err);
}

// ---- forward -----------------------------------------------------------------------------------------------------

// The 4-D views of the attention island (fp32): depth d's queries or outputs [B, S, nH, hd], the layer's whole key /
// value cache [T·B, S, nKV, hd].
static df_tensor heads4(const df_peagle_model *m, const float *p) {
  return df_view((void *)p, DF_F32, m->dev, 4, (const int64_t[]){m->b.B, m->b.S, m->nH, m->hd});
}
static df_tensor cache4(const df_peagle_model *m, const float *p) {
  return df_view((void *)p, DF_F32, m->dev, 4, (const int64_t[]){m->b.T * m->b.B, m->b.S, m->nKV, m->hd});
}

// h0: fc over the captured layers on depth 0; fc(mask_hidden) broadcast to every mask row.
static df_status input_forward(df_peagle_model *m, df_error *err) {
  const int64_t R = m->R, Rt = m->Rt, H = m->H, W = 3 * m->Ht;
  df_tensor tab = mat(m, m->embed.w.data, m->V, H), ids = ivec(m, m->b.ids, Rt), e = mat(m, m->emb, Rt, H);
  DF_TRY(df_embedding_forward(m->ctx, &tab, &ids, &e, err));
  df_tensor x = mat(m, m->b.aux, R, W), y = mat(m, m->h0, R, H);
  DF_TRY(df_linear_forward(m->ctx, &x, &m->fc.w, NULL, &y, err));
  if (Rt == R) return DF_OK;
  df_tensor mh = mat(m, m->mask_hidden.w.data, 1, W), hm = mat(m, m->hm, 1, H);
  DF_TRY(df_linear_forward(m->ctx, &mh, &m->fc.w, NULL, &hm, err));
  df_tensor z = ivec(m, m->zeros, Rt - R), rest = mat(m, at(m, m->h0, R * H), Rt - R, H);
  return df_embedding_forward(m->ctx, &hm, &z, &rest, err);
}

// Layer l over every row: the q/k/v input, the projections, RoPE, each depth's attention, o_proj, the MLP.
static df_status layer_forward(df_peagle_model *m, int64_t l, const float *h_in, df_error *err) {
  const int64_t Rt = m->Rt, H = m->H, win = m->lw[l].win;
  const layer_w *w = &m->lw[l];
  layer_acts *a = &m->acts[l];
  const float *res = h_in;
  df_tensor ra = fvec(m, a->rstd_a, Rt), rb = fvec(m, a->rstd_b, Rt);
  if (l == 0) { // [input_layernorm(emb) ; hidden_norm(h0)]
    df_tensor e = mat(m, m->emb, Rt, H), t = mat(m, m->dtmp, Rt, H), hi = mat(m, h_in, Rt, H),
              hn = mat(m, m->hn, Rt, H);
    DF_TRY(df_rmsnorm_forward(m->ctx, &e, &w->in_norm.w, m->eps, &t, &ra, err));
    DF_TRY(cols_copy(m, Rt, H, m->dtmp, 0, H, a->x, 0, 2 * H, false, err));
    DF_TRY(df_rmsnorm_forward(m->ctx, &hi, &w->hidden_norm.w, m->eps, &hn, &rb, err));
    DF_TRY(cols_copy(m, Rt, H, m->hn, 0, H, a->x, H, 2 * H, false, err));
    if (m->nbr) res = m->hn;
  } else {
    df_tensor hi = mat(m, h_in, Rt, H), x = mat(m, a->x, Rt, H);
    DF_TRY(df_rmsnorm_forward(m->ctx, &hi, &w->in_norm.w, m->eps, &x, &ra, err));
  }
  const bool mixed = m->dt != DF_F32;
  float *k = mixed ? m->ks : a->kc, *v = mixed ? m->vs : a->vc;
  df_tensor x = mat(m, a->x, Rt, win), q = mat(m, a->q, Rt, m->qd), kk = mat(m, k, Rt, m->kvd),
            vv = mat(m, v, Rt, m->kvd);
  DF_TRY(df_linear_forward(m->ctx, &x, &w->q.w, NULL, &q, err));
  DF_TRY(df_linear_forward(m->ctx, &x, &w->k.w, NULL, &kk, err));
  DF_TRY(df_linear_forward(m->ctx, &x, &w->v.w, NULL, &vv, err));
  df_tensor q3 = df_view(a->q, m->dt, m->dev, 3, (const int64_t[]){Rt, m->nH, m->hd});
  df_tensor k3 = df_view(k, m->dt, m->dev, 3, (const int64_t[]){Rt, m->nKV, m->hd});
  df_tensor p = ivec(m, m->b.pos, Rt), inv = fvec(m, m->inv_freq, m->hd / 2);
  DF_TRY(df_rope_forward(m->ctx, &q3, &p, &inv, m->mscale, &q3, err));
  DF_TRY(df_rope_forward(m->ctx, &k3, &p, &inv, m->mscale, &k3, err));
  if (mixed) { // into the fp32 island
    DF_TRY(cast(m, m->dt, m->ks, DF_F32, a->kc, Rt * m->kvd, err));
    DF_TRY(cast(m, m->dt, m->vs, DF_F32, a->vc, Rt * m->kvd, err));
    DF_TRY(cast(m, m->dt, a->q, DF_F32, m->q32, Rt * m->qd, err));
  }
  df_tensor kc = cache4(m, a->kc), vc = cache4(m, a->vc), len = ivec(m, m->b.lengths, m->b.B);
  const float *qs = mixed ? m->q32 : a->q;
  float *os = mixed ? m->o32 : a->t.attn;
  for (int64_t d = 0; d < m->b.T; d++) {
    const df_ttt_attn_desc desc = {.step = d, .scale = (float)(1.0 / sqrt((double)m->hd))};
    df_tensor qd4 = heads4(m, qs + d * m->R * m->qd), od4 = heads4(m, os + d * m->R * m->qd);
    df_tensor lse = fvec(m, a->lse + d * m->R * m->nH, m->R * m->nH);
    DF_TRY(df_ttt_attn_forward(m->ctx, &desc, &qd4, &kc, &vc, &len, &od4, &lse, err));
  }
  if (mixed) DF_TRY(cast(m, DF_F32, m->o32, m->dt, a->t.attn, Rt * m->qd, err));
  return df_llama_tail_forward(m->ctx, &w->tail, Rt, res, &a->t, err);
}

df_status df_peagle_forward(df_peagle_model *m, const df_peagle_batch *b, const float **out, df_error *err) {
  if (!b || b->B < 1 || b->S < 1 || b->T < 1 || !b->aux || !b->ids || !b->pos || !b->lengths)
    return DF_FAIL(err, DF_ERR_INVALID, "batch", "fill every df_peagle_batch field", "incomplete P-EAGLE batch");
  m->b = *b, m->R = b->B * b->S, m->Rt = b->T * m->R, m->have_forward = false;
  DF_TRY(ensure_arena(m, err));
  DF_TRY(input_forward(m, err));
  for (int64_t l = 0; l < m->L; l++) DF_TRY(layer_forward(m, l, l == 0 ? m->h0 : m->acts[l - 1].t.h_out, err));
  df_tensor h = mat(m, m->acts[m->L - 1].t.h_out, m->Rt, m->H), o = mat(m, m->out, m->Rt, m->H);
  df_tensor ro = fvec(m, m->rstd_o, m->Rt);
  DF_TRY(df_rmsnorm_forward(m->ctx, &h, &m->norm.w, m->eps, &o, &ro, err));
  m->have_forward = true;
  *out = m->out;
  return DF_OK;
}

// ---- backward ----------------------------------------------------------------------------------------------------

// Layer l: m->dh holds ∂loss/∂h_out on entry and ∂loss/∂h_in on return.
static df_status layer_backward(df_peagle_model *m, int64_t l, const float *h_in, df_error *err) {
  const int64_t Rt = m->Rt, H = m->H, win = m->lw[l].win, kvd = m->kvd;
  layer_w *w = &m->lw[l];
  const layer_acts *a = &m->acts[l];
  df_ctx *ctx = m->ctx;
  // the MLP and o_proj: dh becomes ∂/∂h_mid, dattn ∂/∂attn
  DF_TRY(df_llama_tail_backward(ctx, &w->tail, Rt, &a->t, m->dh, m->dattn, m->da, m->dg, m->du, m->dy, err));
  df_tensor dh = mat(m, m->dh, Rt, H);
  // the attention, depth by depth; the key / value gradients sum over every depth that read them
  const bool mixed = m->dt != DF_F32;
  if (mixed) {
    DF_TRY(cast(m, m->dt, a->q, DF_F32, m->q32, Rt * m->qd, err));
    DF_TRY(cast(m, m->dt, a->t.attn, DF_F32, m->o32, Rt * m->qd, err));
    DF_TRY(cast(m, m->dt, m->dattn, DF_F32, m->do32, Rt * m->qd, err));
  }
  df_tensor dkc = fvec(m, m->dkc, Rt * kvd), dvc = fvec(m, m->dvc, Rt * kvd);
  DF_TRY(df_fill(ctx, &dkc, 0.0, err));
  DF_TRY(df_fill(ctx, &dvc, 0.0, err));
  df_tensor kc = cache4(m, a->kc), vc = cache4(m, a->vc), len = ivec(m, m->b.lengths, m->b.B);
  dkc = cache4(m, m->dkc), dvc = cache4(m, m->dvc);
  const float *qs = mixed ? m->q32 : a->q, *os = mixed ? m->o32 : a->t.attn, *dos = mixed ? m->do32 : m->dattn;
  float *dqs = mixed ? m->dq32 : m->dq;
  for (int64_t d = m->b.T - 1; d >= 0; d--) {
    const int64_t off = d * m->R * m->qd;
    const df_ttt_attn_desc desc = {.step = d, .scale = (float)(1.0 / sqrt((double)m->hd))};
    df_tensor q4 = heads4(m, qs + off), o4 = heads4(m, os + off), do4 = heads4(m, dos + off),
              dq4 = heads4(m, dqs + off);
    df_tensor lse = fvec(m, a->lse + d * m->R * m->nH, m->R * m->nH);
    DF_TRY(df_ttt_attn_backward(ctx, &desc, &q4, &kc, &vc, &len, &o4, &lse, &do4, &dq4, &dkc, &dvc, err));
  }
  float *dk = m->dkc, *dv = m->dvc;
  if (mixed) { // out of the island
    DF_TRY(cast(m, DF_F32, m->dq32, m->dt, m->dq, Rt * m->qd, err));
    DF_TRY(cast(m, DF_F32, m->dkc, m->dt, m->dk, Rt * kvd, err));
    DF_TRY(cast(m, DF_F32, m->dvc, m->dt, m->dv, Rt * kvd, err));
    dk = m->dk, dv = m->dv;
  }
  df_tensor p = ivec(m, m->b.pos, Rt), inv = fvec(m, m->inv_freq, m->hd / 2);
  df_tensor dq3 = df_view(m->dq, m->dt, m->dev, 3, (const int64_t[]){Rt, m->nH, m->hd});
  df_tensor dk3 = df_view(dk, m->dt, m->dev, 3, (const int64_t[]){Rt, m->nKV, m->hd});
  DF_TRY(df_rope_backward(ctx, &dq3, &p, &inv, m->mscale, &dq3, err));
  DF_TRY(df_rope_backward(ctx, &dk3, &p, &inv, m->mscale, &dk3, err));
  df_tensor x = mat(m, a->x, Rt, win), dx = mat(m, m->dx, Rt, win);
  df_tensor dq = mat(m, m->dq, Rt, m->qd), dkk = mat(m, dk, Rt, kvd), dvv = mat(m, dv, Rt, kvd);
  DF_TRY(df_linear_backward(ctx, &dq, &x, &w->q.w, &dx, false, &w->q.g, NULL, err));
  DF_TRY(df_linear_backward(ctx, &dkk, &x, &w->k.w, &dx, true, &w->k.g, NULL, err));
  DF_TRY(df_linear_backward(ctx, &dvv, &x, &w->v.w, &dx, true, &w->v.g, NULL, err));
  df_tensor ra = fvec(m, a->rstd_a, Rt), rb = fvec(m, a->rstd_b, Rt);
  if (l > 0) { // the residual plus input_layernorm's input gradient
    df_tensor hi = mat(m, h_in, Rt, H);
    return df_rmsnorm_backward(ctx, &dx, &hi, &w->in_norm.w, &ra, &dh, true, &w->in_norm.g, err);
  }
  // layer 0: input_layernorm(emb) into the trained embedding, hidden_norm(h0) into dh (∂/∂h0)
  df_tensor t = mat(m, m->dtmp, Rt, H), e = mat(m, m->emb, Rt, H), de = mat(m, m->dy, Rt, H);
  DF_TRY(cols_copy(m, Rt, H, m->dx, 0, 2 * H, m->dtmp, 0, H, false, err));
  DF_TRY(df_rmsnorm_backward(ctx, &t, &e, &w->in_norm.w, &ra, &de, false, &w->in_norm.g, err));
  df_tensor ids = ivec(m, m->b.ids, Rt);
  DF_TRY(df_embedding_backward(ctx, &de, &ids, &m->embed.g, err));
  const int64_t pad = m->cfg->eagle3.pad_token_id;
  if (pad >= 0) { // nn.Embedding's padding row takes no gradient
    df_tensor row = fvec(m, (float *)m->embed.g.data + pad * H, H);
    DF_TRY(df_fill(ctx, &row, 0.0, err));
  }
  DF_TRY(cols_copy(m, Rt, H, m->dx, H, 2 * H, m->dtmp, 0, H, false, err));
  if (m->nbr) { // the residual read hidden_norm(h0): its gradient joins the norm's output gradient
    df_tensor dr = mat(m, m->dh, Rt, H);
    DF_TRY(df_axpy(ctx, 1.0f, &dr, &t, err));
  }
  df_tensor hi = mat(m, h_in, Rt, H);
  return df_rmsnorm_backward(ctx, &t, &hi, &w->hidden_norm.w, &rb, &dh, !m->nbr, &w->hidden_norm.g, err);
}

// dh (∂/∂h0) into fc and mask_hidden: depth 0 through fc's weight; the mask rows' sum through fc(mask_hidden).
static df_status input_backward(df_peagle_model *m, df_error *err) {
  const int64_t R = m->R, Rt = m->Rt, H = m->H, W = 3 * m->Ht;
  df_ctx *ctx = m->ctx;
  df_tensor dy = mat(m, m->dh, R, H), x = mat(m, m->b.aux, R, W);
  DF_TRY(df_linear_backward(ctx, &dy, &x, &m->fc.w, NULL, false, &m->fc.g, NULL, err));
  if (Rt == R) return DF_OK;
  df_tensor s = fmat(m, m->dsum, 1, H), z = ivec(m, m->zeros, Rt - R), rest = mat(m, at(m, m->dh, R * H), Rt - R, H);
  DF_TRY(df_fill(ctx, &s, 0.0, err));
  DF_TRY(df_embedding_backward(ctx, &rest, &z, &s, err)); // Σ over the mask rows, fp32
  const float *ds = m->dsum;
  if (m->dt != DF_F32) {
    DF_TRY(cast(m, DF_F32, m->dsum, m->dt, m->dsum_s, H, err));
    ds = m->dsum_s;
  }
  df_tensor sd = mat(m, ds, 1, H), mh = mat(m, m->mask_hidden.w.data, 1, W), dmh = mat(m, m->dmh, 1, W);
  DF_TRY(df_linear_backward(ctx, &sd, &mh, &m->fc.w, &dmh, false, &m->fc.g, NULL, err));
  df_tensor dmh_f32 = fvec(m, m->dmh, W); // fp32 storage: dmh itself
  df_tensor g = fvec(m, m->mask_hidden.g.data, W), d = fvec(m, m->dmh32, W);
  if (m->dt != DF_F32) DF_TRY(cast(m, m->dt, m->dmh, DF_F32, m->dmh32, W, err));
  return df_axpy(ctx, 1.0f, m->dt == DF_F32 ? &dmh_f32 : &d, &g, err);
}

df_status df_peagle_backward(df_peagle_model *m, const float *d_out, df_error *err) {
  if (!m->have_forward)
    return DF_FAIL(err, DF_ERR_INVALID, "backward", "run df_peagle_forward first", "no forward to differentiate");
  const int64_t Rt = m->Rt, H = m->H;
  df_tensor dout = mat(m, d_out, Rt, H), dh = mat(m, m->dh, Rt, H), ro = fvec(m, m->rstd_o, Rt);
  df_tensor h = mat(m, m->acts[m->L - 1].t.h_out, Rt, H);
  DF_TRY(df_rmsnorm_backward(m->ctx, &dout, &h, &m->norm.w, &ro, &dh, false, &m->norm.g, err));
  for (int64_t l = m->L - 1; l >= 0; l--) DF_TRY(layer_backward(m, l, l == 0 ? m->h0 : m->acts[l - 1].t.h_out, err));
  m->have_forward = false;
  return input_backward(m, err);
}

// ---- decoding --------------------------------------------------------------------------------------------------

struct df_peagle_cache {
  df_peagle_model *m;
  int64_t cap;
  float **k, **v; // [L] (cap, kvd) each
  void *scratch;
  int64_t rows_cap;
  float *emb, *h0, *hn, *x, *q, *attn, *hmid, *y, *g, *u, *a, *h[2], *out, *rstd, *hm;
  int32_t *pos, *zeros, *hpos;
};

df_status df_peagle_cache_create(df_peagle_model *m, int64_t cap, df_peagle_cache **out, df_error *err) {
  *out = NULL;
  df_peagle_cache *c = calloc(1, sizeof *c);
  if (!c) return DF_FAIL(err, DF_ERR_NOMEM, "draft cache", NULL, "out of memory");
  c->m = m, c->cap = cap;
  c->k = calloc((size_t)m->L, sizeof *c->k), c->v = calloc((size_t)m->L, sizeof *c->v);
  df_status st = c->k && c->v ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "draft cache", NULL, "out of memory");
  const size_t bytes = sizeof(float) * (size_t)(cap * m->kvd);
  for (int64_t l = 0; st == DF_OK && l < m->L; l++) {
    st = df_buffer_alloc(m->ctx, bytes, (void **)&c->k[l], err);
    if (st == DF_OK) st = df_buffer_alloc(m->ctx, bytes, (void **)&c->v[l], err);
  }
  if (st != DF_OK) {
    df_peagle_cache_free(c);
    return st;
  }
  *out = c;
  return DF_OK;
}

void df_peagle_cache_free(df_peagle_cache *c) {
  if (!c) return;
  for (int64_t l = 0; l < c->m->L && c->k && c->v; l++)
    df_buffer_free(c->m->ctx, c->k[l]), df_buffer_free(c->m->ctx, c->v[l]);
  free(c->k), free(c->v);
  df_buffer_free(c->m->ctx, c->scratch);
  free(c->hpos);
  free(c);
}

static df_status cache_rows(df_peagle_cache *c, int64_t n, df_error *err) {
  if (n <= c->rows_cap) return DF_OK;
  df_peagle_model *m = c->m;
  const int64_t H = m->H, I = m->I;
  df_carver meas = {0}, cv;
  for (int pass = 0; pass < 2; pass++) {
    df_carver *k = pass ? &cv : &meas;
    c->emb = carve(k, n * H), c->h0 = carve(k, n * H), c->hn = carve(k, n * H), c->x = carve(k, n * 2 * H);
    c->q = carve(k, n * m->qd), c->attn = carve(k, n * m->qd), c->hmid = carve(k, n * H), c->y = carve(k, n * H);
    c->g = carve(k, n * I), c->u = carve(k, n * I), c->a = carve(k, n * I);
    c->h[0] = carve(k, n * H), c->h[1] = carve(k, n * H), c->out = carve(k, n * H), c->rstd = carve(k, 2 * n);
    c->hm = carve(k, H), c->pos = (int32_t *)carve(k, n), c->zeros = (int32_t *)carve(k, n);
    if (pass) break;
    df_buffer_free(m->ctx, c->scratch);
    c->scratch = NULL;
    DF_TRY(df_buffer_alloc(m->ctx, meas.off, &c->scratch, err));
    cv = (df_carver){.base = c->scratch};
  }
  free(c->hpos);
  if (!(c->hpos = malloc(sizeof(int32_t) * (size_t)n))) return DF_FAIL(err, DF_ERR_NOMEM, "draft cache", NULL, "oom");
  c->rows_cap = n;
  df_tensor z = df_view(c->zeros, DF_I32, m->dev, 1, (const int64_t[]){n});
  return df_fill(m->ctx, &z, 0.0, err);
}

df_status df_peagle_decode(df_peagle_model *m, df_peagle_cache *c, int64_t start, int64_t n, int64_t n0,
                           const float *aux, const int32_t *ids, const float **out, df_error *err) {
  if (n < 1 || n0 < 0 || n0 > n || start < 0 || start + n > c->cap)
    return DF_FAIL(err, DF_ERR_INVALID, "draft cache", "grow the cache", "rows %lld .. %lld outside the cache's %lld",
                   (long long)start, (long long)(start + n), (long long)c->cap);
  if (m->dt != DF_F32)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "model.torch_dtype", "decode with an fp32 draft (eval builds one)",
                   "the P-EAGLE decode runs on fp32 storage, this draft stores %s", df_dtype_name(m->dt));
  DF_TRY(cache_rows(c, n, err));
  df_ctx *ctx = m->ctx;
  const int64_t H = m->H, W = 3 * m->Ht;
  for (int64_t r = 0; r < n; r++) c->hpos[r] = (int32_t)(start + r);
  DF_TRY(df_copy(ctx, c->pos, m->dev, c->hpos, DF_DEV_CPU, sizeof(int32_t) * (size_t)n, err));
  df_tensor tab = fmat(m, m->embed.w.data, m->V, H), idv = ivec(m, ids, n), e = fmat(m, c->emb, n, H);
  DF_TRY(df_embedding_forward(ctx, &tab, &idv, &e, err));
  if (n0 > 0) {
    df_tensor x = fmat(m, aux, n0, W), y = fmat(m, c->h0, n0, H);
    DF_TRY(df_linear_forward(ctx, &x, &m->fc.w, NULL, &y, err));
  }
  if (n > n0) {
    df_tensor mh = fmat(m, m->mask_hidden.w.data, 1, W), hm = fmat(m, c->hm, 1, H);
    df_tensor z = ivec(m, c->zeros, n - n0), rest = fmat(m, c->h0 + n0 * H, n - n0, H);
    DF_TRY(df_linear_forward(ctx, &mh, &m->fc.w, NULL, &hm, err));
    DF_TRY(df_embedding_forward(ctx, &hm, &z, &rest, err));
  }
  const float *h_in = c->h0;
  df_tensor ra = fvec(m, c->rstd, n), rb = fvec(m, c->rstd + n, n), p = ivec(m, c->pos, n);
  df_tensor inv = fvec(m, m->inv_freq, m->hd / 2);
  for (int64_t l = 0; l < m->L; l++) {
    const layer_w *w = &m->lw[l];
    const float *res = h_in;
    if (l == 0) {
      df_tensor ee = fmat(m, c->emb, n, H), t = fmat(m, c->hmid, n, H), hi = fmat(m, h_in, n, H),
                hn = fmat(m, c->hn, n, H);
      DF_TRY(df_rmsnorm_forward(ctx, &ee, &w->in_norm.w, m->eps, &t, &ra, err));
      DF_TRY(cols_copy(m, n, H, c->hmid, 0, H, c->x, 0, 2 * H, false, err));
      DF_TRY(df_rmsnorm_forward(ctx, &hi, &w->hidden_norm.w, m->eps, &hn, &rb, err));
      DF_TRY(cols_copy(m, n, H, c->hn, 0, H, c->x, H, 2 * H, false, err));
      if (m->nbr) res = c->hn;
    } else {
      df_tensor hi = fmat(m, h_in, n, H), x = fmat(m, c->x, n, H);
      DF_TRY(df_rmsnorm_forward(ctx, &hi, &w->in_norm.w, m->eps, &x, &ra, err));
    }
    float *k = c->k[l] + start * m->kvd, *v = c->v[l] + start * m->kvd;
    df_tensor x = fmat(m, c->x, n, w->win), q = fmat(m, c->q, n, m->qd), kk = fmat(m, k, n, m->kvd),
              vv = fmat(m, v, n, m->kvd);
    DF_TRY(df_linear_forward(ctx, &x, &w->q.w, NULL, &q, err));
    DF_TRY(df_linear_forward(ctx, &x, &w->k.w, NULL, &kk, err));
    DF_TRY(df_linear_forward(ctx, &x, &w->v.w, NULL, &vv, err));
    df_tensor q3 = df_view(c->q, DF_F32, m->dev, 3, (const int64_t[]){n, m->nH, m->hd});
    df_tensor k3 = df_view(k, DF_F32, m->dev, 3, (const int64_t[]){n, m->nKV, m->hd});
    DF_TRY(df_rope_forward(ctx, &q3, &p, &inv, m->mscale, &q3, err));
    DF_TRY(df_rope_forward(ctx, &k3, &p, &inv, m->mscale, &k3, err));
    const df_causal_attn_desc desc = {.past = start, .scale = (float)(1.0 / sqrt((double)m->hd))};
    df_tensor q4 = df_view(c->q, DF_F32, m->dev, 4, (const int64_t[]){1, n, m->nH, m->hd});
    df_tensor k4 = df_view(c->k[l], DF_F32, m->dev, 4, (const int64_t[]){1, c->cap, m->nKV, m->hd});
    df_tensor v4 = df_view(c->v[l], DF_F32, m->dev, 4, (const int64_t[]){1, c->cap, m->nKV, m->hd});
    df_tensor o4 = df_view(c->attn, DF_F32, m->dev, 4, (const int64_t[]){1, n, m->nH, m->hd});
    DF_TRY(df_causal_attn_forward(ctx, &desc, &q4, &k4, &v4, &o4, err));
    float *h_out = c->h[l % 2];
    const df_llama_tail_acts ta = {.attn = c->attn,
                                   .h_mid = c->hmid,
                                   .y = c->y,
                                   .g = c->g,
                                   .u = c->u,
                                   .a = c->a,
                                   .h_out = h_out,
                                   .rstd_p = c->rstd};
    DF_TRY(df_llama_tail_forward(ctx, &w->tail, n, res, &ta, err));
    h_in = h_out;
  }
  df_tensor h = fmat(m, h_in, n, H), o = fmat(m, c->out, n, H), ro = fvec(m, c->rstd, n);
  DF_TRY(df_rmsnorm_forward(ctx, &h, &m->norm.w, m->eps, &o, &ro, err));
  *out = c->out;
  return DF_OK;
}
