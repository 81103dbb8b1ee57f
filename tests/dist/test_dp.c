// Data-parallel training under mpirun -np 2 (oversubscribed, as root where needed) on the bundled demos: two
// ranks with batch b against one process with batch 2b (loss curve and final weights), bit-exact resume on two
// ranks, resume across world sizes (2 → 1, 1 → 2), a killed rank ending the job without a partial `latest`, the
// MoE draft, and a Domino draft with an MoE FFN (whose ranks average their per-rank ratio losses, as SpecForge's
// DDP does: two ranks equal one process accumulating the ranks' micro-batches). Skipped (with the reason) in a
// build without MPI.
//
// With DF_DP_DEVICE=cuda every run trains GPU ranks (--device cuda: NCCL, the device-resident exchanges, ZeRO-1 in
// the model's own buffers). CTest runs it that way in the CUDA execution mode (dist.dp_gpu: two emulated devices per
// process, NCCL served by MPI) and on a machine with two GPUs. The GPU runs keep fp32 storage
// (model.torch_dtype: float32), so the equivalences hold to fp32 round-off as on CPU ranks; bf16 storage, the CUDA
// default, has tests of its own at the end (bf16 rounding turns a last-bit difference into 2^-8 now and then).
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "train/dist/comm.h"

#define DFLASH DF_SOURCE_DIR "/recipes/demo-dflash-synthetic.yaml"
#define DSPARK DF_SOURCE_DIR "/recipes/demo-dspark.yaml"
#define MOE    DF_SOURCE_DIR "/recipes/demo-dflash-moe.yaml"

static void need_mpirun(void) {
  if (!df_comm_backend_available(DF_COMM_MPI)) cr_skip_test("this build has no MPI");
  if (access(DF_MPIRUN, X_OK) != 0) cr_skip_test("mpirun not found at configure time (%s)", DF_MPIRUN);
}

static char g_out[65536];

// GPU ranks (DF_DP_DEVICE=cuda), else CPU ranks.
static bool gpu(void) {
  const char *d = getenv("DF_DP_DEVICE");
  return d && !strcmp(d, "cuda");
}
static const char *device_args(void) { return gpu() ? "--device cuda --set model.torch_dtype=float32" : ""; }
static const char *mpirun_env(void) { return gpu() ? "-x DF_EMU_DEVICES" : ""; }

// `draftforge train RECIPE` on np ranks (np 0: no mpirun at all), output in g_out; returns the exit status.
static int train(int np, const char *recipe, const char *out_dir, const char *sets) {
  char cmd[4096], prog[2048];
  snprintf(
      prog, sizeof prog,
      "%s train %s %s --threads 1 --set output_dir=%s --set training.log_interval=1 --set training.eval_interval=0 %s",
      DF_DRAFTFORGE_BIN, recipe, device_args(), out_dir, sets);
  if (np == 0)
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 timeout -k 5 120 %s 2>&1", prog);
  else
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 120 %s --oversubscribe --bind-to none %s --mca btl_vader_single_copy_mechanism none "
             "-x OMP_NUM_THREADS=1 -x ASAN_OPTIONS=detect_leaks=0 %s -np %d %s 2>&1",
             DF_MPIRUN, geteuid() == 0 ? "--allow-run-as-root" : "", mpirun_env(), np, prog);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(g_out, 1, sizeof g_out - 1, p);
  g_out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void train_ok(int np, const char *recipe, const char *out_dir, const char *sets) {
  int st = train(np, recipe, out_dir, sets);
  cr_assert_eq(st, 0, "train on %d rank(s) exited %d:\n%s", np, st, g_out);
}

static void tmpdir(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "/tmp/df_dp_%d_%s", (int)getpid(), name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", buf);
  cr_assert_eq(system(cmd), 0);
}

static void rmdir_all(const char *d) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d);
  (void)!system(cmd);
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  b[n] = 0;
  *len = (size_t)n;
  return b;
}

// The metrics rows (train lines only) of a run.
static json_t *rows(const char *dir) {
  char p[600];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  FILE *f = fopen(p, "r");
  cr_assert_not_null(f, "no %s", p);
  json_t *a = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    cr_assert_not_null(o, "bad line in %s", p);
    if (json_object_get(o, "loss")) json_array_append(a, o);
    json_decref(o);
  }
  free(line);
  fclose(f);
  return a;
}

