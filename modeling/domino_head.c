// Domino's GRU correction head (modeling/domino_head.h): parameters, forward and backward over the block rows,
// legacy checkpoint names. Every step is an op on the head's context: the frozen embedding gather, the GRU's input
// projection (one GEMM for every step), the GRU (kernels/ops_domino.h), df_copy_2d for [h ; s] and the gradient
// splits, embed_proj.0 and the masked SiLU. The forward's tensors and the backward's scratch live in one device
// buffer, regrown only when a batch needs more rows.
#include "modeling/domino_head.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  df_tensor w, g; // the parameter and its gradient, views into the model's flat buffers
} dm_pview;

struct df_domino_head {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_device dev;
  int64_t V, H, G, E, ss, steps; // ss = suffix_start
  bool shift;
  dm_pview w_ih, w_hh, w1, w2;

  // The last forward (R rows in nb blocks) and the backward's scratch: pieces of one device buffer.
  int64_t nb, bs, R;
  bool have_forward;
  void *arena;
  size_t cap;
  df_dtype dt;              // the draft's storage dtype: hidden, corr, dcorr and dhidden are held in it
  const void *hidden;       // [R, H] borrowed
  const uint8_t *corrected; // [R] borrowed (the stage's)
  float *h32;               // bf16 storage: [R, H] the hidden rows cast up; the backward's d(hidden) sum
  void *c16;                // bf16 storage: [R, E] the correction latent the fused LM head reads
  float *dc32;              // bf16 storage: [R, E] dcorr cast up
  float *x;                 // [R, H] embed(head tokens)
  float *gi;                // [R, 3G] x·W_ihᵀ; the backward's dgi
  float *s, *gates;         // [R, G], [R, 4G]
  float *f;                 // [R, H + G] [h ; s']
  float *p, *a;             // [R, E] embed_proj.0 output, silu(p) masked; the backward's dp reuses a
  float *df, *ds;           // [R, H + G], [R, G]
};

// ---- config helpers ------------------------------------------------------------------------------------------

int64_t df_domino_suffix_start(const df_draft_config *cfg) {
  const df_dflash_config *d = &cfg->dflash;
  return d->shift_label ? d->pure_draft_prefix_len : 1 + d->pure_draft_prefix_len;
}

int64_t df_domino_gru_steps(const df_draft_config *cfg) {
  return cfg->dflash.shift_label ? cfg->block_size : cfg->block_size - 1;
}

// ---- parameters ----------------------------------------------------------------------------------------------

df_status df_domino_head_add_params(const df_draft_config *cfg, df_params *p, df_error *err) {
  if (cfg->kind != DF_DRAFT_DOMINO) return DF_OK;
  const int64_t G = cfg->dflash.gru_hidden_dim, E = cfg->dflash.emb_dim, H = cfg->hidden_size, V = cfg->vocab_size;
  if (G < 1 || E < 1 || V < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.gru_hidden_dim", "set emb_dim and gru_hidden_dim >= 1",
                   "%s: a Domino head needs emb_dim, gru_hidden_dim and vocab_size >= 1", cfg->source);
  DF_TRY(df_params_add_f32(p, DF_DOMINO_GRU_IH, DF_ROLE_WEIGHT, 2, 3 * G, H, err));
  DF_TRY(df_params_add_f32(p, DF_DOMINO_GRU_HH, DF_ROLE_WEIGHT, 2, 3 * G, G, err));
  DF_TRY(df_params_add_f32(p, DF_DOMINO_PROJ0, DF_ROLE_WEIGHT, 2, E, H + G, err));
  return df_params_add_f32(p, DF_DOMINO_PROJ2, DF_ROLE_WEIGHT, 2, V, E, err);
}

double df_domino_head_init_bound(const df_draft_config *cfg, const char *name) {
  if (cfg->kind != DF_DRAFT_DOMINO || strncmp(name, DF_DOMINO_GRU_PREF, strlen(DF_DOMINO_GRU_PREF)) != 0) return 0.0;
  return 1.0 / sqrt((double)cfg->dflash.gru_hidden_dim);
}

static df_status bind(df_domino_head *h, const df_params *p, const char *name, float *w, float *g, dm_pview *v,
                      df_error *err) {
  return df_params_bind(p, name, w, g, h->dev, &v->w, &v->g, err);
}

// The fp32 master view (mixed precision: the GRU and embed_proj.0 read their fp32 masters).
static df_status bind_f32(df_domino_head *h, const df_params *p, const char *name, float *w, float *g, dm_pview *v,
                          df_error *err) {
  return df_params_bind_masters(p, name, w, g, h->dev, &v->w, &v->g, err);
}

