// `draftforge eval CHECKPOINT_OR_EXPORT --recipe R [--data FILE] [--out FILE]`: loads a checkpoint or export
// directory strictly, the recipe's target pieces and settings, runs df_evaluate and writes the JSON report.
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/data/online_data.h"
#include "train/eval/evaluate.h"
#include "train/export/export.h"
#include "train/recipe/device.h"
#include "train/recipe/recipe.h"
#include "train/run/run_dir.h"
#include "train/step/resources.h"

static const df_cli_opt EVAL_OPTS[] = {
    {"--recipe", "RECIPE.yaml", DF_CLI_VALUE, "required",
     "target, batch size, max_length, num_anchors, loss_decay_gamma, the DSpark alphas and the data"},
    {"--best", NULL, DF_CLI_FLAG, "off: the latest checkpoint", "from a run directory, evaluate its best checkpoint"},
    {"--data", "PATH", DF_CLI_VALUE, "data.eval_hidden_states_path, else data.hidden_states_path (not held out)",
     "the hidden-state shard or shard directory to evaluate on"},
    {"--out", "FILE", DF_CLI_VALUE, "CHECKPOINT/eval.json", "where the JSON report goes"},
    {"--max-samples", "N", DF_CLI_VALUE, "every sample", "evaluate the first N samples in file order"},
    {"--threads", "N", DF_CLI_VALUE, "OpenMP's", "CPU threads"},
    {"--device", "auto|cpu|cuda", DF_CLI_VALUE, "training.device (auto)",
     "where it runs; auto takes CUDA when a GPU is visible and its backend has every op of a step, else the CPU"},
    DF_CLI_END};

static const df_cli_spec EVAL_CLI = {
    "eval",
    "CHECKPOINT_OR_EXPORT",
    1,
    1,
    "Evaluates a DFlash or DSpark draft (a checkpoint or export directory, or a run directory: its latest\n"
    "checkpoint, or its best with --best) on held-out data: forward only, every sample in file order, anchors from\n"
    "training.seed. Prints and writes (default CHECKPOINT/eval.json) loss, acc, per-position accuracy and the\n"
    "simulated acceptance length τ; for a DSpark draft the loss is the α-weighted DSpark objective and the\n"
    "report adds ce_loss, l1_loss, confidence_loss and tau_probabilistic. The recipe (its training.strategy\n"
    "must match the draft) gives the target, batch size, max_length, num_anchors, loss_decay_gamma, the DSpark\n"
    "alphas and the data: --data, else data.eval_hidden_states_path or data.eval_data_path, else the\n"
    "training data (not held out). Captured shards are read as they are; a token or conversations JSONL runs\n"
    "the recipe's target to compute the features (online, as draftforge train does). --device: where the draft\n"
    "runs (default: the recipe's training.device; an online target runs there too). A non-finite result fails\n"
    "(exit 1), naming the samples that hold NaN/Inf hidden states.\n"
    "\n"
    "draftforge eval --spec-decode --target DIR --draft CKPT --data FILE.jsonl: real speculative decoding\n"
    "(see draftforge eval --spec-decode --help).",
    EVAL_OPTS};

typedef struct {
  const char *checkpoint, *recipe, *data, *out;
  int64_t max_samples;
  int threads;
  bool best, verbose, has_device;
  df_device_choice device;
} eval_args;