// Same step count, exact integer metrics, and the loss, grad norm and loss weight within rtol.
static void expect_same_curve(const char *a, const char *b, int64_t steps, double rtol) {
  json_t *ra = rows(a), *rb = rows(b);
  cr_assert_eq(json_array_size(ra), (size_t)steps, "%s: %zu rows", a, json_array_size(ra));
  cr_assert_eq(json_array_size(rb), (size_t)steps, "%s: %zu rows", b, json_array_size(rb));
  for (size_t i = 0; i < (size_t)steps; i++) {
    json_t *x = json_array_get(ra, i), *y = json_array_get(rb, i);
    const char *ints[] = {"step", "epoch", "tokens", "num_blocks"};
    for (int k = 0; k < 4; k++)
      cr_expect_eq(json_integer_value(json_object_get(x, ints[k])), json_integer_value(json_object_get(y, ints[k])),
                   "step %zu: %s differs", i + 1, ints[k]);
    const char *reals[] = {"loss",       "grad_norm", "loss_den",     "acc",
                           "accept_len", "lr",        "moe/aux_loss", "moe/load_max_ratio"};
    for (int k = 0; k < 8; k++) {
      if (!json_object_get(x, reals[k]) && !json_object_get(y, reals[k])) continue; // dense drafts: no moe/*
      double u = json_number_value(json_object_get(x, reals[k])), v = json_number_value(json_object_get(y, reals[k]));
      cr_expect(fabs(u - v) <= rtol * fabs(v) + 1e-12, "step %zu: %s %.17g vs %.17g", i + 1, reals[k], u, v);
    }
  }
  json_decref(ra), json_decref(rb);
}

// model.safetensors of two checkpoints: the same header (names, shapes, F32), values within atol (atol 0: the
// same bytes).
static void expect_same_weights(const char *ck_a, const char *ck_b, double atol) {
  char pa[700], pb[700];
  snprintf(pa, sizeof pa, "%s/model.safetensors", ck_a);
  snprintf(pb, sizeof pb, "%s/model.safetensors", ck_b);
  size_t na, nb;
  char *a = slurp(pa, &na), *b = slurp(pb, &nb);
  cr_assert_eq(na, nb, "%s and %s differ in size", pa, pb);
  uint64_t h;
  memcpy(&h, a, 8);
  cr_assert(h + 8 <= na && !memcmp(a, b, 8 + h), "%s and %s have different headers", pa, pb);
  cr_assert(strstr(a + 8, "\"F32\"") != NULL && strstr(a + 8, "\"BF16\"") == NULL, "not an F32 checkpoint");
  if (atol == 0) {
    cr_expect(!memcmp(a, b, na), "%s and %s differ", pa, pb);
  } else {
    const size_t n = (na - 8 - h) / 4;
    double worst = 0, moved = 0;
    for (size_t i = 0; i < n; i++) {
      float x, y;
      memcpy(&x, a + 8 + h + 4 * i, 4), memcpy(&y, b + 8 + h + 4 * i, 4);
      if (fabs((double)x - y) > worst) worst = fabs((double)x - y);
      moved += x != y;
    }
    cr_expect(worst <= atol, "weights differ by up to %g (> %g)", worst, atol);
    (void)moved;
  }
  free(a), free(b);
}

static void ckpt(char *buf, size_t n, const char *dir, int step) {
  snprintf(buf, n, "%s/checkpoints/step-%08d", dir, step);
}

// ---- two ranks with batch b = one process with batch 2b ------------------------------------------------------

// The gradient sum is taken per rank, then across ranks, instead of in one order: fp32 round-off. Four AdamW
// steps at lr 3e-3 move a weight by up to ~1e-2; the ranks' round-off, amplified by Adam's division by √v for
// tiny gradients, stays below 1e-5 here (measured 7.4e-6 for DFlash); 5e-5 leaves room for other CPUs.
static void dp_equals_one_process(const char *recipe, const char *name) {
  need_mpirun();
  char one[200], two[300];
  tmpdir(one, sizeof one, name);
  snprintf(two, sizeof two, "%s_w2", one);
  rmdir_all(two);
  train_ok(0, recipe, one, "--set training.max_steps=4 --set training.batch_size=8");
  train_ok(2, recipe, two, "--set training.max_steps=4 --set training.batch_size=4");
  cr_expect(strstr(g_out, "rank 1 of 2 (local rank 1, launched by mpirun)") != NULL, "%s", g_out);
  cr_expect(strstr(g_out, gpu() ? "nccl communicator" : "mpi communicator") != NULL, "%s", g_out);
  expect_same_curve(one, two, 4, 1e-6);
  char a[400], b[400];
  ckpt(a, sizeof a, one, 4), ckpt(b, sizeof b, two, 4);
  expect_same_weights(a, b, 5e-5);
  rmdir_all(one), rmdir_all(two);
}

Test(dp, dflash_two_ranks_equal_one_process_of_the_global_batch, .timeout = 300) {
  dp_equals_one_process(DFLASH, "dflash");
}

