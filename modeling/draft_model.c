// The DFlash draft model: parameter table (SpecForge names, documented order), HF-style init from the
// draftforge RNG, strict warm start, and forward/backward of one micro-batch. Activations live in one arena
// laid out per (B, S, N) shape and grown when a larger batch arrives.
#include "modeling/draft_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "modeling/domino_head.h"
#include "modeling/draft_layer.h"
#include "modeling/dspark_heads.h"
#include "modeling/eagle3_model.h"
#include "modeling/model_util.h"
#include "modeling/peagle_model.h"
#include "modeling/strict_load.h"

struct df_draft_model {
  const df_draft_config *cfg; // borrowed: outlives the model
  df_ctx *ctx;
  df_device dev;
  df_params *params;
  float *weights, *grads; // (df_params_numel) flat fp32 on dev: the masters and their gradient
  df_dtype dt;            // storage of the forward: f32, or bf16 (mixed precision)
  void *params16;         // bf16: the copy of the masters the forward reads (NULL for f32)
  int64_t numel;
  int64_t L, H, K, nH, nKV, hd, bs;
  float eps;
  dflash_pview fc, hidden_norm, norm; // [H, K·H], [H], [H]
  draft_layer *layers;                // [L]
  df_ffn **ffns;                      // [L] layers[i].ffn, for the MoE hooks (moe/ffn_moe.h)
  float *inv_freq;                    // (hd/2) on dev
  float mscale;
  df_dspark_heads *dspark;       // DSpark drafts: the Markov/confidence heads (parameters after norm)
  df_eagle3_model *eagle3;       // EAGLE-3 drafts: the whole model (no backbone layers: L = 0)
  df_peagle_model *peagle;       // P-EAGLE drafts: the whole model (L = 0 here too)
  df_domino_head *domino;        // Domino drafts: the GRU correction head (parameters after norm)
  df_grads_ready_fn grads_ready; // df_draft_model_on_grads_ready
  void *grads_ready_user;

  // Activation arena, laid out for dims.
  void *arena;
  float *ffn_state; // the FFNs' persistent device state (modeling/ffn.h state_elems), NULL when none
  size_t arena_cap, arena_used;
  float *th32;       // bf16: (B, S, K·H) fp32 target features as the batch hands them, cast into th
  int32_t *host_pos; // (T + KV) host staging for the positions
  int64_t host_pos_cap;
  dflash_dims dims;
  bool have_forward;
  float *th;               // (B, S, K·H) target features
  float *fc_out;           // (B, S, H) fc(target_hidden)
  float *ctx_h;            // (B, S, H) hidden_norm(fc_out): the context every layer reads
  float *ctx_rstd;         // (B·S)
  float **h;               // [L+1] (B, Q, H) residual stream; h[0] = block embeddings
  float *out;              // (B, Q, H) norm(h[L])
  float *out_rstd;         // (B·Q)
  float *dfc;              // (B, S, H) backward: ∂/∂fc_out
  int32_t *pos_q, *pos_kv; // (B·Q), (B·(S+Q))
  int32_t *anchors;        // (B, N)
  uint8_t *keep;           // (B, N)
  draft_layer_acts *acts;  // [L]
  dflash_scratch scr;
};

// ---- parameter table -----------------------------------------------------------------------------------

static df_status build_table(df_draft_model *m, df_error *err) {
  DF_TRY(df_params_new(&m->params, err));
  if (m->cfg->kind == DF_DRAFT_EAGLE3 || m->cfg->kind == DF_DRAFT_PEAGLE) {
    DF_TRY(m->cfg->kind == DF_DRAFT_EAGLE3 ? df_eagle3_add_params(m->cfg, m->params, err)
                                           : df_peagle_add_params(m->cfg, m->params, err));
    return df_params_finalize(m->params, err);
  }
  DF_TRY(df_params_add_f32(m->params, "fc.weight", DF_ROLE_WEIGHT, 2, m->H, m->K * m->H, err));
  DF_TRY(df_params_add_f32(m->params, "hidden_norm.weight", DF_ROLE_NORM, 1, m->H, 0, err));
  for (int64_t i = 0; i < m->L; i++) {
    DF_TRY(draft_layer_add_params(m->cfg, i, m->params, &m->layers[i], err));
    m->layers[i].ffn->dt = m->dt; // its activations' dtype, before anything sizes its saved / scratch memory
  }
  DF_TRY(df_params_add_f32(m->params, "norm.weight", DF_ROLE_NORM, 1, m->H, 0, err));
  DF_TRY(df_dspark_heads_add_params(m->cfg, m->params, err)); // nothing unless a DSpark draft
  DF_TRY(df_domino_head_add_params(m->cfg, m->params, err));  // nothing unless a Domino draft
  return df_params_finalize(m->params, err);
}

static df_status bind_top(df_draft_model *m, const char *name, dflash_pview *v, df_error *err) {
  return df_params_bind(m->params, name, m->weights, m->grads, m->dev, &v->w, &v->g, err);
}

