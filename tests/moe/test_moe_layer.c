// The MoE layer behind the FFN vtable: PyTorch golden forward/backward per configuration (transformers'
// Qwen2-/Qwen3-MoE block semantics and the draftforge extensions), finite differences through the whole
// layer, the deferred updates (noaux_tc bias, EMA centering mean), eval, frozen experts, the aux loss's
// gradient path, determinism across thread counts, metrics and argument errors.
//
// Tolerances (references are float64 autograd of fp32 inputs, tools/reference/make_moe_fixtures.py):
// - y, scores, weights and every gradient: max|diff| <= 1e-5 · max|ref| + 1e-6 (fp32 GEMMs over H <= 16 and
//   the router math in double; measured worst 8e-7 relative). Indices and counts: exact.
// - aux loss: 1e-6 relative (a double sum of fp32 scores).
// - finite differences: central, h = 1e-2 in fp32, |fd − g| <= 1e-3 · max|g| + 1e-4 (measured: within 1e-4 ·
//   max|g|), with a check that no perturbation flips the routing (the seeds are chosen so none does).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe/ffn_moe.h"
#include "moe/params.h"
#include "tests/common/fixture.h"

// ---- harness: one MoE layer with its parameter table, flat buffers and memory ------------------------

typedef struct {
  df_moe_config m;
  int64_t H, T;
  df_params *p;
  df_ffn *ffn;
  df_moe_layer *L;
  float *weights, *grads, *saved, *scratch;
  df_ctx *ctx;
} harness;

static void h_init(harness *h, const df_moe_config *m, int64_t H, int64_t T, int threads) {
  df_error err = {0};
  *h = (harness){.m = *m, .H = H, .T = T};
  DF_ASSERT_OK(df_params_new(&h->p, &err), &err);
  DF_ASSERT_OK(df_ffn_moe_create_from(&h->m, H, 3, h->p, &h->ffn, &err), &err);
  DF_ASSERT_OK(df_params_finalize(h->p, &err), &err);
  const int64_t n = df_params_numel(h->p);
  h->weights = calloc((size_t)n, sizeof(float));
  h->grads = calloc((size_t)n, sizeof(float));
  h->saved = calloc((size_t)h->ffn->vt->saved_elems(h->ffn, T), sizeof(float));
  h->scratch = calloc((size_t)h->ffn->vt->scratch_elems(h->ffn, T), sizeof(float));
  DF_ASSERT_OK(h->ffn->vt->bind(h->ffn, h->p, h->weights, h->grads, DF_DEV_CPU, &err), &err);
  h->L = df_ffn_moe_layer(h->ffn);
  cr_assert_not_null(h->L);
  h->ctx = df_test_cpu_ctx(threads);
}

static void h_free(harness *h) {
  df_ffn_free(h->ffn);
  df_params_free(h->p);
  free(h->weights), free(h->grads), free(h->saved), free(h->scratch);
  df_ctx_destroy(h->ctx);
}

static const df_param *h_entry(const harness *h, df_moe_tensor t) {
  char name[DF_MOE_NAME_MAX];
  const df_param *e = df_params_find(h->p, df_moe_param_name(3, t, name, sizeof name));
  cr_assert_not_null(e, "no parameter %s", name);
  return e;
}
static float *h_w(const harness *h, df_moe_tensor t) { return h->weights + h_entry(h, t)->offset; }
static float *h_g(const harness *h, df_moe_tensor t) { return h->grads + h_entry(h, t)->offset; }
static int64_t h_n(const harness *h, df_moe_tensor t) { return h_entry(h, t)->numel; }

// Random parameters: router N-ish(0.6), experts and shared 0.3 scale (uniform of the same spread).
static void h_fill(harness *h, uint64_t seed) {
  for (int t = 0; t < DF_MOE_T_COUNT; t++) {
    if (!df_moe_tensor_present(&h->m, (df_moe_tensor)t) || t == DF_MOE_T_INPUT_MEAN_STEPS) continue;
    const float a = t == DF_MOE_T_ROUTER_WEIGHT ? 1.0f : (t == DF_MOE_T_SELECTION_BIAS ? 0.1f : 0.5f);
    df_test_fill_uniform(h_w(h, (df_moe_tensor)t), h_n(h, (df_moe_tensor)t), seed + 17 * (uint64_t)t, -a, a);
  }
}

static df_status h_forward(harness *h, const float *x, float *y, df_error *err) {
  df_tensor xt = df_f32((void *)x, h->T, h->H), yt = df_f32(y, h->T, h->H);
  return h->ffn->vt->forward(h->ffn, h->ctx, &xt, &yt, h->saved, h->scratch, err);
}

static df_status h_backward(harness *h, const float *x, const float *dy, float *dx, bool acc, df_error *err) {
  df_tensor xt = df_f32((void *)x, h->T, h->H), dyt = df_f32((void *)dy, h->T, h->H), dxt = df_f32(dx, h->T, h->H);
  return h->ffn->vt->backward(h->ffn, h->ctx, &xt, &dyt, &dxt, acc, h->saved, h->scratch, err);
}

// ---- golden --------------------------------------------------------------------------------------------

