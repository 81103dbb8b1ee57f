// Non-finite values in hidden-state data (train/data/hs_scan.h), read sample by sample through the shard reader.
#include "train/data/hs_scan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool df_hs_find_nonfinite(const float *hidden, int64_t L, int64_t W, const float *last, int64_t H,
                          df_hs_bad_value *bad) {
  for (int64_t i = 0; i < L * W; i++)
    if (!isfinite(hidden[i])) {
      bad->token = i / W, bad->column = i % W, bad->dataset = DF_HS_DS_HIDDEN, bad->value = hidden[i];
      return true;
    }
  for (int64_t i = 0; last && i < L * H; i++)
    if (!isfinite(last[i])) {
      bad->token = i / H, bad->column = i % H, bad->dataset = DF_HS_DS_LAST_HIDDEN, bad->value = last[i];
      return true;
    }
  return false;
}

void df_hs_bad_value_locate(const df_hs_dataset *ds, int64_t i, df_hs_bad_value *bad) {
  bad->sample = i;
  if (!ds) { // not HDF5 data (online features): the sample index is the location
    bad->local = i;
    snprintf(bad->shard, sizeof bad->shard, "%s", "(online)");
    return;
  }
  const char *path;
  int k = df_hs_shard_of(ds, i, &bad->local);
  df_hs_shard(ds, k, &path, NULL, NULL);
  snprintf(bad->shard, sizeof bad->shard, "%s", path);
  bad->sample = i;
}

void df_hs_scan_add(df_hs_scan_report *rep, const df_hs_bad_value *bad) {
  rep->bad_samples++;
  if (rep->nreported < DF_HS_SCAN_MAX_REPORT) rep->bad[rep->nreported++] = *bad;
}

// Reads sample i and adds its first non-finite value, if any, to rep.
static df_status scan_one(df_hs_dataset *ds, int64_t i, float **buf, int64_t *cap, df_hs_scan_report *rep,
                          df_error *err) {
  const df_hs_info *in = df_hs_get_info(ds);
  int64_t len, W = (int64_t)in->num_layers * in->hidden_size, H = in->hidden_size;
  DF_TRY(df_hs_sample_length(ds, i, &len, err));
  int64_t need = len * (W + (in->has_last_hidden ? H : 0));
  if (need > *cap) {
    float *g = realloc(*buf, (size_t)need * sizeof *g);
    if (!g)
      return DF_FAIL(err, DF_ERR_NOMEM, "hidden-state scan", NULL, "out of memory for a sample of %lld rows",
                     (long long)len);
    *buf = g, *cap = need;
  }
  float *last = in->has_last_hidden ? *buf + len * W : NULL;
  df_hs_sample_bufs b = {.hidden = *buf, .last_hidden = last};
  DF_TRY(df_hs_read_sample(ds, i, 0, &b, NULL, err));
  rep->scanned++;
  df_hs_bad_value bad = {0};
  if (df_hs_find_nonfinite(*buf, len, W, last, H, &bad)) {
    df_hs_bad_value_locate(ds, i, &bad);
    df_hs_scan_add(rep, &bad);
  }
  return DF_OK;
}

df_status df_hs_scan_samples(df_hs_dataset *ds, const int64_t *samples, int64_t n, df_hs_scan_report *rep,
                             df_error *err) {
  memset(rep, 0, sizeof *rep);
  rep->total = df_hs_get_info(ds)->num_samples;
  float *buf = NULL;
  int64_t cap = 0;
  df_status st = DF_OK;
  for (int64_t j = 0; j < n && st == DF_OK; j++) st = scan_one(ds, samples[j], &buf, &cap, rep, err);
  free(buf);
  return st;
}

int64_t df_hs_scan_sampled_count(const df_hs_dataset *ds) {
  const df_hs_info *in = df_hs_get_info(ds);
  int64_t elem = in->dtype == DF_BF16 ? 2 : 4;
  int64_t row = elem * ((int64_t)in->num_layers * in->hidden_size + (in->has_last_hidden ? in->hidden_size : 0));
  int64_t m = (int64_t)DF_HS_SCAN_PER_SHARD * in->num_shards;
  // budget · N / (T · row) in double: exact enough for a count, and the Python twin computes the same
  double fit = (double)DF_HS_SCAN_BUDGET_BYTES * (double)in->num_samples / ((double)in->num_tokens * (double)row);
  int64_t by_bytes = fit < 1 ? 1 : (int64_t)fit;
  if (by_bytes < m) m = by_bytes;
  return m < in->num_samples ? m : in->num_samples;
}