static df_status check_config(const df_draft_config *cfg, df_error *err) {
  if (df_draft_is_eagle(cfg)) return DF_OK; // modeling/draft_config_eagle3.c checked it
  if (cfg->num_hidden_layers < 1 || cfg->hidden_size < 1 || cfg->head_dim < 2 || cfg->head_dim % 2)
    return DF_FAIL(err, DF_ERR_INVALID, cfg->source, "check num_hidden_layers, hidden_size and head_dim",
                   "the draft needs >= 1 layer, hidden_size >= 1 and an even head_dim (got %lld, %lld, %lld)",
                   (long long)cfg->num_hidden_layers, (long long)cfg->hidden_size, (long long)cfg->head_dim);
  if (cfg->num_key_value_heads < 1 || cfg->num_attention_heads % cfg->num_key_value_heads)
    return DF_FAIL(err, DF_ERR_INVALID, "num_key_value_heads", "num_attention_heads must be a multiple of it",
                   "%lld query heads cannot share %lld kv heads", (long long)cfg->num_attention_heads,
                   (long long)cfg->num_key_value_heads);
  if (cfg->dflash.num_target_layer_ids < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.target_layer_ids", "list the target layers fc reads",
                   "no target layers: fc would have no input");
  return DF_OK;
}

static void copy_sizes(df_draft_model *m, const df_draft_config *cfg) {
  m->L = cfg->num_hidden_layers;
  m->H = cfg->hidden_size;
  m->K = cfg->dflash.num_target_layer_ids;
  m->nH = cfg->num_attention_heads;
  m->nKV = cfg->num_key_value_heads;
  m->hd = cfg->head_dim;
  m->bs = cfg->block_size;
  m->eps = (float)cfg->rms_norm_eps;
}

static df_status zero_device(df_draft_model *m, float *dst, int64_t n, df_error *err);

// The FFNs' persistent device state (the MoE statistics record and stashes): one zeroed buffer, 16-float regions.
static df_status bind_ffn_state(df_draft_model *m, df_error *err) {
  int64_t total = 0;
  for (int64_t i = 0; i < m->L; i++)
    if (m->ffns[i]->vt->state_elems) total += (m->ffns[i]->vt->state_elems(m->ffns[i]) + 15) / 16 * 16;
  if (total == 0) return DF_OK;
  DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_FFN_STATE, sizeof(float) * (size_t)total, (void **)&m->ffn_state, err));
  DF_TRY(zero_device(m, m->ffn_state, total, err));
  float *p = m->ffn_state;
  for (int64_t i = 0; i < m->L; i++) {
    df_ffn *f = m->ffns[i];
    if (!f->vt->state_elems) continue;
    f->vt->bind_state(f, p);
    p += (f->vt->state_elems(f) + 15) / 16 * 16;
  }
  return DF_OK;
}

static df_status alloc_state(df_draft_model *m, df_error *err) {
  m->numel = df_params_numel(m->params);
  const size_t bytes = (size_t)m->numel * sizeof(float);
  const bool mixed = m->dt != DF_F32; // the masters are then a copy of their own, the forward's weights bf16
  DF_TRY(df_buffer_alloc_as(m->ctx, mixed ? DF_MEM_MASTERS : DF_MEM_WEIGHTS, bytes, (void **)&m->weights, err));
  DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_GRADS, bytes, (void **)&m->grads, err));
  // Alignment padding belongs to no parameter: zero it once so whole-buffer comparisons are defined.
  DF_TRY(zero_device(m, m->weights, m->numel, err));
  df_draft_model_zero_grads(m);
  if (mixed) {
    DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_WEIGHTS, (size_t)m->numel * df_dtype_size(m->dt), &m->params16, err));
    DF_TRY(df_draft_model_sync_params(m, err));
    df_params_set_compute(m->params, m->weights, m->params16, m->dt); // the binds below give bf16 weight views
  }
  if (m->cfg->kind == DF_DRAFT_EAGLE3)
    return df_eagle3_model_create(m->cfg, m->ctx, m->params, m->weights, m->grads, &m->eagle3, err);
  if (m->cfg->kind == DF_DRAFT_PEAGLE)
    return df_peagle_model_create(m->cfg, m->ctx, m->params, m->weights, m->grads, &m->peagle, err);
  DF_TRY(bind_top(m, "fc.weight", &m->fc, err));
  DF_TRY(bind_top(m, "hidden_norm.weight", &m->hidden_norm, err));
  DF_TRY(bind_top(m, "norm.weight", &m->norm, err));
  for (int64_t i = 0; i < m->L; i++)
    DF_TRY(draft_layer_bind(&m->layers[i], m->params, m->weights, m->grads, m->dev, err));
  if (m->cfg->kind == DF_DRAFT_DSPARK)
    DF_TRY(df_dspark_heads_create(m->cfg, m->ctx, m->params, m->weights, m->grads, &m->dspark, err));
  if (m->cfg->kind == DF_DRAFT_DOMINO)
    DF_TRY(df_domino_head_create(m->cfg, m->ctx, m->params, m->weights, m->grads, &m->domino, err));
  for (int64_t i = 0; i < m->L; i++) m->ffns[i] = m->layers[i].ffn;
  return bind_ffn_state(m, err);
}

