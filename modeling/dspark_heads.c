// DSpark Markov and confidence heads (modeling/dspark_heads.h): parameters, forward and backward over the
// block rows, legacy checkpoint names, and the export config normalization. Every step of the math is an op on the
// heads' context (GEMMs, the embedding gather, df_copy_2d for the row concatenations and gradient splits, the
// Markov gate and rnn cell ops); the forward's tensors and the backward's scratch live in one device buffer.
#include "modeling/dspark_heads.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W1_NAME     "markov_head.markov_w1.weight"
#define W2_NAME     "markov_head.markov_w2.weight"
#define GATE_W_NAME "markov_head.gate_proj.weight"
#define GATE_B_NAME "markov_head.gate_proj.bias"
#define JNT_W_NAME  "markov_head.joint_proj.weight"
#define JNT_B_NAME  "markov_head.joint_proj.bias"
#define CONF_W_NAME "confidence_head.proj.weight"
#define CONF_B_NAME "confidence_head.proj.bias"

typedef struct {
  df_tensor w, g; // the parameter and its gradient, views into the model's flat buffers
} ds_pview;

struct df_dspark_heads {
  const df_draft_config *cfg;
  df_ctx *ctx;
  df_device dev;
  df_dtype dt;     // storage of the activations and of the weight views (the draft's: f32, or bf16 with fp32 grads)
  int64_t V, H, r; // r = 0: no Markov head
  df_markov_head_type type;
  bool conf, conf_markov;
  ds_pview w1, w2, proj_w, proj_b, conf_w, conf_b; // proj: gate_proj (gated) or joint_proj (rnn)

  // The last forward and its backward's scratch: pieces of one device buffer (`arena`, cap bytes), laid out for
  // R rows (nb blocks) by carve(); regrown only when a batch needs more.
  int64_t nb, bs, R;
  bool have_forward;
  void *arena;
  size_t cap;
  const float *hidden; // [R, H] borrowed (device memory of ctx)
  int32_t *prev;       // [R]
  float *e;            // [R, r] W1[prev]
  float *u;            // [R, r] latent (gated, rnn; vanilla uses e)
  float *gin;          // gated: [R, H + r] gate_proj input
  float *gate;         // gated: [R, r] σ(gate_proj(gin))
  float *z, *y, *s;    // rnn, slot-major: [bs, nb, 2r + H] inputs, [bs, nb, 3r] outputs, [bs, nb, r] states
  float *cin;          // confidence with Markov: [R, H + r]
  float *conf_out;     // [R] fp32 (the fused loss reads fp32 logits)
  float *conf_s;       // [R] the confidence head's output in the storage dtype (bf16 storage only)
  float *dconf_s;      // [R] d(confidence logit) in the storage dtype (bf16 storage only)
  float *de;           // backward: [R, r] dL/de
  float *da, *dgin;    // gated backward: [R, r], [R, H + r]
  float *ds, *dy, *dz; // rnn backward: [nb, r], [nb, 3r], [nb, 2r + H]
  float *dcin;         // confidence backward: [R, H (+ r)]
};

// ---- parameters ----------------------------------------------------------------------------------------------

