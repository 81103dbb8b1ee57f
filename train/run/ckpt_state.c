// state.h5 of a checkpoint: the flat fp32 buffers (masters, AdamW moments) as datasets, the parameter layout
// they follow, the anchor RNG, and the progress / contract records as attributes, each field by name.
#include <hdf5.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/run/ckpt.h"

// ---- field tables ----------------------------------------------------------------------------------------------

typedef enum { F_STR, F_I64, F_F64, F_BOOL } ftype;

typedef struct {
  const char *attr; // attribute name in state.h5
  const char *key;  // what a mismatch message names
  ftype type;
  size_t off, size;
} field;

#define CF(a, k, t, m)                                                                                                 \
  { a, k, t, offsetof(df_ckpt_contract, m), sizeof(((df_ckpt_contract *)0)->m) }
static const field CONTRACT[] = {
    CF("strategy", "training.strategy", F_STR, strategy),
    CF("draft_config_hash", "model.draft_model_config (the draft config's hash)", F_STR, draft_config_hash),
    CF("data_size", "data.hidden_states_path (its sample count)", F_I64, data_size),
    CF("batch_size", "the global batch (ranks x training.batch_size)", F_I64, batch_size),
    CF("accumulation_steps", "training.accumulation_steps", F_I64, accumulation_steps),
    CF("world_size", "world_size", F_I64, world_size),
    CF("block_size", "block_size (draft config)", F_I64, block_size),
    CF("num_anchors", "training.num_anchors", F_I64, num_anchors),
    CF("loss_decay_gamma", "training.loss_decay_gamma", F_F64, loss_decay_gamma),
    CF("max_length", "data.max_length", F_I64, max_length),
    CF("mask_token_id", "mask_token_id", F_I64, mask_token_id),
    CF("seed", "training.seed", F_I64, seed),
    CF("lr_scheduler", "training.lr_scheduler", F_STR, lr_scheduler),
    CF("learning_rate", "training.learning_rate", F_F64, learning_rate),
    CF("warmup_ratio", "training.warmup_ratio", F_F64, warmup_ratio),
    CF("horizon", "the LR schedule horizon (training.total_steps, else max_steps)", F_I64, horizon),
    CF("max_grad_norm", "training.max_grad_norm", F_F64, max_grad_norm),
    CF("weight_decay", "training.weight_decay", F_F64, weight_decay),
    CF("adam_beta1", "training.adam_beta1", F_F64, adam_beta1),
    CF("adam_beta2", "training.adam_beta2", F_F64, adam_beta2),
    CF("adam_eps", "training.adam_eps", F_F64, adam_eps),
};

#define PF(a, t, m)                                                                                                    \
  { a, a, t, offsetof(df_ckpt_progress, m), sizeof(((df_ckpt_progress *)0)->m) }
static const field PROGRESS[] = {
    PF("step", F_I64, step),
    PF("adam_step", F_I64, adam_step),
    PF("epoch", F_I64, epoch),
    PF("cursor", F_I64, cursor),
    PF("consecutive_skips", F_I64, consecutive_skips),
    PF("skipped_steps", F_I64, skipped_steps),
    PF("tokens_seen", F_I64, tokens_seen),
    PF("last_lr", F_F64, last_lr),
    PF("has_best", F_BOOL, has_best),
    PF("best_eval_tau", F_F64, best_eval_tau),
    PF("best_step", F_I64, best_step),
};

#define NFIELDS(t) ((int)(sizeof(t) / sizeof((t)[0])))

// ---- HDF5 plumbing ---------------------------------------------------------------------------------------------

typedef struct {
  const char *file;
  df_error *err;
} h5io;

static df_status h5_fail(const h5io *io, df_status st, const char *name, const char *what) {
  char where[256];
  snprintf(where, sizeof where, "%.180s:%.60s", io->file, name);
  return DF_FAIL(io->err, st, where, "the checkpoint is damaged or from another draftforge; pick another one",
                 "checkpoint state %s: '%s': %s", io->file, name, what);
}

