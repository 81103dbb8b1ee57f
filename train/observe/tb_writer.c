// TensorBoard event files: Event protos packed by protobuf-c, framed as TFRecords
// (u64 length, masked CRC-32C of the length, data, masked CRC-32C of the data), flushed per record.
#include "train/observe/tb_writer.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/fsutil.h"
#include "tb_event.pb-c.h"

struct df_tb_writer {
  FILE *fp;
  char path[4400];
};

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static df_status write_record(df_tb_writer *w, const uint8_t *data, size_t n, df_error *err) {
  unsigned char head[12], tail[4];
  put_le(head, n, 8);
  put_le(head + 8, df_crc32c_mask(df_crc32c(0, head, 8)), 4);
  put_le(tail, df_crc32c_mask(df_crc32c(0, data, n)), 4);
  bool ok = fwrite(head, 1, sizeof head, w->fp) == sizeof head && fwrite(data, 1, n, w->fp) == n &&
            fwrite(tail, 1, sizeof tail, w->fp) == sizeof tail && fflush(w->fp) == 0;
  return ok ? DF_OK
            : DF_FAIL(err, DF_ERR_IO, w->path, "check the disk", "cannot write %s: %s", w->path, strerror(errno));
}

static df_status write_event(df_tb_writer *w, const Dftb__Event *ev, df_error *err) {
  size_t n = dftb__event__get_packed_size(ev);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return DF_FAIL(err, DF_ERR_NOMEM, w->path, NULL, "out of memory for a TensorBoard event");
  dftb__event__pack(ev, buf);
  df_status st = write_record(w, buf, n, err);
  free(buf);
  return st;
}

// ---- summaries under construction --------------------------------------------------------------------------

// The values of one Summary and everything they point to (tags, histograms), freed together.
typedef struct {
  Dftb__Summary__Value **v;
  size_t n, cap;
  bool nomem;
} value_list;

static Dftb__Summary__Value *value_add(value_list *l, const char *tag) {
  if (l->nomem) return NULL;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    Dftb__Summary__Value **grown = realloc(l->v, cap * sizeof *grown);
    if (!grown) {
      l->nomem = true;
      return NULL;
    }
    l->v = grown, l->cap = cap;
  }
  Dftb__Summary__Value *v = malloc(sizeof *v);
  char *t = strdup(tag);
  if (!v || !t) {
    free(v), free(t);
    l->nomem = true;
    return NULL;
  }
  dftb__summary__value__init(v);
  v->tag = t;
  return l->v[l->n++] = v;
}

static void value_scalar(value_list *l, const char *tag, double x) {
  if (!isfinite(x)) return; // JSON's null; TensorBoard would draw a NaN as a gap anyway
  Dftb__Summary__Value *v = value_add(l, tag);
  if (!v) return;
  v->value_case = DFTB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
  v->simple_value = (float)x;
}

static void value_index_histogram(value_list *l, const char *tag, const double *w, int64_t n) {
  Dftb__HistogramProto *h = malloc(sizeof *h);
  double *lim = malloc((size_t)(n ? n : 1) * sizeof *lim), *bkt = malloc((size_t)(n ? n : 1) * sizeof *bkt);
  Dftb__Summary__Value *v = h && lim && bkt ? value_add(l, tag) : NULL;
  if (!v) {
    free(h), free(lim), free(bkt);
    l->nomem = true;
    return;
  }
  dftb__histogram_proto__init(h);
  h->min = 0, h->max = (double)(n > 0 ? n - 1 : 0);
  for (int64_t i = 0; i < n; i++) {
    double x = isfinite(w[i]) ? w[i] : 0.0;
    lim[i] = (double)i + 0.5, bkt[i] = x;
    h->num += x, h->sum += x * (double)i, h->sum_squares += x * (double)i * (double)i;
  }
  h->n_bucket_limit = h->n_bucket = (size_t)n;
  h->bucket_limit = lim, h->bucket = bkt;
  v->value_case = DFTB__SUMMARY__VALUE__VALUE_HISTO;
  v->histo = h;
}

