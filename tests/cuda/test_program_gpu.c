// The whole program with --device cuda against the same commands on the CPU (fp32 storage on both), on the bundled
// tiny target (recipes/tiny-target):
//   - capture with target-regenerated responses: the same tokens, features within 1e-4·max|ref| per sample;
//   - training a DFlash draft on the CPU's capture: every logged loss within 5e-3 relative of the CPU run's;
//   - export of both runs (the export itself converts on the CPU): every tensor within 2e-2·max|ref|, and the
//     whole export within 2e-3 relative L2 (Adam moves weights whose gradients are near zero by up to lr per step
//     whatever the sign's noise, so single elements may drift more than the whole);
//   - the offline eval of a checkpoint: the same counts, loss within 1e-5 relative;
//   - speculative decoding with the CPU run's export: the same generated tokens, verifications and per-slot
//     acceptance as on the CPU (both decode greedily; a near-tie argmax could differ on a real GPU, never here).
// And device residency on the CUDA backend itself (what tests/train/test_residency.c proves on the fake device):
// every optimizer step of a 2-micro-batch window moves one upload per micro-batch and one read, for DFlash, DSpark,
// Domino and MoE drafts. Skipped without a CUDA device; in the CUDA emulator (DF_CUDA=EMU) everything runs.
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/safetensors.h"
#include "modeling/target/byte_tokenizer.h"
#include "tests/cuda/cu_test.h"
#include "train/data/hs.h"
#include "train/trainer/trainer.h"

#define TARGET "recipes/tiny-target"
#define DRAFT  "configs/tiny-target-dflash.json"