Test(dp, dspark_two_ranks_equal_one_process_of_the_global_batch, .timeout = 300) {
  dp_equals_one_process(DSPARK, "dspark");
}

// MoE (8 experts, top-2, switch aux loss, sample centering): the aux loss, its gradient and the centering mean
// come from the routing reduced over both ranks; the moe/* metrics are the global batch's too.
Test(dp, moe_two_ranks_equal_one_process_of_the_global_batch, .timeout = 300) { dp_equals_one_process(MOE, "moe"); }

// Domino with an MoE FFN. Its loss is a ratio per micro-step and per rank, averaged over both (SpecForge: loss /
// accumulation_steps, then DDP's mean), so two ranks with batch 1 equal ONE process with batch 1 and two accumulated
// micro-steps (the same samples: rank r holds slot r of each global batch, the single process takes the same two
// samples in order), not a process with batch 2. Equal-length samples (data.max_length 32 truncates every demo sample)
// keep the anchor stream the same either way; the MoE aux loss is off and routing uncentred, because both are taken
// over what one forward sees (the global batch on two ranks, one micro-batch in one process).
static void write_domino_moe(const char *dir, char *recipe, size_t n) {
  char cfg[400];
  snprintf(cfg, sizeof cfg, "%s/draft.json", dir);
  json_t *c = json_load_file(DF_SOURCE_DIR "/configs/demo-domino-moe.json", 0, NULL);
  cr_assert_not_null(c);
  json_t *dc = json_object_get(c, "dflash_config");
  json_object_set_new(dc, "moe_aux_loss_coeff", json_real(0.0));
  json_object_set_new(dc, "moe_router_center", json_string("none"));
  cr_assert_eq(json_dump_file(c, cfg, JSON_INDENT(2)), 0);
  json_decref(c);
  snprintf(recipe, n, "%s/recipe.yaml", dir);
  FILE *fp = fopen(recipe, "w");
  cr_assert_not_null(fp);
  fprintf(fp,
          "model:\n  target_model_path: %s/recipes/demo/target\n  draft_model_config: %s\n"
          "data:\n  hidden_states_path: %s/recipes/demo/train\n  max_length: 32\n"
          "training:\n  strategy: domino\n  num_epochs: 1\n  num_anchors: 4\n  loss_decay_gamma: 7.0\n"
          "  lambda_base_start: 1.0\n  lambda_base_decay_ratio: 0.05\n  learning_rate: 3.0e-3\n  max_grad_norm: 1.0\n"
          "  warmup_ratio: 0.0\n  seed: 3\n",
          DF_SOURCE_DIR, cfg, DF_SOURCE_DIR);
  fclose(fp);
}

Test(dp, domino_moe_two_ranks_equal_one_process_accumulating_their_micro_batches, .timeout = 300) {
  need_mpirun();
  char one[200], two[300], dir[300], recipe[400];
  tmpdir(one, sizeof one, "domino");
  snprintf(two, sizeof two, "%s_w2", one);
  snprintf(dir, sizeof dir, "%s_cfg", one);
  rmdir_all(two), rmdir_all(dir);
  char mk[400];
  snprintf(mk, sizeof mk, "mkdir -p %s", dir);
  cr_assert_eq(system(mk), 0);
  write_domino_moe(dir, recipe, sizeof recipe);
  train_ok(0, recipe, one,
           "--set training.max_steps=6 --set training.batch_size=1 --set training.accumulation_steps=2");
  train_ok(2, recipe, two,
           "--set training.max_steps=6 --set training.batch_size=1 --set training.accumulation_steps=1");
  // The curve (loss_den 2 either way: one per micro-step of each rank); the MoE load statistics describe what one
  // forward routed (the global batch, or one micro-batch), so they are not compared.
  json_t *r = rows(two), *r1 = rows(one);
  cr_assert_eq(json_array_size(r), 6);
  cr_assert_eq(json_array_size(r1), 6);
  for (size_t i = 0; i < json_array_size(r); i++) {
    json_t *o = json_array_get(r, i), *o1 = json_array_get(r1, i);
    const char *keys[] = {"loss", "grad_norm",   "loss_den",   "acc",       "accept_len",
                          "lr",   "lambda_base", "final_loss", "base_loss", "moe/aux_loss"};
    for (int k = 0; k < 10; k++) {
      const double u = json_number_value(json_object_get(o, keys[k])),
                   v = json_number_value(json_object_get(o1, keys[k]));
      cr_expect(fabs(u - v) <= 1e-6 * fabs(v) + 1e-12, "step %zu: %s %.17g vs %.17g", i + 1, keys[k], u, v);
    }
    cr_expect_eq(json_integer_value(json_object_get(o, "tokens")), json_integer_value(json_object_get(o1, "tokens")));
    cr_expect_eq(json_real_value(json_object_get(o, "loss_den")), 2.0, "step %zu", i + 1);
    cr_expect_not_null(json_object_get(o, "lambda_base"), "step %zu", i + 1);
    cr_expect_not_null(json_object_get(o, "moe/load_max_ratio"), "step %zu", i + 1);
  }
  json_decref(r), json_decref(r1);
  char a[400], b[400];
  ckpt(a, sizeof a, one, 6), ckpt(b, sizeof b, two, 6);
  expect_same_weights(a, b, 5e-5);
  rmdir_all(one), rmdir_all(two), rmdir_all(dir);
}

