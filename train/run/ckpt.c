// Checkpoint directories: written whole under a temporary name, fsynced and renamed, so a directory named
// step-<N> is always complete; the latest/best links are swapped atomically; rotation and resume lookup.
#define _GNU_SOURCE
#include "train/run/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "base/json_write.h"
#include "modeling/strict_load.h"
#include "train/run/ckpt_manifest.h"
#include "train/run/run_dir.h"

#define STEP_FMT "step-%08lld"

// ---- small file-system helpers ---------------------------------------------------------------------------------

// out = dir/name (a truncated path would name the wrong file: callers check the result where it matters).
static bool join(char *out, size_t n, const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  if (a + b + 2 > n) {
    if (n) out[0] = 0;
    return false;
  }
  memmove(out, dir, a); // out may alias dir
  out[a] = '/';
  memcpy(out + a + 1, name, b + 1);
  return true;
}

// out = dir/step-<8 digits>.
static bool join_step(char *out, size_t n, const char *dir, int64_t step) {
  char name[40];
  snprintf(name, sizeof name, STEP_FMT, (long long)step);
  return join(out, n, dir, name);
}

static df_status fsync_path(const char *path, bool dir, df_error *err) {
  int fd = open(path, O_RDONLY | (dir ? O_DIRECTORY : 0));
  bool ok = fd >= 0 && fsync(fd) == 0;
  int e = errno;
  if (fd >= 0) close(fd);
  if (ok) return DF_OK;
  return DF_FAIL(err, DF_ERR_IO, path, "check the disk", "cannot fsync %s: %s", path, strerror(e));
}

static bool is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

static int rm_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return 0;
  return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// "step-00000012" → 12; anything else (temporary names, links) → false.
static bool step_name(const char *name, int64_t *step) {
  if (strncmp(name, "step-", 5)) return false;
  const char *d = name + 5;
  if (strlen(d) < 8) return false;
  for (const char *c = d; *c; c++)
    if (*c < '0' || *c > '9') return false;
  *step = strtoll(d, NULL, 10);
  return true;
}

static bool ckpt_complete(const char *dir) {
  char a[4200], b[4200];
  join(a, sizeof a, dir, "state.h5");
  join(b, sizeof b, dir, "model.safetensors");
  return is_file(a) && is_file(b);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

// Every step-<N> directory under ckdir (complete or not), ascending.
static df_status list_steps(const char *ckdir, bool complete_only, int64_t **out, int *count, df_error *err) {
  *out = NULL, *count = 0;
  DIR *d = opendir(ckdir);
  if (!d) return errno == ENOENT ? DF_OK : DF_FAIL(err, DF_ERR_IO, ckdir, NULL, "cannot list %s", ckdir);
  int cap = 0;
  df_status st = DF_OK;
  for (struct dirent *e; st == DF_OK && (e = readdir(d));) {
    int64_t s;
    char path[4200];
    join(path, sizeof path, ckdir, e->d_name);
    if (!step_name(e->d_name, &s) || !is_dir(path) || (complete_only && !ckpt_complete(path))) continue;
    if (*count == cap) {
      int64_t *grown = realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **out);
      if (!grown)
        st = DF_FAIL(err, DF_ERR_NOMEM, ckdir, NULL, "out of memory");
      else
        *out = grown;
    }
    if (st == DF_OK) (*out)[(*count)++] = s;
  }
  closedir(d);
  if (st != DF_OK)
    free(*out), *out = NULL, *count = 0;
  else if (*count)
    qsort(*out, (size_t)*count, sizeof **out, cmp_i64);
  return st;
}

df_status df_ckpt_list(const char *output_dir, int64_t **out, int *count, df_error *err) {
  char ckdir[4200];
  join(ckdir, sizeof ckdir, output_dir, DF_CKPT_DIR);
  return list_steps(ckdir, true, out, count, err);
}

// The step a link under ckdir points at; -1 when absent or not a step.
static int64_t link_step(const char *ckdir, const char *name) {
  char path[4200], target[512];
  join(path, sizeof path, ckdir, name);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return -1;
  target[n] = 0;
  int64_t s;
  return step_name(target, &s) ? s : -1;
}