static hid_t str_type(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

static df_status put_attr(const h5io *io, hid_t loc, const char *name, hid_t type, const void *v) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Awrite(a, type, v);
  if (a >= 0) H5Aclose(a);
  H5Sclose(sp);
  return rc < 0 ? h5_fail(io, DF_ERR_IO, name, "cannot write the attribute") : DF_OK;
}

static df_status put_str(const h5io *io, hid_t loc, const char *name, const char *s) {
  hid_t t = str_type();
  df_status st = put_attr(io, loc, name, t, &s);
  H5Tclose(t);
  return st;
}

static df_status get_attr(const h5io *io, hid_t loc, const char *name, hid_t type, void *v) {
  if (H5Aexists(loc, name) <= 0) return h5_fail(io, DF_ERR_FORMAT, name, "missing attribute");
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  herr_t rc = a < 0 ? -1 : H5Aread(a, type, v);
  if (a >= 0) H5Aclose(a);
  return rc < 0 ? h5_fail(io, DF_ERR_FORMAT, name, "unreadable attribute (wrong type?)") : DF_OK;
}

static df_status get_str(const h5io *io, hid_t loc, const char *name, char *buf, size_t n) {
  hid_t t = str_type();
  char *s = NULL;
  df_status st = get_attr(io, loc, name, t, &s);
  H5Tclose(t);
  if (st != DF_OK) return st;
  bool fits = s && strlen(s) < n;
  if (fits) memcpy(buf, s, strlen(s) + 1);
  H5free_memory(s);
  return fits ? DF_OK : h5_fail(io, DF_ERR_FORMAT, name, "string attribute too long");
}

static df_status put_data(const h5io *io, hid_t loc, const char *name, hid_t type, const void *data, int64_t n) {
  hsize_t dims[1] = {(hsize_t)n};
  hid_t sp = H5Screate_simple(1, dims, NULL);
  hid_t d = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = d < 0 ? -1 : H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  if (d >= 0) H5Dclose(d);
  H5Sclose(sp);
  return rc < 0 ? h5_fail(io, DF_ERR_IO, name, "cannot write the dataset") : DF_OK;
}

// Reads a 1-D dataset of exactly n elements (HDF5 converts the element type to `type`).
static df_status get_data(const h5io *io, hid_t loc, const char *name, hid_t type, void *data, int64_t n) {
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0) return h5_fail(io, DF_ERR_FORMAT, name, "missing dataset");
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT);
  if (d < 0) return h5_fail(io, DF_ERR_FORMAT, name, "cannot open the dataset");
  hid_t sp = H5Dget_space(d);
  hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
  if (sp >= 0) H5Sclose(sp);
  herr_t rc = np == n ? H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : -1;
  H5Dclose(d);
  if (np != n) {
    char what[160];
    snprintf(what, sizeof what, "holds %lld elements, expected %lld", (long long)np, (long long)n);
    return h5_fail(io, DF_ERR_FORMAT, name, what);
  }
  return rc < 0 ? h5_fail(io, DF_ERR_FORMAT, name, "unreadable dataset") : DF_OK;
}

static df_status put_fields(const h5io *io, hid_t loc, const field *f, int n, const void *rec) {
  for (int i = 0; i < n; i++) {
    const char *p = (const char *)rec + f[i].off;
    int64_t b;
    switch (f[i].type) {
    case F_STR: DF_TRY(put_str(io, loc, f[i].attr, p)); break;
    case F_I64: DF_TRY(put_attr(io, loc, f[i].attr, H5T_NATIVE_INT64, p)); break;
    case F_F64: DF_TRY(put_attr(io, loc, f[i].attr, H5T_NATIVE_DOUBLE, p)); break;
    case F_BOOL:
      b = *(const bool *)p;
      DF_TRY(put_attr(io, loc, f[i].attr, H5T_NATIVE_INT64, &b));
      break;
    }
  }
  return DF_OK;
}

