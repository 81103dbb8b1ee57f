// MoE drafts end to end on the tiny fixture (tests/fixtures/dflash_step target and data, configs/tiny-dflash-moe
// *.json): the expert init, `draftforge step` (aux loss in the objective and step.json, gradient names per
// layout, no buffers), the aux gradient's scale in both gradient modes and its finite-difference check through
// the whole step, eval (no aux, no buffer change), AdamW leaving buffers alone, checkpoint names, bit-exact
// resume (qwen3_5_moe + sample centering + switch aux; deepseek_v4 noaux_tc + groups + clamp), moe/* metrics,
// and the export (refusals, fold of centering checked on router logits, serving fields, layout round trip).
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/draft_model.h"
#include "modeling/safetensors.h"
#include "moe/ffn_moe.h"
#include "moe/layout.h"
#include "tests/common/fixture.h"
#include "train/data/batch.h"
#include "train/eval/evaluate.h"
#include "train/export/export.h"
#include "train/observe/metrics_log.h"
#include "train/recipe/recipe.h"
#include "train/step/resources.h"
#include "train/step/step.h"
#include "train/trainer/trainer.h"

#define FX       DF_FIXTURE_DIR "/dflash_step"
#define CFG_QWEN DF_SOURCE_DIR "/configs/tiny-dflash-moe.json"
#define CFG_DS   DF_SOURCE_DIR "/configs/tiny-dflash-moe-deepseek.json"

// ---- temp dirs, configs, recipes ---------------------------------------------------------------------------------

typedef struct {
  char root[256];
} tdir;

static void tdir_open(tdir *d, const char *name) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_moe_train_%s_%ld", name, (long)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
}

static void tdir_close(tdir *d) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

// A copy of the config at base with dflash_config.moe_aux_loss_coeff = coeff (coeff < 0: unchanged).
static void write_cfg(const char *dst, const char *base, double coeff) {
  json_error_t je;
  json_t *o = json_load_file(base, 0, &je);
  cr_assert(o, "cannot read %s: %s", base, je.text);
  if (coeff >= 0) json_object_set_new(json_object_get(o, "dflash_config"), "moe_aux_loss_coeff", json_real(coeff));
  cr_assert_eq(json_dump_file(o, dst, JSON_INDENT(2)), 0);
  json_decref(o);
}

// A recipe over the fixture target and data; extra is appended to the training section.
static void write_recipe(const char *path, const char *cfg, const char *extra) {
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  fprintf(fp,
          "model:\n"
          "  target_model_path: " FX "/target\n"
          "  draft_model_config: %s\n"
          "data:\n"
          "  hidden_states_path: " FX "/data\n"
          "  max_length: 64\n"
          "training:\n"
          "  strategy: dflash\n"
          "  batch_size: 2\n"
          "  num_anchors: 4\n"
          "  loss_decay_gamma: 7.0\n"
          "  objective_chunk_blocks: 2\n"
          "  seed: 42\n"
          "%s"
          "run_id: t\n",
          cfg, extra ? extra : "");
  fclose(fp);
}

static const char *TRAIN_EXTRA = "  accumulation_steps: 2\n"
                                 "  num_epochs: 8\n"
                                 "  total_steps: 6\n"
                                 "  learning_rate: 1e-3\n"
                                 "  warmup_ratio: 0.25\n"
                                 "  max_grad_norm: 1.0\n"
                                 "  weight_decay: 0.1\n"
                                 "  log_interval: 1\n";

// ---- a loaded step rig (recipe, resources, model, first batch) ----------------------------------------------------

typedef struct {
  const df_recipe *rc;
  df_run_resources res;
  df_ctx *ctx;
  df_draft_model *m;
  df_batch batch;
  df_strategy_run *run;
} rig;

static void rig_open(rig *r, const char *recipe) {
  memset(r, 0, sizeof *r);
  df_error err = {0};
  df_recipe_options ro = {0};
  DF_ASSERT_OK(df_recipe_load(recipe, &ro, &r->rc, &err), &err);
  DF_ASSERT_OK(df_run_resources_load(r->rc, &r->res, &err), &err);
  r->ctx = df_test_cpu_ctx(1);
  DF_ASSERT_OK(df_draft_model_create(r->res.draft, r->ctx, &r->m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(r->m, 42, &err), &err);
  DF_ASSERT_OK(df_batch_first(r->rc->data.hidden_states_path, r->rc->training.seed, r->rc->training.batch_size,
                              r->rc->data.max_length, r->res.draft, &r->batch, &err),
               &err);
  const df_step_settings set = df_step_settings_of(r->rc, r->res.mask_token_id, NULL);
  DF_ASSERT_OK(df_step_open(r->ctx, r->m, r->res.draft, &r->res.frozen, &set, false, &r->run, &err), &err);
}

static void rig_close(rig *r) {
  df_strategy_close(r->run);
  df_batch_free(&r->batch);
  df_draft_model_free(r->m);
  df_ctx_destroy(r->ctx);
  df_run_resources_free(&r->res);
  df_recipe_free(r->rc);
}

// One micro-step from a fresh anchor stream; returns the results (caller frees).
static df_step_result rig_step(rig *r, double grad_scale) {
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, 42);
  df_step_result met;
  df_error err = {0};
  DF_ASSERT_OK(df_step_micro_scaled(r->run, &r->batch, &s, grad_scale, false, &met, &err), &err);
  return met;
}

