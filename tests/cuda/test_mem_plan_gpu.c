// The memory plan on the CUDA backend (tests/common/mem_plan_case.h): a DFlash draft with an evaluation, a DSpark
// draft, a DFlash-MoE draft and an EAGLE-3 draft trained for two steps on the device with the accounting on, then
// planned on a measuring context of the same table; the plan equals the run's tracked peak, per category, at the peak
// and pinned host. The CUDA ops' workspace is what differs from the CPU suite (tests/train/test_mem_plan.c): each op
// that takes workspace requests it on its measure path exactly as it does when it runs. Skipped without a CUDA device;
// runs in the CUDA emulator (DF_CUDA=EMU).
#include <string.h>

#include "tests/common/mem_plan_case.h"
#include "tests/cuda/cu_test.h"

#define DFX DF_FIXTURE_DIR "/dflash_step"
#define SFX DF_FIXTURE_DIR "/dspark_step"
#define EFX DF_FIXTURE_DIR "/eagle3_step"

static void cuda_case(const char *name, const char *draft, const char *strategy, bool last, bool eval,
                      const char *extra) {
  plan_case d;
  const df_ctx_options o = {.device = DF_DEV_CUDA, .num_threads = 1};
  df_mem_plan p = plan_case_offline(&d, name, DFX "/target", draft, strategy, last, eval, extra, &o);
  cr_expect_str_eq(p.backend, "cuda");
  cr_expect_eq(p.eval, eval);
  if (strstr(draft, "moe")) cr_expect_gt(p.mem.tag[DF_MEM_FFN_STATE].peak, 0, "the MoE layers' state");
  plan_case_close(&d);
}

Test(cuda_mem_plan, dflash_plan_equals_the_run_with_eval, .timeout = 300) {
  CU_REQUIRE_GPU();
  cuda_case("cuda_dflash", DFX "/tiny-dflash.json", "dflash", false, true, "  loss_decay_gamma: 7.0\n");
}

Test(cuda_mem_plan, dspark_plan_equals_the_run, .timeout = 300) {
  CU_REQUIRE_GPU();
  cuda_case("cuda_dspark", SFX "/tiny-dspark.json", "dspark", true, false, NULL);
}

Test(cuda_mem_plan, moe_plan_equals_the_run, .timeout = 300) {
  CU_REQUIRE_GPU();
  cuda_case("cuda_moe", DF_SOURCE_DIR "/configs/tiny-dflash-moe.json", "dflash", false, false, NULL);
}

// EAGLE-3: the CUDA TTT attention's backward and the compact teacher's lse/argmax take workspace.
Test(cuda_mem_plan, eagle3_plan_equals_the_run, .timeout = 300) {
  CU_REQUIRE_GPU();
  plan_case d;
  plan_case_open(&d, "cuda_eagle3");
  const int layers[] = {1, 3, 4};
  plan_case_write_shard(&d, PLAN_CASE_MAX_LEN + 9, 64, 3, layers, 256, true);
  plan_case_write_recipe(&d, EFX "/target", EFX "/eagle3.json", "eagle3", false, false, "  ttt_length: 3\n");
  const df_ctx_options o = {.device = DF_DEV_CUDA, .num_threads = 1};
  df_mem_plan p = plan_case_equals_run(&d, &o, 3, "cuda_eagle3");
  cr_expect_str_eq(p.backend, "cuda");
  plan_case_close(&d);
}
