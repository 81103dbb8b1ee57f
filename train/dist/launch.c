// Launcher detection (train/dist/launch.h): one reader per launcher, strict integer parsing that names the
// variable, range checks, then the recipe's deployment.trainer checked against what the launcher said.
#include "train/dist/launch.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *df_launcher_name(df_launcher l) {
  switch (l) {
  case DF_LAUNCH_NONE: return "none";
  case DF_LAUNCH_TORCHRUN: return "torchrun";
  case DF_LAUNCH_OPENMPI: return "mpirun";
  case DF_LAUNCH_SLURM: return "srun";
  }
  return "?";
}

typedef struct {
  df_getenv_fn get;
  void *ctx;
  df_error *err;
} env;

static const char *env_get(const env *e, const char *name) {
  const char *v = e->get ? e->get(e->ctx, name) : getenv(name);
  return v && *v ? v : NULL;
}

static bool any_set(const env *e, const char *const *names) {
  for (int i = 0; names[i]; i++)
    if (env_get(e, names[i])) return true;
  return false;
}

// A decimal in [lo, INT_MAX]. *out untouched and false when unset; an error when set but not such a number.
static df_status env_int(const env *e, const char *name, int lo, bool *set, int *out) {
  const char *v = env_get(e, name);
  *set = v != NULL;
  if (!v) return DF_OK;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  bool digits = isdigit((unsigned char)v[0]) || (v[0] == '-' && isdigit((unsigned char)v[1]));
  if (!digits || *end || errno == ERANGE || x < lo || x > INT_MAX)
    return DF_FAIL(e->err, DF_ERR_INVALID, name, "the launcher sets it; unset it if you exported it by hand",
                   "%s=%s is not a whole number >= %d", name, v, lo);
  *out = (int)x;
  return DF_OK;
}

// The first variable of names that is set (a Slurm value can come from a step or a job variable).
static df_status env_int_first(const env *e, const char *const *names, int lo, const char **which, int *out) {
  *which = NULL;
  for (int i = 0; names[i]; i++) {
    bool set;
    DF_TRY(env_int(e, names[i], lo, &set, out));
    if (set) return *which = names[i], DF_OK;
  }
  return DF_OK;
}

static df_status require(const env *e, const char *have, const char *need, const char *launcher) {
  return DF_FAIL(e->err, DF_ERR_INVALID, need, "set both, or neither (a single process needs none)",
                 "%s is set but %s is not (%s launch variables)", have, need, launcher);
}

// MASTER_ADDR / MASTER_PORT, as torchrun exports them (any launcher may carry them).
static df_status read_master(const env *e, df_launch_info *o) {
  const char *addr = env_get(e, "MASTER_ADDR");
  if (addr) {
    if (strlen(addr) >= sizeof o->master_addr)
      return DF_FAIL(e->err, DF_ERR_INVALID, "MASTER_ADDR", NULL, "MASTER_ADDR is longer than %d characters",
                     DF_LAUNCH_ADDR_MAX - 1);
    snprintf(o->master_addr, sizeof o->master_addr, "%s", addr);
    o->master_addr_from_env = true;
  }
  bool set;
  DF_TRY(env_int(e, "MASTER_PORT", 1, &set, &o->master_port));
  if (set && o->master_port > 65535)
    return DF_FAIL(e->err, DF_ERR_INVALID, "MASTER_PORT", NULL, "MASTER_PORT=%d is not a TCP port", o->master_port);
  o->master_port_from_env = set;
  return DF_OK;
}

