// Loading a recipe's configs, frozen target pieces and mask token (train/step/resources.h), in the order
// and with the checks `draftforge step` uses (docs/dflash-step.md).
#include "train/step/resources.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// model.draft_model_config: a JSON file or a directory holding config.json.
static df_status load_draft_config(const df_recipe *rc, const df_draft_config **out, df_error *err) {
  const char *p = rc->model.draft_model_config;
  if (!p)
    return DF_FAIL(err, DF_ERR_INVALID, "model.draft_model_config", "point it at the draft's config.json",
                   "%s: model.draft_model_config is required (draft configs are not derived from the target yet)",
                   rc->path);
  struct stat sb;
  if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) return df_draft_config_from_file(p, out, err);
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", p);
  return df_draft_config_from_file(path, out, err);
}

// A memory plan reads no weight: the pieces are only sized (their host copies stay NULL; placing them on a measuring
// context allocates the device copies, and the upload reads nothing).
static df_status size_pieces(df_run_resources *t) {
  t->pieces = (df_target_pieces){
      .vocab = t->target->vocab_size, .hidden = t->target->hidden_size, .tied = t->target->tie_word_embeddings};
  t->frozen = (df_frozen){NULL, NULL, t->pieces.vocab, t->pieces.hidden, DF_F32};
  return DF_OK;
}

static df_status load_pieces(const df_recipe *rc, df_run_resources *t, df_error *err) {
  df_target_pieces_options o = {.embed_key = rc->model.embedding_key,
                                .lm_head_key = rc->model.lm_head_key,
                                .tied = t->target->tie_word_embeddings,
                                .expect_vocab = t->target->vocab_size,
                                .expect_hidden = t->target->hidden_size};
  DF_TRY(df_target_pieces_load(rc->model.target_model_path, &o, &t->pieces, err));
  t->frozen = (df_frozen){t->pieces.embed, t->pieces.lm_head, t->pieces.vocab, t->pieces.hidden, DF_F32};
  if (!t->target->has_logits_mup) return DF_OK;
  // SpecForge divides the frozen head by the target's logits_mup_width_multiplier (reference §1.6).
  int64_t n = t->pieces.vocab * t->pieces.hidden;
  t->scaled_head = malloc((size_t)n * sizeof(float));
  if (!t->scaled_head) return DF_FAIL(err, DF_ERR_NOMEM, "lm_head", NULL, "out of memory for the scaled LM head");
  float inv = (float)(1.0 / t->target->logits_mup_width_multiplier);
  for (int64_t i = 0; i < n; i++) t->scaled_head[i] = t->pieces.lm_head[i] * inv;
  t->frozen.lm_head = t->scaled_head;
  return DF_OK;
}

// model.mask_token_id overrides dflash_config.mask_token_id; one of them must be set, below the vocabulary. Only block
// drafts read one (-1 for the others).
static df_status resolve_mask_token(const df_recipe *rc, const df_run_resources *t, int64_t *out, df_error *err) {
  const df_strategy *s = df_strategy_of(t->draft);
  *out = -1;
  if (s && !s->blocks && t->draft->kind != DF_DRAFT_PEAGLE) return DF_OK; // P-EAGLE's mask rows read one too
  int64_t id = rc->model.has_mask_token_id ? rc->model.mask_token_id : t->draft->dflash.mask_token_id;
  if (id < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "model.mask_token_id",
                   "set model.mask_token_id in the recipe or dflash_config.mask_token_id in the draft config",
                   "%s: no mask token id (neither the recipe nor %s sets one)", rc->path, t->draft->source);
  if (id >= t->pieces.vocab)
    return DF_FAIL(err, DF_ERR_INVALID, rc->model.has_mask_token_id ? "model.mask_token_id" : "dflash_config",
                   "the mask token must be a row of the target embedding", "mask_token_id %lld >= vocabulary %lld",
                   (long long)id, (long long)t->pieces.vocab);
  *out = id;
  return DF_OK;
}

