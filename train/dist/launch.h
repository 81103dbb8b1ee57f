// Who this process is in a multi-process job, read from the launcher's environment — torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, ...), OpenMPI's mpirun (OMPI_COMM_WORLD_*), Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, ...) — and checked against the recipe's deployment.trainer (docs/distributed.md "Launching").
#ifndef DF_TRAIN_DIST_LAUNCH_H
#define DF_TRAIN_DIST_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_LAUNCH_NONE = 0, DF_LAUNCH_TORCHRUN, DF_LAUNCH_OPENMPI, DF_LAUNCH_SLURM } df_launcher;

const char *df_launcher_name(df_launcher l); // "none", "torchrun", "mpirun", "srun"

#define DF_LAUNCH_ADDR_MAX 256

typedef struct {
  df_launcher launcher;
  int rank, world_size;
  int local_rank, local_world_size; // local_world_size 0: the launcher does not say
  int node_rank, nnodes;            // -1 / 0: the launcher does not say
  // The bootstrap address (NCCL's id exchange): from MASTER_ADDR / MASTER_PORT, else Slurm's first node, else
  // the recipe (df_launch_apply_recipe). "" / 0: unknown.
  char master_addr[DF_LAUNCH_ADDR_MAX];
  int master_port;
  bool master_addr_from_env, master_port_from_env; // MASTER_ADDR / MASTER_PORT were set
  // The variables each value came from, for messages ("RANK/WORLD_SIZE", "LOCAL_WORLD_SIZE", ...; NULL: none).
  const char *vars, *local_world_var, *nnodes_var, *node_rank_var;
} df_launch_info;

// Reads a variable; NULL when unset. The default is getenv; tests pass tables.
typedef const char *(*df_getenv_fn)(void *ctx, const char *name);

// Detects the launcher (torchrun's variables first, then OpenMPI's, then Slurm's; Slurm's only inside a job
// step, i.e. with SLURM_STEP_ID set, since an sbatch script sees SLURM_PROCID too) and reads its variables.
// None found: rank 0 of 1. A partial set, a non-number or an out-of-range value is an error naming the
// variable. get may be NULL (getenv).
df_status df_launch_detect(df_getenv_fn get, void *ctx, df_launch_info *out, df_error *err);

// The recipe's deployment.trainer, with whether each key was written (in the file or by --set).
typedef struct {
  int64_t nnodes, nproc_per_node, node_rank, master_port;
  const char *master_addr; // NULL: not given
  bool nnodes_set, nproc_per_node_set, node_rank_set, master_port_set;
} df_deploy_trainer;

// Honours and checks the recipe against the environment: when nnodes or nproc_per_node is written, the world
// size must be nnodes × nproc_per_node, and the launcher's node count, processes per node and node rank must
// agree where it tells them; master_addr / master_port fill what the environment lacks and must equal
// MASTER_ADDR / MASTER_PORT when both are given. The error names the recipe key and the variable.
df_status df_launch_apply_recipe(df_launch_info *info, const df_deploy_trainer *d, df_error *err);

// The first host of a Slurm node list: "gpu[003-004,007],cpu1" → "gpu003". False when it does not parse.
bool df_slurm_first_host(const char *nodelist, char *out, size_t n);
// Tasks on node `node` of SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("8(x2),4"): 0 when it does not parse.
int df_slurm_tasks_on_node(const char *tasks_per_node, int node);

#ifdef __cplusplus
}
#endif

#endif
