// Child processes for the scripts in tools/run/: interpreter probing, script lookup, posix_spawn with redirected
// descriptors, and a bounded wait.
#include "base/pytools.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#ifndef DF_SOURCE_TOOLS_DIR
#define DF_SOURCE_TOOLS_DIR ""
#endif

df_status df_pytools_spawn(char *const argv[], int stdin_fd, const char *log_path, char *const extra_env[], pid_t *pid,
                           df_error *err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdin_fd >= 0)
    posix_spawn_file_actions_adddup2(&fa, stdin_fd, 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (log_path) {
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  size_t ne = 0, nx = 0;
  while (environ[ne]) ne++;
  while (extra_env && extra_env[nx]) nx++;
  char **env = calloc(ne + nx + 1, sizeof *env);
  if (!env) {
    posix_spawn_file_actions_destroy(&fa);
    return DF_FAIL(err, DF_ERR_NOMEM, argv[0], NULL, "out of memory");
  }
  if (nx) memcpy(env, extra_env, nx * sizeof *env); // first, so they win over inherited copies
  memcpy(env + nx, environ, ne * sizeof *env);
  int rc = strchr(argv[0], '/') ? posix_spawn(pid, argv[0], &fa, NULL, argv, env)
                                : posix_spawnp(pid, argv[0], &fa, NULL, argv, env);
  free(env);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return DF_FAIL(err, DF_ERR_IO, argv[0], "check that the program exists and is executable", "cannot start %s: %s",
                   argv[0], strerror(rc));
  return DF_OK;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool df_pytools_wait(pid_t pid, double timeout_s, int *exit_code) {
  const double end = mono_s() + timeout_s;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, timeout_s < 0 ? 0 : WNOHANG);
    if (r == pid) {
      *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      return true;
    }
    if (r < 0 && errno != EINTR) { // not our child (already reaped): nothing left to wait for
      *exit_code = 127;
      return true;
    }
    if (timeout_s >= 0 && mono_s() >= end) return false;
    if (r == 0) usleep(20000);
  }
}

// Whether `python -c "import module"` succeeds.
static bool python_imports(const char *python, const char *module) {
  char code[256];
  snprintf(code, sizeof code, "import %s", module);
  char *argv[] = {(char *)python, "-c", code, NULL};
  pid_t pid;
  df_error ignored;
  if (df_pytools_spawn(argv, -1, "/dev/null", NULL, &pid, &ignored) != DF_OK) return false;
  int rc = 1;
  return df_pytools_wait(pid, -1, &rc) && rc == 0;
}

static bool in_tools(const char *rel, char *out, size_t n);

// The tools venv scripts/setup.sh creates (.venv-tools beside tools/), when there is one.
static bool tools_venv_python(char *out, size_t n) { return in_tools("../.venv-tools/bin/python", out, n); }

df_status df_pytools_python(const char *module, const char *pip_name, const char *need, const char *where, char *out,
                            size_t n, df_error *err) {
  const char *forced = getenv("DRAFTFORGE_PYTHON");
  char venv[PATH_MAX];
  const bool free_choice = !(forced && forced[0]);
  const char *candidates[] = {free_choice ? "python3" : forced, free_choice ? "/usr/bin/python3" : NULL,
                              free_choice && tools_venv_python(venv, sizeof venv) ? venv : NULL, NULL};
  for (int i = 0; candidates[i]; i++)
    if (python_imports(candidates[i], module)) {
      snprintf(out, n, "%s", candidates[i]);
      return DF_OK;
    }
  char hint[256];
  snprintf(hint, sizeof hint,
           "pip install %s (into the Python draftforge runs: $DRAFTFORGE_PYTHON, else python3), or run "
           "scripts/setup.sh (.venv-tools)",
           pip_name);
  if (forced && forced[0])
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, where, hint,
                   "%s needs the Python package '%s', which DRAFTFORGE_PYTHON=%s cannot import", need, pip_name,
                   forced);
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, where, hint,
                 "%s needs the Python package '%s', which neither python3, /usr/bin/python3 nor .venv-tools can "
                 "import",
                 need, pip_name);
}

static bool is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// tools/<rel> when it is a file, tools/ being $DRAFTFORGE_TOOLS when set (and only it), else ../tools beside the
// running executable (build/draftforge → tools/), else the source tree's tools/ this binary was built from.
static bool in_tools(const char *rel, char *out, size_t n) {
  const char *env = getenv("DRAFTFORGE_TOOLS");
  if (env && env[0]) return (size_t)snprintf(out, n, "%s/%s", env, rel) < n && is_file(out);
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    if ((size_t)snprintf(out, n, "%s/../tools/%s", exe, rel) < n && is_file(out)) return true;
  }
  return DF_SOURCE_TOOLS_DIR[0] && (size_t)snprintf(out, n, "%s/%s", DF_SOURCE_TOOLS_DIR, rel) < n && is_file(out);
}

df_status df_pytools_script(const char *name, char *out, size_t n, df_error *err) {
  char rel[PATH_MAX];
  snprintf(rel, sizeof rel, "run/%s", name);
  if (in_tools(rel, out, n)) return DF_OK;
  const char *env = getenv("DRAFTFORGE_TOOLS");
  if (env && env[0])
    return DF_FAIL(err, DF_ERR_IO, out, "point DRAFTFORGE_TOOLS at draftforge's tools/ directory (it holds run/)",
                   "DRAFTFORGE_TOOLS has no run/%s", name);
  return DF_FAIL(err, DF_ERR_IO, name, "set DRAFTFORGE_TOOLS to draftforge's tools/ directory (it holds run/)",
                 "cannot find tools/run/%s beside the draftforge program", name);
}
