// `draftforge eval --spec-decode --target DIR --draft CKPT_OR_EXPORT --data FILE.jsonl [--out FILE]`: real
// greedy speculative decoding (train/eval/spec_decode.h) and, on the sequences the target generated, the simulated
// τ of the offline eval (train/eval/evaluate.h), so both numbers come from the same data.
#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "modeling/target_config.h"
#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/data/capture.h"
#include "train/eval/evaluate.h"
#include "train/eval/spec_decode.h"
#include "train/export/export.h"
#include "train/recipe/device.h"
#include "train/run/run_dir.h"

static const df_cli_opt SPEC_OPTS[] = {
    {"--spec-decode", NULL, DF_CLI_FLAG, "required", "real speculative decoding (this command)"},
    {"--target", "DIR", DF_CLI_VALUE, "required", "the target: an HF directory (Qwen3, Qwen2 or Llama, dense)"},
    {"--draft", "CKPT_OR_EXPORT", DF_CLI_VALUE, "required",
     "a DFlash, DSpark or EAGLE-3 draft: a checkpoint, a run directory (its latest checkpoint) or an export"},
    {"--data", "FILE.jsonl", DF_CLI_VALUE, "required",
     "token JSONL (tools/prepare_data.py); each line's prompt is its tokens before the first supervised one"},
    {"--out", "FILE", DF_CLI_VALUE, "none: printed only", "also write the report as JSON"},
    {"--max-new-tokens", "N", DF_CLI_VALUE, "64", "tokens generated per prompt, at most (or up to end-of-sequence)"},
    {"--max-samples", "N", DF_CLI_VALUE, "every line", "decode the first N prompts"},
    {"--num-anchors", "N", DF_CLI_VALUE, "512", "the simulated eval's blocks per sample, at most"},
    {"--num-steps", "N", DF_CLI_VALUE, "7",
     "chain drafts (EAGLE-3): tokens drafted per round, SGLang's --speculative-num-steps (topk 1)"},
    {"--device", "auto|cpu|cuda", DF_CLI_VALUE, "auto",
     "where the target and the draft run (auto: the GPU when the build has CUDA and one is visible)"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads"},
    DF_CLI_END};

static const df_cli_spec SPEC_CLI = {
    "eval --spec-decode",
    NULL,
    0,
    0,
    "Greedy speculative decoding with the target and a draft: per prompt the target prefills, the draft proposes a\n"
    "block from the target's features, the target verifies it in one forward and the accepted prefix plus its\n"
    "bonus token is committed. Reports tau (tokens committed per verification), the per-position acceptance, and\n"
    "whether the output equals plain greedy decoding (it must: exit 1 otherwise). Also runs the offline eval on\n"
    "the sequences the target generated and reports its simulated tau (tau_simulated).",
    SPEC_OPTS};

typedef struct {
  const char *target, *draft, *data, *out;
  int64_t max_new, max_samples, num_anchors, num_steps;
  int threads;
  df_device_choice device;
  bool verbose;
} spec_args;

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse(int argc, char **argv, spec_args *a) {
  df_cli_args c;
  int rc = df_cli_parse(&SPEC_CLI, argc, argv, &c);
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order
  long long mnt = 0, ms = 0, na = 0, th = 0, ns = 0;
  int device = 0;
  if (!rc && !(df_cli_int(&c, "--max-new-tokens", 1, 1 << 20, 64, &mnt) &&
               df_cli_int(&c, "--max-samples", 0, INT32_MAX, 0, &ms) &&
               df_cli_int(&c, "--num-anchors", 1, 1 << 20, 512, &na) && df_cli_int(&c, "--threads", 0, 4096, 0, &th) &&
               df_cli_int(&c, "--num-steps", 1, 64, 7, &ns) && df_cli_choice(&c, "--device", devices, 0, &device)))
    rc = DF_EXIT_USAGE;
  *a = (spec_args){.target = df_cli_get(&c, "--target"),
                   .draft = df_cli_get(&c, "--draft"),
                   .data = df_cli_get(&c, "--data"),
                   .out = df_cli_get(&c, "--out"),
                   .max_new = mnt,
                   .max_samples = ms,
                   .num_anchors = na,
                   .num_steps = ns,
                   .threads = (int)th,
                   .device = (df_device_choice)device,
                   .verbose = c.verbose};
  df_cli_free(&c); // the values point into argv
  if (rc) return rc;
  if (!a->target || !a->draft || !a->data)
    return df_cli_usage_error(&SPEC_CLI, "--target, --draft and --data are required");
  const char *const paths[] = {a->target, a->draft, a->data};
  for (int i = 0; i < 3; i++)
    if (access(paths[i], F_OK) != 0) return df_cli_usage_error(&SPEC_CLI, "%s does not exist", paths[i]);
  return 0;
}

typedef struct {
  df_ctx *ctx;
  df_target *target;
  const df_target_config *tcfg;
  const df_draft_config *cfg;
  df_draft_model *model;
  char dir[PATH_MAX], cfg_path[PATH_MAX + 16], tmp[64];
  int32_t eos[DF_TARGET_MAX_EOS];
  int n_eos;
} spec_run;

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[PATH_MAX + 300];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (unlink(p) != 0) remove_tree(p);
  }
  closedir(d);
  rmdir(dir);
}

