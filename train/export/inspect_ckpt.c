// Checkpoint inspection: state.h5's attributes printed generically (every progress and contract field by its
// name, so fields added later show up), the tensor table read entry by entry through hyperslabs (a large
// draft is never loaded whole), and model.safetensors compared with it.
#include "train/export/inspect_ckpt.h"

#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "modeling/safetensors.h"
#include "train/run/ckpt.h"
#include "train/run/ckpt_manifest.h"

static bool has_state(const char *dir) {
  char p[4300];
  struct stat st;
  snprintf(p, sizeof p, "%s/state.h5", dir);
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

bool df_inspect_checkpoint_dir(const char *path, char *out, size_t n) {
  if (has_state(path)) return snprintf(out, n, "%s", path), true;
  snprintf(out, n, "%s/checkpoints/latest", path);
  return has_state(out);
}

// ---- attributes --------------------------------------------------------------------------------------------

static herr_t print_attr(hid_t loc, const char *name, const H5A_info_t *info, void *op) {
  (void)info;
  FILE *out = op;
  if (!strcmp(name, "recipe")) { // the whole resolved recipe: too long for this page
    fprintf(out, "  %-30s (the resolved recipe: h5dump -a recipe state.h5)\n", name);
    return 0;
  }
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT), t = a < 0 ? -1 : H5Aget_type(a);
  if (a < 0 || t < 0) {
    if (a >= 0) H5Aclose(a);
    return 0;
  }
  H5T_class_t c = H5Tget_class(t);
  if (c == H5T_INTEGER) {
    long long v = 0;
    if (H5Aread(a, H5T_NATIVE_LLONG, &v) >= 0) fprintf(out, "  %-30s %lld\n", name, v);
  } else if (c == H5T_FLOAT) {
    double v = 0;
    if (H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0) fprintf(out, "  %-30s %.17g\n", name, v);
  } else if (c == H5T_STRING && H5Tis_variable_str(t) > 0) {
    char *s = NULL;
    if (H5Aread(a, t, &s) >= 0) fprintf(out, "  %-30s '%s'\n", name, s ? s : "");
    H5free_memory(s);
  } else {
    fprintf(out, "  %-30s (%s)\n", name, c == H5T_STRING ? "fixed string" : "other type");
  }
  H5Tclose(t);
  H5Aclose(a);
  return 0;
}

static void print_group_attrs(hid_t f, const char *group, FILE *out) {
  if (H5Lexists(f, group, H5P_DEFAULT) <= 0) {
    fprintf(out, "%s: (missing)\n", group);
    return;
  }
  hid_t g = H5Gopen2(f, group, H5P_DEFAULT);
  fprintf(out, "%s:\n", group);
  hsize_t idx = 0;
  H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_INC, &idx, print_attr, out);
  H5Gclose(g);
}

// ---- the tensor table ----------------------------------------------------------------------------------------

typedef struct {
  double sum, sumsq, absmax;
  int64_t nonfinite;
} stats;

// Reads n floats at offset of the 1-D dataset `name` into buf and summarises them.
static bool slab_stats(hid_t f, const char *name, int64_t offset, int64_t n, float *buf, stats *s) {
  memset(s, 0, sizeof *s);
  hid_t d = H5Lexists(f, name, H5P_DEFAULT) > 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
  if (d < 0) return false;
  hid_t fs = H5Dget_space(d);
  hsize_t start = (hsize_t)offset, count = (hsize_t)n;
  hid_t ms = H5Screate_simple(1, &count, NULL);
  bool ok = H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &count, NULL) >= 0 &&
            H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) >= 0;
  H5Sclose(ms), H5Sclose(fs), H5Dclose(d);
  for (int64_t i = 0; ok && i < n; i++) {
    double x = buf[i];
    if (!isfinite(x)) {
      s->nonfinite++;
      continue;
    }
    s->sum += x, s->sumsq += x * x;
    s->absmax = fmax(s->absmax, fabs(x));
  }
  return ok;
}

static int64_t dataset_len(hid_t f, const char *name) {
  if (H5Lexists(f, "optimizer", H5P_DEFAULT) <= 0 && strchr(name, '/')) return -1;
  hid_t d = H5Lexists(f, name, H5P_DEFAULT) > 0 ? H5Dopen2(f, name, H5P_DEFAULT) : -1;
  if (d < 0) return -1;
  hid_t sp = H5Dget_space(d);
  int64_t n = (int64_t)H5Sget_simple_extent_npoints(sp);
  H5Sclose(sp), H5Dclose(d);
  return n;
}

typedef struct {
  int64_t count;
  char **names;
  int64_t *offs, *numel;
} layout;

