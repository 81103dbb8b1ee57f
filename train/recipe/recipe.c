// Recipe loading: the libyaml document walk over the schema table (unknown keys, duplicates, nested sections,
// default-only keys), required keys, cross-key rules, and the resolution into the immutable df_recipe.
#include "train/recipe/recipe.h"

#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "train/recipe/recipe_internal.h"

typedef struct {
  df_recipe pub; // first: df_recipe_free casts back
  df_rvalue *vals;
  int nvals;
} recipe_impl;

typedef struct {
  const char *file;
  const df_recipe_options *opt;
  yaml_document_t *doc;
  df_rvalue *vals;
  df_error *err;
} walker;

const df_rvalue *df_recipe_values(const df_recipe *r) { return ((const recipe_impl *)r)->vals; }

static df_rpos node_pos(const walker *w, const yaml_node_t *n) {
  return (df_rpos){w->file, (int)n->start_mark.line + 1, (int)n->start_mark.column + 1};
}

// ---- unknown keys: a suggestion and the section's valid keys -------------------------------------------------

static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63) return 99;
  int d[64][64];
  for (int i = 0; i <= la; i++) d[i][0] = i;
  for (int j = 0; j <= lb; j++) d[0][j] = j;
  for (int i = 1; i <= la; i++)
    for (int j = 1; j <= lb; j++) {
      int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[la][lb];
}

static const char *closest_key(const char *section, const char *key) {
  const df_recipe_key *t = df_recipe_schema();
  const char *best = NULL;
  int best_d = (int)strlen(key) / 3 + 1;
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    if (strcmp(t[i].section, section)) continue;
    int d = edit_distance(key, t[i].key);
    if (d <= best_d) best = t[i].key, best_d = d;
  }
  return best;
}

// The section's keys, those draftforge reads first, as many as fit in n bytes ("…, and 12 more").
static void list_keys(const char *section, char *buf, size_t n) {
  const df_recipe_key *t = df_recipe_schema();
  size_t len = 0;
  int shown = 0, total = 0;
  bool full = false;
  buf[0] = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < df_recipe_schema_count(); i++) {
      if (strcmp(t[i].section, section) || (t[i].support == DF_RS_USED) != (pass == 0)) continue;
      total++;
      full = full || len + strlen(t[i].key) + 2 + 20 >= n;
      if (full) continue;
      len += (size_t)snprintf(buf + len, n - len, "%s%s", shown ? ", " : "", t[i].key);
      shown++;
    }
  if (shown < total) snprintf(buf + len, n - len, ", and %d more", total - shown);
}

static df_status fail_unknown(walker *w, const char *section, const char *key, df_rpos pos) {
  static const char more[] = " (`draftforge schema` lists every key)";
  char where[256], hint[256];
  const char *near = closest_key(section, key);
  int len = near ? snprintf(hint, sizeof hint, "did you mean '%.60s'? valid keys: ", near)
                 : snprintf(hint, sizeof hint, "valid keys: ");
  list_keys(section, hint + len, sizeof hint - (size_t)len - sizeof more);
  snprintf(hint + strlen(hint), sizeof hint - strlen(hint), "%s", more);
  snprintf(where, sizeof where, "%s%s%s", section, section[0] ? "." : "", key);
  char mean[96] = "";
  if (near) snprintf(mean, sizeof mean, " (did you mean '%.60s'?)", near);
  return DF_FAIL(w->err, DF_ERR_INVALID, where, hint, "%s:%d:%d: unknown key '%s' in %s%s%s%s", pos.file, pos.line,
                 pos.col, key, section[0] ? "section '" : "the top level", section, section[0] ? "'" : "", mean);
}

// ---- the walk ----------------------------------------------------------------------------------------------

static df_status walk_mapping(walker *w, yaml_node_t *map, const char *section);

