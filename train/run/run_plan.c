// Fresh run or resume, and the recipe each runs with (train/run/run_plan.h).
#define _GNU_SOURCE
#include "train/run/run_plan.h"

#include <errno.h>
#include <ftw.h>
#include <hdf5.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/path.h"
#include "train/run/ckpt.h"

static const char *const MAY_CHANGE[] = {
    "training.max_steps", "training.num_epochs", "training.save_interval", "training.save_interval_minutes",
    "training.eval_interval", "training.log_interval", "training.max_checkpoints", "training.max_consecutive_skips",
    "training.resume_from",
    // data parallel: the per-rank batch follows the world size; the
    // checkpoint's contract checks the global batch (ranks x batch_size)
    "training.batch_size",
    // the device and the storage: a checkpoint holds fp32 masters and moments whatever the run computed in, so a bf16
    // GPU run continues on the CPU and back (docs/gpu-training.md "Mixed precision")
    "training.device", "model.torch_dtype", "tracking.", "profiling.", NULL}; // a trailing '.' takes the whole section

bool df_run_plan_may_change(const char *key) {
  for (int i = 0; MAY_CHANGE[i]; i++) {
    size_t n = strlen(MAY_CHANGE[i]);
    if (MAY_CHANGE[i][n - 1] == '.' ? !strncmp(key, MAY_CHANGE[i], n) : !strcmp(key, MAY_CHANGE[i])) return true;
  }
  return false;
}

static void may_change_list(char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; MAY_CHANGE[i]; i++)
    snprintf(buf + strlen(buf), n - strlen(buf), "%s%s%s", i ? ", " : "", MAY_CHANGE[i],
             MAY_CHANGE[i][strlen(MAY_CHANGE[i]) - 1] == '.' ? "*" : "");
}

// ---- the run's own recipe ---------------------------------------------------------------------------------------

// The resolved recipe state.h5 stores (for a run directory that lost its recipe.resolved.yaml); NULL when absent.
static char *stored_recipe(const char *ckpt) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%.4000s/state.h5", ckpt);
  H5E_auto2_t fn;
  void *fd;
  H5Eget_auto2(H5E_DEFAULT, &fn, &fd);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  char *text = NULL, *copy = NULL;
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f >= 0 && H5Aexists(f, "recipe") > 0) {
    hid_t a = H5Aopen(f, "recipe", H5P_DEFAULT), t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    if (a >= 0 && H5Aread(a, t, &text) >= 0 && text) copy = strdup(text);
    if (text) H5free_memory(text);
    H5Tclose(t);
    if (a >= 0) H5Aclose(a);
  }
  if (f >= 0) H5Fclose(f);
  H5Eset_auto2(H5E_DEFAULT, fn, fd);
  return copy;
}

// The run's recipe with output_dir pinned to where the run is (a moved run keeps working) and then `extra`
// overrides: <run>/recipe.resolved.yaml, else the copy in the checkpoint's state.h5.
static df_status load_run_recipe(const df_ckpt_choice *c, const char *const *extra, int n_extra, const df_recipe **out,
                                 df_error *err) {
  const char **sets = calloc((size_t)n_extra + 1, sizeof *sets);
  char pin[PATH_MAX + 16];
  if (!sets) return DF_FAIL(err, DF_ERR_NOMEM, c->run_dir, NULL, "out of memory");
  snprintf(pin, sizeof pin, "output_dir=%.4000s", c->run_dir);
  sets[0] = pin;
  for (int i = 0; i < n_extra; i++) sets[i + 1] = extra[i];
  df_recipe_options ro = {.overrides = sets, .n_overrides = n_extra + 1};
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%.4000s/recipe.resolved.yaml", c->run_dir);
  df_status st;
  if (access(path, R_OK) == 0) {
    st = df_recipe_load(path, &ro, out, err);
  } else {
    char *text = stored_recipe(c->ckpt), name[PATH_MAX + 64];
    snprintf(name, sizeof name, "%.4000s/state.h5 (its stored recipe)", c->ckpt);
    st = text ? df_recipe_parse(text, strlen(text), name, NULL, &ro, out, err)
              : DF_FAIL(err, DF_ERR_IO, path,
                        "resume needs the run's recipe.resolved.yaml (or a checkpoint that "
                        "stores it)",
                        "cannot resume %s: it has no recipe.resolved.yaml", c->run_dir);
    free(text);
  }
  free(sets);
  return st;
}

