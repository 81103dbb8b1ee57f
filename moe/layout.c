// Checkpoint layouts at the file boundary: file-name mapping, the strict layout-aware loader and the saver.
// The loader validates the whole mapping (file tensors ↔ parameter slices) before copying anything.
#include "moe/layout.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/registry.h"

static const char EXPERT_MARK[] = "{e}";

const df_moe_layout *df_moe_layout_find(const char *name) {
  const df_moe_reg_entry *e = df_moe_registry_find(DF_MOE_REG_LAYOUT, name);
  return e ? (const df_moe_layout *)e->impl : NULL;
}

const df_moe_layout *df_moe_layout_of(const df_moe_config *m) { return m ? df_moe_layout_find(m->moe_layout) : NULL; }

static const char *suffix_of(const df_moe_layout *l, df_moe_tensor t) {
  return l->file[t] ? l->file[t] : df_moe_tensor_suffix(t);
}

bool df_moe_layout_splits(const df_moe_layout *l, df_moe_tensor t) {
  return df_moe_tensor_is_stacked(t) && strstr(suffix_of(l, t), EXPERT_MARK) != NULL;
}

const char *df_moe_layout_file_name(const df_moe_layout *l, int64_t layer, df_moe_tensor t, int64_t expert, char *buf,
                                    size_t n) {
  const char *s = suffix_of(l, t), *mark = strstr(s, EXPERT_MARK);
  if (mark && df_moe_tensor_is_stacked(t))
    snprintf(buf, n, "layers.%" PRId64 ".mlp.%.*s%" PRId64 "%s", layer, (int)(mark - s), s, expert,
             mark + sizeof EXPERT_MARK - 1);
  else
    snprintf(buf, n, "layers.%" PRId64 ".mlp.%s", layer, s);
  return buf;
}

// A canonical non-negative decimal ("0", "17"; not "", "07", "+1") at *p; advances *p past it.
static bool parse_index(const char **p, int64_t *out) {
  const char *s = *p;
  if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return false;
  int64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    if (v > (INT64_MAX - 9) / 10) return false;
    v = 10 * v + (*s - '0');
  }
  *p = s;
  *out = v;
  return true;
}

// Whether rest matches the suffix pattern (with at most one "{e}"); sets *expert (-1 without "{e}").
static bool match_suffix(const char *pattern, bool stacked, const char *rest, int64_t *expert) {
  const char *mark = stacked ? strstr(pattern, EXPERT_MARK) : NULL;
  *expert = -1;
  if (!mark) return !strcmp(pattern, rest);
  size_t pre = (size_t)(mark - pattern);
  if (strncmp(rest, pattern, pre)) return false;
  const char *p = rest + pre;
  if (!parse_index(&p, expert)) return false;
  return !strcmp(p, mark + sizeof EXPERT_MARK - 1);
}

// "layers.{i}.mlp.<rest>": sets *layer and returns rest, or NULL.
static const char *split_layer(const char *name, int64_t *layer) {
  static const char pre[] = "layers.";
  if (strncmp(name, pre, sizeof pre - 1)) return NULL;
  const char *p = name + sizeof pre - 1;
  if (!parse_index(&p, layer) || strncmp(p, ".mlp.", 5)) return NULL;
  return p + 5;
}

bool df_moe_layout_parse(const df_moe_layout *l, const df_moe_config *m, const char *name, int64_t *layer,
                         df_moe_tensor *t, int64_t *expert) {
  const char *rest = split_layer(name, layer);
  if (!rest) return false;
  for (int k = 0; k < DF_MOE_T_COUNT; k++)
    if ((!m || df_moe_tensor_present(m, (df_moe_tensor)k)) &&
        match_suffix(suffix_of(l, (df_moe_tensor)k), df_moe_tensor_is_stacked((df_moe_tensor)k), rest, expert)) {
      *t = (df_moe_tensor)k;
      return true;
    }
  return false;
}

