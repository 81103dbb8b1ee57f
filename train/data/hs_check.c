// Pure validation of a hidden-state shard's attributes, layout and index, and the bf16 conversions.
// Nothing here touches HDF5, so the fuzzer can drive it with arbitrary values.
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/data/hs.h"

#define HS_MAX_HIDDEN (INT64_C(1) << 24) // far above any model; keeps K·H·rows arithmetic in int64

static void where_of(char *buf, size_t n, const char *file, const char *name) {
  snprintf(buf, n, "%s:%s", file ? file : "?", name);
}

static df_status attr_fail(df_error *err, const char *file, const char *name, const char *hint, const char *what) {
  char where[256];
  where_of(where, sizeof where, file, name);
  return DF_FAIL(err, DF_ERR_FORMAT, where, hint, "shard %s: attribute '%s' %s", file ? file : "?", name, what);
}

static df_status check_format_version(const df_hs_attrs *a, const char *file, df_error *err) {
  const char *fmt_hint = "this is not a draftforge hidden-state shard; convert SpecForge data with "
                         "tools/import_specforge.py";
  if (!a->format) return attr_fail(err, file, DF_HS_ATTR_FORMAT, fmt_hint, "is missing");
  if (strcmp(a->format, DF_HS_FORMAT)) {
    char what[160];
    snprintf(what, sizeof what, "is \"%.64s\", expected \"" DF_HS_FORMAT "\"", a->format);
    return attr_fail(err, file, DF_HS_ATTR_FORMAT, fmt_hint, what);
  }
  if (!a->has_version)
    return attr_fail(err, file, DF_HS_ATTR_VERSION, "write shards with tools/hidden_states.py or draftforge capture",
                     "is missing");
  if (a->version != DF_HS_VERSION) {
    char what[128];
    snprintf(what, sizeof what, "is %lld, this build reads version %d", (long long)a->version, DF_HS_VERSION);
    return attr_fail(err, file, DF_HS_ATTR_VERSION,
                     a->version > DF_HS_VERSION ? "the shard is newer than this draftforge; upgrade draftforge"
                                                : "re-create the shard with the current tools",
                     what);
  }
  return DF_OK;
}

static df_status check_shape_attrs(const df_hs_attrs *a, const char *file, df_error *err) {
  char what[160];
  if (!a->has_hidden_size)
    return attr_fail(err, file, DF_HS_ATTR_HIDDEN_SIZE, "set it to the target's H", "is missing");
  if (a->hidden_size < 1 || a->hidden_size > HS_MAX_HIDDEN) {
    snprintf(what, sizeof what, "is %lld, expected 1..%lld", (long long)a->hidden_size, (long long)HS_MAX_HIDDEN);
    return attr_fail(err, file, DF_HS_ATTR_HIDDEN_SIZE, "set it to the target model's hidden size", what);
  }
  const char *ids_hint = "store the K target layer ids the features were captured from";
  if (!a->layer_ids) return attr_fail(err, file, DF_HS_ATTR_LAYER_IDS, ids_hint, "is missing");
  if (a->num_layers < 1 || a->num_layers > DF_HS_MAX_LAYERS) {
    snprintf(what, sizeof what, "has %lld entries, expected 1..%d", (long long)a->num_layers, DF_HS_MAX_LAYERS);
    return attr_fail(err, file, DF_HS_ATTR_LAYER_IDS, ids_hint, what);
  }
  for (int64_t j = 0; j < a->num_layers; j++)
    if (a->layer_ids[j] < 0 || a->layer_ids[j] > INT_MAX) {
      snprintf(what, sizeof what, "entry %lld is %lld, expected a layer index >= 0", (long long)j,
               (long long)a->layer_ids[j]);
      return attr_fail(err, file, DF_HS_ATTR_LAYER_IDS, ids_hint, what);
    }
  return DF_OK;
}