static float *copy_flat(const float *x, int64_t n) {
  float *c = malloc(sizeof(float) * (size_t)n);
  cr_assert(c);
  memcpy(c, x, sizeof(float) * (size_t)n);
  return c;
}

static const df_param *param(const df_draft_model *m, const char *name) {
  const df_param *e = df_params_find(df_draft_model_params(m), name);
  cr_assert(e, "no parameter %s", name);
  return e;
}

// ---- init ------------------------------------------------------------------------------------------------------

Test(moe_train, experts_are_initialized_with_normals) {
  df_error err = {0};
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(CFG_QWEN, &cfg, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, 7, &err), &err);
  const float *w = df_draft_model_weights(m);
  static const char *const names[] = {"layers.0.mlp.experts.w1", "layers.1.mlp.experts.w2", "layers.0.mlp.gate.weight"};
  for (int k = 0; k < 3; k++) {
    const df_param *e = param(m, names[k]);
    double ss = 0;
    for (int64_t i = 0; i < e->numel; i++) ss += (double)w[e->offset + i] * w[e->offset + i];
    double std = sqrt(ss / (double)e->numel);
    cr_expect(std > 0.017 && std < 0.023, "%s: std %g, expected ~0.02", names[k], std);
  }
  const df_param *mu = param(m, "layers.0.mlp.gate.input_mean");
  for (int64_t i = 0; i < mu->numel; i++) cr_expect_eq(w[mu->offset + i], 0.0f);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
}

// ---- draftforge step -------------------------------------------------------------------------------------------

static json_t *load_json(const char *path) {
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  cr_assert(o, "cannot read %s: %s", path, je.text);
  return o;
}

static double jnum(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  cr_assert(json_is_number(v), "no number %s", key);
  return json_number_value(v);
}

static bool st_has(const df_st_model *f, const char *name) { return df_st_model_find(f, name, NULL) != NULL; }

Test(moe_train, step_adds_the_aux_loss_and_dumps_layout_names) {
  tdir d;
  tdir_open(&d, "step");
  char cfg_on[400], cfg_off[400], rec_on[400], rec_off[400], dump_on[400], dump_off[400];
  snprintf(cfg_on, sizeof cfg_on, "%s/on.json", d.root);
  snprintf(cfg_off, sizeof cfg_off, "%s/off.json", d.root);
  write_cfg(cfg_on, CFG_QWEN, 0.01);
  write_cfg(cfg_off, CFG_QWEN, 0.0);
  snprintf(rec_on, sizeof rec_on, "%s/on.yaml", d.root);
  snprintf(rec_off, sizeof rec_off, "%s/off.yaml", d.root);
  write_recipe(rec_on, cfg_on, NULL);
  write_recipe(rec_off, cfg_off, NULL);
  snprintf(dump_on, sizeof dump_on, "%s/dump_on", d.root);
  snprintf(dump_off, sizeof dump_off, "%s/dump_off", d.root);
  df_error err = {0};
  df_step_result a, b;
  DF_ASSERT_OK(df_step_run(rec_on, dump_on, 1, NULL, &a, &err), &err);
  DF_ASSERT_OK(df_step_run(rec_off, dump_off, 1, NULL, &b, &err), &err);
  // aux > 0 and finite; the CE part is the coefficient-0 run's (the aux loss does not change the forward)
  cr_expect(isfinite(a.aux_loss) && a.aux_loss > 0, "aux_loss %g", a.aux_loss);
  cr_expect_eq(b.aux_loss, 0.0);
  cr_expect_eq(a.loss_den, b.loss_den);
  cr_expect(fabs(a.loss - (b.loss + a.aux_loss)) <= 1e-12 * fabs(a.loss), "loss %.17g != %.17g + %.17g", a.loss, b.loss,
            a.aux_loss);
  cr_expect(fabs(a.loss_num - (b.loss_num + a.aux_loss * a.loss_den)) <= 1e-12 * fabs(a.loss_num));
  // uniform routing gives coeff·k per layer; two layers of near-uniform routing: about 2 · 0.01 · 2
  cr_expect(a.aux_loss > 0.02 && a.aux_loss < 0.08, "aux_loss %g", a.aux_loss);

  char p[600];
  snprintf(p, sizeof p, "%s/step.json", dump_on);
  json_t *sj = load_json(p);
  cr_expect(fabs(jnum(sj, "aux_loss") - a.aux_loss) <= 1e-15);
  cr_expect(fabs(jnum(sj, "loss") - a.loss) <= 1e-15);
  json_decref(sj);

  // grads.safetensors: qwen per-expert names, every trainable parameter, no buffer
  snprintf(p, sizeof p, "%s/grads.safetensors", dump_on);
  df_st_model *f;
  DF_ASSERT_OK(df_st_model_open(p, &f, &err), &err);
  for (int e = 0; e < 4; e++) {
    char n[128];
    snprintf(n, sizeof n, "layers.1.mlp.experts.%d.gate_proj.weight", e);
    cr_expect(st_has(f, n), "missing %s", n);
    snprintf(n, sizeof n, "layers.0.mlp.experts.%d.down_proj.weight", e);
    cr_expect(st_has(f, n), "missing %s", n);
  }
  cr_expect(st_has(f, "layers.0.mlp.gate.weight"));
  cr_expect(st_has(f, "layers.0.mlp.shared_expert.up_proj.weight"));
  cr_expect(st_has(f, "layers.0.mlp.shared_expert_gate.weight"));
  cr_expect(!st_has(f, "layers.0.mlp.experts.w1"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.input_mean"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.input_mean_steps"));
  df_st_model_close(f);
  df_step_result_free(&a);
  df_step_result_free(&b);

  // deepseek layout: experts.{e}.w1.weight, and the noaux_tc selection bias (a buffer) is not dumped
  char rec_ds[400], dump_ds[400];
  snprintf(rec_ds, sizeof rec_ds, "%s/ds.yaml", d.root);
  write_recipe(rec_ds, CFG_DS, NULL);
  snprintf(dump_ds, sizeof dump_ds, "%s/dump_ds", d.root);
  DF_ASSERT_OK(df_step_run(rec_ds, dump_ds, 1, NULL, &a, &err), &err);
  cr_expect_eq(a.aux_loss, 0.0); // deepseek_v4 balances without an aux loss
  df_step_result_free(&a);
  snprintf(p, sizeof p, "%s/grads.safetensors", dump_ds);
  DF_ASSERT_OK(df_st_model_open(p, &f, &err), &err);
  cr_expect(st_has(f, "layers.0.mlp.experts.7.w1.weight"));
  cr_expect(st_has(f, "layers.1.mlp.experts.0.w2.weight"));
  cr_expect(st_has(f, "layers.1.mlp.shared_experts.w3.weight"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.bias"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.balance.bias"));
  df_st_model_close(f);
  tdir_close(&d);
}

