// `draftforge step` against the PyTorch reference: every case directory under tests/fixtures/dflash_step/
// (tools/reference/make_dflash_fixtures.py), tests/fixtures/dspark_step/ (make_dspark_fixtures.py),
// tests/fixtures/moe_step/ (make_moe_step_fixtures.py: MoE drafts, gradients named through the checkpoint layout) and
// tests/fixtures/domino_step/ (make_domino_fixtures.py) runs through df_step_run; loss terms (the MoE aux loss and
// DSpark's and Domino's metric sums included) must agree to rel 1e-5 and every gradient tensor to
// max|Δ| <= 1e-4·max|ref| + 1e-6, with the same set of names. Also the batch order and anchors (expected/batch.json),
// Domino's proposals (tests/fixtures/domino_step/generate/) and a smoke test of the CLI entry point.
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/safetensors.h"
#include "tests/common/fixture.h"
#include "train/recipe/recipe.h"
#include "train/step/step.h"

#define STEP_DIR   DF_FIXTURE_DIR "/dflash_step"
#define DSPARK_DIR DF_FIXTURE_DIR "/dspark_step"
#define MOE_DIR    DF_FIXTURE_DIR "/moe_step"
#define DOMINO_DIR DF_FIXTURE_DIR "/domino_step"
#define EAGLE3_DIR DF_FIXTURE_DIR "/eagle3_step"

enum { MAX_CASES = 64 };

static bool is_file(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Case directories of dir: subdirectories holding recipe.yaml, sorted. Returns -1 when dir does not exist.
static int list_cases_in(const char *dir, char **names, int cap) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d)) && n < cap) {
    snprintf(p, sizeof p, "%s/%s/recipe.yaml", dir, e->d_name);
    if (e->d_name[0] != '.' && is_file(p)) names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  return n;
}

static int list_cases(char **names, int cap) { return list_cases_in(STEP_DIR, names, cap); }

static void tmpdir_make(char *buf, size_t n) {
  snprintf(buf, n, "/tmp/df_step_test_XXXXXX");
  cr_assert_not_null(mkdtemp(buf), "mkdtemp");
}

static void tmpdir_remove(const char *dir) {
  const char *files[] = {"grads.safetensors", "step.json"};
  char p[1024];
  for (size_t i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    remove(p);
  }
  rmdir(dir);
}

// ---- loss terms ------------------------------------------------------------------------------------------------

