// Run directories (train/run/run_dir.h): choosing and verifying a checkpoint, SpecForge-style checkpoint names, stale
// temporaries.
#define _GNU_SOURCE
#include "train/run/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/path.h"
#include "train/run/ckpt.h"
#include "train/run/ckpt_manifest.h"

// ---- small file-system helpers -----------------------------------------------------------------------------------

static bool is_file(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool has(const char *dir, const char *name) {
  char p[PATH_MAX + 64];
  df_pathf(p, sizeof p, "%s/%s", dir, name);
  return is_file(p);
}

static bool is_ckpt(const char *dir, bool need_state) {
  if (need_state) return has(dir, "state.h5");
  return has(dir, "config.json") && (has(dir, "model.safetensors") || has(dir, "model.safetensors.index.json"));
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

// "step-00000012" -> 12, else -1.
static int64_t step_of(const char *name) {
  if (strncmp(name, "step-", 5) || strlen(name) < 13) return -1;
  for (const char *c = name + 5; *c; c++)
    if (*c < '0' || *c > '9') return -1;
  return strtoll(name + 5, NULL, 10);
}

static int cmp_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x < y) - (x > y);
}

// Every step-<N> directory of ckdir, newest first; *out is malloc'd.
static int list_steps_desc(const char *ckdir, int64_t **out) {
  *out = NULL;
  DIR *d = opendir(ckdir);
  if (!d) return 0;
  int n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    int64_t s = step_of(e->d_name);
    char p[PATH_MAX + 64];
    df_pathf(p, sizeof p, "%s/%s", ckdir, e->d_name);
    if (s < 0 || !is_dir(p)) continue;
    if (n == cap) {
      int64_t *g = realloc(*out, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *g);
      if (!g) break;
      *out = g;
    }
    (*out)[n++] = s;
  }
  closedir(d);
  if (n) qsort(*out, (size_t)n, sizeof **out, cmp_desc);
  return n;
}

int df_run_count_checkpoints(const char *output_dir) {
  char ck[PATH_MAX + 32];
  df_pathf(ck, sizeof ck, "%s/" DF_CKPT_DIR, output_dir);
  int64_t *steps;
  int n = list_steps_desc(ck, &steps);
  free(steps);
  return n;
}

// ---- choosing a checkpoint ------------------------------------------------------------------------------------

// A usable checkpoint: the files the caller needs, and an intact manifest. why receives what is wrong.
static bool usable(const char *dir, bool need_state, bool *verified, df_error *why) {
  *verified = false;
  if (!is_ckpt(dir, need_state)) {
    DF_FAIL(why, DF_ERR_FORMAT, dir, NULL, "%s is incomplete: no %s", dir,
            need_state ? "state.h5" : "config.json + model.safetensors");
    return false;
  }
  return df_ckpt_manifest_verify(dir, verified, why) == DF_OK;
}

static void fill_choice(df_ckpt_choice *c, const char *dir, const char *run_dir, bool verified) {
  df_path_shown(dir, c->ckpt, sizeof c->ckpt);
  if (run_dir) df_path_shown(run_dir, c->run_dir, sizeof c->run_dir);
  c->step = step_of(base_name(c->ckpt));
  c->verified = verified;
}

// The run directory around a checkpoint directory: <run>/checkpoints/<ckpt>.
static bool run_of_ckpt(const char *ckpt, char *run, size_t n) {
  char p[PATH_MAX];
  df_path_absolute(ckpt, p, sizeof p);
  char *slash = strrchr(p, '/');
  if (!slash || slash == p) return false;
  *slash = 0;
  if (strcmp(base_name(p), DF_CKPT_DIR)) return false;
  slash = strrchr(p, '/');
  if (!slash) return false;
  *slash = 0;
  char rel[PATH_MAX];
  df_pathf(rel, sizeof rel, "%s/../..", ckpt); // shown as the user would type it from here
  df_path_shown(rel, run, n);
  return true;
}

// The newest usable checkpoint of ckdir other than `skip` (-1: none skipped); its step or -1.
static int64_t newest_usable(const char *ckdir, int64_t skip, bool need_state, bool *verified) {
  int64_t *steps;
  int n = list_steps_desc(ckdir, &steps);
  int64_t found = -1;
  for (int i = 0; i < n && found < 0; i++) {
    if (steps[i] == skip) continue;
    char p[PATH_MAX + 64];
    df_pathf(p, sizeof p, "%s/step-%08lld", ckdir, (long long)steps[i]);
    df_error why = {0};
    if (usable(p, need_state, verified, &why)) found = steps[i];
  }
  free(steps);
  return found;
}