// training.strategy names the strategy the draft config already decides (its projector): they must agree, and no
// other strategy's key may be set away from its default (it would change nothing, silently).
static df_status check_strategy(const df_recipe *rc, const df_draft_config *cfg, df_error *err) {
  const df_strategy *want = df_strategy_find(rc->training.strategy), *is = df_strategy_of(cfg);
  if (!is)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, cfg->source, "train a draft kind draftforge has a strategy for",
                   "%s: no strategy trains a %s draft", cfg->source, df_draft_kind_name(cfg->kind));
  if (want != is) {
    char hint[96];
    snprintf(hint, sizeof hint, "set training.strategy: %s for this draft config", is->name);
    return DF_FAIL(err, DF_ERR_INVALID, "training.strategy", hint, "%s: training.strategy is %s but %s is a %s draft",
                   rc->path, rc->training.strategy, cfg->source, is->name);
  }
  for (int i = 0; df_strategies[i]; i++)
    for (int k = 0; df_strategies[i] != is && df_strategies[i]->keys[k]; k++) {
      const char *key = df_strategies[i]->keys[k];
      if (df_recipe_is_default(rc, "training", key)) continue;
      char where[96], hint[160];
      snprintf(where, sizeof where, "training.%s", key);
      snprintf(hint, sizeof hint, "drop training.%s: it belongs to the %s strategy", key, df_strategies[i]->name);
      return DF_FAIL(err, DF_ERR_INVALID, where, hint, "%s: training.%s does not apply to a %s draft (%s)", rc->path,
                     key, is->name, cfg->source);
    }
  return DF_OK;
}

// The captured layers of an EAGLE-3 draft against its target (model.aux_hidden_state_layer_ids, the config's
// eagle_config, else SpecForge's default): the resolved config replaces the loaded one.
static df_status resolve_capture(const df_recipe *rc, df_run_resources *t, df_error *err) {
  const df_draft_config *resolved = NULL;
  DF_TRY(df_draft_config_resolve_capture(t->draft, t->target->num_hidden_layers, rc->model.aux_layer_ids,
                                         rc->model.num_aux_layer_ids, &resolved, err));
  if (!resolved) return DF_OK;
  df_draft_config_free(t->draft);
  t->draft = resolved;
  return DF_OK;
}

// P-EAGLE's training.norm_before_residual, when set, overrides the draft config's (SpecForge's build_peagle_draft): the
// config checkpoints and exports write says what was trained.
static df_status resolve_norm_before_residual(const df_recipe *rc, df_run_resources *t, df_error *err) {
  const df_strategy_values v = df_recipe_strategy_values(rc);
  double nbr = 0;
  if (t->draft->kind != DF_DRAFT_PEAGLE || !v.number(v.self, "norm_before_residual", &nbr)) return DF_OK;
  if ((nbr != 0) == t->draft->eagle3.norm_before_residual) return DF_OK;
  const df_draft_config *set = NULL;
  DF_TRY(df_draft_config_set_bool(t->draft, "norm_before_residual", nbr != 0, &set, err));
  df_draft_config_free(t->draft);
  t->draft = set;
  return DF_OK;
}

df_status df_run_resources_load(const df_recipe *rc, df_run_resources *out, df_error *err) {
  return df_run_resources_load_ex(rc, NULL, out, err);
}

static df_status load(const df_recipe *rc, const char *draft_config_path, bool shapes, df_run_resources *out,
                      df_error *err) {
  memset(out, 0, sizeof *out);
  df_status st = df_target_config_from_dir(rc->model.target_model_path, &out->target, err);
  if (st == DF_OK)
    st = draft_config_path ? df_draft_config_from_file(draft_config_path, &out->draft, err)
                           : load_draft_config(rc, &out->draft, err);
  if (st == DF_OK) st = check_strategy(rc, out->draft, err);
  if (st == DF_OK) st = resolve_capture(rc, out, err);
  if (st == DF_OK) st = resolve_norm_before_residual(rc, out, err);
  if (st == DF_OK) st = df_draft_config_check_target(out->draft, out->target, err);
  if (st == DF_OK) st = shapes ? size_pieces(out) : load_pieces(rc, out, err);
  if (st == DF_OK) st = resolve_mask_token(rc, out, &out->mask_token_id, err);
  if (st == DF_OK) st = df_draft_config_resolved_json(out->draft, out->mask_token_id, &out->resolved_config, err);
  if (st != DF_OK) df_run_resources_free(out);
  return st;
}