df_status df_moe_layout_check(const df_moe_layout *l, const df_moe_config *m, const char *where, df_error *err) {
  for (int a = 0; a < DF_MOE_T_COUNT; a++) {
    const df_moe_tensor ta = (df_moe_tensor)a;
    const char *sa = suffix_of(l, ta), *mark = strstr(sa, EXPERT_MARK);
    if (mark && (!df_moe_tensor_is_stacked(ta) || strstr(mark + 1, EXPERT_MARK)))
      return DF_FAIL(err, DF_ERR_INVALID, where, "fix the layout's table: \"{e}\" marks the expert of a stacked tensor",
                     "layout '%s': file name '%s' of %s has a misplaced \"{e}\"", l->name, sa,
                     df_moe_tensor_suffix(ta));
    if (!df_moe_tensor_present(m, ta)) continue;
    for (int b = 0; b < a; b++) {
      const df_moe_tensor tb = (df_moe_tensor)b;
      if (df_moe_tensor_present(m, tb) && !strcmp(sa, suffix_of(l, tb)))
        return DF_FAIL(err, DF_ERR_INVALID, where,
                       "pick another moe_layout, or drop one of the two tensors (moe_router_bias / balance)",
                       "layout '%s' writes both %s and %s as '%s'", l->name, df_moe_tensor_suffix(tb),
                       df_moe_tensor_suffix(ta), sa);
    }
  }
  return DF_OK;
}

static df_status report(const df_st_model *f, const df_load_problems *pb, const char *layout, df_error *err) {
  char hint[200];
  snprintf(hint, sizeof hint,
           "the checkpoint does not match the draft config read through the '%s' layout; check moe_layout, "
           "n_routed_experts and the shared-expert / centering keys",
           layout);
  return df_load_problems_report(f, pb, hint, err);
}

// ---- loading ----------------------------------------------------------------------------------------------

static const char *dims_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  df_st_tensor t = {.ndim = ndim};
  memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
  return df_st_shape_str(&t, buf, n);
}

// Where each parameter (or expert slice of a split parameter) comes from: file tensor index + 1, 0 = not yet.
typedef struct {
  const df_params *p;
  const df_st_model *f;
  const df_moe_layout *l;
  const df_moe_config *m;
  int *slot_base; // [np] first slot of parameter i
  int *slots;     // file tensor index + 1 per slot
  int64_t *nslots;
  df_load_problems pb;
} load_plan;

static bool shape_ok(const df_st_tensor *t, const df_param *e, bool slice, df_moe_tensor kind, bool is_moe) {
  const int off = slice ? 1 : 0;
  if (is_moe && kind == DF_MOE_T_INPUT_MEAN_STEPS) return t->numel == 1 && t->ndim <= 1; // [] or [1]
  if (t->ndim != e->ndim - off) return false;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] != e->shape[i + off]) return false;
  return true;
}

// Claims slot `s` of parameter `pi` for file tensor ti after checking shape and dtype.
static void claim(load_plan *lp, int ti, const char *fname, int pi, int64_t s, bool slice, df_moe_tensor kind,
                  bool is_moe) {
  const df_param *e = df_params_at(lp->p, pi);
  const df_st_tensor *t = df_st_model_at(lp->f, ti, NULL);
  int *slot = &lp->slots[lp->slot_base[pi] + s];
  char fs[96], ps[96];
  if (*slot) {
    df_load_problem(&lp->pb, fname, "tensors '%s' and '%s' both map to '%s'%s",
                    df_st_model_at(lp->f, *slot - 1, NULL)->name, fname, e->name, slice ? " (same expert)" : "");
    return;
  }
  *slot = ti + 1;
  if (!shape_ok(t, e, slice, kind, is_moe))
    df_load_problem(&lp->pb, fname, "shape mismatch '%s': file %s, expected %s", fname,
                    df_st_shape_str(t, fs, sizeof fs),
                    dims_str(e->ndim - (slice ? 1 : 0), e->shape + (slice ? 1 : 0), ps, sizeof ps));
  else if (!df_load_dtype_fits(t->dtype, e->dtype))
    df_load_problem(&lp->pb, fname, "dtype '%s': file %s cannot load into a %s parameter", fname,
                    df_st_dtype_name(t->dtype), df_dtype_name(e->dtype));
}