static df_status read_torchrun(const env *e, df_launch_info *o) {
  bool r, w, lr, lw, g, gw;
  DF_TRY(env_int(e, "RANK", 0, &r, &o->rank));
  DF_TRY(env_int(e, "WORLD_SIZE", 1, &w, &o->world_size));
  if (r != w) return require(e, r ? "RANK" : "WORLD_SIZE", r ? "WORLD_SIZE" : "RANK", "torchrun");
  DF_TRY(env_int(e, "LOCAL_RANK", 0, &lr, &o->local_rank));
  DF_TRY(env_int(e, "LOCAL_WORLD_SIZE", 1, &lw, &o->local_world_size));
  if (lw && !lr) return require(e, "LOCAL_WORLD_SIZE", "LOCAL_RANK", "torchrun");
  DF_TRY(env_int(e, "GROUP_RANK", 0, &g, &o->node_rank));
  DF_TRY(env_int(e, "GROUP_WORLD_SIZE", 1, &gw, &o->nnodes));
  o->vars = "RANK/WORLD_SIZE";
  o->local_world_var = lw ? "LOCAL_WORLD_SIZE" : NULL;
  o->node_rank_var = g ? "GROUP_RANK" : NULL;
  o->nnodes_var = gw ? "GROUP_WORLD_SIZE" : NULL;
  return DF_OK;
}

static df_status read_openmpi(const env *e, df_launch_info *o) {
  bool r, w, lr, lw;
  DF_TRY(env_int(e, "OMPI_COMM_WORLD_RANK", 0, &r, &o->rank));
  DF_TRY(env_int(e, "OMPI_COMM_WORLD_SIZE", 1, &w, &o->world_size));
  if (r != w)
    return require(e, r ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE",
                   r ? "OMPI_COMM_WORLD_SIZE" : "OMPI_COMM_WORLD_RANK", "OpenMPI");
  DF_TRY(env_int(e, "OMPI_COMM_WORLD_LOCAL_RANK", 0, &lr, &o->local_rank));
  DF_TRY(env_int(e, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, &lw, &o->local_world_size));
  o->vars = "OMPI_COMM_WORLD_RANK/SIZE";
  o->local_world_var = lw ? "OMPI_COMM_WORLD_LOCAL_SIZE" : NULL;
  return DF_OK;
}