// ---- the aux gradient -------------------------------------------------------------------------------------------

Test(moe_train, aux_gradient_scale_and_finite_differences) {
  tdir d;
  tdir_open(&d, "auxgrad");
  char cfg_on[400], cfg_off[400], rec_on[400], rec_off[400];
  snprintf(cfg_on, sizeof cfg_on, "%s/on.json", d.root);
  snprintf(cfg_off, sizeof cfg_off, "%s/off.json", d.root);
  write_cfg(cfg_on, CFG_QWEN, 1.0); // a large coefficient: the aux term is O(1) and its gradient clear of noise
  write_cfg(cfg_off, CFG_QWEN, 0.0);
  snprintf(rec_on, sizeof rec_on, "%s/on.yaml", d.root);
  snprintf(rec_off, sizeof rec_off, "%s/off.yaml", d.root);
  write_recipe(rec_on, cfg_on, NULL);
  write_recipe(rec_off, cfg_off, NULL);
  rig on, off;
  rig_open(&on, rec_on);
  rig_open(&off, rec_off);
  const int64_t n = df_params_numel(df_draft_model_params(on.m));

  // step mode (grad_scale 0): the gradient of CE ratio + aux; the difference of the two runs is ∂aux/∂θ
  df_step_result m1 = rig_step(&on, 0.0);
  float *g_on = copy_flat(df_draft_model_grads(on.m), n);
  df_step_result m0 = rig_step(&off, 0.0);
  float *g_off = copy_flat(df_draft_model_grads(off.m), n);
  const double den = m1.loss_den, aux = m1.aux_loss;
  cr_assert(aux > 0.5 && den > 0);
  float *d_aux = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) d_aux[i] = g_on[i] - g_off[i];
  df_step_result_free(&m1);
  df_step_result_free(&m0);

  // trainer mode (grad_scale g): the backward gives g·∂(num + aux·den) = g·den·(∂CE ratio + ∂aux)
  const double g = 0.25;
  m1 = rig_step(&on, g);
  float *t_on = copy_flat(df_draft_model_grads(on.m), n);
  m0 = rig_step(&off, g);
  float *t_off = copy_flat(df_draft_model_grads(off.m), n);
  cr_expect(fabs(m1.loss_num - m0.loss_num - aux * den) <= 1e-9 * fabs(m1.loss_num));
  df_step_result_free(&m1);
  df_step_result_free(&m0);
  const char *routers[] = {"layers.0.mlp.gate.weight", "layers.1.mlp.gate.weight"};
  for (int k = 0; k < 2; k++) {
    const df_param *e = param(on.m, routers[k]);
    float *want = malloc(sizeof(float) * (size_t)e->numel), *got = malloc(sizeof(float) * (size_t)e->numel);
    for (int64_t i = 0; i < e->numel; i++) {
      want[i] = (float)(g * den * d_aux[e->offset + i]);
      got[i] = t_on[e->offset + i] - t_off[e->offset + i];
    }
    df_expect_close(routers[k], got, want, e->numel, 1e-3, 1e-7);
    free(want), free(got);
  }

  // finite differences of the aux value through the whole step, along a random direction over both routers
  // and layer 0's q_proj (the aux loss of layer 1 reaches layer 0 through its input)
  const char *dir_names[] = {"layers.0.mlp.gate.weight", "layers.1.mlp.gate.weight",
                             "layers.0.self_attn.q_proj.weight"};
  float *v = calloc((size_t)n, sizeof(float));
  double dot = 0, vv = 0;
  for (int k = 0; k < 3; k++) {
    const df_param *e = param(on.m, dir_names[k]);
    df_test_fill_uniform(v + e->offset, e->numel, 100 + (uint64_t)k, -1.0f, 1.0f);
  }
  for (int64_t i = 0; i < n; i++) vv += (double)v[i] * v[i];
  for (int64_t i = 0; i < n; i++) v[i] = (float)(v[i] / sqrt(vv)), dot += (double)v[i] * d_aux[i];
  float *w = df_draft_model_weights(on.m), *w0 = copy_flat(w, n);
  const double h = 2e-3;
  double f[2];
  for (int s = 0; s < 2; s++) {
    for (int64_t i = 0; i < n; i++) w[i] = w0[i] + (float)((s ? -h : h) * v[i]);
    df_step_result m = rig_step(&on, 0.0);
    f[s] = m.aux_loss;
    df_step_result_free(&m);
  }
  memcpy(w, w0, sizeof(float) * (size_t)n);
  const double fd = (f[0] - f[1]) / (2 * h);
  cr_expect(fabs(fd - dot) <= 2e-2 * fabs(dot) + 1e-6, "aux directional derivative: fd %.9g, backward %.9g", fd, dot);
  cr_log_info("aux directional derivative: fd %.9g, backward %.9g", fd, dot);
  cr_expect(fabs(dot) > 1e-4, "the probe direction should see the aux gradient (%g)", dot);
  free(v), free(w0), free(d_aux), free(g_on), free(g_off), free(t_on), free(t_off);
  rig_close(&on);
  rig_close(&off);
  tdir_close(&d);
}

