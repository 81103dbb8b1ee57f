// DFlash strategy: anchor sampling (contract properties, the exact draws, determinism, all-candidates and
// zero-candidates cases), block inputs/labels/weights with decay, D-PACE weights on a hand-computed block,
// and the objective against a naive double-precision LM head + CE (loss terms, metrics, gradients, chunking).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "strategies/dflash/dflash.h"
#include "tests/common/fixture.h"

// ---- anchors -------------------------------------------------------------------------------------------------

static bool valid_at(const uint8_t *m, int64_t S, int64_t p) { return p <= S - 2 && m[p] && m[p + 1]; }

// Every contract property of one sampled batch.
static void expect_anchor_properties(const df_dflash_anchors *a, const uint8_t *mask, int64_t B, int64_t S,
                                     int64_t num_anchors) {
  int64_t cmax = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t c = 0;
    for (int64_t p = 0; p < S; p++) c += valid_at(mask + b * S, S, p);
    cr_expect_eq(a->candidates[b], c, "sample %lld: candidates", (long long)b);
    if (c > cmax) cmax = c;
  }
  cr_assert_eq(a->N, num_anchors < cmax ? num_anchors : cmax);
  for (int64_t b = 0; b < B; b++) {
    int64_t take = a->candidates[b] < a->N ? a->candidates[b] : a->N;
    for (int64_t n = 0; n < a->N; n++) {
      int32_t an = a->anchors[b * a->N + n];
      cr_expect_eq(a->keep[b * a->N + n], n < take, "sample %lld block %lld keep", (long long)b, (long long)n);
      if (n >= take) {
        cr_expect_eq(an, 0, "padding block anchor");
        continue;
      }
      cr_expect(valid_at(mask + b * S, S, an), "anchor %d is not a candidate", an);
      if (n > 0) cr_expect_gt(an, a->anchors[b * a->N + n - 1], "anchors ascend and are distinct");
    }
  }
}

static uint8_t *random_mask(int64_t B, int64_t S, uint64_t seed, double p_one) {
  uint8_t *m = malloc((size_t)(B * S));
  df_rng r;
  df_rng_init(&r, seed, 99);
  for (int64_t i = 0; i < B * S; i++) m[i] = df_rng_uniform(&r) < p_one;
  return m;
}

Test(dflash_anchors, contract_properties_on_random_masks) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    int64_t B = 1 + (int64_t)(seed % 4), S = 5 + (int64_t)(seed * 7 % 40);
    uint8_t *m = random_mask(B, S, seed, 0.3 + 0.03 * (double)seed);
    m[1] = m[2] = 1; // at least one candidate in the batch
    df_dflash_sampler s;
    df_dflash_sampler_init(&s, seed);
    df_dflash_anchors a;
    df_error err = {0};
    int64_t num = 1 + (int64_t)(seed % 9);
    DF_ASSERT_OK(df_dflash_sample_anchors(&s, m, B, S, num, &a, &err), &err);
    expect_anchor_properties(&a, m, B, S, num);
    df_dflash_anchors_free(&a);
    free(m);
  }
}

// The contract's exact procedure, written out independently: S−1 draws per sample, the take smallest keys.
Test(dflash_anchors, exact_draws_follow_the_contract) {
  enum { B = 2, S = 12, NUM = 3 };
  uint8_t m[B * S] = {0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, /**/ 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, 42);
  df_dflash_anchors a;
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_sample_anchors(&s, m, B, S, NUM, &a, &err), &err);
  cr_assert_eq(a.N, NUM);
  df_rng r;
  df_rng_init(&r, 42, DF_RNG_STREAM_ANCHORS);
  for (int b = 0; b < B; b++) {
    double key[S - 1];
    for (int p = 0; p < S - 1; p++) {
      double u = df_rng_uniform(&r);
      key[p] = valid_at(m + b * S, S, p) ? u : 2.0;
    }
    bool chosen[S - 1] = {0};
    int take = b == 0 ? NUM : 1; // sample 1 has one candidate (p = 0)
    for (int t = 0; t < take; t++) {
      int best = -1;
      for (int p = 0; p < S - 1; p++)
        if (!chosen[p] && (best < 0 || key[p] < key[best])) best = p;
      chosen[best] = true;
    }
    int n = 0;
    for (int p = 0; p < S - 1; p++)
      if (chosen[p]) cr_expect_eq(a.anchors[b * NUM + n++], p, "sample %d anchor %d", b, n - 1);
    for (; n < NUM; n++) cr_expect_eq(a.keep[b * NUM + n], 0);
  }
  // the sampler's state moved on by exactly B·(S−1) draws
  cr_expect_eq(df_rng_next_u64(&s.rng), df_rng_next_u64(&r));
  df_dflash_anchors_free(&a);
}