static df_moe_config config_of_fixture(const fx_file *f) {
  const int64_t S = (int64_t)fx_meta(f, "S");
  return (df_moe_config){.preset = "test",
                         .n_routed_experts = (int64_t)fx_meta(f, "E"),
                         .num_experts_per_tok = (int64_t)fx_meta(f, "k"),
                         .moe_intermediate_size = (int64_t)fx_meta(f, "I"),
                         .n_shared_experts = S > 0,
                         .shared_expert_intermediate_size = S > 0 ? S : 1,
                         .scoring_func = (df_moe_score_func)fx_meta(f, "score_code"),
                         .norm_topk_prob = fx_meta(f, "norm_topk_prob") != 0,
                         .routed_scaling_factor = fx_meta(f, "scale"),
                         .n_group = (int64_t)fx_meta(f, "n_group"),
                         .topk_group = (int64_t)fx_meta(f, "topk_group"),
                         .swiglu_limit = fx_meta(f, "swiglu_limit"),
                         .balance = fx_meta(f, "noaux_tc") != 0 ? DF_MOE_BALANCE_NOAUX_TC : DF_MOE_BALANCE_NONE,
                         .shared_expert_gate =
                             fx_meta(f, "shared_gate") != 0 ? DF_MOE_SHARED_GATE_SIGMOID : DF_MOE_SHARED_GATE_NONE,
                         .moe_router_bias = fx_meta(f, "router_bias") != 0,
                         .aux_loss_coeff = fx_meta(f, "aux_coeff"),
                         .aux_loss_type = DF_MOE_AUX_SWITCH,
                         .router_center = (df_moe_center)fx_meta(f, "center_code"),
                         .router_center_momentum = 0.99};
}

// fixture name → MoE tensor (inputs) and gradient name.
static const struct {
  const char *name, *grad;
  df_moe_tensor t;
} FX_PARAMS[] = {
    {"router", "d_router", DF_MOE_T_ROUTER_WEIGHT},
    {"router_bias", NULL, DF_MOE_T_ROUTER_BIAS},
    {"sel_bias", NULL, DF_MOE_T_SELECTION_BIAS},
    {"input_mean", NULL, DF_MOE_T_INPUT_MEAN},
    {"w1", "d_w1", DF_MOE_T_EXPERTS_W1},
    {"w3", "d_w3", DF_MOE_T_EXPERTS_W3},
    {"w2", "d_w2", DF_MOE_T_EXPERTS_W2},
    {"sw1", "d_sw1", DF_MOE_T_SHARED_W1},
    {"sw3", "d_sw3", DF_MOE_T_SHARED_W3},
    {"sw2", "d_sw2", DF_MOE_T_SHARED_W2},
    {"sgate", "d_sgate", DF_MOE_T_SHARED_GATE},
};
enum { FX_NPARAMS = sizeof FX_PARAMS / sizeof FX_PARAMS[0] };

static void expect_golden(const char *what, const float *got, const fx_file *f, const char *name) {
  const fx_tensor *t = fx_get(f, name);
  df_expect_close(what, got, t->data, fx_numel(t), 1e-5, 1e-6);
}

static void check_golden(const char *case_name) {
  char path[128];
  snprintf(path, sizeof path, "moe/layer_%s.safetensors", case_name);
  fx_file *f = fx_load(path);
  const df_moe_config m = config_of_fixture(f);
  const int64_t H = (int64_t)fx_meta(f, "H"), T = (int64_t)fx_meta(f, "T"), E = m.n_routed_experts;
  const int64_t k = m.num_experts_per_tok;
  const bool training = fx_meta(f, "training") != 0;
  harness h;
  h_init(&h, &m, H, T, 2);
  for (int i = 0; i < FX_NPARAMS; i++) {
    if (!fx_has(f, FX_PARAMS[i].name)) continue;
    const fx_tensor *t = fx_get(f, FX_PARAMS[i].name);
    cr_assert_eq(fx_numel(t), h_n(&h, FX_PARAMS[i].t), "%s: size", FX_PARAMS[i].name);
    memcpy(h_w(&h, FX_PARAMS[i].t), t->data, sizeof(float) * (size_t)fx_numel(t));
  }
  if (m.router_center != DF_MOE_CENTER_NONE) *h_w(&h, DF_MOE_T_INPUT_MEAN_STEPS) = 5.0f;
  df_moe_layer_set_training(h.L, training);
  df_moe_layer_set_rows_per_sample(h.L, (int64_t)fx_meta(f, "rows_per_sample"));
  df_moe_layer_set_aux_grad_scale(h.L, (float)fx_meta(f, "aux_grad_scale"));

  const float *x = fx_get(f, "x")->data, *dy = fx_get(f, "dy")->data;
  float *y = calloc((size_t)(T * H), 4), *dx = calloc((size_t)(T * H), 4);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  expect_golden("y", y, f, "y");
  const df_moe_routing r = df_moe_layer_saved_routing(h.L, h.saved, T);
  expect_golden("scores", r.scores, f, "scores");
  expect_golden("weights", r.weights, f, "weights");
  const int32_t *want_idx = fx_get(f, "indices")->data, *want_counts = fx_get(f, "counts")->data;
  for (int64_t i = 0; i < T * k; i++)
    cr_expect_eq(r.indices[i], want_idx[i], "indices[%lld]: %d vs %d", (long long)i, r.indices[i], want_idx[i]);
  for (int64_t e = 0; e < E; e++) cr_expect_eq(r.counts[e], want_counts[e], "counts[%lld]", (long long)e);
  const double aux = fx_meta(f, "aux_value");
  cr_expect_leq(fabs(df_moe_layer_aux_loss(h.L) - aux), 1e-6 * fabs(aux) + 1e-12, "aux %.9g vs %.9g",
                df_moe_layer_aux_loss(h.L), aux);

  if (training) {
    DF_ASSERT_OK(h_backward(&h, x, dy, dx, false, &err), &err);
    expect_golden("d_x", dx, f, "d_x");
    for (int i = 0; i < FX_NPARAMS; i++) {
      if (!FX_PARAMS[i].grad || !fx_has(f, FX_PARAMS[i].grad)) continue;
      expect_golden(FX_PARAMS[i].grad, h_g(&h, FX_PARAMS[i].t), f, FX_PARAMS[i].grad);
    }
  }
  free(y), free(dx);
  h_free(&h);
  fx_free(f);
}