static df_status build_rope(df_draft_model *m, df_error *err) {
  return df_rope_upload(&m->cfg->rope, m->hd, m->ctx, &m->inv_freq, &m->mscale, err);
}

df_status df_draft_model_create(const df_draft_config *cfg, df_ctx *ctx, df_draft_model **out, df_error *err) {
  return df_draft_model_create_as(cfg, ctx, DF_F32, out, err);
}

df_status df_draft_model_create_as(const df_draft_config *cfg, df_ctx *ctx, df_dtype storage, df_draft_model **out,
                                   df_error *err) {
  *out = NULL;
  DF_TRY(check_config(cfg, err));
  if (storage != DF_F32 && storage != DF_BF16)
    return DF_FAIL(err, DF_ERR_INVALID, "model.torch_dtype", "use bfloat16 or float32",
                   "the draft cannot store its activations as %s", df_dtype_name(storage));
  df_draft_model *m = calloc(1, sizeof *m);
  if (!m) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate the DFlash model");
  m->cfg = cfg;
  m->ctx = ctx;
  m->dev = df_ctx_device(ctx);
  m->dt = storage;
  copy_sizes(m, cfg);
  if (df_draft_is_eagle(cfg)) m->L = 0; // its layers are the EAGLE-3 / P-EAGLE model's (modeling/*eagle*_model.h)
  m->layers = calloc((size_t)m->L + 1, sizeof *m->layers);
  m->acts = calloc((size_t)m->L + 1, sizeof *m->acts);
  m->h = calloc((size_t)m->L + 1, sizeof *m->h);
  m->ffns = calloc((size_t)m->L + 1, sizeof *m->ffns);
  df_status st = m->layers && m->acts && m->h && m->ffns
                     ? DF_OK
                     : DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate %lld layers", (long long)m->L);
  if (st == DF_OK) st = build_table(m, err);
  if (st == DF_OK) st = alloc_state(m, err);
  if (st == DF_OK && !m->eagle3 && !m->peagle) st = build_rope(m, err);
  if (st != DF_OK) {
    df_draft_model_free(m);
    return st;
  }
  *out = m;
  return DF_OK;
}

void df_draft_model_free(df_draft_model *m) {
  if (!m) return;
  for (int64_t i = 0; m->layers && i < m->L; i++) draft_layer_free(&m->layers[i]);
  df_dspark_heads_free(m->dspark);
  df_eagle3_model_free(m->eagle3);
  df_peagle_model_free(m->peagle);
  df_domino_head_free(m->domino);
  df_buffer_free(m->ctx, m->weights);
  df_buffer_free(m->ctx, m->grads);
  df_buffer_free(m->ctx, m->params16);
  df_buffer_free(m->ctx, m->inv_freq);
  df_buffer_free(m->ctx, m->arena);
  df_buffer_free(m->ctx, m->ffn_state);
  df_params_free(m->params);
  free(m->host_pos);
  free(m->layers);
  free(m->acts);
  free(m->h);
  free(m->ffns);
  free(m);
}

const df_params *df_draft_model_params(const df_draft_model *m) { return m->params; }
float *df_draft_model_weights(df_draft_model *m) { return m->weights; }
float *df_draft_model_grads(df_draft_model *m) { return m->grads; }
df_dtype df_draft_model_storage(const df_draft_model *m) { return m->dt; }
void *df_draft_model_compute_params(df_draft_model *m) { return m->params16; }

df_status df_draft_model_sync_params(df_draft_model *m, df_error *err) {
  if (!m->params16) return DF_OK;
  df_tensor src = df_f32_on(m->dev, m->weights, m->numel), dst = df_view_on(m->dt, m->dev, m->params16, m->numel);
  return df_cast(m->ctx, &src, &dst, err);
}
int64_t df_draft_model_activation_bytes(const df_draft_model *m) {
  return m->eagle3   ? df_eagle3_activation_bytes(m->eagle3)
         : m->peagle ? df_peagle_activation_bytes(m->peagle)
                     : (int64_t)m->arena_used;
}
df_dspark_heads *df_draft_model_dspark_heads(df_draft_model *m) { return m->dspark; }
df_eagle3_model *df_draft_model_eagle3(df_draft_model *m) { return m->eagle3; }
df_peagle_model *df_draft_model_peagle(df_draft_model *m) { return m->peagle; }
df_domino_head *df_draft_model_domino_head(df_draft_model *m) { return m->domino; }

