#include "tests/common/fixture.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

static bool dtype_from_name(const char *s, df_dtype *dt) {
  static const struct {
    const char *name;
    df_dtype dt;
  } map[] = {{"F32", DF_F32}, {"F64", DF_F64}, {"I32", DF_I32}, {"I64", DF_I64}, {"U8", DF_U8}, {"BOOL", DF_BOOL}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(s, map[i].name)) {
      *dt = map[i].dt;
      return true;
    }
  return false;
}

// The test-side reader only needs well-formed files from our own generator; the product's validating
// safetensors reader lives in modeling/ (I/O issue).
fx_file *fx_load(const char *relpath) {
  fx_file *f = calloc(1, sizeof *f);
  // DF_FIXTURE_DIR in the environment overrides the build's path (a prebuilt GPU suite run from another checkout).
  const char *dir = getenv("DF_FIXTURE_DIR");
  snprintf(f->path, sizeof f->path, "%s/%s", dir && *dir ? dir : DF_FIXTURE_DIR, relpath);
  FILE *fp = fopen(f->path, "rb");
  cr_assert_not_null(fp, "cannot open fixture %s (regenerate with tools/gen_kernel_fixtures.py)", f->path);
  uint64_t hlen = 0;
  cr_assert_eq(fread(&hlen, 8, 1, fp), 1, "%s: short header", f->path);
  char *hdr = malloc(hlen + 1);
  cr_assert_eq(fread(hdr, 1, hlen, fp), hlen, "%s: short header", f->path);
  hdr[hlen] = 0;
  json_error_t jerr;
  json_t *root = json_loads(hdr, 0, &jerr);
  cr_assert_not_null(root, "%s: bad header JSON: %s", f->path, jerr.text);
  free(hdr);
  long data_start = (long)(8 + hlen);
  f->t = calloc(json_object_size(root), sizeof(fx_tensor));
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (!strcmp(key, "__metadata__")) {
      f->meta = json_incref(val);
      continue;
    }
    fx_tensor *t = &f->t[f->n++];
    snprintf(t->name, sizeof t->name, "%s", key);
    cr_assert(dtype_from_name(json_string_value(json_object_get(val, "dtype")), &t->dtype), "%s: %s: dtype", f->path,
              key);
    json_t *shape = json_object_get(val, "shape");
    t->ndim = (int)json_array_size(shape);
    cr_assert_leq(t->ndim, DF_MAX_DIMS, "%s: %s: too many dims", f->path, key);
    for (int i = 0; i < t->ndim; i++) t->shape[i] = json_integer_value(json_array_get(shape, (size_t)i));
    json_t *off = json_object_get(val, "data_offsets");
    int64_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    cr_assert_eq(e - b, fx_numel(t) * (int64_t)df_dtype_size(t->dtype), "%s: %s: size", f->path, key);
    t->data = aligned_alloc(64, (size_t)((e - b + 63) / 64 * 64 + 64));
    fseek(fp, data_start + b, SEEK_SET);
    cr_assert_eq(fread(t->data, 1, (size_t)(e - b), fp), (size_t)(e - b), "%s: %s: short data", f->path, key);
  }
  json_decref(root);
  fclose(fp);
  return f;
}

void fx_free(fx_file *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free(f->t[i].data);
  free(f->t);
  json_decref(f->meta);
  free(f);
}

int64_t fx_numel(const fx_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

bool fx_has(const fx_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return true;
  return false;
}

const fx_tensor *fx_get(const fx_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->t[i].name, name)) return &f->t[i];
  cr_assert_fail("fixture %s has no tensor '%s'", f->path, name);
  return NULL;
}

df_tensor fx_view(const fx_file *f, const char *name) {
  const fx_tensor *t = fx_get(f, name);
  return df_view(t->data, t->dtype, DF_DEV_CPU, t->ndim, t->shape);
}

double fx_meta(const fx_file *f, const char *key) {
  json_t *v = f->meta ? json_object_get(f->meta, key) : NULL;
  cr_assert_not_null(v, "fixture %s has no metadata '%s'", f->path, key);
  return json_is_string(v) ? strtod(json_string_value(v), NULL) : json_number_value(v);
}

void df_expect_close(const char *what, const float *got, const float *want, int64_t n, double rtol, double atol) {
  double maxref = 0.0, worst = -1.0;
  int64_t wi = -1;
  for (int64_t i = 0; i < n; i++) maxref = fmax(maxref, fabs((double)want[i]));
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (isnan(got[i]) != isnan(want[i])) d = INFINITY;
    if (d > worst) {
      worst = d;
      wi = i;
    }
  }
  double tol = atol + rtol * maxref;
  cr_expect_leq(worst, tol, "%s: max |diff| %.3g at [%lld] (got %.9g, want %.9g) > tol %.3g (max|ref| %.3g)", what,
                worst, (long long)wi, wi >= 0 ? got[wi] : 0.0, wi >= 0 ? want[wi] : 0.0, tol, maxref);
}

void df_expect_close_elementwise(const char *what, const float *got, const float *want, int64_t n, double rtol,
                                 double atol) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (!(d <= atol + rtol * fabs((double)want[i]))) {
      if (first < 0) first = i;
      bad++;
    }
  }
  cr_expect_eq(bad, 0, "%s: %lld of %lld elements off; first at [%lld]: got %.9g want %.9g", what, (long long)bad,
               (long long)n, (long long)first, first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
}

void df_fd_check(const char *what, float *x, const float *grad, int64_t n, df_fd_loss_fn f, void *ctx, double h,
                 double rtol, double atol, int max_checks) {
  double gmax = 0.0;
  for (int64_t i = 0; i < n; i++) gmax = fmax(gmax, fabs((double)grad[i]));
  int64_t step = n <= max_checks ? 1 : n / max_checks;
  int checked = 0;
  for (int64_t i = 0; i < n && checked < max_checks; i += step, checked++) {
    float x0 = x[i];
    x[i] = (float)(x0 + h);
    double hp = (double)x[i] - x0; // the step actually taken in fp32
    double fp = f(ctx);
    x[i] = (float)(x0 - h);
    double hm = x0 - (double)x[i];
    double fm = f(ctx);
    x[i] = x0;
    double fd = (fp - fm) / (hp + hm);
    double d = fabs(fd - (double)grad[i]);
    cr_expect_leq(d, atol + rtol * gmax, "%s: finite difference at [%lld]: fd %.7g vs analytic %.7g (max|g| %.3g)",
                  what, (long long)i, fd, (double)grad[i], gmax);
  }
}

void df_test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
  }
}

df_ctx *df_test_strict_fake_ctx(int num_threads) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_FAKE, .num_threads = num_threads, .backend = df_fake_strict_backend()};
  DF_ASSERT_OK(df_ctx_create(&o, &ctx, &err), &err);
  return ctx;
}

df_ctx *df_test_cpu_ctx(int num_threads) {
  df_ctx *ctx = NULL;
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_CPU, .num_threads = num_threads};
  df_status st = df_ctx_create(&o, &ctx, &err);
  DF_ASSERT_OK(st, &err);
  return ctx;
}
