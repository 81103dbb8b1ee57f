// The EAGLE-3 draft (modeling/eagle3_model.h): parameter entries in SpecForge's order, views into the draft model's
// flat buffers, the training-time test (forward step by step, keys and values of every step in one cache for the TTT
// attention; backward in reverse, the key gradients completing step by step) and the decode of speculative decoding.
#include "modeling/eagle3_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/causal_attn.h"
#include "kernels/eagle3.h"
#include "modeling/model_util.h"

typedef df_pview pview;

// The activations of one TTT step (arena views).
typedef struct {
  float *emb;           // (R, H) embed(ids_i)
  float *rstd_e;        // (R) input_layernorm
  float *rstd_h;        // (R) hidden_norm
  float *x;             // (R, 2H) [input_layernorm(emb) ; hidden_norm(h_in)]
  float *q;             // (R, nH·hd) rotated
  float *lse;           // (R·nH)
  df_llama_tail_acts t; // attn (R, nH·hd), h_mid = h_in + o_proj(attn), post_attention_layernorm's y and rstd_p,
                        // gate, up, silu(gate)·up (R, I), h_out (R, H): the next step's hidden input
  float *out, *rstd_o;  // (R, H) norm(h_out) (when norm_output), (R)
} step_acts;
// Activations and their gradients are held in the model's storage dtype dt (bf16 in mixed precision, their float
// pointers then address bf16 elements); statistics (rstd, lse) are fp32. The TTT attention is an fp32 island: its
// key / value cache and their gradients are fp32 (the key gradients sum over later steps), the queries and outputs
// are cast at its boundary through q32 / o32.

struct df_eagle3_model {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_device dev;
  const df_params *params;
  float *weights;
  int64_t H, Ht, nH, nKV, hd, qd, kvd, I, D, V;
  float eps, mscale;
  df_dtype dt;     // storage dtype of activations (the weight views' dtype)
  size_t es;       // its element size
  float *inv_freq; // (hd/2) on the device
  pview q_w, k_w, v_w, o_w, gate_w, up_w, down_w, hidden_norm, in_norm, post_norm, fc, fc_norm[3], norm, lm_head;
  df_llama_tail tail; // o_proj, the residual and the MLP of the midlayer (modeling/model_util.h)
  const df_param *t2d, *d2t;
  // the micro-batch
  df_eagle3_batch b;
  int64_t R;
  void *arena;
  size_t arena_cap, arena_used;
  float *aux_n, *aux_rstd; // (R, 3Ht), (3, R): fc_norm's output and statistics (EAGLE 3.1)
  float *h0;               // (R, H) fc(aux): step 0's hidden input
  float *kc, *vc;          // (T, R, kvd) every step's rotated keys and values
  step_acts *acts;         // [T]
  int64_t acts_cap;
  // backward scratch
  float *dh, *carry, *dtmp, *dy, *dg, *du, *da, *dattn, *dq, *dx, *dkc, *dvc, *daux, *piece, *piece2;
  // mixed precision only: the attention island's fp32 staging (one step at a time), the k / v rows in dt
  float *q32, *o32, *do32, *dq32, *ks, *vs;
  int64_t next_fwd, next_bwd;
};

// ---- parameters ----------------------------------------------------------------------------------------------

df_status df_eagle3_add_params(const df_draft_config *cfg, df_params *p, df_error *err) {
  const int64_t H = cfg->hidden_size, Ht = cfg->eagle3.target_hidden_size, hd = cfg->head_dim;
  const int64_t qd = cfg->num_attention_heads * hd, kvd = cfg->num_key_value_heads * hd, I = cfg->intermediate_size;
  DF_TRY(df_params_add_f32(p, "midlayer.self_attn.q_proj.weight", DF_ROLE_WEIGHT, 2, qd, 2 * H, err));
  DF_TRY(df_params_add_f32(p, "midlayer.self_attn.k_proj.weight", DF_ROLE_WEIGHT, 2, kvd, 2 * H, err));
  DF_TRY(df_params_add_f32(p, "midlayer.self_attn.v_proj.weight", DF_ROLE_WEIGHT, 2, kvd, 2 * H, err));
  DF_TRY(df_params_add_f32(p, "midlayer.self_attn.o_proj.weight", DF_ROLE_WEIGHT, 2, H, qd, err));
  DF_TRY(df_params_add_f32(p, "midlayer.mlp.gate_proj.weight", DF_ROLE_WEIGHT, 2, I, H, err));
  DF_TRY(df_params_add_f32(p, "midlayer.mlp.up_proj.weight", DF_ROLE_WEIGHT, 2, I, H, err));
  DF_TRY(df_params_add_f32(p, "midlayer.mlp.down_proj.weight", DF_ROLE_WEIGHT, 2, H, I, err));
  DF_TRY(df_params_add_f32(p, "midlayer.hidden_norm.weight", DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, "midlayer.input_layernorm.weight", DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, "midlayer.post_attention_layernorm.weight", DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, "fc.weight", DF_ROLE_WEIGHT, 2, H, 3 * Ht, err));
  for (int j = 0; cfg->eagle3.fc_norm && j < 3; j++) {
    char name[32];
    snprintf(name, sizeof name, "fc_norm.%d.weight", j);
    DF_TRY(df_params_add_f32(p, name, DF_ROLE_NORM, 1, Ht, 0, err));
  }
  DF_TRY(df_params_add_f32(p, "norm.weight", DF_ROLE_NORM, 1, H, 0, err));
  DF_TRY(df_params_add_f32(p, "lm_head.weight", DF_ROLE_WEIGHT, 2, cfg->eagle3.draft_vocab_size, H, err));
  DF_TRY(df_params_add_buffer(p, "t2d", DF_BOOL, cfg->vocab_size, err));
  return df_params_add_buffer(p, "d2t", DF_I64, cfg->eagle3.draft_vocab_size, err);
}