// Absent is accepted (version-1 shards before the attribute, documented as DF_HS_CONVENTION); anything but
// DF_HS_CONVENTION is refused, so a capture shifted by one layer never trains a draft silently.
static df_status check_convention(const df_hs_attrs *a, const char *file, df_error *err) {
  if (!a->convention || !strcmp(a->convention, DF_HS_CONVENTION)) return DF_OK;
  char what[320];
  if (!strcmp(a->convention, DF_HS_CONVENTION_SHIFTED)) {
    snprintf(what, sizeof what,
             "is \"%s\": id L holds the input of decoder layer L (the output of layer L-1), one layer "
             "earlier than the \"" DF_HS_CONVENTION "\" draftforge, SpecForge and SGLang use",
             a->convention);
    return attr_fail(err, file, DF_HS_ATTR_CONVENTION,
                     "recapture with draftforge capture, or re-import with tools/import_specforge.py "
                     "--capture-convention 'hidden_states[L]' so the ids name the layers actually stored",
                     what);
  }
  snprintf(what, sizeof what, "is \"%.64s\", expected \"" DF_HS_CONVENTION "\"", a->convention);
  return attr_fail(err, file, DF_HS_ATTR_CONVENTION,
                   "id L must hold the output of decoder layer L (transformers' hidden_states[L+1]); see "
                   "docs/data-format.md",
                   what);
}

df_status df_hs_check_attrs(const df_hs_attrs *a, const char *file, df_dtype *dtype, df_error *err) {
  DF_TRY(check_format_version(a, file, err));
  DF_TRY(check_shape_attrs(a, file, err));
  DF_TRY(check_convention(a, file, err));
  const char *hint = "dtype must be \"bfloat16\" (uint16 bits) or \"float32\"";
  if (!a->dtype) return attr_fail(err, file, DF_HS_ATTR_DTYPE, hint, "is missing");
  if (!strcmp(a->dtype, "bfloat16")) {
    *dtype = DF_BF16;
  } else if (!strcmp(a->dtype, "float32")) {
    *dtype = DF_F32;
  } else {
    char what[128];
    snprintf(what, sizeof what, "is \"%.64s\", expected \"bfloat16\" or \"float32\"", a->dtype);
    return attr_fail(err, file, DF_HS_ATTR_DTYPE, hint, what);
  }
  return DF_OK;
}

static const char *elem_name(df_hs_elem e) {
  switch (e) {
  case DF_HS_T_I64: return "int64";
  case DF_HS_T_I32: return "int32";
  case DF_HS_T_U8: return "uint8";
  case DF_HS_T_U16: return "uint16";
  case DF_HS_T_F32: return "float32";
  case DF_HS_T_OTHER: break;
  }
  return "another type";
}

static df_status dset_fail(df_error *err, const char *file, const char *name, const char *hint, const char *what) {
  char where[256];
  where_of(where, sizeof where, file, name);
  return DF_FAIL(err, DF_ERR_FORMAT, where, hint, "shard %s: dataset '%s' %s", file ? file : "?", name, what);
}

// Presence, element type and rank of one dataset; rows/cols < 0 mean "not checked here".
static df_status check_dset(const df_hs_dset_shape *d, const char *file, const char *name, df_hs_elem elem, int ndim,
                            int64_t rows, int64_t cols, const char *hint, df_error *err) {
  char what[200];
  if (!d->present) return dset_fail(err, file, name, hint, "is missing");
  if (d->elem != elem) {
    snprintf(what, sizeof what, "has element type %s, expected %s", elem_name(d->elem), elem_name(elem));
    return dset_fail(err, file, name, hint, what);
  }
  if (d->ndim != ndim) {
    snprintf(what, sizeof what, "has %d dimensions, expected %d", d->ndim, ndim);
    return dset_fail(err, file, name, hint, what);
  }
  if (rows >= 0 && d->dims[0] != rows) {
    snprintf(what, sizeof what, "has %lld rows, expected T = %lld (the length of input_ids)", (long long)d->dims[0],
             (long long)rows);
    return dset_fail(err, file, name, hint, what);
  }
  if (ndim == 2 && cols >= 0 && d->dims[1] != cols) {
    snprintf(what, sizeof what, "is %lld wide, expected %lld", (long long)d->dims[1], (long long)cols);
    return dset_fail(err, file, name, hint, what);
  }
  return DF_OK;
}