static df_status fail_unsupported(walker *w, const df_recipe_key *k, const df_rvalue *v) {
  char kp[160], val[128];
  df_recipe_key_path(k, kp, sizeof kp);
  df_rvalue_text(k, v, val, sizeof val);
  char hint[256];
  if (k->hint)
    snprintf(hint, sizeof hint, "%s", k->hint);
  else
    snprintf(hint, sizeof hint, "remove %s or set it to its default (%s)", k->key, df_recipe_key_default_text(k));
  return DF_FAIL(w->err, DF_ERR_UNSUPPORTED, kp, hint, "%s:%d:%d: %s = %s is not supported by draftforge yet: %s",
                 w->file, v->line, v->col, kp, val, k->note ? k->note : "not implemented");
}

// A default-only key must hold its default; an enum must hold one of the values draftforge implements.
static df_status check_support(walker *w, const df_recipe_key *k, const df_rvalue *v) {
  if (k->supported && !v->is_null) {
    for (int i = 0; k->supported[i]; i++)
      if (!strcmp(k->supported[i], v->s)) return DF_OK;
    return fail_unsupported(w, k, v);
  }
  if (k->support != DF_RS_DEFAULT_ONLY) return DF_OK;
  df_rvalue def;
  DF_TRY(df_rvalue_default(k, &def, w->err));
  bool same = df_rvalue_equal(k, v, &def);
  df_rvalue_clear(&def);
  return same ? DF_OK : fail_unsupported(w, k, v);
}

static df_status section_value(walker *w, int idx, yaml_node_t *node, df_rpos pos) {
  const df_recipe_key *k = &df_recipe_schema()[idx];
  df_rvalue *v = &w->vals[idx];
  v->present = true, v->line = pos.line, v->col = pos.col;
  char child[160];
  df_recipe_key_path(k, child, sizeof child);
  if (node->type == YAML_SCALAR_NODE && node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
      (!node->data.scalar.length || !strcmp((const char *)node->data.scalar.value, "null") ||
       !strcmp((const char *)node->data.scalar.value, "~"))) {
    v->is_null = true;
    if (k->nullable) return DF_OK;
    return DF_FAIL(w->err, DF_ERR_INVALID, child, "give it keys, or remove it to take the defaults",
                   "%s:%d:%d: %s: expected a mapping, got null", w->file, pos.line, pos.col, child);
  }
  if (node->type != YAML_MAPPING_NODE)
    return DF_FAIL(w->err, DF_ERR_INVALID, child, "write its keys indented below it",
                   "%s:%d:%d: %s: expected a mapping", w->file, pos.line, pos.col, child);
  if (k->support == DF_RS_DEFAULT_ONLY) return fail_unsupported(w, k, v);
  return walk_mapping(w, node, child);
}

static df_status pair_value(walker *w, const char *section, yaml_node_t *key, yaml_node_t *val) {
  df_rpos kpos = node_pos(w, key);
  if (key->type != YAML_SCALAR_NODE)
    return DF_FAIL(w->err, DF_ERR_INVALID, section, "keys are plain names", "%s:%d:%d: a key that is not a name",
                   w->file, kpos.line, kpos.col);
  const char *name = (const char *)key->data.scalar.value;
  int idx = df_recipe_schema_find(section, name);
  if (idx < 0) return fail_unknown(w, section, name, kpos);
  const df_recipe_key *k = &df_recipe_schema()[idx];
  df_rvalue *v = &w->vals[idx];
  if (v->present) {
    char kp[160];
    return DF_FAIL(w->err, DF_ERR_INVALID, df_recipe_key_path(k, kp, sizeof kp), "keep one of them",
                   "%s:%d:%d: duplicate key '%s' (first at line %d)", w->file, kpos.line, kpos.col, name, v->line);
  }
  df_rpos vpos = node_pos(w, val);
  if (k->type == DF_RT_SECTION) return section_value(w, idx, val, vpos);
  DF_TRY(df_rvalue_from_node(k, w->doc, val, vpos, v, w->err));
  return check_support(w, k, v);
}

static df_status walk_mapping(walker *w, yaml_node_t *map, const char *section) {
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    yaml_node_t *key = yaml_document_get_node(w->doc, p->key), *val = yaml_document_get_node(w->doc, p->value);
    DF_TRY(pair_value(w, section, key, val));
  }
  return DF_OK;
}