void df_eagle3_init_buffers(const df_params *p, float *flat) {
  const df_param *t2d = df_params_find(p, "t2d"), *d2t = df_params_find(p, "d2t");
  if (!t2d || !d2t) return;
  for (int64_t i = 0; i < t2d->numel; i++) flat[t2d->offset + i] = 1.0f;
  memset(flat + d2t->offset, 0, sizeof(float) * (size_t)d2t->numel);
}

static df_status bind(df_eagle3_model *m, float *grads, const char *name, pview *v, df_error *err) {
  return df_params_bind(m->params, name, m->weights, grads, m->dev, &v->w, &v->g, err);
}

static df_status bind_all(df_eagle3_model *m, float *grads, df_error *err) {
  static const char *const names[] = {"midlayer.self_attn.q_proj.weight",
                                      "midlayer.self_attn.k_proj.weight",
                                      "midlayer.self_attn.v_proj.weight",
                                      "midlayer.self_attn.o_proj.weight",
                                      "midlayer.mlp.gate_proj.weight",
                                      "midlayer.mlp.up_proj.weight",
                                      "midlayer.mlp.down_proj.weight",
                                      "midlayer.hidden_norm.weight",
                                      "midlayer.input_layernorm.weight",
                                      "midlayer.post_attention_layernorm.weight",
                                      "fc.weight",
                                      "norm.weight",
                                      "lm_head.weight"};
  pview *views[] = {&m->q_w,         &m->k_w,     &m->v_w,       &m->o_w, &m->gate_w, &m->up_w,   &m->down_w,
                    &m->hidden_norm, &m->in_norm, &m->post_norm, &m->fc,  &m->norm,   &m->lm_head};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) DF_TRY(bind(m, grads, names[i], views[i], err));
  for (int j = 0; m->cfg->eagle3.fc_norm && j < 3; j++) {
    char name[32];
    snprintf(name, sizeof name, "fc_norm.%d.weight", j);
    DF_TRY(bind(m, grads, name, &m->fc_norm[j], err));
  }
  m->t2d = df_params_find(m->params, "t2d"), m->d2t = df_params_find(m->params, "d2t");
  if (!m->t2d || !m->d2t)
    return DF_FAIL(err, DF_ERR_INVALID, "t2d", NULL, "the EAGLE-3 vocabulary buffers are missing");
  return DF_OK;
}