df_ffn *const *df_draft_model_ffns(const df_draft_model *m, int *n) {
  if (n) *n = (int)m->L;
  return m->ffns;
}
bool df_draft_model_is_moe(const df_draft_model *m) { return m->cfg->moe != NULL; }
df_ffn_set df_draft_model_ffn_set(const df_draft_model *m) {
  return (df_ffn_set){.kind = m->cfg->ffn_kind, .cfg = m->cfg->moe, .ffns = m->ffns, .n = (int)m->L};
}
void df_draft_model_set_training(df_draft_model *m, bool training) {
  if (m->cfg->ffn_kind) m->cfg->ffn_kind->set_training(m->ffns, (int)m->L, training);
}

// Zeroes n floats of device memory.
static df_status zero_device(df_draft_model *m, float *dst, int64_t n, df_error *err) {
  df_tensor t = df_f32_on(m->dev, dst, n);
  return df_fill(m->ctx, &t, 0.0, err);
}

void df_draft_model_zero_grads(df_draft_model *m) {
  df_error err = {0};
  if (zero_device(m, m->grads, m->numel, &err) != DF_OK) df_error_print(&err);
}

// ---- init and warm start -------------------------------------------------------------------------------

// A host buffer shaped like the flat parameters: the weights themselves on the CPU, a staging copy otherwise.
static df_status host_flat(df_draft_model *m, float **out, df_error *err) {
  *out = df_ctx_host_addressable(m->ctx) ? m->weights : malloc(sizeof(float) * (size_t)m->numel);
  if (!*out) return DF_FAIL(err, DF_ERR_NOMEM, "weights", NULL, "cannot stage %lld parameters", (long long)m->numel);
  return DF_OK;
}

static df_status host_flat_commit(df_draft_model *m, float *host, df_status st, df_error *err) {
  if (host != m->weights) {
    if (st == DF_OK) st = df_copy(m->ctx, m->weights, m->dev, host, DF_DEV_CPU, sizeof(float) * (size_t)m->numel, err);
    free(host);
  }
  return st == DF_OK ? df_draft_model_sync_params(m, err) : st;
}

// Weights of two or more dimensions (linear, router, embedding, the stacked MoE experts [E, out, in]) draw
// normals; norms are 1; biases, buffers and anything else 0. Every dense weight is 2-D, so the dense draws are
// unchanged by counting the stacked experts in. Domino's GRU weights (a uniform bound > 0) draw (2u − 1)·bound,
// torch.nn.GRU's own init (docs/domino-step.md §2).
static void init_entry(const df_param *e, float *flat, df_rng *rng, double std, double uniform_bound) {
  float *x = flat + e->offset;
  if (uniform_bound > 0) {
    for (int64_t j = 0; j < e->numel; j++) x[j] = (float)((2.0 * df_rng_uniform(rng) - 1.0) * uniform_bound);
    return;
  }
  const bool normal =
      e->ndim >= 2 && (e->role == DF_ROLE_WEIGHT || e->role == DF_ROLE_ROUTER || e->role == DF_ROLE_EMBED);
  for (int64_t j = 0; j < e->numel; j++)
    x[j] = normal ? (float)(std * df_rng_normal(rng)) : (e->role == DF_ROLE_NORM ? 1.0f : 0.0f);
}

df_status df_draft_model_init(df_draft_model *m, uint64_t seed, df_error *err) {
  float *host;
  DF_TRY(host_flat(m, &host, err));
  memset(host, 0, sizeof(float) * (size_t)m->numel); // alignment padding stays 0
  df_rng rng;
  df_rng_init(&rng, seed, DF_RNG_STREAM_INIT);
  for (int i = 0; i < df_params_count(m->params); i++) {
    const df_param *e = df_params_at(m->params, i);
    const double std = df_peagle_init_std(m->cfg, e->name); // P-EAGLE's mask_hidden: N(0, 1)
    init_entry(e, host, &rng, std > 0 ? std : m->cfg->initializer_range, df_domino_head_init_bound(m->cfg, e->name));
  }
  if (m->eagle3 || m->peagle) df_eagle3_init_buffers(m->params, host); // the identity vocabulary mapping
  const df_param *emb = m->peagle ? df_params_find(m->params, "embed_tokens.weight") : NULL;
  if (emb && m->cfg->eagle3.pad_token_id >= 0) // nn.Embedding zeroes its padding row
    memset(host + emb->offset + m->cfg->eagle3.pad_token_id * m->cfg->hidden_size, 0,
           sizeof(float) * (size_t)m->cfg->hidden_size);
  return host_flat_commit(m, host, DF_OK, err);
}

