// Online training on the bundled tiny target (recipes/tiny-target): the online source's batches equal a capture's
// read back (bf16 and fp32 captures, DSpark's final states too, prefetch on and off); `draftforge train` on a token
// JSONL gives the same weights and metrics, bit for bit, as capture-then-train on the same data and seed (with
// online eval against offline eval), and an fp32 online run differs from a bf16 capture (the rounding is what
// makes them equal); an EAGLE-3 run (its capture layers, final states and vocabulary mapping) likewise; resume and
// prefetch keep the bits; conversations are prepared once through
// tools/run/prepare_data.py (when the tools venv exists); bad data and refused deployments are named; the bundled
// online demo recipe loads; on the strict fake device an online run uploads one batch per micro-batch and equals
// the CPU run.
#include <criterion/criterion.h>
#include <glob.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "modeling/target/byte_tokenizer.h"
#include "tests/common/fixture.h"
#include "tests/common/json_edit.h"
#include "train/data/capture.h"
#include "train/data/online_data.h"
#include "train/observe/metrics_log.h"
#include "train/trainer/trainer.h"

#define TARGET     DF_SOURCE_DIR "/recipes/tiny-target"
#define DFLASH_CFG DF_SOURCE_DIR "/configs/tiny-target-dflash.json"
#define MAX_LEN    96

// Fortunes-like prompt / response pairs; the target's own domain.
static const char *const QA[][2] = {
    {"Many alligators will", "be slain, but the swamp will remain."},
    {"A fool and his money", "are soon parted."},
    {"You will be", "surprised by a loud noise."},
    {"Anything that begins well", "will end badly."},
    {"Never put off till tomorrow", "what you can do today."},
    {"The early bird", "gets the worm, but the second mouse gets the cheese."},
    {"If at first you don't succeed,", "try, try again."},
    {"All that glitters", "is not gold."},
    {"A penny saved", "is a penny earned."},
    {"Time flies like an arrow;", "fruit flies like a banana."},
    {"Do not meddle in the affairs of wizards,", "for they are subtle and quick to anger."},
    {"He who laughs last", "laughs best."},
    {"To err is human,", "to forgive divine."},
    {"The pen is mightier", "than the sword."},
    {"Where there's a will,", "there's a way."},
    {"Look before", "you leap."},
    {"Brevity is", "the soul of wit."},
    {"Rome was not built", "in a day."},
    {"Actions speak louder", "than words."},
};

typedef struct {
  char root[256], tokens[300], eval_tokens[300], recipe[300], cfg[300];
} odir;