df_status df_run_resources_load_ex(const df_recipe *rc, const char *draft_config_path, df_run_resources *out,
                                   df_error *err) {
  return load(rc, draft_config_path, false, out, err);
}

df_status df_run_resources_load_shapes(const df_recipe *rc, df_run_resources *out, df_error *err) {
  return load(rc, NULL, true, out, err);
}

df_dtype df_run_storage(const df_recipe *rc, const df_ctx *ctx, const char **why) {
  if (rc->model.torch_dtype == DF_F32) return *why = "model.torch_dtype: float32", DF_F32;
  if (df_ctx_device(ctx) != DF_DEV_CUDA)
    return *why = "model.torch_dtype: bfloat16, but the CPU backend computes in float32", DF_F32;
  return *why = "model.torch_dtype: bfloat16", DF_BF16;
}

df_status df_run_resources_place(df_run_resources *r, df_ctx *ctx, df_error *err) {
  return df_run_resources_place_as(r, ctx, DF_F32, err);
}

df_status df_run_resources_place_as(df_run_resources *r, df_ctx *ctx, df_dtype dt, df_error *err) {
  if (dt != DF_F32) { // bf16: rounded once on the device from an fp32 upload (freed before training starts)
    const int64_t n = r->frozen.vocab * r->frozen.hidden;
    const df_device dev = df_ctx_device(ctx);
    if (!r->frozen.embed && !df_ctx_measuring(ctx))
      return DF_FAIL(err, DF_ERR_INVALID, "target pieces", "load them (df_run_resources_load) to place them",
                     "the frozen pieces were only sized (a memory plan)");
    float *tmp = NULL;
    DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_FROZEN, sizeof(float) * (size_t)n, (void **)&tmp, err));
    const void *src[2] = {r->frozen.embed, r->frozen.lm_head};
    void *dst[2] = {NULL, NULL};
    df_status st = DF_OK;
    for (int i = 0; i < 2 && st == DF_OK; i++) {
      st = df_buffer_alloc_as(ctx, DF_MEM_FROZEN, df_dtype_size(dt) * (size_t)n, &dst[i], err);
      if (st == DF_OK && src[i]) st = df_copy(ctx, tmp, dev, src[i], DF_DEV_CPU, sizeof(float) * (size_t)n, err);
      df_tensor a = df_f32_on(dev, tmp, n), b = df_view_on(dt, dev, dst[i], n);
      if (st == DF_OK) st = df_cast(ctx, &a, &b, err);
    }
    df_buffer_free(ctx, tmp);
    r->placed = ctx, r->dev_embed = dst[0], r->dev_head = dst[1];
    if (st != DF_OK) return st;
    r->frozen.embed = r->dev_embed, r->frozen.lm_head = r->dev_head, r->frozen.dtype = dt;
    return DF_OK;
  }
  if (df_ctx_host_addressable(ctx)) return DF_OK;
  if (!r->frozen.embed && !df_ctx_measuring(ctx))
    return DF_FAIL(err, DF_ERR_INVALID, "target pieces", "load them (df_run_resources_load) to place them",
                   "the frozen pieces were only sized (a memory plan) and %s is not a measuring context",
                   df_ctx_backend_name(ctx));
  const size_t bytes = sizeof(float) * (size_t)(r->frozen.vocab * r->frozen.hidden);
  r->placed = ctx;
  DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_FROZEN, bytes, (void **)&r->dev_embed, err));
  DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_FROZEN, bytes, (void **)&r->dev_head, err));
  DF_TRY(df_copy(ctx, r->dev_embed, df_ctx_device(ctx), r->frozen.embed, DF_DEV_CPU, bytes, err));
  DF_TRY(df_copy(ctx, r->dev_head, df_ctx_device(ctx), r->frozen.lm_head, DF_DEV_CPU, bytes, err));
  r->frozen.embed = r->dev_embed, r->frozen.lm_head = r->dev_head;
  return DF_OK;
}

void df_run_resources_free(df_run_resources *r) {
  json_decref(r->resolved_config);
  if (r->placed) df_buffer_free(r->placed, r->dev_embed), df_buffer_free(r->placed, r->dev_head);
  free(r->scaled_head);
  df_target_pieces_free(&r->pieces);
  df_draft_config_free(r->draft);
  df_target_config_free(r->target);
  memset(r, 0, sizeof *r);
}
