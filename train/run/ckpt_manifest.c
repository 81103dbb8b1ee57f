// Checkpoint manifests (train/run/ckpt_manifest.h): sizes and XXH3-64 checksums of a checkpoint's files.
#define _GNU_SOURCE
#include "train/run/ckpt_manifest.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/fsutil.h"
#include "base/json_write.h"

#define CHECKSUM "xxh3-64"

static const char DAMAGED_HINT[] = "the checkpoint is damaged; resume from an earlier one (--resume auto picks the "
                                   "newest complete checkpoint)";

df_status df_file_xxh3(const char *path, uint64_t *hash, int64_t *size, df_error *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return DF_FAIL(err, DF_ERR_IO, path, DAMAGED_HINT, "cannot read %s: %s", path, strerror(errno));
  XXH3_state_t *st = XXH3_createState();
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  if (!st || !buf) {
    fclose(fp), free(buf), XXH3_freeState(st);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  }
  XXH3_64bits_reset(st);
  int64_t total = 0;
  for (size_t n; (n = fread(buf, 1, CHUNK, fp)) > 0; total += (int64_t)n) XXH3_64bits_update(st, buf, n);
  bool bad = ferror(fp);
  fclose(fp);
  *hash = XXH3_64bits_digest(st);
  *size = total;
  XXH3_freeState(st);
  free(buf);
  if (bad) return DF_FAIL(err, DF_ERR_IO, path, DAMAGED_HINT, "cannot read %s", path);
  return DF_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The regular files of dir (the manifest and temporaries excepted), sorted.
static df_status list_files(const char *dir, char ***out, int *n, df_error *err) {
  *out = NULL, *n = 0;
  DIR *d = opendir(dir);
  if (!d) return DF_FAIL(err, DF_ERR_IO, dir, NULL, "cannot list %s: %s", dir, strerror(errno));
  int cap = 0;
  df_status st = DF_OK;
  for (struct dirent *e; st == DF_OK && (e = readdir(d));) {
    char p[4400];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (e->d_name[0] == '.' || !strcmp(e->d_name, DF_CKPT_MANIFEST) || strstr(e->d_name, ".tmp.")) continue;
    if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (*n == cap) {
      char **g = realloc(*out, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *g);
      if (!g) {
        st = DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
        break;
      }
      *out = g;
    }
    if (!((*out)[*n] = strdup(e->d_name)))
      st = DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
    else
      (*n)++;
  }
  closedir(d);
  if (st == DF_OK) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
  return st;
}

df_status df_ckpt_manifest_write(const char *dir, df_error *err) {
  char **names;
  int n;
  DF_TRY(list_files(dir, &names, &n, err));
  json_t *files = json_object(), *doc = json_object();
  df_status st = files && doc ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
  for (int i = 0; st == DF_OK && i < n; i++) {
    char p[4400], hex[24];
    uint64_t h;
    int64_t size;
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    st = df_file_xxh3(p, &h, &size, err);
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    if (st == DF_OK)
      json_object_set_new(files, names[i], json_pack("{s:I, s:s}", "size", (json_int_t)size, "xxh3_64", hex));
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  if (st == DF_OK) {
    json_object_set_new(doc, "format", json_string(DF_CKPT_MANIFEST_FORMAT));
    json_object_set_new(doc, "version", json_integer(DF_CKPT_MANIFEST_VERSION));
    json_object_set_new(doc, "checksum", json_string(CHECKSUM));
    json_object_set(doc, "files", files);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, DF_CKPT_MANIFEST);
    st = df_write_json_atomic(path, doc, JSON_INDENT(2), "check the output directory", err);
  }
  json_decref(files), json_decref(doc);
  return st;
}

static df_status damaged(df_error *err, const char *path, const char *fmt, const char *what) {
  return DF_FAIL(err, DF_ERR_FORMAT, path, DAMAGED_HINT, fmt, path, what);
}

static df_status verify_file(const char *dir, const char *name, json_t *entry, df_error *err) {
  char p[4400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  json_t *js = json_object_get(entry, "size"), *jh = json_object_get(entry, "xxh3_64");
  if (!json_is_integer(js) || !json_is_string(jh)) return damaged(err, p, "%s: %s", "its manifest entry is malformed");
  struct stat sb;
  if (stat(p, &sb) != 0) return damaged(err, p, "checkpoint file %s is missing (%s)", "listed in the manifest");
  char what[160];
  if ((int64_t)sb.st_size != (int64_t)json_integer_value(js)) {
    snprintf(what, sizeof what, "%lld bytes, the manifest says %lld: truncated or replaced", (long long)sb.st_size,
             (long long)json_integer_value(js));
    return damaged(err, p, "checkpoint file %s is damaged: %s", what);
  }
  uint64_t h;
  int64_t size;
  DF_TRY(df_file_xxh3(p, &h, &size, err));
  char hex[24];
  snprintf(hex, sizeof hex, "%016" PRIx64, h);
  if (strcmp(hex, json_string_value(jh))) {
    snprintf(what, sizeof what, "checksum %s, the manifest says %s (xxh3-64): its bytes changed", hex,
             json_string_value(jh));
    return damaged(err, p, "checkpoint file %s is damaged: %s", what);
  }
  return DF_OK;
}

df_status df_ckpt_manifest_verify(const char *dir, bool *has_manifest, df_error *err) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, DF_CKPT_MANIFEST);
  struct stat sb;
  *has_manifest = stat(path, &sb) == 0;
  if (!*has_manifest) return DF_OK;
  json_error_t je;
  json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  json_t *files = doc ? json_object_get(doc, "files") : NULL;
  const char *fmt = doc ? json_string_value(json_object_get(doc, "format")) : NULL;
  df_status st = DF_OK;
  if (!doc || !json_is_object(files) || !fmt || strcmp(fmt, DF_CKPT_MANIFEST_FORMAT))
    st = damaged(err, path, "checkpoint manifest %s is damaged: %s", doc ? "not a draftforge manifest" : je.text);
  const char *name;
  json_t *entry;
  if (st == DF_OK) json_object_foreach(files, name, entry) {
      if ((st = verify_file(dir, name, entry, err)) != DF_OK) break;
    }
  json_decref(doc);
  return st;
}