// ZeRO-1 (fsdp_sharding SHARD_GRAD_OP, the default) against replicated AdamW (NO_SHARD) on two ranks: the same
// reduced gradient sums (two ranks: one IEEE addition either way), the same element-wise update; only the
// global norm is summed in another grouping (per shard, then across ranks), so the clip coefficient may differ
// in its last bits (measured: identical weights).
Test(dp, zero1_equals_replicated_adamw, .timeout = 300) {
  need_mpirun();
  char off[200], on[300];
  tmpdir(off, sizeof off, "zero_off");
  snprintf(on, sizeof on, "%s_on", off);
  rmdir_all(on);
  train_ok(2, DFLASH, off,
           "--set training.max_steps=4 --set training.batch_size=4 --set training.fsdp_sharding=NO_SHARD");
  train_ok(2, DFLASH, on,
           "--set training.max_steps=4 --set training.batch_size=4 --set training.fsdp_sharding=SHARD_GRAD_OP");
  expect_same_curve(off, on, 4, 1e-12);
  char a[400], b[400];
  ckpt(a, sizeof a, off, 4), ckpt(b, sizeof b, on, 4);
  expect_same_weights(a, b, 1e-7);
  rmdir_all(off), rmdir_all(on);
}

// The gradient reduction in buckets of training.dp_bucket_mb: tiny buckets (0.01 MiB = 2621 floats: 32 for the 82368
// parameters; on GPU ranks most start during the backward, between the layers) give the same bytes as one bucket,
// since each element is summed over the same ranks either way. Replicated AdamW all-reduces each bucket; ZeRO-1 on GPU
// ranks reduces each bucket's part of every shard to that shard's owner (CPU ranks reduce-scatter at the boundary).
static void buckets_change_nothing(const char *sharding, const char *what) {
  char one[200], many[300];
  tmpdir(one, sizeof one, "bucket1");
  snprintf(many, sizeof many, "%s_many", one);
  rmdir_all(many);
  char fix[300], sets[600], line1[200], line32[200];
  snprintf(fix, sizeof fix, "--set training.max_steps=3 --set training.batch_size=4 --set training.fsdp_sharding=%s",
           sharding);
  snprintf(line1, sizeof line1, "gradient %s: 1 bucket(s) of 25 MiB, 0 started during the backward", what);
  snprintf(line32, sizeof line32, "gradient %s: 32 bucket(s) of 0.01 MiB, ", what);
  snprintf(sets, sizeof sets, "%s --set training.dp_bucket_mb=25", fix);
  train_ok(2, DFLASH, one, sets);
  cr_expect(strstr(g_out, line1) != NULL, "%s: %s", sharding, g_out);
  snprintf(sets, sizeof sets, "%s --set training.dp_bucket_mb=0.01", fix);
  train_ok(2, DFLASH, many, sets);
  const char *line = strstr(g_out, line32);
  cr_assert(line != NULL, "%s: %s", sharding, g_out);
  long early = strtol(line + strlen(line32), NULL, 10);
  printf("%s: %.*s\n", sharding, (int)strcspn(line, "\n"), line);
  if (gpu())
    cr_expect(early > 0 && early < 32, "%s: %ld of 32 buckets started during the backward", sharding, early);
  else
    cr_expect_eq(early, 0, "CPU ranks reduce after the backward"); // MPI calls block: nothing to overlap
  expect_same_curve(one, many, 3, 0);
  char a[400], b[400];
  ckpt(a, sizeof a, one, 3), ckpt(b, sizeof b, many, 3);
  expect_same_weights(a, b, 0);
  rmdir_all(one), rmdir_all(many);
}

Test(dp, gradient_buckets_change_nothing, .timeout = 300) {
  need_mpirun();
  buckets_change_nothing("NO_SHARD", "all-reduce");
}