df_status df_eagle3_model_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_eagle3_model **out, df_error *err) {
  *out = NULL;
  df_eagle3_model *m = calloc(1, sizeof *m);
  if (!m) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate the EAGLE-3 model");
  m->cfg = cfg, m->ctx = ctx, m->dev = df_ctx_device(ctx), m->params = p, m->weights = weights;
  m->H = cfg->hidden_size, m->Ht = cfg->eagle3.target_hidden_size, m->nH = cfg->num_attention_heads;
  m->nKV = cfg->num_key_value_heads, m->hd = cfg->head_dim, m->qd = m->nH * m->hd, m->kvd = m->nKV * m->hd;
  m->I = cfg->intermediate_size, m->D = cfg->eagle3.draft_vocab_size, m->V = cfg->vocab_size;
  m->eps = (float)cfg->rms_norm_eps;
  df_status st = bind_all(m, grads, err);
  m->dt = m->q_w.w.dtype, m->es = df_dtype_size(m->dt); // the forward's weights: bf16 views in mixed precision
  m->tail =
      df_llama_tail_of(&m->o_w, &m->post_norm, &m->gate_w, &m->up_w, &m->down_w, m->H, m->I, m->qd, m->eps, m->dt);
  if (st == DF_OK) st = df_rope_upload(&cfg->rope, m->hd, ctx, &m->inv_freq, &m->mscale, err);
  if (st != DF_OK) {
    df_eagle3_model_free(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

void df_eagle3_model_free(df_eagle3_model *m) {
  if (!m) return;
  df_buffer_free(m->ctx, m->inv_freq);
  df_buffer_free(m->ctx, m->arena);
  free(m->acts);
  free(m);
}

const df_draft_config *df_eagle3_config(const df_eagle3_model *m) { return m->cfg; }
df_dtype df_eagle3_storage(const df_eagle3_model *m) { return m->dt; }
int64_t df_eagle3_activation_bytes(const df_eagle3_model *m) { return (int64_t)m->arena_used; }
void df_eagle3_lm_head(df_eagle3_model *m, df_tensor *w, df_tensor *g) {
  if (w) *w = m->lm_head.w;
  if (g) *g = m->lm_head.g;
}

// ---- the vocabulary mapping -------------------------------------------------------------------------------------

// The buffers' floats: in place on the host, else through a staging copy.
static df_status buffer_io(df_ctx *ctx, float *weights, const df_param *e, float *host, bool write, df_error *err) {
  const df_device dev = df_ctx_device(ctx);
  float *on_dev = weights + e->offset;
  const size_t bytes = sizeof(float) * (size_t)e->numel;
  return write ? df_copy(ctx, on_dev, dev, host, DF_DEV_CPU, bytes, err)
               : df_copy(ctx, host, DF_DEV_CPU, on_dev, dev, bytes, err);
}

static df_status vocab_entries(const df_params *p, const df_param **t2d, const df_param **d2t, float **tmp,
                               df_error *err) {
  *t2d = df_params_find(p, "t2d"), *d2t = df_params_find(p, "d2t");
  if (!*t2d || !*d2t) return DF_FAIL(err, DF_ERR_INVALID, "t2d", NULL, "the draft has no vocabulary buffers");
  const int64_t n = (*t2d)->numel > (*d2t)->numel ? (*t2d)->numel : (*d2t)->numel;
  if (!(*tmp = malloc(sizeof(float) * (size_t)n))) return DF_FAIL(err, DF_ERR_NOMEM, "t2d", NULL, "out of memory");
  return DF_OK;
}

df_status df_eagle_vocab_read(df_ctx *ctx, const df_params *p, float *weights, int64_t *d2t, uint8_t *t2d,
                              df_error *err) {
  const df_param *te, *de;
  float *tmp;
  DF_TRY(vocab_entries(p, &te, &de, &tmp, err));
  df_status st = buffer_io(ctx, weights, de, tmp, false, err);
  for (int64_t i = 0; st == DF_OK && i < de->numel; i++) d2t[i] = (int64_t)lrintf(tmp[i]);
  if (st == DF_OK) st = buffer_io(ctx, weights, te, tmp, false, err);
  for (int64_t i = 0; st == DF_OK && i < te->numel; i++) t2d[i] = tmp[i] != 0.0f;
  free(tmp);
  return st;
}

df_status df_eagle_vocab_write(df_ctx *ctx, const df_params *p, float *weights, const int64_t *d2t, const uint8_t *t2d,
                               df_error *err) {
  const df_param *te, *de;
  float *tmp;
  DF_TRY(vocab_entries(p, &te, &de, &tmp, err));
  for (int64_t i = 0; i < de->numel; i++) tmp[i] = (float)d2t[i];
  df_status st = buffer_io(ctx, weights, de, tmp, true, err);
  for (int64_t i = 0; i < te->numel; i++) tmp[i] = t2d[i] ? 1.0f : 0.0f;
  if (st == DF_OK) st = buffer_io(ctx, weights, te, tmp, true, err);
  free(tmp);
  return st;
}

df_status df_eagle3_vocab_read(df_eagle3_model *m, int64_t *d2t, uint8_t *t2d, df_error *err) {
  return df_eagle_vocab_read(m->ctx, m->params, m->weights, d2t, t2d, err);
}

df_status df_eagle3_vocab_write(df_eagle3_model *m, const int64_t *d2t, const uint8_t *t2d, df_error *err) {
  return df_eagle_vocab_write(m->ctx, m->params, m->weights, d2t, t2d, err);
}

// ---- views -----------------------------------------------------------------------------------------------------

// Activations (storage dtype) and fp32 statistics.
static df_tensor mat(const df_eagle3_model *m, const float *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, m->dt, m->dev, 2, (const int64_t[]){rows, cols});
}
static df_tensor vec(const df_eagle3_model *m, const float *p, int64_t n) {
  return df_view((void *)p, m->dt, m->dev, 1, (const int64_t[]){n});
}
static df_tensor fvec(const df_eagle3_model *m, const float *p, int64_t n) {
  return df_view((void *)p, DF_F32, m->dev, 1, (const int64_t[]){n});
}
static df_tensor ivec(const df_eagle3_model *m, const int32_t *p, int64_t n) {
  return df_view((void *)p, DF_I32, m->dev, 1, (const int64_t[]){n});
}

// Copies cols columns between two row-major matrices (strides in elements), or adds them.
static df_status cols_copy(const df_eagle3_model *m, int64_t rows, int64_t cols, const float *src, int64_t s_off,
                           int64_t s_ld, int64_t s_n, float *dst, int64_t d_off, int64_t d_ld, int64_t d_n, bool add,
                           df_error *err) {
  (void)s_n, (void)d_n; // the views' extents follow from rows and the leading dimensions
  return df_cols_copy(m->ctx, m->dt, rows, cols, src, s_off, s_ld, dst, d_off, d_ld, add, err);
}

// ---- the activation arena -----------------------------------------------------------------------------------

typedef df_carver carver;

static float *carve_b(carver *c, size_t bytes) { return df_carve(c, bytes); }
static float *carve(carver *c, int64_t floats) { return carve_b(c, (size_t)floats * sizeof(float)); }
// n elements of the model's storage dtype.
static float *carve_s(carver *c, const df_eagle3_model *m, int64_t n) { return carve_b(c, (size_t)n * m->es); }

static void layout(carver *c, df_eagle3_model *m, int64_t T) {
  const int64_t R = m->R, H = m->H, Ht = m->Ht, I = m->I, qd = m->qd, kvd = m->kvd;
  const bool fcn = m->cfg->eagle3.fc_norm, mixed = m->dt != DF_F32;
  m->aux_n = carve_s(c, m, fcn ? R * 3 * Ht : 0);
  m->aux_rstd = carve(c, fcn ? 3 * R : 0);
  m->h0 = carve_s(c, m, R * H);
  m->kc = carve(c, T * R * kvd), m->vc = carve(c, T * R * kvd); // fp32: the attention island's cache
  for (int64_t i = 0; i < T; i++) {
    step_acts *a = &m->acts[i];
    a->emb = carve_s(c, m, R * H), a->rstd_e = carve(c, R), a->rstd_h = carve(c, R), a->x = carve_s(c, m, R * 2 * H);
    a->q = carve_s(c, m, R * qd), a->t.attn = carve_s(c, m, R * qd), a->lse = carve(c, R * m->nH);
    a->t.h_mid = carve_s(c, m, R * H), a->t.y = carve_s(c, m, R * H), a->t.rstd_p = carve(c, R);
    a->t.g = carve_s(c, m, R * I), a->t.u = carve_s(c, m, R * I), a->t.a = carve_s(c, m, R * I);
    a->t.h_out = carve_s(c, m, R * H);
    a->out = m->cfg->eagle3.norm_output ? carve_s(c, m, R * H) : a->t.h_out;
    a->rstd_o = carve(c, R);
  }
  m->dh = carve_s(c, m, R * H), m->carry = carve_s(c, m, R * H), m->dtmp = carve_s(c, m, R * H);
  m->dy = carve_s(c, m, R * H);
  m->dg = carve_s(c, m, R * I), m->du = carve_s(c, m, R * I), m->da = carve_s(c, m, R * I);
  m->dattn = carve_s(c, m, R * qd), m->dq = carve_s(c, m, R * qd), m->dx = carve_s(c, m, R * 2 * H);
  m->dkc = carve(c, T * R * kvd), m->dvc = carve(c, T * R * kvd); // fp32: summed over the later steps
  m->daux = carve_s(c, m, fcn ? R * 3 * Ht : 0);
  m->piece = carve_s(c, m, R * (Ht > H ? Ht : H)), m->piece2 = carve_s(c, m, R * (Ht > H ? Ht : H));
  m->q32 = carve(c, mixed ? R * qd : 0), m->o32 = carve(c, mixed ? R * qd : 0);
  m->do32 = carve(c, mixed ? R * qd : 0), m->dq32 = carve(c, mixed ? R * qd : 0);
  m->ks = carve_s(c, m, mixed ? R * kvd : 0), m->vs = carve_s(c, m, mixed ? R * kvd : 0);
}

static df_status ensure_arena(df_eagle3_model *m, int64_t T, df_error *err) {
  if (T > m->acts_cap) {
    step_acts *a = realloc(m->acts, sizeof *a * (size_t)T);
    if (!a) return DF_FAIL(err, DF_ERR_NOMEM, "ttt_length", NULL, "out of memory");
    m->acts = a, m->acts_cap = T;
  }
  carver measure = {0};
  layout(&measure, m, T);
  if (measure.off > m->arena_cap) {
    df_buffer_free(m->ctx, m->arena);
    m->arena = NULL, m->arena_cap = 0;
    DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_ACTIVATIONS, measure.off, &m->arena, err));
    m->arena_cap = measure.off;
  }
  carver c = {.base = m->arena};
  layout(&c, m, T);
  m->arena_used = c.off;
  return DF_OK;
}