df_status df_dspark_heads_add_params(const df_draft_config *cfg, df_params *p, df_error *err) {
  if (cfg->kind != DF_DRAFT_DSPARK) return DF_OK;
  const df_dflash_config *d = &cfg->dflash;
  int64_t r = d->markov_rank, V = cfg->vocab_size, H = cfg->hidden_size;
  if (r > 0) {
    if (V < 1)
      return DF_FAIL(err, DF_ERR_INVALID, "vocab_size", "set vocab_size to the target's vocabulary",
                     "%s: a Markov head needs vocab_size >= 1", cfg->source);
    DF_TRY(df_params_add_f32(p, W1_NAME, DF_ROLE_EMBED, 2, V, r, err));
    DF_TRY(df_params_add_f32(p, W2_NAME, DF_ROLE_WEIGHT, 2, V, r, err));
    if (d->markov_head_type == DF_MARKOV_GATED) {
      DF_TRY(df_params_add_f32(p, GATE_W_NAME, DF_ROLE_WEIGHT, 2, r, H + r, err));
      DF_TRY(df_params_add_f32(p, GATE_B_NAME, DF_ROLE_BIAS, 1, r, 0, err));
    } else if (d->markov_head_type == DF_MARKOV_RNN) {
      DF_TRY(df_params_add_f32(p, JNT_W_NAME, DF_ROLE_WEIGHT, 2, 3 * r, 2 * r + H, err));
      DF_TRY(df_params_add_f32(p, JNT_B_NAME, DF_ROLE_BIAS, 1, 3 * r, 0, err));
    }
  }
  if (d->enable_confidence_head) {
    DF_TRY(df_params_add_f32(p, CONF_W_NAME, DF_ROLE_WEIGHT, 2, 1, H + (d->confidence_head_with_markov ? r : 0), err));
    DF_TRY(df_params_add_f32(p, CONF_B_NAME, DF_ROLE_BIAS, 1, 1, 0, err));
  }
  return DF_OK;
}

static df_status bind(df_dspark_heads *h, const df_params *p, const char *name, float *weights, float *grads,
                      ds_pview *v, df_error *err) {
  return df_params_bind(p, name, weights, grads, h->dev, &v->w, &v->g, err);
}

static df_status bind_all(df_dspark_heads *h, const df_params *p, float *w, float *g, df_error *err) {
  if (h->r > 0) {
    DF_TRY(bind(h, p, W1_NAME, w, g, &h->w1, err));
    DF_TRY(bind(h, p, W2_NAME, w, g, &h->w2, err));
    if (h->type == DF_MARKOV_GATED) {
      DF_TRY(bind(h, p, GATE_W_NAME, w, g, &h->proj_w, err));
      DF_TRY(bind(h, p, GATE_B_NAME, w, g, &h->proj_b, err));
    } else if (h->type == DF_MARKOV_RNN) {
      DF_TRY(bind(h, p, JNT_W_NAME, w, g, &h->proj_w, err));
      DF_TRY(bind(h, p, JNT_B_NAME, w, g, &h->proj_b, err));
    }
  }
  if (!h->conf) return DF_OK;
  DF_TRY(bind(h, p, CONF_W_NAME, w, g, &h->conf_w, err));
  return bind(h, p, CONF_B_NAME, w, g, &h->conf_b, err);
}

df_status df_dspark_heads_create(const df_draft_config *cfg, df_ctx *ctx, const df_params *p, float *weights,
                                 float *grads, df_dspark_heads **out, df_error *err) {
  *out = NULL;
  df_dspark_heads *h = calloc(1, sizeof *h);
  if (!h) return DF_FAIL(err, DF_ERR_NOMEM, cfg->source, NULL, "cannot allocate the DSpark heads");
  h->cfg = cfg, h->ctx = ctx, h->dev = df_ctx_device(ctx);
  h->V = cfg->vocab_size, h->H = cfg->hidden_size, h->r = cfg->dflash.markov_rank;
  h->type = cfg->dflash.markov_head_type;
  h->conf = cfg->dflash.enable_confidence_head;
  h->conf_markov = h->conf && cfg->dflash.confidence_head_with_markov && h->r > 0;
  df_status st = bind_all(h, p, weights, grads, err);
  h->dt = h->conf ? h->conf_w.w.dtype : (h->r > 0 ? h->w1.w.dtype : DF_F32); // the model's storage (its weight views)
  if (st != DF_OK) {
    df_dspark_heads_free(h);
    return st;
  }
  *out = h;
  return DF_OK;
}

static void free_buffers(df_dspark_heads *h) {
  df_buffer_free(h->ctx, h->arena);
  h->arena = NULL, h->cap = 0;
}