static df_status read_layout(hid_t f, const char *path, layout *L, df_error *err) {
  memset(L, 0, sizeof *L);
  hid_t g = H5Lexists(f, "param_table", H5P_DEFAULT) > 0 ? H5Gopen2(f, "param_table", H5P_DEFAULT) : -1;
  if (g < 0) return DF_FAIL(err, DF_ERR_FORMAT, path, "pick another checkpoint", "%s has no param_table", path);
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, H5T_VARIABLE);
  int64_t n = dataset_len(g, "names");
  bool ok = n >= 0 && dataset_len(g, "offsets") == n && dataset_len(g, "numel") == n;
  if (ok) {
    L->count = n;
    L->names = calloc((size_t)n + 1, sizeof *L->names);
    L->offs = calloc((size_t)n + 1, sizeof *L->offs), L->numel = calloc((size_t)n + 1, sizeof *L->numel);
    ok = L->names && L->offs && L->numel;
  }
  if (ok) {
    hid_t d = H5Dopen2(g, "names", H5P_DEFAULT);
    ok = H5Dread(d, st, H5S_ALL, H5S_ALL, H5P_DEFAULT, L->names) >= 0;
    H5Dclose(d);
    d = H5Dopen2(g, "offsets", H5P_DEFAULT);
    ok = ok && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, L->offs) >= 0;
    H5Dclose(d);
    d = H5Dopen2(g, "numel", H5P_DEFAULT);
    ok = ok && H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, L->numel) >= 0;
    H5Dclose(d);
  }
  H5Tclose(st);
  H5Gclose(g);
  return ok ? DF_OK : DF_FAIL(err, DF_ERR_FORMAT, path, "pick another checkpoint", "%s: unreadable param_table", path);
}

static void free_layout(layout *L) {
  for (int64_t i = 0; L->names && i < L->count; i++) H5free_memory(L->names[i]);
  free(L->names), free(L->offs), free(L->numel);
}

// One row per tensor: file shape and dtype (model.safetensors, when the name is there), weight RMS and max,
// and the RMS of the two AdamW moments. Returns the number of problems found.
static int print_tensors(hid_t f, const layout *L, const df_st_model *m, FILE *out) {
  int64_t total = dataset_len(f, "params"), maxn = 0, covered = 0;
  for (int64_t i = 0; i < L->count; i++) maxn = L->numel[i] > maxn ? L->numel[i] : maxn;
  float *buf = malloc((size_t)(maxn ? maxn : 1) * sizeof(float));
  int problems = 0;
  if (!buf) return fprintf(out, "PROBLEM: out of memory for a %lld-element tensor\n", (long long)maxn), 1;
  fprintf(out, "tensors: %lld entries over %lld floats\n", (long long)L->count, (long long)total);
  fprintf(out, "  %-44s %-14s %-5s %10s %10s %10s %10s %10s\n", "name", "shape", "dtype", "numel", "rms", "max|w|",
          "rms(m)", "sqrt(v)");
  for (int64_t i = 0; i < L->count; i++) {
    const int64_t o = L->offs[i], n = L->numel[i];
    char shape[64] = "-", dtype[8] = "-";
    const df_st_tensor *t = m ? df_st_model_find(m, L->names[i], NULL) : NULL;
    if (t) df_st_shape_str(t, shape, sizeof shape), snprintf(dtype, sizeof dtype, "%s", df_st_dtype_name(t->dtype));
    stats w, mm, vv;
    bool ok = o >= 0 && n >= 0 && o + n <= total && slab_stats(f, "params", o, n, buf, &w) &&
              slab_stats(f, "optimizer/exp_avg", o, n, buf, &mm) &&
              slab_stats(f, "optimizer/exp_avg_sq", o, n, buf, &vv);
    if (!ok) {
      fprintf(out, "  %-44s PROBLEM: entry at %lld + %lld is outside the %lld stored floats\n", L->names[i],
              (long long)o, (long long)n, (long long)total);
      problems++;
      continue;
    }
    covered += n;
    const double dn = n > 0 ? (double)n : 1.0;
    fprintf(out, "  %-44s %-14s %-5s %10lld %10.3e %10.3e %10.3e %10.3e\n", L->names[i], shape, dtype, (long long)n,
            sqrt(w.sumsq / dn), w.absmax, sqrt(mm.sumsq / dn), sqrt(fmax(vv.sum, 0.0) / dn));
    if (t && t->numel != n) {
      fprintf(out, "  PROBLEM: %s has %lld elements in model.safetensors, %lld in state.h5\n", L->names[i],
              (long long)t->numel, (long long)n);
      problems++;
    }
    if (w.nonfinite + mm.nonfinite + vv.nonfinite) {
      fprintf(out, "  PROBLEM: %s has non-finite values (weights %lld, exp_avg %lld, exp_avg_sq %lld)\n", L->names[i],
              (long long)w.nonfinite, (long long)mm.nonfinite, (long long)vv.nonfinite);
      problems++;
    }
  }
  free(buf);
  fprintf(out, "  %lld parameters in %lld tensors (%lld floats are alignment padding)\n", (long long)covered,
          (long long)L->count, (long long)(total - covered));
  return problems;
}