df_status df_draft_model_init_from_target(df_draft_model *m, const float *embed, int64_t vocab, int64_t hidden,
                                          df_error *err) {
  if (!m->peagle) return DF_OK;
  const df_param *e = df_params_find(m->params, "embed_tokens.weight");
  if (!e || e->numel != vocab * hidden)
    return DF_FAIL(err, DF_ERR_INVALID, "embed_tokens.weight",
                   "the draft's vocab_size and hidden_size are the target's",
                   "the target embedding is [%lld, %lld], the draft's embed_tokens holds %lld values", (long long)vocab,
                   (long long)hidden, e ? (long long)e->numel : 0LL);
  DF_TRY(df_copy(m->ctx, m->weights + e->offset, m->dev, embed, DF_DEV_CPU, sizeof(float) * (size_t)e->numel, err));
  return df_draft_model_sync_params(m, err);
}

df_status df_draft_model_load(df_draft_model *m, const char *path, df_error *err) {
  return df_draft_model_load_ex(m, path, false, err);
}

df_status df_draft_model_load_ex(df_draft_model *m, const char *path, bool centering_optional, df_error *err) {
  df_st_model *sm;
  DF_TRY(df_st_model_open(path, &sm, err));
  float *host;
  df_status st = host_flat(m, &host, err);
  if (st != DF_OK) {
    df_st_model_close(sm);
    return st;
  }
  // inv_freq is derived from the config, never a parameter (older HF checkpoints persisted it).
  // EAGLE-3 checkpoints may carry the frozen target embedding (SpecForge keeps it when it is not frozen): the draft
  // always embeds with the target's.
  static const char *const ignore[] = {"rotary_emb.inv_freq", "embed_tokens.weight"};
  df_load_options opt = {.ignore_suffixes = ignore, .n_ignore = m->eagle3 ? 2 : 1};
  if (m->dspark) opt.renames = df_dspark_heads_legacy_renames(&opt.n_renames); // logit_head.* (SpecForge)
  if (m->domino) opt.renames = df_domino_head_legacy_renames(&opt.n_renames);
  // A sparse FFN kind's tensors pass through its checkpoint layout; a dense draft loads strictly.
  if (m->cfg->ffn_kind)
    st = m->cfg->ffn_kind->load(m->cfg->moe, m->params, host, sm, &opt, centering_optional, err);
  else
    st = df_params_load_strict(m->params, host, sm, &opt, NULL, err);
  df_st_model_close(sm);
  return host_flat_commit(m, host, st, err);
}

// ---- activation arena ----------------------------------------------------------------------------------

typedef df_carver carver;

static void *carve(carver *c, int64_t bytes) { return df_carve(c, (size_t)bytes); }
static float *carve_f(carver *c, int64_t n) { return carve(c, n * (int64_t)sizeof(float)); }
// n elements of the storage dtype (activations and their gradients; statistics stay fp32: carve_f).
static float *carve_s(carver *c, df_dtype dt, int64_t n) { return carve(c, n * (int64_t)df_dtype_size(dt)); }

static void layout_layer(carver *c, df_dtype dt, const draft_layer *L, const dflash_dims *d, draft_layer_acts *a) {
  const int64_t T = d->T, KV = d->KV, H = d->H, qd = d->nH * d->hd, kvd = d->nKV * d->hd;
  *a = (draft_layer_acts){.x = carve_s(c, dt, T * H),
                          .rstd_in = carve_f(c, T),
                          .q_raw = carve_s(c, dt, T * qd),
                          .q_rstd = carve_f(c, T * d->nH),
                          .q = carve_s(c, dt, T * qd),
                          .k_raw = carve_s(c, dt, KV * kvd),
                          .k_rstd = carve_f(c, KV * d->nKV),
                          .k = carve_s(c, dt, KV * kvd),
                          .v = carve_s(c, dt, KV * kvd),
                          .attn = carve_s(c, dt, T * qd),
                          .lse = carve_f(c, T * d->nH),
                          .h_mid = carve_s(c, dt, T * H),
                          .y = carve_s(c, dt, T * H),
                          .rstd_post = carve_f(c, T),
                          .ffn_saved = carve_s(c, dt, L->ffn->vt->saved_elems(L->ffn, T))};
}

static void layout_scratch(carver *c, const df_draft_model *m, const dflash_dims *d, dflash_scratch *s) {
  const df_dtype dt = m->dt;
  const int64_t T = d->T, KV = d->KV, H = d->H, qd = d->nH * d->hd, kvd = d->nKV * d->hd;
  int64_t ffn = 0;
  for (int64_t i = 0; i < m->L; i++) {
    const df_ffn *f = m->layers[i].ffn;
    const int64_t n = f->vt->scratch_elems(f, T);
    ffn = n > ffn ? n : ffn;
  }
  *s = (dflash_scratch){.dh = carve_s(c, dt, T * H),
                        .dtmp = carve_s(c, dt, T * H),
                        .dattn = carve_s(c, dt, T * qd),
                        .dq = carve_s(c, dt, T * qd),
                        .dk = carve_s(c, dt, KV * kvd),
                        .dk_raw = carve_s(c, dt, KV * kvd),
                        .dv = carve_s(c, dt, KV * kvd),
                        .dctx = carve_s(c, dt, d->C * H),
                        .ffn = carve_s(c, dt, ffn)};
}