// ZeRO-1's buckets (GPU ranks: CPU ranks have none) against one bucket; zero1_equals_replicated_adamw ties them to the
// replicated run.
Test(dp, zero1_gradient_buckets_change_nothing, .timeout = 300) {
  need_mpirun();
  if (!gpu()) cr_skip_test("ZeRO-1 reduce-scatters at the boundary on CPU ranks (DF_DP_DEVICE=cuda runs this)");
  buckets_change_nothing("SHARD_GRAD_OP", "reduce to the ZeRO-1 shard owners");
}

// ---- resume ------------------------------------------------------------------------------------------------

// 4 steps straight vs 2 + resume to 4 on two ranks: the same bytes and the same metrics (same reduction order,
// data and anchor stream), with ZeRO-1 (the moments gathered into the checkpoint and scattered on resume) and
// without.
static void resume_bit_exact(const char *sharding) {
  need_mpirun();
  char full[300], part[300];
  tmpdir(full, sizeof full, "full");
  tmpdir(part, sizeof part, "part");
  char fix[300];
  snprintf(fix, sizeof fix, "--set training.total_steps=4 --set training.batch_size=4 --set training.fsdp_sharding=%s",
           sharding);
  char sets[1000];
  snprintf(sets, sizeof sets, "%s --set training.max_steps=4", fix);
  train_ok(2, DFLASH, full, sets);
  snprintf(sets, sizeof sets, "%s --set training.max_steps=2", fix);
  train_ok(2, DFLASH, part, sets);
  snprintf(sets, sizeof sets, "%s --set training.max_steps=4 --resume %s", fix, part);
  train_ok(2, DFLASH, part, sets);
  cr_expect(strstr(g_out, "resuming from") != NULL, "%s", g_out);
  char a[400], b[400];
  ckpt(a, sizeof a, full, 4), ckpt(b, sizeof b, part, 4);
  expect_same_weights(a, b, 0);
  json_t *x = rows(full), *y = rows(part);
  cr_assert_eq(json_array_size(x), 4);
  cr_assert_eq(json_array_size(y), 4);
  for (size_t i = 0; i < 4; i++)
    cr_expect_eq(json_real_value(json_object_get(json_array_get(x, i), "loss")),
                 json_real_value(json_object_get(json_array_get(y, i), "loss")), "step %zu", i + 1);
  json_decref(x), json_decref(y);
  rmdir_all(full), rmdir_all(part);
}

Test(dp, resume_on_two_ranks_is_bit_exact_zero1, .timeout = 300) { resume_bit_exact("SHARD_GRAD_OP"); }
Test(dp, resume_on_two_ranks_is_bit_exact_replicated, .timeout = 300) { resume_bit_exact("NO_SHARD"); }

// A checkpoint of two ranks at batch 4 resumes on one rank at batch 8 (and the reverse): the same global
// batches, anchors and schedule, so the continuation equals the uninterrupted run of the other world size to
// fp32 round-off (the gradient sums are taken in another order).
static void resume_across(int from_np, int to_np, const char *name) {
  need_mpirun();
  char ref[200], run[300];
  tmpdir(ref, sizeof ref, name);
  snprintf(run, sizeof run, "%s_resumed", ref);
  rmdir_all(run);
  const char *bs_from = from_np == 2 ? "--set training.batch_size=4" : "--set training.batch_size=8";
  const char *bs_to = to_np == 2 ? "--set training.batch_size=4" : "--set training.batch_size=8";
  char sets[700];
  snprintf(sets, sizeof sets, "--set training.total_steps=4 --set training.max_steps=4 %s", bs_to);
  train_ok(to_np == 2 ? 2 : 0, DFLASH, ref, sets);
  snprintf(sets, sizeof sets, "--set training.total_steps=4 --set training.max_steps=2 %s", bs_from);
  train_ok(from_np == 2 ? 2 : 0, DFLASH, run, sets);
  snprintf(sets, sizeof sets, "--set training.total_steps=4 --set training.max_steps=4 %s --resume %s", bs_to, run);
  train_ok(to_np == 2 ? 2 : 0, DFLASH, run, sets);
  expect_same_curve(ref, run, 4, 1e-6);
  char a[400], b[400];
  ckpt(a, sizeof a, ref, 4), ckpt(b, sizeof b, run, 4);
  expect_same_weights(a, b, 5e-5);
  rmdir_all(ref), rmdir_all(run);
}

Test(dp, resume_two_ranks_to_one, .timeout = 300) { resume_across(2, 1, "2to1"); }
Test(dp, resume_one_rank_to_two, .timeout = 300) { resume_across(1, 2, "1to2"); }

