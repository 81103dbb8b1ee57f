// Lookups over the registry tables: the core's and, through df_moe_families, every listed family's.
#include "moe/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *df_moe_reg_kind_name(df_moe_reg_kind kind) {
  static const char *const names[DF_MOE_REG_COUNT] = {[DF_MOE_REG_SCORE] = "score function",
                                                      [DF_MOE_REG_ROUTER] = "router",
                                                      [DF_MOE_REG_BALANCE] = "balance controller",
                                                      [DF_MOE_REG_AUX_LOSS] = "aux loss",
                                                      [DF_MOE_REG_EXPERTS] = "experts backend",
                                                      [DF_MOE_REG_SHARED_EXPERT] = "shared expert",
                                                      [DF_MOE_REG_SHARED_GATE] = "shared expert gate",
                                                      [DF_MOE_REG_LAYOUT] = "checkpoint layout",
                                                      [DF_MOE_REG_PRESET] = "MoE preset"};
  return (unsigned)kind < DF_MOE_REG_COUNT ? names[kind] : "?";
}

// Table t of the walk: 0 is the core, 1.. the families in the order families.c lists them.
static const df_moe_family *table(int t) { return t == 0 ? &df_moe_core_family : df_moe_families[t - 1]; }

static int num_tables(void) { return 1 + df_moe_num_families; }

const df_moe_reg_entry *df_moe_registry_find(df_moe_reg_kind kind, const char *name) {
  if (!name) return NULL;
  for (int t = 0; t < num_tables(); t++)
    for (int i = 0; i < table(t)->n; i++) {
      const df_moe_registration *r = &table(t)->regs[i];
      if (r->kind == kind && !strcasecmp(r->entry.name, name)) return &r->entry;
    }
  return NULL;
}

const df_moe_reg_entry *df_moe_registry_by_id(df_moe_reg_kind kind, int id) {
  for (int t = 0; t < num_tables(); t++)
    for (int i = 0; i < table(t)->n; i++) {
      const df_moe_registration *r = &table(t)->regs[i];
      if (r->kind == kind && r->entry.id == id) return &r->entry;
    }
  return NULL;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

const char *df_moe_registry_names(df_moe_reg_kind kind, char *buf, size_t n) {
  const char *names[64];
  int k = 0;
  for (int t = 0; t < num_tables(); t++)
    for (int i = 0; i < table(t)->n && k < 64; i++)
      if (table(t)->regs[i].kind == kind) names[k++] = table(t)->regs[i].entry.name;
  qsort(names, (size_t)k, sizeof *names, cmp_str);
  size_t len = 0;
  if (n) buf[0] = 0;
  for (int i = 0; i < k && len < n; i++) {
    int w = snprintf(buf + len, n - len, "%s%s", i ? ", " : "", names[i]);
    if (w < 0) break;
    len += (size_t)w;
  }
  if (!k && n) snprintf(buf, n, "(none)");
  return buf;
}

df_status df_moe_registry_get(df_moe_reg_kind kind, const char *name, const char *where, const df_moe_reg_entry **out,
                              df_error *err) {
  *out = df_moe_registry_find(kind, name);
  if (*out) return DF_OK;
  char names[256], hint[300];
  df_moe_registry_names(kind, names, sizeof names);
  snprintf(hint, sizeof hint, "use one of: %s", names);
  return DF_FAIL(err, DF_ERR_INVALID, where, hint, "unknown %s '%.64s'; registered: %s", df_moe_reg_kind_name(kind),
                 name ? name : "(null)", names);
}

df_status df_moe_registry_check(df_error *err) {
  for (int t = 0; t < num_tables(); t++)
    for (int i = 0; i < table(t)->n; i++) {
      const df_moe_registration *r = &table(t)->regs[i];
      const char *fam = table(t)->name;
      if ((unsigned)r->kind >= DF_MOE_REG_COUNT || !r->entry.name || !r->entry.name[0])
        return DF_FAIL(err, DF_ERR_INVALID, fam, "fix the family's registry table",
                       "registration %d of '%s' is malformed", i, fam);
      if ((r->kind == DF_MOE_REG_LAYOUT || r->kind == DF_MOE_REG_PRESET) && !r->entry.impl)
        return DF_FAIL(err, DF_ERR_INVALID, r->entry.name, "point impl at the layout / preset definition",
                       "%s '%s' (family '%s') has no definition", df_moe_reg_kind_name(r->kind), r->entry.name, fam);
      // Every earlier registration of the same kind must have another name.
      for (int u = 0; u <= t; u++)
        for (int j = 0; j < (u == t ? i : table(u)->n); j++) {
          const df_moe_registration *q = &table(u)->regs[j];
          if (q->kind == r->kind && !strcasecmp(q->entry.name, r->entry.name))
            return DF_FAIL(err, DF_ERR_INVALID, r->entry.name, "give each registration its own name",
                           "%s '%s' is registered twice (families '%s' and '%s')", df_moe_reg_kind_name(r->kind),
                           r->entry.name, table(u)->name, fam);
        }
    }
  return DF_OK;
}
