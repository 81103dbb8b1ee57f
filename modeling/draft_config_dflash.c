// dflash_config: mask token, target layer ids, the DSpark head keys and the Domino head keys (the moe_* training keys
// are resolved with the MoE config, draft_config_ffn.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config_internal.h"

static df_status parse_mask_token(const df_cj *c, const json_t *dc, df_draft_config *cfg) {
  const json_t *v = df_cj_get(dc, "mask_token_id");
  cfg->dflash.mask_token_id = -1;
  if (!v) return DF_OK;
  int64_t id = 0;
  DF_TRY(df_cj_int(c, v, "dflash_config.mask_token_id", 0, INT64_MAX, &id));
  if (id >= cfg->vocab_size)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.mask_token_id",
                      "the mask token must be a row of the target embedding (Qwen3 uses 151669)",
                      "%lld is not below vocab_size %lld", (long long)id, (long long)cfg->vocab_size);
  cfg->dflash.mask_token_id = id;
  return DF_OK;
}

void df_draft_config_build_target_layer_ids(int64_t num_target_layers, int64_t num_draft_layers, int *out) {
  if (num_draft_layers == 1) {
    out[0] = (int)(num_target_layers / 2);
    return;
  }
  const int64_t start = 1, span = num_target_layers - 3 - start;
  for (int64_t i = 0; i < num_draft_layers; i++) {
    // Python: int(round(start + (i * span) / (n - 1))): true division, then round half to even; rint()
    // under the default rounding mode is the same IEEE operation.
    double x = (double)start + (double)(i * span) / (double)(num_draft_layers - 1);
    out[i] = (int)rint(x);
  }
}

static df_status parse_explicit_layer_ids(const df_cj *c, const json_t *v, df_draft_config_owned *o) {
  const char *path = "dflash_config.target_layer_ids";
  df_draft_config *cfg = &o->pub;
  if (!json_is_array(v))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "write a list of target layer indices, e.g. [1, 9, 17, 25, 33]",
                      "expected an array, got %s", df_cj_type_name(v));
  size_t k = json_array_size(v);
  if (k < 1 || k > DF_DRAFT_MAX_LAYERS)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "list at least one target layer (or drop the key for the default)",
                      "has %zu entries; expected 1 to %d", k, DF_DRAFT_MAX_LAYERS);
  o->target_layer_ids = malloc(k * sizeof(int));
  if (!o->target_layer_ids) return DF_CJ_FAIL(c, DF_ERR_NOMEM, path, NULL, "out of memory");
  for (size_t i = 0; i < k; i++) {
    char ipath[DF_CJ_PATH];
    int64_t id = 0;
    DF_TRY(df_cj_int(c, json_array_get(v, i), df_cj_index(ipath, path, i), INT64_MIN, INT64_MAX, &id));
    if (id < 0 || id >= cfg->num_target_layers)
      return DF_CJ_FAIL(c, DF_ERR_INVALID, ipath,
                        "ids are 0-based target decoder layers (id L = HF hidden_states[L+1]); check num_target_layers",
                        "layer %lld is outside [0, num_target_layers = %lld)", (long long)id,
                        (long long)cfg->num_target_layers);
    o->target_layer_ids[i] = (int)id;
  }
  cfg->dflash.num_target_layer_ids = (int)k;
  return DF_OK;
}

