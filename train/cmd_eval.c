// `draftforge eval CHECKPOINT_OR_EXPORT --recipe R [--data FILE] [--out FILE]`: loads a checkpoint or export
// directory strictly, the recipe's target pieces and settings, runs df_evaluate and writes the JSON report.
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/commands.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/export.h"
#include "train/recipe.h"
#include "train/trainer_resources.h"

static const char *eval_usage =
    "usage: draftforge eval CHECKPOINT_OR_EXPORT --recipe RECIPE.yaml [--data FILE] [--out FILE]\n"
    "                       [--max-samples N] [--threads N] [--device auto|cpu|cuda]\n"
    "\n"
    "Evaluates a DFlash or DSpark draft (a checkpoint or export directory, or a run directory: its latest\n"
    "checkpoint) on held-out hidden states: forward only, every sample in file order, anchors from\n"
    "training.seed. Prints and writes (default CHECKPOINT/eval.json) loss, acc, per-position accuracy and the\n"
    "simulated acceptance length τ; for a DSpark draft the loss is the α-weighted DSpark objective and the\n"
    "report adds ce_loss, l1_loss, confidence_loss and tau_probabilistic. The recipe (its training.strategy\n"
    "must match the draft) gives the target, batch size, max_length, num_anchors, loss_decay_gamma, the DSpark\n"
    "alphas and the data: --data, else data.eval_hidden_states_path, else data.hidden_states_path (not held\n"
    "out). --device: where it runs (default: the recipe's training.device).\n"
    "\n"
    "draftforge eval --spec-decode --target DIR --draft CKPT --data FILE.jsonl: real speculative decoding\n"
    "(see draftforge eval --spec-decode --help).\n";

typedef struct {
  const char *checkpoint, *recipe, *data, *out;
  int64_t max_samples;
  int threads;
  bool has_device;
  df_device_choice device;
} eval_args;

static bool parse_count(const char *s, long long hi, long long *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < 0 || v > hi) return false;
  *out = v;
  return true;
}

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_eval_args(int argc, char **argv, eval_args *a) {
  memset(a, 0, sizeof *a);
  for (int i = 0; i < argc; i++) {
    const char *s = argv[i];
    long long v;
    if (!strcmp(s, "-h") || !strcmp(s, "--help")) return fputs(eval_usage, stdout), 1;
    if (!strcmp(s, "--recipe") && i + 1 < argc)
      a->recipe = argv[++i];
    else if (!strcmp(s, "--data") && i + 1 < argc)
      a->data = argv[++i];
    else if (!strcmp(s, "--out") && i + 1 < argc)
      a->out = argv[++i];
    else if (!strcmp(s, "--device") && i + 1 < argc) {
      df_error e = {0};
      if (df_device_choice_parse(argv[++i], &a->device, &e) != DF_OK)
        return fprintf(stderr, "draftforge eval: %s\n  HINT: %s\n", e.msg, e.hint), 2;
      a->has_device = true;
    } else if (!strcmp(s, "--max-samples") && i + 1 < argc) {
      if (!parse_count(argv[++i], INT64_MAX, &v))
        return fprintf(stderr, "draftforge eval: --max-samples wants a count, got '%s'\n", argv[i]), 2;
      a->max_samples = v;
    } else if (!strcmp(s, "--threads") && i + 1 < argc) {
      if (!parse_count(argv[++i], 4096, &v))
        return fprintf(stderr, "draftforge eval: --threads wants a count, got '%s'\n", argv[i]), 2;
      a->threads = (int)v;
    } else if (s[0] != '-' && !a->checkpoint)
      a->checkpoint = s;
    else
      return fprintf(stderr, "draftforge eval: unexpected argument '%s'\n%s", s, eval_usage), 2;
  }
  if (!a->checkpoint || !a->recipe)
    return fprintf(stderr, "draftforge eval: CHECKPOINT and --recipe RECIPE.yaml are required\n%s", eval_usage), 2;
  return 0;
}

// Everything the command owns, released by eval_free.
typedef struct {
  const df_recipe *recipe;
  df_run_resources res; // target and draft configs (the draft's from the checkpoint), frozen pieces, mask token
  df_ctx *ctx;
  df_dflash_model *model;
  char dir[PATH_MAX];
} eval_run;

static void eval_free(eval_run *r) {
  df_dflash_model_free(r->model);
  df_run_resources_free(&r->res); // before the context: the frozen pieces may live on its device
  df_ctx_destroy(r->ctx);
  df_recipe_free(r->recipe);
}

// The recipe's target pieces and mask token (train/trainer_resources.h) with the draft built from the
// checkpoint's own config.json, and its weights loaded strictly.
static df_status load_draft(eval_run *r, const eval_args *a, df_error *err) {
  char cfg_path[PATH_MAX + 16];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", r->dir);
  DF_TRY(df_run_resources_load_ex(r->recipe, cfg_path, &r->res, err));
  DF_TRY(df_device_open(a->has_device ? a->device : r->recipe->training.device, df_device_cpu_only_reason(r->res.draft),
                        a->threads, stderr, &r->ctx, err));
  DF_TRY(df_run_resources_place(&r->res, r->ctx, err));
  DF_TRY(df_dflash_model_create(r->res.draft, r->ctx, &r->model, err));
  return df_dflash_model_load(r->model, r->dir, err);
}

static const char *eval_data_path(const df_recipe *rc, const char *override) {
  if (override) return override;
  if (rc->data.eval_hidden_states_path) return rc->data.eval_hidden_states_path;
  fprintf(stderr,
          "draftforge eval: warning: the recipe sets no data.eval_hidden_states_path; evaluating on the "
          "training data (%s), which is not held out\n",
          rc->data.hidden_states_path);
  return rc->data.hidden_states_path;
}

static df_status run_eval(const eval_args *a, eval_run *r, df_eval_report *rep, const char **data, df_error *err) {
  df_recipe_options ro = {.log = stderr};
  DF_TRY(df_recipe_load(a->recipe, &ro, &r->recipe, err));
  DF_TRY(df_checkpoint_dir_resolve(a->checkpoint, r->dir, sizeof r->dir, err));
  DF_TRY(load_draft(r, a, err));
  df_eval_options o = df_eval_options_from_recipe(r->recipe, r->res.mask_token_id);
  o.max_samples = a->max_samples;
  *data = eval_data_path(r->recipe, a->data);
  return df_evaluate(r->ctx, r->model, r->res.draft, &r->res.frozen, *data, &o, rep, err);
}

int df_cmd_eval(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--spec-decode")) return df_cmd_eval_spec(argc, argv);
  eval_args a;
  int rc = parse_eval_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  if (a.threads > 0) omp_set_num_threads(a.threads);
  eval_run r = {0};
  df_eval_report rep = {0};
  df_error err = {0};
  const char *data = NULL;
  char out[PATH_MAX + 16];
  df_status st = run_eval(&a, &r, &rep, &data, &err);
  if (st == DF_OK) {
    snprintf(out, sizeof out, "%s", a.out ? a.out : "");
    if (!a.out) snprintf(out, sizeof out, "%s/eval.json", r.dir);
    printf("checkpoint: %s\ndata: %s\n", r.dir, data);
    df_eval_report_print(&rep, stdout);
    st = df_eval_report_write_json(&rep, r.dir, data, out, &err);
    if (st == DF_OK) printf("wrote %s\n", out);
  }
  if (st != DF_OK) df_error_print(&err);
  df_eval_report_free(&rep);
  eval_free(&r);
  return st == DF_OK ? 0 : 1;
}
