// The MPI communicator across real processes: tests/dist/dist_worker.c under mpirun -np 2 and 3 (oversubscribed,
// as root where needed). Collectives against sums taken in one process, the bootstrap over MPI and TCP, a hung
// rank named by the watchdog, a killed rank ending the job. Skipped (with the reason) in a build without MPI.
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/dist/comm.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void need_mpirun(void) {
  if (!df_comm_backend_available(DF_COMM_MPI)) cr_skip_test("this build has no MPI (see mpi.no_mpi_build_says_so)");
  if (access(DF_MPIRUN, X_OK) != 0) cr_skip_test("mpirun not found at configure time (%s)", DF_MPIRUN);
}

// A port nothing listens on right now (bound once by the kernel's choice, then released).
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

typedef struct {
  int status; // exit status of mpirun (-1: killed by the outer timeout or a signal)
  double seconds;
  char out[65536];
} run_result;

// mpirun -np N [extra] dist_worker ARGS, stdout and stderr together, under an outer timeout. The worker links
// OpenMPI, whose start-up allocations the leak checker would report in sanitizer builds: suppressed there.
static void run_worker(int np, const char *extra, const char *args, int limit_s, run_result *r) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 %d %s -np %d --oversubscribe --bind-to none %s --mca btl_vader_single_copy_mechanism none "
           "-x OMP_NUM_THREADS=1 -x LSAN_OPTIONS=suppressions=%s/tests/dist/lsan_mpi.supp:print_suppressions=0 %s %s "
           "%s 2>&1",
           limit_s, DF_MPIRUN, np, geteuid() == 0 ? "--allow-run-as-root" : "", DF_SOURCE_DIR, extra ? extra : "",
           DF_DIST_WORKER_BIN, args);
  double t0 = now_s();
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "popen %s", cmd);
  size_t n = fread(r->out, 1, sizeof r->out - 1, p);
  r->out[n] = 0;
  int st = pclose(p);
  r->seconds = now_s() - t0;
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count(const char *hay, const char *needle) {
  int k = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) k++;
  return k;
}

static void expect_all_ok(const run_result *r, int np) {
  cr_expect_eq(r->status, 0, "mpirun exited %d:\n%s", r->status, r->out);
  for (int k = 0; k < np; k++) {
    char want[32];
    snprintf(want, sizeof want, "rank %d: ok ", k);
    cr_expect(strstr(r->out, want) != NULL, "no '%s' line:\n%s", want, r->out);
  }
  cr_expect_eq(count(r->out, "FAIL"), 0, "%s", r->out);
}

Test(mpi, collectives_two_ranks_match_one_process_sums, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(2, NULL, "collectives", 120, &r);
  expect_all_ok(&r, 2);
}

Test(mpi, collectives_three_ranks_within_stated_roundoff, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(3, NULL, "collectives", 120, &r);
  expect_all_ok(&r, 3);
}

Test(mpi, bootstrap_over_mpi_and_tcp_gives_every_rank_the_id, .timeout = 150) {
  need_mpirun();
  char extra[128];
  snprintf(extra, sizeof extra, "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=%d", free_port());
  run_result r;
  run_worker(3, extra, "bootstrap", 120, &r);
  expect_all_ok(&r, 3);
}

// Rank 1 stops answering after two collectives; ranks 0 and 2 wait 2 s, probe for the 1 s grace period, and
// end the job naming rank 1 (and each other as waiting in the same collective).
Test(mpi, hung_rank_is_named_within_the_timeout, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(3, NULL, "hang 1 2", 120, &r);
  cr_expect_neq(r.status, 0, "the job must fail:\n%s", r.out);
  cr_expect(strstr(r.out, "rank 0: collective #3 (all-reduce of 1 i64) did not finish within 2 s") != NULL, "%s",
            r.out);
  cr_expect(strstr(r.out, "rank 1 did not answer") != NULL, "the message names rank 1:\n%s", r.out);
  cr_expect(strstr(r.out, "waiting in it too: rank 2") || strstr(r.out, "waiting in it too: rank 0"), "%s", r.out);
  cr_expect(strstr(r.out, "aborting the job") != NULL, "%s", r.out);
  cr_expect_eq(count(r.out, "FAIL"), 0, "%s", r.out);
  // 2 s timeout + 1 s grace + mpirun's start and teardown; far below the outer 120 s limit
  cr_expect(r.seconds < 30, "the job took %.1f s", r.seconds);
}

// A killed rank: mpirun notices and ends the job at once, naming the rank.
Test(mpi, killed_rank_ends_the_job, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(2, NULL, "kill 1 60", 120, &r);
  cr_expect_neq(r.status, 0, "the job must fail:\n%s", r.out);
  cr_expect(strstr(r.out, "process rank 1") != NULL, "mpirun names rank 1:\n%s", r.out);
  cr_expect(r.seconds < 30, "the job took %.1f s (the 60 s watchdog must not be what ended it)", r.seconds);
}

// The same with mpirun told to keep going (--enable-recovery), as a launcher that does not reap the job would:
// the watchdog on rank 0 then names the dead rank.
Test(mpi, dead_rank_is_named_when_the_launcher_does_not_stop_the_job, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(2, "--enable-recovery", "kill 1 2", 120, &r);
  cr_expect(strstr(r.out, "rank 0: collective #3 (all-reduce of 1 i64) did not finish within 2 s") != NULL, "%s",
            r.out);
  cr_expect(strstr(r.out, "rank 1 did not answer") != NULL, "the message names rank 1:\n%s", r.out);
  cr_expect(r.seconds < 30, "the job took %.1f s", r.seconds);
}

Test(mpi, no_mpi_build_says_so) {
  if (df_comm_backend_available(DF_COMM_MPI)) cr_skip_test("this build has MPI (the tests above run it)");
  df_comm *c = (df_comm *)1;
  df_error err = {0};
  cr_assert_eq(df_comm_create_mpi(NULL, &c, &err), DF_ERR_UNSUPPORTED);
  cr_expect_null(c);
  cr_expect(strstr(err.msg, "built without MPI") != NULL, "%s", err.msg);
  cr_expect(strstr(err.hint, "openmpi") != NULL, "%s", err.hint);
}