static void layout(carver *c, df_draft_model *m, const dflash_dims *d) {
  const int64_t T = d->T, C = d->C, H = d->H;
  const df_dtype dt = m->dt;
  m->th = carve_s(c, dt, C * m->K * H);
  m->th32 = dt != DF_F32 ? carve_f(c, C * m->K * H) : NULL;
  m->fc_out = carve_s(c, dt, C * H);
  m->ctx_h = carve_s(c, dt, C * H);
  m->ctx_rstd = carve_f(c, C);
  m->dfc = carve_s(c, dt, C * H);
  for (int64_t i = 0; i <= m->L; i++) m->h[i] = carve_s(c, dt, T * H);
  m->out = carve_s(c, dt, T * H);
  m->out_rstd = carve_f(c, T);
  m->pos_q = carve(c, T * (int64_t)sizeof(int32_t));
  m->pos_kv = carve(c, d->KV * (int64_t)sizeof(int32_t));
  m->anchors = carve(c, d->B * d->N * (int64_t)sizeof(int32_t));
  m->keep = carve(c, d->B * d->N);
  for (int64_t i = 0; i < m->L; i++) layout_layer(c, dt, &m->layers[i], d, &m->acts[i]);
  layout_scratch(c, m, d, &m->scr);
}

// Lays the arena out for d, reallocating only when the new layout does not fit.
static df_status ensure_arena(df_draft_model *m, const dflash_dims *d, df_error *err) {
  carver measure = {0};
  layout(&measure, m, d);
  if (measure.off > m->arena_cap) {
    df_buffer_free(m->ctx, m->arena);
    m->arena = NULL;
    m->arena_cap = 0;
    DF_TRY(df_buffer_alloc_as(m->ctx, DF_MEM_ACTIVATIONS, measure.off, &m->arena, err));
    m->arena_cap = measure.off;
  }
  if (d->T + d->KV > m->host_pos_cap) {
    free(m->host_pos);
    m->host_pos = malloc(sizeof(int32_t) * (size_t)(d->T + d->KV));
    m->host_pos_cap = m->host_pos ? d->T + d->KV : 0;
    if (!m->host_pos) return DF_FAIL(err, DF_ERR_NOMEM, "positions", NULL, "cannot stage the position ids");
  }
  carver c = {.base = m->arena};
  layout(&c, m, d);
  m->arena_used = c.off;
  m->dims = *d;
  return DF_OK;
}

// ---- forward -------------------------------------------------------------------------------------------

static df_status check_batch(const df_draft_model *m, const df_draft_batch *b, df_error *err) {
  if (!b || !b->target_hidden || !b->block_embed || !b->anchors || !b->keep)
    return DF_FAIL(err, DF_ERR_INVALID, "batch", "fill target_hidden, block_embed, anchors and keep",
                   "incomplete DFlash batch");
  if (b->B < 1 || b->S < 1 || b->N < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "batch", NULL, "batch sizes B=%lld S=%lld N=%lld must all be >= 1",
                   (long long)b->B, (long long)b->S, (long long)b->N);
  if (b->S + b->N * m->bs >= INT32_MAX)
    return DF_FAIL(err, DF_ERR_INVALID, "batch.S", NULL, "context + block rows exceed int32 positions");
  if (!b->on_device && (!b->pos_q) != (!b->pos_kv))
    return DF_FAIL(err, DF_ERR_INVALID, "batch.pos_q", "pass both position arrays or neither", "half the positions");
  if (b->on_device && (!b->pos_q || !b->pos_kv))
    return DF_FAIL(err, DF_ERR_INVALID, "batch.pos_q", "stage the positions with the batch (strategies/dflash/stage.c)",
                   "a device batch needs its position ids");
  if (b->on_device && !df_ctx_host_addressable(m->ctx)) return DF_OK; // validated on the host where it was built
  for (int64_t i = 0; i < b->B * b->N; i++) {
    if (!b->keep[i] || (b->anchors[i] >= 0 && b->anchors[i] < b->S)) continue;
    char where[64];
    snprintf(where, sizeof where, "anchors[%lld,%lld]", (long long)(i / b->N), (long long)(i % b->N));
    return DF_FAIL(err, DF_ERR_INVALID, where, "anchors of kept blocks index the context: 0 <= anchor < S",
                   "anchor %d is outside [0, %lld)", b->anchors[i], (long long)b->S);
  }
  return DF_OK;
}

static dflash_dims make_dims(const df_draft_model *m, const df_draft_batch *b) {
  const int64_t Q = b->N * m->bs;
  return (dflash_dims){.B = b->B,
                       .S = b->S,
                       .N = b->N,
                       .bs = m->bs,
                       .Q = Q,
                       .T = b->B * Q,
                       .C = b->B * b->S,
                       .KV = b->B * (b->S + Q),
                       .H = m->H,
                       .nH = m->nH,
                       .nKV = m->nKV,
                       .hd = m->hd};
}

