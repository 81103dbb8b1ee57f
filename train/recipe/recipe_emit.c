// The resolved recipe as YAML (<output_dir>/recipe.resolved.yaml): every schema key with the value the run
// used, defaults and --set overrides included, every path absolute (as resolved) so the file loads from anywhere.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/recipe/recipe_internal.h"

typedef struct {
  FILE *fp;
  const df_rvalue *vals;
  char cwd[4096];
} emitter;

// A YAML double-quoted scalar: the escapes YAML and JSON share.
static void put_quoted(FILE *fp, const char *s) {
  fputc('"', fp);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(fp, "\\%c", *p);
    else if (*p == '\n')
      fputs("\\n", fp);
    else if (*p == '\t')
      fputs("\\t", fp);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(fp, "\\x%02x", *p);
    else
      fputc(*p, fp);
  }
  fputc('"', fp);
}

// The shortest %g text that reads back to the same double, always with a '.' or an exponent (a number, not
// an integer, to a reader).
static void put_float(FILE *fp, double x) {
  char buf[40];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
  fputs(buf, fp);
}

static void put_path(const emitter *e, const char *s) {
  if (!s[0] || s[0] == '/' || !e->cwd[0]) return put_quoted(e->fp, s);
  char buf[8192];
  snprintf(buf, sizeof buf, "%s/%s", e->cwd, s);
  put_quoted(e->fp, buf);
}

static void put_value(const emitter *e, const df_recipe_key *k, const df_rvalue *v) {
  FILE *fp = e->fp;
  if (v->is_null) {
    fputs("null", fp);
    return;
  }
  switch (k->type) {
  case DF_RT_STRING:
  case DF_RT_ENUM: put_quoted(fp, v->s); break;
  case DF_RT_PATH: put_path(e, v->s); break;
  case DF_RT_BOOL: fputs(v->b ? "true" : "false", fp); break;
  case DF_RT_INT: fprintf(fp, "%lld", (long long)v->i); break;
  case DF_RT_FLOAT: put_float(fp, v->f); break;
  case DF_RT_INT_LIST:
    fputc('[', fp);
    for (int j = 0; j < v->n; j++) fprintf(fp, "%s%lld", j ? ", " : "", (long long)v->il[j]);
    fputc(']', fp);
    break;
  case DF_RT_STRING_LIST:
    fputc('[', fp);
    for (int j = 0; j < v->n; j++) {
      if (j) fputs(", ", fp);
      put_quoted(fp, v->sl[j]);
    }
    fputc(']', fp);
    break;
  default: fputs("null", fp); break;
  }
}

static void emit_section(const emitter *e, const char *section, int indent) {
  const df_recipe_key *t = df_recipe_schema();
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    if (strcmp(t[i].section, section)) continue;
    fprintf(e->fp, "%*s%s:", indent, "", t[i].key);
    if (t[i].type != DF_RT_SECTION) {
      fputc(' ', e->fp);
      put_value(e, &t[i], &e->vals[i]);
      fputc('\n', e->fp);
      continue;
    }
    char child[160];
    df_recipe_key_path(&t[i], child, sizeof child);
    // A section draftforge refuses (deployment.disaggregated) is only ever accepted as null.
    if (!df_recipe_schema_is_section(child) || t[i].support == DF_RS_DEFAULT_ONLY) {
      fputs(" null\n", e->fp);
      continue;
    }
    fputc('\n', e->fp);
    emit_section(e, child, indent + 2);
  }
}

df_status df_recipe_write_resolved(const df_recipe *r, FILE *fp, df_error *err) {
  emitter e = {.fp = fp, .vals = df_recipe_values(r)};
  if (!getcwd(e.cwd, sizeof e.cwd)) e.cwd[0] = 0;
  fprintf(fp, "# draftforge: the resolved recipe of %s (every key; defaults and --set overrides applied)\n", r->path);
  emit_section(&e, "", 0);
  if (fflush(fp) != 0 || ferror(fp))
    return DF_FAIL(err, DF_ERR_IO, r->path, "check the output directory", "cannot write the resolved recipe");
  return DF_OK;
}
