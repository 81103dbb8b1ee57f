// The memory plan (train/trainer/mem_plan.h) against the memory a run takes, on the fake device (the CPU kernels,
// device-resident memory): the same recipe trained for real with the accounting on and planned on a measuring context
// give exactly the same device peak, split, peak per category and pinned host memory (tests/common/mem_plan_case.h),
// for every strategy, MoE and an online target. The same check runs on the CUDA backend in
// tests/cuda/test_mem_plan_gpu.c. Then the plan's own behaviour: the fit, ZeRO-1, the command.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"
#include "tests/common/mem_plan_case.h"

#define DFX    DF_FIXTURE_DIR "/dflash_step"
#define SFX    DF_FIXTURE_DIR "/dspark_step"
#define EFX    DF_FIXTURE_DIR "/eagle3_step"
#define TARGET DF_SOURCE_DIR "/recipes/tiny-target"

// The fake device: the CPU kernels (and their workspace) behind device-resident memory, as a GPU's.
static df_ctx_options fake(void) { return (df_ctx_options){.num_threads = 2, .backend = df_fake_backend()}; }

static void offline_case(const char *name, const char *draft, const char *strategy, bool last, bool eval,
                         const char *extra) {
  plan_case d;
  const df_ctx_options o = fake();
  df_mem_plan p = plan_case_offline(&d, name, DFX "/target", draft, strategy, last, eval, extra, &o);
  cr_expect_eq(p.eval, eval);
  cr_expect_eq(p.mem.tag[DF_MEM_TARGET_WEIGHTS].peak, 0, "offline: no target on the device");
  plan_case_close(&d);
}

Test(mem_plan, dflash_plan_equals_the_run_with_eval) {
  offline_case("dflash", DFX "/tiny-dflash.json", "dflash", false, true, "  loss_decay_gamma: 7.0\n");
}

Test(mem_plan, dspark_plan_equals_the_run) {
  offline_case("dspark", SFX "/tiny-dspark.json", "dspark", true, true, NULL);
}

Test(mem_plan, domino_plan_equals_the_run) {
  offline_case("domino", DF_FIXTURE_DIR "/domino_step/domino-shift.json", "domino", false, false,
               "  loss_decay_gamma: 4.0\n");
}

Test(mem_plan, moe_plan_equals_the_run) {
  plan_case d;
  plan_case_open(&d, "moe");
  const int layers[] = {1, 2};
  plan_case_write_shard(&d, PLAN_CASE_MAX_LEN, 64, 2, layers, 256, false);
  plan_case_write_recipe(&d, DFX "/target", DF_SOURCE_DIR "/configs/tiny-dflash-moe.json", "dflash", false, true, NULL);
  const df_ctx_options o = fake();
  df_mem_plan p = plan_case_equals_run(&d, &o, 4, "moe");
  cr_expect_gt(p.mem.tag[DF_MEM_FFN_STATE].peak, 0, "the MoE layers' statistics and stashes");
  plan_case_close(&d);
}

// EAGLE-3: the TTT steps' arena, the compact teacher's workspace, and the vocabulary mapping with the target head's
// rows of the draft vocabulary (frozen). The run derives the mapping from its data; the plan sizes the same buffers.
Test(mem_plan, eagle3_plan_equals_the_run) {
  plan_case d;
  plan_case_open(&d, "eagle3");
  const int layers[] = {1, 3, 4}; // the target's default aux layers (8 layers)
  plan_case_write_shard(&d, PLAN_CASE_MAX_LEN + 9, 64, 3, layers, 256, true);
  plan_case_write_recipe(&d, EFX "/target", EFX "/eagle3.json", "eagle3", false, true, "  ttt_length: 3\n");
  const df_ctx_options o = fake();
  df_mem_plan p = plan_case_equals_run(&d, &o, 3, "eagle3"); // N: the TTT steps
  cr_expect_eq(p.bs, 0);
  cr_expect(p.eval);
  plan_case_close(&d);
}

// Online: the target's weights, KV cache and prefill rows sit on its own context; run and plan add both contexts.
Test(mem_plan, online_plan_equals_the_run) {
  plan_case d;
  plan_case_open(&d, "online");
  plan_case_write_tokens(&d, PLAN_CASE_MAX_LEN + 5);
  plan_case_write_recipe(&d, TARGET, DF_SOURCE_DIR "/configs/tiny-target-dflash.json", "dflash", true, false, NULL);
  const df_ctx_options o = fake();
  df_mem_plan p = plan_case_equals_run(&d, &o, 4, "online");
  cr_expect(p.online);
  cr_expect_gt(p.mem.tag[DF_MEM_TARGET_WEIGHTS].peak, 0);
  cr_expect_gt(p.mem.tag[DF_MEM_KV_CACHE].peak, 0);
  cr_expect_gt(p.mem.tag[DF_MEM_TARGET_ACTIVATIONS].peak, 0);
  plan_case_close(&d);
}