// ---- --set overrides ------------------------------------------------------------------------------------------

// The value text of an override as a YAML node: scalars, flow lists; an empty value is null.
static df_status override_node(const char *label, const char *text, yaml_document_t *doc, bool *loaded, df_error *err) {
  *loaded = false;
  if (!text[0]) return DF_OK;
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return DF_FAIL(err, DF_ERR_NOMEM, label, NULL, "cannot start the YAML parser");
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
  bool ok = yaml_parser_load(&parser, doc);
  yaml_parser_delete(&parser);
  if (!ok)
    return DF_FAIL(err, DF_ERR_INVALID, label, "quote the value, or write a list as [a, b]",
                   "%s: the value is not valid YAML", label);
  *loaded = true;
  return DF_OK;
}

// "section.key=value": the key must exist (an unknown one is reported like a file's, with the valid keys) and
// not be a section; the value passes the same checks as in a file and replaces it.
static df_status apply_override(walker *w, const char *text) {
  const char *eq = strchr(text, '=');
  char label[320], path[200];
  snprintf(label, sizeof label, "--set '%.300s'", text);
  if (!eq || eq == text || (size_t)(eq - text) >= sizeof path)
    return DF_FAIL(w->err, DF_ERR_INVALID, text, "write --set section.key=value, e.g. --set training.max_steps=100",
                   "%s: expected section.key=value", label);
  memcpy(path, text, (size_t)(eq - text));
  path[eq - text] = 0;
  char *dot = strrchr(path, '.');
  const char *section = dot ? path : "", *key = dot ? dot + 1 : path;
  if (dot) *dot = 0;
  walker sub = *w;
  sub.file = label;
  df_rpos kpos = {label, 1, 1}, vpos = {label, 1, (int)(eq - text) + 2};
  if (section[0] && !df_recipe_schema_is_section(section)) {
    char *pdot = strrchr(path, '.');
    const char *psec = pdot ? path : "", *pkey = pdot ? pdot + 1 : path;
    if (pdot) *pdot = 0;
    return fail_unknown(&sub, psec, pkey, kpos);
  }
  int idx = df_recipe_schema_find(section, key);
  if (idx < 0) return fail_unknown(&sub, section, key, kpos);
  const df_recipe_key *k = &df_recipe_schema()[idx];
  char kp[160];
  df_recipe_key_path(k, kp, sizeof kp);
  if (k->type == DF_RT_SECTION)
    return DF_FAIL(w->err, DF_ERR_INVALID, kp, "set one of its keys: --set section.key=value",
                   "%s: %s is a section, not a value", label, kp);
  yaml_document_t doc;
  bool loaded;
  DF_TRY(override_node(label, eq + 1, &doc, &loaded, w->err));
  yaml_node_t empty = {.type = YAML_SCALAR_NODE};
  empty.data.scalar.value = (yaml_char_t *)"";
  empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
  yaml_node_t *node = loaded ? yaml_document_get_root_node(&doc) : NULL;
  df_rvalue *v = &w->vals[idx];
  df_rvalue_clear(v);
  df_status st = df_rvalue_from_node(k, loaded ? &doc : NULL, node ? node : &empty, vpos, v, w->err);
  v->from_cli = true;
  if (st == DF_OK) st = check_support(&sub, k, v);
  if (loaded) yaml_document_delete(&doc);
  return st;
}

df_status df_recipe_check_overrides(const char *const *overrides, int n, df_error *err) {
  df_rvalue *vals = calloc((size_t)df_recipe_schema_count(), sizeof *vals);
  if (!vals) return DF_FAIL(err, DF_ERR_NOMEM, "--set", NULL, "out of memory");
  walker w = {"--set", NULL, NULL, vals, err};
  df_status st = DF_OK;
  for (int i = 0; i < n && st == DF_OK; i++) st = apply_override(&w, overrides[i]);
  for (int i = 0; i < df_recipe_schema_count(); i++) df_rvalue_clear(&vals[i]);
  free(vals);
  return st;
}

