// Capture (train/data/capture.h): settings manifest, per-shard resume, optional greedy regeneration, the target
// prefill of each sample and the shard writer, with a progress line (samples, tokens/s, ETA).
#include "train/data/capture.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fsutil.h"
#include "modeling/draft_config.h"
#include "modeling/target_config.h"
#include "strategies/strategy.h"
#include "train/data/hs.h"
#include "train/data/token_jsonl.h"

#define CAPTURE_MANIFEST "capture.json"
#define CAPTURE_FORMAT   "draftforge-capture"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t df_capture_prompt_len(const uint8_t *mask, int64_t len) {
  for (int64_t i = 0; i < len; i++)
    if (mask[i]) return i;
  return len;
}

df_status df_capture_check_layer_ids(const int *ids, int k, int64_t num_layers, df_error *err) {
  for (int j = 0; j < k; j++)
    if (ids[j] < 0 || ids[j] > num_layers - 2)
      return DF_FAIL(err, DF_ERR_INVALID, "dflash_config.target_layer_ids",
                     ids[j] == num_layers - 1
                         ? "the last layer's output is ambiguous (transformers returns it post-norm, SGLang cannot "
                           "capture it); pick a lower layer, the final post-norm state is target_last_hidden_states"
                         : "a layer id L is the output of decoder layer L, 0 <= L <= num_hidden_layers - 2",
                     "layer id %d cannot be captured from a target of %lld layers", ids[j], (long long)num_layers);
  return DF_OK;
}

df_status df_capture_sample(df_target *t, df_target_cache *c, const int32_t *ids, int64_t len, int k,
                            const int *layer_ids, float *hidden, float *last, df_error *err) {
  DF_TRY(df_target_cache_truncate(c, 0, err));
  df_target_outputs o = {.num_capture = k, .capture_ids = layer_ids, .captured = hidden, .final_hidden = last};
  return df_target_forward(t, c, ids, len, &o, err);
}

// ---- the run's resources -------------------------------------------------------------------------------

typedef struct {
  const df_capture_options *o;
  const df_draft_config *draft;
  const df_target_config *tcfg;
  df_ctx *ctx;
  df_target *target;
  df_target_cache *cache;
  int32_t eos[DF_TARGET_MAX_EOS];
  int n_eos;
  bool last;
  int64_t cap; // cache capacity = sample buffer rows
  int32_t *ids, *gen;
  uint8_t *mask;
  float *hidden, *last_buf; // host: what the shard writer reads
  float *dhidden, *dlast;   // the same on the context's device (NULL on the CPU: the host buffers serve)
  df_token_jsonl in;
  int64_t total_lines;
  double t0, last_print;
} capture_run;

static void run_free(capture_run *r) {
  df_token_jsonl_close(&r->in);
  free(r->ids), free(r->gen), free(r->mask), free(r->hidden), free(r->last_buf);
  if (r->ctx) df_buffer_free(r->ctx, r->dhidden), df_buffer_free(r->ctx, r->dlast);
  df_target_cache_free(r->cache);
  df_target_free(r->target);
  df_ctx_destroy(r->ctx);
  df_target_config_free(r->tcfg);
  df_draft_config_free(r->draft);
}

