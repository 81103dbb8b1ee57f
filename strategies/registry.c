// The strategies this build trains: one row each. A new strategy is a folder under strategies/ whose strategy.c
// defines df_strategy_<name>, plus one X(<name>) here.
#include <stdlib.h>
#include <string.h>

#include "strategies/strategy.h"

#define DF_STRATEGIES(X) X(dflash) X(dspark) X(domino) X(eagle3) X(peagle)

#define DECLARE(n) extern const df_strategy df_strategy_##n;
DF_STRATEGIES(DECLARE)
#define TABLE(n) &df_strategy_##n,
const df_strategy *const df_strategies[] = {DF_STRATEGIES(TABLE) NULL};
#define NAME(n) #n,
const char *const df_strategy_names[] = {DF_STRATEGIES(NAME) NULL};

const df_strategy *df_strategy_find(const char *name) {
  for (int i = 0; name && df_strategies[i]; i++)
    if (!strcmp(df_strategies[i]->name, name)) return df_strategies[i];
  return NULL;
}

const df_strategy *df_strategy_of(const df_draft_config *cfg) {
  for (int i = 0; cfg && df_strategies[i]; i++)
    if (df_strategies[i]->trains(cfg)) return df_strategies[i];
  return NULL;
}

bool df_strategy_reads_last_hidden(const df_draft_config *cfg) {
  const df_strategy *s = df_strategy_of(cfg);
  return s && s->reads_last_hidden;
}

const df_strategy *df_strategy_for_projector(const char *projector) {
  for (int i = 0; projector && df_strategies[i]; i++)
    if (!strcmp(df_strategies[i]->projector, projector)) return df_strategies[i];
  return NULL;
}

df_status df_strategy_open(const df_strategy *s, const df_strategy_env *env, df_strategy_run **out, df_error *err) {
  *out = NULL;
  if (!s || !env || !env->ctx || !env->model || !env->cfg)
    return DF_FAIL(err, DF_ERR_INVALID, "strategy", NULL, "a strategy opens on a context, a model and its config");
  if (!s->trains(env->cfg))
    return DF_FAIL(err, DF_ERR_INVALID, "training.strategy", "set training.strategy to the draft's kind",
                   "strategy %s does not train %s (a %s draft)", s->name, env->cfg->source,
                   df_draft_kind_name(env->cfg->kind));
  return s->open(env, out, err);
}

void df_strategy_close(df_strategy_run *r) {
  if (r) r->table->close(r);
}

void df_strategy_metrics_free(df_strategy_metrics *m) {
  if (!m) return;
  free(m->pos_num), free(m->pos_den);
  m->pos_num = m->pos_den = NULL;
}

// ---- values
// ----------------------------------------------------------------------------------------------------------

static const df_strategy_value *list_find(const void *self, const char *key) {
  const df_strategy_value_list *l = self;
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->v[i].key, key)) return &l->v[i];
  return NULL;
}

static bool list_number(const void *self, const char *key, double *out) {
  const df_strategy_value *v = list_find(self, key);
  if (!v || v->text) return false;
  *out = v->number;
  return true;
}

static bool list_text(const void *self, const char *key, const char **out) {
  const df_strategy_value *v = list_find(self, key);
  if (!v || !v->text) return false;
  *out = v->text;
  return true;
}

df_strategy_values df_strategy_values_of_list(const df_strategy_value_list *l) {
  return (df_strategy_values){.self = l, .number = list_number, .text = list_text};
}

double df_strategy_number(const df_strategy_values *v, const char *key, double def) {
  double x;
  return v && v->number && v->number(v->self, key, &x) ? x : def;
}

const char *df_strategy_text(const df_strategy_values *v, const char *key, const char *def) {
  const char *s;
  return v && v->text && v->text(v->self, key, &s) ? s : def;
}
