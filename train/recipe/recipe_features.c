// Whole features a SpecForge recipe may ask for that draftforge does not have, one table row each: a recipe
// asking for one is refused before its keys are checked, with one line naming the key and the feature, and a
// hint saying what to do instead
// (so a P-EAGLE recipe is refused for P-EAGLE, not for the first EAGLE-only key it sets). A row's
// `supported` flips to true when the feature lands (a strategy: when strategies/registry.c lists it); nothing else has
// to change.
#include <stdio.h>
#include <string.h>

#include "strategies/strategy.h"
#include "train/recipe/recipe_internal.h"

// Online training computes the target's hidden states during the run, in-process (train/data/online_source.c), so
// SpecForge's online data keys (data.train_data_path / data.prompts_path) are accepted; its online recipes are
// still refused when they ask for a disaggregated deployment (the row after).
#define DF_ONLINE_TRAINING_SUPPORTED true

typedef struct {
  const char *keys[3]; // "section.key" paths that ask for the feature, any one of them
  const char *value;   // the value that asks for it; NULL: any non-empty value
  bool supported;
  const char *feature;
  const char *instead;
} feature_row;

static const char EAGLE_INSTEAD[] = "train it with SpecForge (specforge train), or train a DFlash, DSpark, Domino or "
                                    "EAGLE-3 draft here (training.strategy: dflash | dspark | domino | eagle3)";
static const char OFFLINE_INSTEAD[] = "capture the target's hidden states first (draftforge capture, or SpecForge's "
                                      "offline capture converted with tools/import_specforge.py) and set "
                                      "data.hidden_states_path";
static const char COLOCATED_INSTEAD[] = "train in one process group: deployment.mode: local_colocated, with the "
                                        "target running in-process (data.train_data_path) or captured data "
                                        "(data.hidden_states_path)";

static const feature_row FEATURES[] = {
    {{"training.strategy"}, "eagle3", false, "EAGLE-3 drafts", EAGLE_INSTEAD},
    {{"training.strategy"}, "peagle", false, "P-EAGLE drafts", EAGLE_INSTEAD},
    {{"training.strategy"},
     "domino",
     false,
     "Domino drafts",
     "train it with SpecForge (specforge train), or train "
     "a DFlash or DSpark draft here"},
    {{"data.train_data_path", "data.prompts_path"},
     NULL,
     DF_ONLINE_TRAINING_SUPPORTED,
     "online capture (the target model running during training)",
     OFFLINE_INSTEAD},
    {{"deployment.mode", "training.deployment_mode"},
     "disaggregated",
     false,
     "a disaggregated SGLang / Mooncake deployment",
     COLOCATED_INSTEAD},
    {{"training.server_urls", "training.metadata_db_path"},
     NULL,
     false,
     "a disaggregated SGLang / Mooncake deployment (legacy keys)",
     COLOCATED_INSTEAD},
};

// The scalar text at a dotted path of the document (NULL when absent or not a scalar); *node its node.
static const char *doc_scalar(yaml_document_t *doc, const char *path, yaml_node_t **node) {
  yaml_node_t *cur = yaml_document_get_root_node(doc);
  char buf[160];
  snprintf(buf, sizeof buf, "%s", path);
  *node = NULL;
  for (char *save = NULL, *part = strtok_r(buf, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
    if (!cur || cur->type != YAML_MAPPING_NODE) return NULL;
    yaml_node_t *next = NULL;
    for (yaml_node_pair_t *p = cur->data.mapping.pairs.start; p < cur->data.mapping.pairs.top; p++) {
      yaml_node_t *k = yaml_document_get_node(doc, p->key);
      if (k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, part)) {
        next = yaml_document_get_node(doc, p->value);
        break;
      }
    }
    cur = next;
  }
  *node = cur;
  if (!cur) return NULL;
  if (cur->type == YAML_SEQUENCE_NODE)
    return cur->data.sequence.items.top > cur->data.sequence.items.start ? "[...]" : "";
  if (cur->type != YAML_SCALAR_NODE) return NULL;
  const char *s = (const char *)cur->data.scalar.value;
  bool null = cur->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && (!strcmp(s, "null") || !strcmp(s, "~"));
  return null ? "" : s;
}

// The value of path: the last --set override of it, else the document's; *line / *col where it is (0: --set).
static const char *value_of(yaml_document_t *doc, const df_recipe_options *opt, const char *path, int *line, int *col) {
  size_t n = strlen(path);
  for (int i = opt ? opt->n_overrides - 1 : -1; i >= 0; i--) {
    const char *o = opt->overrides[i];
    if (!strncmp(o, path, n) && o[n] == '=') {
      *line = *col = 0;
      return o + n + 1;
    }
  }
  yaml_node_t *node;
  const char *s = doc_scalar(doc, path, &node);
  if (node) *line = (int)node->start_mark.line + 1, *col = (int)node->start_mark.column + 1;
  return s;
}

df_status df_recipe_feature_gate(yaml_document_t *doc, const char *file, const df_recipe_options *opt, df_error *err) {
  for (size_t r = 0; r < sizeof FEATURES / sizeof *FEATURES; r++) {
    const feature_row *f = &FEATURES[r];
    // A strategy is supported once the registry lists it (strategies/registry.c): no flag to flip here.
    const bool supported = f->supported || (!strcmp(f->keys[0], "training.strategy") && df_strategy_find(f->value));
    for (int k = 0; !supported && k < 3 && f->keys[k]; k++) {
      int line = 0, col = 0;
      const char *v = value_of(doc, opt, f->keys[k], &line, &col);
      if (!v || !v[0] || (f->value && strcmp(v, f->value))) continue;
      char at[300];
      if (line)
        snprintf(at, sizeof at, "%s:%d:%d", file, line, col);
      else
        snprintf(at, sizeof at, "--set %s", f->keys[k]);
      return DF_FAIL(err, DF_ERR_UNSUPPORTED, f->keys[k], f->instead,
                     "%s: %s = %.60s asks for %s, which draftforge does not support yet", at, f->keys[k], v,
                     f->feature);
    }
  }
  return DF_OK;
}

void df_recipe_print_inert(const df_rvalue *vals, FILE *fp) {
  const df_recipe_key *t = df_recipe_schema();
  int n = 0;
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    if (t[i].support != DF_RS_INERT || !vals[i].present) continue;
    char kp[160];
    fprintf(fp, "%s%s",
            n++ ? ", " : "recipe: accepted, no effect on this run: ", df_recipe_key_path(&t[i], kp, sizeof kp));
  }
  if (n) fprintf(fp, " (`draftforge schema` says why each is inert)\n");
}