// The contract compares the global batch: two ranks of 4 cannot resume as two ranks of 8.
Test(dp, resume_refuses_another_global_batch, .timeout = 300) {
  need_mpirun();
  char run[300];
  tmpdir(run, sizeof run, "gb");
  train_ok(2, DFLASH, run, "--set training.total_steps=4 --set training.max_steps=2 --set training.batch_size=4");
  char sets[600];
  snprintf(sets, sizeof sets, "--set training.total_steps=4 --set training.max_steps=4 --resume %s", run);
  cr_expect_neq(train(2, DFLASH, run, sets), 0);
  cr_expect(strstr(g_out, "contract mismatch on the global batch (ranks x training.batch_size): the checkpoint has 8, "
                          "this run has 16") != NULL,
            "%s", g_out);
  rmdir_all(run);
}

// ---- faults ------------------------------------------------------------------------------------------------

// The pid of the process whose environment holds OMPI_COMM_WORLD_RANK=rank and whose command line names dir.
static pid_t find_rank(const char *dir, int rank) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  char want[64];
  snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
  pid_t found = 0;
  while (!found && (e = readdir(d))) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    char p[64], buf[65536];
    snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
    FILE *f = fopen(p, "rb");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *argv0 = buf, *base = strrchr(argv0, '/'); // argv[0] must be draftforge and argv[1] train
    const size_t l0 = strlen(argv0);
    const bool ours = base && !strcmp(base, "/draftforge") && l0 + 6 < n && !strcmp(argv0 + l0 + 1, "train");
    for (size_t i = 0; i < n; i++) buf[i] = buf[i] ? buf[i] : ' ';
    if (!ours || !strstr(buf, dir)) continue;
    snprintf(p, sizeof p, "/proc/%d/environ", pid);
    if (!(f = fopen(p, "rb"))) continue;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++) buf[i] = buf[i] ? buf[i] : '\n';
    buf[n] = 0;
    for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
      if (!strcmp(l, want)) found = pid;
  }
  closedir(d);
  return found;
}

static int count_rows(const char *dir) {
  char p[600];
  snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  int n = 0;
  for (int c; (c = fgetc(f)) != EOF;) n += c == '\n';
  fclose(f);
  return n;
}

// Rank 1 is killed while the job checkpoints every step: mpirun ends the job naming rank 1, well within
// dist_timeout, and `latest` (if any) points at a complete checkpoint.
Test(dp, killed_rank_ends_the_job_without_a_partial_latest, .timeout = 300) {
  need_mpirun();
  char run[300];
  tmpdir(run, sizeof run, "kill");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 120 %s --oversubscribe --bind-to none %s --mca btl_vader_single_copy_mechanism none "
           "-x OMP_NUM_THREADS=1 -x ASAN_OPTIONS=detect_leaks=0 %s -np 2 %s train %s %s --threads 1 "
           "--set output_dir=%s --set training.max_steps=100000 --set training.batch_size=4 "
           "--set training.save_interval=1 --set training.log_interval=1 --set training.eval_interval=0 "
           "--set training.dist_timeout=1 > %s.log 2>&1",
           DF_MPIRUN, geteuid() == 0 ? "--allow-run-as-root" : "", mpirun_env(), DF_DRAFTFORGE_BIN, DFLASH,
           device_args(), run, run);
  pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0); // its own group: a failed check below stops the whole job
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  struct timespec nap = {0, 50 * 1000 * 1000};
  for (int i = 0; i < 1200 && count_rows(run) < 3; i++) nanosleep(&nap, NULL);
  pid_t victim = count_rows(run) >= 3 ? find_rank(run, 1) : 0;
  if (victim <= 0) {
    kill(-child, SIGKILL);
    waitpid(child, NULL, 0);
    cr_assert_fail("the job did not train 3 steps, or rank 1's process was not found");
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  kill(victim, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 124, "mpirun status %d", st);
  cr_expect_lt(took, 60.0, "the job took %.1f s to end (dist_timeout 60 s)", took);
  char logp[400];
  snprintf(logp, sizeof logp, "%s.log", run);
  size_t n;
  char *log = slurp(logp, &n);
  cr_expect(strstr(log, "rank 1") != NULL && strstr(log, "signal 9") != NULL, "%s", log);
  free(log);
  char latest[500], target[600];
  snprintf(latest, sizeof latest, "%s/checkpoints/latest", run);
  ssize_t k = readlink(latest, target, sizeof target - 1);
  if (k > 0) { // a complete checkpoint: its three files are there
    target[k] = 0;
    const char *files[] = {"model.safetensors", "state.h5", "config.json"};
    for (int i = 0; i < 3; i++) {
      char p[1300];
      snprintf(p, sizeof p, "%s/checkpoints/%s/%s", run, target, files[i]);
      cr_expect(access(p, F_OK) == 0, "latest -> %s lacks %s", target, files[i]);
    }
  }
  rmdir_all(run);
  unlink(logp);
}

