// `draftforge export CHECKPOINT --out DIR [--dtype bfloat16|float32] [--block-size N]`: argument parsing and
// the summary around df_export. Exit code: 0 done, 1 the export failed, 2 bad arguments.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/commands.h"
#include "train/export.h"

static const char *export_usage =
    "usage: draftforge export CHECKPOINT --out DIR [--dtype bfloat16|float32] [--block-size N] [--threads N]\n"
    "\n"
    "Writes DIR/config.json (normalised for SGLang as SpecForge's normalize_dflash_export.py does) and\n"
    "DIR/model.safetensors (exactly the draft's tensors, bfloat16 by default) from CHECKPOINT: a checkpoint\n"
    "directory (config.json + model.safetensors) or a run directory (its latest checkpoint). Every tensor is\n"
    "checked against the draft's parameter table first. DIR appears whole or not at all. --block-size N fails\n"
    "unless the draft's block size is N (the size the server will run). DFlash and DSpark drafts: a DSpark\n"
    "export carries its markov_head.* / confidence_head.* tensors and architectures [\"Qwen3DSparkModel\"] with\n"
    "the head settings (markov_rank, markov_head_type, ...) copied to the top level of config.json.\n";

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
  return 0;
}