df_status df_domino_head_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                float *grads, df_domino_head **out, df_error *err) {
  *out = NULL;
  df_domino_head *h = calloc(1, sizeof *h);
  if (!h) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate the Domino head");
  h->cfg = cfg, h->ctx = ctx, h->dev = df_ctx_device(ctx);
  h->V = cfg->vocab_size, h->H = cfg->hidden_size, h->G = cfg->dflash.gru_hidden_dim, h->E = cfg->dflash.emb_dim;
  h->ss = df_domino_suffix_start(cfg), h->steps = df_domino_gru_steps(cfg), h->shift = cfg->dflash.shift_label;
  // Mixed precision: embed_proj.2 meets the bf16 hidden rows and LM head in the fused op, so it takes the forward's
  // bf16 view (its gradient stays fp32); the GRU and embed_proj.0 are an fp32 island on the masters, cast at its
  // boundary (the hidden rows and dcorr up, the latent and d(hidden) down).
  df_status st = bind(h, p, DF_DOMINO_PROJ2, weights, grads, &h->w2, err);
  h->dt = h->w2.w.dtype;
  if (st == DF_OK) st = bind_f32(h, p, DF_DOMINO_GRU_IH, weights, grads, &h->w_ih, err);
  if (st == DF_OK) st = bind_f32(h, p, DF_DOMINO_GRU_HH, weights, grads, &h->w_hh, err);
  if (st == DF_OK) st = bind_f32(h, p, DF_DOMINO_PROJ0, weights, grads, &h->w1, err);
  if (st != DF_OK) {
    df_domino_head_free(h);
    return st;
  }
  *out = h;
  return DF_OK;
}

void df_domino_head_free(df_domino_head *h) {
  if (!h) return;
  df_buffer_free(h->ctx, h->arena);
  free(h);
}

const df_tensor *df_domino_head_w2(const df_domino_head *h) { return h ? &h->w2.w : NULL; }
df_tensor *df_domino_head_w2_grad(df_domino_head *h) { return h ? &h->w2.g : NULL; }
int64_t df_domino_head_emb_dim(const df_domino_head *h) { return h ? h->E : 0; }

static const df_rename LEGACY[] = {{"logit_head.prefix_gru.", "prefix_gru."},
                                   {"logit_head.embed_proj.", "embed_proj."}};

const df_rename *df_domino_head_legacy_renames(int *n) {
  *n = (int)(sizeof LEGACY / sizeof LEGACY[0]);
  return LEGACY;
}

// ---- buffers -------------------------------------------------------------------------------------------------

// The arena's layout for R rows (each piece 64-byte aligned); with base NULL only the size is computed.
static size_t carve(df_domino_head *h, char *base, int64_t R) {
  const int64_t H = h->H, G = h->G, E = h->E;
  size_t at = 0;
#define PIECE(field, n)                                                                                                \
  do {                                                                                                                 \
    h->field = base ? (float *)(void *)(base + at) : NULL;                                                             \
    at += ((size_t)(n) * sizeof(float) + 63) / 64 * 64;                                                                \
  } while (0)
  PIECE(x, R * H);
  PIECE(gi, R * 3 * G);
  PIECE(s, R * G);
  PIECE(gates, R * 4 * G);
  PIECE(f, R * (H + G));
  PIECE(p, R * E);
  PIECE(a, R * E);
  PIECE(df, R * (H + G));
  PIECE(ds, R * G);
  const int64_t mixed = h->dt != DF_F32; // the fp32 island's staging (see df_domino_head_create)
  PIECE(h32, mixed * R * H);
  PIECE(c16, mixed * R * E);
  PIECE(dc32, mixed * R * E);
#undef PIECE
  return at;
}

static df_status ensure(df_domino_head *h, int64_t R, df_error *err) {
  const size_t need = carve(h, NULL, R);
  if (need > h->cap) {
    df_buffer_free(h->ctx, h->arena);
    h->arena = NULL, h->cap = 0;
    if (df_buffer_alloc_as(h->ctx, DF_MEM_ACTIVATIONS, need, &h->arena, err) != DF_OK) {
      h->arena = NULL;
      return DF_FAIL(err, DF_ERR_NOMEM, "domino head", "lower training.num_anchors or training.batch_size",
                     "out of memory for the Domino head on %lld rows (%.1f MiB)", (long long)R,
                     (double)need / (1 << 20));
    }
    h->cap = need;
  }
  carve(h, h->arena, R);
  return DF_OK;
}