Test(moe_layer, golden_qwen3_5_gated_shared_aux) { check_golden("qwen3_5"); }
Test(moe_layer, golden_qwen2_no_renorm) { check_golden("qwen2_nonorm"); }
Test(moe_layer, golden_qwen3_no_shared) { check_golden("qwen3_noshared"); }
Test(moe_layer, golden_sample_centering_logit_bias) { check_golden("center_bias"); }
Test(moe_layer, golden_eval_running_mean) { check_golden("center_eval"); }
Test(moe_layer, golden_deepseek_v4_sqrtsoftplus_clamp) { check_golden("deepseek_v4"); }
Test(moe_layer, golden_sigmoid_groups_selection_bias) { check_golden("sigmoid_groups"); }

// ---- finite differences through the whole layer ----------------------------------------------------------

typedef struct {
  harness *h;
  const float *x, *probe;
  float *y;
  const int32_t *idx0; // the baseline routing; a perturbation must not change it
  float aux_scale;
} fd_ctx;

// J = Σ probe·y + aux_scale · aux, in double; a training forward without touching the deferred state.
static double fd_loss(void *vc) {
  fd_ctx *c = vc;
  df_error err = {0};
  DF_ASSERT_OK(h_forward(c->h, c->x, c->y, &err), &err);
  c->h->L->balance.pending = false;
  c->h->L->center_pending = false;
  const df_moe_routing r = df_moe_layer_saved_routing(c->h->L, c->h->saved, c->h->T);
  cr_assert(!memcmp(r.indices, c->idx0, sizeof(int32_t) * (size_t)(c->h->T * c->h->m.num_experts_per_tok)),
            "a finite-difference step flipped the routing: pick another seed");
  double J = 0.0;
  for (int64_t i = 0; i < c->h->T * c->h->H; i++) J += (double)c->probe[i] * c->y[i];
  return J + c->aux_scale * df_moe_layer_aux_loss(c->h->L);
}

static void fd_layer(const df_moe_config *m, int64_t H, int64_t T, int64_t rows_per_sample, uint64_t seed) {
  harness h;
  h_init(&h, m, H, T, 1);
  h_fill(&h, seed);
  df_moe_layer_set_rows_per_sample(h.L, rows_per_sample);
  const float aux_scale = 3.0f;
  df_moe_layer_set_aux_grad_scale(h.L, aux_scale);
  float *x = malloc(sizeof(float) * (size_t)(T * H)), *probe = malloc(sizeof(float) * (size_t)(T * H));
  float *y = calloc((size_t)(T * H), 4), *dx = calloc((size_t)(T * H), 4);
  df_test_fill_uniform(x, T * H, seed + 1, -1.5f, 1.5f);
  for (int64_t i = 0; i < T * H; i++) x[i] += 0.7f * (float)((i % H) % 3); // a common mode for centering
  df_test_fill_uniform(probe, T * H, seed + 2, -1.0f, 1.0f);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  h.L->balance.pending = false;
  h.L->center_pending = false;
  const int64_t Tk = T * m->num_experts_per_tok;
  int32_t *idx0 = malloc(sizeof(int32_t) * (size_t)Tk);
  memcpy(idx0, df_moe_layer_saved_routing(h.L, h.saved, T).indices, sizeof(int32_t) * (size_t)Tk);
  DF_ASSERT_OK(h_backward(&h, x, probe, dx, false, &err), &err);

  fd_ctx c = {.h = &h, .x = x, .probe = probe, .y = y, .idx0 = idx0, .aux_scale = aux_scale};
  const double hstep = 1e-2, rtol = 1e-3, atol = 1e-4;
  df_fd_check("x", x, dx, T * H, fd_loss, &c, hstep, rtol, atol, 48);
  static const df_moe_tensor TRAINED[] = {DF_MOE_T_ROUTER_WEIGHT, DF_MOE_T_EXPERTS_W1, DF_MOE_T_EXPERTS_W3,
                                          DF_MOE_T_EXPERTS_W2,    DF_MOE_T_SHARED_W1,  DF_MOE_T_SHARED_W3,
                                          DF_MOE_T_SHARED_W2,     DF_MOE_T_SHARED_GATE};
  for (size_t i = 0; i < sizeof TRAINED / sizeof *TRAINED; i++) {
    if (!df_moe_tensor_present(m, TRAINED[i])) continue;
    df_fd_check(df_moe_tensor_suffix(TRAINED[i]), h_w(&h, TRAINED[i]), h_g(&h, TRAINED[i]), h_n(&h, TRAINED[i]),
                fd_loss, &c, hstep, rtol, atol, 40);
  }
  free(x), free(probe), free(y), free(dx), free(idx0);
  h_free(&h);
}

