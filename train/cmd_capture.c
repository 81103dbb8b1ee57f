// `draftforge capture --target DIR --data FILE.jsonl --draft-config JSON --out DIR [...]` (train/capture.h).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/capture.h"
#include "train/commands.h"

static const char *capture_usage =
    "usage: draftforge capture --target DIR --data FILE.jsonl --draft-config JSON --out DIR\n"
    "                          [--regenerate] [--max-new-tokens N] [--max-length N] [--samples-per-shard N]\n"
    "                          [--dtype bfloat16|float32] [--last-hidden auto|yes|no] [--threads N]\n"
    "\n"
    "Runs the target (an HF directory: Qwen3, Qwen2 or Llama, dense) over token JSONL (tools/prepare_data.py:\n"
    "{\"input_ids\": [...], \"loss_mask\": [...]} a line) and writes HDF5 shards (docs/data-format.md) with the\n"
    "hidden states of the draft config's dflash_config.target_layer_ids (id L = the output of decoder layer L,\n"
    "transformers' hidden_states[L+1]) and, for a DSpark draft (or --last-hidden yes), the final post-norm state.\n"
    "--regenerate replaces each response by the target's greedy continuation of the prompt (the tokens before\n"
    "the first supervised one), up to --max-new-tokens (256) or the end-of-sequence token, as DFlash recommends.\n"
    "Shard k holds input lines [k*N, (k+1)*N) (N = --samples-per-shard, 1000); rerunning the same command skips\n"
    "the finished shards and redoes a partial one. Defaults: --max-length 2048, --dtype bfloat16.\n";

static bool parse_count(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_args(int argc, char **argv, df_capture_options *o, int *threads) {
  *o = (df_capture_options){.max_new_tokens = 256,
                            .max_length = 2048,
                            .samples_per_shard = 1000,
                            .dtype = DF_BF16,
                            .last_hidden = -1,
                            .log = stderr};
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long n;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(capture_usage, stdout), 1;
    if (!strcmp(s, "--regenerate")) {
      o->regenerate = true;
      continue;
    }
    if (!v) return fprintf(stderr, "draftforge capture: '%s' needs a value or is unknown\n%s", s, capture_usage), 2;
    i++;
    if (!strcmp(s, "--target"))
      o->target_dir = v;
    else if (!strcmp(s, "--data"))
      o->data_path = v;
    else if (!strcmp(s, "--draft-config"))
      o->draft_config_path = v;
    else if (!strcmp(s, "--out"))
      o->out_dir = v;
    else if (!strcmp(s, "--max-new-tokens") && parse_count(v, 1, 1 << 20, &n))
      o->max_new_tokens = n;
    else if (!strcmp(s, "--max-length") && parse_count(v, 2, 1 << 24, &n))
      o->max_length = n;
    else if (!strcmp(s, "--samples-per-shard") && parse_count(v, 1, 1 << 30, &n))
      o->samples_per_shard = n;
    else if (!strcmp(s, "--threads") && parse_count(v, 1, 4096, &n))
      *threads = (int)n;
    else if (!strcmp(s, "--dtype") && (!strcmp(v, "bfloat16") || !strcmp(v, "float32")))
      o->dtype = !strcmp(v, "bfloat16") ? DF_BF16 : DF_F32;
    else if (!strcmp(s, "--last-hidden") && (!strcmp(v, "auto") || !strcmp(v, "yes") || !strcmp(v, "no")))
      o->last_hidden = !strcmp(v, "auto") ? -1 : !strcmp(v, "yes");
    else
      return fprintf(stderr, "draftforge capture: bad argument '%s %s'\n%s", s, v, capture_usage), 2;
  }
  if (!o->target_dir || !o->data_path || !o->draft_config_path || !o->out_dir)
    return fprintf(stderr, "draftforge capture: --target, --data, --draft-config and --out are required\n%s",
                   capture_usage),
           2;
  return 0;
}

int df_cmd_capture(int argc, char **argv) {
  df_capture_options o;
  int threads = 0;
  int rc = parse_args(argc, argv, &o, &threads);
  if (rc) return rc == 1 ? 0 : rc;
  if (threads > 0) omp_set_num_threads(threads);
  df_capture_report rep;
  df_error err = {0};
  if (df_capture_run(&o, &rep, &err) != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  printf("captured %lld samples (%lld tokens, %lld generated) from %lld lines into %lld shards in %s (%lld "
         "shards already done, %lld samples dropped without two adjacent supervised tokens) in %.1f s\n",
         (long long)rep.written, (long long)rep.tokens, (long long)rep.generated_tokens, (long long)rep.lines,
         (long long)rep.shards, o.out_dir, (long long)rep.skipped_shards, (long long)rep.dropped, rep.seconds);
  return 0;
}