static double rel_err(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

static bool expect_close_key(const char *name, json_t *want, const char *key, double got) {
  double w = json_number_value(json_object_get(want, key)), e = rel_err(got, w);
  cr_expect_leq(e, 1e-5, "%s: %s = %.10g, expected %.10g (rel err %.3g)", name, key, got, w, e);
  return e <= 1e-5;
}

// DSpark: every metric sum and the per-position sums the strategy reports (step.json's strategy keys).
static bool expect_dspark_terms(const char *name, json_t *want, const json_t *got) {
  const char *keys[] = {"ce_num",           "l1_num",
                        "confidence_num",   "confidence_abs_error_num",
                        "eval_den",         "teacher_agreement_num",
                        "teacher_top1_num", "draft_top1_num",
                        "tau_num",          "tau_den"};
  bool ok = true;
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    ok = expect_close_key(name, want, keys[i], json_number_value(json_object_get(got, keys[i]))) && ok;
  const char *pos[] = {"ce_position_num", "accuracy_position_num", "position_den"};
  for (int j = 0; j < 3; j++) {
    json_t *arr = json_object_get(want, pos[j]), *mine = json_object_get(got, pos[j]);
    cr_expect_eq(json_array_size(mine), json_array_size(arr), "%s: %s length", name, pos[j]);
    for (size_t k = 0; k < json_array_size(mine) && k < json_array_size(arr); k++) {
      double w = json_number_value(json_array_get(arr, k)), g = json_number_value(json_array_get(mine, k));
      double e = rel_err(g, w);
      cr_expect_leq(e, 1e-5, "%s: %s[%zu] = %.10g, expected %.10g", name, pos[j], k, g, w);
      ok = ok && e <= 1e-5;
    }
  }
  bool teacher = !json_is_null(json_object_get(want, "tau_probabilistic"));
  bool mine = !json_is_null(json_object_get(got, "tau_probabilistic"));
  cr_expect_eq(mine, teacher, "%s: the teacher ran in one implementation only", name);
  return ok && mine == teacher;
}

// Domino: the loss parts, lambda_base and its horizon, every metric and its sums (step.json's strategy keys).
static bool expect_domino_terms(const char *name, json_t *want, const df_step_result *r) {
  const char *keys[] = {"lambda_base", "final_num",       "base_num",     "weight_sum", "final_loss",      "base_loss",
                        "accuracy",    "base_accuracy",   "base_acc_num", "accept_num", "base_accept_num", "accept_den",
                        "accept_len",  "base_accept_len", "global_step",  "total_steps"};
  bool ok = true;
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const json_t *g = json_object_get(r->report, keys[i]);
    cr_expect_not_null(g, "%s: step.json lacks %s", name, keys[i]);
    ok = g && expect_close_key(name, want, keys[i], json_number_value(g)) && ok;
  }
  // the loss is (1 − λ)·final_loss + λ·base_loss of the same micro-step
  const double lam = json_number_value(json_object_get(r->report, "lambda_base"));
  const double mix = (1 - lam) * json_number_value(json_object_get(r->report, "final_loss")) +
                     lam * json_number_value(json_object_get(r->report, "base_loss"));
  cr_expect_leq(rel_err(r->loss, mix), 1e-12, "%s: loss %.12g is not the lambda mix %.12g", name, r->loss, mix);
  cr_expect_eq(r->loss_den, 1.0, "%s: a Domino micro-step weighs 1 in the window", name);
  return ok;
}

static bool expect_terms(const char *dir, const char *name, const df_step_result *r) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s/expected/step.json", dir, name);
  json_error_t je;
  json_t *want = json_load_file(p, 0, &je);
  cr_assert_not_null(want, "%s: %s", p, je.text);
  const char *keys[] = {"loss", "acc_num", "acc_den", "loss_num", "loss_den"};
  const double got[] = {r->loss, r->acc_num, r->acc_den, r->loss_num, r->loss_den};
  const json_t *strategy = json_object_get(want, "strategy");
  const bool domino = json_is_string(strategy) && !strcmp(json_string_value(strategy), "domino");
  bool ok = true;
  // Domino's loss is already a per-micro-step ratio (loss_den 1 in draftforge's accumulation, strategies/domino/
  // strategy.c); its reference's numerator and denominator are checked as final_num / base_num / weight_sum.
  for (int i = 0; i < (domino ? 3 : 5); i++) {
    double w = json_number_value(json_object_get(want, keys[i]));
    double e = rel_err(got[i], w);
    cr_expect_leq(e, 1e-5, "%s: %s = %.10g, expected %.10g (rel err %.3g)", name, keys[i], got[i], w, e);
    ok = ok && e <= 1e-5;
  }
  // MoE drafts: the summed, coefficient-scaled aux loss (loss_num carries aux_loss·loss_den); dense drafts: 0.
  if (json_object_get(want, "aux_loss"))
    ok = expect_close_key(name, want, "aux_loss", r->aux_loss) && ok;
  else {
    cr_expect_eq(r->aux_loss, 0.0, "%s: aux_loss %.10g on a dense draft", name, r->aux_loss);
    ok = ok && r->aux_loss == 0.0;
  }
  json_int_t nb = json_integer_value(json_object_get(want, "num_blocks"));
  cr_expect_eq(r->num_blocks, nb, "%s: num_blocks %lld, expected %lld", name, (long long)r->num_blocks, (long long)nb);
  const json_t *mine = json_object_get(r->report, "strategy");
  cr_expect_eq(mine != NULL, strategy != NULL, "%s: strategy", name);
  if (mine && strategy) cr_expect_str_eq(json_string_value(mine), json_string_value(strategy), "%s: strategy", name);
  if (domino)
    ok = expect_domino_terms(name, want, r) && ok;
  else if (mine)
    ok = expect_dspark_terms(name, want, r->report) && ok;
  fprintf(stderr, "  %-26s loss %.9f (ref %.9f, rel %.1e)  aux %.6g  acc %.0f/%.0f  blocks %lld\n", name, r->loss,
          json_number_value(json_object_get(want, "loss")),
          rel_err(r->loss, json_number_value(json_object_get(want, "loss"))), r->aux_loss, r->acc_num, r->acc_den,
          (long long)r->num_blocks);
  json_decref(want);
  return ok && r->num_blocks == nb;
}

