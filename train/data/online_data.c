// From a recipe's data path to a batch source (train/data/online_data.h): the kind of file, the one-time preparation of
// conversations through tools/run/prepare_data.py, and the HDF5 or online source.
#include "train/data/online_data.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/pytools.h"

// ---- the kind of data ------------------------------------------------------------------------------------------

static bool is_hdf5(const char *path) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char head[8];
  FILE *fp = fopen(path, "rb");
  if (!fp) return false;
  bool yes = fread(head, 1, sizeof head, fp) == sizeof head && !memcmp(head, sig, sizeof sig);
  fclose(fp);
  return yes;
}

static const char KIND_HINT[] = "online data is JSONL: {\"input_ids\": [...], \"loss_mask\": [...]} per line (token "
                                "JSONL), or {\"conversations\": [...]} / {\"messages\": [...]} (conversations)";

// The first non-blank line's JSON object decides.
static df_status jsonl_kind(const char *path, df_data_kind *out, df_error *err) {
  FILE *fp = fopen(path, "r");
  if (!fp) return DF_FAIL(err, DF_ERR_IO, path, "check the data path", "cannot open %s", path);
  char *buf = NULL, where[PATH_MAX + 32];
  size_t cap = 0;
  int64_t line = 0;
  df_status st = DF_OK;
  bool found = false;
  while (!found && getline(&buf, &cap, fp) >= 0) {
    line++;
    size_t k = strspn(buf, " \t\r\n");
    if (!buf[k]) continue;
    found = true;
    snprintf(where, sizeof where, "%s:%lld", path, (long long)line);
    json_error_t je;
    json_t *o = json_loads(buf, 0, &je);
    if (json_is_object(o) && json_object_get(o, "input_ids") && json_object_get(o, "loss_mask"))
      *out = DF_DATA_TOKENS;
    else if (json_is_object(o) && (json_object_get(o, "conversations") || json_object_get(o, "messages")))
      *out = DF_DATA_CONVERSATIONS;
    else
      st = DF_FAIL(err, DF_ERR_FORMAT, where, KIND_HINT, "%s: %s", where,
                   o ? "neither a token sample (input_ids, loss_mask) nor a conversation (conversations, messages)"
                     : "not a JSON object, and the file is not HDF5 hidden states");
    json_decref(o);
  }
  free(buf);
  fclose(fp);
  if (st == DF_OK && !found) st = DF_FAIL(err, DF_ERR_FORMAT, path, KIND_HINT, "%s holds no sample", path);
  return st;
}

df_status df_data_kind_of(const char *path, df_data_kind *out, df_error *err) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return DF_FAIL(err, DF_ERR_IO, path, "check the data path in the recipe", "no such file or directory: %s", path);
  if (S_ISDIR(sb.st_mode) || is_hdf5(path)) {
    *out = DF_DATA_HIDDEN_STATES;
    return DF_OK;
  }
  return jsonl_kind(path, out, err);
}

// ---- preparing conversations ----------------------------------------------------------------------------------

// The last non-empty line of the tool's output (its result path on success), and the first "error:" line.
static void scan_output(const char *log_path, FILE *log, char *last, size_t nl, char *error, size_t ne) {
  last[0] = error[0] = '\0';
  FILE *fp = fopen(log_path, "r");
  if (!fp) return;
  char *buf = NULL;
  size_t cap = 0;
  ssize_t got;
  while ((got = getline(&buf, &cap, fp)) >= 0) {
    while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) buf[--got] = '\0';
    if (!got) continue;
    if (last[0] && log) fprintf(log, "  %s\n", last); // every line but the path is the tool's report
    snprintf(last, nl, "%s", buf);
    if (!error[0] && !strncmp(buf, "error:", 6)) snprintf(error, ne, "%s", buf + 6 + strspn(buf + 6, " "));
  }
  free(buf);
  fclose(fp);
}

