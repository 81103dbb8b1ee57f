// Comparing two resolved recipes key by key (train/recipe/recipe.h): what a resume checks against the run's own
// recipe.resolved.yaml.
#include <stdio.h>
#include <string.h>

#include "base/path.h"
#include "train/recipe/recipe_internal.h"

static bool same_value(const df_recipe_key *k, const df_rvalue *a, const df_rvalue *b) {
  if (k->type != DF_RT_PATH || a->is_null || b->is_null) return df_rvalue_equal(k, a, b);
  if (!a->s[0] || !b->s[0]) return !a->s[0] && !b->s[0];
  return df_path_same(a->s, b->s);
}

bool df_recipe_first_difference(const df_recipe *a, const df_recipe *b, bool (*skip)(const char *key), char *key,
                                size_t kn, char *va, size_t van, char *vb, size_t vbn) {
  const df_recipe_key *t = df_recipe_schema();
  const df_rvalue *x = df_recipe_values(a), *y = df_recipe_values(b);
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    if (t[i].type == DF_RT_SECTION) continue;
    char kp[160];
    df_recipe_key_path(&t[i], kp, sizeof kp);
    if ((skip && skip(kp)) || same_value(&t[i], &x[i], &y[i])) continue;
    snprintf(key, kn, "%s", kp);
    df_rvalue_text(&t[i], &x[i], va, van);
    df_rvalue_text(&t[i], &y[i], vb, vbn);
    return true;
  }
  return false;
}