// ---- gradients -------------------------------------------------------------------------------------------------

static float *read_all(const df_st_file *f, const df_st_tensor *t) {
  float *x = malloc((size_t)t->numel * sizeof *x + 4);
  df_error err = {0};
  DF_ASSERT_OK(df_st_read_f32(f, t, x, t->numel, &err), &err);
  return x;
}

// Compares one tensor; returns its max|Δ| / (1e-4·max|ref| + 1e-6) (<= 1 passes).
static double compare_tensor(const char *cname, const df_st_file *gf, const df_st_tensor *g, const df_st_file *wf,
                             const df_st_tensor *w) {
  char sa[64], sb[64];
  cr_expect_str_eq(df_st_shape_str(g, sa, sizeof sa), df_st_shape_str(w, sb, sizeof sb), "%s: %s shape", cname,
                   w->name);
  if (g->numel != w->numel) return INFINITY;
  cr_expect_eq(g->dtype, DF_ST_F32, "%s: %s is not F32", cname, g->name);
  float *x = read_all(gf, g), *y = read_all(wf, w);
  double maxd = 0, maxr = 0;
  for (int64_t i = 0; i < w->numel; i++) {
    maxd = fmax(maxd, fabs((double)x[i] - y[i]));
    maxr = fmax(maxr, fabs((double)y[i]));
  }
  free(x), free(y);
  double ratio = maxd / (1e-4 * maxr + 1e-6);
  cr_expect_leq(ratio, 1.0, "%s: %s max|Δ| %.3g > 1e-4·max|ref| (%.3g) + 1e-6", cname, w->name, maxd, maxr);
  return isnan(ratio) ? INFINITY : ratio;
}

static bool expect_grads(const char *dir, const char *name, const char *dump) {
  char p[1024], q[1024];
  snprintf(p, sizeof p, "%s/%s/expected/grads.safetensors", dir, name);
  snprintf(q, sizeof q, "%s/grads.safetensors", dump);
  df_st_file *wf = NULL, *gf = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open(p, &wf, &err), &err);
  DF_ASSERT_OK(df_st_open(q, &gf, &err), &err);
  bool ok = df_st_count(gf) == df_st_count(wf);
  cr_expect_eq(df_st_count(gf), df_st_count(wf), "%s: %d gradient tensors, expected %d", name, df_st_count(gf),
               df_st_count(wf));
  double worst = 0;
  for (int i = 0; i < df_st_count(wf); i++) {
    const df_st_tensor *w = df_st_at(wf, i), *g = df_st_find(gf, w->name);
    cr_expect_not_null(g, "%s: gradient %s missing", name, w->name);
    if (!g)
      ok = false;
    else
      worst = fmax(worst, compare_tensor(name, gf, g, wf, w));
  }
  for (int i = 0; i < df_st_count(gf); i++) {
    bool known = df_st_find(wf, df_st_at(gf, i)->name) != NULL;
    cr_expect(known, "%s: extra gradient %s", name, df_st_at(gf, i)->name);
    ok = ok && known;
  }
  fprintf(stderr, "  %-26s %d gradients, worst max|Δ| / (1e-4·max|ref| + 1e-6) = %.3g\n", name, df_st_count(wf), worst);
  df_st_close(wf), df_st_close(gf);
  return ok && worst <= 1.0;
}