Test(dflash_anchors, deterministic_per_seed_and_stream_advances) {
  uint8_t *m = random_mask(3, 64, 5, 0.8);
  df_dflash_sampler s1, s2, s3;
  df_dflash_sampler_init(&s1, 7), df_dflash_sampler_init(&s2, 7), df_dflash_sampler_init(&s3, 8);
  df_dflash_anchors a1, a2, a3, a4;
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_sample_anchors(&s1, m, 3, 64, 8, &a1, &err), &err);
  DF_ASSERT_OK(df_dflash_sample_anchors(&s2, m, 3, 64, 8, &a2, &err), &err);
  DF_ASSERT_OK(df_dflash_sample_anchors(&s3, m, 3, 64, 8, &a3, &err), &err);
  DF_ASSERT_OK(df_dflash_sample_anchors(&s1, m, 3, 64, 8, &a4, &err), &err); // the next micro-batch
  size_t n = (size_t)(3 * a1.N) * sizeof(int32_t);
  cr_expect_eq(memcmp(a1.anchors, a2.anchors, n), 0, "same seed, same anchors");
  cr_expect_neq(memcmp(a1.anchors, a3.anchors, n), 0, "another seed, other anchors");
  cr_expect_neq(memcmp(a1.anchors, a4.anchors, n), 0, "the stream advances between micro-batches");
  df_dflash_anchors_free(&a1), df_dflash_anchors_free(&a2), df_dflash_anchors_free(&a3), df_dflash_anchors_free(&a4);
  free(m);
}

Test(dflash_anchors, all_candidates_when_num_anchors_is_large) {
  enum { S = 10 };
  uint8_t m[2 * S] = {1, 1, 1, 0, 1, 1, 0, 1, 1, 1, /**/ 0, 0, 1, 1, 0, 0, 0, 0, 0, 0};
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, 1);
  df_dflash_anchors a;
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_sample_anchors(&s, m, 2, S, 512, &a, &err), &err);
  const int32_t want0[] = {0, 1, 4, 7, 8}; // p <= S−2 with mask[p] and mask[p+1]
  cr_assert_eq(a.N, 5);
  for (int n = 0; n < 5; n++) {
    cr_expect_eq(a.anchors[n], want0[n]);
    cr_expect_eq(a.keep[n], 1);
  }
  cr_expect_eq(a.anchors[5], 2);
  cr_expect_eq(a.keep[5], 1);
  for (int n = 1; n < 5; n++) {
    cr_expect_eq(a.anchors[5 + n], 0);
    cr_expect_eq(a.keep[5 + n], 0);
  }
  df_dflash_anchors_free(&a);
}

