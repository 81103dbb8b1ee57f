// The parameter table: entries in the order the model adds them, a sorted name index, aligned offsets.
#include "modeling/param_table.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h" // DF_PARAM_TRAIN, DF_PARAM_DECAY

struct df_params {
  df_param *e;
  int n, cap;
  df_param **by_name; // sorted by name, built at finalize
  int64_t numel, param_numel;
  bool final;
  // Mixed precision (df_params_set_compute): binds of `masters` give weight views into `compute` instead.
  const float *masters;
  void *compute;
  df_dtype compute_dt;
};

const char *df_param_role_name(df_param_role r) {
  switch (r) {
  case DF_ROLE_WEIGHT: return "weight";
  case DF_ROLE_BIAS: return "bias";
  case DF_ROLE_NORM: return "norm";
  case DF_ROLE_EMBED: return "embed";
  case DF_ROLE_ROUTER: return "router";
  case DF_ROLE_BUFFER: return "buffer";
  }
  return "?";
}

df_status df_params_new(df_params **out, df_error *err) {
  *out = calloc(1, sizeof **out);
  if (!*out) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "out of memory");
  return DF_OK;
}

void df_params_free(df_params *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) free((char *)p->e[i].name);
  free(p->e);
  free(p->by_name);
  free(p);
}

static df_status check_spec(const df_params *p, const df_param_spec *s, df_param *e, df_error *err) {
  const char *name = s->name ? s->name : "";
  if (p->final)
    return DF_FAIL(err, DF_ERR_INVALID, name, "add every parameter before df_params_finalize",
                   "parameter '%s' added to a finalized table", name);
  if (!name[0]) return DF_FAIL(err, DF_ERR_INVALID, name, "name every parameter", "parameter without a name");
  if (s->ndim < 0 || s->ndim > DF_MAX_DIMS || (s->ndim && !s->shape))
    return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "parameter '%s': %d dimensions (0..%d allowed)", name, s->ndim,
                   DF_MAX_DIMS);
  e->ndim = s->ndim;
  e->numel = 1;
  for (int i = 0; i < s->ndim; i++) {
    if (s->shape[i] < 0 || (s->shape[i] && e->numel > (INT64_MAX / 4) / s->shape[i]))
      return DF_FAIL(err, DF_ERR_INVALID, name, NULL, "parameter '%s': bad dimension %d = %lld", name, i,
                     (long long)s->shape[i]);
    e->shape[i] = s->shape[i];
    e->numel *= s->shape[i];
  }
  return DF_OK;
}

df_status df_params_add(df_params *p, const df_param_spec *spec, df_error *err) {
  df_param e = {
      .dtype = spec->dtype, .role = spec->role, .trainable = spec->trainable, .weight_decay = spec->weight_decay};
  DF_TRY(check_spec(p, spec, &e, err));
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 32;
    df_param *q = realloc(p->e, sizeof *q * (size_t)cap);
    if (!q) return DF_FAIL(err, DF_ERR_NOMEM, spec->name, NULL, "out of memory");
    p->e = q;
    p->cap = cap;
  }
  if (!(e.name = strdup(spec->name))) return DF_FAIL(err, DF_ERR_NOMEM, spec->name, NULL, "out of memory");
  p->e[p->n++] = e;
  return DF_OK;
}

static int cmp_name(const void *a, const void *b) {
  return strcmp((*(df_param *const *)a)->name, (*(df_param *const *)b)->name);
}

df_status df_params_finalize(df_params *p, df_error *err) {
  if (p->final) return DF_OK;
  p->by_name = malloc(sizeof *p->by_name * (size_t)(p->n + 1));
  if (!p->by_name) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "out of memory");
  for (int i = 0; i < p->n; i++) p->by_name[i] = &p->e[i];
  qsort(p->by_name, (size_t)p->n, sizeof *p->by_name, cmp_name);
  for (int i = 1; i < p->n; i++)
    if (!strcmp(p->by_name[i]->name, p->by_name[i - 1]->name)) {
      const char *dup = p->by_name[i]->name;
      free(p->by_name);
      p->by_name = NULL;
      return DF_FAIL(err, DF_ERR_INVALID, dup, "each parameter name appears once", "parameter '%s' added twice", dup);
    }
  int64_t off = 0, used = 0;
  for (int i = 0; i < p->n; i++) {
    p->e[i].offset = off;
    off += (p->e[i].numel + DF_PARAMS_ALIGN_ELEMS - 1) / DF_PARAMS_ALIGN_ELEMS * DF_PARAMS_ALIGN_ELEMS;
    used += p->e[i].numel;
  }
  p->numel = off;
  p->param_numel = used;
  p->final = true;
  return DF_OK;
}

