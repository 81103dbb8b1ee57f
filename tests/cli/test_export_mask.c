// `draftforge export` always writes a mask id: a checkpoint whose config.json has none (written before
// checkpoints carried the resolved one) needs --mask-token-id, which must agree with a recorded one.
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char out[1 << 15];

static int run(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", DF_SOURCE_DIR, DF_DRAFTFORGE_BIN, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(export_mask, a_checkpoint_without_mask_id_needs_it_given_and_a_given_one_must_agree) {
  char tmp[] = "/tmp/df_export_mask_XXXXXX", cmd[2048], args[2048], cfgp[1200];
  cr_assert_not_null(mkdtemp(tmp));
  snprintf(cmd, sizeof cmd, "cp -r '%s/tests/fixtures/dflash_step/draft_ckpt' '%s/ckpt'", DF_SOURCE_DIR, tmp);
  cr_assert_eq(system(cmd), 0);
  snprintf(cfgp, sizeof cfgp, "%s/ckpt/config.json", tmp);
  json_t *c = json_load_file(cfgp, 0, NULL);
  cr_assert_not_null(c);
  json_object_del(json_object_get(c, "dflash_config"), "mask_token_id");
  cr_assert_eq(json_dump_file(c, cfgp, JSON_INDENT(2)), 0);
  json_decref(c);

  snprintf(args, sizeof args, "export %s/ckpt --out %s/x", tmp, tmp);
  cr_expect_eq(run(args), 1, "%s", out);
  cr_expect_not_null(strstr(out, "has no mask token id"), "%s", out);
  cr_expect_not_null(strstr(out, "--mask-token-id"), "the hint names the flag: %s", out);
  snprintf(cfgp, sizeof cfgp, "%s/x", tmp);
  cr_expect_neq(access(cfgp, F_OK), 0, "nothing is written");

  snprintf(args, sizeof args, "export %s/ckpt --out %s/x --mask-token-id 255", tmp, tmp);
  cr_assert_eq(run(args), 0, "%s", out);
  snprintf(cfgp, sizeof cfgp, "%s/x/config.json", tmp);
  c = json_load_file(cfgp, 0, NULL);
  cr_assert_not_null(c);
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(c, "dflash_config"), "mask_token_id")), 255);
  json_decref(c);

  snprintf(args, sizeof args, "export tests/fixtures/dflash_step/draft_ckpt --out %s/y --mask-token-id 7", tmp);
  cr_expect_eq(run(args), 1, "%s", out);
  cr_expect_not_null(strstr(out, "--mask-token-id 7 disagrees with the checkpoint's dflash_config.mask_token_id 255"),
                     "%s", out);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  cr_expect_eq(system(cmd), 0);
}