Test(dflash_anchors, zero_candidates_is_an_error) {
  uint8_t m[2 * 6] = {1, 0, 1, 0, 1, 0, /**/ 0, 0, 0, 0, 0, 1};
  df_dflash_sampler s;
  df_dflash_sampler_init(&s, 1);
  df_dflash_anchors a;
  df_error err = {0};
  cr_expect_eq(df_dflash_sample_anchors(&s, m, 2, 6, 4, &a, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "no valid anchor"), "%s", err.msg);
  cr_expect_null(a.anchors);
  uint8_t one[1] = {1};
  cr_expect_eq(df_dflash_sample_anchors(&s, one, 1, 1, 4, &a, &err), DF_ERR_INVALID); // S = 1: no p <= S−2
  cr_expect_eq(df_dflash_sample_anchors(&s, m, 2, 6, 0, &a, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.num_anchors");
}

// ---- blocks --------------------------------------------------------------------------------------------------

Test(dflash_blocks, inputs_positions_labels_and_decayed_weights) {
  enum { S = 8, BS = 4, MASK = 99 };
  const int32_t ids[S] = {10, 11, 12, 13, 14, 15, 16, 17};
  const uint8_t lm[S] = {0, 1, 1, 0, 1, 1, 1, 1};
  int32_t anchors[3] = {1, 5, 0};
  uint8_t keep[3] = {1, 1, 0};
  df_dflash_anchors a = {.B = 1, .N = 3, .anchors = anchors, .keep = keep};
  df_dflash_blocks blk;
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_build_blocks(ids, lm, S, &a, BS, MASK, 2.0, &blk, &err), &err);
  const int32_t want_in[12] = {11, MASK, MASK, MASK, 15, MASK, MASK, MASK, MASK, MASK, MASK, MASK};
  const int32_t want_pos[12] = {1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3};
  // block 0: slot 2 is position 3 (loss_mask 0) → ignored, slot 3 (position 4) still counts
  // block 1: slot 3 is position 8 = S → ignored; block 2 is padding
  const int32_t want_lab[12] = {-1, 12, -1, 14, -1, 16, 17, -1, -1, -1, -1, -1};
  const uint8_t want_bin[12] = {0, 1, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0};
  const float d[BS] = {0, 1.0f, (float)exp(-0.5), (float)exp(-1.0)};
  for (int r = 0; r < 12; r++) {
    cr_expect_eq(blk.input_ids[r], want_in[r], "row %d input", r);
    cr_expect_eq(blk.positions[r], want_pos[r], "row %d position", r);
    cr_expect_eq(blk.labels[r], want_lab[r], "row %d label", r);
    cr_expect_eq(blk.binary[r], want_bin[r], "row %d binary", r);
    cr_expect_float_eq(blk.weights[r], want_bin[r] ? d[r % BS] : 0.0f, 1e-7, "row %d weight", r);
  }
  df_dflash_blocks_free(&blk);
  // γ = 0: every supervised slot weighs 1
  DF_ASSERT_OK(df_dflash_build_blocks(ids, lm, S, &a, BS, MASK, 0.0, &blk, &err), &err);
  for (int r = 0; r < 12; r++) cr_expect_eq(blk.weights[r], (float)want_bin[r], "row %d weight (no decay)", r);
  df_dflash_blocks_free(&blk);
  cr_expect_eq(df_dflash_build_blocks(ids, lm, S, &a, 1, MASK, 0.0, &blk, &err), DF_ERR_INVALID);
  cr_expect_eq(df_dflash_build_blocks(ids, lm, S, &a, BS, -1, 0.0, &blk, &err), DF_ERR_INVALID);
  cr_expect_eq(df_dflash_build_blocks(ids, lm, S, &a, BS, MASK, -1.0, &blk, &err), DF_ERR_INVALID);
}

// ---- D-PACE weights --------------------------------------------------------------------------------------------

// The df_dpace_weights op on a CPU context over host arrays (nblocks blocks of bs slots).
static df_status dpace_weights(df_dflash_loss_type type, double alpha, const float *ce, const float *w, int64_t nb,
                               int64_t bs, float *out, df_error *err) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_tensor tc = df_f32(ce, nb * bs), tw = df_f32(w, nb * bs), to = df_f32(out, nb * bs);
  df_status st = df_dpace_weights(ctx, df_dflash_dpace_mode(type), alpha, bs, &tc, &tw, &to, NULL, err);
  df_ctx_destroy(ctx);
  return st;
}