// A damaged or incomplete choice: fall back to the newest usable checkpoint, or fail offering it.
static df_status damaged_choice(const char *ckdir, const char *run, int64_t skip, bool need_state, bool fall_back,
                                const df_error *why, const char *what, df_ckpt_choice *out, df_error *err) {
  bool verified = false;
  int64_t alt = ckdir ? newest_usable(ckdir, skip, need_state, &verified) : -1;
  char alt_dir[PATH_MAX + 64] = "";
  if (alt >= 0) df_pathf(alt_dir, sizeof alt_dir, "%s/step-%08lld", ckdir, (long long)alt);
  if (alt >= 0 && fall_back) {
    fill_choice(out, alt_dir, run, verified);
    df_pathf(out->note, sizeof out->note, "%s is damaged (%.600s); taking the newest complete checkpoint, step %lld",
             what, why->msg, (long long)alt);
    return DF_OK;
  }
  char hint[256];
  char shown[PATH_MAX];
  df_path_shown(alt_dir, shown, sizeof shown);
  if (alt >= 0)
    df_pathf(hint, sizeof hint,
             "the newest complete checkpoint is %.150s: pass it instead (train --resume auto takes it)", shown);
  else
    snprintf(hint, sizeof hint, "no complete checkpoint is left; start a new run (train --overwrite)");
  return DF_FAIL(err, why->status, why->where, hint, "%s is damaged: %.400s", what, why->msg);
}

static df_status choose_explicit(const char *dir, bool need_state, bool fall_back, df_ckpt_choice *out, df_error *err) {
  char run[PATH_MAX], ckdir[PATH_MAX + 32];
  bool in_run = run_of_ckpt(dir, run, sizeof run);
  df_pathf(ckdir, sizeof ckdir, "%s/" DF_CKPT_DIR, run);
  bool verified;
  df_error why = {0};
  if (usable(dir, need_state, &verified, &why)) {
    fill_choice(out, dir, in_run ? run : NULL, verified);
    df_pathf(out->note, sizeof out->note, "checkpoint %s", out->ckpt);
    return DF_OK;
  }
  char what[PATH_MAX + 32], norm[PATH_MAX];
  df_path_shown(dir, norm, sizeof norm);
  df_pathf(what, sizeof what, "checkpoint %s", norm);
  return damaged_choice(in_run ? ckdir : NULL, in_run ? run : NULL, step_of(base_name(norm)), need_state, fall_back,
                        &why, what, out, err);
}

// The step a link of ckdir points at (-1 when absent or not a step).
static int64_t link_target(const char *ckdir, const char *name) {
  char p[PATH_MAX + 64], t[256];
  df_pathf(p, sizeof p, "%s/%s", ckdir, name);
  ssize_t k = readlink(p, t, sizeof t - 1);
  if (k <= 0) return -1;
  t[k] = 0;
  return step_of(base_name(t));
}

static df_status choose_in_run(const char *ckdir, const char *run, df_ckpt_pick pick, bool need_state, bool fall_back,
                               df_ckpt_choice *out, df_error *err) {
  int64_t *steps;
  int n = list_steps_desc(ckdir, &steps);
  int64_t newest = n ? steps[0] : -1;
  free(steps);
  char shown[PATH_MAX];
  df_path_shown(run ? run : ckdir, shown, sizeof shown);
  if (n == 0)
    return DF_FAIL(err, DF_ERR_IO, shown,
                   "a run saves every training.save_interval steps and training.save_interval_minutes, at the end "
                   "and on SIGTERM; train --resume auto starts the run when it has no checkpoint yet",
                   "no checkpoint under %s", shown);
  const char *link = pick == DF_PICK_BEST ? "best" : "latest";
  int64_t step = link_target(ckdir, link);
  if (step < 0 && pick == DF_PICK_BEST)
    return DF_FAIL(err, DF_ERR_INVALID, shown,
                   "set training.eval_interval (and data.eval_hidden_states_path) so "
                   "the run evaluates; without --best the latest checkpoint is taken",
                   "%s has no best checkpoint: it ran no eval", shown);
  if (step < 0) step = newest; // no link (a run stopped before its first link swap): the highest step
  char dir[PATH_MAX + 64], what[PATH_MAX + 128];
  df_pathf(dir, sizeof dir, "%s/step-%08lld", ckdir, (long long)step);
  df_pathf(what, sizeof what, "the %s checkpoint of %s (step %lld)", link, shown, (long long)step);
  bool verified;
  df_error why = {0};
  if (usable(dir, need_state, &verified, &why)) {
    fill_choice(out, dir, run, verified);
    df_pathf(out->note, sizeof out->note, "%s checkpoint, step %lld", link, (long long)step);
    return DF_OK;
  }
  return damaged_choice(ckdir, run, step, need_state, fall_back, &why, what, out, err);
}

