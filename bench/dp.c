// Data-parallel training benchmark: the demo recipe trained for a few steps at batch b per rank, first on rank 0
// alone (single-process communicator; the other ranks sleep), then on every rank (the job's communicator) with
// replicated AdamW (fsdp_sharding NO_SHARD) and with ZeRO-1 (SHARD_GRAD_OP). Prints the median step time of each,
// the scaling efficiency t(1 rank) / t(W ranks) at the same per-rank batch (1.0: W times the samples per step in
// the same time), and the payload handed to the communicator per optimizer step over 4·P bytes, P the flat
// gradient's elements: 1.00 (plus the small metric and anchor reductions) for the all-reduce — each gradient
// moved once — and 1 + 1/W for ZeRO-1 (the gradient into the reduce-scatter, this rank's parameter shard into
// the all-gather); ZeRO-1's row also carries the final checkpoint's gather of the moments (2·4P·(1/W) per rank,
// spread over the steps: +0.05 at 20 steps and W = 2). One table, printed by rank 0.
// Usage (repository root): mpirun -np 2 build/bench_dp [--steps N] [--batch B] [--recipe PATH]   (alone: world 1 only)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "train/dist/dist.h"
#include "train/trainer/trainer.h"

#ifdef DF_HAVE_MPI
#include <mpi.h>
#endif

typedef struct {
  double last, times[256];
  int n;
  int64_t numel;
} step_clock;

static void on_micro(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  (void)step, (void)micro, (void)grads;
  ((step_clock *)ctx)->numel = n;
}

static void on_step(void *ctx, int64_t step, df_transfer_stats tr) {
  (void)step, (void)tr;
  step_clock *c = ctx;
  double now = bench_now();
  if (c->n < 256) c->times[c->n++] = now - c->last;
  c->last = now;
}

static double median_after_warmup(step_clock *c) {
  int skip = c->n > 2 ? 1 : 0; // the first step sizes the arena
  qsort(c->times + skip, (size_t)(c->n - skip), sizeof(double), bench_cmp_double);
  return c->times[skip + (c->n - skip) / 2];
}

static df_status run(const char *recipe, df_comm *comm, int steps, int batch, const char *sharding, const char *out,
                     step_clock *c, uint64_t *payload, df_error *err) {
  char s_out[512], s_steps[64], s_batch[64], s_shard[64];
  snprintf(s_shard, sizeof s_shard, "training.fsdp_sharding=%s", sharding);
  snprintf(s_out, sizeof s_out, "output_dir=%s", out);
  snprintf(s_steps, sizeof s_steps, "training.max_steps=%d", steps);
  snprintf(s_batch, sizeof s_batch, "training.batch_size=%d", batch);
  const char *sets[] = {
      s_out,  s_steps, s_batch, "training.eval_interval=0", "training.save_interval=0", "training.log_interval=1000000",
      s_shard};
  df_train_hooks h = {.ctx = c, .after_micro = on_micro, .after_step = on_step};
  df_train_options o = {.recipe_path = recipe,
                        .overrides = sets,
                        .n_overrides = (int)(sizeof sets / sizeof *sets),
                        .threads = 1,
                        .hooks = &h,
                        .comm = comm};
  df_train_summary s;
  const uint64_t b0 = df_comm_payload_bytes(comm);
  memset(c, 0, sizeof *c);
  c->last = bench_now();
  DF_TRY(df_train(&o, &s, err));
  *payload = df_comm_payload_bytes(comm) - b0;
  return DF_OK;
}

int main(int argc, char **argv) {
  const char *recipe = "recipes/demo-dflash-synthetic.yaml"; // run from the repository root, or pass --recipe
  int steps = 12, batch = 4;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
      batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--recipe") && i + 1 < argc)
      recipe = argv[++i];
    else
      return fprintf(stderr, "usage: bench_dp [--steps N] [--batch B] [--recipe PATH]\n"), 2;
  }
  df_dist d;
  df_error err = {0};
  df_dist_options dopt = {.cuda_device = -1, .timeout_s = 600, .job_key = 1};
  if (df_dist_init(&dopt, &d, &err) != DF_OK) return df_error_print(&err), df_dist_abort(&d, 1), 1;
  const int rank = df_comm_rank(d.comm), world = df_comm_size(d.comm);
  char out[256];
  snprintf(out, sizeof out, "/tmp/bench_dp_%d", (int)getpid());
  static step_clock c1, cw[2];
  uint64_t pay1 = 0, payw[2] = {0, 0};
  static const char *const MODES[2] = {"NO_SHARD", "SHARD_GRAD_OP"};
  df_status st = DF_OK;
  if (rank == 0) { // one rank alone; the others sleep meanwhile
    df_comm *single = NULL;
    st = df_comm_create_single(false, &single, &err);
    char o1[300];
    snprintf(o1, sizeof o1, "%s_w1", out);
    if (st == DF_OK) st = run(recipe, single, steps, batch, "NO_SHARD", o1, &c1, &pay1, &err);
    if (single) df_comm_finish(single, &err);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", o1);
    (void)!system(cmd);
  }
#ifdef DF_HAVE_MPI
  if (world > 1) { // rank 0 releases the others (they poll with sleeps so rank 0 has the cores)
    int go = st == DF_OK;
    if (rank == 0) {
      for (int r = 1; r < world; r++) MPI_Send(&go, 1, MPI_INT, r, 7, MPI_COMM_WORLD);
    } else {
      MPI_Request rq;
      MPI_Irecv(&go, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, &rq);
      for (int done = 0; !done;) {
        MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
        struct timespec ms = {0, 1000000};
        if (!done) nanosleep(&ms, NULL);
      }
    }
    if (!go) st = DF_ERR_INVALID;
  }
#endif
  char ow[2][300];
  for (int k = 0; k < 2; k++) {
    snprintf(ow[k], sizeof ow[k], "%s_w%d_%d", out, world, k);
    if (st == DF_OK && world > 1) st = run(recipe, d.comm, steps, batch, MODES[k], ow[k], &cw[k], &payw[k], &err);
  }
  if (st != DF_OK) return df_error_print(&err), df_dist_abort(&d, 1), 1;
  if (rank == 0) {
    const double t1 = median_after_warmup(&c1);
    printf("bench_dp: %s, batch %d per rank, %d steps (median after the first)\n", recipe, batch, steps);
    printf("%6s %14s %12s %14s %12s %16s\n", "ranks", "sharding", "step_ms", "samples/s", "efficiency",
           "payload/step/4P");
    printf("%6d %14s %12.2f %14.1f %12s %16s\n", 1, "-", 1e3 * t1, batch / t1, "1.00", "0 (no comm)");
    for (int k = 0; world > 1 && k < 2; k++) {
      const double tw = median_after_warmup(&cw[k]);
      const double per = (double)payw[k] / steps, p4 = 4.0 * (double)cw[k].numel;
      printf("%6d %14s %12.2f %14.1f %12.2f %16.4f\n", world, MODES[k], 1e3 * tw, world * batch / tw, t1 / tw,
             per / p4);
    }
    if (world > 1) printf("P = %lld gradient elements (4P = %.0f B)\n", (long long)cw[0].numel, 4.0 * cw[0].numel);
    for (int k = 0; k < 2; k++) {
      char cmd[400];
      snprintf(cmd, sizeof cmd, "rm -rf %s", ow[k]);
      (void)!system(cmd);
    }
  }
  if (df_dist_finish(&d, &err) != DF_OK) return df_error_print(&err), df_dist_abort(&d, 1), 1;
  return 0;
}