// One block, α = 0.5, w = [0, 1, 1, 0.5], q = exp(−CE) = [·, 0.5, 0.25, 1]:
//   s = [1, 0.75, 0.625, 1], P = [1, 0.75, 0.46875, 0.46875],
//   Σ_{j≥k} P_j·w_j = [1.453125, 1.453125, 0.703125, 0.234375].
Test(dpace, weights_on_a_hand_computed_block) {
  const float ce[4] = {5.0f, (float)log(2.0), (float)log(4.0), 0.0f};
  const float w[4] = {0.0f, 1.0f, 1.0f, 0.5f};
  const float P[4] = {1.0f, 0.75f, 0.46875f, 0.46875f};
  const float suffix[4] = {1.453125f, 1.453125f, 0.703125f, 0.234375f};
  float out[4];
  df_error err = {0};
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DPACE_CUMCONF, 0.5, ce, w, 1, 4, out, &err), &err);
  for (int k = 0; k < 4; k++) cr_expect_float_eq(out[k], P[k], 1e-6, "P[%d]", k);
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DPACE, 0.5, ce, w, 1, 4, out, &err), &err);
  for (int k = 0; k < 4; k++) cr_expect_float_eq(out[k], suffix[k], 1e-6, "suffix[%d]", k);
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DPACE_CONTVALUE, 0.5, ce, w, 1, 4, out, &err), &err);
  for (int k = 0; k < 4; k++) cr_expect_float_eq(out[k], suffix[k] / P[k], 1e-6, "suffix/P[%d]", k);
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DFLASH, 0.5, ce, w, 1, 4, out, &err), &err);
  for (int k = 0; k < 4; k++) cr_expect_eq(out[k], 1.0f);
}

Test(dpace, blocks_reset_and_alpha_one_is_uniform_confidence) {
  const float ce[8] = {1, 2, 3, 4, 1, 2, 3, 4};
  const float w[8] = {0, 1, 1, 1, 0, 1, 1, 1};
  float out[8];
  df_error err = {0};
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DPACE, 0.3, ce, w, 2, 4, out, &err), &err);
  for (int k = 0; k < 4; k++) cr_expect_eq(out[k], out[4 + k], "block 1 slot %d restarts the product", k);
  DF_ASSERT_OK(dpace_weights(DF_LOSS_DPACE, 1.0, ce, w, 2, 4, out, &err), &err); // s = 1: P = 1
  const float want[4] = {3, 3, 2, 1};
  for (int k = 0; k < 4; k++) cr_expect_float_eq(out[k], want[k], 1e-6, "slot %d", k);
}

// ---- objective -------------------------------------------------------------------------------------------------

enum { OB = 2, ON = 3, OBS = 4, OH = 8, OV = 11, OR = OB * ON * OBS };

typedef struct {
  float hidden[OR * OH], head[OV * OH];
  int32_t anchors[OB * ON];
  uint8_t keep[OB * ON];
  df_dflash_anchors a;
  df_dflash_blocks blk;
} obj_case;

// A fixed batch: sample 0 has three blocks, sample 1 two and a padding block; some slots masked.
static void obj_case_make(obj_case *c) {
  df_test_fill_uniform(c->hidden, OR * OH, 11, -1.0f, 1.0f);
  df_test_fill_uniform(c->head, OV * OH, 12, -1.5f, 1.5f);
  enum { S = 10 };
  int32_t ids[OB * S];
  uint8_t lm[OB * S];
  for (int i = 0; i < OB * S; i++) ids[i] = (i * 7 + 3) % OV, lm[i] = (i % 5) != 3;
  const int32_t anchors[OB * ON] = {0, 4, 7, 1, 5, 0};
  const uint8_t keep[OB * ON] = {1, 1, 1, 1, 1, 0};
  memcpy(c->anchors, anchors, sizeof anchors), memcpy(c->keep, keep, sizeof keep);
  c->a = (df_dflash_anchors){.B = OB, .N = ON, .anchors = c->anchors, .keep = c->keep};
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_build_blocks(ids, lm, S, &c->a, OBS, 2, 3.0, &c->blk, &err), &err);
}