// Prompt (unsupervised) and response (supervised) pairs in the tiny target's byte vocabulary and chat format
// (recipes/tiny-target/chat_template.jinja: the specials are matched literally by the tokenizer).
static void write_tokens(const char *path) {
  static const char *const qa[][2] = {{"What is a fortune cookie?", "A small crisp cookie with a paper slip."},
                                      {"Say something wise.", "A journey of a thousand miles begins slowly."},
                                      {"Tell me a joke about cats.", "Why did the cat sit on the computer?"},
                                      {"Name a colour.", "Blue, like the deep sea at dawn."}};
  FILE *fp = fopen(path, "w");
  cr_assert_not_null(fp, "%s", path);
  for (size_t i = 0; i < sizeof qa / sizeof *qa; i++) {
    char prompt[256], answer[256];
    snprintf(prompt, sizeof prompt, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", qa[i][0]);
    snprintf(answer, sizeof answer, "%s<|im_end|>\n", qa[i][1]);
    int32_t ids[512];
    const size_t p = df_byte_tok_encode(prompt, strlen(prompt), ids);
    const size_t n = p + df_byte_tok_encode(answer, strlen(answer), ids + p);
    fputs("{\"input_ids\": [", fp);
    for (size_t k = 0; k < n; k++) fprintf(fp, "%s%d", k ? ", " : "", ids[k]);
    fputs("], \"loss_mask\": [", fp);
    for (size_t k = 0; k < n; k++) fprintf(fp, "%s%d", k ? ", " : "", k >= p);
    fputs("]}\n", fp);
  }
  fclose(fp);
}

static void run_ok(const char *root, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void run_ok(const char *root, const char *what, const char *fmt, ...) {
  char args[4096], log[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(log, sizeof log, "%s/%s.log", root, what);
  cr_assert_eq(cu_run_cli(args, log), 0, "%s failed", what);
}

// ---- capture ---------------------------------------------------------------------------------------------------

static void expect_same_shards(const char *a_dir, const char *b_dir) {
  df_hs_dataset *a = NULL, *b = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_hs_open(a_dir, &a, &err), &err);
  DF_ASSERT_OK(df_hs_open(b_dir, &b, &err), &err);
  const df_hs_info *ia = df_hs_get_info(a), *ib = df_hs_get_info(b);
  cr_assert_eq(ib->num_samples, ia->num_samples, "sample count");
  const int64_t W = ia->num_layers * ia->hidden_size;
  for (int64_t s = 0; s < ia->num_samples; s++) {
    int64_t la = 0, lb = 0;
    DF_ASSERT_OK(df_hs_sample_length(a, s, &la, &err), &err);
    DF_ASSERT_OK(df_hs_sample_length(b, s, &lb, &err), &err);
    cr_assert_eq(lb, la, "sample %lld: length (the regenerated tokens differ)", (long long)s);
    int32_t *ida = malloc(sizeof(int32_t) * (size_t)la), *idb = malloc(sizeof(int32_t) * (size_t)la);
    uint8_t *ma = malloc((size_t)la), *mb = malloc((size_t)la);
    float *ha = malloc(sizeof(float) * (size_t)(la * W)), *hb = malloc(sizeof(float) * (size_t)(la * W));
    df_hs_sample_bufs ba = {ida, ma, ha, NULL}, bb = {idb, mb, hb, NULL};
    int64_t got;
    DF_ASSERT_OK(df_hs_read_sample(a, s, la, &ba, &got, &err), &err);
    DF_ASSERT_OK(df_hs_read_sample(b, s, la, &bb, &got, &err), &err);
    cr_expect(!memcmp(ida, idb, sizeof(int32_t) * (size_t)la), "sample %lld: token ids differ", (long long)s);
    cr_expect(!memcmp(ma, mb, (size_t)la), "sample %lld: loss masks differ", (long long)s);
    double maxd = 0, ref = 0;
    for (int64_t i = 0; i < la * W; i++) maxd = fmax(maxd, fabs((double)ha[i] - hb[i])), ref = fmax(ref, fabs(ha[i]));
    cr_expect_leq(maxd, 1e-4 * ref, "sample %lld: features max|Δ| %.3g vs max|ref| %.3g", (long long)s, maxd, ref);
    free(ida), free(idb), free(ma), free(mb), free(ha), free(hb);
  }
  df_hs_close(a), df_hs_close(b);
}

// ---- training, export, eval -------------------------------------------------------------------------------------

enum { STEPS = 6 };

static int read_losses(const char *run, double *loss, int n) {
  char p[700];
  snprintf(p, sizeof p, "%s/metrics.jsonl", run);
  FILE *f = fopen(p, "r");
  cr_assert_not_null(f, "%s", p);
  char line[1 << 14];
  int k = 0;
  while (k < n && fgets(line, sizeof line, f)) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    if (o && json_object_get(o, "loss") && json_object_get(o, "lr"))
      loss[k++] = json_number_value(json_object_get(o, "loss"));
    json_decref(o);
  }
  fclose(f);
  return k;
}

// dtype: model.torch_dtype (the CPU computes in fp32 whatever it says).
static void train(const char *root, const char *data, const char *run, const char *device, const char *dtype) {
  char label[64];
  snprintf(label, sizeof label, "%s_%s", device, dtype);
  run_ok(root, label,
         "train %s/recipes/demo-dflash.yaml --set output_dir='%s' --set data.hidden_states_path='%s' "
         "--set data.eval_hidden_states_path='%s' --set training.device=%s --set training.max_steps=%d "
         "--set training.batch_size=2 --set training.num_anchors=8 --set training.log_interval=1 "
         "--set training.eval_interval=0 --set model.torch_dtype=%s",
         CU_SOURCE_PATH, run, data, data, device, STEPS, dtype);
}

static void expect_exports_close(const char *a_path, const char *b_path) {
  df_st_file *a = NULL, *b = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open(a_path, &a, &err), &err);
  DF_ASSERT_OK(df_st_open(b_path, &b, &err), &err);
  cr_assert_eq(df_st_count(b), df_st_count(a), "tensor count");
  double d2 = 0, r2 = 0;
  for (int i = 0; i < df_st_count(a); i++) {
    const df_st_tensor *x = df_st_at(a, i), *y = df_st_find(b, x->name);
    cr_assert_not_null(y, "%s missing from the CUDA run's export", x->name);
    cr_assert_eq(y->numel, x->numel, "%s: shape", x->name);
    float *u = malloc(4 * (size_t)x->numel + 4), *v = malloc(4 * (size_t)x->numel + 4);
    DF_ASSERT_OK(df_st_read_f32(a, x, u, x->numel, &err), &err);
    DF_ASSERT_OK(df_st_read_f32(b, y, v, y->numel, &err), &err);
    double maxd = 0, ref = 0;
    for (int64_t k = 0; k < x->numel; k++) {
      const double d = (double)u[k] - v[k];
      maxd = fmax(maxd, isnan(d) ? INFINITY : fabs(d)), ref = fmax(ref, fabs(u[k]));
      d2 += d * d, r2 += (double)u[k] * u[k];
    }
    cr_expect_leq(maxd, 2e-2 * ref + 1e-6, "%s: max|Δ| %.3g vs max|ref| %.3g", x->name, maxd, ref);
    free(u), free(v);
  }
  cr_expect_leq(sqrt(d2 / r2), 2e-3, "the exports differ by %.3g relative L2", sqrt(d2 / r2));
  df_st_close(a), df_st_close(b);
}