// ---- op helpers ----------------------------------------------------------------------------------------------

static df_tensor mat(const df_domino_head *h, const float *p, int64_t rows, int64_t cols) {
  return df_f32_on(h->dev, (float *)p, rows, cols);
}

static df_status copy2d(df_domino_head *h, const float *src, int64_t src_n, float *dst, int64_t dst_n,
                        df_copy_2d_desc d, df_error *err) {
  df_tensor s = df_f32_on(h->dev, (float *)src, src_n), t = df_f32_on(h->dev, dst, dst_n);
  return df_copy_2d(h->ctx, &d, &s, &t, err);
}

// The GRU state each row's correction reads into f[:, H:]: s_k (shift_label) or s_{k−1} (row r takes s row r − 1;
// the first slot of a block then takes the previous block's last row, which the GRU leaves 0 and no corrected slot
// reads, and row 0 takes 0).
static df_status gather_state(df_domino_head *h, df_error *err) {
  const int64_t R = h->R, H = h->H, G = h->G, W = H + G;
  if (h->shift)
    return copy2d(h, h->s, R * G, h->f, R * W,
                  (df_copy_2d_desc){.rows = R, .cols = G, .src_stride = G, .dst_offset = H, .dst_stride = W}, err);
  df_tensor f0 = df_f32_on(h->dev, h->f, W); // row 0
  DF_TRY(df_fill(h->ctx, &f0, 0.0, err));
  if (R < 2) return DF_OK;
  return copy2d(h, h->s, R * G, h->f, R * W,
                (df_copy_2d_desc){.rows = R - 1, .cols = G, .src_stride = G, .dst_offset = W + H, .dst_stride = W},
                err);
}

// ---- forward -------------------------------------------------------------------------------------------------

df_status df_domino_head_forward(df_domino_head *h, const df_domino_head_in *in, const void **corr, df_error *err) {
  *corr = NULL;
  h->have_forward = false;
  if (!in || in->nblocks < 1 || in->bs != h->cfg->block_size || !in->hidden || !in->head_ids || !in->corrected ||
      !in->embed)
    return DF_FAIL(err, DF_ERR_INVALID, "domino head", NULL, "bad head input: %lld blocks of %lld rows",
                   in ? (long long)in->nblocks : 0LL, in ? (long long)in->bs : 0LL);
  const int64_t R = in->nblocks * in->bs, H = h->H, G = h->G, E = h->E;
  DF_TRY(ensure(h, R, err));
  h->nb = in->nblocks, h->bs = in->bs, h->R = R, h->hidden = in->hidden, h->corrected = in->corrected;
  const bool mixed = h->dt != DF_F32;
  df_tensor ids = df_i32_on(h->dev, (int32_t *)in->head_ids, R), x = mat(h, h->x, R, H);
  if (mixed) { // the bf16 embedding rows into h32 (free until the hidden rows arrive), cast up once
    df_tensor x16 = df_view_on(h->dt, h->dev, h->h32, R, H);
    DF_TRY(df_embedding_forward(h->ctx, in->embed, &ids, &x16, err));
    DF_TRY(df_cast(h->ctx, &x16, &x, err));
  } else {
    DF_TRY(df_embedding_forward(h->ctx, in->embed, &ids, &x, err));
  }
  df_tensor gi = mat(h, h->gi, R, 3 * G), s = mat(h, h->s, R, G), gates = mat(h, h->gates, R, 4 * G);
  DF_TRY(df_linear_forward(h->ctx, &x, &h->w_ih.w, NULL, &gi, err));
  const df_gru_desc gd = {.steps = h->steps, .stride = h->bs};
  DF_TRY(df_gru_forward(h->ctx, &gd, &gi, &h->w_hh.w, &s, &gates, err));
  const float *hid = h->hidden;
  if (mixed) {
    df_tensor h16 = df_view_on(h->dt, h->dev, (void *)h->hidden, R, H), h32 = mat(h, h->h32, R, H);
    DF_TRY(df_cast(h->ctx, &h16, &h32, err));
    hid = h->h32;
  }
  DF_TRY(copy2d(h, hid, R * H, h->f, R * (H + G),
                (df_copy_2d_desc){.rows = R, .cols = H, .src_stride = H, .dst_stride = H + G}, err));
  DF_TRY(gather_state(h, err));
  df_tensor f = mat(h, h->f, R, H + G), p = mat(h, h->p, R, E), a = mat(h, h->a, R, E);
  DF_TRY(df_linear_forward(h->ctx, &f, &h->w1.w, NULL, &p, err));
  df_tensor m = df_u8_on(h->dev, (uint8_t *)h->corrected, R);
  DF_TRY(df_masked_silu_forward(h->ctx, &p, &m, &a, err));
  if (mixed) {
    df_tensor c16 = df_view_on(h->dt, h->dev, h->c16, R, E);
    DF_TRY(df_cast(h->ctx, &a, &c16, err));
  }
  h->have_forward = true;
  *corr = mixed ? h->c16 : h->a;
  return DF_OK;
}

