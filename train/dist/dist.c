// Setting up the job (train/dist/dist.h): launcher + recipe, then the communicator and, for NCCL, its id.
#include "train/dist/dist.h"

#include <stdlib.h>
#include <string.h>

#include "train/dist/tcp_bootstrap.h"

static const char *env_get(df_getenv_fn get, void *ctx, const char *name) {
  const char *v = get ? get(ctx, name) : getenv(name);
  return v && *v ? v : NULL;
}

df_status df_dist_bootstrap_port(const df_launch_info *li, df_getenv_fn get, void *ctx, int *port, df_error *err) {
  const char *v = env_get(get, ctx, "DRAFTFORGE_BOOTSTRAP_PORT");
  if (v) {
    char *end;
    long p = strtol(v, &end, 10);
    if (*end || p < 1 || p > 65535)
      return DF_FAIL(err, DF_ERR_INVALID, "DRAFTFORGE_BOOTSTRAP_PORT", NULL,
                     "DRAFTFORGE_BOOTSTRAP_PORT=%s is not a TCP port", v);
    *port = (int)p;
    return DF_OK;
  }
  if (li->master_port < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "MASTER_PORT", "set MASTER_PORT or deployment.trainer.master_port",
                   "no port for the bootstrap");
  const char *agent = env_get(get, ctx, "TORCHELASTIC_USE_AGENT_STORE");
  bool agent_store = agent && (!strcmp(agent, "True") || !strcmp(agent, "true") || !strcmp(agent, "1"));
  *port = li->master_port + (agent_store ? 1 : 0);
  if (*port > 65535)
    return DF_FAIL(err, DF_ERR_INVALID, "MASTER_PORT", "set DRAFTFORGE_BOOTSTRAP_PORT",
                   "MASTER_PORT + 1 is not a TCP port");
  return DF_OK;
}

df_status df_dist_share_blob(const df_launch_info *li, df_comm *host, df_getenv_fn get, void *ctx, uint64_t job_key,
                             double timeout_s, void *blob, size_t len, df_error *err) {
  if (host) return df_comm_broadcast(host, blob, (int64_t)len, DF_COMM_U8, 0, err);
  int port = 0;
  DF_TRY(df_dist_bootstrap_port(li, get, ctx, &port, err));
  if (li->rank != 0 && !li->master_addr[0])
    return DF_FAIL(err, DF_ERR_INVALID, "MASTER_ADDR", "export MASTER_ADDR, or set deployment.trainer.master_addr",
                   "rank %d: no address for rank 0 (the bootstrap of NCCL's id)", li->rank);
  df_tcp_bootstrap_options to = {.addr = li->master_addr,
                                 .port = port,
                                 .rank = li->rank,
                                 .world_size = li->world_size,
                                 .job_key = job_key,
                                 .timeout_s = timeout_s > 0 ? timeout_s : DF_COMM_DEFAULT_TIMEOUT_S};
  return df_tcp_bootstrap(&to, blob, len, err);
}

df_status df_dist_check_same(df_comm *c, const char *what, uint64_t value, df_error *err) {
  int W = df_comm_size(c);
  if (W == 1) return DF_OK;
  uint64_t *all = malloc((size_t)W * sizeof *all);
  if (!all) return DF_FAIL(err, DF_ERR_NOMEM, what, NULL, "out of memory");
  df_status st = df_comm_all_gather_host(c, &value, all, 8, DF_COMM_U8, err);
  for (int r = 1; st == DF_OK && r < W; r++)
    if (all[r] != all[0])
      st = DF_FAIL(err, DF_ERR_INVALID, what, "start every rank with the same recipe, --set options and data",
                   "rank %d has a different %s than rank 0 (%016llx vs %016llx)", r, what, (unsigned long long)all[r],
                   (unsigned long long)all[0]);
  free(all);
  return st;
}

static df_status collective_sum(void *user, float *buf, int64_t n, df_error *err) {
  return df_comm_all_reduce(user, buf, buf, n, DF_COMM_F32, DF_COMM_SUM, err);
}