// model.safetensors: the tensor count, and names that state.h5 does not know (an MoE layout renames experts,
// so those are reported as a count, not as problems).
static void print_model_file(const char *dir, const layout *L, df_st_model **m, FILE *out) {
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  df_error e = {0};
  if (df_st_model_open(p, m, &e) != DF_OK) {
    fprintf(out, "model.safetensors: unreadable (%s)\n", e.msg);
    *m = NULL;
    return;
  }
  int n = df_st_model_count(*m), unknown = 0;
  for (int i = 0; i < n; i++) {
    const df_st_tensor *t = df_st_model_at(*m, i, NULL);
    bool found = false;
    for (int64_t j = 0; !found && j < L->count; j++) found = !strcmp(L->names[j], t->name);
    unknown += !found;
  }
  fprintf(out, "model.safetensors: %d tensors%s", n, unknown ? "" : ", every one in the state's table\n");
  if (unknown) fprintf(out, "; %d named otherwise (an MoE checkpoint layout renames experts)\n", unknown);
}

df_status df_inspect_checkpoint(const char *dir, FILE *out, df_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/state.h5", dir);
  H5E_auto2_t fn;
  void *fd;
  H5Eget_auto2(H5E_DEFAULT, &fn, &fd);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  bool has_manifest = false; // the manifest first: it names a file truncated or changed after the save
  df_error damage = {0};
  bool damaged = df_ckpt_manifest_verify(dir, &has_manifest, &damage) != DF_OK;
  static const char *const damaged_hint = "the checkpoint changed after it was written: take an earlier one "
                                          "(draftforge train --resume auto takes the newest complete one)";
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    H5Eset_auto2(H5E_DEFAULT, fn, fd);
    if (damaged) return DF_FAIL(err, damage.status, damage.where, damaged_hint, "%s", damage.msg);
    return DF_FAIL(err, DF_ERR_IO, path, "the checkpoint is incomplete or damaged; pick another one",
                   "cannot open %s as HDF5", path);
  }
  fprintf(out, "checkpoint %s\n", dir);
  int problems = 0;
  if (damaged)
    fprintf(out, "PROBLEM: %s\n", damage.msg), problems++;
  else
    fprintf(out, "manifest: %s\n",
            has_manifest ? "every file has its recorded size and XXH3-64 checksum"
                         : "none (written before checkpoints had manifests): not verified");
  hsize_t idx = 0;
  fprintf(out, "state.h5:\n");
  H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, &idx, print_attr, out); // format, version (the recipe is long)
  print_group_attrs(f, "progress", out);
  print_group_attrs(f, "contract", out);
  uint64_t rng[4] = {0};
  hid_t g = H5Lexists(f, "rng", H5P_DEFAULT) > 0 ? H5Gopen2(f, "rng", H5P_DEFAULT) : -1;
  if (g >= 0 && dataset_len(g, "anchors") == 4) {
    hid_t d = H5Dopen2(g, "anchors", H5P_DEFAULT);
    if (H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, rng) >= 0)
      fprintf(out, "rng: anchors %016llx %016llx %016llx %016llx\n", (unsigned long long)rng[0],
              (unsigned long long)rng[1], (unsigned long long)rng[2], (unsigned long long)rng[3]);
    H5Dclose(d);
  }
  if (g >= 0) H5Gclose(g);
  layout L;
  df_status st = read_layout(f, path, &L, err);
  if (st == DF_OK) {
    const int64_t total = dataset_len(f, "params");
    if (dataset_len(f, "optimizer/exp_avg") != total || dataset_len(f, "optimizer/exp_avg_sq") != total) {
      fprintf(out, "PROBLEM: the optimizer moments do not match the %lld stored parameters\n", (long long)total);
      problems++;
    } else {
      df_st_model *m = NULL;
      print_model_file(dir, &L, &m, out);
      problems += print_tensors(f, &L, m, out);
      df_st_model_close(m);
    }
    free_layout(&L);
  }
  H5Fclose(f);
  H5Eset_auto2(H5E_DEFAULT, fn, fd);
  if (st != DF_OK) return st;
  if (problems)
    return DF_FAIL(err, DF_ERR_INVALID, dir,
                   damaged ? damaged_hint : "resume from an earlier checkpoint (draftforge train --resume DIR)",
                   "%d problem(s) in checkpoint %s", problems, dir);
  return DF_OK;
}