// ---- batch order and anchors (expected/batch.json: contract §1–§2) ------------------------------------------------

static void expect_batch(const char *dir, const char *name) {
  char p[1024], r[1024];
  snprintf(p, sizeof p, "%s/%s/expected/batch.json", dir, name);
  if (!is_file(p)) return;
  snprintf(r, sizeof r, "%s/%s/recipe.yaml", dir, name);
  json_error_t je;
  json_t *want = json_load_file(p, 0, &je);
  cr_assert_not_null(want, "%s: %s", p, je.text);
  const df_recipe *rc = NULL;
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_load(r, NULL, &rc, &err), &err);
  DF_ASSERT_OK(df_draft_config_from_file(rc->model.draft_model_config, &cfg, &err), &err);
  df_batch b;
  DF_ASSERT_OK(df_batch_first(rc->data.hidden_states_path, rc->training.seed, rc->training.batch_size,
                              rc->data.max_length, cfg, &b, &err),
               &err);
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, rc->training.seed);
  df_dflash_anchors a;
  DF_ASSERT_OK(df_dflash_sample_anchors(&s, b.loss_mask, b.B, b.S, rc->training.num_anchors, &a, &err), &err);
  cr_expect_eq(b.S, json_integer_value(json_object_get(want, "S")), "%s: S", name);
  cr_expect_eq(a.N, json_integer_value(json_object_get(want, "N")), "%s: N", name);
  for (int64_t i = 0; i < b.B; i++) {
    cr_expect_eq(b.index[i], json_integer_value(json_array_get(json_object_get(want, "sample_order"), (size_t)i)),
                 "%s: sample %lld", name, (long long)i);
    json_t *an = json_array_get(json_object_get(want, "anchors"), (size_t)i);
    json_t *kp = json_array_get(json_object_get(want, "keep"), (size_t)i);
    for (int64_t n = 0; n < a.N && n < (int64_t)json_array_size(an); n++) {
      cr_expect_eq(a.anchors[i * a.N + n], json_integer_value(json_array_get(an, (size_t)n)), "%s: anchor %lld,%lld",
                   name, (long long)i, (long long)n);
      cr_expect_eq(a.keep[i * a.N + n], json_integer_value(json_array_get(kp, (size_t)n)), "%s: keep %lld,%lld", name,
                   (long long)i, (long long)n);
    }
  }
  df_dflash_anchors_free(&a);
  df_batch_free(&b);
  df_draft_config_free(cfg);
  df_recipe_free(rc);
  json_decref(want);
}

// ---- tests -------------------------------------------------------------------------------------------------------

static void run_case(const char *dir, const char *name, int *passed) {
  char recipe[1024], dump[64];
  snprintf(recipe, sizeof recipe, "%s/%s/recipe.yaml", dir, name);
  tmpdir_make(dump, sizeof dump);
  df_step_result r;
  df_error err = {0};
  df_status st = df_step_run(recipe, dump, 2, NULL, &r, &err);
  cr_expect_eq(st, DF_OK, "%s: %s [%s]", name, err.msg, err.where);
  if (st == DF_OK) {
    bool ok = expect_terms(dir, name, &r);
    ok = expect_grads(dir, name, dump) && ok;
    *passed += ok;
    df_step_result_free(&r);
  }
  expect_batch(dir, name);
  tmpdir_remove(dump);
}

Test(step_parity, every_fixture_case, .timeout = 600) {
  char *names[MAX_CASES];
  int n = list_cases(names, MAX_CASES);
  if (n < 0) cr_skip_test("%s does not exist yet (tools/reference/make_dflash_fixtures.py writes it)", STEP_DIR);
  cr_assert_gt(n, 0, "no case directory (with recipe.yaml) under %s", STEP_DIR);
  int passed = 0;
  for (int i = 0; i < n; i++) run_case(STEP_DIR, names[i], &passed);
  fprintf(stderr, "step parity: %d/%d cases pass\n", passed, n);
  for (int i = 0; i < n; i++) free(names[i]);
}