static df_status collective_sum_host(void *user, float *buf, int64_t n, df_error *err) {
  return df_comm_all_reduce_host(user, buf, n, DF_COMM_F32, DF_COMM_SUM, err);
}

df_collective df_dist_collective(df_comm *c) {
  if (!c || df_comm_size(c) == 1) return (df_collective){.world_size = 1};
  return (df_collective){
      .sum = collective_sum, .sum_host = collective_sum_host, .user = c, .world_size = df_comm_size(c)};
}

// ---- the communicator for this launch ------------------------------------------------------------------------

static df_status init_mpi(const df_dist_options *o, df_dist *d, df_comm **out, df_error *err) {
  df_comm_mpi_options mo = {.timeout_s = o->timeout_s,
                            .expect_rank = d->launch.rank,
                            .expect_world = d->launch.world_size,
                            .vars = d->launch.vars};
  return df_comm_create_mpi(&mo, out, err);
}

static df_status init_cpu(const df_dist_options *o, df_dist *d, df_error *err) {
  if (d->launch.launcher == DF_LAUNCH_TORCHRUN)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, d->launch.vars,
                   "launch CPU ranks with mpirun -np N (or srun --mpi=pmix); torchrun-style variables serve GPU runs, "
                   "whose collectives are NCCL's",
                   "CPU data-parallel runs communicate over MPI, which processes started by torchrun cannot join");
  return init_mpi(o, d, &d->comm, err);
}

static df_status init_gpu(const df_dist_options *o, df_dist *d, df_error *err) {
  const df_launch_info *li = &d->launch;
  df_nccl_id id;
  memset(&id, 0, sizeof id);
  if (env_get(o->getenv, o->getenv_ctx, "NCCL_COMM_ID")) {
    DF_TRY(df_comm_nccl_new_id(&id, err)); // NCCL derives the same id on every rank from NCCL_COMM_ID
  } else {
    if (li->launcher == DF_LAUNCH_OPENMPI && df_comm_backend_available(DF_COMM_MPI))
      DF_TRY(init_mpi(o, d, &d->host, err));
    if (li->rank == 0) DF_TRY(df_comm_nccl_new_id(&id, err));
    DF_TRY(df_dist_share_blob(li, d->host, o->getenv, o->getenv_ctx, o->job_key, o->timeout_s, id.bytes,
                              sizeof id.bytes, err));
  }
  df_comm_nccl_options no = {.rank = li->rank,
                             .world_size = li->world_size,
                             .device = o->cuda_device >= 0 ? o->cuda_device : li->local_rank,
                             .id = &id,
                             .stream = o->cuda_stream,
                             .timeout_s = o->timeout_s};
  return df_comm_create_nccl(&no, &d->comm, err);
}

df_status df_dist_init(const df_dist_options *o, df_dist *d, df_error *err) {
  memset(d, 0, sizeof *d);
  DF_TRY(df_launch_detect(o->getenv, o->getenv_ctx, &d->launch, err));
  DF_TRY(df_launch_apply_recipe(&d->launch, &o->deploy, err));
  const df_launch_info *li = &d->launch;
  if (li->world_size == 1)
    DF_TRY(df_comm_create_single(o->gpu, &d->comm, err));
  else
    DF_TRY(o->gpu ? init_gpu(o, d, err) : init_cpu(o, d, err));
  if (o->log && li->world_size > 1)
    fprintf(o->log, "rank %d of %d (local rank %d, launched by %s), %s communicator, timeout %.0f s\n", li->rank,
            li->world_size, li->local_rank, df_launcher_name(li->launcher),
            df_comm_backend_name(df_comm_backend_of(d->comm)), df_comm_timeout(d->comm));
  return DF_OK;
}

df_status df_dist_finish(df_dist *d, df_error *err) {
  DF_TRY(df_comm_finish(d->comm, err));
  d->comm = NULL;
  DF_TRY(df_comm_finish(d->host, err));
  d->host = NULL;
  return DF_OK;
}

void df_dist_abort(df_dist *d, int exit_code) {
  df_comm_abort(d->comm, exit_code);
  d->comm = NULL;
  df_comm_abort(d->host, exit_code);
  d->host = NULL;
}