static void value_list_free(value_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    Dftb__Summary__Value *v = l->v[i];
    if (v->value_case == DFTB__SUMMARY__VALUE__VALUE_HISTO) {
      free(v->histo->bucket_limit), free(v->histo->bucket);
      free(v->histo);
    }
    free(v->tag);
    free(v);
  }
  free(l->v);
  memset(l, 0, sizeof *l);
}

static df_status write_values(df_tb_writer *w, int64_t step, value_list *l, df_error *err) {
  if (l->nomem) return DF_FAIL(err, DF_ERR_NOMEM, w->path, NULL, "out of memory for a TensorBoard summary");
  if (!l->n) return DF_OK;
  Dftb__Summary sum = DFTB__SUMMARY__INIT;
  sum.n_value = l->n, sum.value = l->v;
  Dftb__Event ev = DFTB__EVENT__INIT;
  ev.wall_time = wall_now(), ev.step = step;
  ev.what_case = DFTB__EVENT__WHAT_SUMMARY, ev.summary = &sum;
  return write_event(w, &ev, err);
}

// ---- public API ----------------------------------------------------------------------------------------------

static df_status write_session_start(df_tb_writer *w, int64_t step, df_error *err) {
  Dftb__SessionLog sl = DFTB__SESSION_LOG__INIT;
  sl.status = DFTB__SESSION_LOG__SESSION_STATUS__START;
  sl.msg = "draftforge resumed";
  Dftb__Event ev = DFTB__EVENT__INIT;
  ev.wall_time = wall_now(), ev.step = step;
  ev.what_case = DFTB__EVENT__WHAT_SESSION_LOG, ev.session_log = &sl;
  return write_event(w, &ev, err);
}

df_status df_tb_open(const char *dir, int64_t resume_step, df_tb_writer **out, df_error *err) {
  *out = NULL;
  DF_TRY(df_mkdirs(dir, "check output_dir and its permissions", err));
  df_tb_writer *w = calloc(1, sizeof *w);
  if (!w) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  double now = wall_now();
  // TensorFlow's naming (time, host, pid, counter); "x" never reopens an existing file
  for (int i = 0; i < 1000 && !w->fp; i++) {
    snprintf(w->path, sizeof w->path, "%.4000s/events.out.tfevents.%010lld.%.200s.%ld.%d", dir, (long long)now, host,
             (long)getpid(), i);
    w->fp = fopen(w->path, "wbx");
    if (!w->fp && errno != EEXIST) break;
  }
  if (!w->fp) {
    df_status st = DF_FAIL(err, DF_ERR_IO, dir, "check output_dir and its permissions",
                           "cannot create a TensorBoard event file in %s: %s", dir, strerror(errno));
    free(w);
    return st;
  }
  Dftb__Event ev = DFTB__EVENT__INIT;
  ev.wall_time = now;
  ev.what_case = DFTB__EVENT__WHAT_FILE_VERSION, ev.file_version = "brain.Event:2";
  df_status st = write_event(w, &ev, err);
  if (st == DF_OK && resume_step > 0) st = write_session_start(w, resume_step + 1, err);
  if (st != DF_OK) {
    df_tb_close(w);
    return st;
  }
  *out = w;
  return DF_OK;
}

void df_tb_close(df_tb_writer *w) {
  if (!w) return;
  if (w->fp) fclose(w->fp);
  free(w);
}

const char *df_tb_path(const df_tb_writer *w) { return w->path; }

df_status df_tb_scalar(df_tb_writer *w, const char *tag, int64_t step, double value, df_error *err) {
  value_list l = {0};
  value_scalar(&l, tag, value);
  df_status st = write_values(w, step, &l, err);
  value_list_free(&l);
  return st;
}

df_status df_tb_index_histogram(df_tb_writer *w, const char *tag, int64_t step, const double *weights, int64_t n,
                                df_error *err) {
  value_list l = {0};
  value_index_histogram(&l, tag, weights, n);
  df_status st = write_values(w, step, &l, err);
  value_list_free(&l);
  return st;
}