static df_status get_fields(const h5io *io, hid_t loc, const field *f, int n, void *rec) {
  for (int i = 0; i < n; i++) {
    char *p = (char *)rec + f[i].off;
    int64_t b;
    switch (f[i].type) {
    case F_STR: DF_TRY(get_str(io, loc, f[i].attr, p, f[i].size)); break;
    case F_I64: DF_TRY(get_attr(io, loc, f[i].attr, H5T_NATIVE_INT64, p)); break;
    case F_F64: DF_TRY(get_attr(io, loc, f[i].attr, H5T_NATIVE_DOUBLE, p)); break;
    case F_BOOL:
      DF_TRY(get_attr(io, loc, f[i].attr, H5T_NATIVE_INT64, &b));
      *(bool *)p = b != 0;
      break;
    }
  }
  return DF_OK;
}

// ---- the strategy's keys -------------------------------------------------------------------------------------

// Each key as an attribute of its own name (text or double), and their names, comma-separated, in "strategy_keys".
static df_status put_strategy_keys(const h5io *io, hid_t loc, const df_ckpt_contract *c) {
  char names[DF_CKPT_MAX_STRATEGY_KEYS * 49 + 1] = "";
  for (int i = 0; i < c->nkeys; i++) {
    const df_ckpt_value *v = &c->keys[i];
    DF_TRY(v->is_text ? put_str(io, loc, v->key, v->text) : put_attr(io, loc, v->key, H5T_NATIVE_DOUBLE, &v->number));
    strcat(strcat(names, i ? "," : ""), v->key);
  }
  return put_str(io, loc, "strategy_keys", names);
}

// The keys the checkpoint names; a checkpoint written before strategies recorded their keys by name holds the
// DFlash and DSpark keys every run wrote then.
static df_status get_strategy_keys(const h5io *io, hid_t loc, df_ckpt_contract *c) {
  char names[DF_CKPT_MAX_STRATEGY_KEYS * 49 + 1];
  if (H5Aexists(loc, "strategy_keys") > 0)
    DF_TRY(get_str(io, loc, "strategy_keys", names, sizeof names));
  else
    snprintf(names, sizeof names,
             "loss_type,dpace_alpha,dspark_ce_loss_alpha,dspark_l1_loss_alpha,"
             "dspark_confidence_head_alpha");
  c->nkeys = 0;
  for (char *save = NULL, *k = strtok_r(names, ",", &save); k && c->nkeys < DF_CKPT_MAX_STRATEGY_KEYS;
       k = strtok_r(NULL, ",", &save)) {
    df_ckpt_value *v = &c->keys[c->nkeys++];
    snprintf(v->key, sizeof v->key, "%s", k);
    hid_t a = H5Aexists(loc, k) > 0 ? H5Aopen(loc, k, H5P_DEFAULT) : H5I_INVALID_HID;
    hid_t t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
    v->is_text = t >= 0 && H5Tget_class(t) == H5T_STRING;
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    DF_TRY(v->is_text ? get_str(io, loc, k, v->text, sizeof v->text)
                      : get_attr(io, loc, k, H5T_NATIVE_DOUBLE, &v->number));
  }
  return DF_OK;
}

// ---- the parameter layout ------------------------------------------------------------------------------------

static df_status put_layout(const h5io *io, hid_t g, const df_params *t) {
  int n = df_params_count(t);
  const char **names = malloc((size_t)n * sizeof *names);
  int64_t *offs = malloc((size_t)n * sizeof *offs), *numel = malloc((size_t)n * sizeof *numel);
  df_status st = DF_OK;
  if (!names || !offs || !numel) st = DF_FAIL(io->err, DF_ERR_NOMEM, io->file, NULL, "out of memory");
  for (int i = 0; st == DF_OK && i < n; i++) {
    const df_param *e = df_params_at(t, i);
    names[i] = e->name, offs[i] = e->offset, numel[i] = e->numel;
  }
  hid_t st_t = str_type();
  if (st == DF_OK) st = put_data(io, g, "names", st_t, names, n);
  if (st == DF_OK) st = put_data(io, g, "offsets", H5T_NATIVE_INT64, offs, n);
  if (st == DF_OK) st = put_data(io, g, "numel", H5T_NATIVE_INT64, numel, n);
  H5Tclose(st_t);
  free(names), free(offs), free(numel);
  return st;
}