// ChatML as the tiny target's template renders it; the mask covers the response and its end-of-turn marker.
static void write_sample(FILE *fp, const char *q, const char *a, bool supervise) {
  char text[2048];
  int head = snprintf(text, sizeof text, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", q);
  int32_t ids[2048];
  size_t nh = df_byte_tok_encode(text, (size_t)head, ids);
  snprintf(text + head, sizeof text - (size_t)head, "%s<|im_end|>\n", a);
  size_t n = df_byte_tok_encode(text, strlen(text), ids);
  fprintf(fp, "{\"input_ids\": [");
  for (size_t i = 0; i < n; i++) fprintf(fp, "%s%d", i ? ", " : "", ids[i]);
  fprintf(fp, "], \"loss_mask\": [");
  for (size_t i = 0; i < n; i++) fprintf(fp, "%s%d", i ? ", " : "", supervise && i >= nh);
  fprintf(fp, "]}\n");
}

// Training lines: 14 pairs, a blank line, an unsupervised sample (dropped everywhere) and a sample longer than
// MAX_LEN (truncated everywhere); eval lines: the last 5 pairs.
static void write_tokens(const odir *d) {
  FILE *fp = fopen(d->tokens, "w");
  cr_assert(fp);
  for (int i = 0; i < 14; i++) {
    write_sample(fp, QA[i][0], QA[i][1], true);
    if (i == 3) fputs("\n", fp);
    if (i == 6) write_sample(fp, "Nothing to learn", "here.", false);
  }
  write_sample(fp, "Say it four times:",
               "the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog, the quick "
               "brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.",
               true);
  fclose(fp);
  fp = fopen(d->eval_tokens, "w");
  cr_assert(fp);
  for (int i = 14; i < 19; i++) write_sample(fp, QA[i][0], QA[i][1], true);
  fclose(fp);
}

static const char *RECIPE = "run_id: online\n"
                            "model:\n"
                            "  target_model_path: " TARGET "\n"
                            "data:\n"
                            "  max_length: 96\n"
                            "training:\n"
                            "  batch_size: 2\n"
                            "  accumulation_steps: 2\n"
                            "  num_anchors: 8\n"
                            "  loss_decay_gamma: 7.0\n"
                            "  num_epochs: 20\n"
                            "  total_steps: 6\n"
                            "  learning_rate: 1e-3\n"
                            "  warmup_ratio: 0.2\n"
                            "  max_grad_norm: 1.0\n"
                            "  log_interval: 1\n"
                            "  save_interval: 3\n"
                            "  seed: 7\n";

// A DSpark draft for the tiny target (configs/tiny-dspark.json resized), or the DFlash demo config.
static void write_config(const odir *d, bool dspark) {
  json_t *c = df_test_config_doc(dspark ? "tiny-dspark.json" : "tiny-target-dflash.json");
  if (dspark) {
    df_test_json_set(c, "hidden_size", df_test_json("256"));
    df_test_json_set(c, "vocab_size", df_test_json("264"));
    df_test_json_set(c, "head_dim", df_test_json("64"));
    df_test_json_set(c, "intermediate_size", df_test_json("256"));
    df_test_json_set(c, "num_hidden_layers", df_test_json("1"));
    df_test_json_set(c, "layer_types", df_test_json("[\"full_attention\"]"));
    df_test_json_set(c, "use_sliding_window", df_test_json("false"));
    df_test_json_set(c, "sliding_window", df_test_json("null"));
    df_test_json_set(c, "eos_token_id", df_test_json("258"));
    df_test_json_set(c, "dflash_config.mask_token_id", df_test_json("259"));
  }
  cr_assert_eq(json_dump_file(c, d->cfg, JSON_INDENT(1)), 0);
  json_decref(c);
}

static void odir_open(odir *d, const char *name, bool dspark) {
  snprintf(d->root, sizeof d->root, "/tmp/df_test_online_%s_%ld", name, (long)getpid());
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", d->root, d->root);
  cr_assert_eq(system(cmd), 0);
  snprintf(d->tokens, sizeof d->tokens, "%s/train.jsonl", d->root);
  snprintf(d->eval_tokens, sizeof d->eval_tokens, "%s/eval.jsonl", d->root);
  snprintf(d->recipe, sizeof d->recipe, "%s/recipe.yaml", d->root);
  snprintf(d->cfg, sizeof d->cfg, "%s/draft.json", d->root);
  write_tokens(d);
  write_config(d, dspark);
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  fprintf(fp, "%s", RECIPE);
  fprintf(fp, "  strategy: %s\n", dspark ? "dspark" : "dflash");
  fclose(fp);
}

static void odir_close(odir *d) {
  if (getenv("DF_TEST_KEEP")) return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
  cr_expect_eq(system(cmd), 0);
}

// `draftforge capture` of a token file into <root>/<name> (bf16 or fp32, no regeneration, MAX_LEN).
static void capture(const odir *d, const char *tokens, const char *name, df_dtype dtype, int64_t want) {
  char out[400];
  snprintf(out, sizeof out, "%s/%s", d->root, name);
  df_capture_options o = {.target_dir = TARGET,
                          .data_path = tokens,
                          .draft_config_path = d->cfg,
                          .out_dir = out,
                          .max_length = MAX_LEN,
                          .samples_per_shard = 4,
                          .dtype = dtype,
                          .last_hidden = -1};
  df_capture_report rep;
  df_error err = {0};
  omp_set_num_threads(1); // as `draftforge capture --threads 1`: the thread count the runs below train with
  DF_ASSERT_OK(df_capture_run(&o, &rep, &err), &err);
  cr_assert_eq(rep.written, want, "%s: %lld samples", tokens, (long long)rep.written);
}

// Trains the recipe into <root>/<run> with the given overrides (NULL-terminated) on `threads` threads.
static df_status train(const odir *d, const char *run, const char *const *sets, bool resume, bool prefetch,
                       const df_train_hooks *hooks, df_train_summary *s, df_error *err) {
  const char *all[24];
  char out[400], cfg[400], res[400];
  snprintf(out, sizeof out, "output_dir=%s/%s", d->root, run);
  snprintf(cfg, sizeof cfg, "model.draft_model_config=%s", d->cfg);
  snprintf(res, sizeof res, "%s/%s", d->root, run);
  int n = 0;
  all[n++] = out, all[n++] = cfg;
  for (int i = 0; sets && sets[i]; i++) all[n++] = sets[i];
  df_train_options o = {.recipe_path = d->recipe,
                        .overrides = all,
                        .n_overrides = n,
                        .resume = resume ? res : NULL,
                        .threads = 1,
                        .no_prefetch = !prefetch,
                        .online_overlap = prefetch, // the target on the reader thread: the thread pinning is tested
                        .handle_signals = true,
                        .hooks = hooks};
  omp_set_num_threads(1);
  return df_train(&o, s, err);
}

static void train_ok(const odir *d, const char *run, const char *const *sets, bool resume, df_train_summary *s) {
  df_error err = {0};
  DF_ASSERT_OK(train(d, run, sets, resume, true, NULL, s, &err), &err);
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

static bool same_weights(const odir *d, const char *a, const char *b, int64_t step) {
  char pa[400], pb[400];
  snprintf(pa, sizeof pa, "%s/%s/checkpoints/step-%08lld/model.safetensors", d->root, a, (long long)step);
  snprintf(pb, sizeof pb, "%s/%s/checkpoints/step-%08lld/model.safetensors", d->root, b, (long long)step);
  size_t na, nb;
  char *x = slurp(pa, &na), *y = slurp(pb, &nb);
  bool same = na == nb && !memcmp(x, y, na);
  free(x), free(y);
  return same;
}

// metrics.jsonl without its timing fields, as one canonical text.
static char *metrics(const odir *d, const char *run, size_t *lines) {
  char p[400];
  snprintf(p, sizeof p, "%s/%s/metrics.jsonl", d->root, run);
  FILE *fp = fopen(p, "r");
  cr_assert(fp, "no %s", p);
  json_t *rows = json_array();
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, fp) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    cr_assert(o, "bad line in %s", p);
    df_metrics_strip_timing(o);
    json_array_append_new(rows, o);
  }
  free(line);
  fclose(fp);
  *lines = json_array_size(rows);
  char *text = json_dumps(rows, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  json_decref(rows);
  return text;
}

static void expect_same_run(const odir *d, const char *a, const char *b, int64_t step, size_t want_lines) {
  cr_expect(same_weights(d, a, b, step), "%s and %s: the weights of step %lld differ", a, b, (long long)step);
  size_t la, lb;
  char *ma = metrics(d, a, &la), *mb = metrics(d, b, &lb);
  cr_expect_eq(la, want_lines, "%s: %zu metrics lines", a, la);
  cr_expect_str_eq(ma, mb, "metrics of %s and %s differ", a, b);
  free(ma), free(mb);
}

// ---- batches ---------------------------------------------------------------------------------------------------

static void expect_same_batch(const df_batch *x, const df_batch *y) {
  cr_assert_eq(x->B, y->B);
  cr_assert_eq(x->S, y->S);
  cr_assert_eq(x->width, y->width);
  cr_assert_eq(x->hidden_size, y->hidden_size);
  const size_t rows = (size_t)(x->B * x->S);
  cr_expect_arr_eq(x->length, y->length, sizeof(int64_t) * (size_t)x->B);
  cr_expect_arr_eq(x->index, y->index, sizeof(int64_t) * (size_t)x->B);
  cr_expect_arr_eq(x->input_ids, y->input_ids, sizeof(int32_t) * rows);
  cr_expect_arr_eq(x->loss_mask, y->loss_mask, rows);
  for (size_t i = 0; i < rows * (size_t)x->width; i++)
    if (x->hidden[i] != y->hidden[i]) {
      fprintf(stderr, "first hidden difference at %zu (row %zu col %zu of S %lld): %a vs %a\n", i, i / (size_t)x->width,
              i % (size_t)x->width, (long long)x->S, x->hidden[i], y->hidden[i]);
      break;
    }
  cr_expect(!memcmp(x->hidden, y->hidden, sizeof(float) * rows * (size_t)x->width), "hidden rows differ");
  if (x->hidden_size)
    cr_expect(!memcmp(x->last_hidden, y->last_hidden, sizeof(float) * rows * (size_t)x->hidden_size),
              "last hidden rows differ");
}

// Every sample of the capture and of the online source, three at a time in a shuffled order, truncated further to
// 64 rows in one pass: the same bits.
static void expect_same_sources(const odir *d, const char *capture_dir, df_dtype dtype, bool last) {
  df_error err = {0};
  const df_draft_config *cfg = NULL;
  DF_ASSERT_OK(df_draft_config_from_file(d->cfg, &cfg, &err), &err);
  df_batch_source *hs = NULL, *on = NULL;
  DF_ASSERT_OK(df_hs_source_open(capture_dir, cfg, last, &hs, &err), &err);
  df_online_target *t = NULL;
  df_online_target_options to = {.target_dir = TARGET, .cfg = cfg, .feature_dtype = dtype, .threads = 1};
  DF_ASSERT_OK(df_online_target_open(&to, &t, &err), &err);
  int64_t dropped = -1;
  DF_ASSERT_OK(df_online_source_open(t, d->tokens, MAX_LEN, 0, &dropped, &on, &err), &err);
  cr_assert_eq(on->num_samples, hs->num_samples);
  cr_assert_eq(on->num_samples, 15);
  cr_expect_eq(dropped, 1);
  int64_t perm[15], NN = on->num_samples;
  df_data_epoch_order(NN, 3, 0, perm);
  for (int pass = 0; pass < 2; pass++)
    for (int64_t first = 0; first + 3 <= NN; first += 3) {
      df_batch x, y;
      const int64_t cut = pass ? 64 : MAX_LEN;
      DF_ASSERT_OK(df_batch_source_read(hs, perm + first, 3, cut, last, &x, &err), &err);
      DF_ASSERT_OK(df_batch_source_read(on, perm + first, 3, cut, last, &y, &err), &err);
      expect_same_batch(&x, &y);
      df_batch_free(&x), df_batch_free(&y);
    }
  df_online_stats st = df_online_target_stats(t);
  cr_expect_eq(st.samples, 30);
  cr_expect_gt(st.tokens, 30 * 20);
  df_batch_source_close(on);
  df_batch_source_close(hs);
  df_online_target_free(t);
  df_draft_config_free(cfg);
}

Test(online, source_batches_equal_a_bf16_capture_read_back) {
  odir d;
  odir_open(&d, "src_bf16", false);
  capture(&d, d.tokens, "cap", DF_BF16, 15);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/cap", d.root);
  expect_same_sources(&d, dir, DF_BF16, false);
  odir_close(&d);
}

Test(online, source_batches_equal_an_f32_capture_with_final_states) {
  odir d;
  odir_open(&d, "src_f32", true); // DSpark: the capture also stores target_last_hidden_states
  capture(&d, d.tokens, "cap", DF_F32, 15);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/cap", d.root);
  expect_same_sources(&d, dir, DF_F32, true);
  odir_close(&d);
}

// ---- training --------------------------------------------------------------------------------------------------

// Online training and eval (data.train_data_path / eval_data_path) against a capture of the same files trained
// offline: the same weights and metrics; the summary shows the target's work only online.
static void online_vs_offline(bool dspark, df_dtype dtype) {
  odir d;
  odir_open(&d, dspark ? "train_dspark" : (dtype == DF_BF16 ? "train_bf16" : "train_f32"), dspark);
  capture(&d, d.tokens, "cap_train", dtype, 15);
  capture(&d, d.eval_tokens, "cap_eval", dtype, 5);
  char hs[400], ehs[400], td[400], ed[400];
  snprintf(hs, sizeof hs, "data.hidden_states_path=%s/cap_train", d.root);
  snprintf(ehs, sizeof ehs, "data.eval_hidden_states_path=%s/cap_eval", d.root);
  snprintf(td, sizeof td, "data.train_data_path=%s", d.tokens);
  snprintf(ed, sizeof ed, "data.eval_data_path=%s", d.eval_tokens);
  const char *dt = dtype == DF_BF16 ? "data.online_feature_dtype=bfloat16" : "data.online_feature_dtype=float32";
  const char *offline[] = {hs, ehs, "training.eval_interval=3", NULL};
  const char *online[] = {td, ed, dt, "training.eval_interval=3", NULL};
  df_train_summary so, sn;
  train_ok(&d, "offline", offline, false, &so);
  train_ok(&d, "online", online, false, &sn);
  cr_expect_eq(so.last_step, 6);
  cr_expect_eq(sn.last_step, 6);
  cr_expect_eq(so.online_samples, 0);
  // 6 steps × 2 micro-batches × 2 samples, the prefetched batch of step 7, and 2 evals of 5 samples
  cr_expect_geq(sn.online_samples, 24 + 10);
  cr_expect_leq(sn.online_samples, 24 + 2 + 10);
  cr_expect_gt(sn.online_target_s, 0);
  expect_same_run(&d, "offline", "online", 6, 6 + 2);
  expect_same_run(&d, "offline", "online", 3, 6 + 2);
  if (dtype == DF_BF16 && !dspark) { // the control: unrounded fp32 features train to other weights
    const char *f32[] = {td, ed, "data.online_feature_dtype=float32", "training.eval_interval=3", NULL};
    train_ok(&d, "online_f32", f32, false, &sn);
    cr_expect_not(same_weights(&d, "offline", "online_f32", 6),
                  "fp32 features gave the weights of a bf16 capture: the comparison cannot tell them apart");
  }
  odir_close(&d);
}

Test(online, train_equals_bf16_capture_then_train) { online_vs_offline(false, DF_BF16); }
Test(online, train_equals_f32_capture_then_train) { online_vs_offline(false, DF_F32); }
Test(online, dspark_train_equals_capture_then_train) { online_vs_offline(true, DF_BF16); }

// EAGLE-3 online (SpecForge's default strategy): the target computes the three capture layers and the final state per
// batch; the vocabulary mapping (128 of 264) is derived from the online source's tokens before step 1, the same as
// from the capture's. Three TTT steps keep it short. P-EAGLE reads the same features: the same captures (taken once,
// for the EAGLE-3 config) train it with its own config and three depths, offline and online alike.
static void eagle_runs(odir *d, const char *config, const char *training, const char *offline_run,
                       const char *online_run) {
  json_t *c = df_test_config_doc(config);
  cr_assert_eq(json_dump_file(c, d->cfg, JSON_INDENT(1)), 0);
  json_decref(c);
  FILE *fp = fopen(d->recipe, "w");
  cr_assert(fp);
  fprintf(fp, "%s%s", RECIPE, training);
  fclose(fp);
  char hs[400], ehs[400], td[400], ed[400];
  snprintf(hs, sizeof hs, "data.hidden_states_path=%s/cap_train", d->root);
  snprintf(ehs, sizeof ehs, "data.eval_hidden_states_path=%s/cap_eval", d->root);
  snprintf(td, sizeof td, "data.train_data_path=%s", d->tokens);
  snprintf(ed, sizeof ed, "data.eval_data_path=%s", d->eval_tokens);
  const char *offline[] = {hs, ehs, "training.eval_interval=3", NULL};
  const char *online[] = {td, ed, "data.online_feature_dtype=bfloat16", "training.eval_interval=3", NULL};
  df_train_summary so, sn;
  train_ok(d, offline_run, offline, false, &so);
  train_ok(d, online_run, online, false, &sn);
  cr_expect_eq(so.last_step, 6);
  cr_expect_eq(sn.last_step, 6);
  cr_expect_gt(sn.online_samples, 0);
  expect_same_run(d, offline_run, online_run, 6, 6 + 2);
}

Test(online, eagle3_and_peagle_train_equal_capture_then_train) {
  odir d;
  odir_open(&d, "train_eagle", false);
  json_t *c = df_test_config_doc("tiny-target-eagle3.json");
  cr_assert_eq(json_dump_file(c, d.cfg, JSON_INDENT(1)), 0);
  json_decref(c);
  capture(&d, d.tokens, "cap_train", DF_BF16, 15);
  capture(&d, d.eval_tokens, "cap_eval", DF_BF16, 5);
  eagle_runs(&d, "tiny-target-eagle3.json", "  strategy: eagle3\n  ttt_length: 3\n", "offline", "online");
  eagle_runs(&d, "tiny-target-peagle.json", "  strategy: peagle\n  num_depths: 3\n", "offline_peagle", "online_peagle");
  odir_close(&d);
}

static void sigterm_at(void *ctx, int64_t step, int64_t micro, float *grads, int64_t n) {
  (void)grads, (void)n;
  const int64_t *at = ctx;
  if (step == at[0] && micro == at[1]) raise(SIGTERM);
}

Test(online, resume_and_prefetch_keep_the_bits) {
  odir d;
  odir_open(&d, "resume", false);
  char td[400];
  snprintf(td, sizeof td, "data.train_data_path=%s", d.tokens);
  const char *all[] = {td, NULL};
  df_train_summary s;
  train_ok(&d, "straight", all, false, &s);
  // stopped at step 4 (max_steps), resumed to 6: the feed continues at the same cursor, mid-epoch
  const char *half[] = {td, "training.max_steps=4", NULL};
  train_ok(&d, "split", half, false, &s);
  cr_expect_eq(s.last_step, 4);
  train_ok(&d, "split", all, true, &s);
  cr_expect_eq(s.start_step, 4);
  cr_expect_eq(s.last_step, 6);
  expect_same_run(&d, "straight", "split", 6, 6);
  // SIGTERM in step 2's window: the step completes, is checkpointed, and the resumed run continues bit for bit
  int64_t at[2] = {2, 1};
  df_train_hooks h = {.ctx = at, .after_micro = sigterm_at};
  df_error err = {0};
  DF_ASSERT_OK(train(&d, "sig", all, false, true, &h, &s, &err), &err);
  cr_expect(s.stopped_by_signal);
  cr_expect_eq(s.last_step, 2);
  train_ok(&d, "sig", all, true, &s);
  expect_same_run(&d, "straight", "sig", 6, 6);
  // the batches are the same without the reader thread
  DF_ASSERT_OK(train(&d, "sync", all, false, false, NULL, &s, &err), &err);
  expect_same_run(&d, "straight", "sync", 6, 6);
  odir_close(&d);
}

// ---- the device-resident trainer ---------------------------------------------------------------------------------

typedef struct {
  df_transfer_stats per_step[7];
  int seen;
} transfers;

static void on_step(void *ctx, int64_t step, df_transfer_stats x) {
  transfers *t = ctx;
  if (step >= 1 && step <= 6) t->per_step[step] = x, t->seen++;
}

// The online source fills the same host batch the trainer's stage (strategies/dflash/stage.h) uploads for shards: on
// the strict fake device (its memory faults on any host access) an online run with online eval moves one upload per
// micro-batch and one read per step, and equals the CPU run bit for bit.
Test(online, online_run_on_the_strict_fake_device_equals_the_cpu_run) {
  odir d;
  odir_open(&d, "fake", false);
  char td[400], ed[400], out[400], cfg[400];
  snprintf(td, sizeof td, "data.train_data_path=%s", d.tokens);
  snprintf(ed, sizeof ed, "data.eval_data_path=%s", d.eval_tokens);
  snprintf(cfg, sizeof cfg, "model.draft_model_config=%s", d.cfg);
  df_train_summary s;
  const char *sets[] = {td, ed, "training.eval_interval=3", NULL};
  train_ok(&d, "cpu", sets, false, &s);
  snprintf(out, sizeof out, "output_dir=%s/fake", d.root);
  const char *all[] = {out, cfg, td, ed, "training.eval_interval=3"};
  df_ctx_options co = {.device = DF_DEV_FAKE, .num_threads = 1, .backend = df_fake_strict_backend()};
  transfers tr = {0};
  df_train_hooks h = {.ctx = &tr, .after_step = on_step};
  df_train_options o = {.recipe_path = d.recipe,
                        .overrides = all,
                        .n_overrides = 5,
                        .threads = 1,
                        .online_overlap = true,
                        .hooks = &h,
                        .ctx_options = &co};
  omp_set_num_threads(1);
  df_error err = {0};
  DF_ASSERT_OK(df_train(&o, &s, &err), &err);
  cr_expect_eq(s.last_step, 6);
  cr_expect_eq(tr.seen, 6);
  for (int k = 1; k <= 6; k++) {
    cr_expect_eq(tr.per_step[k].h2d, 2, "step %d: %lld uploads, want one per micro-batch", k,
                 (long long)tr.per_step[k].h2d);
    cr_expect_eq(tr.per_step[k].d2h, 1, "step %d: %lld reads, want one", k, (long long)tr.per_step[k].d2h);
  }
  expect_same_run(&d, "cpu", "fake", 6, 6 + 2);
  odir_close(&d);
}

// ---- conversations ---------------------------------------------------------------------------------------------

static void write_conversations(const char *path) {
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  for (int i = 0; i < 8; i++) {
    json_t *o = json_pack("{s:[{s:s,s:s},{s:s,s:s}]}", "conversations", "from", "human", "value", QA[i][0], "from",
                          "gpt", "value", QA[i][1]);
    char *line = json_dumps(o, JSON_COMPACT);
    fprintf(fp, "%s\n", line);
    free(line);
    json_decref(o);
  }
  fclose(fp);
}

Test(online, conversations_are_prepared_once_into_the_cache) {
  const char *venv = DF_SOURCE_DIR "/.venv-tools/bin/python";
  if (access(venv, X_OK) != 0) cr_skip_test("no %s (scripts/setup.sh creates it): prepare_data.py cannot run", venv);
  setenv("DRAFTFORGE_PYTHON", venv, 1);
  odir d;
  odir_open(&d, "conv", false);
  char conv[300], td[400], cache[400], pattern[400];
  snprintf(conv, sizeof conv, "%s/conversations.jsonl", d.root);
  write_conversations(conv);
  snprintf(td, sizeof td, "data.train_data_path=%s", conv);
  snprintf(cache, sizeof cache, "data.cache_dir=%s/cache", d.root);
  const char *sets[] = {td, cache, "data.chat_template=chatml", "training.max_steps=3", NULL};
  df_train_summary s;
  train_ok(&d, "conv", sets, false, &s);
  cr_expect_eq(s.last_step, 3);
  snprintf(pattern, sizeof pattern, "%s/cache/prepared/*.jsonl", d.root);
  glob_t g;
  cr_assert_eq(glob(pattern, 0, NULL, &g), 0, "no prepared file under %s", pattern);
  cr_assert_eq(g.gl_pathc, 1);
  struct stat before, after;
  cr_assert_eq(stat(g.gl_pathv[0], &before), 0);
  // the same prepared tokens given directly train to the same bits; a second conversations run reuses the file
  char direct[600];
  snprintf(direct, sizeof direct, "data.train_data_path=%s", g.gl_pathv[0]);
  const char *tokens[] = {direct, "training.max_steps=3", NULL};
  train_ok(&d, "tokens", tokens, false, &s);
  train_ok(&d, "conv2", sets, false, &s);
  cr_assert_eq(stat(g.gl_pathv[0], &after), 0);
  cr_expect_eq(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  cr_expect_eq(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  globfree(&g);
  expect_same_run(&d, "conv", "tokens", 3, 3);
  expect_same_run(&d, "conv", "conv2", 3, 3);
  odir_close(&d);
}

// ---- errors ----------------------------------------------------------------------------------------------------

static df_error train_err(const odir *d, const char *const *sets, df_status want) {
  df_train_summary s;
  df_error err = {0};
  cr_expect_eq(train(d, "bad", sets, false, true, NULL, &s, &err), want, "%s [%s]", err.msg, err.where);
  return err;
}

Test(online, bad_data_and_refused_deployments_are_named) {
  odir d;
  odir_open(&d, "errors", false);
  char td[400], hs[400], bad[300], badset[400], capdir[400];
  snprintf(td, sizeof td, "data.train_data_path=%s", d.tokens);
  snprintf(hs, sizeof hs, "data.hidden_states_path=%s", d.tokens);

  // a disaggregated SpecForge deployment: refused by name, the online mode as the hint
  const char *disagg[] = {td, "deployment.mode=disaggregated", NULL};
  df_error e = train_err(&d, disagg, DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(e.where, "deployment.mode");
  cr_expect(strstr(e.msg, "disaggregated SGLang / Mooncake deployment"), "%s", e.msg);
  cr_expect(strstr(e.hint, "data.train_data_path") && strstr(e.hint, "in-process"), "%s", e.hint);

  // a SpecForge deployment.disaggregated section (the recipe file gets one for this run)
  char *plain = NULL;
  size_t plain_len = 0;
  plain = slurp(d.recipe, &plain_len);
  FILE *rf = fopen(d.recipe, "a");
  cr_assert(rf);
  fputs("deployment:\n  disaggregated:\n    num_capture_servers: 2\n", rf);
  fclose(rf);
  const char *disagg2[] = {td, NULL};
  e = train_err(&d, disagg2, DF_ERR_UNSUPPORTED);
  cr_expect_str_eq(e.where, "deployment.disaggregated");
  cr_expect(strstr(e.hint, "data.train_data_path"), "%s", e.hint);
  rf = fopen(d.recipe, "w");
  cr_assert(rf);
  fwrite(plain, 1, plain_len, rf);
  fclose(rf);
  free(plain);

  // the online keys' values and combinations
  const char *dtype[] = {td, "data.online_feature_dtype=float16", NULL};
  e = train_err(&d, dtype, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.online_feature_dtype");
  cr_expect(strstr(e.msg, "float16"), "%s", e.msg);
  char ehs[400], ed[400];
  snprintf(ehs, sizeof ehs, "data.eval_hidden_states_path=%s", d.eval_tokens);
  snprintf(ed, sizeof ed, "data.eval_data_path=%s", d.eval_tokens);
  const char *two_evals[] = {td, ehs, ed, NULL};
  e = train_err(&d, two_evals, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.eval_data_path");
  const char *eval_tok_as_hs[] = {td, ehs, "training.eval_interval=3", NULL};
  e = train_err(&d, eval_tok_as_hs, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.eval_hidden_states_path");
  const char *no_eval[] = {td, "training.eval_interval=3", NULL};
  e = train_err(&d, no_eval, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "training.eval_interval");
  cr_expect(strstr(e.hint, "data.eval_data_path"), "%s", e.hint);
  char cap_hs[400];
  snprintf(cap_hs, sizeof cap_hs, "data.hidden_states_path=%s/none", d.root);
  const char *prompts_offline[] = {cap_hs, "data.max_prompts=4", NULL};
  e = train_err(&d, prompts_offline, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.max_prompts");
  char pp[400];
  snprintf(pp, sizeof pp, "data.prompts_path=%s", d.tokens);
  const char *two_online[] = {td, pp, NULL};
  e = train_err(&d, two_online, DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "exactly one") && strstr(e.msg, "2 set"), "%s", e.msg);

  // exactly one training source
  const char *both[] = {td, hs, NULL};
  e = train_err(&d, both, DF_ERR_INVALID);
  cr_expect(strstr(e.msg, "exactly one"), "%s", e.msg);
  const char *none[] = {NULL};
  e = train_err(&d, none, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.hidden_states_path");

  // a token file where shards belong, shards where online data belongs
  const char *tok_as_hs[] = {hs, NULL};
  e = train_err(&d, tok_as_hs, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.hidden_states_path");
  cr_expect(strstr(e.hint, "data.train_data_path"), "%s", e.hint);
  capture(&d, d.eval_tokens, "cap", DF_BF16, 5);
  snprintf(capdir, sizeof capdir, "data.train_data_path=%s/cap", d.root);
  const char *hs_as_online[] = {capdir, NULL};
  e = train_err(&d, hs_as_online, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "data.train_data_path");
  cr_expect(strstr(e.msg, "holds hidden states"), "%s", e.msg);

  // a malformed line names the file and line; so does an id outside the target's vocabulary
  snprintf(bad, sizeof bad, "%s/bad.jsonl", d.root);
  FILE *fp = fopen(bad, "w");
  fputs("{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n{\"input_ids\": [1, 2], \"loss_mask\": [1]}\n", fp);
  fclose(fp);
  snprintf(badset, sizeof badset, "data.train_data_path=%s", bad);
  const char *badline[] = {badset, NULL};
  e = train_err(&d, badline, DF_ERR_FORMAT);
  cr_expect(strstr(e.where, "bad.jsonl:2"), "%s", e.where);
  fp = fopen(bad, "w");
  fputs("{\"input_ids\": [1, 2, 300], \"loss_mask\": [0, 1, 1]}\n", fp);
  fclose(fp);
  e = train_err(&d, badline, DF_ERR_FORMAT);
  cr_expect(strstr(e.msg, "[0, 264)"), "%s", e.msg);
  fp = fopen(bad, "w");
  fputs("{\"text\": \"hello\"}\n", fp);
  fclose(fp);
  e = train_err(&d, badline, DF_ERR_FORMAT);
  cr_expect(strstr(e.where, "bad.jsonl:1") && strstr(e.hint, "conversations"), "%s | %s", e.where, e.hint);

  // conversations need transformers: an interpreter without it is named with the key
  fp = fopen(bad, "w");
  fputs("{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}, {\"from\": \"gpt\", \"value\": \"b\"}]}\n", fp);
  fclose(fp);
  setenv("DRAFTFORGE_PYTHON", "/bin/false", 1);
  e = train_err(&d, badline, DF_ERR_UNSUPPORTED);
  unsetenv("DRAFTFORGE_PYTHON");
  cr_expect_str_eq(e.where, "data.train_data_path");
  cr_expect(strstr(e.msg, "transformers"), "%s", e.msg);

  // the last target layer cannot be captured online either
  json_t *c = df_test_config_doc("tiny-target-dflash.json");
  df_test_json_set(c, "dflash_config.target_layer_ids", df_test_json("[1, 3]"));
  cr_assert_eq(json_dump_file(c, d.cfg, 0), 0);
  json_decref(c);
  const char *last_layer[] = {td, NULL};
  e = train_err(&d, last_layer, DF_ERR_INVALID);
  cr_expect_str_eq(e.where, "dflash_config.target_layer_ids");

  // no output directory was made for any refused run's checkpoints
  char ck[400];
  snprintf(ck, sizeof ck, "%s/bad/checkpoints", d.root);
  struct stat sb;
  cr_expect_neq(stat(ck, &sb), 0);
  odir_close(&d);
}

// ---- the bundled recipe ----------------------------------------------------------------------------------------

Test(online, bundled_online_demo_recipe_loads) {
  const df_recipe *r = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_recipe_load(DF_SOURCE_DIR "/recipes/demo-dflash-online.yaml", NULL, &r, &err), &err);
  cr_expect_null(r->data.hidden_states_path);
  cr_assert_not_null(r->data.train_data_path);
  cr_expect_str_eq(r->data.train_data_path, DF_SOURCE_DIR "/recipes/tiny-target/conversations/train.jsonl");
  cr_assert_not_null(r->data.eval_data_path);
  cr_expect_str_eq(r->data.eval_data_path, DF_SOURCE_DIR "/recipes/tiny-target/conversations/eval.jsonl");
  cr_expect_str_eq(r->data.chat_template, "chatml");
  cr_expect_eq(r->data.online_feature_dtype, DF_BF16);
  df_recipe_free(r);
}