df_status df_hs_check_layout(const df_hs_layout *l, int64_t k, int64_t h, df_dtype dtype, const char *file,
                             int64_t *num_samples, int64_t *num_tokens, df_error *err) {
  const char *hint = "the shard does not follow docs/data-format.md; re-create it or run "
                     "tools/hidden_states.py validate";
  DF_TRY(check_dset(&l->offsets, file, DF_HS_DS_OFFSETS, DF_HS_T_I64, 1, -1, -1, hint, err));
  if (l->offsets.dims[0] < 1)
    return dset_fail(err, file, DF_HS_DS_OFFSETS, hint, "is empty, expected N + 1 >= 1 entries");
  DF_TRY(check_dset(&l->input_ids, file, DF_HS_DS_INPUT_IDS, DF_HS_T_I32, 1, -1, -1, hint, err));
  int64_t t = l->input_ids.dims[0];
  if (t < 0) return dset_fail(err, file, DF_HS_DS_INPUT_IDS, hint, "has a negative length");
  DF_TRY(check_dset(&l->loss_mask, file, DF_HS_DS_LOSS_MASK, DF_HS_T_U8, 1, t, -1, hint, err));
  df_hs_elem he = dtype == DF_BF16 ? DF_HS_T_U16 : DF_HS_T_F32;
  const char *width_hint = "hidden_states must be K·H wide (K = len(target_layer_ids), H = hidden_size); check "
                           "the attributes match the capture";
  DF_TRY(check_dset(&l->hidden, file, DF_HS_DS_HIDDEN, he, 2, t, k * h, width_hint, err));
  if (l->last_hidden.present) DF_TRY(check_dset(&l->last_hidden, file, DF_HS_DS_LAST_HIDDEN, he, 2, t, h, hint, err));
  *num_samples = l->offsets.dims[0] - 1;
  *num_tokens = t;
  return DF_OK;
}

df_status df_hs_check_index(const int64_t *offsets, int64_t n_offsets, int64_t num_tokens, const char *file,
                            df_error *err) {
  char where[256];
  where_of(where, sizeof where, file, DF_HS_DS_OFFSETS);
  const char *hint = "sample i is rows offsets[i]..offsets[i+1]; offsets start at 0, strictly increase and end "
                     "at T = len(input_ids)";
  const char *f = file ? file : "?";
  if (n_offsets < 1) return DF_FAIL(err, DF_ERR_FORMAT, where, hint, "shard %s: sample_offsets is empty", f);
  if (offsets[0] != 0)
    return DF_FAIL(err, DF_ERR_FORMAT, where, hint, "shard %s: sample_offsets[0] is %lld, expected 0", f,
                   (long long)offsets[0]);
  for (int64_t i = 0; i + 1 < n_offsets; i++) {
    if (offsets[i + 1] <= offsets[i])
      return DF_FAIL(err, DF_ERR_FORMAT, where, hint,
                     "shard %s: sample %lld: sample_offsets[%lld] = %lld is not above sample_offsets[%lld] = %lld "
                     "(offsets must strictly increase; empty samples are not allowed)",
                     f, (long long)i, (long long)(i + 1), (long long)offsets[i + 1], (long long)i,
                     (long long)offsets[i]);
    if (offsets[i + 1] > num_tokens)
      return DF_FAIL(err, DF_ERR_FORMAT, where, hint,
                     "shard %s: sample %lld: sample_offsets[%lld] = %lld is past T = %lld rows", f, (long long)i,
                     (long long)(i + 1), (long long)offsets[i + 1], (long long)num_tokens);
  }
  if (offsets[n_offsets - 1] != num_tokens)
    return DF_FAIL(err, DF_ERR_FORMAT, where, hint, "shard %s: sample_offsets[N = %lld] is %lld, expected T = %lld", f,
                   (long long)(n_offsets - 1), (long long)offsets[n_offsets - 1], (long long)num_tokens);
  return DF_OK;
}

uint16_t df_hs_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x0040u); // keep sign, force quiet
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb; // round to nearest, ties to even
  return (uint16_t)(u >> 16);
}

float df_hs_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}
