// metrics.jsonl I/O and the progress line. Lines are written whole and flushed, so a crash loses at most the
// line being written; a resume drops the lines past its checkpoint so the file reads like one straight run.
#include "train/observe/metrics_log.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json_write.h"
#include "train/observe/tb_writer.h"

static const char *const TIMING_KEYS[] = {"tokens_per_s", "step_time_s", "data_wait_s", "eval_time_s",
                                          "elapsed_s",    "eta_s",       NULL};

bool df_metrics_is_timing_key(const char *key) {
  for (int i = 0; TIMING_KEYS[i]; i++)
    if (!strcmp(key, TIMING_KEYS[i])) return true;
  return false;
}

void df_metrics_strip_timing(json_t *line) {
  for (int i = 0; TIMING_KEYS[i]; i++) json_object_del(line, TIMING_KEYS[i]);
}

json_t *df_metrics_real(double x) { return isfinite(x) ? json_real(x) : json_null(); }

// Copies the lines of path whose step is <= keep_through into tmp.
static bool copy_kept(const char *path, FILE *out, int64_t keep_through) {
  FILE *in = fopen(path, "r");
  if (!in) return errno == ENOENT;
  char *line = NULL;
  size_t cap = 0;
  bool ok = true;
  for (ssize_t len; ok && (len = getline(&line, &cap, in)) > 0;) {
    json_t *o = json_loadb(line, (size_t)len, 0, NULL);
    json_t *s = o ? json_object_get(o, "step") : NULL;
    bool keep = s && json_is_integer(s) && json_integer_value(s) <= keep_through;
    json_decref(o);
    if (keep)
      ok = fwrite(line, 1, (size_t)len, out) == (size_t)len && (line[len - 1] == '\n' || fputc('\n', out) != EOF);
  }
  free(line);
  ok = !ferror(in) && ok;
  fclose(in);
  return ok;
}

df_status df_metrics_open(df_metrics_log *l, const char *output_dir, int64_t keep_through, df_error *err) {
  memset(l, 0, sizeof *l);
  snprintf(l->path, sizeof l->path, "%s/metrics.jsonl", output_dir);
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", l->path, (long)getpid());
  FILE *out = fopen(tmp, "w");
  bool ok = out && (keep_through <= 0 || copy_kept(l->path, out, keep_through));
  ok = out && fflush(out) == 0 && fsync(fileno(out)) == 0 && ok;
  if (out) ok = fclose(out) == 0 && ok;
  if (ok) ok = rename(tmp, l->path) == 0;
  if (!ok) {
    remove(tmp);
    return DF_FAIL(err, DF_ERR_IO, l->path, "check output_dir", "cannot rewrite %s: %s", l->path, strerror(errno));
  }
  l->fp = fopen(l->path, "a");
  if (!l->fp) return DF_FAIL(err, DF_ERR_IO, l->path, "check output_dir", "cannot open %s", l->path);
  return DF_OK;
}

df_status df_metrics_append(df_metrics_log *l, const json_t *obj, df_error *err) {
  char *text = df_json_dumps(obj, JSON_COMPACT);
  bool ok = text && fputs(text, l->fp) != EOF && fputc('\n', l->fp) != EOF && fflush(l->fp) == 0;
  free(text);
  if (!ok) return DF_FAIL(err, DF_ERR_IO, l->path, "check the disk", "cannot append to %s", l->path);
  return l->tb ? df_tb_metrics_line(l->tb, obj, err) : DF_OK;
}

void df_metrics_close(df_metrics_log *l) {
  if (l->fp) fclose(l->fp);
  df_tb_close(l->tb);
  l->fp = NULL, l->tb = NULL;
}

static void human_rate(double x, char *buf, size_t n) {
  if (!isfinite(x) || x < 0)
    snprintf(buf, n, "-");
  else if (x >= 1e6)
    snprintf(buf, n, "%.1fM", x / 1e6);
  else if (x >= 1e3)
    snprintf(buf, n, "%.1fk", x / 1e3);
  else
    snprintf(buf, n, "%.0f", x);
}

void df_progress_format(const df_progress *p, char *buf, size_t n) {
  char rate[32], eta[32] = "-";
  human_rate(p->tokens_per_s, rate, sizeof rate);
  if (isfinite(p->eta_s) && p->eta_s >= 0) {
    long long s = (long long)(p->eta_s + 0.5);
    snprintf(eta, sizeof eta, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  }
  if (p->skipped) {
    snprintf(buf, n, "step %lld/%lld | ep %lld | SKIPPED (non-finite loss or gradient norm) | lr %.2e | ETA %s",
             (long long)p->step, (long long)p->stop, (long long)p->epoch, p->lr, eta);
    return;
  }
  snprintf(buf, n,
           "step %lld/%lld | ep %lld | loss %.4f | acc %.4f | tau %.2f | lr %.2e | gnorm %.3f | %s tok/s | ETA %s",
           (long long)p->step, (long long)p->stop, (long long)p->epoch, p->loss, p->acc, p->tau, p->lr, p->grad_norm,
           rate, eta);
}
