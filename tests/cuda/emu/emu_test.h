// Helpers of the CUDA emulator's own tests: a death test that runs a function in a child process and hands back
// what it wrote to stderr, so a test checks both that the emulator stopped the run and what it said.
#ifndef DF_TESTS_CUDA_EMU_EMU_TEST_H
#define DF_TESTS_CUDA_EMU_EMU_TEST_H

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// Runs fn() in a child (stderr captured into out); the child's terminating signal, or -exit status.
static inline int emu_run_child(void (*fn)(void), char *out, size_t n) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  fflush(NULL);
  const pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 2);
    close(p[0]);
    fn();
    fflush(NULL);
    _exit(0);
  }
  close(p[1]);
  size_t got = 0;
  ssize_t r;
  while (got + 1 < n && (r = read(p[0], out + got, n - 1 - got)) > 0) got += (size_t)r;
  out[got] = 0;
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFSIGNALED(st) ? WTERMSIG(st) : -WEXITSTATUS(st);
}

// fn must stop the run (SIGABRT) and say each of the given strings.
#define EMU_EXPECT_ABORT(fn, ...)                                                                                      \
  do {                                                                                                                 \
    static char out_[16384];                                                                                           \
    const int sig_ = emu_run_child(fn, out_, sizeof out_);                                                             \
    cr_expect_eq(sig_, SIGABRT, "%s: the run was not stopped (signal / -status %d); it said:\n%s", #fn, sig_, out_);   \
    const char *needles_[] = {__VA_ARGS__};                                                                            \
    for (size_t i_ = 0; i_ < sizeof needles_ / sizeof *needles_; i_++)                                                 \
      cr_expect(strstr(out_, needles_[i_]) != NULL, "%s: the report lacks \"%s\":\n%s", #fn, needles_[i_], out_);      \
  } while (0)

#endif