// ---- eval --------------------------------------------------------------------------------------------------------

Test(moe_train, eval_has_no_aux_and_changes_no_buffer) {
  tdir d;
  tdir_open(&d, "eval");
  char rec[400];
  snprintf(rec, sizeof rec, "%s/r.yaml", d.root);
  write_recipe(rec, CFG_QWEN, NULL);
  rig r;
  rig_open(&r, rec);
  df_step_result m = rig_step(&r, 0.0); // a training forward: a centering update is now pending
  cr_expect(m.aux_loss > 0);
  df_step_result_free(&m);
  const int64_t n = df_params_numel(df_draft_model_params(r.m));
  float *before = copy_flat(df_draft_model_weights(r.m), n);
  df_eval_options eo = {.batch_size = 2,
                        .max_length = 64,
                        .seed = 1,
                        .set = {.num_anchors = 4, .loss_decay_gamma = 7.0, .mask_token_id = r.res.mask_token_id}};
  df_eval_report rep;
  df_error err = {0};
  DF_ASSERT_OK(df_evaluate(r.ctx, r.m, r.res.draft, &r.res.frozen, FX "/data", &eo, &rep, &err), &err);
  cr_expect(isfinite(rep.loss));
  cr_expect(!memcmp(before, df_draft_model_weights(r.m), sizeof(float) * (size_t)n), "eval changed the weights");
  int nf;
  df_ffn *const *ffns = df_draft_model_ffns(r.m, &nf);
  cr_expect_eq(df_moe_aux_loss_sum(ffns, nf), 0.0, "eval left an aux loss");
  for (int i = 0; i < nf; i++) {
    cr_expect(df_ffn_moe_layer(ffns[i])->training, "eval must hand the model back in training mode");
    cr_expect(df_ffn_moe_layer(ffns[i])->center_pending, "eval must not consume the training stash");
  }
  // the eval loss is the objective alone: the same forward's training loss minus its aux term
  df_eval_report_free(&rep);
  free(before);
  rig_close(&r);
  tdir_close(&d);
}

// ---- the trainer: AdamW and buffers, checkpoint names, metrics, resume -----------------------------------------

typedef struct {
  const df_params *table;
  float *params; // the model's flat weights (known from the first after_update)
  float *snap;   // buffer values right before AdamW
  int checked;
} buf_probe;

static bool is_buffer(const df_param *e) { return e->role == DF_ROLE_BUFFER; }

static void probe_before(void *ctx, int64_t step, const float *grads, int64_t n, double gn, double cc) {
  buf_probe *p = ctx;
  if (!p->params) return;
  for (int i = 0; i < df_params_count(p->table); i++) {
    const df_param *e = df_params_at(p->table, i);
    if (is_buffer(e)) memcpy(p->snap + e->offset, p->params + e->offset, sizeof(float) * (size_t)e->numel);
  }
}