static df_status parse_target_layer_ids(const df_cj *c, const json_t *dc, df_draft_config_owned *o) {
  df_draft_config *cfg = &o->pub;
  const json_t *v = df_cj_get(dc, "target_layer_ids");
  if (v) DF_TRY(parse_explicit_layer_ids(c, v, o));
  if (!v) {
    int64_t n = cfg->num_hidden_layers;
    o->target_layer_ids = malloc((size_t)n * sizeof(int));
    if (!o->target_layer_ids)
      return DF_CJ_FAIL(c, DF_ERR_NOMEM, "dflash_config.target_layer_ids", NULL, "out of memory");
    df_draft_config_build_target_layer_ids(cfg->num_target_layers, n, o->target_layer_ids);
    for (int64_t i = 0; i < n; i++)
      if (o->target_layer_ids[i] < 0 || o->target_layer_ids[i] >= cfg->num_target_layers)
        return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.target_layer_ids",
                          "the target is too shallow for the default spread; list the ids explicitly",
                          "absent, and the default for num_target_layers %lld and %lld draft layers gives layer %d, "
                          "outside the target",
                          (long long)cfg->num_target_layers, (long long)n, o->target_layer_ids[i]);
    cfg->dflash.num_target_layer_ids = (int)n;
    cfg->dflash.target_layer_ids_defaulted = true;
  }
  cfg->dflash.target_layer_ids = o->target_layer_ids;
  return DF_OK;
}

// DSpark: projector "dspark" (absent resolves to it). DominoDraftModel: "domino" (absent resolves to it, anything
// else is SpecForge's constructor error). DFlashDraftModel: "dflash" or absent, or "domino": SpecForge's Domino export
// (scripts/gates/normalize_dflash_export.py names every non-DSpark export DFlashDraftModel and keeps the projector),
// which reads back as the Domino draft it is.
static df_status parse_projector(const df_cj *c, const json_t *dc, df_draft_config *cfg) {
  static const char *const names[] = {"dflash", "dspark", "domino"};
  const char *path = "dflash_config.projector_type";
  const json_t *v = df_cj_get(dc, "projector_type");
  cfg->dflash.projector_type = cfg->kind == DF_DRAFT_DSPARK   ? DF_PROJECTOR_DSPARK
                               : cfg->kind == DF_DRAFT_DOMINO ? DF_PROJECTOR_DOMINO
                                                              : DF_PROJECTOR_DFLASH;
  if (!v) return DF_OK;
  int p = 0;
  DF_TRY(df_cj_enum(c, v, path, names, 3, &p));
  if (p == DF_PROJECTOR_DOMINO && cfg->kind == DF_DRAFT_DFLASH) {
    cfg->kind = DF_DRAFT_DOMINO, cfg->dflash.projector_type = DF_PROJECTOR_DOMINO;
    return DF_OK;
  }
  if (p != (int)cfg->dflash.projector_type)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "make projector_type agree with architectures (or remove it)",
                      "\"%s\" contradicts architectures[0] = %s", names[p], cfg->architecture);
  return DF_OK;
}

// DSparkDraftModel's constructor rule: gqa needs fewer KV heads than query heads, mha equal counts.
static df_status parse_attention_mode(const df_cj *c, const json_t *dc, df_draft_config *cfg) {
  static const char *const names[] = {"gqa", "mha"};
  const char *path = "dflash_config.attention_mode";
  const json_t *v = df_cj_get(dc, "attention_mode");
  int m = 0;
  if (v) DF_TRY(df_cj_enum(c, v, path, names, 2, &m));
  cfg->dflash.attention_mode = (df_attention_mode)m;
  if (cfg->kind != DF_DRAFT_DSPARK) return DF_OK;
  long long nh = cfg->num_attention_heads, nkv = cfg->num_key_value_heads;
  if (m == DF_ATTENTION_GQA && nkv >= nh)
    return DF_CJ_FAIL(
        c, DF_ERR_INVALID, path, "set dflash_config.attention_mode to \"mha\" for equal query/KV head counts",
        "DSpark gqa (the default) needs num_key_value_heads < num_attention_heads, got %lld and %lld", nkv, nh);
  if (m == DF_ATTENTION_MHA && nkv != nh)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use \"gqa\", or make num_key_value_heads equal num_attention_heads",
                      "mha needs num_key_value_heads == num_attention_heads, got %lld and %lld", nkv, nh);
  return DF_OK;
}

