// `draftforge export CHECKPOINT --out DIR`: the command line around df_export — which checkpoint it takes (a
// run's latest, or its best with --best; said in the summary), options, exit codes 0 / 1 / 2.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/export/export.h"
#include "train/run/run_dir.h"

static const df_cli_opt EXPORT_OPTS[] = {
    {"--out", "DIR", DF_CLI_VALUE, "required", "the export directory; it appears whole or not at all"},
    {"--best", NULL, DF_CLI_FLAG, "off: the latest checkpoint",
     "from a run directory, export its best checkpoint (checkpoints/best: the best eval τ)"},
    {"--dtype", "bfloat16|float32", DF_CLI_VALUE, "bfloat16", "the tensors' dtype in model.safetensors"},
    {"--block-size", "N", DF_CLI_VALUE, "the draft's",
     "fail unless the draft's block size is N (what the server runs)"},
    {"--mask-token-id", "N", DF_CLI_VALUE, "the checkpoint's",
     "for a checkpoint whose config.json has no mask id; must agree with one that has one"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads for loading"},
    DF_CLI_END};

static const df_cli_spec EXPORT_CLI = {
    "export",
    "CHECKPOINT",
    1,
    1,
    "Writes DIR/config.json (every key SGLang reads resolved, then normalised as SpecForge's\n"
    "normalize_dflash_export.py does) and DIR/model.safetensors (exactly the draft's tensors, bfloat16 by default;\n"
    "a DSpark confidence head stays float32) from CHECKPOINT: a checkpoint directory (config.json +\n"
    "model.safetensors; a draftforge checkpoint's manifest is verified first) or a run directory (its latest\n"
    "checkpoint, or its best with --best; the summary says which). Every tensor is checked against the draft's\n"
    "parameter table. A DSpark export carries its markov_head.* / confidence_head.* tensors and architectures\n"
    "[\"Qwen3DSparkModel\"] with the head keys at the top level and in dflash_config; MoE drafts name\n"
    "DFlashMoEDraftModel / Qwen3MoeDSparkModel, which stock SGLang does not have (docs/export-and-eval.md).",
    EXPORT_OPTS};

int df_cmd_export(int argc, char **argv) {
  df_cli_args a;
  int rc = df_cli_parse(&EXPORT_CLI, argc, argv, &a);
  if (rc) return df_cli_free(&a), rc == 1 ? DF_EXIT_OK : rc;
  static const char *const dtypes[] = {"bfloat16", "float32", "bf16", "f32", NULL};
  long long bs, threads, mask;
  int dt;
  const char *out = df_cli_get(&a, "--out");
  bool ok = df_cli_choice(&a, "--dtype", dtypes, 0, &dt) && df_cli_int(&a, "--block-size", 2, 1 << 20, 0, &bs) &&
            df_cli_int(&a, "--threads", 0, 4096, 0, &threads) &&
            df_cli_int(&a, "--mask-token-id", -1, 1LL << 40, -1, &mask);
  struct stat sb;
  if (ok && !out) ok = !df_cli_usage_error(&EXPORT_CLI, "--out DIR is required");
  if (ok && stat(a.pos[0], &sb) != 0) ok = !df_cli_usage_error(&EXPORT_CLI, "%s does not exist", a.pos[0]);
  if (!ok) return df_cli_free(&a), DF_EXIT_USAGE;
  df_export_options opt = {
      .dtype = dt % 2 == 0 ? DF_ST_BF16 : DF_ST_F32, .expect_block_size = bs, .threads = (int)threads};
  if (mask >= 0) opt.has_mask_token_id = true, opt.mask_token_id = mask;
  df_ckpt_choice c;
  df_export_info info;
  df_error err = {0};
  df_status st = df_ckpt_choose_model(a.pos[0], df_cli_has(&a, "--best"), &c, &err);
  if (st == DF_OK) st = df_export(c.ckpt, out, &opt, &info, &err);
  if (st != DF_OK) {
    df_error_print_verbose(&err, a.verbose);
    return df_cli_free(&a), DF_EXIT_FAILURE;
  }
  printf("export: %s (%s) -> %s (%d tensors, %lld parameters, %s)\n", c.ckpt, c.note, out, info.num_tensors,
         (long long)info.num_params, opt.dtype == DF_ST_BF16 ? "bfloat16" : "float32");
  if (info.mask_token_id >= 0)
    printf("export: architectures [\"%s\"], mask_token_id %lld\n", info.architecture, (long long)info.mask_token_id);
  else
    printf("export: architectures [\"%s\"]\n", info.architecture);
  if (info.needs_external)
    printf("note: %s is not part of stock SGLang 0.5.23: serve it with SGLANG_EXTERNAL_MODEL_PACKAGE naming a "
           "package that provides it (docs/export-and-eval.md)\n",
           info.architecture);
  if (strstr(info.architecture, "DSpark") && !info.confidence_head)
    printf("note: this DSpark export has no confidence head: SGLang serves it in the default ragged-verify mode "
           "(SGLANG_RAGGED_VERIFY_MODE=static); the cap-accept and compact modes build the head and refuse to load "
           "it\n");
  if (opt.dtype == DF_ST_F32)
    printf("note: config.json says float32, which SGLang's --dtype auto serves as float16: launch with --dtype "
           "bfloat16, or export bfloat16\n");
  df_cli_free(&a);
  return DF_EXIT_OK;
}