// ---- forward -----------------------------------------------------------------------------------------------------

// fc's input: the captured layers, each RMS-normed first with fc_norm (EAGLE 3.1).
static df_status fc_input(df_eagle3_model *m, const float **in, df_error *err) {
  const int64_t R = m->R, Ht = m->Ht, W = 3 * Ht;
  *in = m->b.aux;
  if (!m->cfg->eagle3.fc_norm) return DF_OK;
  for (int j = 0; j < 3; j++) {
    DF_TRY(cols_copy(m, R, Ht, m->b.aux, j * Ht, W, R * W, m->piece, 0, Ht, R * Ht, false, err));
    df_tensor x = mat(m, m->piece, R, Ht), y = mat(m, m->piece2, R, Ht), r = fvec(m, m->aux_rstd + j * R, R);
    DF_TRY(df_rmsnorm_forward(m->ctx, &x, &m->fc_norm[j].w, m->eps, &y, &r, err));
    DF_TRY(cols_copy(m, R, Ht, m->piece2, 0, Ht, R * Ht, m->aux_n, j * Ht, W, R * W, false, err));
  }
  *in = m->aux_n;
  return DF_OK;
}

df_status df_eagle3_begin(df_eagle3_model *m, const df_eagle3_batch *b, df_error *err) {
  if (!b || b->B < 1 || b->S < 1 || b->T < 1 || !b->aux || !b->ids || !b->pos || !b->lengths || !b->embed)
    return DF_FAIL(err, DF_ERR_INVALID, "batch", "fill every df_eagle3_batch field", "incomplete EAGLE-3 batch");
  m->b = *b, m->R = b->B * b->S;
  DF_TRY(ensure_arena(m, b->T, err));
  const float *in;
  DF_TRY(fc_input(m, &in, err));
  df_tensor x = mat(m, in, m->R, 3 * m->Ht), y = mat(m, m->h0, m->R, m->H);
  DF_TRY(df_linear_forward(m->ctx, &x, &m->fc.w, NULL, &y, err));
  m->next_fwd = 0, m->next_bwd = -1;
  return DF_OK;
}

