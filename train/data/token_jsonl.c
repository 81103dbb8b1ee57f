// Token JSONL reader: getline + jansson per line, every value checked (integer ids in [0, vocab), mask 0/1,
// equal non-zero lengths) with the file and line in the error.
#include "train/data/token_jsonl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *HINT = "each line is {\"input_ids\": [int, ...], \"loss_mask\": [0|1, ...]} of equal lengths, as "
                          "tools/run/prepare_data.py writes";

df_status df_token_jsonl_open(const char *path, int64_t vocab, df_token_jsonl *r, df_error *err) {
  memset(r, 0, sizeof *r);
  r->fp = fopen(path, "r");
  if (!r->fp) return DF_FAIL(err, DF_ERR_IO, path, "check the --data path", "cannot open %s", path);
  r->path = strdup(path);
  r->vocab = vocab;
  if (!r->path) return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  return DF_OK;
}

void df_token_jsonl_close(df_token_jsonl *r) {
  if (r->fp) fclose(r->fp);
  free(r->path), free(r->buf), free(r->ids), free(r->mask);
  memset(r, 0, sizeof *r);
}

static df_status fail_at(df_token_jsonl *r, df_error *err, const char *what) {
  char where[600];
  snprintf(where, sizeof where, "%s:%lld", r->path, (long long)r->line);
  return DF_FAIL(err, DF_ERR_FORMAT, where, HINT, "%s: %s", where, what);
}

static df_status grow(df_token_jsonl *r, int64_t n, df_error *err) {
  if (n <= r->cap) return DF_OK;
  int32_t *ids = realloc(r->ids, sizeof *ids * (size_t)n);
  if (ids) r->ids = ids;
  uint8_t *mask = realloc(r->mask, (size_t)n);
  if (mask) r->mask = mask;
  if (!ids || !mask) return DF_FAIL(err, DF_ERR_NOMEM, r->path, NULL, "out of memory");
  r->cap = n;
  return DF_OK;
}

static df_status parse_line(df_token_jsonl *r, json_t *o, df_error *err) {
  char what[160];
  json_t *ids = json_object_get(o, "input_ids"), *mask = json_object_get(o, "loss_mask");
  if (!json_is_array(ids) || !json_is_array(mask)) return fail_at(r, err, "needs arrays input_ids and loss_mask");
  const size_t n = json_array_size(ids);
  if (n == 0 || json_array_size(mask) != n) {
    snprintf(what, sizeof what, "input_ids has %zu entries and loss_mask %zu: need equal, non-zero lengths", n,
             json_array_size(mask));
    return fail_at(r, err, what);
  }
  DF_TRY(grow(r, (int64_t)n, err));
  for (size_t i = 0; i < n; i++) {
    json_t *a = json_array_get(ids, i), *b = json_array_get(mask, i);
    json_int_t id = json_is_integer(a) ? json_integer_value(a) : -1;
    if (id < 0 || id > INT32_MAX || (r->vocab > 0 && id >= r->vocab)) {
      snprintf(what, sizeof what, "input_ids[%zu] is not a token id in [0, %lld)", i, (long long)r->vocab);
      return fail_at(r, err, what);
    }
    json_int_t m = json_is_integer(b) ? json_integer_value(b) : -1;
    if (json_is_boolean(b)) m = json_is_true(b);
    if (m != 0 && m != 1) {
      snprintf(what, sizeof what, "loss_mask[%zu] is not 0 or 1", i);
      return fail_at(r, err, what);
    }
    r->ids[i] = (int32_t)id;
    r->mask[i] = (uint8_t)m;
  }
  r->len = (int64_t)n;
  return DF_OK;
}

// Parses the line in r->buf (already counted in r->line).
static df_status parse_buf(df_token_jsonl *r, df_error *err) {
  json_error_t je;
  json_t *o = json_loads(r->buf, 0, &je);
  if (!o || !json_is_object(o)) {
    char what[256];
    snprintf(what, sizeof what, "not a JSON object (%s)", o ? "another value" : je.text);
    json_decref(o);
    return fail_at(r, err, what);
  }
  df_status st = parse_line(r, o, err);
  json_decref(o);
  return st;
}

df_status df_token_jsonl_next(df_token_jsonl *r, bool *done, df_error *err) {
  *done = false;
  for (;;) {
    off_t at = ftello(r->fp);
    ssize_t got = getline(&r->buf, &r->buf_cap, r->fp);
    if (got < 0) {
      *done = true;
      return DF_OK;
    }
    r->line++;
    size_t k = 0;
    while (r->buf[k] == ' ' || r->buf[k] == '\t' || r->buf[k] == '\r' || r->buf[k] == '\n') k++;
    if (!r->buf[k]) continue;
    r->offset = (int64_t)at;
    return parse_buf(r, err);
  }
}

df_status df_token_jsonl_read_at(df_token_jsonl *r, int64_t offset, int64_t line, df_error *err) {
  r->line = line;
  if (fseeko(r->fp, (off_t)offset, SEEK_SET) != 0 || getline(&r->buf, &r->buf_cap, r->fp) < 0)
    return DF_FAIL(err, DF_ERR_IO, r->path, "do not change the data file while it is in use",
                   "%s: cannot read line %lld again (the file was truncated?)", r->path, (long long)line);
  r->offset = offset;
  return parse_buf(r, err);
}

df_status df_token_jsonl_count(const char *path, int64_t *n, df_error *err) {
  *n = 0;
  FILE *fp = fopen(path, "r");
  if (!fp) return DF_FAIL(err, DF_ERR_IO, path, "check the --data path", "cannot open %s", path);
  char *buf = NULL;
  size_t cap = 0;
  while (getline(&buf, &cap, fp) >= 0) {
    size_t k = 0;
    while (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r' || buf[k] == '\n') k++;
    *n += buf[k] != 0;
  }
  free(buf);
  fclose(fp);
  return DF_OK;
}