// EAGLE-3: SpecForge averages each rank's own micro-batch loss (a mean over that batch's B·S positions) across the
// ranks, so the grouping of samples into micro-batches is part of the loss. With one sample per rank, two ranks are
// one process accumulating two one-sample micro-batches (the feed hands rank r the global batch's slot r, the
// single process its r-th micro-batch): the same curve and, up to the order of the gradient sum, the same weights.
// One process accumulating two one-sample micro-batches (paths one) against two ranks of one sample each (two),
// over 4 steps of the recipe text (written to recipe): the same curve within rtol, weights within wtol.
static void two_ranks_equal_accumulating(const char *tag, const char *text, double rtol, double wtol, char *one,
                                         size_t n_one, char *two, size_t n_two, char *recipe, size_t n_recipe) {
  need_mpirun();
  tmpdir(one, n_one, tag);
  snprintf(two, n_two, "%s_w2", one);
  rmdir_all(two);
  snprintf(recipe, n_recipe, "%s.yaml", one);
  FILE *fp = fopen(recipe, "w");
  cr_assert_not_null(fp);
  fputs(text, fp);
  fclose(fp);
  train_ok(0, recipe, one, "--set training.max_steps=4 --set training.accumulation_steps=2");
  train_ok(2, recipe, two, "--set training.max_steps=4");
  expect_same_curve(one, two, 4, rtol);
  char a[400], b[400];
  ckpt(a, sizeof a, one, 4), ckpt(b, sizeof b, two, 4);
  expect_same_weights(a, b, wtol);
}

Test(dp, eagle3_two_ranks_equal_one_process_accumulating, .timeout = 300) {
  char one[200], two[300], recipe[400];
  two_ranks_equal_accumulating(
      "eagle3",
      "model:\n  target_model_path: " DF_FIXTURE_DIR "/eagle3_step/target\n"
      "  draft_model_config: " DF_FIXTURE_DIR "/eagle3_step/eagle3.json\n"
      "data:\n  hidden_states_path: " DF_FIXTURE_DIR "/eagle3_step/data\n  max_length: 64\n"
      "training:\n  strategy: eagle3\n  ttt_length: 3\n  batch_size: 1\n  num_epochs: 4\n  learning_rate: 3e-3\n"
      "  seed: 5\n",
      1e-6, 5e-5, one, sizeof one, two, sizeof two, recipe, sizeof recipe);
  rmdir_all(one), rmdir_all(two);
  remove(recipe);
}

// P-EAGLE: a micro-batch's loss is the mean of its samples' own losses (SpecForge trains one sample per rank), and
// each sample's COD rows come from its own stream (the optimizer step's one draw of the anchor stream plus its
// dataset index): two ranks of one sample each are one process accumulating two one-sample micro-batches, and one
// process with batch 2 (padded to the longer sample), up to the order of the gradient sums. Measured: the first step
// equal, then losses within 1.1e-6 and grad norms within 2.3e-6 relative, weights after 4 steps within 1.6e-4 (AdamW
// turns the round-off of near-zero gradient entries into up to lr-sized steps); tolerances 1e-5 and 3e-4.
Test(dp, peagle_two_ranks_equal_one_process_accumulating, .timeout = 300) {
  char one[200], two[300], recipe[400];
  two_ranks_equal_accumulating(
      "peagle",
      "model:\n  target_model_path: " DF_FIXTURE_DIR "/eagle3_step/target\n"
      "  draft_model_config: " DF_FIXTURE_DIR "/peagle_step/peagle.json\n  mask_token_id: 250\n"
      "data:\n  hidden_states_path: " DF_FIXTURE_DIR "/eagle3_step/data\n  max_length: 64\n"
      "training:\n  strategy: peagle\n  num_depths: 3\n  batch_size: 1\n  num_epochs: 4\n  learning_rate: 3e-3\n"
      "  seed: 5\n",
      1e-5, 3e-4, one, sizeof one, two, sizeof two, recipe, sizeof recipe);
  char three[300], a[400], b[400];
  snprintf(three, sizeof three, "%s_b2", one);
  rmdir_all(three);
  train_ok(0, recipe, three, "--set training.max_steps=4 --set training.batch_size=2");
  expect_same_curve(three, two, 4, 1e-5);
  ckpt(a, sizeof a, three, 4), ckpt(b, sizeof b, two, 4);
  expect_same_weights(a, b, 3e-4);
  rmdir_all(one), rmdir_all(two), rmdir_all(three);
  remove(recipe);
}