// Naive per-row CE, argmax and dCE/dh in double.
static void naive_row(const obj_case *c, int r, double *ce, int *argmax, double *dh) {
  double z[OV], mx = -1e300;
  *argmax = 0;
  for (int v = 0; v < OV; v++) {
    z[v] = 0;
    for (int h = 0; h < OH; h++) z[v] += (double)c->hidden[r * OH + h] * c->head[v * OH + h];
    if (z[v] > mx) mx = z[v], *argmax = v;
  }
  double se = 0;
  for (int v = 0; v < OV; v++) se += exp(z[v] - mx);
  int lab = c->blk.labels[r];
  *ce = lab < 0 ? 0 : log(se) + mx - z[lab];
  for (int h = 0; h < OH; h++) dh[h] = 0;
  if (lab < 0) return;
  for (int v = 0; v < OV; v++) {
    double g = exp(z[v] - mx) / se - (v == lab);
    for (int h = 0; h < OH; h++) dh[h] += g * c->head[v * OH + h];
  }
}

static void run_objective(obj_case *c, df_dflash_loss_type type, int64_t chunk, float *dh, df_dflash_metrics *m) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_tensor hidden = df_f32(c->hidden, OR, OH), head = df_f32(c->head, OV, OH);
  df_dflash_loss_options opt = {.type = type, .dpace_alpha = 0.4, .chunk_blocks = chunk};
  df_error err = {0};
  DF_ASSERT_OK(df_dflash_objective(ctx, &opt, &hidden, &head, &c->blk, &c->a, dh, m, &err), &err);
  df_ctx_destroy(ctx);
}

static void check_objective(df_dflash_loss_type type) {
  obj_case c;
  obj_case_make(&c);
  float dh[OR * OH];
  df_dflash_metrics m;
  run_objective(&c, type, 1, dh, &m);
  double ce[OR], dce[OR][OH], num = 0, den = 0, acc = 0, accden = 0;
  int am[OR];
  float cef[OR], wt[OR], w[OR];
  bool dpace = type != DF_LOSS_DFLASH;
  // D-PACE weighs slots by the binary weight (decay ignored, as SpecForge does); dflash by the decayed one.
  for (int r = 0; r < OR; r++) w[r] = dpace ? (float)c.blk.binary[r] : c.blk.weights[r];
  for (int r = 0; r < OR; r++) naive_row(&c, r, &ce[r], &am[r], dce[r]), cef[r] = (float)ce[r];
  df_error err = {0};
  DF_ASSERT_OK(dpace_weights(type, 0.4, cef, w, OB * ON, OBS, wt, &err), &err);
  for (int r = 0; r < OR; r++) {
    num += ce[r] * w[r] * wt[r];
    den += c.blk.weights[r];
    acc += c.blk.binary[r] && am[r] == c.blk.labels[r];
    accden += c.blk.binary[r];
  }
  if (dpace) den = OB;
  cr_expect_float_eq(m.loss_num, num, 1e-5 * fabs(num), "loss_num");
  cr_expect_float_eq(m.loss_den, den, 1e-9, "loss_den");
  cr_expect_eq(m.acc_num, acc);
  cr_expect_eq(m.acc_den, accden);
  cr_expect_eq(m.num_blocks, 5);
  cr_expect_eq(m.pos_acc_den[0], 0, "slot 0 is never supervised");
  float want[OR * OH];
  for (int r = 0; r < OR; r++)
    for (int h = 0; h < OH; h++) want[r * OH + h] = (float)(dce[r][h] * w[r] * wt[r] / den);
  df_expect_close("dhidden", dh, want, OR * OH, 1e-5, 1e-7);
  // chunking changes nothing, and the forward-only call gives the same terms
  float dh_full[OR * OH];
  df_dflash_metrics m2, m3;
  run_objective(&c, type, 0, dh_full, &m2);
  cr_expect_eq(memcmp(dh, dh_full, sizeof dh), 0, "chunk_blocks 1 vs one pass");
  cr_expect_eq(m.loss_num, m2.loss_num);
  run_objective(&c, type, 2, NULL, &m3);
  cr_expect_eq(m.loss_num, m3.loss_num);
  cr_expect_eq(m.acc_num, m3.acc_num);
  df_dflash_metrics_free(&m), df_dflash_metrics_free(&m2), df_dflash_metrics_free(&m3);
  df_dflash_blocks_free(&c.blk);
}

