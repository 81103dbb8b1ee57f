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

// mpirun [common options] TAIL, stdout and stderr together, under an outer timeout. TAIL holds -np and the
// program(s). The programs link OpenMPI, whose start-up allocations the leak checker of sanitizer builds would
// report: suppressed by library (tests/dist/lsan_mpi.supp), which needs the slow unwinder — OpenMPI unloads
// its components at MPI_Finalize, and the fast one then loses the frames that name the library.
static void run_mpirun(const char *tail, int limit_s, run_result *r) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 %d %s --oversubscribe --bind-to none %s --mca btl_vader_single_copy_mechanism none "
           "--mca orte_base_help_aggregate 0 -x OMP_NUM_THREADS=1 "
           "-x ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0 "
           "-x LSAN_OPTIONS=suppressions=%s/tests/dist/lsan_mpi.supp:print_suppressions=0 %s 2>&1",
           limit_s, DF_MPIRUN, geteuid() == 0 ? "--allow-run-as-root" : "", DF_SOURCE_DIR, tail);
  double t0 = now_s();
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p, "popen %s", cmd);
  size_t n = fread(r->out, 1, sizeof r->out - 1, p);
  r->out[n] = 0;
  int st = pclose(p);
  r->seconds = now_s() - t0;
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void run_worker(int np, const char *extra, const char *args, int limit_s, run_result *r) {
  char tail[1024];
  snprintf(tail, sizeof tail, "-np %d %s %s %s", np, extra ? extra : "", DF_DIST_WORKER_BIN, args);
  run_mpirun(tail, limit_s, r);
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

// GPU ranks under mpirun: rank 0 makes NCCL's id, MPI carries it, every rank then creates its NCCL
// communicator on device = local rank. Without a GPU each rank must reach that last step (its CUDA error names
// its own device, which it can only do after the id arrived); without NCCL rank 0 says so.
Test(mpi, gpu_ranks_bootstrap_nccl_over_mpi, .timeout = 150) {
  need_mpirun();
  run_result r;
  run_worker(2, NULL, "gpu-init", 120, &r);
  if (!df_comm_backend_available(DF_COMM_NCCL)) {
    cr_expect(strstr(r.out, "rank 0: gpu init: unsupported: this draftforge was built without NCCL") != NULL, "%s",
              r.out);
    return;
  }
  if (strstr(r.out, "gpu init: ok")) cr_skip_test("a GPU is present: two ranks on one machine's devices\n%s", r.out);
  cr_expect(strstr(r.out, "rank 0: gpu init: io: rank 0: cudaSetDevice failed on device 0") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "rank 1: gpu init: io: rank 1: cudaSetDevice failed on device 1") != NULL, "%s", r.out);
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

// ---- draftforge train under mpirun: start-up checks end the whole job with the reason ------------------------

#define DEMO DF_SOURCE_DIR "/recipes/demo-dflash-synthetic.yaml"

static void train_cmd(char *buf, size_t n, const char *out_dir, const char *sets) {
  snprintf(buf, n, "%s train %s --threads 1 --set output_dir=%s %s", DF_DRAFTFORGE_BIN, DEMO, out_dir, sets);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

Test(mpi, train_refuses_a_recipe_that_disagrees_with_mpirun, .timeout = 150) {
  need_mpirun();
  char out[128], prog[1024], tail[1200];
  snprintf(out, sizeof out, "/tmp/df_dist_train_%d_a", (int)getpid());
  train_cmd(prog, sizeof prog, out, "--set deployment.trainer.nproc_per_node=3");
  snprintf(tail, sizeof tail, "-np 2 %s", prog);
  run_result r;
  run_mpirun(tail, 120, &r);
  cr_expect_neq(r.status, 0, "%s", r.out);
  cr_expect(strstr(r.out, "deployment.trainer asks for nnodes 1 x nproc_per_node 3 = 3 processes, but mpirun "
                          "started 2 (OMPI_COMM_WORLD_RANK/SIZE)") != NULL,
            "%s", r.out);
  cr_expect(!exists(out), "nothing is written for a job that does not start");
}

Test(mpi, train_refuses_ranks_with_different_recipes, .timeout = 150) {
  need_mpirun();
  char out[128], a[1024], b[1024], tail[2200];
  snprintf(out, sizeof out, "/tmp/df_dist_train_%d_b", (int)getpid());
  train_cmd(a, sizeof a, out, "");
  train_cmd(b, sizeof b, out, "--set training.seed=7");
  snprintf(tail, sizeof tail, "-np 1 %s : -np 1 %s", a, b);
  run_result r;
  run_mpirun(tail, 120, &r);
  cr_expect_neq(r.status, 0, "%s", r.out);
  cr_expect(strstr(r.out, "rank 1 has a different resolved recipe than rank 0") != NULL, "%s", r.out);
  cr_expect(!exists(out), "nothing is written for a job that does not start");
}

// Launch, recipe and communicator agree, and the job trains (tests/dist/test_dp.c checks what it computes).
Test(mpi, train_on_two_ranks_names_each_rank, .timeout = 150) {
  need_mpirun();
  char out[128], prog[1024], tail[1200];
  snprintf(out, sizeof out, "/tmp/df_dist_train_%d_c", (int)getpid());
  train_cmd(prog, sizeof prog, out,
            "--set deployment.trainer.nproc_per_node=2 --set training.dist_timeout=0.5 --set training.max_steps=1 "
            "--set training.eval_interval=0");
  snprintf(tail, sizeof tail, "-np 2 %s", prog);
  run_result r;
  run_mpirun(tail, 120, &r);
  cr_expect_eq(r.status, 0, "%s", r.out);
  cr_expect(strstr(r.out, "rank 0 of 2 (local rank 0, launched by mpirun), mpi communicator, timeout 30 s") != NULL,
            "%s", r.out);
  cr_expect(strstr(r.out, "rank 1 of 2 (local rank 1, launched by mpirun)") != NULL, "%s", r.out);
  cr_expect_eq(count(r.out, "done: step 1 of 1"), 1, "rank 0 alone reports the end:\n%s", r.out);
  char p[300];
  snprintf(p, sizeof p, "%s/checkpoints/step-00000001/state.h5", out);
  cr_expect(exists(p), "no %s", p);
  snprintf(p, sizeof p, "rm -rf %s", out);
  cr_expect_eq(system(p), 0);
}
