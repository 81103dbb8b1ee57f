// The tensor half of `draftforge inspect EXPORT` (train/export/inspect_export.h): every tensor SGLang 0.5.23's loader
// fills for the class (file names before its q/k/v → qkv_proj and gate/up → gate_up_proj fusing, with the
// shard shapes its weight loaders assert), against model.safetensors. A parameter no tensor fills is served
// uninitialised (SGLang does not check); a misshaped one trips an assert; an unknown backbone tensor is
// skipped; an unknown markov_head.* / confidence_head.* one raises. The confidence head (and an MoE router)
// lives in fp32, so a 16-bit copy has already lost its precision.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/safetensors.h"
#include "train/export/inspect_export.h"

typedef struct {
  char name[96];
  int ndim;
  int64_t shape[2];
  bool f32;  // kept in fp32 by the server
  bool conf; // built only outside the static ragged-verify mode
  bool seen;
} expect;

typedef struct {
  expect *v;
  int n, cap;
  bool oom;
} expects;

static void add(expects *e, const char *name, int64_t d0, int64_t d1, bool f32) {
  if (e->n == e->cap) {
    int cap = e->cap ? 2 * e->cap : 64;
    expect *v = realloc(e->v, (size_t)cap * sizeof *v);
    if (!v) {
      e->oom = true;
      return;
    }
    e->v = v, e->cap = cap;
  }
  expect *x = &e->v[e->n++];
  memset(x, 0, sizeof *x);
  snprintf(x->name, sizeof x->name, "%s", name);
  x->ndim = d1 > 0 ? 2 : 1, x->shape[0] = d0, x->shape[1] = d1, x->f32 = f32;
  x->conf = !strncmp(name, "confidence_head.", 16);
}

static void addf(expects *e, int64_t d0, int64_t d1, bool f32, const char *fmt, long long i, long long j) {
  char name[96];
  snprintf(name, sizeof name, fmt, i, j);
  add(e, name, d0, d1, f32);
}

static void mlp(expects *e, const df_serve_shape *s, long long i) {
  if (s->cls == DF_SERVE_DENSE_DFLASH || s->cls == DF_SERVE_DENSE_DSPARK) {
    addf(e, s->I, s->H, false, "layers.%lld.mlp.gate_proj.weight", i, 0);
    addf(e, s->I, s->H, false, "layers.%lld.mlp.up_proj.weight", i, 0);
    addf(e, s->H, s->I, false, "layers.%lld.mlp.down_proj.weight", i, 0);
    return;
  }
  addf(e, s->E, s->H, true, "layers.%lld.mlp.gate.weight", i, 0);
  if (s->router_bias) addf(e, s->E, 0, true, "layers.%lld.mlp.gate.bias", i, 0);
  for (long long x = 0; x < s->E; x++) {
    addf(e, s->moe_I, s->H, false, "layers.%lld.mlp.experts.%lld.gate_proj.weight", i, x);
    addf(e, s->moe_I, s->H, false, "layers.%lld.mlp.experts.%lld.up_proj.weight", i, x);
    addf(e, s->H, s->moe_I, false, "layers.%lld.mlp.experts.%lld.down_proj.weight", i, x);
  }
  if (s->shared != 1) return;
  addf(e, s->shared_I, s->H, false, "layers.%lld.mlp.shared_expert.gate_proj.weight", i, 0);
  addf(e, s->shared_I, s->H, false, "layers.%lld.mlp.shared_expert.up_proj.weight", i, 0);
  addf(e, s->H, s->shared_I, false, "layers.%lld.mlp.shared_expert.down_proj.weight", i, 0);
  addf(e, 1, s->H, false, "layers.%lld.mlp.shared_expert_gate.weight", i, 0);
}

static void expected(expects *e, const df_serve_shape *s) {
  const int64_t q = s->nh * s->hd, kv = s->nkv * s->hd, r = s->markov_rank, H = s->H;
  add(e, "fc.weight", H, s->K * H, false);
  add(e, "hidden_norm.weight", H, 0, false);
  add(e, "norm.weight", H, 0, false);
  static const char *const proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  for (long long i = 0; i < s->n; i++) {
    addf(e, H, 0, false, "layers.%lld.input_layernorm.weight", i, 0);
    addf(e, H, 0, false, "layers.%lld.post_attention_layernorm.weight", i, 0);
    addf(e, s->hd, 0, false, "layers.%lld.self_attn.q_norm.weight", i, 0);
    addf(e, s->hd, 0, false, "layers.%lld.self_attn.k_norm.weight", i, 0);
    for (int p = 0; p < 4; p++) {
      const int64_t rows = p == 0 ? q : p < 3 ? kv : H, cols = p == 3 ? q : H;
      char name[96];
      snprintf(name, sizeof name, "layers.%lld.self_attn.%s.weight", i, proj[p]);
      add(e, name, rows, cols, false);
      snprintf(name, sizeof name, "layers.%lld.self_attn.%s.bias", i, proj[p]);
      if (s->attention_bias) add(e, name, rows, 0, false);
    }
    mlp(e, s, i);
  }
  if (s->domino) { // the GRU head, as SpecForge's DominoDraftModel names it (a Domino loader's strict load)
    const int64_t G = s->domino_G, E = s->domino_E;
    add(e, "prefix_gru.weight_ih_l0", 3 * G, H, false);
    add(e, "prefix_gru.weight_hh_l0", 3 * G, G, false);
    add(e, "embed_proj.0.weight", E, H + G, false);
    add(e, "embed_proj.2.weight", s->V, E, false);
  }
  if (s->cls != DF_SERVE_DENSE_DSPARK && s->cls != DF_SERVE_MOE_DSPARK) return;
  add(e, "markov_head.markov_w1.weight", s->V, r, false);
  add(e, "markov_head.markov_w2.weight", s->V, r, false);
  if (s->markov_type == 1) add(e, "markov_head.gate_proj.weight", r, H + r, false);
  if (s->markov_type == 1) add(e, "markov_head.gate_proj.bias", r, 0, false);
  if (s->markov_type == 2) add(e, "markov_head.joint_proj.weight", 3 * r, 2 * r + H, false);
  if (s->markov_type == 2) add(e, "markov_head.joint_proj.bias", 3 * r, 0, false);
  add(e, "confidence_head.proj.weight", 1, H + (s->conf_with_markov ? r : 0), true);
  add(e, "confidence_head.proj.bias", 1, 0, true);
}

