// Loads the target's embedding and LM head (converted to fp32) and checks that they agree on [V, H].
#include "modeling/target_pieces.h"

#include <stdlib.h>
#include <string.h>

#include "modeling/safetensors.h"

// Finds key in m and checks it is a 2-D matrix; *t stays NULL when absent.
static df_status find_matrix(const df_st_model *m, const char *key, const df_st_tensor **t, const df_st_file **f,
                             df_error *err) {
  *t = df_st_model_find(m, key, f);
  if (!*t) return DF_OK;
  char where[256], shape[96];
  if ((*t)->ndim != 2 || (*t)->numel == 0 || !df_st_dtype_is_float((*t)->dtype))
    return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, df_st_path(*f), key),
                   "the target's embedding and LM head are non-empty float [V, H] matrices",
                   "tensor '%s' is %s %s, expected a float [V, H] matrix", key, df_st_dtype_name((*t)->dtype),
                   df_st_shape_str(*t, shape, sizeof shape));
  return DF_OK;
}

static df_status read_matrix(const df_st_file *f, const df_st_tensor *t, float **out, df_error *err) {
  char where[256];
  float *buf = malloc(sizeof *buf * (size_t)t->numel);
  if (!buf)
    return DF_FAIL(err, DF_ERR_NOMEM, df_st_where(where, sizeof where, df_st_path(f), t->name),
                   "the target's vocabulary matrix needs V·H·4 bytes of host memory",
                   "cannot allocate %lld floats for '%s'", (long long)t->numel, t->name);
  df_status st = df_st_read_f32(f, t, buf, t->numel, err);
  if (st != DF_OK) {
    free(buf);
    return st;
  }
  *out = buf;
  return DF_OK;
}

static df_status check_dims(const df_st_model *m, const char *key, const df_st_tensor *t,
                            const df_target_pieces_options *o, int64_t v, int64_t h, df_error *err) {
  char where[256];
  df_st_where(where, sizeof where, df_st_model_path(m), key);
  if (t->shape[0] != v || t->shape[1] != h)
    return DF_FAIL(err, DF_ERR_FORMAT, where, "the embedding and LM head must have the same [V, H]",
                   "'%s' is [%lld, %lld] but the embedding is [V=%lld, H=%lld]", key, (long long)t->shape[0],
                   (long long)t->shape[1], (long long)v, (long long)h);
  if ((o->expect_vocab > 0 && v != o->expect_vocab) || (o->expect_hidden > 0 && h != o->expect_hidden))
    return DF_FAIL(err, DF_ERR_FORMAT, where, "the target weights and its config.json disagree",
                   "'%s' is [V=%lld, H=%lld] but the config says vocab_size=%lld, hidden_size=%lld", key, (long long)v,
                   (long long)h, (long long)o->expect_vocab, (long long)o->expect_hidden);
  return DF_OK;
}

static df_status load_pieces(const df_st_model *m, const df_target_pieces_options *o, df_target_pieces *out,
                             df_error *err) {
  const char *ek = o->embed_key ? o->embed_key : DF_TARGET_EMBED_KEY;
  const char *hk = o->lm_head_key ? o->lm_head_key : DF_TARGET_LM_HEAD_KEY;
  const df_st_tensor *et, *ht = NULL;
  const df_st_file *ef, *hf = NULL;
  char where[256];
  DF_TRY(find_matrix(m, ek, &et, &ef, err));
  if (!et)
    return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, df_st_model_path(m), ek),
                   "pass the embedding's checkpoint name if the target uses another", "the target has no tensor '%s'",
                   ek);
  int64_t v = et->shape[0], h = et->shape[1];
  DF_TRY(check_dims(m, ek, et, o, v, h, err));
  if (!o->tied) {
    DF_TRY(find_matrix(m, hk, &ht, &hf, err));
    if (!ht)
      return DF_FAIL(err, DF_ERR_FORMAT, df_st_where(where, sizeof where, df_st_model_path(m), hk),
                     "an untied target (tie_word_embeddings=false) must ship its LM head; check the key",
                     "the target has no tensor '%s'", hk);
    DF_TRY(check_dims(m, hk, ht, o, v, h, err));
  }
  DF_TRY(read_matrix(ef, et, &out->owned_[0], err));
  if (ht) DF_TRY(read_matrix(hf, ht, &out->owned_[1], err));
  out->embed = out->owned_[0];
  out->lm_head = ht ? out->owned_[1] : out->owned_[0]; // tied: the same buffer, shared by reference
  out->vocab = v;
  out->hidden = h;
  out->tied = o->tied;
  return DF_OK;
}

df_status df_target_pieces_load(const char *dir, const df_target_pieces_options *opt, df_target_pieces *out,
                                df_error *err) {
  memset(out, 0, sizeof *out);
  df_target_pieces_options none = {0};
  df_st_model *m;
  DF_TRY(df_st_model_open(dir, &m, err));
  df_status st = load_pieces(m, opt ? opt : &none, out, err);
  df_st_model_close(m);
  if (st != DF_OK) df_target_pieces_free(out);
  return st;
}

void df_target_pieces_free(df_target_pieces *tp) {
  if (!tp) return;
  free(tp->owned_[0]);
  free(tp->owned_[1]);
  memset(tp, 0, sizeof *tp);
}

df_tensor df_target_embed_view(const df_target_pieces *tp) {
  return df_view((void *)tp->embed, DF_F32, DF_DEV_CPU, 2, (int64_t[]){tp->vocab, tp->hidden});
}

df_tensor df_target_lm_head_view(const df_target_pieces *tp) {
  return df_view((void *)tp->lm_head, DF_F32, DF_DEV_CPU, 2, (int64_t[]){tp->vocab, tp->hidden});
}