// The midlayer over R rows: x = [input_layernorm(emb) ; hidden_norm(h_in)], q / k / v, RoPE at pos; attention is the
// caller's (k, v already written where kc / vc point); then o_proj + residual and the MLP.
static df_status qkv_forward(df_eagle3_model *m, int64_t R, const float *h_in, const int32_t *pos, step_acts *a,
                             float *k, float *v, float *tmp, df_error *err) {
  const int64_t H = m->H;
  df_tensor e = mat(m, a->emb, R, H), hi = mat(m, h_in, R, H), t = mat(m, tmp, R, H);
  df_tensor re = fvec(m, a->rstd_e, R), rh = fvec(m, a->rstd_h, R);
  DF_TRY(df_rmsnorm_forward(m->ctx, &e, &m->in_norm.w, m->eps, &t, &re, err));
  DF_TRY(cols_copy(m, R, H, tmp, 0, H, R * H, a->x, 0, 2 * H, R * 2 * H, false, err));
  DF_TRY(df_rmsnorm_forward(m->ctx, &hi, &m->hidden_norm.w, m->eps, &t, &rh, err));
  DF_TRY(cols_copy(m, R, H, tmp, 0, H, R * H, a->x, H, 2 * H, R * 2 * H, false, err));
  df_tensor x = mat(m, a->x, R, 2 * H), q = mat(m, a->q, R, m->qd), kk = mat(m, k, R, m->kvd),
            vv = mat(m, v, R, m->kvd);
  DF_TRY(df_linear_forward(m->ctx, &x, &m->q_w.w, NULL, &q, err));
  DF_TRY(df_linear_forward(m->ctx, &x, &m->k_w.w, NULL, &kk, err));
  DF_TRY(df_linear_forward(m->ctx, &x, &m->v_w.w, NULL, &vv, err));
  df_tensor q3 = df_view(a->q, m->dt, m->dev, 3, (const int64_t[]){R, m->nH, m->hd});
  df_tensor k3 = df_view(k, m->dt, m->dev, 3, (const int64_t[]){R, m->nKV, m->hd});
  df_tensor p = ivec(m, pos, R), inv = fvec(m, m->inv_freq, m->hd / 2);
  DF_TRY(df_rope_forward(m->ctx, &q3, &p, &inv, m->mscale, &q3, err));
  return df_rope_forward(m->ctx, &k3, &p, &inv, m->mscale, &k3, err);
}

static df_status tail_forward(df_eagle3_model *m, int64_t R, const float *h_in, step_acts *a, df_error *err) {
  const int64_t H = m->H;
  df_tensor ho = mat(m, a->t.h_out, R, H);
  DF_TRY(df_llama_tail_forward(m->ctx, &m->tail, R, h_in, &a->t, err));
  if (!m->cfg->eagle3.norm_output) return DF_OK;
  df_tensor o = mat(m, a->out, R, H), ro = fvec(m, a->rstd_o, R);
  return df_rmsnorm_forward(m->ctx, &ho, &m->norm.w, m->eps, &o, &ro, err);
}

// The attention island's fp32 views: the key / value cache and one step's queries or outputs.
static df_tensor cache4(const df_eagle3_model *m, const float *p) {
  return df_view((void *)p, DF_F32, m->dev, 4, (const int64_t[]){m->b.T * m->b.B, m->b.S, m->nKV, m->hd});
}
static df_tensor heads4(const df_eagle3_model *m, const float *p) {
  return df_view((void *)p, DF_F32, m->dev, 4, (const int64_t[]){m->b.B, m->b.S, m->nH, m->hd});
}

// Mixed precision: n elements between an activation (storage dtype) and an fp32 staging buffer of the island.
static df_status cast_in(df_eagle3_model *m, const float *act, float *f32, int64_t n, df_error *err) {
  df_tensor a = vec(m, act, n), f = fvec(m, f32, n);
  return df_cast(m->ctx, &a, &f, err);
}
static df_status cast_out(df_eagle3_model *m, const float *f32, float *act, int64_t n, df_error *err) {
  df_tensor f = fvec(m, f32, n), a = vec(m, act, n);
  return df_cast(m->ctx, &f, &a, err);
}

df_status df_eagle3_step_forward(df_eagle3_model *m, int64_t i, const float **out, df_error *err) {
  if (i != m->next_fwd || i >= m->b.T)
    return DF_FAIL(err, DF_ERR_INVALID, "step", "run the steps 0, 1, .. T−1 in order after df_eagle3_begin",
                   "TTT step %lld out of order (expected %lld)", (long long)i, (long long)m->next_fwd);
  const int64_t R = m->R;
  step_acts *a = &m->acts[i];
  const float *h_in = i == 0 ? m->h0 : m->acts[i - 1].t.h_out;
  df_tensor tab = mat(m, m->b.embed, m->b.vocab, m->H), ids = ivec(m, m->b.ids + i * R, R), e = mat(m, a->emb, R, m->H);
  DF_TRY(df_embedding_forward(m->ctx, &tab, &ids, &e, err));
  float *k = m->kc + i * R * m->kvd, *v = m->vc + i * R * m->kvd;
  const bool mixed = m->dt != DF_F32;
  DF_TRY(qkv_forward(m, R, h_in, m->b.pos + i * R, a, mixed ? m->ks : k, mixed ? m->vs : v, m->piece, err));
  if (mixed) { // into the island: this step's keys and values into the fp32 cache, its queries into q32
    DF_TRY(cast_in(m, m->ks, k, R * m->kvd, err));
    DF_TRY(cast_in(m, m->vs, v, R * m->kvd, err));
    DF_TRY(cast_in(m, a->q, m->q32, R * m->qd, err));
  }
  const df_ttt_attn_desc desc = {.step = i, .scale = (float)(1.0 / sqrt((double)m->hd))};
  df_tensor q = heads4(m, mixed ? m->q32 : a->q), kc = cache4(m, m->kc), vc = cache4(m, m->vc);
  df_tensor o = heads4(m, mixed ? m->o32 : a->t.attn);
  df_tensor len = ivec(m, m->b.lengths, m->b.B), lse = fvec(m, a->lse, R * m->nH);
  DF_TRY(df_ttt_attn_forward(m->ctx, &desc, &q, &kc, &vc, &len, &o, &lse, err));
  if (mixed) DF_TRY(cast_out(m, m->o32, a->t.attn, R * m->qd, err));
  DF_TRY(tail_forward(m, R, h_in, a, err));
  m->next_fwd = i + 1;
  if (i + 1 == m->b.T) m->next_bwd = i;
  *out = a->out;
  return DF_OK;
}

