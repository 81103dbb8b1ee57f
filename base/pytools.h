// Running the Python in tools/run/ from the draftforge program (plot, experiment trackers, online data
// preparation, EAGLE-3 .pt mappings): which interpreter, where the scripts are, and starting one as a child process.
#ifndef DF_BASE_PYTOOLS_H
#define DF_BASE_PYTOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// The interpreter that can `import module`: $DRAFTFORGE_PYTHON when set (and only it), else the first of
// `python3` on PATH, /usr/bin/python3 and the tools venv of scripts/setup.sh (.venv-tools beside tools/) that
// imports it. The error names the pip package (pip_name) and who
// needs it (need, e.g. "tracking.report_to = wandb"); where names that key.
df_status df_pytools_python(const char *module, const char *pip_name, const char *need, const char *where, char *out,
                            size_t n, df_error *err);

// The path of tools/run/<name>, tools/ being $DRAFTFORGE_TOOLS when set, else ../tools beside the running
// executable (build/draftforge → tools/), else the source tree's tools/ this binary was built from.
df_status df_pytools_script(const char *name, char *out, size_t n, df_error *err);

// Starts argv (argv[0] is looked up on PATH when it has no '/') with stdin from stdin_fd (-1: /dev/null) and
// stdout + stderr appended to log_path (NULL: inherited). extra_env ("K=V" strings, NULL-terminated, may be
// NULL) is added to the environment.
df_status df_pytools_spawn(char *const argv[], int stdin_fd, const char *log_path, char *const extra_env[], pid_t *pid,
                           df_error *err);

// Waits for pid for at most timeout_s seconds (< 0: forever). Returns true with *exit_code (128 + signal when
// killed) when it ended; false when it is still running.
bool df_pytools_wait(pid_t pid, double timeout_s, int *exit_code);

#ifdef __cplusplus
}
#endif

#endif