void df_dspark_heads_free(df_dspark_heads *h) {
  if (!h) return;
  free_buffers(h);
  free(h);
}

int64_t df_dspark_heads_markov_rank(const df_dspark_heads *h) { return h ? h->r : 0; }
bool df_dspark_heads_has_confidence(const df_dspark_heads *h) { return h && h->conf; }
const df_tensor *df_dspark_heads_w2(const df_dspark_heads *h) { return h && h->r ? &h->w2.w : NULL; }
df_tensor *df_dspark_heads_w2_grad(df_dspark_heads *h) { return h && h->r ? &h->w2.g : NULL; }

static const df_rename LEGACY[] = {{"logit_head.markov_head.", "markov_head."},
                                   {"logit_head.confidence_head.", "confidence_head."}};

const df_rename *df_dspark_heads_legacy_renames(int *n) {
  *n = (int)(sizeof LEGACY / sizeof LEGACY[0]);
  return LEGACY;
}

// ---- buffers -------------------------------------------------------------------------------------------------

// The arena's layout for R rows in nb blocks: each piece 64-byte aligned, NULL where the config has no use for it.
// With base NULL only the size is computed.
static size_t carve(df_dspark_heads *h, char *base, int64_t R, int64_t nb) {
  const int64_t r = h->r, H = h->H, K = 2 * r + H, Kc = H + (h->conf_markov ? r : 0);
  const bool gated = r > 0 && h->type == DF_MARKOV_GATED, rnn = r > 0 && h->type == DF_MARKOV_RNN;
  size_t at = 0;
#define PIECE_BYTES(field, cond, bytes)                                                                                \
  do {                                                                                                                 \
    h->field = NULL;                                                                                                   \
    if (cond) {                                                                                                        \
      if (base) h->field = (void *)(base + at);                                                                        \
      at += ((size_t)(bytes) + 63) / 64 * 64;                                                                          \
    }                                                                                                                  \
  } while (0)
#define PIECE(field, cond, n, type) PIECE_BYTES(field, cond, (size_t)(n) * sizeof(type))
  const size_t es = df_dtype_size(h->dt);
#define SPIECE(field, cond, n) PIECE_BYTES(field, cond, (size_t)(n)*es)
  PIECE(prev, r > 0, R, int32_t);
  SPIECE(e, r > 0, R * r);
  SPIECE(de, r > 0, R * r);
  SPIECE(u, r > 0 && h->type != DF_MARKOV_VANILLA, R * r);
  SPIECE(gin, gated, R * (H + r));
  SPIECE(gate, gated, R * r);
  SPIECE(da, gated, R * r);
  SPIECE(dgin, gated, R * (H + r));
  SPIECE(z, rnn, R * K);
  SPIECE(y, rnn, R * 3 * r);
  SPIECE(s, rnn, R * r);
  SPIECE(ds, rnn, nb * r);
  SPIECE(dy, rnn, nb * 3 * r);
  SPIECE(dz, rnn, nb * K);
  SPIECE(cin, h->conf_markov, R * (H + r));
  PIECE(conf_out, h->conf, R, float);
  SPIECE(conf_s, h->conf && h->dt != DF_F32, R);
  SPIECE(dconf_s, h->conf && h->dt != DF_F32, R);
  SPIECE(dcin, h->conf, R * Kc);
#undef SPIECE
#undef PIECE
#undef PIECE_BYTES
  return at;
}

// Device buffers for R rows in nb blocks (reallocated only when they need more room).
static df_status ensure(df_dspark_heads *h, int64_t R, int64_t nb, df_error *err) {
  size_t need = carve(h, NULL, R, nb);
  if (need > h->cap) {
    free_buffers(h);
    df_status st = df_buffer_alloc_as(h->ctx, DF_MEM_ACTIVATIONS, need, &h->arena, err);
    if (st != DF_OK) {
      h->arena = NULL;
      return DF_FAIL(err, DF_ERR_NOMEM, "dspark heads", "lower training.num_anchors or training.batch_size",
                     "out of memory for the DSpark heads on %lld rows", (long long)R);
    }
    h->cap = need;
  }
  carve(h, h->arena, R, nb);
  return DF_OK;
}