// want (what the command line asks for) must equal the run's recipe except where a resume may change a key.
static df_status check_agreement(const df_recipe *want, const df_recipe *run, const df_ckpt_choice *c,
                                 const char *asked_by, df_error *err) {
  char key[160], a[160], b[160];
  if (!df_recipe_first_difference(want, run, df_run_plan_may_change, key, sizeof key, a, sizeof a, b, sizeof b))
    return DF_OK;
  char changeable[600], hint[256];
  may_change_list(changeable, sizeof changeable);
  int k = snprintf(hint, sizeof hint,
                   "resume with `draftforge train --resume %.100s` (it reads the run's own recipe), "
                   "or give the run's value",
                   c->run_dir);
  (void)k;
  return DF_FAIL(err, DF_ERR_INVALID, key, hint,
                 "cannot resume %s: %s is %s in %s, but the run has %s (a resume continues the run as it was set "
                 "up; may change: %s)",
                 c->run_dir, key, a, asked_by, b, changeable);
}

static df_status plan_resume(const df_run_plan_options *opt, const df_recipe *asked, df_run_plan *plan,
                             const df_recipe **out, df_error *err) {
  const df_ckpt_choice *c = &plan->from;
  if (!c->run_dir[0])
    return DF_FAIL(err, DF_ERR_INVALID, c->ckpt,
                   "resume a run directory, or start a new run from these weights with model.draft_checkpoint_path "
                   "(a warm start: weights only)",
                   "cannot resume %s: it does not sit in a run directory (<output_dir>/checkpoints/step-<N>)", c->ckpt);
  const df_recipe *run = NULL, *want = NULL;
  DF_TRY(load_run_recipe(c, NULL, 0, &run, err));
  df_status st = DF_OK;
  if (asked) { // RECIPE.yaml given too: it (with its --set) must describe this run
    char by[PATH_MAX + 32];
    snprintf(by, sizeof by, "%.4000s%s", asked->path, opt->n_overrides ? " with the --set options" : "");
    st = check_agreement(asked, run, c, by, err);
    plan->bad_arguments = st != DF_OK;
  } else {
    st = load_run_recipe(c, opt->overrides, opt->n_overrides, &want, err);
    if (st == DF_OK) {
      st = check_agreement(want, run, c, "the --set options", err);
      plan->bad_arguments = st != DF_OK;
    }
  }
  df_recipe_free(run);
  if (st != DF_OK) return df_recipe_free(want), st;
  *out = asked ? asked : want;
  return DF_OK;
}

// ---- a fresh run's directory ----------------------------------------------------------------------------------

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