static void run_free(spec_run *r) {
  if (r->tmp[0]) remove_tree(r->tmp);
  df_draft_model_free(r->model);
  df_draft_config_free(r->cfg);
  df_target_config_free(r->tcfg);
  df_target_free(r->target);
  df_ctx_destroy(r->ctx);
}

static df_status load(const spec_args *a, spec_run *r, df_error *err) {
  DF_TRY(df_device_open(a->device, NULL, a->threads, stderr, &r->ctx, err));
  DF_TRY(df_target_config_from_dir(a->target, &r->tcfg, err));
  DF_TRY(df_target_load(a->target, r->ctx, &r->target, err));
  DF_TRY(df_target_eos_ids(a->target, r->eos, &r->n_eos, err));
  DF_TRY(df_checkpoint_dir_resolve(a->draft, r->dir, sizeof r->dir, err));
  snprintf(r->cfg_path, sizeof r->cfg_path, "%s/config.json", r->dir);
  DF_TRY(df_draft_config_from_file(r->cfg_path, &r->cfg, err));
  const df_draft_config *resolved = NULL; // an EAGLE-3 export carries its capture layers; else the default
  DF_TRY(df_draft_config_resolve_capture(r->cfg, r->tcfg->num_hidden_layers, NULL, 0, &resolved, err));
  if (resolved) df_draft_config_free(r->cfg), r->cfg = resolved;
  DF_TRY(df_draft_config_check_target(r->cfg, r->tcfg, err));
  DF_TRY(df_capture_check_layer_ids(r->cfg->dflash.target_layer_ids, r->cfg->dflash.num_target_layer_ids,
                                    r->tcfg->num_hidden_layers, err));
  const df_strategy *s = df_strategy_of(r->cfg);
  if ((!s || s->blocks) && r->cfg->dflash.mask_token_id < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.mask_token_id", "set the MASK token id in the draft config",
                   "%s has no mask_token_id", r->cfg_path);
  DF_TRY(df_draft_model_create(r->cfg, r->ctx, &r->model, err));
  return df_draft_model_load(r->model, r->dir, err);
}

// The offline eval on the target's own greedy sequences: captured to a temporary directory, then df_evaluate.
static df_status simulated(const spec_args *a, spec_run *r, const char *seqs, df_eval_report *ev, df_error *err) {
  char shards[PATH_MAX];
  snprintf(shards, sizeof shards, "%s/shards", r->tmp);
  df_capture_options co = {.target_dir = a->target,
                           .data_path = seqs,
                           .draft_config_path = r->cfg_path,
                           .out_dir = shards,
                           .max_length = 1 << 20,
                           .samples_per_shard = 1 << 20,
                           .dtype = DF_F32,
                           .last_hidden = -1,
                           .device = df_ctx_device(r->ctx) == DF_DEV_CPU ? DF_DEVICE_CPU : DF_DEVICE_CUDA,
                           .threads = a->threads};
  df_capture_report cr;
  DF_TRY(df_capture_run(&co, &cr, err));
  df_tensor emb = df_target_embed(r->target), head = df_target_lm_head(r->target);
  df_frozen fz = {.embed = emb.data, .lm_head = head.data, .vocab = emb.shape[0], .hidden = emb.shape[1]};
  // SpecForge's defaults for the strategy's own keys (no recipe here)
  df_eval_options eo = {.batch_size = 1,
                        .set = {.num_anchors = a->num_anchors, .mask_token_id = r->cfg->dflash.mask_token_id}};
  return df_evaluate(r->ctx, r->model, r->cfg, &fz, shards, &eo, ev, err);
}

static json_t *report_json(const spec_args *a, const spec_run *r, const df_spec_report *s, const df_eval_report *ev) {
  json_t *pos = json_array(), *reached = json_array();
  for (int64_t k = 0; k < s->proposals; k++) {
    json_array_append_new(pos, json_real(s->reached[k] ? (double)s->accepted[k] / (double)s->reached[k] : 0.0));
    json_array_append_new(reached, json_integer(s->reached[k]));
  }
  json_t *o =
      json_pack("{s:f, s:f, s:o, s:o, s:I, s:I, s:I, s:I, s:b, s:I, s:I, s:I}", "tau", s->tau, "tau_simulated",
                ev->accept_len, "per_position_acceptance", pos, "per_position_reached", reached, "generated_tokens",
                (json_int_t)s->generated_tokens, "target_forwards", (json_int_t)s->target_forwards, "verifications",
                (json_int_t)s->verifications, "prompts", (json_int_t)s->prompts, "identical_to_greedy",
                s->identical_to_greedy, "mismatched_prompts", (json_int_t)s->mismatched_prompts, "block_size",
                (json_int_t)r->cfg->block_size, "proposals_per_block", (json_int_t)s->proposals);
  json_object_set_new(o, "strategy", json_string(ev->strategy));
  json_object_set_new(o, "draft", json_string(r->dir));
  json_object_set_new(o, "target", json_string(a->target));
  json_object_set_new(o, "data", json_string(a->data));
  json_object_set_new(o, "max_new_tokens", json_integer(a->max_new));
  json_object_set_new(o, "spec_seconds", json_real(s->spec_seconds));
  json_object_set_new(o, "greedy_seconds", json_real(s->greedy_seconds));
  json_object_set_new(o, "simulated",
                      json_pack("{s:f, s:f, s:I, s:I}", "loss", ev->loss, "acc", ev->acc, "num_blocks",
                                (json_int_t)ev->num_blocks, "num_samples", (json_int_t)ev->num_samples));
  if (s->first_mismatch_prompt >= 0)
    json_object_set_new(o, "first_mismatch",
                        json_pack("{s:I, s:I}", "prompt", (json_int_t)s->first_mismatch_prompt, "position",
                                  (json_int_t)s->first_mismatch_pos));
  return o;
}

