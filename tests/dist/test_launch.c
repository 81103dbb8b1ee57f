// Launcher detection from tables of environment variables (torchrun, mpirun, srun, none; every variable set,
// partial and malformed sets, launchers nested in one another) and the recipe's deployment.trainer checked
// against them; Slurm's compressed lists; the bootstrap port rule.
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/common/fixture.h"
#include "train/dist/dist.h"
#include "train/dist/launch.h"

// A NULL-terminated list of "NAME=value".
static const char *table_get(void *ctx, const char *name) {
  size_t n = strlen(name);
  for (const char *const *p = ctx; *p; p++)
    if (!strncmp(*p, name, n) && (*p)[n] == '=') return *p + n + 1;
  return NULL;
}

static df_launch_info detect_ok(const char *const *env) {
  df_launch_info li;
  df_error err = {0};
  DF_ASSERT_OK(df_launch_detect(table_get, (void *)env, &li, &err), &err);
  return li;
}

// The error's "where" and a piece of its message.
static void detect_fails(const char *const *env, const char *where, const char *msg_part) {
  df_launch_info li;
  df_error err = {0};
  cr_assert_eq(df_launch_detect(table_get, (void *)env, &li, &err), DF_ERR_INVALID, "expected an error (%s)", where);
  cr_expect_str_eq(err.where, where);
  cr_expect(strstr(err.msg, msg_part) != NULL, "message '%s' lacks '%s'", err.msg, msg_part);
}

static const char *const NOTHING[] = {"HOME=/root", NULL};

Test(launch, no_launcher_is_one_process) {
  df_launch_info li = detect_ok(NOTHING);
  cr_expect_eq(li.launcher, DF_LAUNCH_NONE);
  cr_expect(li.rank == 0 && li.world_size == 1 && li.local_rank == 0 && li.local_world_size == 1);
  cr_expect(li.node_rank == 0 && li.nnodes == 1);
  cr_expect_str_eq(li.master_addr, "");
  cr_expect_eq(li.master_port, 0);
}

Test(launch, torchrun_every_variable) {
  static const char *const env[] = {"RANK=13",
                                    "WORLD_SIZE=16",
                                    "LOCAL_RANK=5",
                                    "LOCAL_WORLD_SIZE=8",
                                    "GROUP_RANK=1",
                                    "GROUP_WORLD_SIZE=2",
                                    "MASTER_ADDR=10.0.0.7",
                                    "MASTER_PORT=29512",
                                    NULL};
  df_launch_info li = detect_ok(env);
  cr_expect_eq(li.launcher, DF_LAUNCH_TORCHRUN);
  cr_expect_str_eq(df_launcher_name(li.launcher), "torchrun");
  cr_expect(li.rank == 13 && li.world_size == 16 && li.local_rank == 5 && li.local_world_size == 8);
  cr_expect(li.node_rank == 1 && li.nnodes == 2);
  cr_expect_str_eq(li.master_addr, "10.0.0.7");
  cr_expect(li.master_port == 29512 && li.master_addr_from_env && li.master_port_from_env);
  cr_expect_str_eq(li.vars, "RANK/WORLD_SIZE");
}