static df_moe_config tiny_qwen(void) {
  return (df_moe_config){.preset = "test",
                         .n_routed_experts = 4,
                         .num_experts_per_tok = 2,
                         .moe_intermediate_size = 6,
                         .n_shared_experts = 1,
                         .shared_expert_intermediate_size = 5,
                         .scoring_func = DF_MOE_SCORE_SOFTMAX,
                         .norm_topk_prob = true,
                         .routed_scaling_factor = 1.0,
                         .n_group = 1,
                         .topk_group = 1,
                         .shared_expert_gate = DF_MOE_SHARED_GATE_SIGMOID,
                         .moe_router_bias = true,
                         .aux_loss_coeff = 0.1,
                         .router_center = DF_MOE_CENTER_SAMPLE,
                         .router_center_momentum = 0.99};
}

// Softmax, renormalised, sample centering (mean in the graph), logit bias, gated shared expert, aux loss.
Test(moe_layer, finite_differences_qwen_centered) {
  const df_moe_config m = tiny_qwen();
  fd_layer(&m, 8, 8, 4, 11);
}

// sqrtsoftplus, scale 1.5, noaux_tc bias, groups (4 of 2, keep 2), ungated shared expert, aux loss.
Test(moe_layer, finite_differences_sqrtsoftplus_groups) {
  df_moe_config m = tiny_qwen();
  m.n_routed_experts = 8;
  m.scoring_func = DF_MOE_SCORE_SQRTSOFTPLUS;
  m.routed_scaling_factor = 1.5;
  m.n_group = 4;
  m.topk_group = 2;
  m.balance = DF_MOE_BALANCE_NOAUX_TC;
  m.shared_expert_gate = DF_MOE_SHARED_GATE_NONE;
  m.moe_router_bias = false;
  m.router_center = DF_MOE_CENTER_NONE;
  fd_layer(&m, 8, 8, 8, 5);
}

// Sigmoid scores without renormalisation, no shared expert.
Test(moe_layer, finite_differences_sigmoid_no_renorm) {
  df_moe_config m = tiny_qwen();
  m.scoring_func = DF_MOE_SCORE_SIGMOID;
  m.norm_topk_prob = false;
  m.routed_scaling_factor = 2.0;
  m.n_shared_experts = 0;
  m.router_center = DF_MOE_CENTER_NONE;
  fd_layer(&m, 8, 8, 8, 4);
}

// ---- training state ------------------------------------------------------------------------------------

static float *rand_rows(int64_t T, int64_t H, uint64_t seed, float offset) {
  float *x = malloc(sizeof(float) * (size_t)(T * H));
  df_test_fill_uniform(x, T * H, seed, -1.0f, 1.0f);
  for (int64_t i = 0; i < T * H; i++) x[i] += offset * (float)(i % H) / (float)H;
  return x;
}

// noaux_tc: the bias moves only when the stash is applied (the next training forward or an explicit call),
// by exactly rate · sign(mean load − load_e), once per stash; eval forwards neither stash nor apply.
Test(moe_layer, noaux_tc_update_is_deferred_signed_and_applied_once) {
  df_moe_config m = tiny_qwen();
  m.n_routed_experts = 8;
  m.balance = DF_MOE_BALANCE_NOAUX_TC;
  m.bias_update_rate = 0.01;
  m.router_center = DF_MOE_CENTER_NONE;
  m.aux_loss_coeff = 0.0;
  const int64_t H = 8, T = 16, E = 8;
  harness h;
  h_init(&h, &m, H, T, 1);
  h_fill(&h, 21);
  float *x = rand_rows(T, H, 22, 0.0f), *y = calloc((size_t)(T * H), 4);
  float *beta = h_w(&h, DF_MOE_T_SELECTION_BIAS), beta0[8], want[8];
  memcpy(beta0, beta, sizeof beta0);
  df_error err = {0};

  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  cr_expect(!memcmp(beta, beta0, sizeof beta0), "the forward itself must not move the bias");
  const df_moe_routing r = df_moe_layer_saved_routing(h.L, h.saved, T);
  double mean = 0.0;
  for (int64_t e = 0; e < E; e++) mean += r.counts[e] / (double)E;
  for (int64_t e = 0; e < E; e++) {
    const float sgn = mean > r.counts[e] ? 1.0f : (mean < r.counts[e] ? -1.0f : 0.0f);
    want[e] = beta0[e] + 0.01f * sgn;
  }
  // Eval forwards neither apply the pending update nor replace the stash.
  df_moe_layer_set_training(h.L, false);
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  cr_expect(!memcmp(beta, beta0, sizeof beta0), "an eval forward must not apply the update");
  df_moe_layer_set_training(h.L, true);
  // The next training forward applies it first.
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  for (int64_t e = 0; e < E; e++) {
    cr_expect_eq(beta[e], want[e], "beta[%lld] = %.9g, want %.9g", (long long)e, beta[e], want[e]);
    cr_expect_leq(fabsf(beta[e] - beta0[e]), 0.01f + 1e-7f, "|Δβ| <= rate");
  }
  // That forward stashed again; an explicit apply consumes it, a second one is a no-op.
  DF_ASSERT_OK(df_moe_layer_apply_pending(h.L, &err), &err);
  float after[8];
  memcpy(after, beta, sizeof after);
  DF_ASSERT_OK(df_moe_layer_apply_pending(h.L, &err), &err);
  cr_expect(!memcmp(beta, after, sizeof after), "a second apply without a new stash must do nothing");
  df_moe_metrics mt;
  cr_assert(df_moe_layer_metrics(h.L, &mt));
  cr_expect_gt(mt.bias_abs_max, 0.0);
  free(x), free(y);
  h_free(&h);
}