df_status df_hs_scan(df_hs_dataset *ds, df_hs_scan_mode mode, df_hs_scan_report *rep, df_error *err) {
  memset(rep, 0, sizeof *rep);
  int64_t n = df_hs_get_info(ds)->num_samples;
  rep->total = n, rep->full = mode == DF_HS_SCAN_FULL;
  int64_t m = rep->full ? n : df_hs_scan_sampled_count(ds);
  float *buf = NULL;
  int64_t cap = 0;
  df_status st = DF_OK;
  for (int64_t j = 0; j < m && st == DF_OK; j++) {
    int64_t i = m == n ? j : (m > 1 ? j * (n - 1) / (m - 1) : 0);
    st = scan_one(ds, i, &buf, &cap, rep, err);
  }
  free(buf);
  return st;
}

void df_hs_bad_value_text(const df_hs_bad_value *b, char *buf, size_t n) {
  snprintf(buf, n, "shard %s: sample %lld (#%lld), token %lld: %s column %lld is %s", b->shard, (long long)b->local,
           (long long)b->sample, (long long)b->token, b->dataset, (long long)b->column,
           isnan(b->value) ? "NaN"
           : b->value > 0  ? "+Inf"
                           : "-Inf");
}

void df_hs_scan_summary(const df_hs_scan_report *rep, char *buf, size_t n) {
  if (rep->scanned == rep->total)
    snprintf(buf, n, "%lld samples", (long long)rep->scanned);
  else
    snprintf(buf, n, "%lld of %lld samples", (long long)rep->scanned, (long long)rep->total);
}

df_status df_hs_scan_fail(const df_hs_scan_report *rep, const char *what, df_error *err) {
  char first[900], sum[128];
  df_hs_bad_value_text(&rep->bad[0], first, sizeof first);
  df_hs_scan_summary(rep, sum, sizeof sum);
  const char *mode = rep->full ? "full scan" : "sampled scan";
  return DF_FAIL(err, DF_ERR_FORMAT, rep->bad[0].shard,
                 "remove or recapture those samples; tools/hidden_states.py validate --full PATH (or draftforge "
                 "inspect --full PATH) lists every one",
                 "%s: %lld sample(s) hold NaN/Inf hidden states (%s of %s); first: %.600s", what,
                 (long long)rep->bad_samples, mode, sum, first);
}

df_status df_hs_inspect(const char *path, df_hs_scan_mode mode, FILE *out, df_error *err) {
  DF_TRY(df_hs_print(path, out, err));
  df_hs_dataset *ds;
  DF_TRY(df_hs_open(path, &ds, err));
  df_hs_scan_report rep;
  df_status st = df_hs_scan(ds, mode, &rep, err);
  df_hs_close(ds);
  DF_TRY(st);
  char sum[128];
  df_hs_scan_summary(&rep, sum, sizeof sum);
  const char *how = rep.full ? "full scan" : "sampled scan";
  const char *more = rep.full || rep.scanned == rep.total ? "" : "; --full reads every sample";
  if (!rep.bad_samples) {
    fprintf(out, "non-finite values: none (%s of %s%s)\n", how, sum, more);
    return DF_OK;
  }
  fprintf(out, "non-finite values: %lld sample(s) hold NaN/Inf (%s of %s%s):\n", (long long)rep.bad_samples, how, sum,
          more);
  for (int i = 0; i < rep.nreported; i++) {
    char t[900];
    df_hs_bad_value_text(&rep.bad[i], t, sizeof t);
    fprintf(out, "  %s\n", t);
  }
  if (rep.bad_samples > rep.nreported)
    fprintf(out, "  ... and %lld more\n", (long long)(rep.bad_samples - rep.nreported));
  return df_hs_scan_fail(&rep, path, err);
}