// ---- the plan's own behaviour -------------------------------------------------------------------------------------

// The peak grows with the batch; the fit is the largest batch whose peak fits, and the next one does not.
Test(mem_plan, fit_finds_the_largest_batch) {
  plan_case d;
  plan_case_open(&d, "fit");
  plan_case_write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  df_mem_plan_options o = {.recipe_path = d.recipe, .ctx = fake()};
  df_mem_plan p3, p4;
  df_error err = {0};
  o.batch_size = 3;
  DF_ASSERT_OK(df_mem_plan_run(&o, &p3, &err), &err);
  o.batch_size = 4;
  DF_ASSERT_OK(df_mem_plan_run(&o, &p4, &err), &err);
  cr_assert_gt(p4.mem.device.peak, p3.mem.device.peak);
  cr_expect_eq(p4.mem.tag[DF_MEM_WEIGHTS].peak, p3.mem.tag[DF_MEM_WEIGHTS].peak, "the weights do not grow");
  int64_t best;
  df_mem_plan fit, over;
  o.batch_size = 0;
  DF_ASSERT_OK(df_mem_plan_fit(&o, p4.mem.device.peak - 1, 64, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 3);
  cr_expect_eq(fit.mem.device.peak, p3.mem.device.peak);
  cr_expect_eq(over.batch, 4);
  DF_ASSERT_OK(df_mem_plan_fit(&o, 1000, 64, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 0, "nothing fits 1000 bytes");
  cr_expect_eq(over.batch, 1);
  DF_ASSERT_OK(df_mem_plan_fit(&o, (int64_t)1 << 40, 5, &best, &fit, &over, &err), &err);
  cr_expect_eq(best, 5, "the search stops at max_batch");
  cr_expect_eq(over.batch, 0);
  plan_case_close(&d);
}

// Data parallel: replicated AdamW (NO_SHARD) keeps the whole moments on every rank; ZeRO-1 (SHARD_GRAD_OP, the
// default) keeps rank 0's shard.
Test(mem_plan, zero1_shards_the_moments) {
  plan_case d;
  plan_case_open(&d, "zero");
  plan_case_write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  df_mem_plan_options o = {.recipe_path = d.recipe, .ctx = fake(), .world_size = 4};
  df_mem_plan rep, zero;
  df_error err = {0};
  DF_ASSERT_OK(df_mem_plan_run(&o, &zero, &err), &err);
  const char *sets[] = {"training.fsdp_sharding=NO_SHARD"};
  o.overrides = sets, o.n_overrides = 1;
  DF_ASSERT_OK(df_mem_plan_run(&o, &rep, &err), &err);
  cr_expect(!rep.zero && zero.zero && zero.world == 4 && rep.world == 4);
  const int64_t n = rep.params, shard = n / 4 / 16 * 16; // rank 0's: ⌊n / 4⌋ rounded down to 16 (trainer_dp.c)
  cr_expect_eq(rep.mem.tag[DF_MEM_OPTIMIZER].peak, 2 * 4 * n + n, "fp32 m and v, a one-byte mask");
  cr_expect_eq(zero.mem.tag[DF_MEM_OPTIMIZER].peak, 2 * 4 * shard + n, "rank 0's shard of m and v, the whole mask");
  cr_expect_eq(zero.mem.tag[DF_MEM_WEIGHTS].peak, rep.mem.tag[DF_MEM_WEIGHTS].peak);
  cr_expect_eq(zero.mem.tag[DF_MEM_GRADS].peak, rep.mem.tag[DF_MEM_GRADS].peak, "no padded gradient copy");
  cr_expect_eq(zero.mem.tag[DF_MEM_STAGE].peak - rep.mem.tag[DF_MEM_STAGE].peak, 4 * n,
               "the moments' stage (n floats below 25 MiB)");
  plan_case_close(&d);
}

// The command: a table with every category and the peak; the fit line with --device-memory.
Test(mem_plan, command_prints_the_table_and_the_fit) {
  plan_case d;
  plan_case_open(&d, "cli");
  plan_case_write_recipe(&d, DFX "/target", DFX "/tiny-dflash.json", "dflash", false, false, NULL);
  char cmd[900], out[8192];
  snprintf(cmd, sizeof cmd,
           "cd %s && OMP_NUM_THREADS=1 %s train recipe.yaml --plan --device cpu --device-memory 1MiB 2>&1", d.root,
           DF_DRAFTFORGE_BIN);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  out[fread(out, 1, sizeof out - 1, p)] = 0;
  cr_assert_eq(pclose(p), 0, "%s", out);
  const char *want[] = {"memory plan: cpu backend, micro-batch 2 x 40 tokens",
                        "weights",
                        "activations",
                        "stage",
                        "workspace",
                        "frozen",
                        "device peak",
                        "pinned host",
                        "device memory 1.00 MiB",
                        "largest batch_size that fits:"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_expect(strstr(out, want[i]), "no '%s' in:\n%s", want[i], out);
  plan_case_close(&d);
}