// DSpark: each Markov head type, with and without the confidence head, with and without decay.
Test(step_parity, every_dspark_fixture_case, .timeout = 600) {
  char *names[MAX_CASES];
  int n = list_cases_in(DSPARK_DIR, names, MAX_CASES);
  if (n < 0) cr_skip_test("%s does not exist yet (tools/reference/make_dspark_fixtures.py writes it)", DSPARK_DIR);
  cr_assert_gt(n, 0, "no case directory (with recipe.yaml) under %s", DSPARK_DIR);
  int passed = 0;
  for (int i = 0; i < n; i++) run_case(DSPARK_DIR, names[i], &passed);
  fprintf(stderr, "dspark step parity: %d/%d cases pass\n", passed, n);
  for (int i = 0; i < n; i++) free(names[i]);
}

// MoE drafts (qwen3_5_moe / deepseek_v4 presets; qwen, deepseek and native layouts; centering, router and
// selection biases, aux loss, D-PACE, frozen experts, warm starts in layout file names).
Test(step_parity, every_moe_fixture_case, .timeout = 600) {
  char *names[MAX_CASES];
  int n = list_cases_in(MOE_DIR, names, MAX_CASES);
  if (n < 0) cr_skip_test("%s does not exist yet (tools/reference/make_moe_step_fixtures.py writes it)", MOE_DIR);
  cr_assert_gt(n, 0, "no case directory (with recipe.yaml) under %s", MOE_DIR);
  int passed = 0;
  for (int i = 0; i < n; i++) run_case(MOE_DIR, names[i], &passed);
  fprintf(stderr, "moe step parity: %d/%d cases pass\n", passed, n);
  for (int i = 0; i < n; i++) free(names[i]);
}

// Domino: shift_label on and off, pure_draft_prefix_len 0 and 1, λ at 1, 0 and between (training.global_step,
// horizons from total_steps and from the data), decay, chunking, cold (uniform GRU init) and warm (legacy names).
Test(step_parity, every_domino_fixture_case, .timeout = 600) {
  char *names[MAX_CASES];
  int n = list_cases_in(DOMINO_DIR, names, MAX_CASES);
  if (n < 0) cr_skip_test("%s does not exist yet (tools/reference/make_domino_fixtures.py writes it)", DOMINO_DIR);
  cr_assert_gt(n, 0, "no case directory (with recipe.yaml) under %s", DOMINO_DIR);
  int passed = 0;
  for (int i = 0; i < n; i++) run_case(DOMINO_DIR, names[i], &passed);
  fprintf(stderr, "domino step parity: %d/%d cases pass\n", passed, n);
  cr_expect_eq(passed, n);
  for (int i = 0; i < n; i++) free(names[i]);
}

// ---- EAGLE-3 (tests/fixtures/eagle3_step: tools/reference/make_eagle3_fixtures.py, docs/eagle3-step.md) ---------

// The vocabulary mapping the step used (dump/vocab.safetensors) equals expected/vocab.safetensors: d2t and t2d as
// SpecForge derives them from the case's data.
static bool expect_vocab(const char *dir, const char *name, const char *dump) {
  char p[1024], q[1024];
  snprintf(p, sizeof p, "%s/%s/expected/vocab.safetensors", dir, name);
  snprintf(q, sizeof q, "%s/vocab.safetensors", dump);
  df_st_file *wf = NULL, *gf = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open(p, &wf, &err), &err);
  DF_ASSERT_OK(df_st_open(q, &gf, &err), &err);
  const char *bufs[] = {"d2t", "t2d"};
  bool ok = true;
  for (int b = 0; b < 2; b++) {
    const df_st_tensor *w = df_st_find(wf, bufs[b]), *g = df_st_find(gf, bufs[b]);
    cr_assert(w && g, "%s: %s missing", name, bufs[b]);
    cr_assert_eq(g->numel, w->numel, "%s: %s size", name, bufs[b]);
    float *x = read_all(gf, g), *y = read_all(wf, w);
    bool same = true;
    for (int64_t i = 0; i < w->numel; i++) same = same && x[i] == y[i];
    cr_expect(same, "%s: the %s the step used is not SpecForge's", name, bufs[b]);
    ok = ok && same;
    free(x), free(y);
  }
  df_st_close(wf), df_st_close(gf);
  return ok;
}