bool df_params_is_final(const df_params *p) { return p->final; }
int64_t df_params_numel(const df_params *p) { return p->numel; }
int64_t df_params_param_numel(const df_params *p) { return p->param_numel; }
int df_params_count(const df_params *p) { return p->n; }
const df_param *df_params_at(const df_params *p, int i) { return i >= 0 && i < p->n ? &p->e[i] : NULL; }

const df_param *df_params_find(const df_params *p, const char *name) {
  if (!p->final) return NULL;
  int lo = 0, hi = p->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2, c = strcmp(name, p->by_name[mid]->name);
    if (c == 0) return p->by_name[mid];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

df_tensor df_params_view_on(const df_param *e, float *flat, df_device dev) {
  return df_view(flat + e->offset, DF_F32, dev, e->ndim, e->shape);
}

df_tensor df_params_view(const df_param *e, float *flat) { return df_params_view_on(e, flat, DF_DEV_CPU); }

df_status df_params_view_named(const df_params *p, const char *name, float *flat, df_tensor *out, df_error *err) {
  if (!p->final)
    return DF_FAIL(err, DF_ERR_INVALID, name, "call df_params_finalize first", "parameter table not finalized");
  const df_param *e = df_params_find(p, name);
  if (!e) return DF_FAIL(err, DF_ERR_INVALID, name, "check the parameter name", "no parameter '%s'", name);
  *out = df_params_view(e, flat);
  return DF_OK;
}

df_status df_params_bind_masters(const df_params *p, const char *name, float *weights, float *grads, df_device dev,
                                 df_tensor *w, df_tensor *g, df_error *err) {
  DF_TRY(df_params_view_named(p, name, weights, w, err));
  DF_TRY(df_params_view_named(p, name, grads, g, err));
  w->device = g->device = dev; // views of the flat buffers, which live on the context's device
  return DF_OK;
}

void df_params_optim_mask(const df_params *p, uint8_t *mask) {
  memset(mask, 0, (size_t)p->numel);
  for (int i = 0; i < p->n; i++) {
    const df_param *e = &p->e[i];
    if (e->trainable)
      memset(mask + e->offset, DF_PARAM_TRAIN | (e->weight_decay ? DF_PARAM_DECAY : 0), (size_t)e->numel);
  }
}

df_status df_params_bind(const df_params *p, const char *name, float *weights, float *grads, df_device dev,
                         df_tensor *w, df_tensor *g, df_error *err) {
  DF_TRY(df_params_bind_masters(p, name, weights, grads, dev, w, g, err));
  if (p->compute && weights == p->masters) { // the forward's copy, same element offsets
    w->data = (char *)p->compute + ((float *)w->data - weights) * (int64_t)df_dtype_size(p->compute_dt);
    w->dtype = p->compute_dt;
  }
  return DF_OK;
}

void df_params_set_compute(df_params *p, const float *masters, void *compute, df_dtype dt) {
  p->masters = masters, p->compute = compute, p->compute_dt = dt;
}

df_status df_params_add_buffer(df_params *p, const char *name, df_dtype dt, int64_t n, df_error *err) {
  const df_param_spec s = {.name = name, .role = DF_ROLE_BUFFER, .ndim = 1, .shape = &n, .dtype = dt};
  return df_params_add(p, &s, err);
}

df_status df_params_add_f32(df_params *p, const char *name, df_param_role role, int ndim, int64_t d0, int64_t d1,
                            df_error *err) {
  const int64_t shape[2] = {d0, d1};
  const df_param_spec spec = {.name = name,
                              .role = role,
                              .ndim = ndim,
                              .shape = shape,
                              .dtype = DF_F32,
                              .trainable = true,
                              .weight_decay = role == DF_ROLE_WEIGHT || role == DF_ROLE_EMBED};
  return df_params_add(p, &spec, err);
}
