// `draftforge inspect` on each kind of file it knows, and on one it does not.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

// Runs the built program with args (from the source dir); returns its exit code and stdout+stderr.
static int run_draftforge(const char *args, char *out, size_t n) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", DF_SOURCE_DIR, DF_DRAFTFORGE_BIN, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t len = fread(out, 1, n - 1, p);
  out[len] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char out[1 << 16];

Test(inspect, draft_config) {
  cr_expect_eq(run_draftforge("inspect configs/tiny-dflash.json", out, sizeof out), 0, "%s", out);
  cr_expect_not_null(strstr(out, "block_size"), "%s", out);
  cr_expect_not_null(strstr(out, "[1, 2]"), "target_layer_ids are printed: %s", out);
}

Test(inspect, target_config) {
  cr_expect_eq(run_draftforge("inspect tests/fixtures/configs/qwen3-8b/config.json", out, sizeof out), 0, "%s", out);
  cr_expect_not_null(strstr(out, "4096"), "hidden size is printed: %s", out);
}

Test(inspect, safetensors_and_sharded_dir) {
  cr_expect_eq(run_draftforge("inspect tests/fixtures/safetensors/sharded", out, sizeof out), 0, "%s", out);
  cr_expect_not_null(strstr(out, "lm_head.weight"), "%s", out);
  cr_expect_not_null(strstr(out, "[6, 4]"), "%s", out);
}

Test(inspect, hidden_state_shard) {
  cr_expect_eq(run_draftforge("inspect tests/fixtures/hidden_states/h5py_bf16.h5", out, sizeof out), 0, "%s", out);
  cr_expect_not_null(strstr(out, "samples: 3"), "%s", out);
  cr_expect_not_null(strstr(out, "layer_id_convention: hidden_states[L+1] (id L"), "%s", out);
}

Test(inspect, unknown_kind_and_missing_file_fail_with_a_hint) {
  cr_expect_eq(run_draftforge("inspect README.md", out, sizeof out), 1, "%s", out);
  cr_expect_not_null(strstr(out, "HINT"), "%s", out);
  cr_expect_eq(run_draftforge("inspect no/such/file.safetensors", out, sizeof out), 2,
               "a missing file is a bad argument: %s", out);
  cr_expect_not_null(strstr(out, "no/such/file.safetensors"), "the error names the path: %s", out);
}

Test(cli, version_and_unknown_command) {
  cr_expect_eq(run_draftforge("--version", out, sizeof out), 0, "%s", out);
  cr_expect_not_null(strstr(out, "draftforge "), "%s", out);
  cr_expect_eq(run_draftforge("frobnicate", out, sizeof out), 2, "%s", out);
}
