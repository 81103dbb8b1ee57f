// `draftforge eval CHECKPOINT_OR_EXPORT --recipe R [--data FILE] [--out FILE]`: loads a checkpoint or export
// directory strictly, the recipe's target pieces and settings, runs df_evaluate and writes the JSON report.
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/target_config.h"
#include "modeling/target_pieces.h"
#include "train/commands.h"
#include "train/evaluate.h"
#include "train/export.h"
#include "train/recipe.h"

static const char *eval_usage =
    "usage: draftforge eval CHECKPOINT_OR_EXPORT --recipe RECIPE.yaml [--data FILE] [--out FILE]\n"
    "                       [--max-samples N] [--threads N]\n"
    "\n"
    "Evaluates a draft (a checkpoint or export directory, or a run directory: its latest checkpoint) on\n"
    "held-out hidden states: forward only, every sample in file order, anchors from training.seed.\n"
    "Prints and writes (default CHECKPOINT/eval.json) loss, acc, per-position accuracy and the simulated\n"
    "acceptance length τ. The recipe gives the target, batch size, max_length, num_anchors, loss_decay_gamma\n"
    "and the data: --data, else data.eval_hidden_states_path, else data.hidden_states_path (not held out).\n";

typedef struct {
  const char *checkpoint, *recipe, *data, *out;
  int64_t max_samples;
  int threads;
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
    else if (!strcmp(s, "--max-samples") && i + 1 < argc) {
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
  const df_target_config *target;
  const df_draft_config *draft;
  df_target_pieces pieces;
  float *scaled_head;
  df_ctx *ctx;
  df_dflash_model *model;
  char dir[PATH_MAX];
} eval_run;

static void eval_free(eval_run *r) {
  df_dflash_model_free(r->model);
  df_ctx_destroy(r->ctx);
  free(r->scaled_head);
  df_target_pieces_free(&r->pieces);
  df_draft_config_free(r->draft);
  df_target_config_free(r->target);
  df_recipe_free(r->recipe);
}

// The frozen embedding and head, the head divided by logits_mup_width_multiplier as in training.
static df_status load_target(eval_run *r, df_error *err) {
  const df_recipe *rc = r->recipe;
  DF_TRY(df_target_config_from_dir(rc->model.target_model_path, &r->target, err));
  DF_TRY(df_draft_config_check_target(r->draft, r->target, err));
  df_target_pieces_options o = {.embed_key = rc->model.embedding_key,
                                .lm_head_key = rc->model.lm_head_key,
                                .tied = r->target->tie_word_embeddings,
                                .expect_vocab = r->target->vocab_size,
                                .expect_hidden = r->target->hidden_size};
  DF_TRY(df_target_pieces_load(rc->model.target_model_path, &o, &r->pieces, err));
  if (!r->target->has_logits_mup) return DF_OK;
  int64_t n = r->pieces.vocab * r->pieces.hidden;
  if (!(r->scaled_head = malloc((size_t)n * sizeof(float))))
    return DF_FAIL(err, DF_ERR_NOMEM, "lm_head", NULL, "out of memory for the scaled LM head");
  float inv = (float)(1.0 / r->target->logits_mup_width_multiplier);
  for (int64_t i = 0; i < n; i++) r->scaled_head[i] = r->pieces.lm_head[i] * inv;
  return DF_OK;
}

static df_status load_draft(eval_run *r, int threads, df_error *err) {
  char cfg_path[PATH_MAX + 16];
  snprintf(cfg_path, sizeof cfg_path, "%s/config.json", r->dir);
  DF_TRY(df_draft_config_from_file(cfg_path, &r->draft, err));
  if (r->draft->kind != DF_DRAFT_DFLASH)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, cfg_path, "evaluate DSpark drafts once the DSpark model is built in",
                   "only DFlash drafts can be evaluated by this build");
  DF_TRY(load_target(r, err));
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = threads};
  DF_TRY(df_ctx_create(&co, &r->ctx, err));
  DF_TRY(df_dflash_model_create(r->draft, r->ctx, &r->model, err));
  return df_dflash_model_load(r->model, r->dir, err);
}

// model.mask_token_id overrides dflash_config.mask_token_id, as in training.
static df_status mask_token(const eval_run *r, int64_t *out, df_error *err) {
  const df_recipe *rc = r->recipe;
  *out = rc->model.has_mask_token_id ? rc->model.mask_token_id : r->draft->dflash.mask_token_id;
  if (*out < 0)
    return DF_FAIL(err, DF_ERR_INVALID, "model.mask_token_id",
                   "set model.mask_token_id in the recipe or dflash_config.mask_token_id in the draft config",
                   "no mask token id");
  return DF_OK;
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
  DF_TRY(load_draft(r, a->threads, err));
  const df_recipe *rc = r->recipe;
  df_eval_options o = {.batch_size = rc->training.batch_size,
                       .max_length = rc->data.max_length,
                       .num_anchors = rc->training.num_anchors,
                       .loss_decay_gamma = rc->training.loss_decay_gamma,
                       .chunk_blocks = rc->training.objective_chunk_blocks,
                       .seed = rc->training.seed,
                       .max_samples = a->max_samples};
  DF_TRY(mask_token(r, &o.mask_token_id, err));
  *data = eval_data_path(rc, a->data);
  df_step_frozen fz = {r->pieces.embed, r->scaled_head ? r->scaled_head : r->pieces.lm_head, r->pieces.vocab,
                       r->pieces.hidden};
  return df_evaluate(r->ctx, r->model, r->draft, &fz, *data, &o, rep, err);
}

int df_cmd_eval(int argc, char **argv) {
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