// ---- backward ----------------------------------------------------------------------------------------------------

static df_status zero(df_eagle3_model *m, float *p, int64_t n, df_error *err) { // fp32 buffers
  df_tensor t = fvec(m, p, n);
  return df_fill(m->ctx, &t, 0.0, err);
}

// dh (R, H) = ∂loss/∂h_out of step i → through the MLP and o_proj: dh becomes ∂/∂h_mid, dattn ∂/∂attn.
static df_status tail_backward(df_eagle3_model *m, int64_t R, const step_acts *a, df_error *err) {
  return df_llama_tail_backward(m->ctx, &m->tail, R, &a->t, m->dh, m->dattn, m->da, m->dg, m->du, m->dy, err);
}

// From dq and this step's (now complete) key gradients to x, then to the two norms: the carry becomes ∂/∂h_in.
static df_status qkv_backward(df_eagle3_model *m, int64_t i, const step_acts *a, const float *h_in, df_error *err) {
  const int64_t R = m->R, H = m->H, kvd = m->kvd;
  df_tensor p = ivec(m, m->b.pos + i * R, R), inv = fvec(m, m->inv_freq, m->hd / 2);
  float *dk = m->dkc + i * R * kvd, *dv = m->dvc + i * R * kvd;
  if (m->dt != DF_F32) { // out of the island: this step's (now complete) key and value gradients
    DF_TRY(cast_out(m, dk, m->ks, R * kvd, err));
    DF_TRY(cast_out(m, dv, m->vs, R * kvd, err));
    dk = m->ks, dv = m->vs;
  }
  df_tensor dq3 = df_view(m->dq, m->dt, m->dev, 3, (const int64_t[]){R, m->nH, m->hd});
  df_tensor dk3 = df_view(dk, m->dt, m->dev, 3, (const int64_t[]){R, m->nKV, m->hd});
  DF_TRY(df_rope_backward(m->ctx, &dq3, &p, &inv, m->mscale, &dq3, err));
  DF_TRY(df_rope_backward(m->ctx, &dk3, &p, &inv, m->mscale, &dk3, err));
  df_tensor x = mat(m, a->x, R, 2 * H), dx = mat(m, m->dx, R, 2 * H);
  df_tensor dq = mat(m, m->dq, R, m->qd), dkk = mat(m, dk, R, kvd), dvv = mat(m, dv, R, kvd);
  DF_TRY(df_linear_backward(m->ctx, &dq, &x, &m->q_w.w, &dx, false, &m->q_w.g, NULL, err));
  DF_TRY(df_linear_backward(m->ctx, &dkk, &x, &m->k_w.w, &dx, true, &m->k_w.g, NULL, err));
  DF_TRY(df_linear_backward(m->ctx, &dvv, &x, &m->v_w.w, &dx, true, &m->v_w.g, NULL, err));
  // input_layernorm(emb): only its weight learns (the embedding is frozen); hidden_norm(h_in) adds to the carry.
  df_tensor t = mat(m, m->dtmp, R, H), e = mat(m, a->emb, R, H), re = fvec(m, a->rstd_e, R), sink = mat(m, m->dy, R, H);
  DF_TRY(cols_copy(m, R, H, m->dx, 0, 2 * H, R * 2 * H, m->dtmp, 0, H, R * H, false, err));
  DF_TRY(df_rmsnorm_backward(m->ctx, &t, &e, &m->in_norm.w, &re, &sink, false, &m->in_norm.g, err));
  DF_TRY(cols_copy(m, R, H, m->dx, H, 2 * H, R * 2 * H, m->dtmp, 0, H, R * H, false, err));
  df_tensor hi = mat(m, h_in, R, H), rh = fvec(m, a->rstd_h, R), carry = mat(m, m->carry, R, H);
  DF_TRY(df_copy(m->ctx, m->carry, m->dev, m->dh, m->dev, m->es * (size_t)(R * H), err)); // the residual
  return df_rmsnorm_backward(m->ctx, &t, &hi, &m->hidden_norm.w, &rh, &carry, true, &m->hidden_norm.g, err);
}

// Step 0's carry is ∂/∂fc(aux): fc's weight, and fc_norm's through fc's input gradient.
static df_status fc_backward(df_eagle3_model *m, df_error *err) {
  const int64_t R = m->R, Ht = m->Ht, W = 3 * Ht;
  const bool fcn = m->cfg->eagle3.fc_norm;
  df_tensor dy = mat(m, m->carry, R, m->H), x = mat(m, fcn ? m->aux_n : m->b.aux, R, W), dx = mat(m, m->daux, R, W);
  DF_TRY(df_linear_backward(m->ctx, &dy, &x, &m->fc.w, fcn ? &dx : NULL, false, &m->fc.g, NULL, err));
  for (int j = 0; fcn && j < 3; j++) {
    DF_TRY(cols_copy(m, R, Ht, m->daux, j * Ht, W, R * W, m->piece, 0, Ht, R * Ht, false, err));
    DF_TRY(cols_copy(m, R, Ht, m->b.aux, j * Ht, W, R * W, m->piece2, 0, Ht, R * Ht, false, err));
    df_tensor g = mat(m, m->piece, R, Ht), xx = mat(m, m->piece2, R, Ht), r = fvec(m, m->aux_rstd + j * R, R);
    df_tensor sink = mat(m, m->dh, R, Ht <= m->H ? Ht : m->H); // Ht == H (the config refuses others)
    DF_TRY(df_rmsnorm_backward(m->ctx, &g, &xx, &m->fc_norm[j].w, &r, &sink, false, &m->fc_norm[j].g, err));
  }
  return DF_OK;
}