// The outputs of a run draftforge writes into output_dir; --overwrite removes these and nothing else.
static df_status remove_run_outputs(const char *dir, FILE *log, df_error *err) {
  static const char *const outputs[] = {DF_CKPT_DIR, "metrics.jsonl", "recipe.resolved.yaml", "tensorboard", NULL};
  for (int i = 0; outputs[i]; i++) {
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%.4000s/%s", dir, outputs[i]);
    struct stat sb;
    if (lstat(p, &sb) != 0) continue;
    if (nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
      return DF_FAIL(err, DF_ERR_IO, p, "check the permissions of output_dir", "--overwrite: cannot remove %s: %s", p,
                     strerror(errno));
  }
  char shown[PATH_MAX];
  df_path_shown(dir, shown, sizeof shown);
  if (log) fprintf(log, "--overwrite: removed the earlier run's checkpoints and metrics in %s\n", shown);
  return DF_OK;
}

static df_status prepare_fresh(const df_run_plan_options *opt, const df_recipe *r, df_run_plan *plan, df_error *err) {
  int n = df_run_count_checkpoints(r->output_dir);
  if (n == 0) return DF_OK;
  if (opt->overwrite) {
    plan->overwrite = true; // removed by df_run_plan_apply, once the new run has passed its start-up checks
    return DF_OK;
  }
  char hint[256], shown[PATH_MAX];
  df_path_shown(r->output_dir, shown, sizeof shown);
  snprintf(hint, sizeof hint,
           "continue it with `draftforge train --resume %.60s`, start over with --overwrite (deletes its checkpoints "
           "and metrics), or choose another output_dir (--set output_dir=...)",
           shown);
  return DF_FAIL(err, DF_ERR_INVALID, "output_dir", hint,
                 "output_dir %s already holds %d checkpoint(s) of an earlier run; a new run does not write into it",
                 shown, n);
}

df_status df_run_plan_apply(const df_run_plan *plan, const df_recipe *recipe, FILE *log, df_error *err) {
  return plan->overwrite ? remove_run_outputs(recipe->output_dir, log, err) : DF_OK;
}

// ---- the plan ---------------------------------------------------------------------------------------------------

df_status df_run_plan_make(const df_run_plan_options *opt, const df_recipe **recipe, df_run_plan *plan, df_error *err) {
  *recipe = NULL;
  memset(plan, 0, sizeof *plan);
  const df_recipe *asked = NULL;
  if (opt->recipe_path) {
    df_recipe_options ro = {.log = opt->log, .overrides = opt->overrides, .n_overrides = opt->n_overrides};
    DF_TRY(df_recipe_load(opt->recipe_path, &ro, &asked, err));
  }
  const char *from = opt->resume ? opt->resume : asked ? asked->training.resume_from : NULL;
  bool aut = from && !strcmp(from, "auto");
  if ((!from || aut) && !asked)
    return DF_FAIL(err, DF_ERR_INVALID, "RECIPE.yaml",
                   "give the recipe: draftforge train RECIPE.yaml [--resume auto]; or resume a run: draftforge train "
                   "--resume RUN_DIR",
                   "%s needs RECIPE.yaml", aut ? "--resume auto" : "a new run");
  df_status st = DF_OK;
  if (aut && df_run_count_checkpoints(asked->output_dir) == 0) { // nothing to resume yet: start the run
    char shown[PATH_MAX];
    df_path_shown(asked->output_dir, shown, sizeof shown);
    if (opt->log) fprintf(opt->log, "--resume auto: %s has no checkpoint yet; starting the run\n", shown);
    from = NULL;
  }
  if (!from) {
    st = prepare_fresh(opt, asked, plan, err);
    if (st != DF_OK) return df_recipe_free(asked), st;
    *recipe = asked;
    return DF_OK;
  }
  st = df_ckpt_choose(aut ? asked->output_dir : from, DF_PICK_LATEST, true, aut, &plan->from, err);
  if (st == DF_OK && opt->log && aut) fprintf(opt->log, "--resume auto: %s\n", plan->from.note);
  plan->resume = true;
  if (st == DF_OK) st = plan_resume(opt, asked, plan, recipe, err);
  if (st != DF_OK || *recipe != asked) df_recipe_free(asked);
  return st;
}

// The run directory PATH belongs to, by its shape alone: <run>, <run>/checkpoints, <run>/checkpoints/<ckpt>
// (or its state.h5), as an absolute path. False when PATH has none of these shapes.
static bool run_dir_of(const char *path, char *run, size_t n) {
  char p[PATH_MAX], ck[PATH_MAX + 32];
  df_path_absolute(path, p, sizeof p);
  size_t len = strlen(p);
  if (len > 9 && !strcmp(p + len - 9, "/state.h5")) p[len - 9] = 0;
  struct stat sb;
  snprintf(ck, sizeof ck, "%s/" DF_CKPT_DIR, p);
  if (stat(ck, &sb) == 0 && S_ISDIR(sb.st_mode)) return snprintf(run, n, "%s", p), true;
  for (int up = 0; up < 2; up++) { // p is <run>/checkpoints (up 0) or <run>/checkpoints/<ckpt> (up 1)
    char *slash = strrchr(p, '/');
    if (!slash || slash == p) return false;
    if (up == 1) *slash = 0, slash = strrchr(p, '/');
    if (!slash || strcmp(slash + 1, DF_CKPT_DIR)) continue;
    *slash = 0;
    return snprintf(run, n, "%s", p[0] ? p : "/"), true;
  }
  return false;
}

df_status df_run_plan_peek_recipe(const df_run_plan_options *opt, const df_recipe **recipe, df_error *err) {
  *recipe = NULL;
  bool aut = opt->resume && !strcmp(opt->resume, "auto");
  if (opt->recipe_path || !opt->resume || aut) {
    df_recipe_options ro = {.overrides = opt->overrides, .n_overrides = opt->n_overrides};
    if (!opt->recipe_path)
      return DF_FAIL(err, DF_ERR_INVALID, "RECIPE.yaml", "give the recipe, or resume a run: --resume RUN_DIR",
                     "a new run needs RECIPE.yaml");
    return df_recipe_load(opt->recipe_path, &ro, recipe, err);
  }
  df_ckpt_choice c = {0};
  char path[PATH_MAX + 32];
  struct stat sb;
  if (run_dir_of(opt->resume, c.run_dir, sizeof c.run_dir) &&
      snprintf(path, sizeof path, "%s/recipe.resolved.yaml", c.run_dir) > 0 && stat(path, &sb) == 0)
    return load_run_recipe(&c, opt->overrides, opt->n_overrides, recipe, err);
  df_run_plan_options quiet = *opt;
  quiet.log = NULL;
  df_run_plan plan;
  return df_run_plan_make(&quiet, recipe, &plan, err);
}
