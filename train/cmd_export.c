// `draftforge export CHECKPOINT --out DIR [--dtype bfloat16|float32] [--block-size N]`: argument parsing and
// the summary around df_export. Exit code: 0 done, 1 the export failed, 2 bad arguments.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/commands.h"
#include "train/export.h"

static const char *export_usage =
    "usage: draftforge export CHECKPOINT --out DIR [--dtype bfloat16|float32] [--block-size N]\n"
    "                         [--mask-token-id N] [--threads N]\n"
    "\n"
    "Writes DIR/config.json (every key SGLang reads resolved, then normalised as SpecForge's\n"
    "normalize_dflash_export.py does) and DIR/model.safetensors (exactly the draft's tensors, bfloat16 by\n"
    "default; a DSpark confidence head stays float32) from CHECKPOINT: a checkpoint directory (config.json +\n"
    "model.safetensors) or a run directory (its latest checkpoint). Every tensor is checked against the draft's\n"
    "parameter table first. DIR appears whole or not at all. --block-size N fails unless the draft's block size\n"
    "is N (the size the server will run). --mask-token-id N is needed only for a checkpoint whose config.json\n"
    "has no mask id. DSpark exports name Qwen3DSparkModel with the head keys (markov_rank, markov_head_type,\n"
    "enable_confidence_head, confidence_head_with_markov) at the top level and in dflash_config; MoE drafts name\n"
    "DFlashMoEDraftModel / Qwen3MoeDSparkModel, which stock SGLang does not have (docs/export-and-eval.md).\n";

typedef struct {
  const char *checkpoint, *out;
  df_export_options opt;
} export_args;

static bool parse_count(const char *s, long lo, long hi, long *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_export_args(int argc, char **argv, export_args *a) {
  memset(a, 0, sizeof *a);
  a->opt.dtype = DF_ST_BF16;
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    long v;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(export_usage, stdout), 1;
    if (!strcmp(s, "--out") && i + 1 < argc)
      a->out = argv[++i];
    else if (!strcmp(s, "--dtype") && i + 1 < argc) {
      const char *d = argv[++i];
      if (!strcmp(d, "bfloat16") || !strcmp(d, "bf16"))
        a->opt.dtype = DF_ST_BF16;
      else if (!strcmp(d, "float32") || !strcmp(d, "f32"))
        a->opt.dtype = DF_ST_F32;
      else
        return fprintf(stderr, "draftforge export: --dtype is bfloat16 or float32, got '%s'\n", d), 2;
    } else if (!strcmp(s, "--block-size") && i + 1 < argc) {
      if (!parse_count(argv[++i], 2, 1 << 20, &v))
        return fprintf(stderr, "draftforge export: --block-size wants an integer >= 2, got '%s'\n", argv[i]), 2;
      a->opt.expect_block_size = v;
    } else if (!strcmp(s, "--mask-token-id") && i + 1 < argc) {
      if (!parse_count(argv[++i], 0, 1L << 40, &v))
        return fprintf(stderr, "draftforge export: --mask-token-id wants a token id >= 0, got '%s'\n", argv[i]), 2;
      a->opt.has_mask_token_id = true, a->opt.mask_token_id = v;
    } else if (!strcmp(s, "--threads") && i + 1 < argc) {
      if (!parse_count(argv[++i], 0, 4096, &v))
        return fprintf(stderr, "draftforge export: --threads wants a count, got '%s'\n", argv[i]), 2;
      a->opt.threads = (int)v;
    } else if (s[0] != '-' && !a->checkpoint)
      a->checkpoint = s;
    else
      return fprintf(stderr, "draftforge export: unexpected argument '%s'\n%s", s, export_usage), 2;
  }
  if (!a->checkpoint || !a->out)
    return fprintf(stderr, "draftforge export: CHECKPOINT and --out DIR are required\n%s", export_usage), 2;
  return 0;
}

int df_cmd_export(int argc, char **argv) {
  export_args a;
  int rc = parse_export_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  df_export_info info;
  df_error err = {0};
  if (df_export(a.checkpoint, a.out, &a.opt, &info, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  printf("export: %s -> %s (%d tensors, %lld parameters, %s)\n", info.checkpoint, a.out, info.num_tensors,
         (long long)info.num_params, a.opt.dtype == DF_ST_BF16 ? "bfloat16" : "float32");
  printf("export: architectures [\"%s\"], mask_token_id %lld\n", info.architecture, (long long)info.mask_token_id);
  if (info.needs_external)
    printf("note: %s is not part of stock SGLang 0.5.23: serve it with SGLANG_EXTERNAL_MODEL_PACKAGE naming a "
           "package that provides it (docs/export-and-eval.md)\n",
           info.architecture);
  if (strstr(info.architecture, "DSpark") && !info.confidence_head)
    printf("note: this DSpark export has no confidence head: SGLang serves it in the default ragged-verify mode "
           "(SGLANG_RAGGED_VERIFY_MODE=static); the cap-accept and compact modes build the head and refuse to load "
           "it\n");
  if (a.opt.dtype == DF_ST_F32)
    printf("note: config.json says float32, which SGLang's --dtype auto serves as float16: launch with --dtype "
           "bfloat16, or export bfloat16\n");
  return 0;
}