df_status df_ckpt_choose(const char *path, df_ckpt_pick pick, bool need_state, bool fall_back, df_ckpt_choice *out,
                         df_error *err) {
  memset(out, 0, sizeof *out);
  out->step = -1;
  char p[PATH_MAX];
  df_path_shown(path, p, sizeof p);
  if (is_file(p) && !strcmp(base_name(p), "state.h5")) { // state.h5 itself: its directory
    char *slash = strrchr(p, '/');
    if (slash)
      *slash = 0;
    else
      df_pathf(p, sizeof p, ".");
  }
  if (!is_dir(p))
    return DF_FAIL(err, DF_ERR_IO, p, "pass a run directory (output_dir), its checkpoints/ or one checkpoint directory",
                   "%s does not exist", p);
  char ckdir[PATH_MAX + 32];
  df_pathf(ckdir, sizeof ckdir, "%s/" DF_CKPT_DIR, p);
  if (is_dir(ckdir)) return choose_in_run(ckdir, p, pick, need_state, fall_back, out, err);
  if (!strcmp(base_name(p), DF_CKPT_DIR) && !is_ckpt(p, need_state)) {
    char run[PATH_MAX + 8];
    df_pathf(run, sizeof run, "%s/..", p);
    char nrun[PATH_MAX];
    df_path_shown(run, nrun, sizeof nrun);
    return choose_in_run(p, nrun, pick, need_state, fall_back, out, err);
  }
  if (pick == DF_PICK_BEST)
    return DF_FAIL(err, DF_ERR_INVALID, p, "pass the run directory with --best, or drop --best",
                   "--best needs a run directory; %s is one checkpoint", p);
  if (is_ckpt(p, need_state) || has(p, DF_CKPT_MANIFEST) || step_of(base_name(p)) >= 0)
    return choose_explicit(p, need_state, fall_back, out, err);
  return DF_FAIL(err, DF_ERR_INVALID, p,
                 "pass a run directory (output_dir), its checkpoints/ or one checkpoint directory",
                 "%s is neither a run directory nor a checkpoint (no %s)", p,
                 need_state ? "checkpoints/ or state.h5" : "checkpoints/ or config.json + model.safetensors");
}

// ---- temporaries of dead writers -------------------------------------------------------------------------------

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

// The writer's pid in a temporary's name: ".tmp-step-<N>.<pid>" (dir) or "<latest|best|best.json>.tmp.<pid>"; 0
// when the name is not a temporary.
static long temp_pid(const char *name, bool *is_dir_tmp) {
  const char *digits = NULL;
  *is_dir_tmp = false;
  if (!strncmp(name, ".tmp-step-", 10)) {
    const char *dot = strchr(name + 10, '.');
    if (!dot || dot == name + 10) return 0;
    for (const char *c = name + 10; c < dot; c++)
      if (*c < '0' || *c > '9') return 0;
    digits = dot + 1, *is_dir_tmp = true;
  } else {
    static const char *const links[] = {"latest.tmp.", "best.tmp.", "best.json.tmp.", NULL};
    for (int i = 0; links[i] && !digits; i++)
      if (!strncmp(name, links[i], strlen(links[i]))) digits = name + strlen(links[i]);
  }
  if (!digits || !*digits) return 0;
  for (const char *c = digits; *c; c++)
    if (*c < '0' || *c > '9') return 0;
  return strtol(digits, NULL, 10);
}

static bool process_gone(long pid) {
  if (pid == (long)getpid()) return true; // this process writes none while cleaning: a previous owner of the id
  return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int df_ckpt_remove_stale(const char *ckdir, FILE *log) {
  DIR *d = opendir(ckdir);
  if (!d) return 0;
  int removed = 0;
  for (struct dirent *e; (e = readdir(d));) {
    bool dir_tmp;
    long pid = temp_pid(e->d_name, &dir_tmp);
    if (pid <= 0 || !process_gone(pid)) continue;
    char p[PATH_MAX + 300];
    df_pathf(p, sizeof p, "%s/%s", ckdir, e->d_name);
    struct stat sb;
    if (lstat(p, &sb) != 0 || (dir_tmp && !S_ISDIR(sb.st_mode))) continue;
    int rc = dir_tmp ? nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS) : remove(p);
    if (rc != 0) continue;
    removed++;
    if (log) {
      char shown[PATH_MAX];
      df_path_shown(p, shown, sizeof shown);
      fprintf(log, "removed %s, left by process %ld, which is gone\n", shown, pid);
    }
  }
  closedir(d);
  return removed;
}

// ---- checkpoints draftforge did not write (SpecForge-style names) ---------------------------------------------

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

// The N of a name ending in "step<N>", "step-<N>" or "step_<N>" (N decimal digits), or -1.
static long long step_number(const char *name) {
  long long n = -1;
  for (const char *s = strstr(name, "step"); s; s = strstr(s + 1, "step")) {
    const char *d = s + 4 + (s[4] == '-' || s[4] == '_');
    if (*d < '0' || *d > '9') continue;
    char *end;
    long long v = strtoll(d, &end, 10);
    if (*end == 0) n = v;
  }
  return n;
}

