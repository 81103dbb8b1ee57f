// The program tests/dist/test_mpi.c starts under mpirun. Each rank runs the collectives on inputs it can also
// compute for every other rank, so it checks its results against sums taken in this one process (plain loops
// over ranks in rank order, not the communicator). Modes:
//   collectives          every collective, type, reduction and in-place form; counts 0 to 3·2^20
//   bootstrap            launcher variables vs MPI; NCCL's id (or a random blob) shared over MPI and over TCP;
//                        the MoE deferred-update hook (moe/balance.h) over the communicator
//   gpu-init             df_dist_init for GPU ranks: NCCL's id over MPI, then the NCCL communicator; prints
//                        the outcome (on a machine without a GPU: the CUDA error of each rank's device)
//   gpu-collectives      GPU ranks as in gpu-init, then every collective of the NCCL communicator on device
//                        buffers against host sums (builds with NCCL; the CUDA emulator runs it without a GPU)
//   hang RANK TIMEOUT_S  RANK stops answering after two collectives; the others must fail naming it
//   kill RANK            RANK is killed (SIGKILL) after two collectives; the job must end
// Prints "rank R: ok N checks" and exits 0, or prints what differed and exits 1.
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/dist/dist.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int g_rank, g_checks, g_fails;

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    g_checks++;                                                                                                        \
    if (!(cond)) {                                                                                                     \
      g_fails++;                                                                                                       \
      printf("rank %d: FAIL line %d: ", g_rank, __LINE__);                                                             \
      printf(__VA_ARGS__);                                                                                             \
      printf("\n");                                                                                                    \
      fflush(stdout);                                                                                                  \
    }                                                                                                                  \
  } while (0)