static df_status setup(capture_run *r, df_error *err) {
  const df_capture_options *o = r->o;
  DF_TRY(df_draft_config_from_file(o->draft_config_path, &r->draft, err));
  DF_TRY(df_target_config_from_dir(o->target_dir, &r->tcfg, err));
  const df_draft_config *resolved = NULL; // EAGLE-3: its capture layers, else SpecForge's default for this target
  DF_TRY(df_draft_config_resolve_capture(r->draft, r->tcfg->num_hidden_layers, NULL, 0, &resolved, err));
  if (resolved) df_draft_config_free(r->draft), r->draft = resolved;
  DF_TRY(df_draft_config_check_target(r->draft, r->tcfg, err));
  const df_dflash_config *dc = &r->draft->dflash;
  DF_TRY(df_capture_check_layer_ids(dc->target_layer_ids, dc->num_target_layer_ids, r->tcfg->num_hidden_layers, err));
  r->last = o->last_hidden < 0 ? df_strategy_reads_last_hidden(r->draft) : o->last_hidden > 0;
  if (o->ctx_options)
    DF_TRY(df_ctx_create(o->ctx_options, &r->ctx, err));
  else
    DF_TRY(df_device_open(o->device, NULL, o->threads, o->log, &r->ctx, err));
  DF_TRY(df_target_load(o->target_dir, r->ctx, &r->target, err));
  DF_TRY(df_target_eos_ids(o->target_dir, r->eos, &r->n_eos, err));
  r->cap = o->max_length;
  DF_TRY(df_target_cache_create(r->target, r->cap, &r->cache, err));
  const int64_t H = r->tcfg->hidden_size, K = dc->num_target_layer_ids;
  r->ids = malloc(sizeof *r->ids * (size_t)r->cap), r->gen = malloc(sizeof *r->gen * (size_t)r->cap);
  r->mask = malloc((size_t)r->cap), r->hidden = malloc(sizeof(float) * (size_t)(r->cap * K * H));
  r->last_buf = r->last ? malloc(sizeof(float) * (size_t)(r->cap * H)) : NULL;
  if (!r->ids || !r->gen || !r->mask || !r->hidden || (r->last && !r->last_buf))
    return DF_FAIL(err, DF_ERR_NOMEM, "capture", "lower --max-length", "cannot allocate the sample buffers");
  if (!df_ctx_host_addressable(r->ctx)) {
    DF_TRY(df_buffer_alloc_as(r->ctx, DF_MEM_TARGET_ACTIVATIONS, sizeof(float) * (size_t)(r->cap * K * H),
                              (void **)&r->dhidden, err));
    if (r->last)
      DF_TRY(df_buffer_alloc_as(r->ctx, DF_MEM_TARGET_ACTIVATIONS, sizeof(float) * (size_t)(r->cap * H),
                                (void **)&r->dlast, err));
  }
  DF_TRY(df_token_jsonl_count(o->data_path, &r->total_lines, err));
  return df_token_jsonl_open(o->data_path, r->tcfg->vocab_size, &r->in, err);
}

// ---- manifest ------------------------------------------------------------------------------------------

// A 64-bit FNV-1a of the data file: a rerun must read the same input to continue the same capture.
static df_status file_hash(const char *path, char out[17], df_error *err) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return DF_FAIL(err, DF_ERR_IO, path, NULL, "cannot open %s", path);
  uint64_t h = 1469598103934665603ull;
  unsigned char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, fp)) > 0)
    for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
  fclose(fp);
  snprintf(out, 17, "%016llx", (unsigned long long)h);
  return DF_OK;
}

static json_t *manifest_of(const capture_run *r, const char *hash) {
  const df_capture_options *o = r->o;
  char tdir[PATH_MAX], dpath[PATH_MAX];
  if (!realpath(o->target_dir, tdir)) snprintf(tdir, sizeof tdir, "%s", o->target_dir);
  if (!realpath(o->data_path, dpath)) snprintf(dpath, sizeof dpath, "%s", o->data_path);
  json_t *ids = json_array();
  for (int j = 0; j < r->draft->dflash.num_target_layer_ids; j++)
    json_array_append_new(ids, json_integer(r->draft->dflash.target_layer_ids[j]));
  return json_pack("{s:s, s:i, s:s, s:s, s:s, s:o, s:s, s:b, s:b, s:I, s:I, s:I, s:s}", "format", CAPTURE_FORMAT,
                   "version", 1, "target", tdir, "data", dpath, "data_fnv1a64", hash, "target_layer_ids", ids,
                   "layer_id_convention", DF_HS_CONVENTION, "target_last_hidden_states", r->last, "regenerate",
                   o->regenerate, "max_new_tokens", (json_int_t)(o->regenerate ? o->max_new_tokens : 0), "max_length",
                   (json_int_t)o->max_length, "samples_per_shard", (json_int_t)o->samples_per_shard, "dtype",
                   o->dtype == DF_BF16 ? "bfloat16" : "float32");
}

// First key whose value differs (or is missing), for the error.
static const char *first_difference(const json_t *a, const json_t *b) {
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)a, key, v) if (!json_equal(v, json_object_get(b, key))) return key;
  json_object_foreach((json_t *)b, key, v) if (!json_object_get(a, key)) return key;
  return NULL;
}

static bool dir_has_shards(const char *dir) {
  char pat[PATH_MAX + 32];
  snprintf(pat, sizeof pat, "%s/shard_00000.h5", dir);
  return access(pat, F_OK) == 0;
}