static void probe_after(void *ctx, int64_t step, float *params, int64_t n) {
  buf_probe *p = ctx;
  if (p->params) {
    for (int i = 0; i < df_params_count(p->table); i++) {
      const df_param *e = df_params_at(p->table, i);
      if (!is_buffer(e)) continue;
      cr_expect(!memcmp(p->snap + e->offset, params + e->offset, sizeof(float) * (size_t)e->numel),
                "AdamW changed the buffer %s at step %lld", e->name, (long long)step);
      p->checked++;
    }
  }
  p->params = params;
}

static df_status train(const char *recipe, const char *out, const char *const *sets, const char *resume,
                       const df_train_hooks *hooks, df_train_summary *s, df_error *err) {
  const char *all[8];
  char o[600];
  snprintf(o, sizeof o, "output_dir=%s", out);
  int n = 0;
  all[n++] = o;
  for (int i = 0; sets && sets[i]; i++) all[n++] = sets[i];
  df_train_options opt = {.recipe_path = recipe,
                          .overrides = all,
                          .n_overrides = n,
                          .resume = resume,
                          .threads = 1,
                          .hooks = hooks,
                          .no_prefetch = true};
  omp_set_num_threads(1);
  return df_train(&opt, s, err);
}

static char *slurp(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  cr_assert(fp, "cannot open %s", path);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
  buf[n] = 0;
  fclose(fp);
  *len = (size_t)n;
  return buf;
}

static json_t *metrics_rows(const char *run) {
  char p[500];
  snprintf(p, sizeof p, "%s/metrics.jsonl", run);
  FILE *fp = fopen(p, "r");
  cr_assert(fp, "no %s", p);
  json_t *rows = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    cr_assert(o);
    df_metrics_strip_timing(o);
    json_array_append_new(rows, o);
  }
  free(line);
  fclose(fp);
  return rows;
}