void df_draft_fill_positions(int64_t B, int64_t S, int64_t N, int64_t bs, const int32_t *anchors, const uint8_t *keep,
                             int32_t *pos_q, int32_t *pos_kv) {
  const int64_t Q = N * bs;
  for (int64_t s = 0; s < B; s++)
    for (int64_t n = 0; n < N; n++) {
      const int64_t i = s * N + n;
      const int32_t a = keep[i] ? anchors[i] : 0;
      for (int64_t k = 0; k < bs; k++) pos_q[i * bs + k] = a + (int32_t)k;
    }
  for (int64_t s = 0; s < B; s++) {
    int32_t *row = pos_kv + s * (S + Q);
    for (int64_t j = 0; j < S; j++) row[j] = (int32_t)j;
    memcpy(row + S, pos_q + s * Q, sizeof(int32_t) * (size_t)Q);
  }
}

static df_status put(df_draft_model *m, void *dst, const void *src, df_device src_dev, int64_t bytes, df_error *err) {
  return df_copy(m->ctx, dst, m->dev, src, src_dev, (size_t)bytes, err);
}

// The model keeps its own copy of the batch: the backward reads it again after the caller moved on.
static df_status upload_batch(df_draft_model *m, const df_draft_batch *b, df_error *err) {
  const dflash_dims *d = &m->dims;
  const int64_t f = (int64_t)sizeof(float), i4 = (int64_t)sizeof(int32_t);
  const df_device src = b->on_device ? m->dev : DF_DEV_CPU;
  const int32_t *pq = b->pos_q, *pkv = b->pos_kv;
  df_device pos_src = src;
  if (!pq) { // host anchors: derive the positions here
    df_draft_fill_positions(d->B, d->S, d->N, d->bs, b->anchors, b->keep, m->host_pos, m->host_pos + d->T);
    pq = m->host_pos, pkv = m->host_pos + d->T, pos_src = DF_DEV_CPU;
  }
  if (m->th32) { // the batch's fp32 features, rounded once into the storage dtype
    DF_TRY(put(m, m->th32, b->target_hidden, src, d->C * m->K * d->H * f, err));
    df_tensor t32 = df_f32_on(m->dev, m->th32, d->C * m->K * d->H),
              ts = df_view_on(m->dt, m->dev, m->th, d->C * m->K * d->H);
    DF_TRY(df_cast(m->ctx, &t32, &ts, err));
  } else {
    DF_TRY(put(m, m->th, b->target_hidden, src, d->C * m->K * d->H * f, err));
  }
  DF_TRY(put(m, m->h[0], b->block_embed, src, d->T * d->H * (int64_t)df_dtype_size(m->dt), err)); // storage dtype
  DF_TRY(put(m, m->anchors, b->anchors, src, d->B * d->N * i4, err));
  DF_TRY(put(m, m->keep, b->keep, src, d->B * d->N, err));
  DF_TRY(put(m, m->pos_q, pq, pos_src, d->T * i4, err));
  return put(m, m->pos_kv, pkv, pos_src, d->KV * i4, err);
}

// A storage-dtype matrix (activations, their gradients).
static df_tensor smat(const df_draft_model *m, const void *p, int64_t rows, int64_t cols) {
  return df_view((void *)p, m->dt, m->dev, 2, (const int64_t[]){rows, cols});
}
static df_tensor row(const float *p, df_device dev, int64_t n) {
  return df_view((void *)p, DF_F32, dev, 1, (const int64_t[]){n});
}

static dflash_shared shared_inputs(const df_draft_model *m) {
  return (dflash_shared){.ctx = m->ctx_h,
                         .pos_q = m->pos_q,
                         .pos_kv = m->pos_kv,
                         .anchors = m->anchors,
                         .keep = m->keep,
                         .inv_freq = m->inv_freq,
                         .mscale = m->mscale,
                         .eps = m->eps,
                         .dev = m->dev,
                         .dt = m->dt};
}

// ctx = hidden_norm(fc(target_hidden)), once for all layers.
static df_status context_forward(df_draft_model *m, df_error *err) {
  const int64_t C = m->dims.C, H = m->H;
  df_tensor th = smat(m, m->th, C, m->K * H), fc = smat(m, m->fc_out, C, H);
  df_tensor ctx = smat(m, m->ctx_h, C, H), r = row(m->ctx_rstd, m->dev, C);
  DF_TRY(df_linear_forward(m->ctx, &th, &m->fc.w, NULL, &fc, err));
  return df_rmsnorm_forward(m->ctx, &fc, &m->hidden_norm.w, m->eps, &ctx, &r, err);
}

