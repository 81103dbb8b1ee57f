// Test helpers for driving the built `draftforge` program: a scratch run directory holding the tiny DFlash
// recipe (tests/fixtures/dflash_step), running a command with its exit code and output, and small file checks.
// DF_TEST_DRAFTFORGE in the environment replaces the program under test (to run the same tests against another
// build, e.g. the one before a fix).
#ifndef DF_TESTS_CLI_RUN_H
#define DF_TESTS_CLI_RUN_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
  char root[256];   // /tmp/df_cli_<name>_<pid>, created empty
  char recipe[320]; // root/recipe.yaml: the tiny recipe (6 samples, batch 2, accumulation 2, 12-step horizon)
} df_cli_dir;

// Creates the directory and writes the recipe, with `extra` (YAML lines for the end of the training section,
// may be NULL) appended.
void df_cli_dir_open(df_cli_dir *d, const char *name, const char *extra);
void df_cli_dir_close(df_cli_dir *d);

// The program under test.
const char *df_cli_bin(void);

// Runs `cd root && OMP_NUM_THREADS=1 <bin> <args> 2>&1`; returns the exit code, out receives the output.
int df_cli_run(const df_cli_dir *d, const char *args, char *out, size_t n);

// Starts `cd root && exec <bin> <args> > root/<log> 2>&1` (or the shell command `shell` when bin_args is NULL)
// in the background, waits until root/<wait_for> exists (at most ~60 s), sends SIGTERM and waits for the exit.
// Returns the exit code; root/<log> holds the output.
int df_cli_run_until(const df_cli_dir *d, const char *args, const char *shell, const char *log, const char *wait_for);

// root/rel exists (lstat: a dangling link counts).
bool df_cli_exists(const df_cli_dir *d, const char *rel);
// Reads root/rel whole (malloc'd, NUL-terminated; NULL when missing).
char *df_cli_slurp(const df_cli_dir *d, const char *rel);
// Truncates root/rel to `size` bytes.
void df_cli_truncate(const df_cli_dir *d, const char *rel, long size);
// The last line of text (without its newline) into line.
void df_cli_last_line(const char *text, char *line, size_t n);

#endif