#define OK_OR_DIE(expr, errp)                                                                                          \
  do {                                                                                                                 \
    if ((expr) != DF_OK) {                                                                                             \
      printf("rank %d: FAIL line %d: %s [%s]\n", g_rank, __LINE__, (errp)->msg, (errp)->where);                        \
      fflush(stdout);                                                                                                  \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's element i of test t, as each type: the same function on every rank.
static uint64_t bits(int t, int r, size_t i) { return mix(((uint64_t)t << 48) ^ ((uint64_t)r << 40) ^ i); }
static float in_f32(int t, int r, size_t i) { return (float)((double)(bits(t, r, i) >> 11) * 0x1p-53 * 2.0 - 1.0); }
static double in_f64(int t, int r, size_t i) { return (double)(bits(t, r, i) >> 11) * 0x1p-53 * 200.0 - 100.0; }
static int32_t in_i32(int t, int r, size_t i) { return (int32_t)(bits(t, r, i) % 2000001) - 1000000; }
static int64_t in_i64(int t, int r, size_t i) { return (int64_t)(bits(t, r, i) % (1ull << 50)) - (1ll << 49); }

static void fill(void *buf, df_comm_dtype dt, int t, int r, size_t n) {
  for (size_t i = 0; i < n; i++) switch (dt) {
    case DF_COMM_F32: ((float *)buf)[i] = in_f32(t, r, i); break;
    case DF_COMM_F64: ((double *)buf)[i] = in_f64(t, r, i); break;
    case DF_COMM_I32: ((int32_t *)buf)[i] = in_i32(t, r, i); break;
    case DF_COMM_I64: ((int64_t *)buf)[i] = in_i64(t, r, i); break;
    case DF_COMM_U8: ((uint8_t *)buf)[i] = (uint8_t)bits(t, r, i); break;
    }
}

static double value(const void *buf, df_comm_dtype dt, size_t i) {
  switch (dt) {
  case DF_COMM_F32: return ((const float *)buf)[i];
  case DF_COMM_F64: return ((const double *)buf)[i];
  case DF_COMM_I32: return ((const int32_t *)buf)[i];
  case DF_COMM_I64: return (double)((const int64_t *)buf)[i];
  case DF_COMM_U8: return ((const uint8_t *)buf)[i];
  }
  return 0;
}

// The expected element i of op over ranks of input (t, ·, off + i), reduced in rank order in the element type;
// *abs_sum receives Σ|x| for the float tolerance.
static void expect_one(df_comm_dtype dt, df_comm_op op, int t, int W, size_t j, void *out, size_t i, double *abs_sum) {
  double a = 0;
  if (dt == DF_COMM_F32) {
    float acc = in_f32(t, 0, j);
    for (int r = 1; r < W; r++) {
      float x = in_f32(t, r, j);
      acc = op == DF_COMM_MAX ? fmaxf(acc, x) : op == DF_COMM_MIN ? fminf(acc, x) : acc + x;
    }
    for (int r = 0; r < W; r++) a += fabs(in_f32(t, r, j));
    ((float *)out)[i] = op == DF_COMM_AVG ? acc / (float)W : acc;
  } else if (dt == DF_COMM_F64) {
    double acc = in_f64(t, 0, j);
    for (int r = 1; r < W; r++) {
      double x = in_f64(t, r, j);
      acc = op == DF_COMM_MAX ? fmax(acc, x) : op == DF_COMM_MIN ? fmin(acc, x) : acc + x;
    }
    for (int r = 0; r < W; r++) a += fabs(in_f64(t, r, j));
    ((double *)out)[i] = op == DF_COMM_AVG ? acc / W : acc;
  } else if (dt == DF_COMM_I32) {
    int64_t acc = in_i32(t, 0, j);
    for (int r = 1; r < W; r++) {
      int64_t x = in_i32(t, r, j);
      acc = op == DF_COMM_MAX ? (x > acc ? x : acc) : op == DF_COMM_MIN ? (x < acc ? x : acc) : acc + x;
    }
    ((int32_t *)out)[i] = (int32_t)acc;
  } else if (dt == DF_COMM_I64) {
    int64_t acc = in_i64(t, 0, j);
    for (int r = 1; r < W; r++) {
      int64_t x = in_i64(t, r, j);
      acc = op == DF_COMM_MAX ? (x > acc ? x : acc) : op == DF_COMM_MIN ? (x < acc ? x : acc) : acc + x;
    }
    ((int64_t *)out)[i] = acc;
  }
  *abs_sum = a;
}

// Integers exactly. Floats: with two ranks any reduction order is the one addition x0 + x1 (IEEE addition
// commutes), so exactly; with more ranks the order may differ from rank order: |got − want| ≤ (W−1)·ε·Σ|x|.
static void compare(const char *what, df_comm_dtype dt, df_comm_op op, int t, int W, const void *got, size_t off,
                    size_t n) {
  size_t sz = df_comm_dtype_size(dt), bad = 0, first = 0;
  unsigned char want[8];
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double abs_sum = 0;
    expect_one(dt, op, t, W, off + i, want, 0, &abs_sum);
    bool ok;
    if (dt == DF_COMM_I32 || dt == DF_COMM_I64 || W == 2 || op == DF_COMM_MAX || op == DF_COMM_MIN) {
      ok = !memcmp(want, (const char *)got + i * sz, sz);
    } else {
      double eps = dt == DF_COMM_F32 ? 0x1p-24 : 0x1p-53;
      double d = fabs(value(got, dt, i) - value(want, dt, 0));
      ok = d <= (W - 1) * eps * abs_sum * (op == DF_COMM_AVG ? 1.0 / W + eps : 1.0);
      if (d > worst) worst = d;
    }
    if (!ok && !bad++) first = i;
  }
  CHECK(bad == 0, "%s %s %s: %zu of %zu elements differ (first %zu: got %.9g)", what, df_comm_dtype_name(dt),
        df_comm_op_name(op), bad, n, first, n ? value(got, dt, first) : 0.0);
}

static uint64_t hash_bytes(const void *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
  return h;
}

// Every rank must hold the same bits (a data-parallel update must be identical everywhere).
static void check_identical(df_comm *c, const char *what, const void *buf, size_t bytes) {
  uint64_t h = hash_bytes(buf, bytes);
  df_error err = {0};
  CHECK(df_dist_check_same(c, what, h, &err) == DF_OK, "%s: %s", what, err.msg);
}

static const df_comm_dtype TYPES[] = {DF_COMM_F32, DF_COMM_F64, DF_COMM_I32, DF_COMM_I64};
static const size_t COUNTS[] = {0, 1, 7, 1000, 100003};

static void test_all_reduce(df_comm *c, int *t) {
  int W = df_comm_size(c), R = df_comm_rank(c);
  for (size_t ti = 0; ti < 4; ti++)
    for (int op = DF_COMM_SUM; op <= DF_COMM_MIN; op++)
      for (size_t ci = 0; ci < 5; ci++) {
        df_comm_dtype dt = TYPES[ti];
        if (op == DF_COMM_AVG && (dt == DF_COMM_I32 || dt == DF_COMM_I64)) continue;
        size_t n = COUNTS[ci], sz = df_comm_dtype_size(dt);
        void *send = malloc(n * sz + 8), *recv = malloc(n * sz + 8);
        fill(send, dt, ++*t, R, n);
        df_error err = {0};
        OK_OR_DIE(df_comm_all_reduce(c, send, recv, (int64_t)n, dt, (df_comm_op)op, &err), &err);
        compare("all-reduce", dt, (df_comm_op)op, *t, W, recv, 0, n);
        OK_OR_DIE(df_comm_all_reduce(c, send, send, (int64_t)n, dt, (df_comm_op)op, &err), &err); // in place
        CHECK(!memcmp(send, recv, n * sz), "in-place all-reduce %s %s n=%zu differs from out of place",
              df_comm_dtype_name(dt), df_comm_op_name((df_comm_op)op), n);
        if (ci == 4) check_identical(c, "all-reduce result", recv, n * sz);
        free(send), free(recv);
      }
  // A large fp32 sum (gradient-sized), twice: the same bits every time, on every rank.
  size_t n = 3u << 20;
  float *g = malloc(n * sizeof *g), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  fill(g, DF_COMM_F32, ++*t, R, n);
  df_error err = {0};
  OK_OR_DIE(df_comm_all_reduce(c, g, a, (int64_t)n, DF_COMM_F32, DF_COMM_SUM, &err), &err);
  OK_OR_DIE(df_comm_all_reduce(c, g, b, (int64_t)n, DF_COMM_F32, DF_COMM_SUM, &err), &err);
  compare("large all-reduce", DF_COMM_F32, DF_COMM_SUM, *t, W, a, 0, n);
  CHECK(!memcmp(a, b, n * sizeof *a), "the same all-reduce twice gave different bits");
  check_identical(c, "large all-reduce", a, n * sizeof *a);
  free(g), free(a), free(b);
  CHECK(df_comm_all_reduce(c, NULL, NULL, 0, DF_COMM_I64, DF_COMM_AVG, &err) == DF_ERR_INVALID,
        "avg of integers must be refused");
}

static void test_reduce_scatter(df_comm *c, int *t) {
  int W = df_comm_size(c), R = df_comm_rank(c);
  for (size_t ti = 0; ti < 4; ti++)
    for (size_t ci = 0; ci < 5; ci++) {
      df_comm_dtype dt = TYPES[ti];
      df_comm_op op = dt == DF_COMM_F32 ? DF_COMM_AVG : DF_COMM_SUM;
      size_t n = COUNTS[ci], sz = df_comm_dtype_size(dt);
      char *send = malloc(W * n * sz + 8), *recv = malloc(n * sz + 8);
      fill(send, dt, ++*t, R, W * n);
      df_error err = {0};
      OK_OR_DIE(df_comm_reduce_scatter(c, send, recv, (int64_t)n, dt, op, &err), &err);
      compare("reduce-scatter", dt, op, *t, W, recv, (size_t)R * n, n);
      OK_OR_DIE(df_comm_reduce_scatter(c, send, send + (size_t)R * n * sz, (int64_t)n, dt, op, &err), &err);
      CHECK(!memcmp(send + (size_t)R * n * sz, recv, n * sz), "in-place reduce-scatter %s n=%zu differs",
            df_comm_dtype_name(dt), n);
      free(send), free(recv);
    }
}

static void test_all_gather_broadcast(df_comm *c, int *t) {
  int W = df_comm_size(c), R = df_comm_rank(c);
  for (size_t ci = 0; ci < 5; ci++) {
    size_t n = COUNTS[ci];
    int64_t *send = malloc(n * 8 + 8), *recv = malloc(W * n * 8 + 8);
    fill(send, DF_COMM_I64, ++*t, R, n);
    df_error err = {0};
    OK_OR_DIE(df_comm_all_gather(c, send, recv, (int64_t)n, DF_COMM_I64, &err), &err);
    size_t bad = 0;
    for (int q = 0; q < W; q++)
      for (size_t i = 0; i < n; i++) bad += recv[q * n + i] != in_i64(*t, q, i);
    CHECK(bad == 0, "all-gather n=%zu: %zu elements differ", n, bad);
    memset(recv, 0, W * n * 8);
    memcpy(recv + R * n, send, n * 8);
    OK_OR_DIE(df_comm_all_gather(c, recv + R * n, recv, (int64_t)n, DF_COMM_I64, &err), &err); // in place
    bad = 0;
    for (int q = 0; q < W; q++)
      for (size_t i = 0; i < n; i++) bad += recv[q * n + i] != in_i64(*t, q, i);
    CHECK(bad == 0, "in-place all-gather n=%zu: %zu elements differ", n, bad);
    for (int root = 0; root < W; root += W - 1) {
      double *buf = malloc(n * 8 + 8);
      fill(buf, DF_COMM_F64, ++*t, R, n);
      OK_OR_DIE(df_comm_broadcast(c, buf, (int64_t)n, DF_COMM_F64, root, &err), &err);
      bad = 0;
      for (size_t i = 0; i < n; i++) bad += buf[i] != in_f64(*t, root, i);
      CHECK(bad == 0, "broadcast from %d n=%zu: %zu elements differ", root, n, bad);
      // reduce to root, in place: root holds the sum of every rank's input
      fill(buf, DF_COMM_F64, ++*t, R, n);
      OK_OR_DIE(df_comm_reduce(c, buf, (int64_t)n, DF_COMM_F64, DF_COMM_SUM, root, &err), &err);
      if (R == root) compare("reduce", DF_COMM_F64, DF_COMM_SUM, *t, W, buf, 0, n);
      free(buf);
      if (W == 1) break;
    }
    free(send), free(recv);
  }
}

static int run_collectives(df_comm *c) {
  int t = 0;
  test_all_reduce(c, &t);
  test_reduce_scatter(c, &t);
  test_all_gather_broadcast(c, &t);
  df_error err = {0};
  OK_OR_DIE(df_comm_barrier(c, &err), &err);
  // Every rank issued the same collectives; the count is the same everywhere.
  int64_t seq = df_comm_num_collectives(c), all[64];
  OK_OR_DIE(df_comm_all_gather(c, &seq, all, 1, DF_COMM_I64, &err), &err);
  for (int q = 0; q < df_comm_size(c) && q < 64; q++)
    CHECK(all[q] == seq, "rank %d issued %lld collectives", q, (long long)all[q]);
  return 0;
}

// ---- bootstrap -----------------------------------------------------------------------------------------------

static int run_bootstrap(df_comm *c) {
  df_error err = {0};
  df_launch_info li;
  OK_OR_DIE(df_launch_detect(NULL, NULL, &li, &err), &err);
  CHECK(li.launcher == DF_LAUNCH_OPENMPI, "launcher %s", df_launcher_name(li.launcher));
  CHECK(li.rank == df_comm_rank(c) && li.world_size == df_comm_size(c), "env rank %d of %d vs MPI %d of %d", li.rank,
        li.world_size, df_comm_rank(c), df_comm_size(c));
  CHECK(li.local_rank == li.rank && li.local_world_size == li.world_size, "one node: local rank %d of %d",
        li.local_rank, li.local_world_size);
  df_nccl_id via_mpi, via_tcp;
  memset(&via_mpi, 0, sizeof via_mpi);
  if (li.rank == 0) {
    if (df_comm_backend_available(DF_COMM_NCCL))
      OK_OR_DIE(df_comm_nccl_new_id(&via_mpi, &err), &err);
    else
      for (int i = 0; i < DF_NCCL_ID_BYTES; i++) via_mpi.bytes[i] = (unsigned char)(mix((uint64_t)getpid() + i) | 1);
  }
  via_tcp = via_mpi;
  OK_OR_DIE(df_dist_share_blob(&li, c, NULL, NULL, 7, 30, via_mpi.bytes, sizeof via_mpi.bytes, &err), &err);
  // The same blob again, over the TCP exchange (MASTER_ADDR / MASTER_PORT come from mpirun -x).
  OK_OR_DIE(df_dist_share_blob(&li, NULL, NULL, NULL, 7, 30, via_tcp.bytes, sizeof via_tcp.bytes, &err), &err);
  int nonzero = 0;
  for (int i = 0; i < DF_NCCL_ID_BYTES; i++) nonzero += via_mpi.bytes[i] != 0;
  CHECK(nonzero > 0, "the shared id is all zeros");
  CHECK(!memcmp(via_mpi.bytes, via_tcp.bytes, sizeof via_mpi.bytes), "MPI and TCP gave different bytes");
  check_identical(c, "bootstrap id", via_mpi.bytes, sizeof via_mpi.bytes);
  // The MoE hook: a sum, and a mean over ranks (the EMA centering mean's reduction).
  df_collective mc = df_dist_collective(c);
  float v[3] = {1.0f + (float)li.rank, 0.5f, -2.0f * (float)li.rank}, m[3] = {v[0], v[1], v[2]};
  int W = li.world_size;
  OK_OR_DIE(df_allreduce(&mc, v, 3, false, &err), &err);
  OK_OR_DIE(df_allreduce(&mc, m, 3, true, &err), &err);
  float s0 = 0, s2 = 0; // Σ(1 + r), Σ(−2r) over ranks, in rank order
  for (int r = 0; r < W; r++) s0 += 1.0f + (float)r, s2 += -2.0f * (float)r;
  CHECK(mc.world_size == W && v[0] == s0 && v[1] == 0.5f * (float)W && v[2] == s2, "moe sum %g %g %g", v[0], v[1],
        v[2]);
  CHECK(m[0] == s0 / (float)W && m[1] == 0.5f && m[2] == s2 / (float)W, "moe mean %g %g %g", m[0], m[1], m[2]);
  df_status st = df_dist_check_same(c, "rank-dependent value", (uint64_t)li.rank, &err);
  CHECK(st == DF_ERR_INVALID && strstr(err.msg, "rank 1 has a different rank-dependent value"), "check_same: %s",
        err.msg);
  return 0;
}

// ---- faults --------------------------------------------------------------------------------------------------

static int run_fault(df_comm *c, bool kill_it, int victim) {
  df_error err = {0};
  int64_t x = 1, y = 0;
  for (int i = 0; i < 2; i++) OK_OR_DIE(df_comm_all_reduce(c, &x, &y, 1, DF_COMM_I64, DF_COMM_SUM, &err), &err);
  printf("rank %d: two collectives done\n", g_rank);
  fflush(stdout);
  if (g_rank == victim) {
    if (kill_it) raise(SIGKILL);
    for (;;) pause(); // hung outside any collective: answers no probe
  }
  double t0 = now_s();
  df_status st = df_comm_all_reduce(c, &x, &y, 1, DF_COMM_I64, DF_COMM_SUM, &err);
  printf("rank %d: collective #3 returned after %.1f s\n", g_rank, now_s() - t0);
  if (st == DF_OK) {
    printf("rank %d: FAIL the collective finished without rank %d\n", g_rank, victim);
    return 1;
  }
  fflush(stdout);
  df_error_print(&err);
  fflush(stderr);
  // Later calls repeat the failure at once.
  df_error again = {0};
  CHECK(df_comm_barrier(c, &again) == st && !strcmp(again.msg, err.msg), "the failure is not sticky: %s", again.msg);
  printf("rank %d: aborting the job\n", g_rank);
  fflush(stdout);
  df_comm_abort(c, 3);
  return 3;
}

// No communicator of our own: df_dist_init makes them (MPI to carry the id, then NCCL).
static int run_gpu_init(void) {
  df_dist_options o = {.gpu = true, .cuda_device = -1, .timeout_s = 60, .deploy = {.nnodes = 1, .nproc_per_node = 1}};
  df_dist d;
  df_error err = {0};
  df_status st = df_dist_init(&o, &d, &err);
  printf("rank %s: gpu init: %s: %s\n", getenv("OMPI_COMM_WORLD_RANK"), df_status_name(st),
         st == DF_OK ? df_comm_backend_name(df_comm_backend_of(d.comm)) : err.msg);
  fflush(stdout);
  if (st == DF_OK) st = df_dist_finish(&d, &err);
  if (st == DF_OK) return 0;
  // Finalize the MPI that carried the id, so the job ends without an abort (every rank gets here).
  if (d.host && df_comm_finish(d.host, &err) == DF_OK) d.host = NULL;
  df_dist_abort(&d, 4);
  return 4;
}

#ifdef DF_HAVE_NCCL
#include <cuda_runtime.h>

// rank r's input x_r[i] = (r + 1)·(i % 97) − r, exactly representable, so sums over ranks are exact.
static float gpu_input(int r, int64_t i) { return (float)((r + 1) * (int)(i % 97) - r); }

static float *gpu_buffer(int64_t n) {
  float *d = NULL;
  CHECK(cudaMalloc((void **)&d, sizeof(float) * (size_t)n) == cudaSuccess, "cudaMalloc");
  return d;
}

static void gpu_put(float *d, const float *h, int64_t n) {
  CHECK(cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
}

// Waits for the communicator's stream, then copies back.
static void gpu_get(df_comm *c, float *h, const float *d, int64_t n) {
  df_error err = {0};
  CHECK(df_comm_wait(c, &err) == DF_OK, "wait: %s", err.msg);
  CHECK(cudaMemcpy(h, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
}

static int run_gpu_collectives(void) {
  df_dist_options o = {.gpu = true, .cuda_device = -1, .timeout_s = 60, .deploy = {.nnodes = 1, .nproc_per_node = 1}};
  df_dist d;
  df_error err = {0};
  if (df_dist_init(&o, &d, &err) != DF_OK) {
    df_error_print(&err);
    df_dist_abort(&d, 4);
    return 4;
  }
  df_comm *c = d.comm;
  g_rank = df_comm_rank(c);
  const int R = df_comm_size(c);
  CHECK(df_comm_backend_of(c) == DF_COMM_NCCL && df_comm_device_buffers(c), "an NCCL communicator");
  enum { N = 3000 };
  float *h = malloc(sizeof(float) * N * (size_t)R), *want = malloc(sizeof(float) * N * (size_t)R);
  float *dx = gpu_buffer(N * R), *dy = gpu_buffer(N * R);
  for (int op = DF_COMM_SUM; op <= DF_COMM_MIN; op++) { // all-reduce, in place and out of place
    for (int64_t i = 0; i < N; i++) h[i] = gpu_input(g_rank, i);
    gpu_put(dx, h, N);
    CHECK(df_comm_all_reduce(c, dx, dy, N, DF_COMM_F32, (df_comm_op)op, &err) == DF_OK, "all-reduce: %s", err.msg);
    CHECK(df_comm_all_reduce(c, dx, dx, N, DF_COMM_F32, (df_comm_op)op, &err) == DF_OK, "all-reduce: %s", err.msg);
    for (int64_t i = 0; i < N; i++) {
      double s = 0, mx = -1e30, mn = 1e30;
      for (int r = 0; r < R; r++) s += gpu_input(r, i), mx = fmax(mx, gpu_input(r, i)), mn = fmin(mn, gpu_input(r, i));
      want[i] = (float)(op == DF_COMM_SUM ? s : op == DF_COMM_AVG ? s / R : op == DF_COMM_MAX ? mx : mn);
    }
    gpu_get(c, h, dy, N);
    CHECK(!memcmp(h, want, sizeof(float) * N), "all-reduce %s (out of place)", df_comm_op_name((df_comm_op)op));
    gpu_get(c, h, dx, N);
    CHECK(!memcmp(h, want, sizeof(float) * N), "all-reduce %s (in place)", df_comm_op_name((df_comm_op)op));
  }
  // reduce-scatter of R·N, all-gather back, broadcast from the last rank, barrier.
  for (int64_t i = 0; i < N * R; i++) h[i] = gpu_input(g_rank, i);
  gpu_put(dx, h, N * R);
  CHECK(df_comm_reduce_scatter(c, dx, dy, N, DF_COMM_F32, DF_COMM_SUM, &err) == DF_OK, "reduce-scatter: %s", err.msg);
  for (int64_t i = 0; i < N; i++) {
    double s = 0;
    for (int r = 0; r < R; r++) s += gpu_input(r, g_rank * (int64_t)N + i);
    want[i] = (float)s;
  }
  gpu_get(c, h, dy, N);
  CHECK(!memcmp(h, want, sizeof(float) * N), "reduce-scatter: this rank's block of the sum");
  CHECK(df_comm_all_gather(c, dy, dx, N, DF_COMM_F32, &err) == DF_OK, "all-gather: %s", err.msg);
  for (int64_t i = 0; i < N * R; i++) {
    double s = 0;
    for (int r = 0; r < R; r++) s += gpu_input(r, i);
    want[i] = (float)s;
  }
  gpu_get(c, h, dx, N * R);
  CHECK(!memcmp(h, want, sizeof(float) * N * R), "all-gather of the reduce-scatter blocks: the whole sum");
  for (int64_t i = 0; i < N; i++) h[i] = gpu_input(g_rank, i);
  gpu_put(dy, h, N);
  CHECK(df_comm_broadcast(c, dy, N, DF_COMM_F32, R - 1, &err) == DF_OK, "broadcast: %s", err.msg);
  for (int64_t i = 0; i < N; i++) want[i] = gpu_input(R - 1, i);
  gpu_get(c, h, dy, N);
  CHECK(!memcmp(h, want, sizeof(float) * N), "broadcast from rank %d", R - 1);
  // reduce to the last rank, in place (ZeRO-1's gradient buckets to each shard's owner)
  for (int64_t i = 0; i < N; i++) h[i] = gpu_input(g_rank, i);
  gpu_put(dy, h, N);
  CHECK(df_comm_reduce(c, dy, N, DF_COMM_F32, DF_COMM_SUM, R - 1, &err) == DF_OK, "reduce: %s", err.msg);
  if (g_rank == R - 1) {
    for (int64_t i = 0; i < N; i++) {
      double s = 0;
      for (int r = 0; r < R; r++) s += gpu_input(r, i);
      want[i] = (float)s;
    }
    gpu_get(c, h, dy, N);
    CHECK(!memcmp(h, want, sizeof(float) * N), "reduce to rank %d", R - 1);
  }
  CHECK(df_comm_barrier(c, &err) == DF_OK, "barrier: %s", err.msg);
  cudaFree(dx), cudaFree(dy), free(h), free(want);
  CHECK(df_dist_finish(&d, &err) == DF_OK, "finish: %s", err.msg);
  printf("rank %d: %s %d checks\n", g_rank, g_fails ? "FAILED" : "ok", g_checks);
  fflush(stdout);
  return g_fails ? 1 : 0;
}
#endif

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "collectives";
  if (!strcmp(mode, "gpu-init")) return run_gpu_init();
#ifdef DF_HAVE_NCCL
  if (!strcmp(mode, "gpu-collectives")) return run_gpu_collectives();
#endif
  double timeout = 60;
  int victim = -1;
  if (!strcmp(mode, "hang") || !strcmp(mode, "kill")) {
    victim = argc > 2 ? atoi(argv[2]) : 1;
    if (argc > 3) timeout = atof(argv[3]);
  }
  df_comm_mpi_options mo = {.timeout_s = timeout, .expect_rank = -1, .expect_world = -1};
  df_comm *c = NULL;
  df_error err = {0};
  OK_OR_DIE(df_comm_create_mpi(&mo, &c, &err), &err);
  g_rank = df_comm_rank(c);
  int rc = 0;
  if (!strcmp(mode, "collectives"))
    rc = run_collectives(c);
  else if (!strcmp(mode, "bootstrap"))
    rc = run_bootstrap(c);
  else if (victim >= 0)
    return run_fault(c, !strcmp(mode, "kill"), victim);
  else
    return printf("unknown mode %s\n", mode), 2;
  if (g_fails) rc = 1;
  printf("rank %d: %s %d checks\n", g_rank, rc ? "FAILED" : "ok", g_checks);
  fflush(stdout);
  if (df_comm_finish(c, &err) != DF_OK) {
    df_error_print(&err);
    df_comm_abort(c, 1);
    return 1;
  }
  return rc;
}
