// Table-driven parsing and --help for the subcommands (train/cli/cli.h).
#include "train/cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const df_cli_opt HELP_OPT = {"--help", NULL, DF_CLI_FLAG, "off", "print this help and exit (also -h)"};
static const df_cli_opt VERBOSE_OPT = {"--verbose", NULL, DF_CLI_FLAG, "off",
                                       "errors also show where in the source they were raised"};

int df_cli_usage_error(const df_cli_spec *spec, const char *fmt, ...) {
  fprintf(stderr, "draftforge %s: ", spec->name);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n  HINT: draftforge %s --help lists the arguments and options\n", spec->name);
  return DF_EXIT_USAGE;
}

static int find_opt(const df_cli_spec *spec, const char *name, size_t len) {
  for (int i = 0; spec->opts[i].name; i++)
    if (strlen(spec->opts[i].name) == len && !strncmp(spec->opts[i].name, name, len)) return i;
  return -1;
}

static const df_cli_opt *opt_at(const df_cli_spec *spec, int i) { return &spec->opts[i]; }

static int add_repeat(df_cli_args *a, int k, const char *v) {
  const char **grown = realloc(a->rep[k], (size_t)(a->nrep[k] + 2) * sizeof *grown);
  if (!grown) return fputs("draftforge: out of memory\n", stderr), DF_EXIT_FAILURE;
  grown[a->nrep[k]++] = v, grown[a->nrep[k]] = NULL;
  a->rep[k] = grown;
  return 0;
}

// One "--name[=value]" at argv[*i]; a value that is not attached is the next argument.
static int parse_option(const df_cli_spec *spec, int argc, char **argv, int *i, df_cli_args *a) {
  const char *s = argv[*i], *eq = strchr(s, '=');
  size_t len = eq ? (size_t)(eq - s) : strlen(s);
  if (!strcmp(s, "-h") || !strcmp(s, "--help")) return df_cli_print_help(spec, stdout), 1;
  if (!strcmp(s, "--verbose")) return a->verbose = true, 0;
  int k = find_opt(spec, s, len);
  if (k < 0) return df_cli_usage_error(spec, "unknown option '%.*s'", (int)len, s);
  const df_cli_opt *o = opt_at(spec, k);
  if (o->kind == DF_CLI_FLAG) {
    if (eq) return df_cli_usage_error(spec, "%s takes no value", o->name);
    a->val[k] = "1";
    return 0;
  }
  const char *v = eq ? eq + 1 : NULL;
  if (!v) {
    if (*i + 1 >= argc) return df_cli_usage_error(spec, "%s needs a value (%s)", o->name, o->metavar);
    v = argv[++*i];
  }
  if (o->kind == DF_CLI_REPEAT) return add_repeat(a, k, v);
  a->val[k] = v;
  return 0;
}

int df_cli_parse(const df_cli_spec *spec, int argc, char **argv, df_cli_args *a) {
  memset(a, 0, sizeof *a);
  a->spec = spec;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    if (s[0] == '-' && s[1]) {
      int rc = parse_option(spec, argc, argv, &i, a);
      if (rc) return rc;
      continue;
    }
    if (a->npos >= spec->max_pos || a->npos >= DF_CLI_MAX_POS)
      return df_cli_usage_error(spec, "unexpected argument '%s' (it takes %s)", s,
                                spec->max_pos ? spec->positional : "no positional arguments");
    a->pos[a->npos++] = s;
  }
  if (a->npos < spec->min_pos) return df_cli_usage_error(spec, "%s is required", spec->positional);
  return 0;
}

void df_cli_free(df_cli_args *a) {
  for (int k = 0; k < DF_CLI_MAX_OPTS; k++) free(a->rep[k]);
  memset(a, 0, sizeof *a);
}

