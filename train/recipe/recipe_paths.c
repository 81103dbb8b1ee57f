// Recipe paths resolved as SpecForge resolves them (specforge/training/model_loading.py): a "file://" prefix is
// dropped, "~" expanded, a relative path taken from the current directory (SpecForge runs from its checkout),
// and the result made absolute. A relative input that does not exist is an error naming the directory it was
// resolved against; for the model paths a value that is not a local path (no leading ".", "/", "~", no ".json")
// is a Hugging Face hub id, looked up offline in the cache transformers would use (train/recipe/hf_cache.h).
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/recipe/hf_cache.h"
#include "train/recipe/recipe_internal.h"

static bool exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

// os.path.normpath of an absolute path: "." and empty parts dropped, ".." removes the previous part.
enum { JOINED_MAX = 2 * PATH_MAX };

static void normalise(char *p) {
  char *parts[PATH_MAX / 2];
  int n = 0;
  char copy[JOINED_MAX];
  snprintf(copy, sizeof copy, "%s", p);
  for (char *save = NULL, *t = strtok_r(copy, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
    if (!strcmp(t, ".")) continue;
    if (!strcmp(t, "..")) {
      if (n > 0) n--;
      continue;
    }
    if (n < (int)(sizeof parts / sizeof *parts)) parts[n++] = t;
  }
  size_t len = 0;
  char out[JOINED_MAX];
  out[0] = 0;
  for (int i = 0; i < n && len < sizeof out; i++) len += (size_t)snprintf(out + len, sizeof out - len, "/%s", parts[i]);
  snprintf(p, JOINED_MAX, "%s", n ? out : "/");
}

// SpecForge's _looks_like_local_path, less its os.path.exists test (the caller has made it).
static bool looks_local(const char *raw) {
  size_t n = strlen(raw);
  return raw[0] == '.' || raw[0] == '/' || raw[0] == '~' || !strncmp(raw, "file://", 7) ||
         (n >= 5 && !strcmp(raw + n - 5, ".json"));
}

// "file:line:col: " for a value written in the file, "--set: " for an override, "" for a default.
static const char *where(const df_rvalue *v, const char *file, char *buf, size_t n) {
  if (v->from_cli)
    snprintf(buf, n, "--set: ");
  else if (v->present)
    snprintf(buf, n, "%s:%d:%d: ", file, v->line, v->col);
  else
    buf[0] = 0;
  return buf;
}

static const char *cache_dir_value(const df_rvalue *vals) {
  int i = df_recipe_schema_find("model", "cache_dir");
  return i >= 0 && !vals[i].is_null && vals[i].s && vals[i].s[0] ? vals[i].s : NULL;
}

static df_status hub_path(const df_recipe_key *k, df_rvalue *v, const char *raw, const char *base, const char *file,
                          const char *cache_dir, df_error *err) {
  char kp[160], root[PATH_MAX], repo[PATH_MAX + 64], snap[PATH_MAX + 256], hint[256], at[400];
  where(v, file, at, sizeof at);
  df_recipe_key_path(k, kp, sizeof kp);
  df_hf_cache_root(cache_dir, root, sizeof root);
  if (root[0] != '/') { // a relative model.cache_dir is taken from the current directory, as from_pretrained does
    char joined[JOINED_MAX];
    snprintf(joined, sizeof joined, "%s/%s", base, root);
    normalise(joined);
    snprintf(root, sizeof root, "%.*s", (int)sizeof root - 1, joined);
  }
  bool found = df_hf_cache_snapshot(root, raw, repo, sizeof repo, snap, sizeof snap);
  snprintf(hint, sizeof hint,
           "download it where there is network: hf download %s%s%s (huggingface_hub's CLI), or set "
           "HF_HUB_CACHE / HF_HOME to a cache that has it",
           raw, cache_dir ? " --cache-dir " : "", cache_dir ? cache_dir : "");
  if (!found)
    return DF_FAIL(err, DF_ERR_IO, kp, hint,
                   "%s%s: '%s' is not a path under %s and the Hugging Face model %s is not in the cache (searched "
                   "%s: refs/main -> snapshots/<commit>)",
                   at, kp, raw, base, raw, repo);
  char cfg[PATH_MAX + 300];
  snprintf(cfg, sizeof cfg, "%s/config.json", snap);
  if (!exists(cfg))
    return DF_FAIL(err, DF_ERR_IO, kp, hint, "%s%s: the cached snapshot %s of %s has no config.json", at, kp, snap,
                   raw);
  char *p = strdup(snap);
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, kp, NULL, "out of memory");
  free(v->s);
  v->s = p;
  return DF_OK;
}

static df_status resolve_one(const df_recipe_key *k, df_rvalue *v, const char *base, const char *file,
                             const char *cache_dir, bool missing_ok, df_error *err) {
  const char *raw = v->s;
  char expanded[PATH_MAX], joined[JOINED_MAX], kp[160], at[400];
  const char *p = !strncmp(raw, "file://", 7) ? raw + 7 : raw;
  df_expand_user(p, expanded, sizeof expanded);
  if (expanded[0] == '/')
    snprintf(joined, sizeof joined, "%s", expanded);
  else
    snprintf(joined, sizeof joined, "%s/%s", base, expanded);
  normalise(joined);
  bool relative = expanded[0] != '/';
  if (k->input && relative && !exists(joined) && !(missing_ok && !k->hub)) {
    if (k->hub && !looks_local(raw) && df_hf_is_repo_id(raw)) return hub_path(k, v, raw, base, file, cache_dir, err);
    df_recipe_key_path(k, kp, sizeof kp);
    return DF_FAIL(err, DF_ERR_IO, kp,
                   "run draftforge from the directory the recipe's paths are relative to (for a SpecForge recipe, "
                   "its checkout), or write the path absolute",
                   "%s%s: '%s' does not exist: relative paths are resolved against the current directory %s (as "
                   "SpecForge resolves them), giving %s",
                   where(v, file, at, sizeof at), kp, raw, base, joined);
  }
  char *out = strdup(joined);
  if (!out) return DF_FAIL(err, DF_ERR_NOMEM, k->key, NULL, "out of memory");
  free(v->s);
  v->s = out;
  return DF_OK;
}

df_status df_recipe_resolve_paths(df_rvalue *vals, const char *file, const char *base_dir, bool missing_ok,
                                  df_error *err) {
  char cwd[PATH_MAX];
  if (!base_dir) {
    if (!getcwd(cwd, sizeof cwd))
      return DF_FAIL(err, DF_ERR_IO, file, NULL, "cannot read the current directory: %s", strerror(errno));
    base_dir = cwd;
  }
  const df_recipe_key *t = df_recipe_schema();
  const char *cache_dir = cache_dir_value(vals);
  for (int i = 0; i < df_recipe_schema_count(); i++) {
    df_rvalue *v = &vals[i];
    if (t[i].type != DF_RT_PATH || v->is_null || !v->s || !v->s[0]) continue;
    DF_TRY(resolve_one(&t[i], v, base_dir, file, cache_dir, missing_ok, err));
  }
  return DF_OK;
}
