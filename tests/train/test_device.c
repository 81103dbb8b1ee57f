// The device choice (train/recipe/device.h): training.device / --device spellings, auto's pick, and the drafts that
// must stay on the CPU.
#include <criterion/criterion.h>
#include <stdio.h>

#include "kernels/backend.h"
#include "tests/common/fixture.h"
#include "train/recipe/device.h"

Test(device, choice_parse_and_open) {
  df_device_choice c;
  df_error err = {0};
  DF_ASSERT_OK(df_device_choice_parse("cuda", &c, &err), &err);
  cr_expect_eq(c, DF_DEVICE_CUDA);
  cr_expect_eq(df_device_choice_parse("gpu", &c, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "--device");
  cr_expect(strstr(err.hint, "auto, cpu or cuda"), "%s", err.hint);
  df_ctx *ctx;
  DF_ASSERT_OK(df_device_open(DF_DEVICE_CPU, NULL, 1, NULL, &ctx, &err), &err);
  cr_expect_str_eq(df_ctx_backend_name(ctx), "cpu");
  df_ctx_destroy(ctx);
  // auto picks the CPU while the CUDA table is incomplete (or absent), and cuda without a GPU is an error
  DF_ASSERT_OK(df_device_open(DF_DEVICE_AUTO, NULL, 1, NULL, &ctx, &err), &err);
  const bool cuda_ready = df_cuda_available() && df_backend_complete(df_cuda_backend(), NULL);
  cr_expect_str_eq(df_ctx_backend_name(ctx), cuda_ready ? "cuda" : "cpu");
  df_ctx_destroy(ctx);
  // a draft that must stay on the CPU (DSpark heads, MoE FFN) keeps auto on the CPU whatever the GPU
  DF_ASSERT_OK(df_device_open(DF_DEVICE_AUTO, "a host-only draft", 1, NULL, &ctx, &err), &err);
  cr_expect_str_eq(df_ctx_backend_name(ctx), "cpu");
  df_ctx_destroy(ctx);
  if (df_cuda_available()) return;
  cr_expect_eq(df_device_open(DF_DEVICE_CUDA, NULL, 1, NULL, &ctx, &err), DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(err.where, "device");
}

// Drafts whose heads or FFN still run host loops name the reason, so auto keeps them on the CPU.
Test(device, cpu_only_drafts_are_named) {
  const char *names[3] = {"tiny-dflash.json", "tiny-dspark.json", "tiny-dflash-moe.json"};
  const bool cpu_only[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/configs/%s", DF_SOURCE_DIR, names[i]);
    const df_draft_config *cfg = NULL;
    df_error err = {0};
    DF_ASSERT_OK(df_draft_config_from_file(path, &cfg, &err), &err);
    cr_expect_eq(df_device_cpu_only_reason(cfg) != NULL, cpu_only[i], "%s", names[i]);
    df_draft_config_free(cfg);
  }
}