// ---- op helpers ----------------------------------------------------------------------------------------------

// Views of storage-dtype activations, and n storage elements past p (the pieces are typed float * but hold h->dt).
static df_tensor mat(const df_dspark_heads *h, const float *p, int64_t rows, int64_t cols) {
  return df_view_on(h->dt, h->dev, p, rows, cols);
}
static float *at(const df_dspark_heads *h, const float *p, int64_t n) {
  return (float *)((char *)p + n * (int64_t)df_dtype_size(h->dt));
}

// df_copy_2d from src (src_n elements) into dst (dst_n elements), storage dtype.
static df_status copy2d(df_dspark_heads *h, const float *src, int64_t src_n, float *dst, int64_t dst_n,
                        df_copy_2d_desc d, df_error *err) {
  df_tensor s = df_view_on(h->dt, h->dev, src, src_n), t = df_view_on(h->dt, h->dev, dst, dst_n);
  return df_copy_2d(h->ctx, &d, &s, &t, err);
}

// dst[R, na + nb] = [a (na) ; b (nb)] row by row.
static df_status concat_rows(df_dspark_heads *h, float *dst, const float *a, int64_t na, const float *b, int64_t nb,
                             int64_t R, df_error *err) {
  const int64_t w = na + nb;
  DF_TRY(copy2d(h, a, R * na, dst, R * w, (df_copy_2d_desc){.rows = R, .cols = na, .src_stride = na, .dst_stride = w},
                err));
  return copy2d(h, b, R * nb, dst, R * w,
                (df_copy_2d_desc){.rows = R, .cols = nb, .src_stride = nb, .dst_offset = na, .dst_stride = w}, err);
}

// dst[R, n] += src[R, ld] columns off .. off + n.
static df_status add_cols(df_dspark_heads *h, float *dst, int64_t n, const float *src, int64_t ld, int64_t off,
                          int64_t R, df_error *err) {
  return copy2d(
      h, src, R * ld, dst, R * n,
      (df_copy_2d_desc){.rows = R, .cols = n, .src_offset = off, .src_stride = ld, .dst_stride = n, .accumulate = true},
      err);
}

static df_status linear(df_dspark_heads *h, const float *x, int64_t M, const ds_pview *w, const ds_pview *b, float *y,
                        df_error *err) {
  df_tensor tx = mat(h, x, M, w->w.shape[1]), ty = mat(h, y, M, w->w.shape[0]);
  return df_linear_forward(h->ctx, &tx, &w->w, b ? &b->w : NULL, &ty, err);
}

// dx = dy · W (written), dW += dyᵀ x, db += Σ dy.
static df_status linear_back(df_dspark_heads *h, const float *dy, const float *x, int64_t M, ds_pview *w, ds_pview *b,
                             float *dx, df_error *err) {
  int64_t N = w->w.shape[0], K = w->w.shape[1];
  df_tensor tdy = mat(h, dy, M, N), tx = mat(h, x, M, K), tdx = mat(h, dx, M, K);
  return df_linear_backward(h->ctx, &tdy, &tx, &w->w, &tdx, false, &w->g, b ? &b->g : NULL, err);
}

// ---- forward -------------------------------------------------------------------------------------------------

// gated: g = σ(Wg [h ; e] + bg), u = g ⊙ e.
static df_status gated_forward(df_dspark_heads *h, df_error *err) {
  const int64_t R = h->R, r = h->r;
  DF_TRY(concat_rows(h, h->gin, h->hidden, h->H, h->e, r, R, err));
  DF_TRY(linear(h, h->gin, R, &h->proj_w, &h->proj_b, h->gate, err));
  df_tensor g = mat(h, h->gate, R, r), e = mat(h, h->e, R, r), u = mat(h, h->u, R, r);
  return df_markov_gate_forward(h->ctx, &g, &e, &g, &u, err);
}