// A router logit bias (layers.{i}.mlp.gate.bias) in the file while the config has none: typically an export, which
// folds router centering into gate.bias, warm-starting a centred training config. Says so and returns true.
static bool unexpected_router_bias(load_plan *lp, const char *name, const char *fname) {
  int64_t layer = 0, expert = -1;
  df_moe_tensor kind = DF_MOE_T_COUNT;
  char pname[DF_MOE_NAME_MAX];
  if (!lp->m || df_moe_tensor_present(lp->m, DF_MOE_T_ROUTER_BIAS) ||
      !df_moe_layout_parse(lp->l, NULL, name, &layer, &kind, &expert) || kind != DF_MOE_T_ROUTER_BIAS ||
      !df_params_find(lp->p, df_moe_param_name(layer, DF_MOE_T_ROUTER_WEIGHT, pname, sizeof pname)))
    return false;
  df_load_problem(&lp->pb, fname,
                  "unexpected tensor '%s': the file has a router logit bias (e.g. an export with centering folded "
                  "into gate.bias); set moe_router_bias: true in the draft config to load it",
                  fname);
  return true;
}

static void plan_tensor(load_plan *lp, const df_load_options *o, int ti, int *ignored) {
  const df_st_tensor *t = df_st_model_at(lp->f, ti, NULL);
  char buf[512], pname[DF_MOE_NAME_MAX], want[DF_MOE_NAME_MAX];
  const char *name = df_load_map_name(o, t->name, buf, sizeof buf);
  int64_t layer = 0, expert = -1;
  df_moe_tensor kind = DF_MOE_T_COUNT;
  if (df_moe_layout_parse(lp->l, lp->m, name, &layer, &kind, &expert)) {
    const df_param *e = df_params_find(lp->p, df_moe_param_name(layer, kind, pname, sizeof pname));
    if (!e) {
      df_load_problem(&lp->pb, t->name, "unexpected tensor '%s' (this draft has no %s)", t->name, pname);
      return;
    }
    const int pi = (int)(e - df_params_at(lp->p, 0));
    const bool split = expert >= 0;
    if (split && expert >= lp->nslots[pi]) {
      df_load_problem(&lp->pb, t->name,
                      "unexpected tensor '%s' (expert %" PRId64 ", but n_routed_experts is %" PRId64 ")", t->name,
                      expert, lp->nslots[pi]);
      return;
    }
    claim(lp, ti, t->name, pi, split ? expert : 0, split, kind, true);
    return;
  }
  if (unexpected_router_bias(lp, name, t->name)) return;
  if (df_moe_param_parse(name, &layer, &kind)) { // a native name this layout renames
    df_load_problem(&lp->pb, t->name, "unexpected tensor '%s' (the '%s' layout writes it as '%s')", t->name,
                    lp->l->name, df_moe_layout_file_name(lp->l, layer, kind, 0, want, sizeof want));
    return;
  }
  const df_param *e = df_params_find(lp->p, name);
  if (!e) {
    df_load_unmatched(o, t->name, name, ignored, &lp->pb);
    return;
  }
  claim(lp, ti, t->name, (int)(e - df_params_at(lp->p, 0)), 0, false, DF_MOE_T_COUNT, false);
}

