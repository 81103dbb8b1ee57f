// The tracker child process: its command line from the recipe's tracking section, the pipe it watches, and
// the bounded wait at the end of the run.
#include "train/observe/tracker.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "base/pytools.h"

struct df_tracker {
  const df_recipe *r;
  char python[4096], script[4096];
  pid_t pid;  // -1 until started
  int pipe_w; // the trainer's end; closing it tells the script the run is over
  char backend[16];
  char log_path[4400];
};

const char *df_tracker_package(df_report_to report_to) {
  switch (report_to) {
  case DF_REPORT_WANDB: return "wandb";
  case DF_REPORT_SWANLAB: return "swanlab";
  case DF_REPORT_MLFLOW: return "mlflow";
  case DF_REPORT_NONE:
  case DF_REPORT_TENSORBOARD: return NULL;
  }
  return NULL;
}

// argv after the script: the settings of one backend (NULL values left out). Strings point into r.
typedef struct {
  char *v[40];
  int n;
} argv_list;

static void add(argv_list *a, const char *flag, const char *value) {
  if (!value || a->n + 2 >= (int)(sizeof a->v / sizeof a->v[0])) return;
  a->v[a->n++] = (char *)flag;
  a->v[a->n++] = (char *)value;
}

static void backend_args(const df_recipe *r, argv_list *a, char *mlruns, size_t n) {
  const char *name = r->run_id;
  switch (r->tracking.report_to) {
  case DF_REPORT_WANDB:
    add(a, "--project", r->tracking.wandb_project);
    add(a, "--name", r->tracking.wandb_name ? r->tracking.wandb_name : name);
    add(a, "--dir", r->tracking.wandb_dir ? r->tracking.wandb_dir : r->output_dir);
    if (r->tracking.wandb_offline) a->v[a->n++] = "--offline";
    break;
  case DF_REPORT_SWANLAB:
    add(a, "--project", r->tracking.swanlab_project);
    add(a, "--name", r->tracking.swanlab_name ? r->tracking.swanlab_name : name);
    add(a, "--dir", r->output_dir);
    break;
  case DF_REPORT_MLFLOW:
    snprintf(mlruns, n, "%s/mlruns", r->output_dir);
    add(a, "--tracking-uri", r->tracking.mlflow_tracking_uri ? r->tracking.mlflow_tracking_uri : mlruns);
    add(a, "--project", r->tracking.mlflow_experiment_name);
    add(a, "--name", r->tracking.mlflow_run_name ? r->tracking.mlflow_run_name : name);
    break;
  case DF_REPORT_NONE:
  case DF_REPORT_TENSORBOARD: break;
  }
}

df_status df_tracker_prepare(const df_recipe *r, df_tracker **out, df_error *err) {
  *out = NULL;
  const char *pkg = df_tracker_package(r->tracking.report_to);
  if (!pkg) return DF_OK;
  df_tracker *t = calloc(1, sizeof *t);
  if (!t) return DF_FAIL(err, DF_ERR_NOMEM, "tracking", NULL, "out of memory");
  t->r = r, t->pid = -1, t->pipe_w = -1;
  snprintf(t->backend, sizeof t->backend, "%s", pkg);
  char need[64];
  snprintf(need, sizeof need, "tracking.report_to = %s", pkg);
  df_status st = df_pytools_python(pkg, pkg, need, "tracking.report_to", t->python, sizeof t->python, err);
  if (st == DF_OK) st = df_pytools_script("track.py", t->script, sizeof t->script, err);
  if (st != DF_OK) return free(t), st;
  *out = t;
  return DF_OK;
}

df_status df_tracker_start(df_tracker *t, int64_t from_step, FILE *log, df_error *err) {
  const df_recipe *r = t->r;
  char dir[4300];
  snprintf(dir, sizeof dir, "%.4200s/tracking", r->output_dir);
  df_status st = df_mkdirs(dir, "check output_dir and its permissions", err);
  snprintf(t->log_path, sizeof t->log_path, "%s/%s.log", dir, t->backend);
  int fds[2] = {-1, -1};
  if (st == DF_OK && pipe(fds) != 0) st = DF_FAIL(err, DF_ERR_IO, "tracking", NULL, "cannot create the tracker's pipe");
  if (st != DF_OK) return free(t), st;
  fcntl(fds[1], F_SETFD, FD_CLOEXEC); // later children (another tracker, a probe) must not hold the run open
  char from[32], mlruns[4300];
  snprintf(from, sizeof from, "%lld", (long long)from_step);
  argv_list a = {
      .v = {t->python, t->script, "--backend", t->backend, "--run-dir", (char *)r->output_dir, "--from-step", from},
      .n = 8};
  backend_args(r, &a, mlruns, sizeof mlruns);
  a.v[a.n] = NULL;
  // API keys go through the environment, never the command line (ps shows it to every user)
  char wkey[600], skey[600];
  char *env[3] = {NULL, NULL, NULL};
  int ne = 0;
  if (r->tracking.wandb_key) snprintf(wkey, sizeof wkey, "WANDB_API_KEY=%s", r->tracking.wandb_key), env[ne++] = wkey;
  if (r->tracking.swanlab_key)
    snprintf(skey, sizeof skey, "SWANLAB_API_KEY=%s", r->tracking.swanlab_key), env[ne++] = skey;
  st = df_pytools_spawn(a.v, fds[0], t->log_path, env, &t->pid, err);
  close(fds[0]);
  if (st != DF_OK) {
    close(fds[1]);
    free(t);
    return st;
  }
  t->pipe_w = fds[1];
  if (log)
    fprintf(log, "tracking: %s via tools/run/track.py (pid %ld, log %s)\n", t->backend, (long)t->pid, t->log_path);
  return DF_OK;
}

void df_tracker_finish(df_tracker *t, double timeout_s, FILE *log) {
  if (!t) return;
  if (t->pid < 0) { // prepared, never started
    free(t);
    return;
  }
  close(t->pipe_w);
  int rc = 0;
  bool ended = df_pytools_wait(t->pid, timeout_s, &rc);
  if (!ended) {
    kill(t->pid, SIGTERM);
    ended = df_pytools_wait(t->pid, 10.0, &rc);
    if (!ended) kill(t->pid, SIGKILL), df_pytools_wait(t->pid, -1, &rc);
    if (log)
      fprintf(log, "tracking: %s did not finish within %.0f s and was stopped; see %s\n", t->backend, timeout_s,
              t->log_path);
  } else if (rc != 0 && log) {
    fprintf(log, "tracking: tools/run/track.py (%s) exited with status %d; see %s (metrics.jsonl has every line)\n",
            t->backend, rc, t->log_path);
  }
  free(t);
}