// rnn, slot by slot (all blocks at once): z_k = [s_{k−1} ; e ; h], (a, c, o) = Wj z_k + bj, u = tanh(o),
// s_k = σ(a) s_{k−1} + (1 − σ(a)) tanh(c).
static df_status rnn_forward(df_dspark_heads *h, df_error *err) {
  const int64_t nb = h->nb, bs = h->bs, r = h->r, H = h->H, K = 2 * r + H, R = h->R;
  for (int64_t k = 0; k < bs; k++) {
    float *zk = at(h, h->z, k * nb * K), *yk = at(h, h->y, k * nb * 3 * r), *sk = at(h, h->s, k * nb * r);
    const float *sp = k ? at(h, h->s, (k - 1) * nb * r) : NULL;
    if (sp)
      DF_TRY(copy2d(h, sp, nb * r, zk, nb * K,
                    (df_copy_2d_desc){.rows = nb, .cols = r, .src_stride = r, .dst_stride = K}, err));
    else {
      df_tensor z0 = mat(h, zk, nb, K);
      DF_TRY(df_fill(h->ctx, &z0, 0.0, err)); // s_{−1} = 0
    }
    DF_TRY(
        copy2d(h, h->e, R * r, zk, nb * K,
               (df_copy_2d_desc){
                   .rows = nb, .cols = r, .src_offset = k * r, .src_stride = bs * r, .dst_offset = r, .dst_stride = K},
               err));
    DF_TRY(copy2d(
        h, h->hidden, R * H, zk, nb * K,
        (df_copy_2d_desc){
            .rows = nb, .cols = H, .src_offset = k * H, .src_stride = bs * H, .dst_offset = 2 * r, .dst_stride = K},
        err));
    DF_TRY(linear(h, zk, nb, &h->proj_w, &h->proj_b, yk, err));
    df_markov_rnn_desc d = {.slot = k, .block_size = bs};
    df_tensor y = mat(h, yk, nb, 3 * r), s = mat(h, sk, nb, r), s_prev = mat(h, sp, nb, r), u = mat(h, h->u, R, r);
    DF_TRY(df_markov_rnn_forward(h->ctx, &d, &y, sp ? &s_prev : NULL, &s, &u, err));
  }
  return DF_OK;
}

// conf = wc · [h ; e] + bc, or wc · h + bc.
static df_status conf_forward(df_dspark_heads *h, df_error *err) {
  const float *x = h->hidden;
  if (h->conf_markov) {
    DF_TRY(concat_rows(h, h->cin, h->hidden, h->H, h->e, h->r, h->R, err));
    x = h->cin;
  }
  if (!h->conf_s) return linear(h, x, h->R, &h->conf_w, &h->conf_b, h->conf_out, err);
  DF_TRY(linear(h, x, h->R, &h->conf_w, &h->conf_b, h->conf_s, err)); // bf16 storage: the logits to fp32 for the loss
  df_tensor a = mat(h, h->conf_s, h->R, 1), b = df_f32_on(h->dev, h->conf_out, h->R, 1);
  return df_cast(h->ctx, &a, &b, err);
}

