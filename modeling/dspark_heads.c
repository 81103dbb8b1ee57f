// DSpark Markov and confidence heads (modeling/dspark_heads.h): parameters, forward and backward over the
// block rows, legacy checkpoint names, and the export config normalization. GEMMs and the embedding gather go
// through the op interface; the elementwise parts are CPU loops (the heads refuse a CUDA context for now).
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
  int64_t V, H, r; // r = 0: no Markov head
  df_markov_head_type type;
  bool conf, conf_markov;
  ds_pview w1, w2, proj_w, proj_b, conf_w, conf_b; // proj: gate_proj (gated) or joint_proj (rnn)

  // The last forward (buffers sized for cap rows).
  int64_t nb, bs, R, cap;
  bool have_forward;
  const float *hidden; // [R, H] borrowed
  int32_t *prev;       // [R]
  float *e;            // [R, r] W1[prev]
  float *u;            // [R, r] latent (gated, rnn; vanilla uses e)
  float *gin;          // gated: [R, H + r] gate_proj input
  float *gate;         // gated: [R, r] σ(gate_proj(gin))
  float *z, *y, *s;    // rnn, slot-major: [bs, nb, 2r + H] inputs, [bs, nb, 3r] outputs, [bs, nb, r] states
  float *cin;          // confidence with Markov: [R, H + r]
  float *conf_out;     // [R]
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
  if (st != DF_OK) {
    df_dspark_heads_free(h);
    return st;
  }
  *out = h;
  return DF_OK;
}

static void free_buffers(df_dspark_heads *h) {
  free(h->prev), free(h->e), free(h->u), free(h->gin), free(h->gate), free(h->z), free(h->y), free(h->s);
  free(h->cin), free(h->conf_out);
  h->prev = NULL, h->e = h->u = h->gin = h->gate = h->z = h->y = h->s = h->cin = h->conf_out = NULL;
  h->cap = 0;
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

// ---- forward -------------------------------------------------------------------------------------------------

static float *alloc_f(int64_t n, bool *ok) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  *ok = *ok && p;
  return p;
}

// Buffers for R rows (reallocated only when R grows).
static df_status ensure(df_dspark_heads *h, int64_t R, df_error *err) {
  if (R <= h->cap) return DF_OK;
  free_buffers(h);
  int64_t r = h->r, H = h->H;
  bool ok = true;
  h->prev = malloc(sizeof(int32_t) * (size_t)R);
  ok = h->prev != NULL;
  if (r > 0) h->e = alloc_f(R * r, &ok);
  if (r > 0 && h->type != DF_MARKOV_VANILLA) h->u = alloc_f(R * r, &ok);
  if (r > 0 && h->type == DF_MARKOV_GATED) h->gin = alloc_f(R * (H + r), &ok), h->gate = alloc_f(R * r, &ok);
  if (r > 0 && h->type == DF_MARKOV_RNN)
    h->z = alloc_f(R * (2 * r + H), &ok), h->y = alloc_f(R * 3 * r, &ok), h->s = alloc_f(R * r, &ok);
  if (h->conf_markov) h->cin = alloc_f(R * (H + r), &ok);
  if (h->conf) h->conf_out = alloc_f(R, &ok);
  if (!ok) {
    free_buffers(h);
    return DF_FAIL(err, DF_ERR_NOMEM, "dspark heads", "lower training.num_anchors or training.batch_size",
                   "out of memory for the DSpark heads on %lld rows", (long long)R);
  }
  h->cap = R;
  return DF_OK;
}

static df_status linear(df_dspark_heads *h, const float *x, int64_t M, const ds_pview *w, const ds_pview *b, float *y,
                        df_error *err) {
  df_tensor tx = df_f32_on(h->dev, (float *)x, M, w->w.shape[1]), ty = df_f32_on(h->dev, y, M, w->w.shape[0]);
  return df_linear_forward(h->ctx, &tx, &w->w, b ? &b->w : NULL, &ty, err);
}