static void sample_batch_mean(const float *x, int64_t T, int64_t H, int64_t n, double *out) {
  for (int64_t c = 0; c < H; c++) {
    double tot = 0.0;
    for (int64_t b = 0; b < T / n; b++) {
      double s = 0.0;
      for (int64_t r = 0; r < n; r++) s += x[(b * n + r) * H + c];
      tot += s / (double)n;
    }
    out[c] = tot / (double)(T / n);
  }
}

// Sample centering's running mean: stashed by a training forward, applied at the start of the next one:
// the first update copies, then μ ← 0.99·μ + 0.01·m; steps counts updates; eval leaves it alone.
Test(moe_layer, ema_centering_update) {
  const df_moe_config m = tiny_qwen();
  const int64_t H = 8, T = 8, n = 4;
  harness h;
  h_init(&h, &m, H, T, 1);
  h_fill(&h, 31);
  float *mu = h_w(&h, DF_MOE_T_INPUT_MEAN), *steps = h_w(&h, DF_MOE_T_INPUT_MEAN_STEPS);
  memset(mu, 0, sizeof(float) * (size_t)H);
  *steps = 0.0f;
  df_moe_layer_set_rows_per_sample(h.L, n);
  float *x1 = rand_rows(T, H, 32, 4.0f), *x2 = rand_rows(T, H, 33, -2.0f), *x3 = rand_rows(T, H, 34, 1.0f);
  float *y = calloc((size_t)(T * H), 4);
  double m1[8], m2[8];
  sample_batch_mean(x1, T, H, n, m1);
  sample_batch_mean(x2, T, H, n, m2);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&h, x1, y, &err), &err);
  for (int64_t c = 0; c < H; c++) cr_expect_eq(mu[c], 0.0f, "no update inside the forward");
  cr_expect_eq(*steps, 0.0f);
  DF_ASSERT_OK(h_forward(&h, x2, y, &err), &err);
  cr_expect_eq(*steps, 1.0f);
  for (int64_t c = 0; c < H; c++)
    cr_expect_float_eq(mu[c], (float)m1[c], 1e-6f, "first update copies: mu[%lld]", (long long)c);
  df_moe_layer_set_training(h.L, false);
  DF_ASSERT_OK(h_forward(&h, x3, y, &err), &err);
  cr_expect_eq(*steps, 1.0f, "eval applies nothing");
  df_moe_layer_set_training(h.L, true);
  DF_ASSERT_OK(h_forward(&h, x3, y, &err), &err);
  cr_expect_eq(*steps, 2.0f);
  for (int64_t c = 0; c < H; c++)
    cr_expect_float_eq(mu[c], (float)(0.99 * m1[c] + 0.01 * m2[c]), 1e-6f, "EMA: mu[%lld]", (long long)c);
  free(x1), free(x2), free(x3), free(y);
  h_free(&h);
}

// Two ranks with this rank's data (the sum doubles every value; the layer divides by the world size on the device):
// the centering mean is exactly the one-rank mean.
static int n_reduced;
static df_status twice(void *user, float *buf, int64_t n, df_error *err) {
  (void)user, (void)err;
  for (int64_t i = 0; i < n; i++) buf[i] *= 2.0f;
  n_reduced++;
  return DF_OK;
}

Test(moe_layer, deferred_updates_reduce_over_ranks) {
  const df_moe_config m = tiny_qwen();
  const int64_t H = 8, T = 8, n = 4;
  harness a, b;
  h_init(&a, &m, H, T, 1), h_init(&b, &m, H, T, 1);
  h_fill(&a, 41), h_fill(&b, 41);
  df_moe_layer_set_rows_per_sample(a.L, n), df_moe_layer_set_rows_per_sample(b.L, n);
  const df_collective two = {.sum = twice, .world_size = 2};
  df_moe_layer_set_collective(b.L, &two);
  float *x = rand_rows(T, H, 42, 3.0f), *y = calloc((size_t)(T * H), 4);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&a, x, y, &err), &err);
  DF_ASSERT_OK(h_forward(&b, x, y, &err), &err);
  n_reduced = 0;
  DF_ASSERT_OK(df_moe_layer_apply_pending(a.L, &err), &err);
  DF_ASSERT_OK(df_moe_layer_apply_pending(b.L, &err), &err);
  cr_expect_eq(n_reduced, 1, "the centering stash is reduced once");
  const float *ma = h_w(&a, DF_MOE_T_INPUT_MEAN), *mb = h_w(&b, DF_MOE_T_INPUT_MEAN);
  cr_expect(!memcmp(ma, mb, sizeof(float) * (size_t)H), "the mean over two equal ranks is the one-rank mean");
  free(x), free(y);
  h_free(&a), h_free(&b);
}

// Eval: no aux loss even with a coefficient; the metrics keep the last training forward's values.
Test(moe_layer, eval_has_no_aux_loss_and_keeps_metrics) {
  const df_moe_config m = tiny_qwen();
  harness h;
  h_init(&h, &m, 8, 8, 1);
  h_fill(&h, 41);
  df_moe_layer_set_rows_per_sample(h.L, 4);
  float *x = rand_rows(8, 8, 42, 0.0f), *y = calloc(64, 4);
  df_moe_metrics before, after;
  df_error err = {0};
  cr_expect(!df_moe_layer_metrics(h.L, &before), "no metrics before a training forward");
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  cr_expect_gt(df_moe_layer_aux_loss(h.L), 0.0);
  cr_assert(df_moe_layer_metrics(h.L, &before));
  cr_expect_float_eq(before.aux_loss, df_moe_layer_aux_loss(h.L), 1e-12);
  df_moe_layer_set_training(h.L, false);
  float *x2 = rand_rows(8, 8, 43, 3.0f);
  DF_ASSERT_OK(h_forward(&h, x2, y, &err), &err);
  cr_expect_eq(df_moe_layer_aux_loss(h.L), 0.0, "eval never produces the aux loss");
  cr_assert(df_moe_layer_metrics(h.L, &after));
  cr_expect(!memcmp(&before, &after, sizeof before), "eval leaves the metrics alone");
  free(x), free(x2), free(y);
  h_free(&h);
}