// An exported Qwen3DSparkModel config carries copies of some DSpark keys at the top level (SpecForge's
// export normalizer); a copy that disagrees with dflash_config is an error, as there.
static df_status pick_dspark_key(const df_cj *c, const json_t *root, const json_t *dc, const char *key,
                                 const json_t **v, char path[DF_CJ_PATH]) {
  const json_t *nested = df_cj_get(dc, key), *top = df_cj_get(root, key);
  if (nested && top && !json_equal(nested, top))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, key, "make the top-level copy equal dflash_config's, or remove it",
                      "conflicts with dflash_config.%s", key);
  *v = nested ? nested : top;
  df_cj_path(path, nested ? "dflash_config" : "", key);
  return DF_OK;
}

static df_status parse_markov(const df_cj *c, const json_t *root, const json_t *dc, df_draft_config *cfg) {
  static const char *const types[] = {"vanilla", "gated", "rnn"};
  char path[DF_CJ_PATH];
  const json_t *v = NULL;
  DF_TRY(pick_dspark_key(c, root, dc, "markov_rank", &v, path));
  cfg->dflash.markov_rank = 0;
  if (v) DF_TRY(df_cj_int(c, v, path, 0, 1 << 20, &cfg->dflash.markov_rank));
  if (cfg->kind != DF_DRAFT_DSPARK && cfg->dflash.markov_rank > 0)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "use architectures [\"DSparkDraftModel\"], or drop the key",
                      "a Markov head exists only in DSpark drafts; architectures[0] is %s", cfg->architecture);
  DF_TRY(pick_dspark_key(c, root, dc, "markov_head_type", &v, path));
  int t = 0;
  if (v) DF_TRY(df_cj_enum(c, v, path, types, 3, &t));
  cfg->dflash.markov_head_type = (df_markov_head_type)t;
  return DF_OK;
}

static df_status parse_confidence(const df_cj *c, const json_t *root, const json_t *dc, df_draft_config *cfg) {
  char path[DF_CJ_PATH];
  const json_t *v = NULL;
  df_dflash_config *d = &cfg->dflash;
  DF_TRY(df_cj_opt_real(c, dc, "dflash_config", "confidence_head_alpha", 0.0, 0.0, false, INFINITY,
                        &d->confidence_head_alpha));
  DF_TRY(pick_dspark_key(c, root, dc, "enable_confidence_head", &v, path));
  d->enable_confidence_head = d->confidence_head_alpha > 0.0;
  if (v) DF_TRY(df_cj_bool(c, v, path, &d->enable_confidence_head));
  if (cfg->kind != DF_DRAFT_DSPARK && d->enable_confidence_head)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, v ? path : "dflash_config.confidence_head_alpha",
                      "use architectures [\"DSparkDraftModel\"], or drop the confidence keys",
                      "a confidence head exists only in DSpark drafts; architectures[0] is %s", cfg->architecture);
  DF_TRY(pick_dspark_key(c, root, dc, "confidence_head_with_markov", &v, path));
  d->confidence_head_with_markov = false;
  if (v) DF_TRY(df_cj_bool(c, v, path, &d->confidence_head_with_markov));
  if (d->confidence_head_with_markov && d->markov_rank == 0)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, path, "set dflash_config.markov_rank > 0, or set this to false",
                      "true needs a Markov head, but markov_rank is 0");
  return DF_OK;
}

// A Domino key read from dflash_config (where DominoDraftModel reads it); SpecForge's configs also carry a top-level
// copy of emb_dim, which it never reads: a copy that disagrees is refused, as the DSpark copies are.
static df_status pick_domino_key(const df_cj *c, const json_t *root, const json_t *dc, const char *key) {
  const json_t *nested = df_cj_get(dc, key), *top = df_cj_get(root, key);
  if (top && nested && !json_equal(nested, top))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, key, "remove the top-level copy or make it equal dflash_config's",
                      "conflicts with dflash_config.%s (DominoDraftModel reads dflash_config only)", key);
  if (top && !nested)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, key, "move the key into dflash_config",
                      "is set at the top level only; DominoDraftModel reads dflash_config.%s", key);
  return DF_OK;
}

