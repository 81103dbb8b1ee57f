// Communicator benchmark: time per call of the data-parallel gradient patterns on fp32 buffers of P floats —
// DDP's all-reduce (SUM) and ZeRO-1's reduce-scatter + all-gather — with the algorithm bandwidth (4P bytes /
// time), the bus bandwidth (× 2(W−1)/W, the bytes a ring moves per rank) and the payload the communicator was
// handed per element: 4 B for the all-reduce (each gradient once); 4 + 4/W for ZeRO-1 (each gradient once into
// the reduce-scatter, then this rank's parameter shard into the all-gather). One table, printed by rank 0.
// With MPI the all-reduce row also shows its time over a plain blocking MPI_Allreduce of the same buffer, in
// the same run: what the timed non-blocking call and its watchdog cost.
// Usage: mpirun -np 2 build/bench_comm [--reps N]   (alone: the single-process communicator)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "train/dist/dist.h"

#ifdef DF_HAVE_MPI
#include <mpi.h>

// The same all-reduce through MPI directly (blocking, in place), reps times; seconds per call.
static double plain_mpi_allreduce(float *g, int64_t P, int reps) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = bench_now();
  for (int k = 0; k < reps; k++) MPI_Allreduce(MPI_IN_PLACE, g, (int)P, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return (bench_now() - t0) / reps;
}
#endif

static const int64_t SIZES[] = {1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24};

typedef struct {
  double seconds;
  uint64_t bytes;
} timed;

// reps calls of one pattern, every rank the same count (a budget-based stop would desynchronise the ranks).
static df_status time_pattern(df_comm *c, bool zero1, float *g, int64_t P, int reps, timed *out, df_error *err) {
  int W = df_comm_size(c), R = df_comm_rank(c);
  int64_t shard = P / W;
  DF_TRY(df_comm_barrier(c, err));
  uint64_t b0 = df_comm_payload_bytes(c);
  double t0 = bench_now();
  for (int k = 0; k < reps; k++) {
    if (!zero1) {
      DF_TRY(df_comm_all_reduce(c, g, g, P, DF_COMM_F32, DF_COMM_SUM, err));
    } else {
      DF_TRY(df_comm_reduce_scatter(c, g, g + R * shard, shard, DF_COMM_F32, DF_COMM_SUM, err));
      DF_TRY(df_comm_all_gather(c, g + R * shard, g, shard, DF_COMM_F32, err));
    }
  }
  DF_TRY(df_comm_wait(c, err));
  out->seconds = (bench_now() - t0) / reps;
  out->bytes = (df_comm_payload_bytes(c) - b0) / (uint64_t)reps;
  return DF_OK;
}

static df_status run(df_comm *c, int reps, df_error *err) {
  int W = df_comm_size(c), R = df_comm_rank(c);
  if (R == 0) {
    printf("communicator %s, world %d, %d reps per row\n", df_comm_backend_name(df_comm_backend_of(c)), W, reps);
    printf("%-10s %-22s %12s %12s %12s %16s %18s\n", "P floats", "pattern", "time/call", "alg GB/s", "bus GB/s",
           "payload B/elem", "vs MPI_Allreduce");
  }
  for (size_t i = 0; i < sizeof SIZES / sizeof SIZES[0]; i++) {
    int64_t P = SIZES[i] / W * W;
    float *g = malloc((size_t)P * sizeof *g);
    if (!g) return DF_FAIL(err, DF_ERR_NOMEM, "bench", NULL, "out of memory for %lld floats", (long long)P);
    for (int64_t j = 0; j < P; j++) g[j] = 1e-3f * (float)((j + R) % 97);
    for (int zero1 = 0; zero1 < 2; zero1++) {
      timed t;
      df_status st = time_pattern(c, zero1, g, P, reps, &t, err);
      if (st != DF_OK) return free(g), st;
      double bytes = 4.0 * (double)P, alg = bytes / t.seconds / 1e9, plain = 0;
#ifdef DF_HAVE_MPI
      if (!zero1 && df_comm_backend_of(c) == DF_COMM_MPI) plain = plain_mpi_allreduce(g, P, reps);
#endif
      char ratio[32] = "-";
      if (plain > 0) snprintf(ratio, sizeof ratio, "%.2fx", t.seconds / plain);
      if (R == 0 && W > 1)
        printf("%-10lld %-22s %9.3f ms %12.2f %12.2f %16.2f %18s\n", (long long)P,
               zero1 ? "reduce-scatter+gather" : "all-reduce", t.seconds * 1e3, alg, alg * 2.0 * (W - 1) / W,
               (double)t.bytes / (double)P, ratio);
      else if (R == 0) // world 1: nothing moves; the time is the call overhead
        printf("%-10lld %-22s %9.3f ms %12s %12s %16.2f\n", (long long)P,
               zero1 ? "reduce-scatter+gather" : "all-reduce", t.seconds * 1e3, "-", "-", (double)t.bytes / (double)P);
    }
    free(g);
  }
  return DF_OK;
}

int main(int argc, char **argv) {
  int reps = 20;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
  if (reps < 1) reps = 1;
  df_dist_options o = {.cuda_device = -1, .timeout_s = 120, .deploy = {.nnodes = 1, .nproc_per_node = 1}};
  df_dist d;
  df_error err = {0};
  df_status st = df_dist_init(&o, &d, &err);
  if (st == DF_OK) st = run(d.comm, reps, &err);
  if (st == DF_OK) st = df_dist_finish(&d, &err);
  if (st != DF_OK) {
    df_error_print(&err);
    df_dist_abort(&d, 1);
    return 1;
  }
  return 0;
}
