// A fresh EAGLE-3 run's vocabulary mapping (docs/eagle3-step.md §2), after the draft's init or warm start:
// - model.vocab_mapping_path names an existing file: its d2t / t2d (safetensors, or SpecForge's torch .pt through
//   tools/run/eagle3_vocab_pt.py);
// - else, with a draft vocabulary smaller than the target's, SpecForge's offline derivation over the whole training
//   data (strategies/eagle3/vocab.h), which replaces a warm start's mapping; with vocab_mapping_path set it is cached
//   there (.pt in torch's format for SpecForge, anything else as safetensors);
// - a draft vocabulary equal to the target's keeps the buffers (the identity, or the warm start's).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/pytools.h"
#include "modeling/safetensors.h"
#include "strategies/eagle3/eagle3.h"
#include "strategies/eagle3/vocab.h"

static bool ends_with(const char *s, const char *x) {
  const size_t n = strlen(s), k = strlen(x);
  return n >= k && !strcmp(s + n - k, x);
}

// tools/run/eagle3_vocab_pt.py MODE IN OUT: a torch .pt {"d2t", "t2d"} to safetensors, or back.
static df_status convert_pt(const char *mode, const char *in, const char *out, df_error *err) {
  char python[4096], script[4096];
  DF_TRY(df_pytools_python("torch", "torch", "a model.vocab_mapping_path in torch's .pt format",
                           "model.vocab_mapping_path", python, sizeof python, err));
  DF_TRY(df_pytools_script("eagle3_vocab_pt.py", script, sizeof script, err));
  char *const argv[] = {python, script, (char *)mode, (char *)in, (char *)out, NULL};
  pid_t pid;
  DF_TRY(df_pytools_spawn(argv, -1, NULL, NULL, &pid, err));
  int rc = -1;
  df_pytools_wait(pid, -1, &rc);
  if (rc != 0)
    return DF_FAIL(err, DF_ERR_IO, in, "check the file (a dict with d2t and t2d tensors, as SpecForge saves it)",
                   "tools/run/eagle3_vocab_pt.py %s failed (exit %d)", mode, rc);
  return DF_OK;
}

static df_status read_mapping(eagle3_run *r, const char *path, int64_t *d2t, uint8_t *t2d, df_error *err) {
  char tmp[64] = "";
  const char *file = path;
  if (ends_with(path, ".pt") || ends_with(path, ".pth")) {
    snprintf(tmp, sizeof tmp, "/tmp/draftforge-vocab-%ld.safetensors", (long)getpid());
    DF_TRY(convert_pt("to-safetensors", path, tmp, err));
    file = tmp;
  }
  df_st_file *f = NULL;
  df_status st = df_st_open(file, &f, err);
  const df_st_tensor *a = st == DF_OK ? df_st_find(f, "d2t") : NULL, *b = st == DF_OK ? df_st_find(f, "t2d") : NULL;
  if (st == DF_OK && (!a || !b || a->numel != r->D || b->numel != r->V || df_st_dtype_is_float(a->dtype)))
    st = DF_FAIL(err, DF_ERR_INVALID, path, "a mapping for this draft: d2t [draft_vocab_size] and t2d [vocab_size]",
                 "%s does not hold d2t [%lld] and t2d [%lld] integer tensors", path, (long long)r->D, (long long)r->V);
  float *buf = st == DF_OK ? malloc(sizeof(float) * (size_t)(r->V > r->D ? r->V : r->D)) : NULL;
  if (st == DF_OK && !buf) st = DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  if (st == DF_OK) st = df_st_read_f32(f, a, buf, r->D, err);
  for (int64_t i = 0; st == DF_OK && i < r->D; i++) d2t[i] = (int64_t)buf[i];
  if (st == DF_OK) st = df_st_read_f32(f, b, buf, r->V, err);
  for (int64_t i = 0; st == DF_OK && i < r->V; i++) t2d[i] = buf[i] != 0.0f;
  // one mapping: draft id d is target id d + d2t[d], ascending and in range, and t2d selects exactly those ids
  int64_t selected = 0;
  for (int64_t i = 0; st == DF_OK && i < r->V; i++) selected += t2d[i];
  for (int64_t d = 0; st == DF_OK && d < r->D; d++) {
    const int64_t t = d + d2t[d], prev = d > 0 ? d - 1 + d2t[d - 1] : -1;
    if (t < 0 || t >= r->V || t <= prev || !t2d[t] || (d == r->D - 1 && selected != r->D))
      st = DF_FAIL(err, DF_ERR_INVALID, path, "a mapping as SpecForge writes it (or remove the file to derive one)",
                   "%s: draft id %lld maps to target id %lld, which is out of range, out of order or not in t2d "
                   "(which selects %lld ids for %lld draft ids)",
                   path, (long long)d, (long long)t, (long long)selected, (long long)r->D);
  }
  free(buf);
  df_st_close(f);
  if (tmp[0]) unlink(tmp);
  return st;
}

