// GPU ranks under mpirun -np 2 in the CUDA emulator: df_dist_init makes the NCCL communicator (its id carried over
// MPI, device = local rank of two emulated GPUs), and every collective on device buffers matches sums taken in one
// process (tests/dist/dist_worker.c gpu-collectives). The emulated NCCL runs on MPI, so without MPI it is absent.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "tests/cuda/emu/emu_test.h"
#include "train/dist/comm.h"

Test(emu_nccl, two_gpu_ranks_under_mpirun, .timeout = 120) {
  if (!df_comm_backend_available(DF_COMM_NCCL)) cr_skip_test("no MPI in this build: the emulated NCCL is absent");
  if (access(DF_MPIRUN, X_OK) != 0) cr_skip_test("mpirun not found at configure time (%s)", DF_MPIRUN);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 100 %s --oversubscribe --bind-to none %s --mca btl_vader_single_copy_mechanism none "
           "-x OMP_NUM_THREADS=1 -x DF_EMU_DEVICES=2 -np 2 %s gpu-collectives 2>&1",
           DF_MPIRUN, geteuid() == 0 ? "--allow-run-as-root" : "", DF_DIST_WORKER_BIN);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  static char out[65536];
  const size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  const int st = pclose(p);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "mpirun exited %d:\n%s", st, out);
  cr_expect(strstr(out, "rank 0: ok") != NULL, "rank 0 did not finish its checks:\n%s", out);
  cr_expect(strstr(out, "rank 1: ok") != NULL, "rank 1 did not finish its checks:\n%s", out);
}