df_status df_eagle3_step_backward(df_eagle3_model *m, int64_t i, const float *d_out, df_error *err) {
  if (i != m->next_bwd || i < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "step", "run every forward step, then the backward from T−1 down to 0",
                   "TTT backward of step %lld out of order (expected %lld)", (long long)i, (long long)m->next_bwd);
  const int64_t R = m->R, H = m->H, T = m->b.T;
  const step_acts *a = &m->acts[i];
  if (i == T - 1) {
    DF_TRY(zero(m, m->dkc, T * R * m->kvd, err));
    DF_TRY(zero(m, m->dvc, T * R * m->kvd, err));
  }
  df_tensor dout = mat(m, d_out, R, H), dh = mat(m, m->dh, R, H), carry = mat(m, m->carry, R, H);
  if (m->cfg->eagle3.norm_output) {
    df_tensor ho = mat(m, a->t.h_out, R, H), ro = fvec(m, a->rstd_o, R);
    DF_TRY(df_rmsnorm_backward(m->ctx, &dout, &ho, &m->norm.w, &ro, &dh, false, &m->norm.g, err));
  } else {
    DF_TRY(df_copy(m->ctx, m->dh, m->dev, d_out, m->dev, m->es * (size_t)(R * H), err));
  }
  if (i < T - 1) DF_TRY(df_axpy(m->ctx, 1.0f, &carry, &dh, err)); // step i + 1 read h_out as its hidden input
  DF_TRY(tail_backward(m, R, a, err));
  const df_ttt_attn_desc desc = {.step = i, .scale = (float)(1.0 / sqrt((double)m->hd))};
  const bool mixed = m->dt != DF_F32;
  if (mixed) { // into the island: the step's queries, outputs (as the forward rounded them) and their gradient
    DF_TRY(cast_in(m, a->q, m->q32, R * m->qd, err));
    DF_TRY(cast_in(m, a->t.attn, m->o32, R * m->qd, err));
    DF_TRY(cast_in(m, m->dattn, m->do32, R * m->qd, err));
  }
  df_tensor q = heads4(m, mixed ? m->q32 : a->q), kc = cache4(m, m->kc), vc = cache4(m, m->vc);
  df_tensor o = heads4(m, mixed ? m->o32 : a->t.attn), dat = heads4(m, mixed ? m->do32 : m->dattn);
  df_tensor len = ivec(m, m->b.lengths, m->b.B), lse = fvec(m, a->lse, R * m->nH);
  df_tensor dq = heads4(m, mixed ? m->dq32 : m->dq), dkc = cache4(m, m->dkc), dvc = cache4(m, m->dvc);
  DF_TRY(df_ttt_attn_backward(m->ctx, &desc, &q, &kc, &vc, &len, &o, &lse, &dat, &dq, &dkc, &dvc, err));
  if (mixed) DF_TRY(cast_out(m, m->dq32, m->dq, R * m->qd, err));
  DF_TRY(qkv_backward(m, i, a, i == 0 ? m->h0 : m->acts[i - 1].t.h_out, err));
  m->next_bwd = i - 1;
  return i == 0 ? fc_backward(m, err) : DF_OK;
}

// ---- decoding --------------------------------------------------------------------------------------------------

struct df_eagle3_cache {
  df_eagle3_model *m;
  int64_t cap;
  float *k, *v;     // (cap, kvd)
  void *scratch;    // one row block's activations
  int64_t rows_cap; // rows the scratch holds
  step_acts a;
  float *h_in, *fc_in;   // (n, H), (n, 3Ht)
  float *piece, *piece2; // (n, max(H, Ht)) scratch
  int32_t *pos;          // (n) on the device
  int32_t *hpos;         // (n) host staging
};

df_status df_eagle3_cache_create(df_eagle3_model *m, int64_t cap, df_eagle3_cache **out, df_error *err) {
  *out = NULL;
  df_eagle3_cache *c = calloc(1, sizeof *c);
  if (!c) return DF_FAIL(err, DF_ERR_NOMEM, "draft cache", NULL, "out of memory");
  c->m = m, c->cap = cap;
  const size_t bytes = sizeof(float) * (size_t)(cap * m->kvd);
  df_status st = df_buffer_alloc(m->ctx, bytes, (void **)&c->k, err);
  if (st == DF_OK) st = df_buffer_alloc(m->ctx, bytes, (void **)&c->v, err);
  if (st != DF_OK) {
    df_eagle3_cache_free(c);
    return st;
  }
  *out = c;
  return DF_OK;
}

void df_eagle3_cache_free(df_eagle3_cache *c) {
  if (!c) return;
  df_buffer_free(c->m->ctx, c->k), df_buffer_free(c->m->ctx, c->v), df_buffer_free(c->m->ctx, c->scratch);
  free(c->hpos);
  free(c);
}