// The aux loss's gradient reaches the router weight and the input, never an expert.
Test(moe_layer, aux_gradient_reaches_router_not_experts) {
  const df_moe_config m = tiny_qwen();
  const int64_t H = 8, T = 8;
  harness h;
  h_init(&h, &m, H, T, 1);
  h_fill(&h, 51);
  df_moe_layer_set_rows_per_sample(h.L, 4);
  float *x = rand_rows(T, H, 52, 0.0f), *y = calloc(64, 4), *dy = calloc(64, 4), *dx = calloc(64, 4);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  DF_ASSERT_OK(h_backward(&h, x, dy, dx, false, &err), &err);
  double router = 0.0, xs = 0.0;
  for (int64_t i = 0; i < h_n(&h, DF_MOE_T_ROUTER_WEIGHT); i++) router += fabs(h_g(&h, DF_MOE_T_ROUTER_WEIGHT)[i]);
  for (int64_t i = 0; i < T * H; i++) xs += fabs(dx[i]);
  cr_expect_gt(router, 0.0, "the router weight gets the aux gradient");
  cr_expect_gt(xs, 0.0, "the input gets the aux gradient (through the scores and the centering)");
  static const df_moe_tensor EXPERT[] = {DF_MOE_T_EXPERTS_W1, DF_MOE_T_EXPERTS_W3, DF_MOE_T_EXPERTS_W2,
                                         DF_MOE_T_SHARED_W1,  DF_MOE_T_SHARED_W3,  DF_MOE_T_SHARED_W2,
                                         DF_MOE_T_SHARED_GATE};
  for (size_t t = 0; t < sizeof EXPERT / sizeof *EXPERT; t++)
    for (int64_t i = 0; i < h_n(&h, EXPERT[t]); i++)
      cr_assert_eq(h_g(&h, EXPERT[t])[i], 0.0f, "%s gets no aux gradient", df_moe_tensor_suffix(EXPERT[t]));
  // Scale 0 turns the aux term off: then nothing at all flows from dy = 0.
  memset(h.grads, 0, sizeof(float) * (size_t)df_params_numel(h.p));
  df_moe_layer_set_aux_grad_scale(h.L, 0.0f);
  DF_ASSERT_OK(h_backward(&h, x, dy, dx, false, &err), &err);
  for (int64_t i = 0; i < df_params_numel(h.p); i++) cr_assert_eq(h.grads[i], 0.0f);
  for (int64_t i = 0; i < T * H; i++) cr_assert_eq(dx[i], 0.0f);
  free(x), free(y), free(dy), free(dx);
  h_free(&h);
}

// moe_freeze_experts: the routed experts get no gradient (and are not trainable in the table); everything
// else — outputs, dx, router and shared gradients — is bitwise what the unfrozen layer gives.
Test(moe_layer, frozen_experts_get_no_gradient) {
  df_moe_config m = tiny_qwen();
  const int64_t H = 8, T = 8;
  harness a, b;
  h_init(&a, &m, H, T, 1);
  m.freeze_experts = true;
  h_init(&b, &m, H, T, 1);
  h_fill(&a, 61);
  h_fill(&b, 61);
  cr_expect(!h_entry(&b, DF_MOE_T_EXPERTS_W1)->trainable && h_entry(&a, DF_MOE_T_EXPERTS_W1)->trainable);
  df_moe_layer_set_rows_per_sample(a.L, 4);
  df_moe_layer_set_rows_per_sample(b.L, 4);
  float *x = rand_rows(T, H, 62, 0.0f), *dy = rand_rows(T, H, 63, 0.0f);
  float *ya = calloc(64, 4), *yb = calloc(64, 4), *dxa = calloc(64, 4), *dxb = calloc(64, 4);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&a, x, ya, &err), &err);
  DF_ASSERT_OK(h_forward(&b, x, yb, &err), &err);
  DF_ASSERT_OK(h_backward(&a, x, dy, dxa, false, &err), &err);
  DF_ASSERT_OK(h_backward(&b, x, dy, dxb, false, &err), &err);
  cr_expect(!memcmp(ya, yb, 64 * 4) && !memcmp(dxa, dxb, 64 * 4));
  for (int t = 0; t < DF_MOE_T_COUNT; t++) {
    if (!df_moe_tensor_present(&m, (df_moe_tensor)t) || t == DF_MOE_T_INPUT_MEAN_STEPS) continue;
    const float *ga = h_g(&a, (df_moe_tensor)t), *gb = h_g(&b, (df_moe_tensor)t);
    const int64_t n = h_n(&a, (df_moe_tensor)t);
    if (df_moe_tensor_is_stacked((df_moe_tensor)t)) {
      for (int64_t i = 0; i < n; i++) cr_assert_eq(gb[i], 0.0f, "%s is frozen", df_moe_tensor_suffix((df_moe_tensor)t));
    } else {
      cr_expect(!memcmp(ga, gb, sizeof(float) * (size_t)n), "%s unchanged", df_moe_tensor_suffix((df_moe_tensor)t));
    }
  }
  free(x), free(dy), free(ya), free(yb), free(dxa), free(dxb);
  h_free(&a);
  h_free(&b);
}

