// Paths and the pasteable command line (base/path.h).
#define _GNU_SOURCE
#include "base/path.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

bool df_pathf(char *out, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(out, n, fmt, ap);
  va_end(ap);
  return k >= 0 && (size_t)k < n;
}

// ---- paths -------------------------------------------------------------------------------------------------------

void df_path_normalize(const char *in, char *out, size_t n) {
  if (!n) return;
  bool abs = in[0] == '/';
  const char *parts[512];
  size_t lens[512];
  int k = 0, ups = 0; // ups: leading ".." kept in a relative path
  for (const char *p = in; *p && k < 512;) {
    while (*p == '/') p++;
    const char *s = p;
    while (*p && *p != '/') p++;
    size_t len = (size_t)(p - s);
    if (!len || (len == 1 && s[0] == '.')) continue;
    if (len == 2 && s[0] == '.' && s[1] == '.') {
      if (k > ups)
        k--;
      else if (!abs)
        parts[k] = s, lens[k++] = 2, ups++;
      continue;
    }
    parts[k] = s, lens[k++] = len;
  }
  size_t used = 0;
  out[0] = 0;
  if (abs && used + 1 < n) out[used++] = '/', out[used] = 0;
  for (int i = 0; i < k; i++) {
    int w = snprintf(out + used, n - used, "%s%.*s", i ? "/" : "", (int)lens[i], parts[i]);
    if (w < 0 || (size_t)w >= n - used) break;
    used += (size_t)w;
  }
  if (!out[0]) snprintf(out, n, ".");
}

void df_path_absolute(const char *in, char *out, size_t n) {
  char cwd[PATH_MAX], buf[2 * PATH_MAX + 2];
  if (in[0] != '/' && getcwd(cwd, sizeof cwd))
    df_pathf(buf, sizeof buf, "%s/%s", cwd, in);
  else
    df_pathf(buf, sizeof buf, "%s", in);
  df_path_normalize(buf, out, n);
}

void df_path_shown(const char *in, char *out, size_t n) {
  char abs[PATH_MAX], cwd[PATH_MAX], ncwd[PATH_MAX];
  df_path_absolute(in, abs, sizeof abs);
  if (!getcwd(cwd, sizeof cwd)) {
    snprintf(out, n, "%s", abs);
    return;
  }
  df_path_normalize(cwd, ncwd, sizeof ncwd);
  size_t c = strlen(ncwd);
  if (!strcmp(abs, ncwd))
    snprintf(out, n, ".");
  else if (c == 1) // the working directory is "/"
    snprintf(out, n, "%s", abs + 1);
  else if (!strncmp(abs, ncwd, c) && abs[c] == '/')
    snprintf(out, n, "%s", abs + c + 1);
  else
    snprintf(out, n, "%s", abs);
}

bool df_path_same(const char *a, const char *b) {
  char x[PATH_MAX], y[PATH_MAX];
  df_path_absolute(a, x, sizeof x);
  df_path_absolute(b, y, sizeof y);
  return !strcmp(x, y);
}

// ---- the command line -------------------------------------------------------------------------------------------

void df_self_path(char *out, size_t n) {
  char exe[PATH_MAX], cwd[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) {
    snprintf(out, n, "draftforge");
    return;
  }
  exe[k] = 0;
  size_t c = getcwd(cwd, sizeof cwd) ? strlen(cwd) : 0;
  if (c > 1 && !strncmp(exe, cwd, c) && exe[c] == '/')
    snprintf(out, n, ".%s", exe + c);
  else
    snprintf(out, n, "%s", exe);
}

void df_shell_quote_append(char *out, size_t n, const char *s) {
  size_t used = strlen(out);
  bool plain = *s != 0;
  for (const char *c = s; *c && plain; c++)
    plain =
        (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("_./=:,+-@%", *c);
  if (plain) {
    snprintf(out + used, n - used, "%s", s);
    return;
  }
  if (used + 1 < n) out[used++] = '\'', out[used] = 0;
  for (const char *c = s; *c && used + 5 < n; c++) {
    if (*c == '\'') {
      memcpy(out + used, "'\\''", 4), used += 4;
    } else {
      out[used++] = *c;
    }
  }
  if (used + 1 < n) out[used++] = '\'';
  out[used < n ? used : n - 1] = 0;
}