df_status df_tb_text(df_tb_writer *w, const char *tag, int64_t step, const char *text, df_error *err) {
  Dftb__SummaryMetadata__PluginData pd = DFTB__SUMMARY_METADATA__PLUGIN_DATA__INIT;
  pd.plugin_name = "text";
  Dftb__SummaryMetadata md = DFTB__SUMMARY_METADATA__INIT;
  md.plugin_data = &pd;
  Dftb__TensorShapeProto shape = DFTB__TENSOR_SHAPE_PROTO__INIT; // a scalar string tensor: no dims
  ProtobufCBinaryData s = {.len = strlen(text), .data = (uint8_t *)text};
  Dftb__TensorProto t = DFTB__TENSOR_PROTO__INIT;
  t.dtype = 7, t.tensor_shape = &shape, t.n_string_val = 1, t.string_val = &s;
  Dftb__Summary__Value v = DFTB__SUMMARY__VALUE__INIT;
  v.tag = (char *)tag, v.metadata = &md;
  v.value_case = DFTB__SUMMARY__VALUE__VALUE_TENSOR, v.tensor = &t;
  Dftb__Summary__Value *vp = &v;
  Dftb__Summary sum = DFTB__SUMMARY__INIT;
  sum.n_value = 1, sum.value = &vp;
  Dftb__Event ev = DFTB__EVENT__INIT;
  ev.wall_time = wall_now(), ev.step = step;
  ev.what_case = DFTB__EVENT__WHAT_SUMMARY, ev.summary = &sum;
  return write_event(w, &ev, err);
}

// moe/expert_load: {"<layer>": [share, ...]} → a histogram and the max/min load ratios per layer.
static void moe_load_values(value_list *l, const json_t *obj) {
  const char *layer;
  const json_t *arr;
  json_object_foreach((json_t *)obj, layer, arr) {
    const int64_t E = (int64_t)json_array_size(arr);
    double *w = malloc((size_t)(E ? E : 1) * sizeof *w);
    if (!w) {
      l->nomem = true;
      return;
    }
    double mx = -INFINITY, mn = INFINITY;
    for (int64_t e = 0; e < E; e++) {
      const json_t *x = json_array_get(arr, (size_t)e);
      w[e] = json_is_number(x) ? json_number_value(x) : 0.0;
      mx = fmax(mx, w[e]), mn = fmin(mn, w[e]);
    }
    char tag[256];
    snprintf(tag, sizeof tag, "moe/expert_load/layer_%.32s", layer);
    value_index_histogram(l, tag, w, E);
    snprintf(tag, sizeof tag, "moe/layer_%.32s/load_max_ratio", layer);
    value_scalar(l, tag, E ? mx * (double)E : NAN);
    snprintf(tag, sizeof tag, "moe/layer_%.32s/load_min_ratio", layer);
    value_scalar(l, tag, E ? mn * (double)E : NAN);
    free(w);
  }
}

df_status df_tb_metrics_line(df_tb_writer *w, const json_t *line, df_error *err) {
  const json_t *s = json_object_get(line, "step");
  if (!json_is_integer(s)) return DF_OK; // every trainer line has one; anything else is not a point on a chart
  value_list l = {0};
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)line, key, v) {
    if (!strcmp(key, "step")) continue;
    if (json_is_number(v)) {
      value_scalar(&l, key, json_number_value(v));
    } else if (json_is_boolean(v)) {
      value_scalar(&l, key, json_is_true(v) ? 1.0 : 0.0);
    } else if (json_is_array(v)) {
      size_t i;
      const json_t *x;
      json_array_foreach(v, i, x) {
        if (!json_is_number(x)) continue;
        char tag[256];
        snprintf(tag, sizeof tag, "%.200s/%zu", key, i);
        value_scalar(&l, tag, json_number_value(x));
      }
    } else if (json_is_object(v) && !strcmp(key, "moe/expert_load")) {
      moe_load_values(&l, v);
    }
  }
  df_status st = write_values(w, json_integer_value(s), &l, err);
  value_list_free(&l);
  return st;
}