// Every TTT step's terms (rel 1e-5 on the losses and rates; counts exact), the total loss, and the vocabulary mapping
// the step used equal to expected/vocab.safetensors (SpecForge's, derived from the case's data).
static bool expect_eagle3_terms(const char *name, const df_step_result *r, const char *dump) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s/expected/step.json", EAGLE3_DIR, name);
  json_error_t je;
  json_t *want = json_load_file(p, 0, &je);
  cr_assert_not_null(want, "%s: %s", p, je.text);
  bool ok = expect_close_key(name, want, "loss", r->loss);
  cr_expect_str_eq(json_string_value(json_object_get(r->report, "strategy")), "eagle3", "%s", name);
  const char *keys[] = {"kl_loss",         "step_loss",           "acc_correct",      "acc_denom",
                        "acceptance_rate", "log_acceptance_rate", "position_mask_sum"};
  double worst = rel_err(r->loss, json_number_value(json_object_get(want, "loss")));
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    json_t *w = json_object_get(want, keys[k]), *g = json_object_get(r->report, keys[k]);
    cr_expect_eq(json_array_size(g), json_array_size(w), "%s: %s has %zu steps", name, keys[k], json_array_size(g));
    for (size_t i = 0; i < json_array_size(w) && i < json_array_size(g); i++) {
      const double wv = json_number_value(json_array_get(w, i)), gv = json_number_value(json_array_get(g, i));
      const double e = wv == 0 ? fabs(gv) : rel_err(gv, wv);
      cr_expect_leq(e, 1e-5, "%s: %s[%zu] = %.10g, expected %.10g", name, keys[k], i, gv, wv);
      ok = ok && e <= 1e-5;
      worst = fmax(worst, e);
    }
  }
  json_decref(want);
  ok = expect_vocab(EAGLE3_DIR, name, dump) && ok;
  fprintf(stderr, "  %-26s loss %.9f, worst per-step rel err %.1e\n", name, r->loss, worst);
  return ok;
}

// Every case: TTT 1 .. 5, the forward KL, LK alpha and LK lambda, draft vocabularies 64 / 48 / the full one,
// EAGLE 3.1's fc_norm, cold and warm starts (a warm start's stale mapping replaced by the data's), truncation,
// compact_teacher.
// Every case directory of dir (at least min_cases) through df_step_run, checked by terms (the strategy's step.json
// keys and its mapping) and expect_grads; the dump also holds the mapping (vocab.safetensors).
typedef bool (*terms_check)(const char *name, const df_step_result *r, const char *dump);
static void eagle_family_cases(const char *dir, int min_cases, const char *label, terms_check terms) {
  char *names[MAX_CASES];
  int n = list_cases_in(dir, names, MAX_CASES);
  if (n < 0) cr_skip_test("%s does not exist yet (tools/reference/ writes it)", dir);
  cr_assert_geq(n, min_cases, "the %s fixtures have %d step cases", label, min_cases);
  int passed = 0;
  for (int i = 0; i < n; i++) {
    char recipe[1024], dump[64], p[1100];
    snprintf(recipe, sizeof recipe, "%s/%s/recipe.yaml", dir, names[i]);
    tmpdir_make(dump, sizeof dump);
    df_step_result r;
    df_error err = {0};
    df_status st = df_step_run(recipe, dump, 2, NULL, &r, &err);
    cr_expect_eq(st, DF_OK, "%s: %s [%s]", names[i], err.msg, err.where);
    if (st == DF_OK) {
      bool ok = terms(names[i], &r, dump);
      ok = expect_grads(dir, names[i], dump) && ok;
      passed += ok;
      df_step_result_free(&r);
    }
    snprintf(p, sizeof p, "%s/vocab.safetensors", dump);
    remove(p);
    tmpdir_remove(dump);
    free(names[i]);
  }
  fprintf(stderr, "%s step parity: %d/%d cases pass\n", label, passed, n);
  cr_expect_eq(passed, n);
}