// The file's layout must be the model's, entry by entry; the error names the first parameter that differs.
static df_status check_layout(const h5io *io, hid_t g, const df_params *t) {
  int64_t n = 0;
  DF_TRY(get_attr(io, g, "count", H5T_NATIVE_INT64, &n));
  if (n != df_params_count(t)) {
    char what[200];
    snprintf(what, sizeof what, "the checkpoint has %lld parameters, the model %d (another draft config?)",
             (long long)n, df_params_count(t));
    return h5_fail(io, DF_ERR_INVALID, "param_table", what);
  }
  char **names = calloc((size_t)n, sizeof *names);
  int64_t *offs = malloc((size_t)n * sizeof *offs), *numel = malloc((size_t)n * sizeof *numel);
  hid_t st_t = str_type();
  df_status st = names && offs && numel ? DF_OK : DF_FAIL(io->err, DF_ERR_NOMEM, io->file, NULL, "out of memory");
  if (st == DF_OK) st = get_data(io, g, "names", st_t, names, n);
  if (st == DF_OK) st = get_data(io, g, "offsets", H5T_NATIVE_INT64, offs, n);
  if (st == DF_OK) st = get_data(io, g, "numel", H5T_NATIVE_INT64, numel, n);
  for (int64_t i = 0; st == DF_OK && i < n; i++) {
    const df_param *e = df_params_at(t, (int)i);
    if (names[i] && !strcmp(names[i], e->name) && offs[i] == e->offset && numel[i] == e->numel) continue;
    char what[400];
    snprintf(what, sizeof what, "entry %lld is '%s' (%lld elements at %lld); the model has '%s' (%lld at %lld)",
             (long long)i, names[i] ? names[i] : "?", (long long)numel[i], (long long)offs[i], e->name,
             (long long)e->numel, (long long)e->offset);
    st = h5_fail(io, DF_ERR_INVALID, "param_table", what);
  }
  for (int64_t i = 0; names && i < n; i++) H5free_memory(names[i]);
  H5Tclose(st_t);
  free(names), free(offs), free(numel);
  return st;
}

// ---- write / read ----------------------------------------------------------------------------------------------