Test(dflash_objective, dflash_matches_naive) { check_objective(DF_LOSS_DFLASH); }
Test(dflash_objective, dpace_matches_naive) { check_objective(DF_LOSS_DPACE); }
Test(dflash_objective, dpace_cumconf_matches_naive) { check_objective(DF_LOSS_DPACE_CUMCONF); }
Test(dflash_objective, dpace_contvalue_matches_naive) { check_objective(DF_LOSS_DPACE_CONTVALUE); }

Test(dflash_objective, accept_length_counts_the_leading_correct_run) {
  // Make the head predict the label exactly on chosen rows: hidden row = e_label scaled, head = identity-like.
  obj_case c;
  obj_case_make(&c);
  memset(c.head, 0, sizeof c.head);
  for (int v = 0; v < OV && v < OH; v++) c.head[v * OH + v] = 1.0f;
  for (int v = OH; v < OV; v++) c.head[v * OH + (v % OH)] = -1.0f; // never the argmax for a positive row
  memset(c.hidden, 0, sizeof c.hidden);
  // every row of every block predicts token 0, except the ones set below
  for (int r = 0; r < OR; r++) c.hidden[r * OH + 0] = 5.0f;
  df_dflash_metrics m;
  run_objective(&c, DF_LOSS_DFLASH, 0, NULL, &m);
  double want_sum = 0;
  for (int i = 0; i < OB * ON; i++) {
    if (!c.keep[i]) continue;
    int run = 0;
    for (int k = 1; k < OBS; k++) {
      int r = i * OBS + k;
      if (!c.blk.binary[r]) continue;
      if (c.blk.labels[r] != 0) break;
      run++;
    }
    want_sum += 1 + run;
  }
  cr_expect_eq(m.accept_len_sum, want_sum);
  cr_expect_geq(m.accept_len_sum, 5.0);
  df_dflash_metrics_free(&m);
  df_dflash_blocks_free(&c.blk);
}

Test(dflash_objective, bad_options_fail) {
  obj_case c;
  obj_case_make(&c);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_tensor hidden = df_f32(c.hidden, OR, OH), head = df_f32(c.head, OV, OH);
  df_dflash_metrics m;
  df_error err = {0};
  df_dflash_loss_options opt = {.type = DF_LOSS_DPACE, .dpace_alpha = 1.5};
  cr_expect_eq(df_dflash_objective(ctx, &opt, &hidden, &head, &c.blk, &c.a, NULL, &m, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "training.dpace_alpha");
  opt = (df_dflash_loss_options){.type = DF_LOSS_DFLASH, .chunk_blocks = -1};
  cr_expect_eq(df_dflash_objective(ctx, &opt, &hidden, &head, &c.blk, &c.a, NULL, &m, &err), DF_ERR_INVALID);
  df_tensor short_hidden = df_f32(c.hidden, OR - 1, OH);
  opt.chunk_blocks = 0;
  cr_expect_eq(df_dflash_objective(ctx, &opt, &short_hidden, &head, &c.blk, &c.a, NULL, &m, &err), DF_ERR_INVALID);
  df_ctx_destroy(ctx);
  df_dflash_blocks_free(&c.blk);
}