// ckdir/name → step-<step>, replaced atomically (a temporary link renamed over the old one).
static df_status set_link(const char *ckdir, const char *name, int64_t step, df_error *err) {
  char path[4200], tmp[4300], target[64];
  join(path, sizeof path, ckdir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  snprintf(target, sizeof target, STEP_FMT, (long long)step);
  remove(tmp);
  if (symlink(target, tmp) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    remove(tmp);
    return DF_FAIL(err, DF_ERR_IO, path, "check the output directory", "cannot link %s -> %s: %s", path, target,
                   strerror(e));
  }
  return DF_OK;
}

// ---- writing ---------------------------------------------------------------------------------------------------

static df_status write_config(const char *path, const json_t *cfg, df_error *err) {
  FILE *fp = fopen(path, "w");
  bool ok = fp && df_json_dumpf(cfg, fp, JSON_INDENT(2)) == 0 && fputc('\n', fp) != EOF;
  ok = fp && fflush(fp) == 0 && fsync(fileno(fp)) == 0 && ok;
  if (fp) ok = fclose(fp) == 0 && ok;
  return ok ? DF_OK
            : DF_FAIL(err, DF_ERR_IO, path, "check the output directory", "cannot write %s: %s", path, strerror(errno));
}

static df_status write_files(const char *dir, const df_ckpt_state *s, df_error *err) {
  char path[4200];
  join(path, sizeof path, dir, "config.json");
  DF_TRY(write_config(path, s->draft_config, err));
  join(path, sizeof path, dir, "model.safetensors");
  df_save_options so = {.dtype = DF_ST_F32};
  DF_TRY(df_ffn_set_save(s->ffn, s->table, s->params, path, &so, err)); // dense / NULL: df_params_save
  DF_TRY(fsync_path(path, false, err));
  join(path, sizeof path, dir, "state.h5");
  DF_TRY(df_ckpt_write_state(path, s, err));
  DF_TRY(fsync_path(path, false, err));
  return fsync_path(dir, true, err);
}

// Which checkpoints a prune removes, given the steps ascending (i of n) and the step `best` points at (-1: none).
typedef bool (*prune_rule)(int64_t step, int i, int n, int64_t best, int64_t arg);

// Removes the checkpoints drop selects; one that `best` pointed at takes the best link and best.json with it.
static df_status prune(const char *ckdir, prune_rule drop, int64_t arg, df_error *err) {
  int64_t *steps;
  int n;
  DF_TRY(list_steps(ckdir, false, &steps, &n, err));
  int64_t best = link_step(ckdir, "best");
  df_status st = DF_OK;
  for (int i = 0; i < n && st == DF_OK; i++) {
    if (!drop(steps[i], i, n, best, arg)) continue;
    char path[4200];
    join_step(path, sizeof path, ckdir, steps[i]);
    if (rm_tree(path) != 0) st = DF_FAIL(err, DF_ERR_IO, path, NULL, "cannot remove %s: %s", path, strerror(errno));
    if (steps[i] == best) {
      join(path, sizeof path, ckdir, "best");
      remove(path);
      join(path, sizeof path, ckdir, "best.json");
      remove(path);
    }
  }
  free(steps);
  return st;
}

// A resumed run that saves step N discards the old run's checkpoints at steps >= N (and a best link to them).
static bool at_or_after(int64_t step, int i, int n, int64_t best, int64_t from) {
  (void)i, (void)n, (void)best;
  return step >= from;
}

// Rotation keeps the newest `keep` checkpoints, plus the one `best` points at.
static bool older_than_newest(int64_t step, int i, int n, int64_t best, int64_t keep) {
  return i + keep < n && step != best;
}

df_status df_ckpt_write(const char *output_dir, const df_ckpt_state *s, int64_t max_checkpoints, char *out, size_t n,
                        df_error *err) {
  char ckdir[4096], tmp[4096], final[4096], name[64];
  int64_t step = s->progress->step;
  snprintf(name, sizeof name, ".tmp-" STEP_FMT ".%ld", (long long)step, (long)getpid());
  if (!join(ckdir, sizeof ckdir, output_dir, DF_CKPT_DIR) || !join_step(final, sizeof final, ckdir, step) ||
      !join(tmp, sizeof tmp, ckdir, name))
    return DF_FAIL(err, DF_ERR_INVALID, "output_dir", "use a shorter output_dir", "output_dir is too long: %.200s",
                   output_dir);
  DF_TRY(df_mkdirs(ckdir, "check output_dir and its permissions", err));
  rm_tree(tmp);
  if (mkdir(tmp, 0777) != 0)
    return DF_FAIL(err, DF_ERR_IO, tmp, "check the output directory", "cannot create %s: %s", tmp, strerror(errno));
  df_status st = write_files(tmp, s, err);
  if (st == DF_OK) st = df_ckpt_manifest_write(tmp, err); // last: a checkpoint with a manifest was written whole
  if (st == DF_OK) st = fsync_path(tmp, true, err);
  if (st == DF_OK) st = prune(ckdir, at_or_after, step, err);
  if (st == DF_OK && rename(tmp, final) != 0)
    st = DF_FAIL(err, DF_ERR_IO, final, NULL, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
  if (st != DF_OK) {
    rm_tree(tmp);
    return st;
  }
  DF_TRY(fsync_path(ckdir, true, err));
  DF_TRY(set_link(ckdir, "latest", step, err));
  if (max_checkpoints > 0) DF_TRY(prune(ckdir, older_than_newest, max_checkpoints, err));
  df_ckpt_remove_stale(ckdir, NULL); // temporaries of writers that died (train/run/run_dir.h)
  if (out) snprintf(out, n, "%s", final);
  return DF_OK;
}

df_status df_ckpt_mark_best(const char *output_dir, int64_t step, const char *metric, double value, df_error *err) {
  char ckdir[4096], path[4096];
  if (!join(ckdir, sizeof ckdir, output_dir, DF_CKPT_DIR) || !join(path, sizeof path, ckdir, "best.json"))
    return DF_FAIL(err, DF_ERR_INVALID, "output_dir", "use a shorter output_dir", "output_dir is too long");
  DF_TRY(set_link(ckdir, "best", step, err));
  json_t *o = json_pack("{s:I, s:s, s:f}", "step", (json_int_t)step, "metric", metric, "value", value);
  char *text = o ? df_json_dumps(o, JSON_INDENT(2)) : NULL;
  json_decref(o);
  if (!text) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  size_t n = strlen(text);
  df_status st = df_write_file_atomic(path, text, n, "check the output directory", err);
  free(text);
  return st;
}

// ---- resume lookup ---------------------------------------------------------------------------------------------

df_status df_ckpt_resolve(const char *path, char *out, size_t n, df_error *err) {
  if (is_file(path)) {
    // state.h5 itself: its directory
    char buf[4200];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash && !strcmp(slash + 1, "state.h5")) {
      *slash = 0;
      return df_ckpt_resolve(buf[0] ? buf : "/", out, n, err);
    }
  }
  if (ckpt_complete(path)) return snprintf(out, n, "%s", path), DF_OK;
  char ckdir[4200];
  join(ckdir, sizeof ckdir, path, DF_CKPT_DIR);
  if (!is_dir(ckdir)) snprintf(ckdir, sizeof ckdir, "%s", path);
  if (!is_dir(ckdir))
    return DF_FAIL(err, DF_ERR_IO, path, "pass a run directory (output_dir) or a checkpoint directory",
                   "cannot resume: %s does not exist", path);
  int64_t latest = link_step(ckdir, "latest");
  char cand[4400];
  join_step(cand, sizeof cand, ckdir, latest);
  if (latest >= 0 && ckpt_complete(cand)) return snprintf(out, n, "%s", cand), DF_OK;
  int64_t *steps;
  int count;
  DF_TRY(list_steps(ckdir, true, &steps, &count, err));
  if (!count)
    return DF_FAIL(err, DF_ERR_IO, path, "pass a run directory that has checkpoints, or a checkpoint directory",
                   "cannot resume: no complete checkpoint under %s", ckdir);
  join_step(cand, sizeof cand, ckdir, steps[count - 1]);
  free(steps);
  snprintf(out, n, "%s", cand);
  return DF_OK;
}