static df_status read_slurm(const env *e, df_launch_info *o) {
  static const char *const ntasks[] = {"SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS", NULL};
  static const char *const nnodes[] = {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", NULL};
  static const char *const tasks_per_node[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL};
  static const char *const nodelists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", NULL};
  bool r, lr, nid;
  const char *w_var, *nn_var;
  DF_TRY(env_int(e, "SLURM_PROCID", 0, &r, &o->rank));
  DF_TRY(env_int_first(e, ntasks, 1, &w_var, &o->world_size));
  if (!r || !w_var)
    return require(e, r ? "SLURM_PROCID" : "SLURM_NTASKS", r ? "SLURM_NTASKS" : "SLURM_PROCID", "Slurm");
  DF_TRY(env_int(e, "SLURM_LOCALID", 0, &lr, &o->local_rank));
  DF_TRY(env_int(e, "SLURM_NODEID", 0, &nid, &o->node_rank));
  DF_TRY(env_int_first(e, nnodes, 1, &nn_var, &o->nnodes));
  o->vars = "SLURM_PROCID/SLURM_NTASKS";
  o->node_rank_var = nid ? "SLURM_NODEID" : NULL;
  o->nnodes_var = nn_var;
  for (int i = 0; tasks_per_node[i] && nid; i++) {
    const char *v = env_get(e, tasks_per_node[i]);
    int t = v ? df_slurm_tasks_on_node(v, o->node_rank) : 0;
    if (!v) continue;
    if (t <= 0)
      return DF_FAIL(e->err, DF_ERR_INVALID, tasks_per_node[i], NULL, "%s=%s does not say how many tasks node %d runs",
                     tasks_per_node[i], v, o->node_rank);
    o->local_world_size = t, o->local_world_var = tasks_per_node[i];
    break;
  }
  if (!o->master_addr_from_env)
    for (int i = 0; nodelists[i]; i++) {
      const char *v = env_get(e, nodelists[i]);
      if (v && df_slurm_first_host(v, o->master_addr, sizeof o->master_addr)) break;
      o->master_addr[0] = 0;
    }
  return DF_OK;
}

static df_status check_ranges(const env *e, const df_launch_info *o) {
  if (o->rank >= o->world_size)
    return DF_FAIL(e->err, DF_ERR_INVALID, o->vars, NULL, "rank %d is not below the world size %d (%s)", o->rank,
                   o->world_size, o->vars);
  if (o->local_world_size > 0 && o->local_rank >= o->local_world_size)
    return DF_FAIL(e->err, DF_ERR_INVALID, o->local_world_var, NULL, "local rank %d is not below %s=%d", o->local_rank,
                   o->local_world_var, o->local_world_size);
  if (o->local_world_size > o->world_size)
    return DF_FAIL(e->err, DF_ERR_INVALID, o->local_world_var, NULL, "%s=%d is more than the world size %d",
                   o->local_world_var, o->local_world_size, o->world_size);
  if (o->nnodes > 0 && o->node_rank >= o->nnodes)
    return DF_FAIL(e->err, DF_ERR_INVALID, o->node_rank_var, NULL, "node rank %d (%s) is not below %s=%d", o->node_rank,
                   o->node_rank_var, o->nnodes_var, o->nnodes);
  return DF_OK;
}

df_status df_launch_detect(df_getenv_fn get, void *ctx, df_launch_info *out, df_error *err) {
  static const char *const TORCHRUN[] = {"RANK", "WORLD_SIZE", NULL};
  static const char *const OPENMPI[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", NULL};
  static const char *const SLURM_STEP[] = {"SLURM_STEP_ID", "SLURM_STEPID", NULL};
  static const char *const SLURM[] = {"SLURM_PROCID", "SLURM_NTASKS", NULL};
  env e = {get, ctx, err};
  memset(out, 0, sizeof *out);
  out->world_size = 1, out->node_rank = -1;
  DF_TRY(read_master(&e, out));
  if (any_set(&e, TORCHRUN)) {
    out->launcher = DF_LAUNCH_TORCHRUN;
    DF_TRY(read_torchrun(&e, out));
  } else if (any_set(&e, OPENMPI)) {
    out->launcher = DF_LAUNCH_OPENMPI;
    DF_TRY(read_openmpi(&e, out));
  } else if (any_set(&e, SLURM_STEP) && any_set(&e, SLURM)) {
    out->launcher = DF_LAUNCH_SLURM;
    DF_TRY(read_slurm(&e, out));
  } else {
    out->local_world_size = 1, out->node_rank = 0, out->nnodes = 1;
    out->vars = "no launcher";
  }
  return check_ranges(&e, out);
}

// ---- the recipe --------------------------------------------------------------------------------------------

static df_status launch_hint_fail(const df_launch_info *o, const df_deploy_trainer *d, int64_t want, df_error *err) {
  char hint[256];
  if (o->launcher == DF_LAUNCH_NONE)
    snprintf(hint, sizeof hint,
             "draftforge starts no processes itself: launch %lld of them, e.g. mpirun -np %lld draftforge train ... "
             "(docs/distributed.md)",
             (long long)want, (long long)want);
  else
    snprintf(hint, sizeof hint, "make the launcher's process count and deployment.trainer agree");
  return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer", hint,
                 "deployment.trainer asks for nnodes %lld x nproc_per_node %lld = %lld processes, but %s started %d "
                 "(%s)",
                 (long long)d->nnodes, (long long)d->nproc_per_node, (long long)want,
                 o->launcher == DF_LAUNCH_NONE ? "nothing" : df_launcher_name(o->launcher), o->world_size, o->vars);
}

static df_status check_counts(const df_launch_info *o, const df_deploy_trainer *d, df_error *err) {
  if (d->nnodes_set || d->nproc_per_node_set) {
    int64_t want = d->nnodes * d->nproc_per_node;
    if (want != o->world_size) return launch_hint_fail(o, d, want, err);
  }
  if (d->nproc_per_node_set && o->local_world_size > 0 && o->local_world_var &&
      d->nproc_per_node != o->local_world_size)
    return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.nproc_per_node", "make the launcher and the recipe agree",
                   "deployment.trainer.nproc_per_node = %lld, but %s=%d", (long long)d->nproc_per_node,
                   o->local_world_var, o->local_world_size);
  if (d->nnodes_set && o->nnodes > 0 && o->nnodes_var && d->nnodes != o->nnodes)
    return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.nnodes", "make the launcher and the recipe agree",
                   "deployment.trainer.nnodes = %lld, but %s=%d", (long long)d->nnodes, o->nnodes_var, o->nnodes);
  if (d->node_rank_set && d->node_rank >= d->nnodes)
    return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.node_rank", NULL,
                   "deployment.trainer.node_rank = %lld is not below nnodes = %lld", (long long)d->node_rank,
                   (long long)d->nnodes);
  if (d->node_rank_set && o->node_rank >= 0 && o->node_rank_var && d->node_rank != o->node_rank)
    return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.node_rank",
                   "leave node_rank out of a recipe shared by every node (each node's launcher knows its own)",
                   "deployment.trainer.node_rank = %lld, but %s=%d", (long long)d->node_rank, o->node_rank_var,
                   o->node_rank);
  return DF_OK;
}