df_status df_checkpoint_dir_resolve(const char *path, char *out, size_t out_size, df_error *err) {
  static const char hint[] = "pass a checkpoint directory (config.json + model.safetensors) or a run directory";
  if (is_ckpt(path, false)) {
    snprintf(out, out_size, "%s", path);
    return DF_OK;
  }
  char sub[PATH_MAX]; // a run directory keeps its checkpoints under checkpoints/ (DF_CKPT_DIR)
  if (df_pathf(sub, sizeof sub, "%s/" DF_CKPT_DIR, path)) {
    struct stat sb;
    if (stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) return df_checkpoint_dir_resolve(sub, out, out_size, err);
  }
  DIR *d = opendir(path);
  if (!d) return DF_FAIL(err, DF_ERR_IO, path, hint, "cannot open the checkpoint: %s", strerror(errno));
  char best[PATH_MAX] = "", latest[PATH_MAX] = "", p[PATH_MAX];
  long long best_n = -1;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if (!df_pathf(p, sizeof p, "%s/%s", path, e->d_name) || !is_ckpt(p, false)) continue;
    if (ends_with(e->d_name, "latest")) snprintf(latest, sizeof latest, "%s", p);
    long long n = step_number(e->d_name);
    if (n > best_n) best_n = n, snprintf(best, sizeof best, "%s", p);
  }
  closedir(d);
  // Name the checkpoint the link points at (a relative target sits in the same directory).
  char target[PATH_MAX];
  ssize_t k = latest[0] ? readlink(latest, target, sizeof target - 1) : -1;
  if (k > 0) {
    target[k] = 0;
    if (target[0] == '/' || !df_pathf(latest, sizeof latest, "%s/%s", path, target))
      snprintf(latest, sizeof latest, "%s", target);
  }
  const char *pick = latest[0] ? latest : best;
  if (!pick[0])
    return DF_FAIL(err, DF_ERR_INVALID, path, hint,
                   "no checkpoint here: neither config.json + model.safetensors nor a *latest / *-step<N> directory");
  snprintf(out, out_size, "%s", pick);
  return DF_OK;
}

// ---- export and eval -------------------------------------------------------------------------------------------

bool df_run_best(const char *run_dir, int64_t *step, char *metric, size_t n, double *value) {
  char ck[PATH_MAX + 32], p[PATH_MAX + 64];
  if (!df_pathf(ck, sizeof ck, "%s/" DF_CKPT_DIR, run_dir) || !df_pathf(p, sizeof p, "%s/best.json", ck)) return false;
  *step = link_target(ck, "best");
  json_t *o = json_load_file(p, 0, NULL);
  const char *m = o ? json_string_value(json_object_get(o, "metric")) : NULL;
  snprintf(metric, n, "%s", m ? m : "eval");
  *value = o ? json_number_value(json_object_get(o, "value")) : 0;
  json_decref(o);
  return *step >= 0;
}

df_status df_ckpt_choose_model(const char *path, bool best, df_ckpt_choice *out, df_error *err) {
  char p[PATH_MAX], ck[PATH_MAX + 32];
  df_path_shown(path, p, sizeof p);
  bool ours = df_pathf(ck, sizeof ck, "%s/" DF_CKPT_DIR, p) && is_dir(ck);
  ours = ours || !strcmp(base_name(p), DF_CKPT_DIR) || is_ckpt(p, false) || has(p, DF_CKPT_MANIFEST) || best;
  if (!ours) { // not a draftforge layout: SpecForge-style names
    memset(out, 0, sizeof *out);
    char dir[PATH_MAX];
    DF_TRY(df_checkpoint_dir_resolve(p, dir, sizeof dir, err));
    fill_choice(out, dir, NULL, false);
    df_pathf(out->note, sizeof out->note, "checkpoint %s", out->ckpt);
    return DF_OK;
  }
  DF_TRY(df_ckpt_choose(p, best ? DF_PICK_BEST : DF_PICK_LATEST, false, false, out, err));
  int64_t bstep;
  double value;
  char metric[64];
  if (best && df_run_best(out->run_dir, &bstep, metric, sizeof metric, &value))
    df_pathf(out->note, sizeof out->note, "best checkpoint, step %lld (%s %.4f)", (long long)out->step, metric, value);
  else if (!best && out->run_dir[0] && strstr(out->note, "latest") &&
           df_run_best(out->run_dir, &bstep, metric, sizeof metric, &value) && bstep != out->step)
    df_pathf(out->note + strlen(out->note), sizeof out->note - strlen(out->note),
             "; the run's best is step %lld (%s %.4f): --best takes it", (long long)bstep, metric, value);
  return DF_OK;
}
