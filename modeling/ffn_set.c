// A model's FFNs as a run drives them (modeling/ffn.h df_ffn_set): each call goes to the kind's hook, and a dense
// model (no kind) has nothing to do, so train/ never asks which kind it holds.
#include "modeling/ffn.h"

bool df_ffn_set_active(const df_ffn_set *s) { return s && s->kind; }

df_status df_ffn_set_save(const df_ffn_set *s, const df_params *p, const float *flat, const char *path,
                          const df_save_options *so, df_error *err) {
  if (df_ffn_set_active(s) && s->kind->save) return s->kind->save(s->cfg, p, flat, path, so, err);
  return df_params_save(p, flat, path, so, err);
}

void df_ffn_set_collective(const df_ffn_set *s, const df_collective *c) {
  if (df_ffn_set_active(s) && s->kind->set_collective) s->kind->set_collective(s->ffns, s->n, c);
}

int64_t df_ffn_set_stats_elems(const df_ffn_set *s) {
  return df_ffn_set_active(s) && s->kind->stats_elems ? s->kind->stats_elems(s->ffns, s->n) : 0;
}

void df_ffn_set_stats(const df_ffn_set *s, double *sums, double den) {
  if (df_ffn_set_active(s) && s->kind->set_stats) s->kind->set_stats(s->ffns, s->n, sums, den);
}

double df_ffn_set_loss_term(const df_ffn_set *s) {
  return df_ffn_set_active(s) && s->kind->loss_term ? s->kind->loss_term(s->ffns, s->n) : 0.0;
}

void df_ffn_set_loss_term_grad(const df_ffn_set *s, float scale) {
  if (df_ffn_set_active(s) && s->kind->set_loss_term_grad) s->kind->set_loss_term_grad(s->ffns, s->n, scale);
}

df_status df_ffn_set_apply_pending(const df_ffn_set *s, df_error *err) {
  if (df_ffn_set_active(s) && s->kind->apply_pending) return s->kind->apply_pending(s->ffns, s->n, err);
  return DF_OK;
}

double df_ffn_set_stats_loss_num(const df_ffn_set *s, const double *sums) {
  return df_ffn_set_active(s) && s->kind->stats_loss_num ? s->kind->stats_loss_num(s->ffns, s->n, sums) : 0.0;
}

void df_ffn_set_stats_json(const df_ffn_set *s, const double *sums, int micro, json_t *o) {
  if (df_ffn_set_active(s) && s->kind->stats_json) s->kind->stats_json(s->ffns, s->n, sums, micro, o);
}

// ---- from a draft config alone -----------------------------------------------------------------------------------

static df_ffn_set config_set(const df_draft_config *cfg) {
  return (df_ffn_set){.kind = cfg->ffn_kind, .cfg = cfg->moe};
}

df_status df_ffn_config_save(const df_draft_config *cfg, const df_params *p, const float *flat, const char *path,
                             const df_save_options *so, df_error *err) {
  const df_ffn_set s = config_set(cfg);
  return df_ffn_set_save(&s, p, flat, path, so, err);
}

df_status df_ffn_export_check(const df_draft_config *cfg, df_error *err) {
  const df_ffn_kind *k = cfg->ffn_kind;
  return k && k->export_check ? k->export_check(cfg->moe, err) : DF_OK;
}

df_status df_ffn_export_draft_json(const df_draft_config *cfg, json_t **out, df_error *err) {
  *out = NULL;
  const df_ffn_kind *k = cfg->ffn_kind;
  return k && k->export_draft_json ? k->export_draft_json(cfg->moe, cfg->json, out, err) : DF_OK;
}

df_status df_ffn_export_weights(const df_draft_config *cfg, const df_params *sp, const float *sflat,
                                const df_params *dp, float *dflat, df_error *err) {
  const df_ffn_kind *k = cfg->ffn_kind;
  if (!k || !k->export_weights)
    return DF_FAIL(err, DF_ERR_INVALID, "ffn", NULL, "this FFN kind has no export transform");
  return k->export_weights(cfg->moe, sp, sflat, dp, dflat, err);
}

df_status df_ffn_export_config(const df_draft_config *cfg, json_t *norm, const char *serving_class, df_error *err) {
  const df_ffn_kind *k = cfg->ffn_kind;
  return k && k->export_config ? k->export_config(cfg->moe, norm, serving_class, err) : DF_OK;
}