df_status df_launch_apply_recipe(df_launch_info *o, const df_deploy_trainer *d, df_error *err) {
  DF_TRY(check_counts(o, d, err));
  if (d->master_addr && *d->master_addr) {
    if (o->master_addr_from_env && strcmp(d->master_addr, o->master_addr))
      return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.master_addr",
                     "use one address: drop master_addr from the recipe or unset MASTER_ADDR",
                     "deployment.trainer.master_addr = %s, but MASTER_ADDR=%s", d->master_addr, o->master_addr);
    if (strlen(d->master_addr) >= sizeof o->master_addr)
      return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.master_addr", NULL, "the address is too long");
    snprintf(o->master_addr, sizeof o->master_addr, "%s", d->master_addr); // wins over Slurm's first node
  }
  if (d->master_port_set && o->master_port_from_env && d->master_port != o->master_port)
    return DF_FAIL(err, DF_ERR_INVALID, "deployment.trainer.master_port",
                   "use one port: drop master_port from the recipe or unset MASTER_PORT",
                   "deployment.trainer.master_port = %lld, but MASTER_PORT=%d", (long long)d->master_port,
                   o->master_port);
  if (!o->master_port_from_env && d->master_port > 0) o->master_port = (int)d->master_port;
  return DF_OK;
}

// ---- Slurm's compressed lists --------------------------------------------------------------------------------

bool df_slurm_first_host(const char *list, char *out, size_t n) {
  if (!list || !*list || n == 0) return false;
  size_t i = 0;
  while (list[i] && list[i] != ',' && list[i] != '[') i++; // the prefix
  if (i == 0 || i >= n) return false;
  memcpy(out, list, i);
  out[i] = 0;
  if (list[i] != '[') return true; // a plain host name
  const char *p = list + i + 1;
  size_t d = 0;
  while (isdigit((unsigned char)p[d])) d++; // the first number of the range, zero padding kept
  if (d == 0 || (p[d] != '-' && p[d] != ',' && p[d] != ']') || i + d >= n) return false;
  memcpy(out + i, p, d);
  out[i + d] = 0;
  return true;
}

int df_slurm_tasks_on_node(const char *s, int node) {
  if (!s || node < 0) return 0;
  int seen = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long t = strtol(p, &end, 10);
    if (end == p || t <= 0) return 0;
    long rep = 1;
    if (end[0] == '(' && end[1] == 'x') {
      rep = strtol(end + 2, &end, 10);
      if (rep <= 0 || *end != ')') return 0;
      end++;
    }
    if (node < seen + rep) return (int)t;
    seen += (int)rep;
    if (*end == ',')
      end++;
    else if (*end)
      return 0;
    p = end;
  }
  return 0;
}