// Absent keys take their defaults; required keys must be present; defaults must be implemented too.
static df_status fill_defaults(walker *w) {
  const df_recipe_key *t = df_recipe_schema();
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    if (w->vals[i].present) continue;
    char kp[160];
    df_recipe_key_path(&t[i], kp, sizeof kp);
    if (t[i].required)
      return DF_FAIL(w->err, DF_ERR_INVALID, kp, "add it to the recipe", "%s: missing required key %s", w->file, kp);
    if (t[i].type == DF_RT_SECTION) continue;
    DF_TRY(df_rvalue_default(&t[i], &w->vals[i], w->err));
    if (t[i].supported && !w->vals[i].is_null) {
      int j = 0;
      while (t[i].supported[j] && strcmp(t[i].supported[j], w->vals[i].s)) j++;
      if (!t[i].supported[j])
        return DF_FAIL(w->err, DF_ERR_UNSUPPORTED, kp, "set it explicitly",
                       "%s: %s defaults to '%s', which draftforge does not implement (supported: %s)", w->file, kp,
                       w->vals[i].s, t[i].supported[0]);
    }
  }
  return DF_OK;
}

// ---- resolution ----------------------------------------------------------------------------------------------

static const df_rvalue *val(const recipe_impl *r, const char *section, const char *key) {
  int i = df_recipe_schema_find(section, key);
  return i < 0 ? NULL : &r->vals[i];
}

static const char *str_or_null(const df_rvalue *v) { return v->is_null || !v->s[0] ? NULL : v->s; }

static int64_t int_or_zero(const df_rvalue *v) { return v->is_null ? 0 : v->i; }

static void build_trainer(const recipe_impl *r, df_recipe *p) {
  p->training.num_epochs = val(r, "training", "num_epochs")->i;
  p->training.max_steps = int_or_zero(val(r, "training", "max_steps"));
  p->training.total_steps = int_or_zero(val(r, "training", "total_steps"));
  p->training.accumulation_steps = val(r, "training", "accumulation_steps")->i;
  p->training.learning_rate = val(r, "training", "learning_rate")->f;
  p->training.lr_scheduler = (df_lr_kind)val(r, "training", "lr_scheduler")->choice;
  p->training.device = (df_device_choice)val(r, "training", "device")->choice;
  p->training.fsdp_sharding = (df_shard_kind)val(r, "training", "fsdp_sharding")->choice;
  p->training.warmup_ratio = val(r, "training", "warmup_ratio")->f;
  p->training.max_grad_norm = val(r, "training", "max_grad_norm")->f;
  p->training.weight_decay = val(r, "training", "weight_decay")->f;
  p->training.adam_beta1 = val(r, "training", "adam_beta1")->f;
  p->training.adam_beta2 = val(r, "training", "adam_beta2")->f;
  p->training.adam_eps = val(r, "training", "adam_eps")->f;
  p->training.max_consecutive_skips = val(r, "training", "max_consecutive_skips")->i;
  p->training.save_interval = val(r, "training", "save_interval")->i;
  p->training.save_interval_minutes = val(r, "training", "save_interval_minutes")->f;
  p->training.eval_interval = val(r, "training", "eval_interval")->i;
  p->training.log_interval = val(r, "training", "log_interval")->i;
  p->training.max_checkpoints = val(r, "training", "max_checkpoints")->i;
  p->training.resume_from = str_or_null(val(r, "training", "resume_from"));
  p->training.dist_timeout = val(r, "training", "dist_timeout")->f;
  p->training.dp_bucket_mb = val(r, "training", "dp_bucket_mb")->f;
  const df_rvalue *nn = val(r, "deployment.trainer", "nnodes"), *np = val(r, "deployment.trainer", "nproc_per_node");
  const df_rvalue *nr = val(r, "deployment.trainer", "node_rank"), *mp = val(r, "deployment.trainer", "master_port");
  p->deployment.trainer.nnodes = nn->i, p->deployment.trainer.nnodes_set = nn->present;
  p->deployment.trainer.nproc_per_node = np->i, p->deployment.trainer.nproc_per_node_set = np->present;
  p->deployment.trainer.node_rank = int_or_zero(nr), p->deployment.trainer.node_rank_set = nr->present && !nr->is_null;
  p->deployment.trainer.master_port = mp->i, p->deployment.trainer.master_port_set = mp->present;
  p->deployment.trainer.master_addr = str_or_null(val(r, "deployment.trainer", "master_addr"));
}