static inline float sigmoidf_(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

// rows[i] = [a_i (na) ; b_i (nb)] for R rows.
static void concat_rows(float *dst, const float *a, int64_t na, const float *b, int64_t nb, int64_t R) {
  for (int64_t i = 0; i < R; i++) {
    memcpy(dst + i * (na + nb), a + i * na, sizeof(float) * (size_t)na);
    memcpy(dst + i * (na + nb) + na, b + i * nb, sizeof(float) * (size_t)nb);
  }
}

// gated: g = σ(Wg [h ; e] + bg), u = g ⊙ e.
static df_status gated_forward(df_dspark_heads *h, df_error *err) {
  int64_t R = h->R, r = h->r;
  concat_rows(h->gin, h->hidden, h->H, h->e, r, R);
  DF_TRY(linear(h, h->gin, R, &h->proj_w, &h->proj_b, h->gate, err));
  for (int64_t i = 0; i < R * r; i++) {
    h->gate[i] = sigmoidf_(h->gate[i]);
    h->u[i] = h->gate[i] * h->e[i];
  }
  return DF_OK;
}

// rnn, slot by slot (all blocks at once): z_k = [s_{k−1} ; e ; h], (a, c, o) = Wj z_k + bj, u = tanh(o),
// s_k = σ(a) s_{k−1} + (1 − σ(a)) tanh(c).
static df_status rnn_forward(df_dspark_heads *h, df_error *err) {
  int64_t nb = h->nb, bs = h->bs, r = h->r, H = h->H, K = 2 * r + H;
  for (int64_t k = 0; k < bs; k++) {
    float *zk = h->z + k * nb * K, *yk = h->y + k * nb * 3 * r, *sk = h->s + k * nb * r;
    const float *sp = k ? h->s + (k - 1) * nb * r : NULL;
    for (int64_t b = 0; b < nb; b++) {
      int64_t i = b * bs + k;
      float *zr = zk + b * K;
      if (sp)
        memcpy(zr, sp + b * r, sizeof(float) * (size_t)r);
      else
        memset(zr, 0, sizeof(float) * (size_t)r);
      memcpy(zr + r, h->e + i * r, sizeof(float) * (size_t)r);
      memcpy(zr + 2 * r, h->hidden + i * H, sizeof(float) * (size_t)H);
    }
    DF_TRY(linear(h, zk, nb, &h->proj_w, &h->proj_b, yk, err));
    for (int64_t b = 0; b < nb; b++) {
      const float *yr = yk + b * 3 * r;
      float *ur = h->u + (b * bs + k) * r;
      for (int64_t j = 0; j < r; j++) {
        float g = sigmoidf_(yr[j]), tc = tanhf(yr[r + j]), prev = sp ? sp[b * r + j] : 0.0f;
        sk[b * r + j] = g * prev + (1.0f - g) * tc;
        ur[j] = tanhf(yr[2 * r + j]);
      }
    }
  }
  return DF_OK;
}

// conf = wc · [h ; e] + bc, or wc · h + bc.
static df_status conf_forward(df_dspark_heads *h, df_error *err) {
  const float *x = h->hidden;
  if (h->conf_markov) {
    concat_rows(h->cin, h->hidden, h->H, h->e, h->r, h->R);
    x = h->cin;
  }
  return linear(h, x, h->R, &h->conf_w, &h->conf_b, h->conf_out, err);
}

df_status df_dspark_heads_forward(df_dspark_heads *h, int64_t nblocks, int64_t bs, const float *hidden,
                                  const int32_t *prev, const float **latent, const float **conf, df_error *err) {
  *latent = NULL, *conf = NULL;
  h->have_forward = false;
  if (h->dev == DF_DEV_CUDA) // their loops run on host-backed memory (the CPU, the fake test device)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "dspark heads", "run DSpark drafts on the CPU backend for now",
                   "the DSpark Markov/confidence heads have no CUDA path yet");
  if (nblocks < 1 || bs < 1 || !hidden || !prev)
    return DF_FAIL(err, DF_ERR_INVALID, "dspark heads", NULL, "bad head input: %lld blocks of %lld rows",
                   (long long)nblocks, (long long)bs);
  int64_t R = nblocks * bs;
  DF_TRY(ensure(h, R, err));
  h->nb = nblocks, h->bs = bs, h->R = R, h->hidden = hidden;
  memcpy(h->prev, prev, sizeof(int32_t) * (size_t)R);
  if (h->r > 0) {
    df_tensor ids = df_i32_on(h->dev, h->prev, R), e = df_f32_on(h->dev, h->e, R, h->r);
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

// dx = dy · W (written), dW += dyᵀ x, db += Σ dy.
static df_status linear_back(df_dspark_heads *h, const float *dy, const float *x, int64_t M, ds_pview *w, ds_pview *b,
                             float *dx, df_error *err) {
  int64_t N = w->w.shape[0], K = w->w.shape[1];
  df_tensor tdy = df_f32_on(h->dev, (float *)dy, M, N), tx = df_f32_on(h->dev, (float *)x, M, K),
            tdx = df_f32_on(h->dev, dx, M, K);
  return df_linear_backward(h->ctx, &tdy, &tx, &w->w, &tdx, false, &w->g, b ? &b->g : NULL, err);
}

// dst[i] += src[i, off .. off + n) for R rows of width ld.
static void add_cols(float *dst, int64_t n, const float *src, int64_t ld, int64_t off, int64_t R) {
  for (int64_t i = 0; i < R; i++)
    for (int64_t j = 0; j < n; j++) dst[i * n + j] += src[i * ld + off + j];
}

static df_status conf_backward(df_dspark_heads *h, const float *dconf, float *de, float *dhidden, df_error *err) {
  int64_t R = h->R, H = h->H, K = h->conf_w.w.shape[1];
  float *dcin = malloc(sizeof(float) * (size_t)(R * K));
  if (!dcin) return DF_FAIL(err, DF_ERR_NOMEM, "confidence head", NULL, "out of memory");
  df_status st = linear_back(h, dconf, h->conf_markov ? h->cin : h->hidden, R, &h->conf_w, &h->conf_b, dcin, err);
  if (st == DF_OK) {
    add_cols(dhidden, H, dcin, K, 0, R);
    if (h->conf_markov) add_cols(de, h->r, dcin, K, H, R);
  }
  free(dcin);
  return st;
}

// gated: dg = du ⊙ e, de += du ⊙ g, da = dg ⊙ g (1 − g); [dh ; de] += Wgᵀ da.
static df_status gated_backward(df_dspark_heads *h, const float *du, float *de, float *dhidden, df_error *err) {
  int64_t R = h->R, r = h->r, H = h->H;
  float *da = malloc(sizeof(float) * (size_t)(R * r)), *dgin = malloc(sizeof(float) * (size_t)(R * (H + r)));
  if (!da || !dgin) {
    free(da), free(dgin);
    return DF_FAIL(err, DF_ERR_NOMEM, "gated Markov head", NULL, "out of memory");
  }
  for (int64_t i = 0; i < R * r; i++) {
    float g = h->gate[i];
    de[i] += du[i] * g;
    da[i] = du[i] * h->e[i] * g * (1.0f - g);
  }
  df_status st = linear_back(h, da, h->gin, R, &h->proj_w, &h->proj_b, dgin, err);
  if (st == DF_OK) {
    add_cols(dhidden, H, dgin, H + r, 0, R);
    add_cols(de, r, dgin, H + r, H, R);
  }
  free(da), free(dgin);
  return st;
}

// rnn, slots in reverse with the state gradient ds carried from slot k + 1 to slot k:
//   do = du (1 − tanh²o);  da = ds (s_{k−1} − tanh c) σ'(a);  dc = ds (1 − σ(a)) (1 − tanh²c)
//   ds ← ds σ(a) + (Wjᵀ dy)[state part];  de, dh += (Wjᵀ dy)[their parts].
static void rnn_slot_grad(const df_dspark_heads *h, int64_t k, const float *du, float *ds, float *dy) {
  int64_t nb = h->nb, bs = h->bs, r = h->r;
  const float *yk = h->y + k * nb * 3 * r, *sp = k ? h->s + (k - 1) * nb * r : NULL;
  for (int64_t b = 0; b < nb; b++) {
    const float *yr = yk + b * 3 * r, *dur = du ? du + (b * bs + k) * r : NULL;
    float *dyr = dy + b * 3 * r, *dsr = ds + b * r;
    for (int64_t j = 0; j < r; j++) {
      float g = sigmoidf_(yr[j]), tc = tanhf(yr[r + j]), to = tanhf(yr[2 * r + j]);
      float prev = sp ? sp[b * r + j] : 0.0f, dsk = dsr[j];
      dyr[j] = dsk * (prev - tc) * g * (1.0f - g);
      dyr[r + j] = dsk * (1.0f - g) * (1.0f - tc * tc);
      dyr[2 * r + j] = dur ? dur[j] * (1.0f - to * to) : 0.0f;
      dsr[j] = dsk * g;
    }
  }
}

static df_status rnn_backward(df_dspark_heads *h, const float *du, float *de, float *dhidden, df_error *err) {
  int64_t nb = h->nb, bs = h->bs, r = h->r, H = h->H, K = 2 * r + H;
  float *ds = calloc((size_t)(nb * r), sizeof(float)), *dy = malloc(sizeof(float) * (size_t)(nb * 3 * r));
  float *dz = malloc(sizeof(float) * (size_t)(nb * K));
  df_status st = ds && dy && dz ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "rnn Markov head", NULL, "out of memory");
  for (int64_t k = bs - 1; k >= 0 && st == DF_OK; k--) {
    rnn_slot_grad(h, k, du, ds, dy);
    st = linear_back(h, dy, h->z + k * nb * K, nb, &h->proj_w, &h->proj_b, dz, err);
    for (int64_t b = 0; b < nb && st == DF_OK; b++) {
      int64_t i = b * bs + k;
      const float *dzr = dz + b * K;
      for (int64_t j = 0; j < r; j++) ds[b * r + j] += dzr[j], de[i * r + j] += dzr[r + j];
      for (int64_t j = 0; j < H; j++) dhidden[i * H + j] += dzr[2 * r + j];
    }
  }
  free(ds), free(dy), free(dz);
  return st;
}

df_status df_dspark_heads_backward(df_dspark_heads *h, const float *du, const float *dconf, float *dhidden,
                                   df_error *err) {
  if (!h->have_forward)
    return DF_FAIL(err, DF_ERR_INVALID, "dspark heads", "run df_dspark_heads_forward first", "no forward to undo");
  if (!dhidden) return DF_FAIL(err, DF_ERR_INVALID, "dhidden", NULL, "dhidden is NULL");
  int64_t R = h->R, r = h->r;
  float *de = r > 0 ? calloc((size_t)(R * r), sizeof(float)) : NULL;
  if (r > 0 && !de) return DF_FAIL(err, DF_ERR_NOMEM, "Markov head", NULL, "out of memory for %lld rows", (long long)R);
  df_status st = DF_OK;
  if (h->conf && dconf) st = conf_backward(h, dconf, de, dhidden, err);
  if (st == DF_OK && r > 0 && du) {
    if (h->type == DF_MARKOV_VANILLA)
      for (int64_t i = 0; i < R * r; i++) de[i] += du[i];
    else if (h->type == DF_MARKOV_GATED)
      st = gated_backward(h, du, de, dhidden, err);
    else
      st = rnn_backward(h, du, de, dhidden, err);
  }
  if (st == DF_OK && r > 0) {
    df_tensor tde = df_f32_on(h->dev, de, R, r), ids = df_i32_on(h->dev, h->prev, R);
    st = df_embedding_backward(h->ctx, &tde, &ids, &h->w1.g, err);
  }
  free(de);
  return st;
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