// The backward's accumulate flag adds into dx instead of writing it.
Test(moe_layer, backward_accumulates_dx) {
  const df_moe_config m = tiny_qwen();
  harness h;
  h_init(&h, &m, 8, 8, 1);
  h_fill(&h, 71);
  df_moe_layer_set_rows_per_sample(h.L, 4);
  float *x = rand_rows(8, 8, 72, 0.0f), *dy = rand_rows(8, 8, 73, 0.0f), *y = calloc(64, 4);
  float *dx1 = calloc(64, 4), *dx2 = malloc(64 * 4);
  for (int i = 0; i < 64; i++) dx2[i] = 1.0f;
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&h, x, y, &err), &err);
  DF_ASSERT_OK(h_backward(&h, x, dy, dx1, false, &err), &err);
  DF_ASSERT_OK(h_backward(&h, x, dy, dx2, true, &err), &err);
  for (int i = 0; i < 64; i++) cr_assert_float_eq(dx2[i], dx1[i] + 1.0f, 1e-6f);
  free(x), free(dy), free(y), free(dx1), free(dx2);
  h_free(&h);
}

// Bitwise the same outputs and gradients for 1, 2 and 4 threads, at shapes where every loop goes parallel.
Test(moe_layer, deterministic_across_thread_counts) {
  df_moe_config m = tiny_qwen();
  m.n_routed_experts = 16;
  m.num_experts_per_tok = 4;
  m.moe_intermediate_size = 32;
  m.shared_expert_intermediate_size = 48;
  const int64_t H = 64, T = 2048;
  float *out[3] = {0}, *grads[3] = {0};
  int64_t ng = 0;
  float *x = rand_rows(T, H, 81, 2.0f), *dy = rand_rows(T, H, 82, 0.0f);
  const int threads[3] = {1, 2, 4};
  for (int r = 0; r < 3; r++) {
    harness h;
    h_init(&h, &m, H, T, threads[r]);
    h_fill(&h, 83);
    df_moe_layer_set_rows_per_sample(h.L, 128);
    out[r] = calloc((size_t)(2 * T * H), 4);
    df_error err = {0};
    DF_ASSERT_OK(h_forward(&h, x, out[r], &err), &err);
    DF_ASSERT_OK(h_backward(&h, x, dy, out[r] + T * H, false, &err), &err);
    ng = df_params_numel(h.p);
    grads[r] = malloc(sizeof(float) * (size_t)ng);
    memcpy(grads[r], h.grads, sizeof(float) * (size_t)ng);
    h_free(&h);
  }
  for (int r = 1; r < 3; r++) {
    cr_expect(!memcmp(out[0], out[r], sizeof(float) * (size_t)(2 * T * H)), "y, dx: 1 vs %d threads", threads[r]);
    cr_expect(!memcmp(grads[0], grads[r], sizeof(float) * (size_t)ng), "grads: 1 vs %d threads", threads[r]);
  }
  for (int r = 0; r < 3; r++) free(out[r]), free(grads[r]);
  free(x), free(dy);
}

// ---- model-level hooks and metrics ---------------------------------------------------------------------

Test(moe_layer, model_hooks_and_metrics) {
  df_moe_config m = tiny_qwen();
  m.n_routed_experts = 8;
  harness a, b;
  h_init(&a, &m, 8, 16, 1);
  m.balance = DF_MOE_BALANCE_NOAUX_TC;
  m.bias_update_rate = 0.5;
  h_init(&b, &m, 8, 16, 1);
  h_fill(&a, 91);
  h_fill(&b, 92);
  df_ffn *ffns[3] = {a.ffn, NULL, b.ffn};
  cr_expect_str_eq(a.ffn->vt->kind, "moe");
  cr_expect(df_ffn_is_moe(a.ffn) && !df_ffn_is_moe(NULL) && !df_ffn_moe_layer(NULL));
  df_moe_metric mt[DF_MOE_MAX_METRICS];
  cr_expect_eq(df_moe_collect_metrics(ffns, 3, mt), 0, "no metrics before a training forward");
  df_moe_set_rows_per_sample(ffns, 3, 8);
  cr_expect_eq(a.L->rows_per_sample, 8);
  float *x = rand_rows(16, 8, 93, 1.0f), *y = calloc(128, 4);
  df_error err = {0};
  DF_ASSERT_OK(h_forward(&a, x, y, &err), &err);
  DF_ASSERT_OK(h_forward(&b, x, y, &err), &err);
  const double aux = df_moe_layer_aux_loss(a.L) + df_moe_layer_aux_loss(b.L);
  cr_expect_float_eq(df_moe_aux_loss_sum(ffns, 3), aux, 1e-12, "the objective gets the layer sum");
  const int n = df_moe_collect_metrics(ffns, 3, mt);
  cr_assert_eq(n, 5);
  df_moe_metrics ma, mb;
  cr_assert(df_moe_layer_metrics(a.L, &ma) && df_moe_layer_metrics(b.L, &mb));
  const char *names[5] = {"moe/load_max_ratio", "moe/load_min_ratio", "moe/experts_unused_frac", "moe/aux_loss",
                          "moe/bias_abs_max"};
  const double want[5] = {(ma.load_max_ratio + mb.load_max_ratio) / 2, (ma.load_min_ratio + mb.load_min_ratio) / 2,
                          (ma.experts_unused_frac + mb.experts_unused_frac) / 2, aux / 2,
                          (ma.bias_abs_max + mb.bias_abs_max) / 2};
  for (int i = 0; i < 5; i++) {
    cr_expect_str_eq(mt[i].name, names[i]);
    cr_expect_float_eq(mt[i].value, want[i], 1e-12, "%s", names[i]);
  }
  cr_expect_leq(ma.load_max_ratio, 8.0 / 2.0, "load_max_ratio <= E/k");
  cr_expect_leq(ma.load_min_ratio, 1.0);
  cr_expect_geq(ma.load_max_ratio, 1.0);
  // Model-level training flag and explicit apply.
  df_moe_set_training(ffns, 3, false);
  cr_expect(!a.L->training && !b.L->training);
  df_moe_set_aux_grad_scale(ffns, 3, 0.25f);
  cr_expect_eq(b.L->aux_grad_scale, 0.25f);
  const float beta0 = h_w(&b, DF_MOE_T_SELECTION_BIAS)[0];
  DF_ASSERT_OK(df_moe_apply_pending(ffns, 3, &err), &err);
  cr_expect_neq(h_w(&b, DF_MOE_T_SELECTION_BIAS)[0], beta0, "the stash is applied by the model hook");
  free(x), free(y);
  h_free(&a);
  h_free(&b);
}