Test(step_parity, every_eagle3_fixture_case, .timeout = 600) {
  eagle_family_cases(EAGLE3_DIR, 6, "eagle3", expect_eagle3_terms);
}

// ---- P-EAGLE (tests/fixtures/peagle_step: tools/reference/make_peagle_fixtures.py, docs/peagle.md) -------------

#define PEAGLE_DIR DF_FIXTURE_DIR "/peagle_step"

// The loss and its sums (rel 1e-5), the per-depth accuracy sums and the rows COD sampled per depth (exact: the same
// draws as the Python twin of the sampler), and the mapping.
static bool expect_peagle_terms(const char *name, const df_step_result *r, const char *dump) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s/expected/step.json", PEAGLE_DIR, name);
  json_error_t je;
  json_t *want = json_load_file(p, 0, &je);
  cr_assert_not_null(want, "%s: %s", p, je.text);
  cr_expect_str_eq(json_string_value(json_object_get(r->report, "strategy")), "peagle", "%s", name);
  bool ok = expect_close_key(name, want, "loss", r->loss);
  const char *keys[] = {"position_mask_sum", "kl_sum", "acc_correct", "acc_denom"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    const double w = json_number_value(json_object_get(want, keys[k]));
    const double g = json_number_value(json_object_get(r->report, keys[k]));
    const double e = w == 0 ? fabs(g) : rel_err(g, w);
    cr_expect_leq(e, 1e-5, "%s: %s = %.10g, expected %.10g", name, keys[k], g, w);
    ok = ok && e <= 1e-5;
  }
  const char *arrays[] = {"depth_rows", "depth_correct", "depth_denom"};
  for (size_t k = 0; k < 3; k++) {
    json_t *w = json_object_get(want, arrays[k]), *g = json_object_get(r->report, arrays[k]);
    cr_expect_eq(json_array_size(g), json_array_size(w), "%s: %s has %zu depths", name, arrays[k], json_array_size(g));
    for (size_t i = 0; i < json_array_size(w) && i < json_array_size(g); i++) {
      const double wv = json_number_value(json_array_get(w, i)), gv = json_number_value(json_array_get(g, i));
      cr_expect_eq(gv, wv, "%s: %s[%zu] = %g, expected %g", name, arrays[k], i, gv, wv);
      ok = ok && gv == wv;
    }
  }
  json_decref(want);
  ok = expect_vocab(PEAGLE_DIR, name, dump) && ok;
  fprintf(stderr, "  %-26s loss %.9f\n", name, r->loss);
  return ok;
}

// Every case: 1 .. 3 layers, 3 .. 8 depths, COD ratios, cold (the target's embedding copied in) and warm starts,
// norm_before_residual from the recipe, draft vocabularies 64 / 48 / the full one, the embedding's padding row
// (pad 105, 83, the mask token itself, none), a sampling that stops at depth 2.
Test(step_parity, every_peagle_fixture_case, .timeout = 600) {
  eagle_family_cases(PEAGLE_DIR, 5, "peagle", expect_peagle_terms);
}

