// Internal to train/recipe*.c: the value a schema row resolves to, and the scalar/list conversions and checks
// shared by the YAML walk (recipe.c) and the value layer (recipe_value.c).
#ifndef DF_TRAIN_RECIPE_RECIPE_INTERNAL_H
#define DF_TRAIN_RECIPE_RECIPE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <yaml.h>

#include "base/error.h"
#include "train/recipe/recipe.h"
#include "train/recipe/recipe_schema.h"

// One schema row's value: written in the file (present, with its 1-based line/column) or the default.
typedef struct {
  bool present;
  bool is_null;
  int line, col;
  bool from_cli; // set by a --set override: a relative path stays relative to the working directory
  bool b;
  int64_t i;
  double f;
  char *s;     // STRING, PATH, ENUM (owned)
  int choice;  // ENUM: index into choices
  int n;       // list length
  int64_t *il; // INT_LIST (owned)
  char **sl;   // STRING_LIST (owned)
} df_rvalue;

void df_rvalue_clear(df_rvalue *v);

// Where a value came from, for messages: "<file>:<line>:<col>".
typedef struct {
  const char *file;
  int line, col;
} df_rpos;

// Converts a scalar or sequence node into v for row k (type, null, range and choice checks). The message
// names file:line:col and section.key; the support check (default-only keys) is separate.
df_status df_rvalue_from_node(const df_recipe_key *k, yaml_document_t *doc, yaml_node_t *node, df_rpos pos,
                              df_rvalue *v, df_error *err);
// v = row k's default.
df_status df_rvalue_default(const df_recipe_key *k, df_rvalue *v, df_error *err);
// Whether a and b are the same value of row k's type (default-only keys).
bool df_rvalue_equal(const df_recipe_key *k, const df_rvalue *a, const df_rvalue *b);
// The resolved values of r, one per schema row (df_recipe_schema order).
const df_rvalue *df_recipe_values(const df_recipe *r);
// "section.key" into buf.
const char *df_recipe_key_path(const df_recipe_key *k, char *buf, size_t n);
// The value as a short text for messages ("6e-4", "[1, 2]", "null").
const char *df_rvalue_text(const df_recipe_key *k, const df_rvalue *v, char *buf, size_t n);
// The default as text ("null" when unset).
const char *df_recipe_key_default_text(const df_recipe_key *k);
const char *df_recipe_type_name(df_recipe_type t);

// Every DF_RT_PATH value made absolute against base_dir (NULL: the current directory) the way SpecForge
// resolves paths; relative inputs must exist, model paths may be hub ids in the HF cache (train/recipe/recipe_paths.c).
// missing_ok: inputs that are not model paths (data, a warm-start checkpoint) need not exist (a memory plan).
df_status df_recipe_resolve_paths(df_rvalue *vals, const char *file, const char *base_dir, bool missing_ok,
                                  df_error *err);

// Refuses a recipe that asks for a feature draftforge lacks (EAGLE-3, P-EAGLE, Domino, online capture,
// disaggregated deployment) with one line naming the key and what to do instead; reads the document and the
// --set overrides before any key is checked (train/recipe/recipe_features.c).
df_status df_recipe_feature_gate(yaml_document_t *doc, const char *file, const df_recipe_options *opt, df_error *err);

// The inert keys the recipe sets (written in the file or by --set), listed on one line
// (train/recipe/recipe_features.c).
void df_recipe_print_inert(const df_rvalue *vals, FILE *fp);

#endif