static void expect_same_run(const char *a, const char *b, int64_t step) {
  char pa[500], pb[500];
  snprintf(pa, sizeof pa, "%s/checkpoints/step-%08lld/model.safetensors", a, (long long)step);
  snprintf(pb, sizeof pb, "%s/checkpoints/step-%08lld/model.safetensors", b, (long long)step);
  size_t na, nb;
  char *x = slurp(pa, &na), *y = slurp(pb, &nb);
  cr_expect(na == nb && !memcmp(x, y, na), "%s and %s differ", pa, pb);
  free(x), free(y);
  json_t *ma = metrics_rows(a), *mb = metrics_rows(b);
  char *ta = json_dumps(ma, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  char *tb = json_dumps(mb, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  cr_expect_str_eq(ta, tb, "metrics of %s and %s differ", a, b);
  free(ta), free(tb);
  json_decref(ma), json_decref(mb);
}

static void resume_case(const char *name, const char *cfg, bool noaux) {
  tdir d;
  tdir_open(&d, name);
  char rec[400], straight[400], split[400];
  snprintf(rec, sizeof rec, "%s/r.yaml", d.root);
  write_recipe(rec, cfg, TRAIN_EXTRA);
  snprintf(straight, sizeof straight, "%s/straight", d.root);
  snprintf(split, sizeof split, "%s/split", d.root);
  df_train_summary s;
  df_error err = {0};
  const char *every3[] = {"training.save_interval=3", NULL};
  DF_ASSERT_OK(train(rec, straight, every3, NULL, NULL, &s, &err), &err);
  cr_expect_eq(s.last_step, 6);
  const char *half[] = {"training.save_interval=3", "training.max_steps=3", NULL};
  DF_ASSERT_OK(train(rec, split, half, NULL, NULL, &s, &err), &err);
  cr_expect_eq(s.last_step, 3);
  const char *rest[] = {"training.save_interval=3", "training.max_steps=6", NULL};
  DF_ASSERT_OK(train(rec, split, rest, split, NULL, &s, &err), &err);
  cr_expect_eq(s.start_step, 3);
  expect_same_run(straight, split, 6);

  // metrics.jsonl carries the moe/* layer averages at every log step
  json_t *rows = metrics_rows(straight);
  cr_expect_eq(json_array_size(rows), 6);
  for (size_t i = 0; i < json_array_size(rows); i++) {
    const json_t *o = json_array_get(rows, i);
    double maxr = jnum(o, "moe/load_max_ratio"), minr = jnum(o, "moe/load_min_ratio");
    cr_expect(maxr >= 1.0 && minr <= 1.0 && minr >= 0.0, "load ratios %g %g", maxr, minr);
    (void)jnum(o, "moe/experts_unused_frac");
    double aux = jnum(o, "moe/aux_loss");
    cr_expect(noaux ? aux == 0.0 : aux > 0.0);
    cr_expect_eq(json_object_get(o, "moe/bias_abs_max") != NULL, noaux);
    if (noaux) cr_expect(jnum(o, "moe/bias_abs_max") > 0.0); // the noaux_tc bias moved
  }
  json_decref(rows);

  // the checkpoint's model.safetensors goes through the layout, buffers included, fp32 / int64
  char p[600];
  snprintf(p, sizeof p, "%s/checkpoints/step-00000006/model.safetensors", straight);
  df_st_model *f;
  DF_ASSERT_OK(df_st_model_open(p, &f, &err), &err);
  if (noaux) {
    cr_expect(st_has(f, "layers.0.mlp.experts.3.w2.weight"));
    const df_st_tensor *b = df_st_model_find(f, "layers.1.mlp.gate.bias", NULL); // the selection bias
    cr_assert(b);
    cr_expect_eq(b->dtype, DF_ST_F32);
  } else {
    cr_expect(st_has(f, "layers.0.mlp.experts.3.up_proj.weight"));
    const df_st_file *sf = NULL;
    const df_st_tensor *mu = df_st_model_find(f, "layers.0.mlp.gate.input_mean", NULL);
    const df_st_tensor *steps = df_st_model_find(f, "layers.0.mlp.gate.input_mean_steps", &sf);
    cr_assert(mu && steps);
    cr_expect_eq(mu->dtype, DF_ST_F32);
    cr_expect_eq(steps->dtype, DF_ST_I64);
    // every micro-batch's centering update is applied by the boundary: 6 steps × 2 micro-batches
    int64_t nsteps = -1;
    DF_ASSERT_OK(df_st_read_raw(sf, steps, &nsteps, sizeof nsteps, &err), &err);
    cr_expect_eq(nsteps, 12);
  }
  df_st_model_close(f);
  tdir_close(&d);
}

Test(moe_train, resume_is_bit_exact_qwen_centered) { resume_case("resume_qwen", CFG_QWEN, false); }
Test(moe_train, resume_is_bit_exact_deepseek_noaux) { resume_case("resume_ds", CFG_DS, true); }

Test(moe_train, adamw_leaves_buffers_untouched) {
  tdir d;
  tdir_open(&d, "adamw");
  char rec[400], out[400];
  snprintf(rec, sizeof rec, "%s/r.yaml", d.root);
  write_recipe(rec, CFG_QWEN, TRAIN_EXTRA); // weight_decay 0.1: a decayed buffer would move
  snprintf(out, sizeof out, "%s/run", d.root);
  df_error err = {0};
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(CFG_QWEN, &cfg, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  buf_probe p = {.table = df_draft_model_params(m)};
  p.snap = calloc((size_t)df_params_numel(p.table), sizeof(float));
  df_train_hooks h = {.ctx = &p, .before_update = probe_before, .after_update = probe_after};
  df_train_summary s;
  DF_ASSERT_OK(train(rec, out, NULL, NULL, &h, &s, &err), &err);
  cr_expect(p.checked >= 5 * 4, "checked %d buffers", p.checked); // 2 layers × (mean, steps) × 5 steps
  free(p.snap);
  df_draft_model_free(m);
  df_ctx_destroy(ctx);
  df_draft_config_free(cfg);
  tdir_close(&d);
}

// ---- export ----------------------------------------------------------------------------------------------------

Test(moe_train, export_refuses_unservable_recipes) {
  df_error err = {0};
  const df_draft_config *cfg;
  DF_ASSERT_OK(df_draft_config_from_file(CFG_DS, &cfg, &err), &err);
  cr_expect_eq(df_moe_serving_check(cfg->moe, &err), DF_ERR_UNSUPPORTED);
  cr_expect(strstr(err.where, "scoring_func"), "where: %s", err.where);
  df_moe_config m = *cfg->moe;
  m.scoring_func = DF_MOE_SCORE_SOFTMAX;
  cr_expect_eq(df_moe_serving_check(&m, &err), DF_ERR_UNSUPPORTED);
  cr_expect(strstr(err.where, "balance") && strstr(err.msg, "noaux_tc"), "%s: %s", err.where, err.msg);
  m.balance = DF_MOE_BALANCE_NONE;
  cr_expect_eq(df_moe_serving_check(&m, &err), DF_ERR_UNSUPPORTED);
  cr_expect(strstr(err.where, "n_group"), "where: %s", err.where);
  m.n_group = m.topk_group = 1;
  m.n_shared_experts = 2;
  cr_expect_neq(df_moe_serving_check(&m, &err), DF_OK);
  cr_expect(strstr(err.where, "n_shared_experts"), "where: %s", err.where);
  m.n_shared_experts = 1;
  m.num_experts_per_tok = m.n_routed_experts + 1;
  cr_expect_neq(df_moe_serving_check(&m, &err), DF_OK);
  cr_expect(strstr(err.where, "num_experts_per_tok"), "where: %s", err.where);
  m.num_experts_per_tok = 2;
  m.routed_scaling_factor = 1.0;
  cr_expect_neq(df_moe_serving_check(&m, &err), DF_OK);
  cr_expect(strstr(err.where, "swiglu_limit"), "where: %s", err.where);
  m.swiglu_limit = 0;
  cr_expect_eq(df_moe_serving_check(&m, &err), DF_OK);
  df_draft_config_free(cfg);
}

// Router logits of layer `layer` of model m on rows x (eval: centering uses the running mean).
static float *router_logits(df_draft_model *m, int layer, const float *x, int64_t T, int64_t H, df_ctx *ctx) {
  int nf;
  df_ffn *f = df_draft_model_ffns(m, &nf)[layer];
  df_draft_model_set_training(m, false);
  float *saved = calloc((size_t)f->vt->saved_elems(f, T), sizeof(float));
  float *scratch = calloc((size_t)f->vt->scratch_elems(f, T), sizeof(float));
  float *y = calloc((size_t)(T * H), sizeof(float));
  df_tensor xt = df_f32((float *)x, T, H), yt = df_f32(y, T, H);
  df_error err = {0};
  DF_ASSERT_OK(f->vt->forward(f, ctx, &xt, &yt, saved, scratch, &err), &err);
  df_moe_layer *L = df_ffn_moe_layer(f);
  const df_moe_routing r = df_moe_layer_saved_routing(L, saved, T);
  const int64_t E = L->router.E;
  float *out = malloc(sizeof(float) * (size_t)(T * E));
  memcpy(out, r.logits, sizeof(float) * (size_t)(T * E));
  free(saved), free(scratch), free(y);
  return out;
}

Test(moe_train, export_folds_centering_into_an_fp32_bias) {
  tdir d;
  tdir_open(&d, "export");
  char rec[400], run[400], exp_dir[400], p[600];
  snprintf(rec, sizeof rec, "%s/r.yaml", d.root);
  write_recipe(rec, CFG_QWEN, TRAIN_EXTRA);
  snprintf(run, sizeof run, "%s/run", d.root);
  snprintf(exp_dir, sizeof exp_dir, "%s/export", d.root);
  df_train_summary s;
  df_error err = {0};
  const char *two[] = {"training.max_steps=2", NULL};
  DF_ASSERT_OK(train(rec, run, two, NULL, NULL, &s, &err), &err);
  df_export_options eo = {.dtype = DF_ST_BF16, .threads = 1};
  DF_ASSERT_OK(df_export(run, exp_dir, &eo, NULL, &err), &err);

  // config.json: serving class, serving fields, the folded router bias, no centering keys
  snprintf(p, sizeof p, "%s/config.json", exp_dir);
  json_t *c = load_json(p);
  cr_expect_str_eq(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "DFlashMoEDraftModel");
  cr_expect(json_is_true(json_object_get(c, "moe_router_bias")));
  cr_expect_eq(json_integer_value(json_object_get(c, "num_experts")), 4);
  cr_expect_eq(json_integer_value(json_object_get(c, "n_routed_experts")), 4);
  cr_expect_str_eq(json_string_value(json_object_get(c, "topk_method")), "greedy");
  cr_expect_str_eq(json_string_value(json_object_get(c, "scoring_func")), "softmax");
  cr_expect_str_eq(json_string_value(json_object_get(c, "shared_expert_gate")), "sigmoid");
  cr_expect(!json_object_get(json_object_get(c, "dflash_config"), "moe_router_center"));
  json_decref(c);

  // model.safetensors: qwen names, the router (gate.weight, gate.bias) fp32 in a bf16 export as the serving
  // class keeps it (moe.md §10), no centering buffers
  snprintf(p, sizeof p, "%s/model.safetensors", exp_dir);
  df_st_model *f;
  DF_ASSERT_OK(df_st_model_open(p, &f, &err), &err);
  const df_st_tensor *b = df_st_model_find(f, "layers.0.mlp.gate.bias", NULL);
  cr_assert(b, "no folded gate.bias");
  cr_expect_eq(b->dtype, DF_ST_F32);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.gate.weight", NULL)->dtype, DF_ST_F32);
  cr_expect_eq(df_st_model_find(f, "layers.0.mlp.experts.0.up_proj.weight", NULL)->dtype, DF_ST_BF16);
  cr_expect(st_has(f, "layers.1.mlp.experts.3.gate_proj.weight"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.input_mean"));
  cr_expect(!st_has(f, "layers.0.mlp.gate.input_mean_steps"));
  df_st_model_close(f);

  // An fp32 export reloads through the layout as the draft its config.json describes, and its router logits
  // (x·Wᵀ + b − W·μ) equal the trained router's centered logits ((x − μ)·Wᵀ + b) in eval.
  char exp32[400];
  snprintf(exp32, sizeof exp32, "%s/export32", d.root);
  eo.dtype = DF_ST_F32;
  DF_ASSERT_OK(df_export(run, exp32, &eo, NULL, &err), &err);
  snprintf(p, sizeof p, "%s/config.json", exp32);
  const df_draft_config *ecfg, *scfg;
  DF_ASSERT_OK(df_draft_config_from_file(p, &ecfg, &err), &err);
  cr_expect(ecfg->moe && ecfg->moe->moe_router_bias && ecfg->moe->router_center == DF_MOE_CENTER_NONE);
  snprintf(p, sizeof p, "%s/checkpoints/step-00000002/config.json", run);
  DF_ASSERT_OK(df_draft_config_from_file(p, &scfg, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *em, *sm;
  DF_ASSERT_OK(df_draft_model_create(ecfg, ctx, &em, &err), &err);
  DF_ASSERT_OK(df_draft_model_load(em, exp32, &err), &err);
  DF_ASSERT_OK(df_draft_model_create(scfg, ctx, &sm, &err), &err);
  snprintf(p, sizeof p, "%s/checkpoints/step-00000002", run);
  DF_ASSERT_OK(df_draft_model_load(sm, p, &err), &err);
  const int64_t T = 24, H = 64, E = 4;
  float *x = malloc(sizeof(float) * (size_t)(T * H));
  df_test_fill_uniform(x, T * H, 5, -2.0f, 2.0f);
  // a common mode like the draft's: every token shares an offset the centering removes
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < H; j++) x[t * H + j] += 0.5f * (float)((j % 7) - 3);
  for (int layer = 0; layer < 2; layer++) {
    float *want = router_logits(sm, layer, x, T, H, ctx), *got = router_logits(em, layer, x, T, H, ctx);
    df_expect_close_elementwise("folded router logits", got, want, T * E, 1e-6, 1e-6);
    free(want), free(got);
  }
  // the centering mean is not zero after two steps (the fold did something)
  const df_param *mu = param(sm, "layers.0.mlp.gate.input_mean");
  double mu_abs = 0;
  for (int64_t i = 0; i < mu->numel; i++) mu_abs += fabs(df_draft_model_weights(sm)[mu->offset + i]);
  cr_expect(mu_abs > 0);
  // every tensor but the router bias round-trips exactly through the export's layout
  const df_params *ep = df_draft_model_params(em);
  for (int i = 0; i < df_params_count(ep); i++) {
    const df_param *e = df_params_at(ep, i);
    if (strstr(e->name, "gate.bias")) continue;
    const df_param *s2 = param(sm, e->name);
    cr_expect(!memcmp(df_draft_model_weights(em) + e->offset, df_draft_model_weights(sm) + s2->offset,
                      sizeof(float) * (size_t)e->numel),
              "%s differs after the export round trip", e->name);
  }
  free(x);
  df_draft_model_free(em);
  df_draft_model_free(sm);
  df_ctx_destroy(ctx);
  df_draft_config_free(ecfg);
  df_draft_config_free(scfg);
  tdir_close(&d);
}

// ---- warm start vs resume strictness ----------------------------------------------------------------------------

Test(moe_train, centering_buffers_optional_on_warm_start_only) {
  tdir d;
  tdir_open(&d, "warm");
  char nocenter[400], file[400];
  snprintf(nocenter, sizeof nocenter, "%s/nocenter.json", d.root);
  json_t *o = load_json(CFG_QWEN);
  json_object_del(json_object_get(o, "dflash_config"), "moe_router_center");
  cr_assert_eq(json_dump_file(o, nocenter, JSON_INDENT(2)), 0);
  json_decref(o);
  df_error err = {0};
  const df_draft_config *c0, *c1;
  DF_ASSERT_OK(df_draft_config_from_file(nocenter, &c0, &err), &err);
  DF_ASSERT_OK(df_draft_config_from_file(CFG_QWEN, &c1, &err), &err);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m0, *m1;
  DF_ASSERT_OK(df_draft_model_create(c0, ctx, &m0, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m0, 3, &err), &err);
  snprintf(file, sizeof file, "%s/model.safetensors", d.root);
  DF_ASSERT_OK(df_moe_layout_save(c0->moe, df_draft_model_params(m0), df_draft_model_weights(m0), file, NULL, &err),
               &err);
  DF_ASSERT_OK(df_draft_model_create(c1, ctx, &m1, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m1, 4, &err), &err);
  // required (resume, eval, export): the missing centering buffers are named
  cr_expect_neq(df_draft_model_load(m1, file, &err), DF_OK);
  cr_expect(strstr(err.msg, "gate.input_mean"), "%s", err.msg);
  // optional (warm start): everything else loads, the buffers keep their init values (0)
  DF_ASSERT_OK(df_draft_model_load_ex(m1, file, true, &err), &err);
  const df_param *w0 = param(m0, "layers.1.mlp.experts.w3"), *w1 = param(m1, "layers.1.mlp.experts.w3");
  cr_expect(!memcmp(df_draft_model_weights(m0) + w0->offset, df_draft_model_weights(m1) + w1->offset,
                    sizeof(float) * (size_t)w0->numel));
  const df_param *mu = param(m1, "layers.0.mlp.gate.input_mean_steps");
  cr_expect_eq(df_draft_model_weights(m1)[mu->offset], 0.0f);
  df_draft_model_free(m0);
  df_draft_model_free(m1);
  df_ctx_destroy(ctx);
  df_draft_config_free(c0);
  df_draft_config_free(c1);
  tdir_close(&d);
}