// A Kubeflow PyTorchJob sets only RANK, WORLD_SIZE and the master: one process per pod, local rank 0.
Test(launch, torchrun_minimal_set) {
  static const char *const env[] = {"RANK=3", "WORLD_SIZE=4", "MASTER_ADDR=job-master-0", "MASTER_PORT=23456", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect(li.rank == 3 && li.world_size == 4 && li.local_rank == 0 && li.local_world_size == 0);
  cr_expect(li.node_rank == -1 && li.nnodes == 0, "the launcher does not say");
}

Test(launch, openmpi_every_variable) {
  static const char *const env[] = {"OMPI_COMM_WORLD_RANK=6", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE=4", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect_eq(li.launcher, DF_LAUNCH_OPENMPI);
  cr_expect(li.rank == 6 && li.world_size == 8 && li.local_rank == 2 && li.local_world_size == 4);
  cr_expect_str_eq(li.local_world_var, "OMPI_COMM_WORLD_LOCAL_SIZE");
  cr_expect(li.nnodes == 0 && li.node_rank == -1, "mpirun does not export a node index");
}

Test(launch, slurm_every_variable) {
  static const char *const env[] = {"SLURM_JOB_ID=77",
                                    "SLURM_STEP_ID=0",
                                    "SLURM_PROCID=6",
                                    "SLURM_NTASKS=8",
                                    "SLURM_LOCALID=2",
                                    "SLURM_NODEID=1",
                                    "SLURM_STEP_NUM_NODES=2",
                                    "SLURM_STEP_TASKS_PER_NODE=4(x2)",
                                    "SLURM_STEP_NODELIST=gpu[007-008]",
                                    NULL};
  df_launch_info li = detect_ok(env);
  cr_expect_eq(li.launcher, DF_LAUNCH_SLURM);
  cr_expect(li.rank == 6 && li.world_size == 8 && li.local_rank == 2 && li.local_world_size == 4);
  cr_expect(li.node_rank == 1 && li.nnodes == 2);
  cr_expect_str_eq(li.master_addr, "gpu007", "the first node of the step hosts rank 0");
  cr_expect(!li.master_addr_from_env);
}

Test(launch, slurm_job_level_fallbacks_and_master_addr_wins) {
  static const char *const env[] = {"SLURM_STEPID=3",           "SLURM_PROCID=0",   "SLURM_NPROCS=3",
                                    "SLURM_NODEID=0",           "SLURM_NNODES=2",   "SLURM_TASKS_PER_NODE=2,1",
                                    "SLURM_JOB_NODELIST=a1,b2", "MASTER_ADDR=head", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect(li.launcher == DF_LAUNCH_SLURM && li.world_size == 3 && li.local_world_size == 2 && li.nnodes == 2);
  cr_expect_str_eq(li.master_addr, "head");
}

// An sbatch script sees SLURM_PROCID=0 and the job's SLURM_NTASKS but is no task of a step: one process.
Test(launch, sbatch_script_without_step_is_one_process) {
  static const char *const env[] = {"SLURM_JOB_ID=77", "SLURM_PROCID=0", "SLURM_NTASKS=16", "SLURM_NODEID=0", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect(li.launcher == DF_LAUNCH_NONE && li.world_size == 1);
}

// torchrun inside srun: the worker's RANK is its own, SLURM_PROCID the agent's.
Test(launch, torchrun_inside_srun_uses_torchrun) {
  static const char *const env[] = {
      "SLURM_STEP_ID=0", "SLURM_PROCID=1", "SLURM_NTASKS=2", "RANK=12", "WORLD_SIZE=16", "LOCAL_RANK=4", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect(li.launcher == DF_LAUNCH_TORCHRUN && li.rank == 12 && li.world_size == 16);
}

// mpirun inside an allocation: the OMPI variables are the process's, the Slurm ones the batch step's.
Test(launch, mpirun_inside_slurm_uses_openmpi) {
  static const char *const env[] = {"SLURM_STEP_ID=0",        "SLURM_PROCID=0",         "SLURM_NTASKS=4",
                                    "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", NULL};
  df_launch_info li = detect_ok(env);
  cr_expect(li.launcher == DF_LAUNCH_OPENMPI && li.rank == 3);
}

Test(launch, partial_sets_name_the_missing_variable) {
  static const char *const a[] = {"RANK=0", NULL};
  detect_fails(a, "WORLD_SIZE", "RANK is set but WORLD_SIZE is not");
  static const char *const b[] = {"WORLD_SIZE=2", NULL};
  detect_fails(b, "RANK", "WORLD_SIZE is set but RANK is not");
  static const char *const c[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", NULL};
  detect_fails(c, "LOCAL_RANK", "LOCAL_WORLD_SIZE is set but LOCAL_RANK is not");
  static const char *const d[] = {"OMPI_COMM_WORLD_SIZE=2", NULL};
  detect_fails(d, "OMPI_COMM_WORLD_RANK", "is set but OMPI_COMM_WORLD_RANK is not");
  static const char *const e[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=1", NULL};
  detect_fails(e, "SLURM_NTASKS", "SLURM_PROCID is set but SLURM_NTASKS is not");
}

Test(launch, malformed_and_out_of_range_values) {
  static const char *const a[] = {"RANK=one", "WORLD_SIZE=2", NULL};
  detect_fails(a, "RANK", "RANK=one is not a whole number >= 0");
  static const char *const b[] = {"RANK=-1", "WORLD_SIZE=2", NULL};
  detect_fails(b, "RANK", "RANK=-1 is not a whole number >= 0");
  static const char *const c[] = {"RANK=0", "WORLD_SIZE=0", NULL};
  detect_fails(c, "WORLD_SIZE", "WORLD_SIZE=0 is not a whole number >= 1");
  static const char *const d[] = {"RANK=2", "WORLD_SIZE=2", NULL};
  detect_fails(d, "RANK/WORLD_SIZE", "rank 2 is not below the world size 2");
  static const char *const e[] = {"RANK=0", "WORLD_SIZE=8", "LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4", NULL};
  detect_fails(e, "LOCAL_WORLD_SIZE", "local rank 4 is not below LOCAL_WORLD_SIZE=4");
  static const char *const f[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4", NULL};
  detect_fails(f, "LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE=4 is more than the world size 2");
  static const char *const g[] = {"RANK=0", "WORLD_SIZE=2", "GROUP_RANK=2", "GROUP_WORLD_SIZE=2", NULL};
  detect_fails(g, "GROUP_RANK", "node rank 2 (GROUP_RANK) is not below GROUP_WORLD_SIZE=2");
  static const char *const h[] = {"MASTER_PORT=70000", NULL};
  detect_fails(h, "MASTER_PORT", "MASTER_PORT=70000 is not a TCP port");
  static const char *const i[] = {"MASTER_PORT=29500x", NULL};
  detect_fails(i, "MASTER_PORT", "is not a whole number");
  static const char *const j[] = {
      "SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODEID=0", "SLURM_STEP_TASKS_PER_NODE=two", NULL};
  detect_fails(j, "SLURM_STEP_TASKS_PER_NODE", "does not say how many tasks node 0 runs");
}

// ---- the recipe's deployment.trainer -----------------------------------------------------------------------------

static df_deploy_trainer deploy(int64_t nnodes, int64_t nproc) {
  df_deploy_trainer d = {.nnodes = nnodes, .nproc_per_node = nproc, .master_port = 29500};
  d.nnodes_set = nnodes > 0, d.nproc_per_node_set = nproc > 0;
  if (!d.nnodes_set) d.nnodes = 1;
  if (!d.nproc_per_node_set) d.nproc_per_node = 1;
  return d;
}

static void recipe_fails(const char *const *env, const df_deploy_trainer *d, const char *where, const char *part) {
  df_launch_info li = detect_ok(env);
  df_error err = {0};
  cr_assert_eq(df_launch_apply_recipe(&li, d, &err), DF_ERR_INVALID, "expected a disagreement (%s)", part);
  cr_expect_str_eq(err.where, where);
  cr_expect(strstr(err.msg, part) != NULL, "message '%s' lacks '%s'", err.msg, part);
}

static const char *const TORCH_2x4[] = {"RANK=5",
                                        "WORLD_SIZE=8",
                                        "LOCAL_RANK=1",
                                        "LOCAL_WORLD_SIZE=4",
                                        "GROUP_RANK=1",
                                        "GROUP_WORLD_SIZE=2",
                                        "MASTER_ADDR=n0",
                                        "MASTER_PORT=29600",
                                        NULL};

Test(launch, recipe_that_agrees_is_honoured) {
  df_launch_info li = detect_ok(TORCH_2x4);
  df_deploy_trainer d = deploy(2, 4);
  d.master_addr = "n0", d.master_port = 29600, d.master_port_set = true;
  d.node_rank = 1, d.node_rank_set = true;
  df_error err = {0};
  DF_ASSERT_OK(df_launch_apply_recipe(&li, &d, &err), &err);
  cr_expect_str_eq(li.master_addr, "n0");
  cr_expect_eq(li.master_port, 29600);
}

Test(launch, recipe_silent_leaves_the_environment_in_charge) {
  df_launch_info li = detect_ok(TORCH_2x4);
  df_deploy_trainer d = deploy(0, 0); // nothing written: defaults 1 x 1 are not a demand
  df_error err = {0};
  DF_ASSERT_OK(df_launch_apply_recipe(&li, &d, &err), &err);
  cr_expect_eq(li.master_port, 29600, "MASTER_PORT wins over the default");
}

Test(launch, recipe_fills_what_the_environment_lacks) {
  static const char *const env[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", NULL};
  df_launch_info li = detect_ok(env);
  df_deploy_trainer d = deploy(1, 2);
  d.master_addr = "10.1.2.3";
  df_error err = {0};
  DF_ASSERT_OK(df_launch_apply_recipe(&li, &d, &err), &err);
  cr_expect_str_eq(li.master_addr, "10.1.2.3");
  cr_expect_eq(li.master_port, 29500, "the recipe's default port");
}

Test(launch, recipe_disagreements_name_key_and_variable) {
  df_deploy_trainer d = deploy(1, 4);
  recipe_fails(TORCH_2x4, &d, "deployment.trainer",
               "deployment.trainer asks for nnodes 1 x nproc_per_node 4 = 4 processes, but torchrun started 8 "
               "(RANK/WORLD_SIZE)");
  d = deploy(1, 8);
  static const char *const env8[] = {"RANK=0", "WORLD_SIZE=8", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=4", NULL};
  recipe_fails(env8, &d, "deployment.trainer.nproc_per_node",
               "deployment.trainer.nproc_per_node = 8, but LOCAL_WORLD_SIZE=4");
  d = deploy(4, 2);
  recipe_fails(TORCH_2x4, &d, "deployment.trainer.nproc_per_node", "nproc_per_node = 2, but LOCAL_WORLD_SIZE=4");
  static const char *const slurm[] = {"SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_NNODES=4", NULL};
  d = deploy(2, 4);
  recipe_fails(slurm, &d, "deployment.trainer.nnodes", "deployment.trainer.nnodes = 2, but SLURM_NNODES=4");
  d = deploy(2, 4);
  d.node_rank = 0, d.node_rank_set = true;
  recipe_fails(TORCH_2x4, &d, "deployment.trainer.node_rank", "node_rank = 0, but GROUP_RANK=1");
  d = deploy(2, 4);
  d.node_rank = 2, d.node_rank_set = true;
  recipe_fails(TORCH_2x4, &d, "deployment.trainer.node_rank", "node_rank = 2 is not below nnodes = 2");
  d = deploy(2, 4);
  d.master_addr = "n1";
  recipe_fails(TORCH_2x4, &d, "deployment.trainer.master_addr", "master_addr = n1, but MASTER_ADDR=n0");
  d = deploy(2, 4);
  d.master_port = 29500, d.master_port_set = true;
  recipe_fails(TORCH_2x4, &d, "deployment.trainer.master_port", "master_port = 29500, but MASTER_PORT=29600");
}

Test(launch, recipe_asking_for_processes_nobody_started) {
  df_launch_info li = detect_ok(NOTHING);
  df_deploy_trainer d = deploy(0, 2);
  df_error err = {0};
  cr_assert_eq(df_launch_apply_recipe(&li, &d, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "= 2 processes, but nothing started 1") != NULL, "%s", err.msg);
  cr_expect(strstr(err.hint, "mpirun -np 2 draftforge train") != NULL, "%s", err.hint);
}

// ---- Slurm lists and the bootstrap port -------------------------------------------------------------------------

Test(launch, slurm_first_host) {
  char h[64];
  cr_expect(df_slurm_first_host("node1", h, sizeof h) && !strcmp(h, "node1"));
  cr_expect(df_slurm_first_host("gpu[003-004,007],cpu1", h, sizeof h) && !strcmp(h, "gpu003"));
  cr_expect(df_slurm_first_host("a[1,3]", h, sizeof h) && !strcmp(h, "a1"));
  cr_expect(df_slurm_first_host("x1,x2", h, sizeof h) && !strcmp(h, "x1"));
  cr_expect(!df_slurm_first_host("", h, sizeof h));
  cr_expect(!df_slurm_first_host("[1-2]", h, sizeof h));
  cr_expect(!df_slurm_first_host("x[", h, sizeof h));
  cr_expect(!df_slurm_first_host("averyveryverylongname", h, 8), "does not fit");
}

Test(launch, slurm_tasks_per_node) {
  cr_expect_eq(df_slurm_tasks_on_node("8(x2),4", 0), 8);
  cr_expect_eq(df_slurm_tasks_on_node("8(x2),4", 1), 8);
  cr_expect_eq(df_slurm_tasks_on_node("8(x2),4", 2), 4);
  cr_expect_eq(df_slurm_tasks_on_node("8(x2),4", 3), 0);
  cr_expect_eq(df_slurm_tasks_on_node("2,3", 1), 3);
  cr_expect_eq(df_slurm_tasks_on_node("4", 0), 4);
  cr_expect_eq(df_slurm_tasks_on_node("bad", 0), 0);
  cr_expect_eq(df_slurm_tasks_on_node("2(x", 0), 0);
}

Test(launch, bootstrap_port_rule) {
  df_launch_info li = detect_ok(TORCH_2x4);
  df_error err = {0};
  int port = 0;
  static const char *const plain[] = {NULL};
  DF_ASSERT_OK(df_dist_bootstrap_port(&li, table_get, (void *)plain, &port, &err), &err);
  cr_expect_eq(port, 29600);
  static const char *const agent[] = {"TORCHELASTIC_USE_AGENT_STORE=True", NULL};
  DF_ASSERT_OK(df_dist_bootstrap_port(&li, table_get, (void *)agent, &port, &err), &err);
  cr_expect_eq(port, 29601, "torchrun's agent store holds MASTER_PORT");
  static const char *const mine[] = {"TORCHELASTIC_USE_AGENT_STORE=True", "DRAFTFORGE_BOOTSTRAP_PORT=40000", NULL};
  DF_ASSERT_OK(df_dist_bootstrap_port(&li, table_get, (void *)mine, &port, &err), &err);
  cr_expect_eq(port, 40000);
  static const char *const bad[] = {"DRAFTFORGE_BOOTSTRAP_PORT=0", NULL};
  cr_expect_eq(df_dist_bootstrap_port(&li, table_get, (void *)bad, &port, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "DRAFTFORGE_BOOTSTRAP_PORT");
}

// ---- df_dist_init without other processes -------------------------------------------------------------------

Test(launch, dist_init_world_one_is_the_single_communicator) {
  df_dist_options o = {.deploy = deploy(0, 0), .getenv = table_get, .getenv_ctx = (void *)NOTHING};
  df_dist d;
  df_error err = {0};
  DF_ASSERT_OK(df_dist_init(&o, &d, &err), &err);
  cr_expect_eq(df_comm_backend_of(d.comm), DF_COMM_SINGLE);
  cr_expect(df_comm_size(d.comm) == 1 && !df_comm_device_buffers(d.comm));
  cr_expect_null(d.host);
  DF_ASSERT_OK(df_dist_finish(&d, &err), &err);
  o.gpu = true; // one GPU process: the no-op communicator on device buffers
  DF_ASSERT_OK(df_dist_init(&o, &d, &err), &err);
  cr_expect(df_comm_device_buffers(d.comm));
  DF_ASSERT_OK(df_dist_finish(&d, &err), &err);
}

Test(launch, dist_init_cpu_under_torchrun_is_refused) {
  df_dist_options o = {.deploy = deploy(0, 0), .getenv = table_get, .getenv_ctx = (void *)TORCH_2x4};
  df_dist d;
  df_error err = {0};
  cr_assert_eq(df_dist_init(&o, &d, &err), DF_ERR_UNSUPPORTED);
  cr_expect(strstr(err.hint, "mpirun -np N") != NULL, "%s", err.hint);
  df_dist_abort(&d, 1); // nothing was created: a no-op
}

Test(launch, dist_init_reports_recipe_disagreement_before_any_communicator) {
  df_dist_options o = {.deploy = deploy(1, 4), .getenv = table_get, .getenv_ctx = (void *)TORCH_2x4, .gpu = true};
  df_dist d;
  df_error err = {0};
  cr_assert_eq(df_dist_init(&o, &d, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "deployment.trainer");
  cr_expect_null(d.comm);
}

// ---- draftforge train started alone while the recipe asks for more processes ----------------------------------

Test(launch, train_alone_with_a_multi_process_recipe_says_how_to_launch) {
  char out[128], cmd[1024], buf[8192];
  snprintf(out, sizeof out, "/tmp/df_launch_cli_%d", (int)getpid());
  snprintf(cmd, sizeof cmd,
           "env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u SLURM_STEP_ID -u SLURM_STEPID "
           "%s train %s/recipes/demo-dflash-synthetic.yaml --set output_dir=%s --set "
           "deployment.trainer.nproc_per_node=2 2>&1",
           DF_DRAFTFORGE_BIN, DF_SOURCE_DIR, out);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = 0;
  int st = pclose(p);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d:\n%s", st, buf);
  cr_expect(strstr(buf, "deployment.trainer asks for nnodes 1 x nproc_per_node 2 = 2 processes, but nothing "
                        "started 1") != NULL,
            "%s", buf);
  cr_expect(strstr(buf, "HINT: draftforge starts no processes itself: launch 2 of them, e.g. mpirun -np 2") != NULL,
            "%s", buf);
  cr_expect(access(out, F_OK) != 0, "nothing is written");
}

// GPU ranks launched torchrun-style: rank 0 makes NCCL's id and serves it over TCP at MASTER_ADDR:MASTER_PORT;
// rank 1 (a forked process) fetches it; each then creates its NCCL communicator on device = LOCAL_RANK. On a
// machine without a GPU both must get as far as their device's CUDA error (rank 1 only after the exchange).
Test(launch, gpu_ranks_bootstrap_nccl_over_tcp, .timeout = 60) {
  if (!df_comm_backend_available(DF_COMM_NCCL)) cr_skip_test("this build has no NCCL");
  char port[32];
  snprintf(port, sizeof port, "MASTER_PORT=%d", 20000 + (int)(getpid() % 20000));
  const char *env0[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", port, NULL};
  const char *env1[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=127.0.0.1", port, NULL};
  df_dist_options o = {
      .gpu = true, .cuda_device = -1, .timeout_s = 20, .deploy = deploy(0, 0), .job_key = 5, .getenv = table_get};
  pid_t kid = fork();
  cr_assert(kid >= 0);
  if (kid == 0) {
    df_dist d;
    df_error err = {0};
    o.getenv_ctx = (void *)env1;
    df_status st = df_dist_init(&o, &d, &err);
    bool reached = st == DF_ERR_IO && strstr(err.msg, "rank 1: cudaSetDevice failed on device 1");
    if (st == DF_OK)
      df_dist_finish(&d, &err);
    else
      df_dist_abort(&d, 1);
    _exit(st == DF_OK ? 10 : reached ? 0 : 1);
  }
  df_dist d;
  df_error err = {0};
  o.getenv_ctx = (void *)env0;
  df_status st = df_dist_init(&o, &d, &err);
  int status = 0;
  waitpid(kid, &status, 0);
  if (st == DF_OK) {
    df_dist_finish(&d, &err);
    cr_skip_test("a GPU is present: NCCL ran; two ranks on one machine's devices are not checked here");
  }
  df_dist_abort(&d, 1);
  cr_expect_eq(st, DF_ERR_IO, "%s", err.msg);
  cr_expect(strstr(err.msg, "rank 0: cudaSetDevice failed on device 0") != NULL, "%s", err.msg);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank 1 reached its device after the exchange (%d)",
            WEXITSTATUS(status));
}