df_status df_dspark_heads_forward(df_dspark_heads *h, int64_t nblocks, int64_t bs, const float *hidden,
                                  const int32_t *prev, const float **latent, const float **conf, df_error *err) {
  *latent = NULL, *conf = NULL;
  h->have_forward = false;
  if (nblocks < 1 || bs < 1 || !hidden || !prev)
    return DF_FAIL(err, DF_ERR_INVALID, "dspark heads", NULL, "bad head input: %lld blocks of %lld rows",
                   (long long)nblocks, (long long)bs);
  int64_t R = nblocks * bs;
  DF_TRY(ensure(h, R, nblocks, err));
  h->nb = nblocks, h->bs = bs, h->R = R, h->hidden = hidden;
  if (h->r > 0) {
    DF_TRY(df_copy_async(h->ctx, h->prev, h->dev, prev, h->dev, sizeof(int32_t) * (size_t)R, err)); // stream-ordered
    df_tensor ids = df_i32_on(h->dev, h->prev, R), e = mat(h, h->e, R, h->r);
    DF_TRY(df_embedding_forward(h->ctx, &h->w1.w, &ids, &e, err));
    if (h->type == DF_MARKOV_GATED) DF_TRY(gated_forward(h, err));
    if (h->type == DF_MARKOV_RNN) DF_TRY(rnn_forward(h, err));
    *latent = h->type == DF_MARKOV_VANILLA ? h->e : h->u;
  }
  if (h->conf) {
    DF_TRY(conf_forward(h, err));
    *conf = h->conf_out;
  }
  h->have_forward = true;
  return DF_OK;
}

// ---- backward ------------------------------------------------------------------------------------------------

static df_status conf_backward(df_dspark_heads *h, const float *dconf, float *dhidden, df_error *err) {
  const int64_t R = h->R, H = h->H, K = h->conf_w.w.shape[1];
  if (h->dconf_s) { // the loss's fp32 d(logit) into the storage dtype
    df_tensor a = df_f32_on(h->dev, dconf, R, 1), b = mat(h, h->dconf_s, R, 1);
    DF_TRY(df_cast(h->ctx, &a, &b, err));
    dconf = h->dconf_s;
  }
  DF_TRY(linear_back(h, dconf, h->conf_markov ? h->cin : h->hidden, R, &h->conf_w, &h->conf_b, h->dcin, err));
  DF_TRY(add_cols(h, dhidden, H, h->dcin, K, 0, R, err));
  return h->conf_markov ? add_cols(h, h->de, h->r, h->dcin, K, H, R, err) : DF_OK;
}

// gated: dg = du ⊙ e, de += du ⊙ g, da = dg ⊙ g (1 − g); [dh ; de] += Wgᵀ da.
static df_status gated_backward(df_dspark_heads *h, const float *du, float *dhidden, df_error *err) {
  const int64_t R = h->R, r = h->r, H = h->H;
  df_tensor g = mat(h, h->gate, R, r), e = mat(h, h->e, R, r), tdu = mat(h, du, R, r), de = mat(h, h->de, R, r),
            da = mat(h, h->da, R, r);
  DF_TRY(df_markov_gate_backward(h->ctx, &g, &e, &tdu, &de, &da, err));
  DF_TRY(linear_back(h, h->da, h->gin, R, &h->proj_w, &h->proj_b, h->dgin, err));
  DF_TRY(add_cols(h, dhidden, H, h->dgin, H + r, 0, R, err));
  return add_cols(h, h->de, r, h->dgin, H + r, H, R, err);
}