static df_status write_mapping(const eagle3_run *r, const char *path, const int64_t *d2t, const uint8_t *t2d,
                               df_error *err) {
  char tmp[64] = "";
  const char *file = path;
  if (ends_with(path, ".pt") || ends_with(path, ".pth")) {
    snprintf(tmp, sizeof tmp, "/tmp/draftforge-vocab-%ld.safetensors", (long)getpid());
    file = tmp;
  }
  df_st_writer *w;
  DF_TRY(df_st_writer_new(&w, err));
  const int64_t dn = r->D, vn = r->V;
  df_status st = df_st_writer_add(w, "d2t", DF_ST_I64, 1, &dn, d2t, err);
  if (st == DF_OK) st = df_st_writer_add(w, "t2d", DF_ST_BOOL, 1, &vn, t2d, err);
  if (st == DF_OK) st = df_st_writer_write(w, file, err);
  df_st_writer_free(w);
  if (st == DF_OK && tmp[0]) st = convert_pt("to-pt", tmp, path, err);
  if (tmp[0]) unlink(tmp);
  return st;
}

// SpecForge's derivation over every sample of the training data, in order.
static df_status derive(eagle3_run *r, const df_strategy_data *data, int64_t *d2t, uint8_t *t2d, int64_t *npad,
                        df_error *err) {
  df_eagle3_counter c;
  DF_TRY(df_eagle3_counter_init(&c, r->V, err));
  df_status st = DF_OK;
  for (int64_t i = 0; st == DF_OK && i < data->count; i++) {
    const int32_t *ids;
    const uint8_t *mask;
    int64_t len;
    st = data->sample(data->self, i, &ids, &mask, &len, err);
    if (st == DF_OK) st = df_eagle3_counter_add(&c, ids, mask, len, i, err);
  }
  if (st == DF_OK) st = df_eagle3_vocab_from_counts(&c, r->D, d2t, t2d, NULL, npad, err);
  if (st == DF_OK && data->log)
    fprintf(data->log,
            "eagle3: draft vocabulary of %lld from %lld supervised token ids of %lld samples (%lld padded)\n",
            (long long)r->D, (long long)c.n, (long long)data->count, (long long)*npad);
  df_eagle3_counter_free(&c);
  return st;
}

df_status df_eagle3_prepare(df_strategy_run *base, const df_strategy_data *data, df_error *err) {
  eagle3_run *r = (eagle3_run *)base;
  const char *path = data && data->vocab_mapping_path && data->vocab_mapping_path[0] ? data->vocab_mapping_path : NULL;
  struct stat sb;
  const bool have_file = path && stat(path, &sb) == 0;
  if (!have_file && r->D == r->V) return DF_OK; // SpecForge keeps the buffers
  if (!have_file && !data)
    return DF_FAIL(err, DF_ERR_INVALID, "model.vocab_mapping_path", "give the run its training data",
                   "the vocabulary mapping needs the training data or a mapping file");
  int64_t *d2t = malloc(sizeof *d2t * (size_t)r->D), npad = 0;
  uint8_t *t2d = malloc((size_t)r->V);
  df_status st = d2t && t2d ? DF_OK : DF_FAIL(err, DF_ERR_NOMEM, "vocabulary", NULL, "out of memory");
  if (st == DF_OK && have_file) {
    st = read_mapping(r, path, d2t, t2d, err);
    if (st == DF_OK && data && data->log) fprintf(data->log, "eagle3: vocabulary mapping from %s\n", path);
  } else if (st == DF_OK) {
    st = derive(r, data, d2t, t2d, &npad, err);
    if (st == DF_OK && path && data->write_files) {
      st = write_mapping(r, path, d2t, t2d, err);
      if (st == DF_OK && data->log) fprintf(data->log, "eagle3: vocabulary mapping cached at %s\n", path);
    }
  }
  if (st == DF_OK) st = df_eagle3_run_vocab_write(r, d2t, t2d, err);
  if (st == DF_OK) st = df_eagle3_sync_vocab(r, err);
  free(d2t), free(t2d);
  return st;
}