// "  --name VALUE    help (default: x)", the text wrapped at 110 columns under its own column.
static void print_opt(const df_cli_opt *o, FILE *fp) {
  enum { LEFT = 30, WIDTH = 110 };
  char left[64], text[1024];
  snprintf(left, sizeof left, "%s%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "",
           o->kind == DF_CLI_REPEAT ? " ..." : "");
  snprintf(text, sizeof text, "%s%s%s%s", o->help, o->def ? " (default: " : "", o->def ? o->def : "",
           o->def ? ")" : "");
  int col = fprintf(fp, "  %-*s", LEFT - 2, left);
  if (col > LEFT) fprintf(fp, "\n%*s", LEFT, ""), col = LEFT;
  for (const char *w = text; *w;) {
    size_t n = strcspn(w, " ");
    if (col > LEFT && col + 1 + (int)n > WIDTH)
      fprintf(fp, "\n%*s", LEFT, ""), col = LEFT;
    else if (col > LEFT)
      fputc(' ', fp), col++;
    col += fprintf(fp, "%.*s", (int)n, w);
    w += n;
    while (*w == ' ') w++;
  }
  fputc('\n', fp);
}

void df_cli_print_help(const df_cli_spec *spec, FILE *fp) {
  fprintf(fp, "usage: draftforge %s%s%s [options]\n\n%s\n\noptions:\n", spec->name, spec->positional ? " " : "",
          spec->positional ? spec->positional : "", spec->about);
  for (int i = 0; spec->opts[i].name; i++) print_opt(&spec->opts[i], fp);
  print_opt(&VERBOSE_OPT, fp);
  print_opt(&HELP_OPT, fp);
  fputs("exit codes: 0 success, 1 failure, 2 bad usage or bad arguments\n", fp);
}

static int index_of(const df_cli_args *a, const char *name) {
  int k = find_opt(a->spec, name, strlen(name));
  if (k < 0) fprintf(stderr, "draftforge %s: internal: no option %s in the table\n", a->spec->name, name);
  return k;
}

const char *df_cli_get(const df_cli_args *a, const char *name) {
  int k = index_of(a, name);
  return k < 0 ? NULL : a->val[k];
}

bool df_cli_has(const df_cli_args *a, const char *name) { return df_cli_get(a, name) != NULL; }

const char *const *df_cli_list(const df_cli_args *a, const char *name, int *n) {
  int k = index_of(a, name);
  *n = k < 0 ? 0 : a->nrep[k];
  return k < 0 ? NULL : a->rep[k];
}

bool df_cli_int(const df_cli_args *a, const char *name, long long lo, long long hi, long long def, long long *out) {
  const char *s = df_cli_get(a, name);
  *out = def;
  if (!s) return true;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    df_cli_usage_error(a->spec, "%s wants an integer in [%lld, %lld], got '%s'", name, lo, hi, s);
    return false;
  }
  *out = v;
  return true;
}

bool df_cli_bytes(const df_cli_args *a, const char *name, int64_t *out) {
  static const struct {
    const char *unit;
    double scale;
  } units[] = {{"", 1},          {"b", 1},    {"kb", 1e3},      {"kib", 1024.0}, {"mb", 1e6},
               {"mib", 1 << 20}, {"gb", 1e9}, {"gib", 1 << 30}, {"tb", 1e12},    {"tib", 1099511627776.0}};
  const char *s = df_cli_get(a, name);
  *out = 0;
  if (!s) return true;
  char *end;
  errno = 0;
  const double v = strtod(s, &end);
  for (size_t i = 0; end != s && !errno && isfinite(v) && v > 0 && i < sizeof units / sizeof *units; i++) {
    if (strcasecmp(end, units[i].unit)) continue;
    const double bytes = floor(v * units[i].scale);
    if (bytes >= 1 && bytes < 9.2e18) return *out = (int64_t)bytes, true;
  }
  df_cli_usage_error(a->spec, "%s wants a size such as 141GB, 80GiB, 81920MiB or a byte count, got '%s'", name, s);
  return false;
}

bool df_cli_choice(const df_cli_args *a, const char *name, const char *const *choices, int def, int *out) {
  const char *s = df_cli_get(a, name);
  *out = def;
  if (!s) return true;
  for (int i = 0; choices[i]; i++)
    if (!strcmp(s, choices[i])) return *out = i, true;
  char list[256] = "";
  for (int i = 0; choices[i]; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", choices[i]);
  df_cli_usage_error(a->spec, "%s is one of %s, got '%s'", name, list, s);
  return false;
}