// Returns 0 to run, 1 after --help, 2 on a usage error (printed).
static int parse_eval_args(int argc, char **argv, eval_args *e, df_cli_args *a) {
  memset(e, 0, sizeof *e);
  int rc = df_cli_parse(&EVAL_CLI, argc, argv, a);
  if (rc) return rc;
  static const char *const devices[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order
  long long n, threads;
  int device;
  if (!df_cli_int(a, "--max-samples", 0, INT64_MAX, 0, &n) || !df_cli_int(a, "--threads", 0, 4096, 0, &threads) ||
      !df_cli_choice(a, "--device", devices, 0, &device))
    return DF_EXIT_USAGE;
  e->has_device = df_cli_has(a, "--device"), e->device = (df_device_choice)device;
  e->checkpoint = a->pos[0], e->recipe = df_cli_get(a, "--recipe"), e->data = df_cli_get(a, "--data");
  e->out = df_cli_get(a, "--out"), e->max_samples = n, e->threads = (int)threads;
  e->best = df_cli_has(a, "--best"), e->verbose = a->verbose;
  if (!e->recipe) return df_cli_usage_error(&EVAL_CLI, "--recipe RECIPE.yaml is required");
  if (access(e->checkpoint, F_OK) != 0) return df_cli_usage_error(&EVAL_CLI, "%s does not exist", e->checkpoint);
  if (access(e->recipe, F_OK) != 0) return df_cli_usage_error(&EVAL_CLI, "recipe %s does not exist", e->recipe);
  return 0;
}

// Everything the command owns, released by eval_free.
typedef struct {
  const df_recipe *recipe;
  df_run_resources res; // target and draft configs (the draft's from the checkpoint), frozen pieces, mask token
  df_ctx *ctx;
  df_draft_model *model;
  df_online_target *online; // online eval data
  df_batch_source *src;
  df_strategy_values values; // the strategy's own recipe keys
  char dir[PATH_MAX];
  char note[1024]; // which checkpoint was taken
} eval_run;

static void eval_free(eval_run *r) {
  df_batch_source_close(r->src);
  df_online_target_free(r->online);
  df_draft_model_free(r->model);
  df_run_resources_free(&r->res); // before the context: the frozen pieces may live on its device
  df_ctx_destroy(r->ctx);
  df_recipe_free(r->recipe);
}

// The recipe's target pieces and mask token (train/step/resources.h) with the draft built from the
// checkpoint's own config.json, and its weights loaded strictly.
static df_status load_draft(eval_run *r, const eval_args *a, df_error *err) {
  char cfg_path[PATH_MAX + 16];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", r->dir);
  DF_TRY(df_run_resources_load_ex(r->recipe, cfg_path, &r->res, err));
  DF_TRY(df_device_open(a->has_device ? a->device : r->recipe->training.device, df_device_cpu_only_reason(r->res.draft),
                        a->threads, stderr, &r->ctx, err));
  DF_TRY(df_run_resources_place(&r->res, r->ctx, err));
  DF_TRY(df_draft_model_create(r->res.draft, r->ctx, &r->model, err));
  return df_draft_model_load(r->model, r->dir, err);
}

// The data and the key that named it: --data, the eval set, else the training data with a warning.
static const char *eval_data_path(const df_recipe *rc, const char *override, const char **key) {
  *key = "--data";
  if (override) return override;
  *key = rc->data.eval_hidden_states_path ? "data.eval_hidden_states_path" : "data.eval_data_path";
  if (rc->data.eval_hidden_states_path) return rc->data.eval_hidden_states_path;
  if (rc->data.eval_data_path) return rc->data.eval_data_path;
  const char *train = rc->data.hidden_states_path ? rc->data.hidden_states_path : rc->data.train_data_path;
  *key = rc->data.hidden_states_path ? "data.hidden_states_path" : "data.train_data_path";
  fprintf(stderr,
          "draftforge eval: warning: the recipe sets no eval data (data.eval_hidden_states_path or "
          "data.eval_data_path); evaluating on the training data (%s), which is not held out\n",
          train);
  return train;
}

static df_status run_eval(const eval_args *a, eval_run *r, df_eval_report *rep, const char **data, df_error *err) {
  df_recipe_options ro = {.log = stderr};
  DF_TRY(df_recipe_load(a->recipe, &ro, &r->recipe, err));
  df_ckpt_choice c;
  DF_TRY(df_ckpt_choose_model(a->checkpoint, a->best, &c, err));
  snprintf(r->dir, sizeof r->dir, "%.4000s", c.ckpt);
  snprintf(r->note, sizeof r->note, "%s", c.note);
  DF_TRY(load_draft(r, a, err));
  r->values = df_recipe_strategy_values(r->recipe);
  df_eval_options o = df_eval_options_from_recipe(r->recipe, r->res.mask_token_id, &r->values);
  o.max_samples = a->max_samples;
  const char *key;
  *data = eval_data_path(r->recipe, a->data, &key);
  const df_ctx_options target_ctx = {.device = df_ctx_device(r->ctx), .num_threads = a->threads};
  df_data_source_options so = {.rc = r->recipe,
                               .path = *data,
                               .key = key,
                               .allow_hidden_states = true,
                               .allow_online = true,
                               .cfg = r->res.draft,
                               .threads = a->threads,
                               .target_ctx = &target_ctx,
                               .log = stderr,
                               .target = &r->online};
  DF_TRY(df_data_source_open(&so, &r->src, err));
  return df_evaluate_source(r->ctx, r->model, r->res.draft, &r->res.frozen, r->src, &o, rep, err);
}

// A result that is not finite is a failure naming the samples that hold NaN/Inf hidden states.
static df_status check_finite_result(const df_eval_report *rep, const char *data, df_error *err) {
  double v[3] = {rep->loss, rep->acc, rep->accept_len};
  if (isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2])) return DF_OK;
  const df_hs_scan_report *nf = &rep->nonfinite;
  if (!nf->bad_samples)
    return DF_FAIL(err, DF_ERR_NUMERIC, data,
                   "the draft's weights give the non-finite value: evaluate an earlier checkpoint",
                   "eval result is not finite (loss %g, acc %g, tau %g), and every sample of %s is finite", v[0], v[1],
                   v[2], data);
  char list[400] = "";
  for (int i = 0; i < nf->nreported && strlen(list) < 300; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s#%lld", i ? ", " : "", (long long)nf->bad[i].sample);
  char first[900];
  df_hs_bad_value_text(&nf->bad[0], first, sizeof first);
  return DF_FAIL(
      err, DF_ERR_NUMERIC, nf->bad[0].shard,
      "remove or recapture those samples (draftforge inspect --full DATA lists every one), or --data another set",
      "eval result is not finite (loss %g): %lld sample(s) of %s hold NaN/Inf hidden states: %s%s; first: %.500s", v[0],
      (long long)nf->bad_samples, data, list, nf->bad_samples > nf->nreported ? ", ..." : "", first);
}

int df_cmd_eval(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (!strcmp(argv[i], "--spec-decode")) return df_cmd_eval_spec(argc, argv);
  eval_args a;
  df_cli_args cli;
  int rc = parse_eval_args(argc, argv, &a, &cli);
  df_cli_free(&cli);
  if (rc) return rc == 1 ? DF_EXIT_OK : rc;
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
    printf("checkpoint: %s (%s)\ndata: %s\n", r.dir, r.note, data);
    df_eval_report_print(&rep, stdout);
    st = check_finite_result(&rep, data, &err);
  }
  if (st == DF_OK) st = df_eval_report_write_json(&rep, r.dir, data, out, &err);
  if (st == DF_OK) printf("wrote %s\n", out);
  if (st != DF_OK) fflush(stdout), df_error_print_verbose(&err, a.verbose);
  df_eval_report_free(&rep);
  eval_free(&r);
  return st == DF_OK ? DF_EXIT_OK : DF_EXIT_FAILURE;
}