// The CLI entry point: exit codes and the two files.
Test(step_cli, smoke) {
  char *names[MAX_CASES];
  int n = list_cases(names, MAX_CASES);
  if (n <= 0) cr_skip_test("no fixture case under %s yet", STEP_DIR);
  char recipe[1024], dump[64], p[1024];
  snprintf(recipe, sizeof recipe, "%s/%s/recipe.yaml", STEP_DIR, names[0]);
  tmpdir_make(dump, sizeof dump);
  char *ok_argv[] = {recipe, "--dump", dump, "--threads", "1"};
  cr_expect_eq(df_cmd_step(5, ok_argv), 0);
  snprintf(p, sizeof p, "%s/grads.safetensors", dump);
  cr_expect(is_file(p), "%s missing", p);
  snprintf(p, sizeof p, "%s/step.json", dump);
  cr_expect(is_file(p), "%s missing", p);
  json_t *j = json_load_file(p, 0, NULL);
  cr_expect_not_null(json_object_get(j, "per_position_acc"));
  cr_expect_not_null(json_object_get(j, "mean_accept_len"));
  json_decref(j);
  tmpdir_remove(dump);
  char *no_dump[] = {recipe};
  cr_expect_eq(df_cmd_step(1, no_dump), 2);
  char *bad_threads[] = {recipe, "--dump", dump, "--threads", "x"};
  cr_expect_eq(df_cmd_step(5, bad_threads), 2);
  char *missing[] = {"/nonexistent.yaml", "--dump", dump};
  cr_expect_eq(df_cmd_step(3, missing), 2, "a recipe that does not exist is a bad argument");
  for (int i = 0; i < n; i++) free(names[i]);
}

// A model.mask_token_id outside the target vocabulary fails naming the key.
Test(step_errors, mask_token_resolution) {
  char *names[MAX_CASES];
  int n = list_cases(names, MAX_CASES);
  if (n <= 0) cr_skip_test("no fixture case under %s yet", STEP_DIR);
  char path[1024];
  snprintf(path, sizeof path, "/tmp/df_step_mask_%d.yaml", (int)getpid());
  FILE *fp = fopen(path, "w");
  fprintf(fp,
          "model:\n  target_model_path: %s/target\n  draft_model_config: %s/tiny-dflash.json\n"
          "  mask_token_id: 100000\ndata:\n  hidden_states_path: %s/data\ntraining:\n  strategy: dflash\n"
          "  batch_size: 2\n",
          STEP_DIR, STEP_DIR, STEP_DIR);
  fclose(fp);
  df_step_result r;
  df_error err = {0};
  cr_expect_eq(df_step_run(path, NULL, 1, NULL, &r, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "model.mask_token_id");
  remove(path);
  for (int i = 0; i < n; i++) free(names[i]);
}

// A DSpark draft whose loss needs the teacher, on data without target_last_hidden_states, fails naming them;
// training.strategy must agree with the draft config.
Test(step_errors, dspark_teacher_and_strategy) {
  char path[1024];
  snprintf(path, sizeof path, "/tmp/df_step_dspark_%d.yaml", (int)getpid());
  const char *cases[][3] = {
      {"dspark", DSPARK_DIR "/vanilla.json", "target_last_hidden_states"}, // default alphas: L1 + confidence
      {"dflash", DSPARK_DIR "/vanilla.json", "training.strategy"},
      {"dspark", STEP_DIR "/tiny-dflash.json", "training.strategy"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *fp = fopen(path, "w");
    fprintf(fp,
            "model:\n  target_model_path: %s/target\n  draft_model_config: %s\ndata:\n  hidden_states_path: %s/data\n"
            "training:\n  strategy: %s\n  batch_size: 2\n",
            STEP_DIR, cases[i][1], STEP_DIR, cases[i][0]);
    fclose(fp);
    df_step_result r;
    df_error err = {0};
    cr_expect_eq(df_step_run(path, NULL, 1, NULL, &r, &err), DF_ERR_INVALID, "case %zu", i);
    cr_expect_str_eq(err.where, cases[i][2], "case %zu: %s", i, err.msg);
  }
  remove(path);
}
