// `draftforge capture --target DIR --data FILE.jsonl --draft-config JSON --out DIR [...]` (train/data/capture.h); its
// options are a table (train/cli/cli.h).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/data/capture.h"

static const df_cli_opt CAPTURE_OPTS[] = {
    {"--target", "DIR", DF_CLI_VALUE, "required", "the target: an HF directory (Qwen3, Qwen2 or Llama, dense)"},
    {"--data", "FILE.jsonl", DF_CLI_VALUE, "required",
     "token JSONL (tools/run/prepare_data.py: {\"input_ids\": [...], \"loss_mask\": [...]} a line)"},
    {"--draft-config", "JSON", DF_CLI_VALUE, "required", "the draft config whose target_layer_ids are captured"},
    {"--out", "DIR", DF_CLI_VALUE, "required", "the shard directory"},
    {"--regenerate", NULL, DF_CLI_FLAG, "off",
     "replace each response by the target's greedy continuation of the prompt (as DFlash recommends)"},
    {"--max-new-tokens", "N", DF_CLI_VALUE, "256", "--regenerate: at most N tokens (or up to end-of-sequence)"},
    {"--max-length", "N", DF_CLI_VALUE, "2048", "rows per sample, at most"},
    {"--samples-per-shard", "N", DF_CLI_VALUE, "1000", "shard k holds input lines [k*N, (k+1)*N)"},
    {"--dtype", "bfloat16|float32", DF_CLI_VALUE, "bfloat16", "how the hidden states are stored"},
    {"--last-hidden", "auto|yes|no", DF_CLI_VALUE, "auto: for a DSpark draft",
     "also store the final post-norm state (target_last_hidden_states)"},
    {"--device", "auto|cpu|cuda", DF_CLI_VALUE, "auto",
     "where the target runs (auto: the GPU when the build has CUDA and one is visible)"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads"},
    DF_CLI_END};

static const df_cli_spec CAPTURE_CLI = {
    "capture",
    NULL,
    0,
    0,
    "Runs the target over token JSONL and writes HDF5 shards (docs/data-format.md) with the hidden states of the\n"
    "draft config's dflash_config.target_layer_ids (id L = the output of decoder layer L, transformers'\n"
    "hidden_states[L+1]) and, for a DSpark draft (or --last-hidden yes), the final post-norm state. Rerunning the\n"
    "same command skips the finished shards and redoes a partial one.",
    CAPTURE_OPTS};

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_args(int argc, char **argv, df_capture_options *o, int *threads, bool *verbose) {
  *o = (df_capture_options){.max_new_tokens = 256,
                            .max_length = 2048,
                            .samples_per_shard = 1000,
                            .dtype = DF_BF16,
                            .last_hidden = -1,
                            .log = stderr};
  df_cli_args a;
  int rc = df_cli_parse(&CAPTURE_CLI, argc, argv, &a);
  static const char *const dtypes[] = {"bfloat16", "float32", NULL}, *const lasts[] = {"auto", "yes", "no", NULL};
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order
  long long mnt, ml, sps, th;
  int dt, last, device;
  if (!rc &&
      !(df_cli_int(&a, "--max-new-tokens", 1, 1 << 20, 256, &mnt) &&
        df_cli_int(&a, "--max-length", 2, 1 << 24, 2048, &ml) &&
        df_cli_int(&a, "--samples-per-shard", 1, 1 << 30, 1000, &sps) && df_cli_int(&a, "--threads", 0, 4096, 0, &th) &&
        df_cli_choice(&a, "--dtype", dtypes, 0, &dt) && df_cli_choice(&a, "--last-hidden", lasts, 0, &last) &&
        df_cli_choice(&a, "--device", devices, 0, &device)))
    rc = DF_EXIT_USAGE;
  if (!rc) {
    o->target_dir = df_cli_get(&a, "--target"), o->data_path = df_cli_get(&a, "--data");
    o->draft_config_path = df_cli_get(&a, "--draft-config"), o->out_dir = df_cli_get(&a, "--out");
    o->regenerate = df_cli_has(&a, "--regenerate");
    o->max_new_tokens = mnt, o->max_length = ml, o->samples_per_shard = sps, *threads = (int)th;
    o->dtype = dt == 0 ? DF_BF16 : DF_F32, o->last_hidden = last == 0 ? -1 : last == 1;
    o->device = (df_device_choice)device, o->threads = (int)th;
    *verbose = a.verbose;
  }
  df_cli_free(&a); // the values point into argv
  if (rc) return rc;
  if (!o->target_dir || !o->data_path || !o->draft_config_path || !o->out_dir)
    return df_cli_usage_error(&CAPTURE_CLI, "--target, --data, --draft-config and --out are required");
  return 0;
}

int df_cmd_capture(int argc, char **argv) {
  df_capture_options o;
  int threads = 0;
  bool verbose = false;
  int rc = parse_args(argc, argv, &o, &threads, &verbose);
  if (rc) return rc == 1 ? DF_EXIT_OK : rc;
  if (threads > 0) omp_set_num_threads(threads);
  df_capture_report rep;
  df_error err = {0};
  if (df_capture_run(&o, &rep, &err) != DF_OK) {
    df_error_print_verbose(&err, verbose);
    return DF_EXIT_FAILURE;
  }
  printf("captured %lld samples (%lld tokens, %lld generated) from %lld lines into %lld shards in %s (%lld "
         "shards already done, %lld samples dropped without two adjacent supervised tokens) in %.1f s\n",
         (long long)rep.written, (long long)rep.tokens, (long long)rep.generated_tokens, (long long)rep.lines,
         (long long)rep.shards, o.out_dir, (long long)rep.skipped_shards, (long long)rep.dropped, rep.seconds);
  return 0;
}