// Writes capture.json on a fresh directory; on an existing one requires the same settings.
static df_status claim_out_dir(const capture_run *r, df_error *err) {
  const char *dir = r->o->out_dir;
  char path[PATH_MAX + 32], hash[17];
  DF_TRY(file_hash(r->o->data_path, hash, err));
  DF_TRY(df_mkdirs(dir, "pass a writable --out directory", err));
  snprintf(path, sizeof path, "%s/" CAPTURE_MANIFEST, dir);
  json_t *want = manifest_of(r, hash);
  if (!want) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  df_status st = DF_OK;
  if (access(path, F_OK) == 0) {
    json_error_t je;
    json_t *have = json_load_file(path, 0, &je);
    const char *diff = have ? first_difference(want, have) : "(unreadable)";
    if (diff)
      st = DF_FAIL(err, DF_ERR_INVALID, path,
                   "continue a capture with the same --target, --data, --draft-config and "
                   "options, or capture into a new --out directory",
                   "%s holds a capture made with other settings ('%s' differs)", dir, diff);
    json_decref(have);
  } else if (dir_has_shards(dir)) {
    st = DF_FAIL(err, DF_ERR_INVALID, dir, "capture into an empty or new directory",
                 "%s already holds shards but no " CAPTURE_MANIFEST "; it is not a capture directory", dir);
  } else {
    st = df_write_json_atomic(path, want, JSON_INDENT(1) | JSON_SORT_KEYS, "check the --out directory", err);
  }
  json_decref(want);
  return st;
}

// ---- the loop ------------------------------------------------------------------------------------------

static void progress(capture_run *r, const df_capture_report *rep, bool final) {
  FILE *log = r->o->log;
  if (!log) return;
  const double t = now_s(), el = t - r->t0;
  const bool tty = isatty(fileno(log));
  if (!final && t - r->last_print < (tty ? 0.5 : 10.0)) return;
  r->last_print = t;
  const int64_t done = rep->lines, left = r->total_lines - done;
  const double rate = el > 0 ? (double)(rep->tokens + rep->generated_tokens) / el : 0.0;
  const double per_line = done > rep->skipped_shards * r->o->samples_per_shard && el > 0
                              ? el / (double)(done - rep->skipped_shards * r->o->samples_per_shard)
                              : 0.0;
  const double eta = per_line * (double)(left > 0 ? left : 0);
  fprintf(log, "%scapture: %lld/%lld samples | %lld tokens (%lld generated) | %.0f tok/s | ETA %dm%02ds%s",
          tty ? "\r" : "", (long long)done, (long long)r->total_lines, (long long)(rep->tokens + rep->generated_tokens),
          (long long)rep->generated_tokens, rate, (int)(eta / 60), (int)eta % 60, tty && !final ? "" : "\n");
  fflush(log);
}

// One input line → at most one sample in the writer (dropped without two adjacent supervised tokens).
static df_status one_sample(capture_run *r, df_hs_writer *w, df_capture_report *rep, df_error *err) {
  const df_capture_options *o = r->o;
  int64_t len = r->in.len < o->max_length ? r->in.len : o->max_length;
  memcpy(r->ids, r->in.ids, sizeof *r->ids * (size_t)len);
  memcpy(r->mask, r->in.mask, (size_t)len);
  if (o->regenerate) {
    const int64_t P = df_capture_prompt_len(r->in.mask, r->in.len);
    if (P < 1 || P >= o->max_length) {
      rep->dropped++;
      return DF_OK; // no prompt to continue, or no room for a response
    }
    int64_t room = o->max_length - P, n = 0, max_new = o->max_new_tokens < room ? o->max_new_tokens : room;
    DF_TRY(df_target_generate_greedy(r->target, r->cache, r->in.ids, P, max_new, r->eos, r->n_eos, r->gen, &n, err));
    memcpy(r->ids + P, r->gen, sizeof *r->ids * (size_t)n);
    memset(r->mask, 0, (size_t)P);
    memset(r->mask + P, 1, (size_t)n);
    len = P + n;
    rep->generated_tokens += n;
  }
  bool adjacent = false;
  for (int64_t i = 0; i + 1 < len && !adjacent; i++) adjacent = r->mask[i] && r->mask[i + 1];
  if (!adjacent) {
    rep->dropped++;
    return DF_OK;
  }
  const df_dflash_config *dc = &r->draft->dflash;
  const int64_t H = r->tcfg->hidden_size, K = dc->num_target_layer_ids;
  float *hidden = r->dhidden ? r->dhidden : r->hidden, *last = r->dlast ? r->dlast : r->last_buf;
  DF_TRY(df_capture_sample(r->target, r->cache, r->ids, len, (int)K, dc->target_layer_ids, hidden,
                           r->last ? last : NULL, err));
  const df_device dev = df_ctx_device(r->ctx);
  if (r->dhidden)
    DF_TRY(df_copy(r->ctx, r->hidden, DF_DEV_CPU, r->dhidden, dev, sizeof(float) * (size_t)(len * K * H), err));
  if (r->dlast && r->last)
    DF_TRY(df_copy(r->ctx, r->last_buf, DF_DEV_CPU, r->dlast, dev, sizeof(float) * (size_t)(len * H), err));
  DF_TRY(df_hs_writer_append(w, len, r->ids, r->mask, r->hidden, r->last ? r->last_buf : NULL, err));
  rep->tokens += len;
  rep->written++;
  return DF_OK;
}