// rnn, slots in reverse with the state gradient ds carried from slot k + 1 to slot k (df_markov_rnn_backward:
// dy and ds ← ds σ(a)); then Wjᵀ dy splits into ds += its state part and de, dh += theirs.
static df_status rnn_backward(df_dspark_heads *h, const float *du, float *dhidden, df_error *err) {
  const int64_t nb = h->nb, bs = h->bs, r = h->r, H = h->H, K = 2 * r + H, R = h->R;
  df_tensor ds = mat(h, h->ds, nb, r), dy = mat(h, h->dy, nb, 3 * r), tdu = mat(h, du, R, r);
  DF_TRY(df_fill(h->ctx, &ds, 0.0, err));
  for (int64_t k = bs - 1; k >= 0; k--) {
    const float *sp = k ? at(h, h->s, (k - 1) * nb * r) : NULL;
    df_markov_rnn_desc d = {.slot = k, .block_size = bs};
    df_tensor y = mat(h, at(h, h->y, k * nb * 3 * r), nb, 3 * r), s_prev = mat(h, sp, nb, r);
    DF_TRY(df_markov_rnn_backward(h->ctx, &d, &y, sp ? &s_prev : NULL, &tdu, &ds, &dy, err));
    DF_TRY(linear_back(h, h->dy, at(h, h->z, k * nb * K), nb, &h->proj_w, &h->proj_b, h->dz, err));
    DF_TRY(add_cols(h, h->ds, r, h->dz, K, 0, nb, err));
    DF_TRY(copy2d(h, h->dz, nb * K, h->de, R * r,
                  (df_copy_2d_desc){.rows = nb,
                                    .cols = r,
                                    .src_offset = r,
                                    .src_stride = K,
                                    .dst_offset = k * r,
                                    .dst_stride = bs * r,
                                    .accumulate = true},
                  err));
    DF_TRY(copy2d(h, h->dz, nb * K, dhidden, R * H,
                  (df_copy_2d_desc){.rows = nb,
                                    .cols = H,
                                    .src_offset = 2 * r,
                                    .src_stride = K,
                                    .dst_offset = k * H,
                                    .dst_stride = bs * H,
                                    .accumulate = true},
                  err));
  }
  return DF_OK;
}

df_status df_dspark_heads_backward(df_dspark_heads *h, const float *du, const float *dconf, float *dhidden,
                                   df_error *err) {
  if (!h->have_forward)
    return DF_FAIL(err, DF_ERR_INVALID, "dspark heads", "run df_dspark_heads_forward first", "no forward to undo");
  if (!dhidden) return DF_FAIL(err, DF_ERR_INVALID, "dhidden", NULL, "dhidden is NULL");
  const int64_t R = h->R, r = h->r;
  df_tensor de = mat(h, h->de, R, r > 0 ? r : 1);
  if (r > 0) DF_TRY(df_fill(h->ctx, &de, 0.0, err));
  if (h->conf && dconf) DF_TRY(conf_backward(h, dconf, dhidden, err));
  if (r > 0 && du) {
    if (h->type == DF_MARKOV_VANILLA) {
      df_tensor tdu = mat(h, du, R, r);
      DF_TRY(df_axpy(h->ctx, 1.0f, &tdu, &de, err));
    } else if (h->type == DF_MARKOV_GATED)
      DF_TRY(gated_backward(h, du, dhidden, err));
    else
      DF_TRY(rnn_backward(h, du, dhidden, err));
  }
  if (r == 0) return DF_OK;
  df_tensor ids = df_i32_on(h->dev, h->prev, R);
  return df_embedding_backward(h->ctx, &de, &ids, &h->w1.g, err);
}

// ---- export --------------------------------------------------------------------------------------------------

static const char *const TOP_LEVEL_KEYS[] = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                             "confidence_head_with_markov"};

// dflash_config's value of key, else the top level's.
static json_t *nested_or_top(json_t *config, json_t *dc, const char *key) {
  json_t *v = dc ? json_object_get(dc, key) : NULL;
  return v && !json_is_null(v) ? v : json_object_get(config, key);
}