static void build_tracking(const recipe_impl *r, df_recipe *p) {
  p->tracking.report_to = (df_report_to)val(r, "tracking", "report_to")->choice;
  p->tracking.wandb_project = str_or_null(val(r, "tracking", "wandb_project"));
  p->tracking.wandb_name = str_or_null(val(r, "tracking", "wandb_name"));
  p->tracking.wandb_key = str_or_null(val(r, "tracking", "wandb_key"));
  p->tracking.wandb_dir = str_or_null(val(r, "tracking", "wandb_dir"));
  p->tracking.wandb_offline = val(r, "tracking", "wandb_offline")->b;
  p->tracking.swanlab_project = str_or_null(val(r, "tracking", "swanlab_project"));
  p->tracking.swanlab_name = str_or_null(val(r, "tracking", "swanlab_name"));
  p->tracking.swanlab_key = str_or_null(val(r, "tracking", "swanlab_key"));
  p->tracking.mlflow_tracking_uri = str_or_null(val(r, "tracking", "mlflow_tracking_uri"));
  p->tracking.mlflow_experiment_name = str_or_null(val(r, "tracking", "mlflow_experiment_name"));
  p->tracking.mlflow_run_name = str_or_null(val(r, "tracking", "mlflow_run_name"));
}

static void build_public(recipe_impl *r, const char *name) {
  df_recipe *p = &r->pub;
  p->path = name;
  p->run_id = val(r, "", "run_id")->s;
  p->output_dir = val(r, "", "output_dir")->s;
  p->model.target_model_path = val(r, "model", "target_model_path")->s;
  p->model.draft_model_config = str_or_null(val(r, "model", "draft_model_config"));
  p->model.draft_checkpoint_path = str_or_null(val(r, "model", "draft_checkpoint_path"));
  p->model.embedding_key = val(r, "model", "embedding_key")->s;
  p->model.load_target_embedding = val(r, "model", "load_target_embedding")->b;
  p->model.lm_head_key = val(r, "model", "lm_head_key")->s;
  p->model.torch_dtype = val(r, "model", "torch_dtype")->choice == 2 ? DF_F32 : DF_BF16;
  const df_rvalue *mask = val(r, "model", "mask_token_id");
  p->model.has_mask_token_id = !mask->is_null, p->model.mask_token_id = mask->is_null ? -1 : mask->i;
  const df_rvalue *aux = val(r, "model", "aux_hidden_state_layer_ids");
  p->model.num_aux_layer_ids = aux->is_null ? 0 : (aux->n < 8 ? aux->n : 8);
  for (int i = 0; i < p->model.num_aux_layer_ids; i++) p->model.aux_layer_ids[i] = (int)aux->il[i];
  p->model.vocab_mapping_path = str_or_null(val(r, "model", "vocab_mapping_path"));
  if (p->model.vocab_mapping_path && !p->model.vocab_mapping_path[0]) p->model.vocab_mapping_path = NULL;
  p->data.hidden_states_path = str_or_null(val(r, "data", "hidden_states_path"));
  p->data.train_data_path = str_or_null(val(r, "data", "train_data_path"));
  if (!p->data.train_data_path) p->data.train_data_path = str_or_null(val(r, "data", "prompts_path"));
  p->data.eval_hidden_states_path = str_or_null(val(r, "data", "eval_hidden_states_path"));
  p->data.eval_data_path = str_or_null(val(r, "data", "eval_data_path"));
  p->data.max_length = val(r, "data", "max_length")->i;
  p->data.chat_template = val(r, "data", "chat_template")->s;
  p->data.cache_dir = val(r, "data", "cache_dir")->s;
  p->data.train_only_last_turn = val(r, "data", "train_only_last_turn")->b;
  p->data.is_preformatted = val(r, "data", "is_preformatted")->b;
  p->data.max_prompts = int_or_zero(val(r, "data", "max_prompts"));
  p->data.online_feature_dtype = val(r, "data", "online_feature_dtype")->choice == 1 ? DF_F32 : DF_BF16;
  p->training.strategy = val(r, "training", "strategy")->s;
  p->training.batch_size = val(r, "training", "batch_size")->i;
  p->training.num_anchors = val(r, "training", "num_anchors")->i;
  const df_rvalue *gamma = val(r, "training", "loss_decay_gamma");
  p->training.loss_decay_gamma = gamma->is_null ? 0.0 : gamma->f;
  p->training.objective_chunk_blocks = val(r, "training", "objective_chunk_blocks")->i;
  p->training.seed = (uint64_t)val(r, "training", "seed")->i;
  build_trainer(r, p);
  build_tracking(r, p);
}