// Domino (DominoDraftModel.__init__, specforge/modeling/draft/domino.py): emb_dim and gru_hidden_dim required,
// pure_draft_prefix_len 0 and shift_label false by default; at least one corrected slot per block. Other drafts
// accept only the defaults of the two keys SpecForge reads for every DFlash-family draft.
static df_status parse_domino_keys(const df_cj *c, const json_t *root, const json_t *dc, df_draft_config *cfg) {
  df_dflash_config *d = &cfg->dflash;
  DF_TRY(df_cj_opt_int(c, dc, "dflash_config", "pure_draft_prefix_len", 0, 0, INT32_MAX, &d->pure_draft_prefix_len));
  DF_TRY(df_cj_opt_bool(c, dc, "dflash_config", "shift_label", false, &d->shift_label));
  d->emb_dim = d->gru_hidden_dim = 0;
  if (cfg->kind != DF_DRAFT_DOMINO) {
    if (d->pure_draft_prefix_len != 0)
      return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "dflash_config.pure_draft_prefix_len",
                        "this key only affects Domino drafts (architectures [\"DominoDraftModel\"]); remove it",
                        "%lld is not supported by a %s draft (only 0)", (long long)d->pure_draft_prefix_len,
                        df_draft_kind_name(cfg->kind));
    if (d->shift_label)
      return DF_CJ_FAIL(c, DF_ERR_UNSUPPORTED, "dflash_config.shift_label",
                        "this key only affects Domino drafts (architectures [\"DominoDraftModel\"]); remove it",
                        "true is not supported by a %s draft (DFlash labels are same-position, DSpark's next-token)",
                        df_draft_kind_name(cfg->kind));
    return DF_OK;
  }
  static const char *const keys[] = {"emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label"};
  for (int i = 0; i < 4; i++) DF_TRY(pick_domino_key(c, root, dc, keys[i]));
  DF_TRY(df_cj_req_int(c, dc, "dflash_config", "emb_dim", 1, 1 << 20, &d->emb_dim));
  DF_TRY(df_cj_req_int(c, dc, "dflash_config", "gru_hidden_dim", 1, 1 << 20, &d->gru_hidden_dim));
  const int64_t ss = d->shift_label ? d->pure_draft_prefix_len : 1 + d->pure_draft_prefix_len;
  if (ss >= cfg->block_size)
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config.pure_draft_prefix_len",
                      "keep pure_draft_prefix_len below block_size (shift_label) or block_size - 1 (without)",
                      "%lld leaves no corrected slot in a block of %lld (suffix_start %lld)",
                      (long long)d->pure_draft_prefix_len, (long long)cfg->block_size, (long long)ss);
  return DF_OK;
}

df_status df_draft_parse_dflash(const df_cj *c, const json_t *root, df_draft_config_owned *o) {
  df_draft_config *cfg = &o->pub;
  const json_t *dc = df_cj_get(root, "dflash_config");
  json_t *empty = NULL;
  if (dc && !json_is_object(dc))
    return DF_CJ_FAIL(c, DF_ERR_INVALID, "dflash_config", "write an object: {\"mask_token_id\": ..., ...}",
                      "expected an object, got %s", df_cj_type_name(dc));
  if (!dc) dc = empty = json_object(); // absent: every key takes its default
  df_status st = parse_mask_token(c, dc, cfg);
  if (st == DF_OK) st = parse_target_layer_ids(c, dc, o);
  if (st == DF_OK) st = parse_projector(c, dc, cfg);
  if (st == DF_OK) st = parse_attention_mode(c, dc, cfg);
  if (st == DF_OK) st = parse_markov(c, root, dc, cfg);
  if (st == DF_OK) st = parse_confidence(c, root, dc, cfg);
  if (st == DF_OK) st = parse_domino_keys(c, root, dc, cfg);
  json_decref(empty);
  return st;
}