static df_status check_export(json_t *config, json_t *dc, const char *src, char *type_lower, size_t n, df_error *err) {
  json_t *mt = json_object_get(config, "model_type");
  if (!json_is_string(mt) || strcmp(json_string_value(mt), "qwen3") != 0)
    return DF_FAIL(err, DF_ERR_INVALID, "model_type", "SGLang's standalone DSpark export expects model_type \"qwen3\"",
                   "%s: DSpark export needs model_type \"qwen3\", got %s", src,
                   json_is_string(mt) ? json_string_value(mt) : "a non-string");
  json_t *rank = nested_or_top(config, dc, "markov_rank");
  if (!json_is_integer(rank) || json_integer_value(rank) <= 0)
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.markov_rank",
                   "SGLang serves DSpark drafts with a Markov head: set a positive markov_rank",
                   "%s: DSpark export requires a positive integer markov_rank", src);
  json_t *type = nested_or_top(config, dc, "markov_head_type");
  const char *t = json_is_string(type) ? json_string_value(type) : "";
  size_t i = 0;
  for (; t[i] && i + 1 < n; i++) type_lower[i] = (char)tolower((unsigned char)t[i]);
  type_lower[i] = 0;
  if (strcmp(type_lower, "vanilla") && strcmp(type_lower, "gated") && strcmp(type_lower, "rnn"))
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.markov_head_type", "use vanilla, gated or rnn",
                   "%s: DSpark export requires markov_head_type in {gated, rnn, vanilla}, got %s", src,
                   json_is_string(type) ? t : "none");
  for (size_t k = 0; k < sizeof TOP_LEVEL_KEYS / sizeof *TOP_LEVEL_KEYS; k++) {
    json_t *nested = dc ? json_object_get(dc, TOP_LEVEL_KEYS[k]) : NULL,
           *top = json_object_get(config, TOP_LEVEL_KEYS[k]);
    if (!nested || json_is_null(nested) || !top || json_is_null(top) || json_equal(nested, top)) continue;
    char *a = json_dumps(top, JSON_ENCODE_ANY), *b = json_dumps(nested, JSON_ENCODE_ANY);
    df_status st = DF_FAIL(err, DF_ERR_INVALID, TOP_LEVEL_KEYS[k], "make the top-level value agree with dflash_config",
                           "%s: DSpark config conflict for %s: top-level %s != dflash_config %s", src,
                           TOP_LEVEL_KEYS[k], a ? a : "?", b ? b : "?");
    free(a), free(b);
    return st;
  }
  return DF_OK;
}

df_status df_dspark_normalize_export_config(json_t *config, const char *source, df_error *err) {
  const char *src = source ? source : "config.json";
  if (!json_is_object(config))
    return DF_FAIL(err, DF_ERR_INVALID, src, NULL, "%s: the config is not a JSON object", src);
  json_t *dc = json_object_get(config, "dflash_config");
  if (dc && !json_is_null(dc) && !json_is_object(dc))
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config", NULL, "%s: dflash_config is not an object", src);
  if (dc && json_is_null(dc)) dc = NULL;
  char type[16];
  DF_TRY(check_export(config, dc, src, type, sizeof type, err));
  json_t *rank = json_incref(nested_or_top(config, dc, "markov_rank"));
  for (size_t k = 0; dc && k < sizeof TOP_LEVEL_KEYS / sizeof *TOP_LEVEL_KEYS; k++) {
    json_t *nested = json_object_get(dc, TOP_LEVEL_KEYS[k]);
    if (nested && !json_is_null(nested)) json_object_set(config, TOP_LEVEL_KEYS[k], nested);
  }
  json_object_set_new(config, "markov_rank", rank);
  json_object_set_new(config, "markov_head_type", json_string(type));
  if (dc) {
    if (dc && !json_object_get(dc, "projector_type")) json_object_set_new(dc, "projector_type", json_string("dspark"));
    json_t *mode = json_object_get(dc, "attention_mode");
    char m[8] = "gqa";
    if (json_is_string(mode)) {
      size_t i = 0;
      for (const char *s = json_string_value(mode); s[i] && i + 1 < sizeof m; i++)
        m[i] = (char)tolower((unsigned char)s[i]);
      m[i] = 0;
    }
    json_object_set_new(dc, "attention_mode", json_string(m));
  }
  json_t *arch = json_array();
  json_array_append_new(arch, json_string("Qwen3DSparkModel"));
  json_object_set_new(config, "architectures", arch);
  json_object_del(config, "auto_map");
  return DF_OK;
}