// The trainer's rules between keys: the schedule horizon bounds the stop, and eval needs an eval set.
static df_status trainer_checks(const recipe_impl *r, const char *file, df_error *err) {
  const df_rvalue *max = val(r, "training", "max_steps"), *total = val(r, "training", "total_steps");
  if (!max->is_null && !total->is_null && max->i > total->i)
    return DF_FAIL(err, DF_ERR_INVALID, "training.max_steps",
                   "raise training.total_steps (it fixes the LR schedule) or lower training.max_steps",
                   "%s: training.max_steps = %lld is past training.total_steps = %lld, where the schedule ends", file,
                   (long long)max->i, (long long)total->i);
  const bool eval_set = val(r, "data", "eval_hidden_states_path")->s[0] || val(r, "data", "eval_data_path")->s[0];
  if (val(r, "training", "eval_interval")->i > 0 && !eval_set)
    return DF_FAIL(err, DF_ERR_INVALID, "training.eval_interval",
                   "set data.eval_hidden_states_path (captured) or data.eval_data_path (online), or "
                   "training.eval_interval: 0",
                   "%s: training.eval_interval = %lld needs eval data", file,
                   (long long)val(r, "training", "eval_interval")->i);
  return DF_OK;
}

// The data sources: exactly one for training (SpecForge's rule), at most one for eval, online-only keys.
static df_status data_checks(const recipe_impl *r, const char *file, df_error *err) {
  const bool hs = val(r, "data", "hidden_states_path")->s[0], td = val(r, "data", "train_data_path")->s[0];
  const bool pp = val(r, "data", "prompts_path")->s[0];
  if (hs + td + pp != 1)
    return DF_FAIL(
        err, DF_ERR_INVALID, hs + td + pp ? "data.train_data_path" : "data.hidden_states_path",
        "offline: data.hidden_states_path (captured shards); online: data.train_data_path (conversations "
        "or a token JSONL)",
        "%s: set exactly one of data.train_data_path, data.prompts_path and data.hidden_states_path (%d set)", file,
        hs + td + pp);
  if (val(r, "data", "eval_hidden_states_path")->s[0] && val(r, "data", "eval_data_path")->s[0])
    return DF_FAIL(err, DF_ERR_INVALID, "data.eval_data_path", "keep one eval source",
                   "%s: data.eval_hidden_states_path and data.eval_data_path are both set", file);
  const df_rvalue *mp = val(r, "data", "max_prompts");
  if (hs && !mp->is_null && mp->i > 0)
    return DF_FAIL(err, DF_ERR_INVALID, "data.max_prompts", "remove it, or train online (data.train_data_path)",
                   "%s: data.max_prompts limits online data; this run reads data.hidden_states_path", file);
  return DF_OK;
}