static df_status write_groups(const h5io *io, hid_t f, const df_ckpt_state *s) {
  const char *format = DF_CKPT_FORMAT;
  int64_t version = DF_CKPT_VERSION, numel = df_params_numel(s->table), count = df_params_count(s->table);
  DF_TRY(put_str(io, f, "format", format));
  DF_TRY(put_attr(io, f, "version", H5T_NATIVE_INT64, &version));
  if (s->recipe_yaml) DF_TRY(put_str(io, f, "recipe", s->recipe_yaml));
  DF_TRY(put_data(io, f, "params", H5T_NATIVE_FLOAT, s->params, numel));
  df_status st = DF_OK;
  hid_t g = H5Gcreate2(f, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return h5_fail(io, DF_ERR_IO, "optimizer", "cannot create the group");
  st = put_data(io, g, "exp_avg", H5T_NATIVE_FLOAT, s->exp_avg, numel);
  if (st == DF_OK) st = put_data(io, g, "exp_avg_sq", H5T_NATIVE_FLOAT, s->exp_avg_sq, numel);
  H5Gclose(g);
  DF_TRY(st);
  static const char *const groups[] = {"param_table", "progress", "contract", "rng"};
  for (int i = 0; i < 4 && st == DF_OK; i++) {
    g = H5Gcreate2(f, groups[i], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return h5_fail(io, DF_ERR_IO, groups[i], "cannot create the group");
    if (i == 0) st = put_layout(io, g, s->table);
    if (i == 0 && st == DF_OK) st = put_attr(io, g, "count", H5T_NATIVE_INT64, &count);
    if (i == 1) st = put_fields(io, g, PROGRESS, NFIELDS(PROGRESS), s->progress);
    if (i == 2) st = put_fields(io, g, CONTRACT, NFIELDS(CONTRACT), s->contract);
    if (i == 2 && st == DF_OK) st = put_strategy_keys(io, g, s->contract);
    if (i == 2 && st == DF_OK)
      st = put_str(io, g, "precision", s->contract->precision[0] ? s->contract->precision : "float32");
    if (i == 3) st = put_data(io, g, "anchors", H5T_NATIVE_UINT64, s->progress->anchor_rng.s, 4);
    H5Gclose(g);
  }
  return st;
}

df_status df_ckpt_write_state(const char *path, const df_ckpt_state *s, df_error *err) {
  h5io io = {path, err};
  H5E_auto2_t fn;
  void *fd;
  H5Eget_auto2(H5E_DEFAULT, &fn, &fd);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  df_status st = f < 0 ? DF_FAIL(err, DF_ERR_IO, path, "check the output directory", "cannot create %s", path)
                       : write_groups(&io, f, s);
  if (f >= 0 && H5Fclose(f) < 0 && st == DF_OK) st = h5_fail(&io, DF_ERR_IO, "/", "cannot close the file");
  H5Eset_auto2(H5E_DEFAULT, fn, fd);
  return st;
}

static df_status read_groups(const h5io *io, hid_t f, const df_params *t, float *params, float *m, float *v,
                             df_ckpt_contract *c, df_ckpt_progress *p) {
  char format[64];
  int64_t version = 0, numel = df_params_numel(t);
  DF_TRY(get_str(io, f, "format", format, sizeof format));
  DF_TRY(get_attr(io, f, "version", H5T_NATIVE_INT64, &version));
  if (strcmp(format, DF_CKPT_FORMAT) || version != DF_CKPT_VERSION) {
    char what[200];
    snprintf(what, sizeof what, "format '%s' version %lld; this draftforge reads '%s' version %d", format,
             (long long)version, DF_CKPT_FORMAT, DF_CKPT_VERSION);
    return h5_fail(io, DF_ERR_FORMAT, "format", what);
  }
  static const char *const groups[] = {"param_table", "progress", "contract", "rng", "optimizer"};
  hid_t g[5] = {H5I_INVALID_HID, H5I_INVALID_HID, H5I_INVALID_HID, H5I_INVALID_HID, H5I_INVALID_HID};
  df_status st = DF_OK;
  for (int i = 0; i < 5 && st == DF_OK; i++) {
    g[i] = H5Lexists(f, groups[i], H5P_DEFAULT) > 0 ? H5Gopen2(f, groups[i], H5P_DEFAULT) : H5I_INVALID_HID;
    if (g[i] < 0) st = h5_fail(io, DF_ERR_FORMAT, groups[i], "missing group");
  }
  if (st == DF_OK) st = check_layout(io, g[0], t);
  if (st == DF_OK) st = get_fields(io, g[1], PROGRESS, NFIELDS(PROGRESS), p);
  if (st == DF_OK) st = get_fields(io, g[2], CONTRACT, NFIELDS(CONTRACT), c);
  if (st == DF_OK) st = get_strategy_keys(io, g[2], c);
  if (st == DF_OK && H5Aexists(g[2], "precision") > 0)
    st = get_str(io, g[2], "precision", c->precision, sizeof c->precision);
  else if (st == DF_OK)
    snprintf(c->precision, sizeof c->precision, "float32"); // written before the attribute existed
  if (st == DF_OK) st = get_data(io, g[3], "anchors", H5T_NATIVE_UINT64, p->anchor_rng.s, 4);
  if (st == DF_OK) st = get_data(io, f, "params", H5T_NATIVE_FLOAT, params, numel);
  if (st == DF_OK) st = get_data(io, g[4], "exp_avg", H5T_NATIVE_FLOAT, m, numel);
  if (st == DF_OK) st = get_data(io, g[4], "exp_avg_sq", H5T_NATIVE_FLOAT, v, numel);
  for (int i = 0; i < 5; i++)
    if (g[i] >= 0) H5Gclose(g[i]);
  return st;
}

// state.h5 that HDF5 cannot open: missing (not a checkpoint directory) or damaged (present but unreadable).
static df_status open_failure(const char *path, df_error *err) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return DF_FAIL(err, DF_ERR_IO, path, "pass a checkpoint directory (it holds state.h5) or a run directory",
                   "cannot resume: %s does not exist", path);
  return DF_FAIL(err, DF_ERR_FORMAT, path,
                 "the checkpoint is damaged (truncated?); resume from an earlier checkpoint, or pass --resume auto to "
                 "take the newest complete one",
                 "the checkpoint state %s (%lld bytes) is damaged: it does not open as HDF5", path,
                 (long long)sb.st_size);
}

df_status df_ckpt_read(const char *ckpt_dir, const df_params *table, float *params, float *exp_avg, float *exp_avg_sq,
                       df_ckpt_contract *contract, df_ckpt_progress *progress, df_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/state.h5", ckpt_dir);
  memset(contract, 0, sizeof *contract);
  memset(progress, 0, sizeof *progress);
  h5io io = {path, err};
  H5E_auto2_t fn;
  void *fd;
  H5Eget_auto2(H5E_DEFAULT, &fn, &fd);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  df_status st =
      f < 0 ? open_failure(path, err) : read_groups(&io, f, table, params, exp_avg, exp_avg_sq, contract, progress);
  if (f >= 0) H5Fclose(f);
  H5Eset_auto2(H5E_DEFAULT, fn, fd);
  return st;
}

// ---- contract --------------------------------------------------------------------------------------------------

static void field_text(const field *f, const void *rec, char *buf, size_t n) {
  const char *p = (const char *)rec + f->off;
  if (f->type == F_STR)
    snprintf(buf, n, "'%s'", p);
  else if (f->type == F_I64)
    snprintf(buf, n, "%lld", (long long)*(const int64_t *)p);
  else
    snprintf(buf, n, "%.17g", *(const double *)p);
}

df_status df_ckpt_check_contract(const df_ckpt_contract *want, const df_ckpt_contract *have, const char *ckpt_dir,
                                 df_error *err) {
  for (int i = 0; i < NFIELDS(CONTRACT); i++) {
    const field *f = &CONTRACT[i];
    // the world size is informational: the global batch (batch_size) is what must agree, so a run resumes on
    // another number of ranks (docs/distributed.md)
    if (f->off == offsetof(df_ckpt_contract, world_size)) continue;
    const char *a = (const char *)want + f->off, *b = (const char *)have + f->off;
    bool same = f->type == F_STR   ? !strcmp(a, b)
                : f->type == F_I64 ? *(const int64_t *)a == *(const int64_t *)b
                                   : *(const double *)a == *(const double *)b;
    if (same) continue;
    char tw[96], th[96];
    field_text(f, want, tw, sizeof tw);
    field_text(f, have, th, sizeof th);
    return DF_FAIL(err, DF_ERR_INVALID, f->key,
                   "resume with the settings the run started with, or start a new run in another output_dir",
                   "cannot resume from %s: contract mismatch on %s: the checkpoint has %s, this run has %s", ckpt_dir,
                   f->key, th, tw);
  }
  for (int i = 0; i < want->nkeys; i++) {
    const df_ckpt_value *w = &want->keys[i], *h = NULL;
    for (int j = 0; j < have->nkeys && !h; j++)
      if (!strcmp(have->keys[j].key, w->key)) h = &have->keys[j];
    const bool same =
        h && h->is_text == w->is_text && (w->is_text ? !strcmp(h->text, w->text) : h->number == w->number);
    if (same) continue;
    char tw[96], th[96] = "no value";
    if (w->is_text)
      snprintf(tw, sizeof tw, "'%s'", w->text);
    else
      snprintf(tw, sizeof tw, "%.17g", w->number);
    if (h && h->is_text)
      snprintf(th, sizeof th, "'%s'", h->text);
    else if (h)
      snprintf(th, sizeof th, "%.17g", h->number);
    char key[64];
    snprintf(key, sizeof key, "training.%s", w->key);
    return DF_FAIL(err, DF_ERR_INVALID, key,
                   "resume with the settings the run started with, or start a new run in another output_dir",
                   "cannot resume from %s: contract mismatch on %s: the checkpoint has %s, this run has %s", ckpt_dir,
                   key, th, tw);
  }
  return DF_OK;
}

void df_ckpt_config_hash(const json_t *cfg, char out[24]) {
  char *text = json_dumps(cfg, JSON_SORT_KEYS | JSON_COMPACT);
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++) h = (h ^ *p) * 0x100000001b3ULL;
  free(text);
  snprintf(out, 24, "%016llx", (unsigned long long)h);
}