static df_status cache_rows(df_eagle3_cache *c, int64_t n, df_error *err) {
  if (n <= c->rows_cap) return DF_OK;
  df_eagle3_model *m = c->m;
  const int64_t H = m->H, I = m->I;
  carver meas = {0}, cv;
  for (int pass = 0; pass < 2; pass++) {
    carver *k = pass ? &cv : &meas;
    step_acts *a = &c->a;
    a->emb = carve(k, n * H), a->rstd_e = carve(k, n), a->rstd_h = carve(k, n), a->x = carve(k, n * 2 * H);
    a->q = carve(k, n * m->qd), a->t.attn = carve(k, n * m->qd), a->lse = carve(k, n * m->nH);
    a->t.h_mid = carve(k, n * H), a->t.y = carve(k, n * H), a->t.rstd_p = carve(k, n);
    a->t.g = carve(k, n * I), a->t.u = carve(k, n * I), a->t.a = carve(k, n * I), a->t.h_out = carve(k, n * H);
    a->out = carve(k, n * H), a->rstd_o = carve(k, n);
    c->h_in = carve(k, n * H), c->fc_in = carve(k, n * 3 * m->Ht);
    c->pos = (int32_t *)carve(k, n);
    c->piece = carve(k, n * (m->Ht > H ? m->Ht : H)), c->piece2 = carve(k, n * (m->Ht > H ? m->Ht : H));
    if (pass) break;
    df_buffer_free(m->ctx, c->scratch);
    c->scratch = NULL;
    DF_TRY(df_buffer_alloc(m->ctx, meas.off, &c->scratch, err));
    cv = (carver){.base = c->scratch};
  }
  free(c->hpos);
  if (!(c->hpos = malloc(sizeof(int32_t) * (size_t)n))) return DF_FAIL(err, DF_ERR_NOMEM, "draft cache", NULL, "oom");
  c->rows_cap = n;
  return DF_OK;
}

df_status df_eagle3_decode(df_eagle3_model *m, df_eagle3_cache *c, int64_t start, int64_t n, const float *hidden,
                           bool from_aux, const int32_t *ids, const float *embed, int64_t vocab, const float **h_out,
                           const float **logits_in, df_error *err) {
  if (n < 1 || start < 0 || start + n > c->cap)
    return DF_FAIL(err, DF_ERR_INVALID, "draft cache", "grow the cache", "rows %lld .. %lld outside the cache's %lld",
                   (long long)start, (long long)(start + n), (long long)c->cap);
  if (m->dt != DF_F32)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "model.torch_dtype", "decode with an fp32 draft (eval builds one)",
                   "the EAGLE-3 decode runs on fp32 storage, this draft stores %s", df_dtype_name(m->dt));
  DF_TRY(cache_rows(c, n, err));
  const int64_t H = m->H;
  step_acts *a = &c->a;
  const float *h_in = hidden;
  if (from_aux) {
    df_tensor x = mat(m, hidden, n, 3 * m->Ht), y = mat(m, c->h_in, n, H);
    if (m->cfg->eagle3.fc_norm) {
      const int64_t Ht = m->Ht, W = 3 * Ht;
      for (int j = 0; j < 3; j++) {
        DF_TRY(cols_copy(m, n, Ht, hidden, j * Ht, W, n * W, c->piece, 0, Ht, n * Ht, false, err));
        df_tensor px = mat(m, c->piece, n, Ht), py = mat(m, c->piece2, n, Ht), r = fvec(m, a->rstd_e, n);
        DF_TRY(df_rmsnorm_forward(m->ctx, &px, &m->fc_norm[j].w, m->eps, &py, &r, err));
        DF_TRY(cols_copy(m, n, Ht, c->piece2, 0, Ht, n * Ht, c->fc_in, j * Ht, W, n * W, false, err));
      }
      x = mat(m, c->fc_in, n, W);
    }
    DF_TRY(df_linear_forward(m->ctx, &x, &m->fc.w, NULL, &y, err));
    h_in = c->h_in;
  }
  for (int64_t r = 0; r < n; r++) c->hpos[r] = (int32_t)(start + r);
  DF_TRY(df_copy(m->ctx, c->pos, m->dev, c->hpos, DF_DEV_CPU, sizeof(int32_t) * (size_t)n, err));
  df_tensor tab = mat(m, embed, vocab, H), idv = ivec(m, ids, n), e = mat(m, a->emb, n, H);
  DF_TRY(df_embedding_forward(m->ctx, &tab, &idv, &e, err));
  DF_TRY(qkv_forward(m, n, h_in, c->pos, a, c->k + start * m->kvd, c->v + start * m->kvd, c->piece, err));
  const df_causal_attn_desc desc = {.past = start, .scale = (float)(1.0 / sqrt((double)m->hd))};
  df_tensor q = df_view(a->q, DF_F32, m->dev, 4, (const int64_t[]){1, n, m->nH, m->hd});
  df_tensor k = df_view(c->k, DF_F32, m->dev, 4, (const int64_t[]){1, c->cap, m->nKV, m->hd});
  df_tensor v = df_view(c->v, DF_F32, m->dev, 4, (const int64_t[]){1, c->cap, m->nKV, m->hd});
  df_tensor o = df_view(a->t.attn, DF_F32, m->dev, 4, (const int64_t[]){1, n, m->nH, m->hd});
  DF_TRY(df_causal_attn_forward(m->ctx, &desc, &q, &k, &v, &o, err));
  const bool norm_out = m->cfg->eagle3.norm_output;
  if (!norm_out) a->out = a->t.h_out;
  DF_TRY(tail_forward(m, n, h_in, a, err));
  *h_out = a->t.h_out, *logits_in = norm_out ? a->out : a->t.h_out;
  return DF_OK;
}