// ---- bf16 storage on GPU ranks (DF_DP_DEVICE=cuda only) -------------------------------------------------------

// Mixed precision on two GPU ranks resumes bit for bit, ZeRO-1 included: the checkpoint holds the fp32 masters, and
// the bf16 copy every rank's forward reads is rounded from them again after the resume and after each all-gather.
Test(dp, bf16_resume_on_two_gpu_ranks_is_bit_exact, .timeout = 300) {
  if (!gpu()) cr_skip_test("bf16 storage is the CUDA backend's (DF_DP_DEVICE=cuda)");
  need_mpirun();
  char full[300], part[300];
  tmpdir(full, sizeof full, "bf16_full");
  tmpdir(part, sizeof part, "bf16_part");
  const char *fix = "--set training.total_steps=4 --set training.batch_size=4 --set model.torch_dtype=bfloat16";
  char sets[1000];
  snprintf(sets, sizeof sets, "%s --set training.max_steps=4", fix);
  train_ok(2, DFLASH, full, sets);
  cr_expect(strstr(g_out, "precision bf16") != NULL, "%s", g_out);
  snprintf(sets, sizeof sets, "%s --set training.max_steps=2", fix);
  train_ok(2, DFLASH, part, sets);
  snprintf(sets, sizeof sets, "%s --set training.max_steps=4 --resume %s", fix, part);
  train_ok(2, DFLASH, part, sets);
  char a[400], b[400];
  ckpt(a, sizeof a, full, 4), ckpt(b, sizeof b, part, 4);
  expect_same_weights(a, b, 0);
  json_t *x = rows(full), *y = rows(part);
  for (size_t i = 0; i < 4 && i < json_array_size(x) && i < json_array_size(y); i++)
    cr_expect_eq(json_real_value(json_object_get(json_array_get(x, i), "loss")),
                 json_real_value(json_object_get(json_array_get(y, i), "loss")), "step %zu", i + 1);
  json_decref(x), json_decref(y);
  rmdir_all(full), rmdir_all(part);
}

// Two bf16 ranks with batch 4 against one bf16 process with batch 8: the same training to bf16's reach. The per-rank
// GEMMs see 4 samples' rows instead of 8, so an fp32 accumulation may end a last bit apart and its bf16 rounding then
// moves by 2^-8 relative; measured in the emulator over 4 steps: losses within 4e-5 relative, grad norms within
// 2e-3, weights within 1e-2 (lr 3e-3: about three update sizes). Tolerances 1e-3 (loss), 1e-2 (norm), 2e-2 (weights).
Test(dp, bf16_two_gpu_ranks_follow_one_process, .timeout = 300) {
  if (!gpu()) cr_skip_test("bf16 storage is the CUDA backend's (DF_DP_DEVICE=cuda)");
  need_mpirun();
  char one[200], two[300];
  tmpdir(one, sizeof one, "bf16_dp");
  snprintf(two, sizeof two, "%s_w2", one);
  rmdir_all(two);
  train_ok(0, DFLASH, one, "--set training.max_steps=4 --set training.batch_size=8 --set model.torch_dtype=bfloat16");
  train_ok(2, DFLASH, two, "--set training.max_steps=4 --set training.batch_size=4 --set model.torch_dtype=bfloat16");
  json_t *x = rows(one), *y = rows(two);
  cr_assert_eq(json_array_size(x), 4);
  cr_assert_eq(json_array_size(y), 4);
  for (size_t i = 0; i < 4; i++) {
    json_t *u = json_array_get(x, i), *v = json_array_get(y, i);
    const double lu = json_number_value(json_object_get(u, "loss")), lv = json_number_value(json_object_get(v, "loss"));
    const double gu = json_number_value(json_object_get(u, "grad_norm")),
                 gv = json_number_value(json_object_get(v, "grad_norm"));
    cr_expect(fabs(lu - lv) <= 1e-3 * fabs(lu), "step %zu: loss %.9g vs %.9g", i + 1, lu, lv);
    cr_expect(fabs(gu - gv) <= 1e-2 * fabs(gu), "step %zu: grad_norm %.9g vs %.9g", i + 1, gu, gv);
    cr_expect_eq(json_integer_value(json_object_get(u, "tokens")), json_integer_value(json_object_get(v, "tokens")));
  }
  json_decref(x), json_decref(y);
  char a[400], b[400];
  ckpt(a, sizeof a, one, 4), ckpt(b, sizeof b, two, 4);
  expect_same_weights(a, b, 2e-2);
  rmdir_all(one), rmdir_all(two);
}