// ---- errors --------------------------------------------------------------------------------------------

static void expect_config_error(const df_moe_config *m, const char *where) {
  df_params *p = NULL;
  df_ffn *f = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  cr_expect_neq(df_ffn_moe_create_from(m, 8, 0, p, &f, &err), DF_OK, "config accepted; want an error at %s", where);
  cr_expect_null(f);
  cr_expect_str_eq(err.where, where);
  df_params_free(p);
}

Test(moe_layer, config_errors_name_the_key) {
  df_moe_config m = tiny_qwen();
  m.num_experts_per_tok = 5;
  expect_config_error(&m, "num_experts_per_tok");
  m = tiny_qwen();
  m.n_group = 3;
  expect_config_error(&m, "n_group");
  m = tiny_qwen();
  m.n_routed_experts = 8;
  m.num_experts_per_tok = 3;
  m.n_group = 4;
  m.topk_group = 1;
  expect_config_error(&m, "topk_group");
  m = tiny_qwen();
  m.swiglu_limit = -1.0;
  expect_config_error(&m, "swiglu_limit");
  m = tiny_qwen();
  m.router_center_momentum = 1.0;
  expect_config_error(&m, "moe_router_center_momentum");
  m = tiny_qwen();
  m.aux_loss_coeff = -0.1;
  expect_config_error(&m, "moe_aux_loss_coeff");
  m = tiny_qwen();
  m.experts_backend = "fused";
  expect_config_error(&m, "router");
}

Test(moe_layer, call_errors) {
  const df_moe_config m = tiny_qwen();
  harness h;
  h_init(&h, &m, 8, 8, 1);
  h_fill(&h, 101);
  float *x = rand_rows(8, 8, 102, 0.0f), *y = calloc(64, 4), *dx = calloc(64, 4);
  df_error err = {0};
  // A backward with no forward in `saved`.
  cr_expect_eq(h_backward(&h, x, y, dx, false, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "saved");
  // Rows that do not split into samples.
  df_moe_layer_set_rows_per_sample(h.L, 3);
  cr_expect_eq(h_forward(&h, x, y, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "rows_per_sample");
  // The wrong width.
  df_tensor xt = df_f32(x, 16, 4), yt = df_f32(y, 16, 4);
  cr_expect_eq(h.ffn->vt->forward(h.ffn, h.ctx, &xt, &yt, h.saved, h.scratch, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "x");
  // (B, Q, H) input sets the rows per sample itself.
  df_tensor x3 = df_view(x, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(2, 4, 8)),
            y3 = df_view(y, DF_F32, DF_DEV_CPU, 3, DF_SHAPE(2, 4, 8));
  DF_ASSERT_OK(h.ffn->vt->forward(h.ffn, h.ctx, &x3, &y3, h.saved, h.scratch, &err), &err);
  free(x), free(y), free(dx);
  h_free(&h);
}

// Binding against a table built for another config fails naming the missing parameter.
Test(moe_layer, bind_names_missing_parameter) {
  df_moe_config with = tiny_qwen(), without = tiny_qwen();
  without.n_shared_experts = 0;
  df_params *p = NULL, *q = NULL;
  df_ffn *f = NULL, *g = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_params_new(&p, &err), &err);
  DF_ASSERT_OK(df_params_new(&q, &err), &err);
  DF_ASSERT_OK(df_ffn_moe_create_from(&with, 8, 0, p, &f, &err), &err);
  DF_ASSERT_OK(df_ffn_moe_create_from(&without, 8, 0, q, &g, &err), &err);
  DF_ASSERT_OK(df_params_finalize(q, &err), &err);
  float *w = calloc((size_t)df_params_numel(q), 4), *gr = calloc((size_t)df_params_numel(q), 4);
  cr_expect_neq(f->vt->bind(f, q, w, gr, DF_DEV_CPU, &err), DF_OK);
  cr_expect(strstr(err.where, "shared_experts") != NULL, "where = %s", err.where);
  free(w), free(gr);
  df_ffn_free(f);
  df_ffn_free(g);
  df_params_free(p);
  df_params_free(q);
}