// Every slot must be filled; centering buffers may stay empty on a warm start.
static void plan_missing(load_plan *lp, bool centering_optional) {
  char fname[DF_MOE_NAME_MAX];
  for (int i = 0; i < df_params_count(lp->p); i++) {
    const df_param *e = df_params_at(lp->p, i);
    int64_t layer = 0;
    df_moe_tensor kind = DF_MOE_T_COUNT;
    const bool is_moe = df_moe_param_parse(e->name, &layer, &kind);
    const bool centering = is_moe && (kind == DF_MOE_T_INPUT_MEAN || kind == DF_MOE_T_INPUT_MEAN_STEPS);
    for (int64_t s = 0; s < lp->nslots[i]; s++) {
      if (lp->slots[lp->slot_base[i] + s] || (centering && centering_optional)) continue;
      if (!is_moe) {
        df_load_problem(&lp->pb, e->name, "missing parameter '%s'", e->name);
        continue;
      }
      df_moe_layout_file_name(lp->l, layer, kind, s, fname, sizeof fname);
      if (df_moe_layout_splits(lp->l, kind))
        df_load_problem(&lp->pb, fname, "missing tensor '%s' (expert %" PRId64 " of %" PRId64 ")", fname, s,
                        lp->nslots[i]);
      else
        df_load_problem(&lp->pb, fname, "missing tensor '%s'", fname);
    }
  }
}

static df_status copy_all(const load_plan *lp, float *flat, df_error *err) {
  for (int i = 0; i < df_params_count(lp->p); i++) {
    const df_param *e = df_params_at(lp->p, i);
    const int64_t slice = e->numel / lp->nslots[i];
    for (int64_t s = 0; s < lp->nslots[i]; s++) {
      const int src = lp->slots[lp->slot_base[i] + s];
      if (!src) continue; // an optional centering buffer
      const df_st_file *file;
      const df_st_tensor *t = df_st_model_at(lp->f, src - 1, &file);
      DF_TRY(df_st_read_f32(file, t, flat + e->offset + s * slice, slice, err));
    }
  }
  return DF_OK;
}

df_status df_moe_layout_load(const df_moe_config *m, const df_params *p, float *flat, const df_st_model *f,
                             const df_moe_load_options *opt, df_load_stats *stats, df_error *err) {
  const df_moe_load_options none = {0};
  const df_moe_load_options *o = opt ? opt : &none;
  if (!m) return df_params_load_strict(p, flat, f, &o->base, stats, err);
  const df_moe_layout *l = df_moe_layout_of(m);
  if (!l)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_layout", "resolve the config through df_moe_config_resolve",
                   "layout '%s' is not registered", m->moe_layout ? m->moe_layout : "(null)");
  if (!df_params_is_final(p))
    return DF_FAIL(err, DF_ERR_INVALID, df_st_model_path(f), "call df_params_finalize first",
                   "parameter table not finalized");
  const int np = df_params_count(p);
  load_plan lp = {.p = p, .f = f, .l = l, .m = m, .pb = {.log = o->base.log}};
  lp.slot_base = calloc((size_t)np + 1, sizeof *lp.slot_base);
  lp.nslots = calloc((size_t)np + 1, sizeof *lp.nslots);
  int total = 0;
  for (int i = 0; lp.slot_base && lp.nslots && i < np; i++) {
    const df_param *e = df_params_at(p, i);
    int64_t layer = 0;
    df_moe_tensor kind = DF_MOE_T_COUNT;
    lp.nslots[i] = df_moe_param_parse(e->name, &layer, &kind) && df_moe_layout_splits(l, kind) ? e->shape[0] : 1;
    lp.slot_base[i] = total;
    total += (int)lp.nslots[i];
  }
  lp.slots = calloc((size_t)total + 1, sizeof *lp.slots);
  df_status st = DF_OK;
  if (!lp.slot_base || !lp.nslots || !lp.slots)
    st = DF_FAIL(err, DF_ERR_NOMEM, df_st_model_path(f), NULL, "out of memory");
  int ignored = 0;
  for (int ti = 0; st == DF_OK && ti < df_st_model_count(f); ti++) plan_tensor(&lp, &o->base, ti, &ignored);
  if (st == DF_OK) plan_missing(&lp, o->centering_optional);
  if (st == DF_OK && lp.pb.total) st = report(f, &lp.pb, l->name, err);
  if (st == DF_OK) st = copy_all(&lp, flat, err);
  if (st == DF_OK && stats) *stats = (df_load_stats){.loaded = df_st_model_count(f) - ignored, .ignored = ignored};
  free(lp.slot_base);
  free(lp.nslots);
  free(lp.slots);
  return st;
}