df_status df_data_prepare(const df_recipe *rc, const char *conversations, const char *key, char *out, size_t n,
                          FILE *log, df_error *err) {
  if (rc->data.is_preformatted)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "data.is_preformatted",
                   "give conversations (the chat template is applied by tools/run/prepare_data.py) or a token JSONL",
                   "%s holds conversations, and preformatted text (data.is_preformatted: true) is not read", key);
  char python[PATH_MAX], script[PATH_MAX];
  DF_TRY(df_pytools_python("transformers", "transformers", "online data holding conversations", key, python,
                           sizeof python, err));
  DF_TRY(df_pytools_script("prepare_data.py", script, sizeof script, err));
  char max_len[32], log_path[] = "/tmp/draftforge-prepare-XXXXXX";
  snprintf(max_len, sizeof max_len, "%lld", (long long)rc->data.max_length);
  int fd = mkstemp(log_path);
  if (fd < 0) return DF_FAIL(err, DF_ERR_IO, "/tmp", "check /tmp", "cannot create a temporary file");
  close(fd);
  char *argv[] = {python,
                  script,
                  "--target",
                  (char *)rc->model.target_model_path,
                  "--data",
                  (char *)conversations,
                  "--chat-template",
                  (char *)rc->data.chat_template,
                  "--max-length",
                  max_len,
                  "--cache-dir",
                  (char *)rc->data.cache_dir,
                  rc->data.train_only_last_turn ? "--train-only-last-turn" : NULL,
                  NULL};
  if (log)
    fprintf(log, "online data: preparing %s (tools/run/prepare_data.py, template %s)\n", conversations,
            rc->data.chat_template);
  pid_t pid;
  df_status st = df_pytools_spawn(argv, -1, log_path, NULL, &pid, err);
  int code = 1;
  if (st == DF_OK) df_pytools_wait(pid, -1, &code);
  char last[PATH_MAX], error[400];
  scan_output(log_path, log, last, sizeof last, error, sizeof error);
  unlink(log_path);
  if (st != DF_OK) return st;
  if (code != 0)
    return DF_FAIL(err, DF_ERR_INVALID, key, "fix the data or data.chat_template; the tool's message says where",
                   "tools/run/prepare_data.py failed on %s (exit %d): %s", conversations, code,
                   error[0] ? error : (last[0] ? last : "no output"));
  if (access(last, R_OK) != 0)
    return DF_FAIL(err, DF_ERR_IO, key, "run tools/run/prepare_data.py by hand to see its output",
                   "tools/run/prepare_data.py did not report a readable token file (last line: %s)", last);
  snprintf(out, n, "%s", last);
  return DF_OK;
}

// ---- the source ------------------------------------------------------------------------------------------------

static df_status open_online(const df_data_source_options *o, const char *tokens, df_batch_source **out,
                             df_error *err) {
  const df_recipe *rc = o->rc;
  if (!*o->target) {
    df_online_target_options to = {.target_dir = rc->model.target_model_path,
                                   .cfg = o->cfg,
                                   .feature_dtype = rc->data.online_feature_dtype,
                                   .threads = o->threads,
                                   .overlap = o->overlap,
                                   .ctx_options = o->target_ctx};
    DF_TRY(df_online_target_open(&to, o->target, err));
  }
  int64_t dropped = 0;
  DF_TRY(df_online_source_open(*o->target, tokens, rc->data.max_length, rc->data.max_prompts, &dropped, out, err));
  if (o->log)
    fprintf(o->log,
            "online data (%s): %lld samples from %s (%lld without two adjacent supervised tokens dropped); "
            "features from %s, %s\n",
            o->key, (long long)(*out)->num_samples, tokens, (long long)dropped, rc->model.target_model_path,
            rc->data.online_feature_dtype == DF_BF16 ? "rounded to bfloat16" : "float32");
  return DF_OK;
}

// A memory plan's data: the shapes of the run's largest micro-batch, through the same sources.
static df_status open_synthetic(const df_data_source_options *o, df_batch_source **out, df_error *err) {
  const df_recipe *rc = o->rc;
  const int64_t H = o->cfg->hidden_size, K = o->cfg->dflash.num_target_layer_ids;
  if (o->allow_hidden_states || !o->target) // the final hidden states too, for the eval of a draft that reads them
    return df_synthetic_source_open(o->synthetic, rc->data.max_length, K * H, H, out, err);
  if (!*o->target) {
    df_online_target_options to = {.target_dir = rc->model.target_model_path,
                                   .cfg = o->cfg,
                                   .feature_dtype = rc->data.online_feature_dtype,
                                   .threads = o->threads,
                                   .ctx_options = o->target_ctx,
                                   .shapes_only = true};
    DF_TRY(df_online_target_open(&to, o->target, err));
  }
  return df_online_source_open_synthetic(*o->target, rc->data.max_length, o->synthetic, out, err);
}

df_status df_data_source_open(const df_data_source_options *o, df_batch_source **out, df_error *err) {
  *out = NULL;
  if (o->synthetic > 0) return open_synthetic(o, out, err);
  df_data_kind kind;
  DF_TRY(df_data_kind_of(o->path, &kind, err));
  if (kind == DF_DATA_HIDDEN_STATES) {
    if (!o->allow_hidden_states)
      return DF_FAIL(err, DF_ERR_INVALID, o->key,
                     "captured hidden states go in data.hidden_states_path / data.eval_hidden_states_path",
                     "%s = %s holds hidden states, not online data (a token or conversations JSONL)", o->key, o->path);
    return df_hs_source_open(o->path, o->cfg, o->need_last_hidden, out, err);
  }
  if (!o->allow_online || !o->target)
    return DF_FAIL(err, DF_ERR_INVALID, o->key,
                   "online data (token or conversations JSONL) goes in data.train_data_path / data.eval_data_path",
                   "%s = %s is a JSONL file, not captured hidden states", o->key, o->path);
  if (kind == DF_DATA_TOKENS) return open_online(o, o->path, out, err);
  char tokens[PATH_MAX];
  DF_TRY(df_data_prepare(o->rc, o->path, o->key, tokens, sizeof tokens, o->log, err));
  return open_online(o, tokens, out, err);
}