// ---- backward ------------------------------------------------------------------------------------------------

// dL/ds of every row from f's state columns: df[:, H:] itself (shift_label) or moved up one row (row r's state is
// s row r − 1); the last row, which no correction reads, gets 0.
static df_status scatter_state(df_domino_head *h, df_error *err) {
  const int64_t R = h->R, H = h->H, G = h->G, W = H + G;
  if (h->shift)
    return copy2d(h, h->df, R * W, h->ds, R * G,
                  (df_copy_2d_desc){.rows = R, .cols = G, .src_offset = H, .src_stride = W, .dst_stride = G}, err);
  df_tensor last = df_f32_on(h->dev, h->ds + (R - 1) * G, G);
  DF_TRY(df_fill(h->ctx, &last, 0.0, err));
  if (R < 2) return DF_OK;
  return copy2d(h, h->df, R * W, h->ds, R * G,
                (df_copy_2d_desc){.rows = R - 1, .cols = G, .src_offset = W + H, .src_stride = W, .dst_stride = G},
                err);
}

df_status df_domino_head_backward(df_domino_head *h, const void *dcorr, void *dhidden, df_error *err) {
  if (!h->have_forward)
    return DF_FAIL(err, DF_ERR_INVALID, "domino head", "run df_domino_head_forward first", "no forward to undo");
  if (!dcorr || !dhidden) return DF_FAIL(err, DF_ERR_INVALID, "dcorr", NULL, "dcorr or dhidden is NULL");
  h->have_forward = false; // dp and dgi overwrite the forward's a and gi
  const int64_t R = h->R, H = h->H, G = h->G, E = h->E, W = H + G;
  const bool mixed = h->dt != DF_F32;
  df_tensor p = mat(h, h->p, R, E), dc = mat(h, mixed ? h->dc32 : dcorr, R, E), dp = mat(h, h->a, R, E);
  if (mixed) {
    df_tensor dc16 = df_view_on(h->dt, h->dev, (void *)dcorr, R, E);
    DF_TRY(df_cast(h->ctx, &dc16, &dc, err));
  }
  df_tensor m = df_u8_on(h->dev, (uint8_t *)h->corrected, R);
  DF_TRY(df_masked_silu_backward(h->ctx, &p, &m, &dc, &dp, err));
  df_tensor f = mat(h, h->f, R, W), df = mat(h, h->df, R, W);
  DF_TRY(df_linear_backward(h->ctx, &dp, &f, &h->w1.w, &df, false, &h->w1.g, NULL, err));
  // d(hidden) += df[:, :H]; in bf16 the sum is formed in fp32 and rounded once
  df_tensor dh16 = df_view_on(h->dt, h->dev, dhidden, R, H), dh32 = mat(h, h->h32, R, H);
  if (mixed) DF_TRY(df_cast(h->ctx, &dh16, &dh32, err));
  DF_TRY(copy2d(h, h->df, R * W, mixed ? h->h32 : dhidden, R * H,
                (df_copy_2d_desc){.rows = R, .cols = H, .src_stride = W, .dst_stride = H, .accumulate = true}, err));
  if (mixed) DF_TRY(df_cast(h->ctx, &dh32, &dh16, err));
  DF_TRY(scatter_state(h, err));
  const df_gru_desc gd = {.steps = h->steps, .stride = h->bs};
  df_tensor s = mat(h, h->s, R, G), gates = mat(h, h->gates, R, 4 * G), ds = mat(h, h->ds, R, G);
  df_tensor dgi = mat(h, h->gi, R, 3 * G), x = mat(h, h->x, R, H);
  DF_TRY(df_gru_backward(h->ctx, &gd, &h->w_hh.w, &s, &gates, &ds, &dgi, &h->w_hh.g, err));
  return df_linear_backward(h->ctx, &dgi, &x, &h->w_ih.w, NULL, false, &h->w_ih.g, NULL, err);
}