// Rules between keys that SpecForge's validators enforce and that touch keys draftforge accepts.
static df_status cross_checks(const recipe_impl *r, const char *file, df_error *err) {
  DF_TRY(data_checks(r, file, err));
  if (!val(r, "model", "target_model_path")->s[0])
    return DF_FAIL(err, DF_ERR_INVALID, "model.target_model_path", "point it at the target model directory",
                   "%s: model.target_model_path is empty", file);
  if (val(r, "runtime", "in_flight_low_watermark")->i > val(r, "runtime", "in_flight_high_watermark")->i)
    return DF_FAIL(err, DF_ERR_INVALID, "runtime.in_flight_low_watermark", NULL,
                   "%s: runtime.in_flight_low_watermark must be <= runtime.in_flight_high_watermark", file);
  if (val(r, "training", "down_sample_ratio_min")->f > val(r, "training", "down_sample_ratio")->f)
    return DF_FAIL(err, DF_ERR_INVALID, "training.down_sample_ratio_min", NULL,
                   "%s: training.down_sample_ratio_min must be <= training.down_sample_ratio", file);
  return trainer_checks(r, file, err);
}

static df_status resolve(recipe_impl *r, const char *file, const char *base_dir, bool missing_ok, df_error *err) {
  DF_TRY(cross_checks(r, file, err));
  return df_recipe_resolve_paths(r->vals, file, base_dir, missing_ok, err);
}

// ---- entry points ------------------------------------------------------------------------------------------

static df_status load_document(const char *text, size_t len, const char *name, yaml_document_t *doc, df_error *err) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "cannot start the YAML parser");
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  df_status st = DF_OK;
  if (!yaml_parser_load(&parser, doc)) {
    st = DF_FAIL(err, DF_ERR_FORMAT, name, "fix the YAML syntax", "%s:%d:%d: YAML error: %s%s%s", name,
                 (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
                 parser.problem ? parser.problem : "malformed", parser.context ? " " : "",
                 parser.context ? parser.context : "");
  } else {
    yaml_document_t extra;
    if (yaml_parser_load(&parser, &extra)) {
      bool more = yaml_document_get_root_node(&extra) != NULL;
      yaml_document_delete(&extra);
      if (more)
        st = DF_FAIL(err, DF_ERR_FORMAT, name, "keep one document per recipe", "%s: more than one YAML document", name);
    }
    if (st != DF_OK) yaml_document_delete(doc);
  }
  yaml_parser_delete(&parser);
  return st;
}

void df_recipe_free(const df_recipe *r) {
  if (!r) return;
  recipe_impl *impl = (recipe_impl *)r;
  for (int i = 0; i < impl->nvals; i++) df_rvalue_clear(&impl->vals[i]);
  free(impl->vals);
  free((char *)impl->pub.path);
  free(impl);
}

static df_status walk_document(walker *w, yaml_document_t *doc) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  if (!root)
    return DF_FAIL(w->err, DF_ERR_FORMAT, w->file, "write the model/data/training sections", "%s: empty recipe",
                   w->file);
  if (root->type != YAML_MAPPING_NODE)
    return DF_FAIL(w->err, DF_ERR_FORMAT, w->file,
                   "the top level holds sections such as model:, data:", "%s:%d:%d: the recipe is not a mapping",
                   w->file, (int)root->start_mark.line + 1, (int)root->start_mark.column + 1);
  DF_TRY(df_recipe_feature_gate(doc, w->file, w->opt, w->err));
  DF_TRY(walk_mapping(w, root, ""));
  for (int i = 0; w->opt && i < w->opt->n_overrides; i++) DF_TRY(apply_override(w, w->opt->overrides[i]));
  return fill_defaults(w);
}

df_status df_recipe_parse(const char *text, size_t len, const char *name, const char *base_dir,
                          const df_recipe_options *opt, const df_recipe **out, df_error *err) {
  *out = NULL;
  recipe_impl *r = calloc(1, sizeof *r);
  if (r) r->vals = calloc((size_t)df_recipe_schema_count(), sizeof *r->vals);
  if (r) r->pub.path = strdup(name ? name : "<recipe>");
  if (!r || !r->vals || !r->pub.path) {
    if (r) free(r->vals), free((char *)r->pub.path), free(r);
    return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "out of memory");
  }
  r->nvals = df_recipe_schema_count();
  yaml_document_t doc;
  df_status st = load_document(text, len, r->pub.path, &doc, err);
  if (st == DF_OK) {
    walker w = {r->pub.path, opt, &doc, r->vals, err};
    st = walk_document(&w, &doc);
    yaml_document_delete(&doc);
  }
  if (st == DF_OK) st = resolve(r, r->pub.path, base_dir, opt && opt->inputs_may_be_missing, err);
  if (st != DF_OK) {
    df_recipe_free(&r->pub);
    return st;
  }
  build_public(r, r->pub.path);
  if (opt && opt->log) df_recipe_print_inert(r->vals, opt->log);
  *out = &r->pub;
  return DF_OK;
}