// ---- saving -----------------------------------------------------------------------------------------------

static bool is_int_dtype(df_dtype dt) { return dt == DF_I64 || dt == DF_I32 || dt == DF_U8 || dt == DF_BOOL; }

// Integer entries (the centering step counter) leave the fp32 flat buffer as int64.
static df_status add_int(df_st_writer *w, const char *name, const df_param *e, const float *src, int64_t **keep,
                         df_error *err) {
  int64_t *v = malloc((size_t)(e->numel ? e->numel : 1) * sizeof *v);
  if (!v) return DF_FAIL(err, DF_ERR_NOMEM, name, NULL, "out of memory");
  *keep = v;
  for (int64_t i = 0; i < e->numel; i++) v[i] = (int64_t)llrintf(src[i]);
  return df_st_writer_add(w, name, DF_ST_I64, e->ndim, e->shape, v, err);
}

static df_status add_entry(df_st_writer *w, const df_moe_layout *l, const df_param *e, const float *flat,
                           const df_save_options *o, int64_t **keep, df_error *err) {
  char fname[DF_MOE_NAME_MAX];
  int64_t layer = 0;
  df_moe_tensor kind = DF_MOE_T_COUNT;
  const float *src = flat + e->offset;
  const bool is_moe = l && df_moe_param_parse(e->name, &layer, &kind);
  const char *name = is_moe ? df_moe_layout_file_name(l, layer, kind, 0, fname, sizeof fname) : e->name;
  if (is_int_dtype(e->dtype)) return add_int(w, name, e, src, keep, err);
  df_st_dtype dtype = df_save_dtype(o, name);
  if (e->role == DF_ROLE_BUFFER) dtype = DF_ST_F32; // fp32 buffers stay exact (a bf16 bias could flip top-k)
  if (!is_moe || !df_moe_layout_splits(l, kind))
    return df_st_writer_add_f32_as(w, name, dtype, e->ndim, e->shape, src, err);
  const int64_t slice = e->numel / e->shape[0];
  for (int64_t x = 0; x < e->shape[0]; x++) {
    df_moe_layout_file_name(l, layer, kind, x, fname, sizeof fname);
    DF_TRY(df_st_writer_add_f32_as(w, fname, dtype, e->ndim - 1, e->shape + 1, src + x * slice, err));
  }
  return DF_OK;
}

df_status df_moe_layout_save(const df_moe_config *m, const df_params *p, const float *flat, const char *path,
                             const df_save_options *opt, df_error *err) {
  const df_save_options none = {.dtype = DF_ST_F32};
  const df_save_options *o = opt ? opt : &none;
  if (!m) return df_params_save(p, flat, path, o, err);
  const df_moe_layout *l = df_moe_layout_of(m);
  if (!l)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_layout", "resolve the config through df_moe_config_resolve",
                   "layout '%s' is not registered", m->moe_layout ? m->moe_layout : "(null)");
  if (!df_params_is_final(p))
    return DF_FAIL(err, DF_ERR_INVALID, path, "call df_params_finalize first", "parameter table not finalized");
  const int np = df_params_count(p);
  int64_t **keep = calloc((size_t)np + 1, sizeof *keep);
  df_st_writer *w = NULL;
  df_status st = keep ? df_st_writer_new(&w, err) : DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  if (st == DF_OK) st = df_st_writer_set_metadata(w, "format", "pt", err);
  for (int i = 0; i < o->n_metadata && st == DF_OK; i++)
    st = df_st_writer_set_metadata(w, o->metadata[2 * i], o->metadata[2 * i + 1], err);
  for (int i = 0; i < np && st == DF_OK; i++) {
    const df_param *e = df_params_at(p, i);
    if (o->trainable_only && !e->trainable) continue;
    st = add_entry(w, l, e, flat, o, &keep[i], err);
  }
  if (st == DF_OK) st = df_st_writer_write(w, path, err);
  df_st_writer_free(w);
  for (int i = 0; keep && i < np; i++) free(keep[i]);
  free(keep);
  return st;
}