static df_status skip_lines(capture_run *r, int64_t n, df_error *err) {
  bool done = false;
  for (int64_t i = 0; i < n && !done; i++) DF_TRY(df_token_jsonl_next(&r->in, &done, err));
  return DF_OK;
}

static df_status capture_shards(capture_run *r, df_capture_report *rep, df_error *err) {
  const df_capture_options *o = r->o;
  const int64_t sps = o->samples_per_shard, nshards = (r->total_lines + sps - 1) / sps;
  df_hs_writer_options wo = {.hidden_size = r->tcfg->hidden_size,
                             .num_layers = r->draft->dflash.num_target_layer_ids,
                             .target_layer_ids = r->draft->dflash.target_layer_ids,
                             .dtype = o->dtype,
                             .has_last_hidden = r->last};
  for (int64_t k = 0; k < nshards; k++) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/shard_%05lld.h5", o->out_dir, (long long)k);
    const int64_t lines = k + 1 < nshards ? sps : r->total_lines - k * sps;
    rep->shards++;
    if (access(path, F_OK) == 0) { // renamed into place only when complete
      DF_TRY(skip_lines(r, lines, err));
      rep->lines += lines, rep->skipped_shards++;
      continue;
    }
    df_hs_writer *w = NULL;
    DF_TRY(df_hs_writer_create(path, &wo, &w, err));
    df_status st = DF_OK;
    for (int64_t i = 0; i < lines && st == DF_OK; i++) {
      bool done = false;
      st = df_token_jsonl_next(&r->in, &done, err);
      if (st == DF_OK && done)
        st = DF_FAIL(err, DF_ERR_IO, o->data_path, "do not change the data file during a capture", "%s ended early",
                     o->data_path);
      if (st == DF_OK) st = one_sample(r, w, rep, err);
      rep->lines++;
      progress(r, rep, false);
    }
    if (st != DF_OK) {
      df_hs_writer_abort(w);
      return st;
    }
    DF_TRY(df_hs_writer_close(w, err));
  }
  return DF_OK;
}

static df_status check_options(const df_capture_options *o, df_error *err) {
  if (!o->target_dir || !o->data_path || !o->draft_config_path || !o->out_dir)
    return DF_FAIL(err, DF_ERR_INVALID, "capture", "pass --target, --data, --draft-config and --out",
                   "missing a required option");
  if (o->max_length < 2 || o->samples_per_shard < 1 || (o->regenerate && o->max_new_tokens < 1))
    return DF_FAIL(err, DF_ERR_INVALID, "capture", "--max-length >= 2, --samples-per-shard >= 1, --max-new-tokens >= 1",
                   "bad sizes: max_length %lld, samples_per_shard %lld, max_new_tokens %lld", (long long)o->max_length,
                   (long long)o->samples_per_shard, (long long)o->max_new_tokens);
  if (o->dtype != DF_BF16 && o->dtype != DF_F32)
    return DF_FAIL(err, DF_ERR_INVALID, "dtype", "bfloat16 or float32", "unsupported dtype");
  return DF_OK;
}

df_status df_capture_run(const df_capture_options *o, df_capture_report *rep, df_error *err) {
  memset(rep, 0, sizeof *rep);
  DF_TRY(check_options(o, err));
  capture_run r = {.o = o};
  df_status st = setup(&r, err);
  if (st == DF_OK) st = claim_out_dir(&r, err);
  r.t0 = now_s();
  if (st == DF_OK) st = capture_shards(&r, rep, err);
  rep->seconds = now_s() - r.t0;
  if (st == DF_OK) progress(&r, rep, true);
  run_free(&r);
  return st;
}