static df_status read_file(const char *path, char **text, size_t *len, df_error *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return DF_FAIL(err, DF_ERR_IO, path, "check the recipe path", "cannot open recipe %s", path);
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, fp);
    if (n < cap) break;
    char *grown = cap < ((size_t)64 << 20) ? realloc(buf, cap *= 2) : NULL;
    if (!grown) free(buf);
    buf = grown;
  }
  bool bad = ferror(fp);
  fclose(fp);
  if (!buf || bad) {
    free(buf);
    return DF_FAIL(err, DF_ERR_IO, path, "recipes are small YAML files", "cannot read recipe %s", path);
  }
  *text = buf, *len = n;
  return DF_OK;
}

df_status df_recipe_load(const char *path, const df_recipe_options *opt, const df_recipe **out, df_error *err) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  DF_TRY(read_file(path, &text, &len, err));
  // Relative paths are taken from the current directory, as SpecForge (run from its checkout) takes them.
  df_status st = df_recipe_parse(text, len, path, NULL, opt, out, err);
  free(text);
  return st;
}

void df_recipe_print_schema(FILE *fp) {
  static const char *const support[] = {"default only", "used", "accepted, no effect"};
  const df_recipe_key *t = df_recipe_schema();
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    char kp[160];
    fprintf(fp, "%-44s %-16s %-28s %s%s%s\n", df_recipe_key_path(&t[i], kp, sizeof kp), df_recipe_type_name(t[i].type),
            df_recipe_key_default_text(&t[i]), support[t[i].support], t[i].note ? ": " : "",
            t[i].note ? t[i].note : "");
  }
}

// ---- a strategy's keys (strategies/strategy.h) -------------------------------------------------------------------

static const df_rvalue *training_value(const void *self, const char *key, df_recipe_type *type) {
  const int i = df_recipe_schema_find("training", key);
  if (i < 0) return NULL;
  *type = df_recipe_schema()[i].type;
  const df_rvalue *v = &df_recipe_values(self)[i];
  return v->is_null ? NULL : v;
}

static bool strategy_number(const void *self, const char *key, double *out) {
  df_recipe_type t;
  const df_rvalue *v = training_value(self, key, &t);
  if (!v || (t != DF_RT_FLOAT && t != DF_RT_INT && t != DF_RT_BOOL)) return false;
  *out = t == DF_RT_INT ? (double)v->i : t == DF_RT_BOOL ? (double)v->b : v->f;
  return true;
}

static bool strategy_text(const void *self, const char *key, const char **out) {
  df_recipe_type t;
  const df_rvalue *v = training_value(self, key, &t);
  if (!v || (t != DF_RT_ENUM && t != DF_RT_STRING)) return false;
  *out = v->s;
  return true;
}

df_strategy_values df_recipe_strategy_values(const df_recipe *r) {
  return (df_strategy_values){.self = r, .number = strategy_number, .text = strategy_text};
}

bool df_recipe_is_default(const df_recipe *r, const char *section, const char *key) {
  const int i = df_recipe_schema_find(section, key);
  if (i < 0) return true;
  const df_recipe_key *k = &df_recipe_schema()[i];
  df_rvalue def;
  df_error ignored = {0};
  if (df_rvalue_default(k, &def, &ignored) != DF_OK) return false;
  const bool same = df_rvalue_equal(k, &df_recipe_values(r)[i], &def);
  df_rvalue_clear(&def);
  return same;
}
