// The offline Hugging Face hub cache lookup (train/recipe/hf_cache.h), following huggingface_hub's constants.py
// (where the cache is) and file_download.try_to_load_from_cache (refs/<revision> → snapshots/<commit>).
#include "train/recipe/hf_cache.h"

#include <ctype.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void df_expand_user(const char *p, char *out, size_t n) {
  if (p[0] != '~') {
    snprintf(out, n, "%s", p);
    return;
  }
  const char *slash = strchr(p, '/');
  size_t ulen = slash ? (size_t)(slash - p - 1) : strlen(p + 1);
  const char *home = NULL;
  if (ulen == 0) {
    home = getenv("HOME");
    if (!home || !home[0]) {
      struct passwd *pw = getpwuid(getuid());
      home = pw ? pw->pw_dir : NULL;
    }
  } else {
    char user[256];
    snprintf(user, sizeof user, "%.*s", (int)(ulen < 255 ? ulen : 255), p + 1);
    struct passwd *pw = getpwnam(user);
    home = pw ? pw->pw_dir : NULL;
  }
  if (!home) {
    snprintf(out, n, "%s", p);
    return;
  }
  snprintf(out, n, "%s%s", home, slash ? slash : "");
}

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

void df_hf_cache_root(const char *cache_dir, char *out, size_t n) {
  char buf[4096];
  if (cache_dir && cache_dir[0])
    snprintf(buf, sizeof buf, "%s", cache_dir);
  else if (env("HF_HUB_CACHE"))
    snprintf(buf, sizeof buf, "%s", env("HF_HUB_CACHE"));
  else if (env("HUGGINGFACE_HUB_CACHE"))
    snprintf(buf, sizeof buf, "%s", env("HUGGINGFACE_HUB_CACHE"));
  else if (env("HF_HOME"))
    snprintf(buf, sizeof buf, "%s/hub", env("HF_HOME"));
  else if (env("XDG_CACHE_HOME"))
    snprintf(buf, sizeof buf, "%s/huggingface/hub", env("XDG_CACHE_HOME"));
  else
    snprintf(buf, sizeof buf, "~/.cache/huggingface/hub");
  df_expand_user(buf, out, n);
}

static bool part_ok(const char *s, size_t len) {
  if (len == 0 || len > 96 || s[0] == '-' || s[0] == '.' || s[len - 1] == '-' || s[len - 1] == '.') return false;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!isalnum(c) && c != '-' && c != '_' && c != '.') return false;
    if (i + 1 < len && ((c == '-' && s[i + 1] == '-') || (c == '.' && s[i + 1] == '.'))) return false;
  }
  return true;
}

bool df_hf_is_repo_id(const char *s) {
  const char *slash = strchr(s, '/');
  if (!slash) return part_ok(s, strlen(s));
  if (strchr(slash + 1, '/')) return false;
  return part_ok(s, (size_t)(slash - s)) && part_ok(slash + 1, strlen(slash + 1));
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool df_hf_cache_snapshot(const char *root, const char *repo_id, char *repo_dir, size_t repo_n, char *snapshot,
                          size_t snap_n) {
  int k = snprintf(repo_dir, repo_n, "%s/models--", root);
  for (const char *p = repo_id; *p && k >= 0 && (size_t)k + 3 < repo_n; p++) {
    if (*p == '/') {
      repo_dir[k++] = '-';
      repo_dir[k++] = '-';
    } else
      repo_dir[k++] = *p;
  }
  if (k < 0 || (size_t)k >= repo_n) return false;
  repo_dir[k] = 0;
  // refs/main holds the commit hash exactly as the hub wrote it (no newline); an absent ref leaves "main",
  // which no snapshot is named, as in huggingface_hub.
  char ref[4200], rev[128] = "main";
  snprintf(ref, sizeof ref, "%s/refs/main", repo_dir);
  FILE *fp = fopen(ref, "r");
  if (fp) {
    size_t len = fread(rev, 1, sizeof rev - 1, fp);
    rev[len] = 0;
    fclose(fp);
  }
  if (!rev[0] || strchr(rev, '/')) return false;
  int w = snprintf(snapshot, snap_n, "%s/snapshots/%s", repo_dir, rev);
  return w >= 0 && (size_t)w < snap_n && is_dir(snapshot);
}