static void print_report(const df_spec_report *s, const df_eval_report *ev) {
  printf("speculative decoding: %lld prompts, %lld tokens generated, %lld target forwards (%lld verifications)\n",
         (long long)s->prompts, (long long)s->generated_tokens, (long long)s->target_forwards,
         (long long)s->verifications);
  printf("tau (real, tokens committed per verification): %.3f\n", s->tau);
  printf("tau_simulated (offline eval on the same sequences): %.3f\n", ev->accept_len);
  printf("per-position acceptance:");
  for (int64_t k = 0; k < s->proposals; k++)
    printf(" %.3f", s->reached[k] ? (double)s->accepted[k] / (double)s->reached[k] : 0.0);
  printf("\noutput identical to greedy decoding: %s", s->identical_to_greedy ? "yes" : "NO");
  if (!s->identical_to_greedy)
    printf(" (%lld prompts differ; first: prompt %lld at token %lld)", (long long)s->mismatched_prompts,
           (long long)s->first_mismatch_prompt, (long long)s->first_mismatch_pos);
  printf("\ntime: speculative %.2f s, greedy %.2f s\n", s->spec_seconds, s->greedy_seconds);
}

static df_status run(const spec_args *a, spec_run *r, df_spec_report *s, df_eval_report *ev, df_error *err) {
  DF_TRY(load(a, r, err));
  snprintf(r->tmp, sizeof r->tmp, "/tmp/draftforge-spec-XXXXXX");
  if (!mkdtemp(r->tmp)) {
    r->tmp[0] = 0;
    return DF_FAIL(err, DF_ERR_IO, "/tmp", "check /tmp is writable", "cannot create a temporary directory");
  }
  char seqs[PATH_MAX];
  snprintf(seqs, sizeof seqs, "%s/sequences.jsonl", r->tmp);
  df_spec_options o = {.max_new_tokens = a->max_new,
                       .max_samples = a->max_samples,
                       .mask_token_id = r->cfg->dflash.mask_token_id,
                       .num_steps = a->num_steps,
                       .eos = r->eos,
                       .n_eos = r->n_eos,
                       .sequences_out = seqs,
                       .log = stderr};
  DF_TRY(df_spec_decode_run(r->target, r->model, r->cfg, a->data, &o, s, err));
  if (s->prompts == 0)
    return DF_FAIL(err, DF_ERR_INVALID, a->data, "each line needs a prompt and a supervised response",
                   "no prompt to decode");
  return simulated(a, r, seqs, ev, err);
}

int df_cmd_eval_spec(int argc, char **argv) {
  spec_args a;
  int rc = parse(argc, argv, &a);
  if (rc) return rc == 1 ? DF_EXIT_OK : rc;
  if (a.threads > 0) omp_set_num_threads(a.threads);
  spec_run r = {0};
  df_spec_report s = {0};
  df_eval_report ev = {0};
  df_error err = {0};
  df_status st = run(&a, &r, &s, &ev, &err);
  if (st == DF_OK) {
    print_report(&s, &ev);
    if (a.out) {
      json_t *o = report_json(&a, &r, &s, &ev);
      st = df_write_json_atomic(a.out, o, JSON_INDENT(1), "pass a writable --out path", &err);
      json_decref(o);
      if (st == DF_OK) printf("wrote %s\n", a.out);
    }
  }
  if (st == DF_OK && !s.identical_to_greedy)
    st = DF_FAIL(&err, DF_ERR_NUMERIC, a.data,
                 "the batched verification and the one-token decode of the target disagree on an argmax (a near-tie "
                 "in its logits, or a bug): rerun with --threads 1, and report it with the prompt named above",
                 "speculative decoding changed the output: %lld of %lld prompts differ from greedy decoding (first: "
                 "prompt %lld at token %lld)",
                 (long long)s.mismatched_prompts, (long long)s.prompts, (long long)s.first_mismatch_prompt,
                 (long long)s.first_mismatch_pos);
  if (st != DF_OK) fflush(stdout), df_error_print_verbose(&err, a.verbose);
  df_eval_report_free(&ev);
  df_spec_report_free(&s);
  run_free(&r);
  return st == DF_OK ? DF_EXIT_OK : DF_EXIT_FAILURE;
}