df_status df_draft_model_forward(df_draft_model *m, const df_draft_batch *batch, const float **out_hidden,
                                 df_error *err) {
  if (out_hidden) *out_hidden = NULL;
  m->have_forward = false;
  if (m->eagle3 || m->peagle)
    return DF_FAIL(err, DF_ERR_INVALID, "draft", "run EAGLE-3 / P-EAGLE drafts through their strategy (strategies/)",
                   "an EAGLE-3 draft has no block forward");
  DF_TRY(check_batch(m, batch, err));
  const dflash_dims d = make_dims(m, batch);
  DF_TRY(ensure_arena(m, &d, err));
  if (m->cfg->ffn_kind) // MoE sample centering: one sample's N·bs block rows
    m->cfg->ffn_kind->set_rows_per_sample(m->ffns, (int)m->L, d.Q);
  DF_TRY(upload_batch(m, batch, err));
  DF_TRY(context_forward(m, err));
  const dflash_shared sh = shared_inputs(m);
  const df_ffn_set fs = df_draft_model_ffn_set(m);
  df_ffn_set_stats(&fs, batch->ffn_stats, batch->ffn_stats_den); // this forward's statistics go there (or nowhere)
  df_status st = DF_OK;
  for (int64_t i = 0; i < m->L && st == DF_OK; i++)
    st = draft_layer_forward(m->ctx, &m->layers[i], &d, &sh, m->h[i], m->h[i + 1], &m->acts[i], &m->scr, err);
  df_ffn_set_stats(&fs, NULL, 0.0);
  DF_TRY(st);
  df_tensor hL = smat(m, m->h[m->L], d.T, m->H), out = smat(m, m->out, d.T, m->H);
  df_tensor r = row(m->out_rstd, m->dev, d.T);
  DF_TRY(df_rmsnorm_forward(m->ctx, &hL, &m->norm.w, m->eps, &out, &r, err));
  m->have_forward = true;
  if (out_hidden) *out_hidden = m->out;
  return DF_OK;
}

// ---- backward ------------------------------------------------------------------------------------------

// ∂ctx (summed over layers) → hidden_norm → fc.weight; target_hidden takes no gradient.
static df_status context_backward(df_draft_model *m, df_error *err) {
  const int64_t C = m->dims.C, H = m->H;
  df_tensor dctx = smat(m, m->scr.dctx, C, H), fc = smat(m, m->fc_out, C, H);
  df_tensor dfc = smat(m, m->dfc, C, H), r = row(m->ctx_rstd, m->dev, C);
  df_tensor th = smat(m, m->th, C, m->K * H);
  DF_TRY(df_rmsnorm_backward(m->ctx, &dctx, &fc, &m->hidden_norm.w, &r, &dfc, false, &m->hidden_norm.g, err));
  return df_linear_backward(m->ctx, &dfc, &th, &m->fc.w, NULL, false, &m->fc.g, NULL, err);
}

void df_draft_model_on_grads_ready(df_draft_model *m, df_grads_ready_fn fn, void *user) {
  m->grads_ready = fn, m->grads_ready_user = user;
}

// The gradient from the parameter whose view is v to the end of the flat buffer is complete.
static df_status grads_ready_from(df_draft_model *m, const dflash_pview *v, df_error *err) {
  if (!m->grads_ready) return DF_OK;
  return m->grads_ready(m->grads_ready_user, (int64_t)((const float *)v->g.data - m->grads), err);
}

df_status df_draft_model_backward(df_draft_model *m, const float *d_hidden, df_error *err) {
  if (!m->have_forward)
    return DF_FAIL(err, DF_ERR_INVALID, "backward", "run df_draft_model_forward first",
                   "no forward to differentiate (none yet, or the last one failed)");
  if (!d_hidden) return DF_FAIL(err, DF_ERR_INVALID, "d_hidden", NULL, "d_hidden is NULL");
  const dflash_dims *d = &m->dims;
  df_tensor dout = smat(m, d_hidden, d->T, m->H), hL = smat(m, m->h[m->L], d->T, m->H);
  df_tensor dh = smat(m, m->scr.dh, d->T, m->H), r = row(m->out_rstd, m->dev, d->T);
  DF_TRY(df_rmsnorm_backward(m->ctx, &dout, &hL, &m->norm.w, &r, &dh, false, &m->norm.g, err));
  DF_TRY(grads_ready_from(m, &m->norm, err));
  const dflash_shared sh = shared_inputs(m);
  for (int64_t i = m->L - 1; i >= 0; i--) {
    DF_TRY(draft_layer_backward(m->ctx, &m->layers[i], d, &sh, m->h[i], &m->acts[i], &m->scr, i == m->L - 1, err));
    DF_TRY(grads_ready_from(m, &m->layers[i].in_norm, err)); // a layer's parameters start with input_layernorm
  }
  // scr.dh now holds ∂/∂block_embed: the frozen target embedding takes no gradient.
  return context_backward(m, err);
}