static json_t *load_json(const char *path) {
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  cr_assert_not_null(o, "%s: %s", path, je.text);
  return o;
}

static double num(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

Test(cuda_program, capture_train_export_eval_and_spec_decode_on_the_tiny_target, .timeout = 600) {
  CU_REQUIRE_GPU();
  char root[128], tok[300], cap_cpu[300], cap_gpu[300], run_cpu[300], run_gpu[300];
  cu_tmpdir(root, sizeof root, "program");
  snprintf(tok, sizeof tok, "%s/tokens.jsonl", root);
  snprintf(cap_cpu, sizeof cap_cpu, "%s/cap_cpu", root), snprintf(cap_gpu, sizeof cap_gpu, "%s/cap_gpu", root);
  snprintf(run_cpu, sizeof run_cpu, "%s/run_cpu", root), snprintf(run_gpu, sizeof run_gpu, "%s/run_gpu", root);
  write_tokens(tok);

  const char *cap = "capture --target %s/" TARGET " --data '%s' --draft-config %s/" DRAFT
                    " --out '%s' --regenerate --max-new-tokens 12 --max-length 128 --dtype float32 --device %s";
  run_ok(root, "capture_cpu", cap, CU_SOURCE_PATH, tok, CU_SOURCE_PATH, cap_cpu, "cpu");
  run_ok(root, "capture_gpu", cap, CU_SOURCE_PATH, tok, CU_SOURCE_PATH, cap_gpu, "cuda");
  expect_same_shards(cap_cpu, cap_gpu);

  train(root, cap_cpu, run_cpu, "cpu", "float32");
  train(root, cap_cpu, run_gpu, "cuda", "float32"); // fp32 storage: the same program as the CPU's
  double lc[STEPS], lg[STEPS];
  cr_assert_eq(read_losses(run_cpu, lc, STEPS), STEPS);
  cr_assert_eq(read_losses(run_gpu, lg, STEPS), STEPS);
  for (int i = 0; i < STEPS; i++)
    cr_expect_leq(fabs(lg[i] - lc[i]), 5e-3 * fabs(lc[i]), "step %d: loss %.8g on CUDA, %.8g on the CPU", i + 1, lg[i],
                  lc[i]);

  run_ok(root, "export_cpu", "export '%s' --out '%s/export' --dtype float32", run_cpu, run_cpu);
  run_ok(root, "export_gpu", "export '%s' --out '%s/export' --dtype float32", run_gpu, run_gpu);
  char ea[400], eb[400];
  snprintf(ea, sizeof ea, "%s/export/model.safetensors", run_cpu),
      snprintf(eb, sizeof eb, "%s/export/model.safetensors", run_gpu);
  expect_exports_close(ea, eb);

  // The offline eval of one checkpoint on both devices.
  const char *ev = "eval '%s' --recipe '%s/recipe.resolved.yaml' --data '%s' --out '%s/eval_%s.json' --device %s";
  run_ok(root, "eval_cpu", ev, run_gpu, run_gpu, cap_cpu, root, "cpu", "cpu");
  run_ok(root, "eval_gpu", ev, run_gpu, run_gpu, cap_cpu, root, "cuda", "cuda");
  char pa[400], pb[400];
  snprintf(pa, sizeof pa, "%s/eval_cpu.json", root), snprintf(pb, sizeof pb, "%s/eval_cuda.json", root);
  json_t *ec = load_json(pa), *eg = load_json(pb);
  const char *counts[] = {"num_blocks", "num_samples", "acc_num", "acc_den"};
  for (int i = 0; i < 4; i++) cr_expect_eq(num(eg, counts[i]), num(ec, counts[i]), "eval %s", counts[i]);
  cr_expect_leq(fabs(num(eg, "loss") - num(ec, "loss")), 1e-5 * num(ec, "loss"), "eval loss %.9g vs %.9g",
                num(eg, "loss"), num(ec, "loss"));
  json_decref(ec), json_decref(eg);

  // Speculative decoding with the CPU run's export.
  const char *sd = "eval --spec-decode --target %s/" TARGET " --draft '%s/export' --data '%s' --max-new-tokens 24 "
                   "--out '%s/spec_%s.json' --device %s";
  run_ok(root, "spec_cpu", sd, CU_SOURCE_PATH, run_cpu, tok, root, "cpu", "cpu");
  run_ok(root, "spec_gpu", sd, CU_SOURCE_PATH, run_cpu, tok, root, "cuda", "cuda");
  snprintf(pa, sizeof pa, "%s/spec_cpu.json", root), snprintf(pb, sizeof pb, "%s/spec_cuda.json", root);
  json_t *sc = load_json(pa), *sg = load_json(pb);
  const char *same[] = {"generated_tokens", "target_forwards", "verifications", "prompts", "tau"};
  for (int i = 0; i < 5; i++) cr_expect_eq(num(sg, same[i]), num(sc, same[i]), "spec decode %s", same[i]);
  cr_expect(json_is_true(json_object_get(sg, "identical_to_greedy")), "the CUDA decode differs from greedy");
  cr_expect(json_equal(json_object_get(sg, "per_position_reached"), json_object_get(sc, "per_position_reached")),
            "per-slot counts differ");
  json_decref(sc), json_decref(sg);

  // Mixed precision, the CUDA default: the same training in bf16 storage follows the CPU's fp32 losses within bf16's
  // reach (2e-2 relative per step over these few steps; the 50-step curve is cuda_step's), and its bf16 export
  // (as users export) drafts for the target: speculative decoding with it is the target's greedy output.
  char run16[300];
  snprintf(run16, sizeof run16, "%s/run_bf16", root);
  train(root, cap_cpu, run16, "cuda", "bfloat16");
  double l16[STEPS];
  cr_assert_eq(read_losses(run16, l16, STEPS), STEPS);
  for (int i = 0; i < STEPS; i++)
    cr_expect_leq(fabs(l16[i] - lc[i]), 2e-2 * fabs(lc[i]), "step %d: bf16 loss %.8g, fp32 CPU %.8g", i + 1, l16[i],
                  lc[i]);
  run_ok(root, "export_bf16", "export '%s' --out '%s/export' --dtype bfloat16", run16, run16);
  run_ok(root, "spec_bf16", sd, CU_SOURCE_PATH, run16, tok, root, "bf16", "cuda");
  snprintf(pa, sizeof pa, "%s/spec_bf16.json", root);
  json_t *s16 = load_json(pa);
  cr_expect(json_is_true(json_object_get(s16, "identical_to_greedy")), "the bf16 draft's decode differs from greedy");
  json_decref(s16);
  cu_rmtree(root);
}

// ---- device residency on the CUDA backend -------------------------------------------------------------------------

enum { RSTEPS = 3, ACCUM = 2 };

typedef struct {
  df_transfer_stats per_step[RSTEPS + 1];
  int seen;
} transfers;

static void on_step(void *ctx, int64_t step, df_transfer_stats s) {
  transfers *t = ctx;
  if (step >= 1 && step <= RSTEPS) t->per_step[step] = s, t->seen++;
}

#define DFX DF_FIXTURE_DIR "/dflash_step"
#define SFX DF_FIXTURE_DIR "/dspark_step"
#define OFX DF_FIXTURE_DIR "/domino_step"

static void residency(const char *name, const char *draft, const char *data, const char *strategy) {
  char root[128], recipe[300], out[300], o[400];
  cu_tmpdir(root, sizeof root, name);
  snprintf(recipe, sizeof recipe, "%s/recipe.yaml", root), snprintf(out, sizeof out, "%s/run", root);
  FILE *fp = fopen(recipe, "w");
  cr_assert_not_null(fp);
  fprintf(fp,
          "model:\n  target_model_path: " DFX "/target\n  draft_model_config: %s\ndata:\n  hidden_states_path: %s\n"
          "  max_length: 64\ntraining:\n  strategy: %s\n  batch_size: 2\n  accumulation_steps: %d\n  num_anchors: 4\n"
          "  objective_chunk_blocks: 2\n  num_epochs: 4\n  total_steps: %d\n  learning_rate: 1e-3\n  log_interval: 1\n"
          "  seed: 7\n  device: cuda\nrun_id: residency\n",
          draft, data, strategy, ACCUM, RSTEPS);
  fclose(fp);
  snprintf(o, sizeof o, "output_dir=%s", out);
  const char *sets[] = {o};
  transfers tr = {0};
  df_train_hooks h = {.ctx = &tr, .after_step = on_step};
  df_train_options opt = {
      .recipe_path = recipe, .overrides = sets, .n_overrides = 1, .threads = 1, .no_prefetch = true, .hooks = &h};
  df_train_summary s;
  df_error err = {0};
  DF_ASSERT_OK(df_train(&opt, &s, &err), &err);
  cr_assert_eq(s.last_step, RSTEPS);
  cr_assert_eq(tr.seen, RSTEPS);
  for (int k = 1; k <= RSTEPS; k++) {
    cr_expect_eq(tr.per_step[k].h2d, ACCUM, "%s step %d: %lld uploads, want one per micro-batch", name, k,
                 (long long)tr.per_step[k].h2d);
    cr_expect_eq(tr.per_step[k].d2h, 1, "%s step %d: %lld reads, want one", name, k, (long long)tr.per_step[k].d2h);
  }
  cu_rmtree(root);
}

Test(cuda_program, dflash_step_moves_only_the_batch_and_one_read, .timeout = 300) {
  CU_REQUIRE_GPU();
  residency("res_dflash", DFX "/tiny-dflash.json", DFX "/data", "dflash");
}

Test(cuda_program, dspark_step_moves_only_the_batch_and_one_read, .timeout = 300) {
  CU_REQUIRE_GPU();
  residency("res_dspark", SFX "/rnn.json", SFX "/data", "dspark");
}

Test(cuda_program, domino_step_moves_only_the_batch_and_one_read, .timeout = 300) {
  CU_REQUIRE_GPU();
  residency("res_domino", OFX "/domino-shift.json", DFX "/data", "domino");
}

Test(cuda_program, moe_step_moves_only_the_batch_and_one_read, .timeout = 300) {
  CU_REQUIRE_GPU();
  residency("res_moe", DF_SOURCE_DIR "/configs/tiny-dflash-moe.json", DFX "/data", "dflash");
}
