// The `draftforge` command-line test helpers (tests/common/cli_run.h).
#include "tests/common/cli_run.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FX DF_FIXTURE_DIR "/dflash_step"

static const char *RECIPE = "model:\n"
                            "  target_model_path: " FX "/target\n"
                            "  draft_model_config: " FX "/tiny-dflash.json\n"
                            "data:\n"
                            "  hidden_states_path: " FX "/data\n"
                            "  max_length: 64\n"
                            "run_id: t\n"
                            "training:\n"
                            "  strategy: dflash\n"
                            "  batch_size: 2\n"
                            "  accumulation_steps: 2\n"
                            "  num_anchors: 4\n"
                            "  loss_decay_gamma: 7.0\n"
                            "  objective_chunk_blocks: 2\n"
                            "  num_epochs: 8\n"
                            "  total_steps: 12\n"
                            "  learning_rate: 1e-3\n"
                            "  warmup_ratio: 0.25\n"
                            "  max_grad_norm: 1.0\n"
                            "  log_interval: 1\n"
                            "  seed: 42\n";

const char *df_cli_bin(void) {
  const char *b = getenv("DF_TEST_DRAFTFORGE");
  return b && *b ? b : DF_DRAFTFORGE_BIN;
}

void df_cli_dir_open(df_cli_dir *d, const char *name, const char *extra) {
  snprintf(d->root, sizeof d->root, "/tmp/df_cli_%s_%ld", name, (long)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  fputs(RECIPE, fp);
  if (extra) fputs(extra, fp);
  fclose(fp);
}

void df_cli_dir_close(df_cli_dir *d) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

int df_cli_run(const df_cli_dir *d, const char *args, char *out, size_t n) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && OMP_NUM_THREADS=1 '%s' %s 2>&1", d->root, df_cli_bin(), args);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool df_cli_exists(const df_cli_dir *d, const char *rel) {
  char p[800];
  snprintf(p, sizeof p, "%s/%s", d->root, rel);
  struct stat sb;
  return lstat(p, &sb) == 0;
}

char *df_cli_slurp(const df_cli_dir *d, const char *rel) {
  char p[800];
  snprintf(p, sizeof p, "%s/%s", d->root, rel);
  FILE *fp = fopen(p, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n);
  buf[n] = 0;
  fclose(fp);
  return buf;
}

void df_cli_truncate(const df_cli_dir *d, const char *rel, long size) {
  char p[800];
  snprintf(p, sizeof p, "%s/%s", d->root, rel);
  cr_assert_eq(truncate(p, size), 0, "truncate %s", p);
}

void df_cli_last_line(const char *text, char *line, size_t n) {
  size_t len = strlen(text);
  while (len && text[len - 1] == '\n') len--;
  size_t start = len;
  while (start && text[start - 1] != '\n') start--;
  snprintf(line, n, "%.*s", (int)(len - start), text + start);
}

int df_cli_run_until(const df_cli_dir *d, const char *args, const char *shell, const char *log, const char *wait_for) {
  char cmd[4096];
  if (args)
    snprintf(cmd, sizeof cmd, "cd '%s' && OMP_NUM_THREADS=1 exec '%s' %s > '%s' 2>&1", d->root, df_cli_bin(), args,
             log);
  else
    snprintf(cmd, sizeof cmd, "cd '%s' && OMP_NUM_THREADS=1 exec %s > '%s' 2>&1", d->root, shell, log);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  struct timespec ts = {0, 20 * 1000 * 1000};
  for (int i = 0; i < 3000 && !df_cli_exists(d, wait_for); i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1; // ended on its own
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGTERM);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