static expect *find(expects *e, const char *name) {
  const char *n = strncmp(name, "model.", 6) ? name : name + 6;
  for (int i = 0; i < e->n; i++)
    if (!strcmp(e->v[i].name, n)) return &e->v[i];
  return NULL;
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
  if (ndim == 1)
    snprintf(buf, n, "[%lld]", (long long)shape[0]);
  else
    snprintf(buf, n, "[%lld, %lld]", (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 0));
}

static void check_file_tensor(expects *e, const df_serve_shape *s, const df_st_tensor *t, df_serve_log *log,
                              int *conf_tensors) {
  expect *x = find(e, t->name);
  const bool moe = s->cls == DF_SERVE_MOE_DFLASH || s->cls == DF_SERVE_MOE_DSPARK;
  *conf_tensors += !strncmp(t->name, "confidence_head.", 16);
  if (!x) {
    if (!strncmp(t->name, "markov_head.", 12))
      df_serve_line(log, "PROBLEM", "%-44s no such parameter: SGLang raises \"unexpected markov weight\"", t->name);
    else if (!strncmp(t->name, "confidence_head.", 16))
      df_serve_line(log, "PROBLEM", "%-44s no such parameter: cap-accept / compact raise", t->name);
    else if (moe && strstr(t->name, ".mlp."))
      df_serve_line(log, "PROBLEM",
                    "%-44s no such MoE parameter: the MoE class maps every *.mlp.* tensor and raises "
                    "(a leftover gate.input_mean would shift the router twice)",
                    t->name);
    else if (!strncmp(t->name, "prefix_gru.", 11) || !strncmp(t->name, "embed_proj.", 11))
      df_serve_line(log, "PROBLEM",
                    "%-44s Domino projector weights without projector_type domino: SGLang's DFlash raises", t->name);
    else if (strncmp(t->name, "lm_head.", 8) && strncmp(t->name, "embed_tokens.", 13))
      df_serve_line(log, "NOTE", "%-44s no such parameter: SGLang skips it", t->name);
    return;
  }
  x->seen = true;
  char want[48], got[48];
  shape_text(want, sizeof want, x->ndim, x->shape);
  shape_text(got, sizeof got, t->ndim, t->shape);
  bool same = t->ndim == x->ndim && t->shape[0] == x->shape[0] && (x->ndim == 1 || t->shape[1] == x->shape[1]);
  if (!same)
    df_serve_line(log, "PROBLEM", "%-44s %s, SGLang's parameter is %s: its loader asserts%s", t->name, got, want,
                  x->conf ? " (cap-accept / compact)" : "");
  else if (x->f32 && t->dtype != DF_ST_F32 && t->dtype != DF_ST_F64)
    df_serve_line(log, "PROBLEM", "%-44s %s: SGLang keeps it in fp32, this copy has lost the precision", t->name,
                  df_st_dtype_name(t->dtype));
}

df_status df_inspect_export_tensors(const char *dir, const df_serve_shape *s, df_serve_log *log, df_error *err) {
  df_st_model *m = NULL;
  DF_TRY(df_st_model_open(dir, &m, err));
  expects e = {0};
  expected(&e, s);
  if (e.oom) {
    free(e.v);
    df_st_model_close(m);
    return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory listing the expected tensors");
  }
  int conf_tensors = 0, before = log->problems;
  for (int i = 0; i < df_st_model_count(m); i++)
    check_file_tensor(&e, s, df_st_model_at(m, i, NULL), log, &conf_tensors);
  for (int i = 0; i < e.n; i++) {
    if (e.v[i].seen || (e.v[i].conf && conf_tensors == 0)) continue;
    char want[48];
    shape_text(want, sizeof want, e.v[i].ndim, e.v[i].shape);
    df_serve_line(log, "PROBLEM", "%-44s %s missing: %s", e.v[i].name, want,
                  e.v[i].conf ? "cap-accept / compact raise" : "SGLang serves the parameter uninitialised");
  }
  bool dspark = s->cls == DF_SERVE_DENSE_DSPARK || s->cls == DF_SERVE_MOE_DSPARK;
  if (dspark && conf_tensors == 0)
    df_serve_line(log, "NOTE",
                  "%-44s none: SGLang serves this draft only in the default ragged-verify mode "
                  "(SGLANG_RAGGED_VERIFY_MODE=static); cap-accept and compact build the head and refuse to load it",
                  "confidence_head.*");
  if (log->problems == before)
    df_serve_line(log, "ok", "%-44s all %d expected tensors present with SGLang's shapes (%d in the file)", "tensors",
                  e.n - (conf_tensors ? 0 : (dspark ? 2 : 0)), df_st_model_count(m));
  free(e.v);
  df_st_model_close(m);
  return DF_OK;
}
