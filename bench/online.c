// Online against offline training on the bundled tiny target (recipes/demo-dflash.yaml, block 8): the same token
// data trained (a) offline — `draftforge capture` into bf16 shards, then df_train on them — and (b) online —
// df_train with data.train_data_path, the target prefilling each batch; by default the target and the step take
// turns on the caller's thread, and once more overlapped (df_train_options.online_overlap: the target on the
// feed's reader thread while the step runs). Prints the capture's time and tokens/s, each training run's steps/s
// and tokens/s (step time includes the wait for data, which online holds the target's forward), the data wait
// share, the target's own time and tokens/s, and the online/offline steps/s ratios, all measured in this one run.
//
// The data: --data TOKENS.jsonl (tools/run/prepare_data.py's format), else the first --samples conversations of
// recipes/tiny-target/conversations/train.jsonl turned into ChatML token ids with the byte tokenizer (the
// assistant turn through its end marker supervised), as tools/run/prepare_data.py marks them for this target.
//
//   bench_online [--steps N] [--threads N] [--samples N] [--data TOKENS.jsonl] [--repo DIR]
#define _GNU_SOURCE // nftw
#include <ftw.h>
#include <jansson.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "modeling/target/byte_tokenizer.h"
#include "train/data/capture.h"
#include "train/trainer/trainer.h"

typedef struct {
  int steps, threads, samples;
  const char *data, *repo;
} bench_args;

typedef struct {
  int steps;
  double step_s, wait_s, wall_s, target_s;
  int64_t tokens, target_tokens;
} run_stats;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

// One conversation as a token line: every turn in the target's ChatML template, assistant turns supervised.
static void write_conversation(FILE *out, json_t *turns) {
  static char text[1 << 16];
  static int32_t ids[1 << 16];
  static uint8_t mask[1 << 16];
  size_t n = 0;
  for (size_t i = 0; i < json_array_size(turns); i++) {
    json_t *t = json_array_get(turns, i);
    const char *from = json_string_value(json_object_get(t, "from")),
               *v = json_string_value(json_object_get(t, "value"));
    if (!from || !v) continue;
    const bool gpt = !strcmp(from, "gpt");
    int head = snprintf(text, sizeof text, "<|im_start|>%s\n", gpt ? "assistant" : "user");
    int all = snprintf(text + head, sizeof text - (size_t)head, "%s<|im_end|>\n", v) + head;
    if (all >= (int)sizeof text || n + (size_t)all > sizeof ids / sizeof *ids) break;
    // supervised: from the end of the assistant header through its <|im_end|> (the newline after it is not)
    size_t nh = df_byte_tok_encode(text, (size_t)head, ids + n);
    size_t ne = df_byte_tok_encode(text, (size_t)all - 1, ids + n);
    size_t nt = df_byte_tok_encode(text, (size_t)all, ids + n);
    for (size_t k = 0; k < nt; k++) mask[n + k] = gpt && k >= nh && k < ne;
    n += nt;
  }
  fprintf(out, "{\"input_ids\": [");
  for (size_t k = 0; k < n; k++) fprintf(out, "%s%d", k ? ", " : "", ids[k]);
  fprintf(out, "], \"loss_mask\": [");
  for (size_t k = 0; k < n; k++) fprintf(out, "%s%d", k ? ", " : "", mask[k]);
  fprintf(out, "]}\n");
}

static df_status make_tokens(const bench_args *a, const char *out_path, df_error *err) {
  char conv[4096];
  snprintf(conv, sizeof conv, "%s/recipes/tiny-target/conversations/train.jsonl", a->repo);
  FILE *in = fopen(conv, "r"), *out = fopen(out_path, "w");
  df_status st = in && out ? DF_OK
                           : DF_FAIL(err, DF_ERR_IO, in ? out_path : conv,
                                     "run from the repository root "
                                     "or pass --repo",
                                     "cannot open %s", in ? out_path : conv);
  char line[1 << 16];
  for (int i = 0; st == DF_OK && i < a->samples && fgets(line, sizeof line, in); i++) {
    json_t *o = json_loads(line, 0, NULL);
    if (o) write_conversation(out, json_object_get(o, "conversations"));
    json_decref(o);
  }
  if (in) fclose(in);
  if (out) fclose(out);
  return st;
}

// Sums step_time_s, data_wait_s and tokens over the step lines of metrics.jsonl.
static bool read_metrics(const char *dir, run_stats *r) {
  char path[4400], line[8192];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *fp = fopen(path, "r");
  if (!fp) return false;
  while (fgets(line, sizeof line, fp)) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && json_object_get(o, "tokens")) {
      r->steps++;
      r->step_s += json_number_value(json_object_get(o, "step_time_s"));
      r->wait_s += json_number_value(json_object_get(o, "data_wait_s"));
      r->tokens += json_integer_value(json_object_get(o, "tokens"));
    }
    json_decref(o);
  }
  fclose(fp);
  return r->steps > 0;
}

// df_train of recipes/demo-dflash.yaml for --steps steps on `data` (a data.* assignment), no eval, no checkpoints.
static df_status train(const bench_args *a, const char *root, const char *name, const char *data, bool overlap,
                       run_stats *r, df_error *err) {
  char recipe[4096], out[4200], steps[64];
  snprintf(recipe, sizeof recipe, "%s/recipes/demo-dflash.yaml", a->repo);
  snprintf(out, sizeof out, "output_dir=%s/%s", root, name);
  snprintf(steps, sizeof steps, "training.max_steps=%d", a->steps);
  // the recipe names captured shards; an online run replaces them by data.train_data_path
  const bool online = strncmp(data, "data.train_data_path=", 21) == 0;
  const char *sets[] = {out,
                        steps,
                        data,
                        "data.eval_hidden_states_path=\"\"",
                        "training.log_interval=1",
                        "training.eval_interval=0",
                        "training.save_interval=0",
                        "training.num_epochs=1000",
                        online ? "data.hidden_states_path=\"\"" : NULL};
  df_train_options o = {.recipe_path = recipe,
                        .overrides = sets,
                        .n_overrides = online ? 9 : 8,
                        .threads = a->threads,
                        .online_overlap = overlap};
  df_train_summary sum;
  memset(r, 0, sizeof *r);
  double t0 = bench_now();
  df_status st = df_train(&o, &sum, err);
  r->wall_s = bench_now() - t0;
  r->target_s = sum.online_target_s, r->target_tokens = sum.online_tokens;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  if (st == DF_OK && !read_metrics(dir, r))
    st = DF_FAIL(err, DF_ERR_FORMAT, dir, NULL, "no step lines in metrics.jsonl");
  return st;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  *a = (bench_args){.steps = 40, .threads = 2, .samples = 200, .repo = "."};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      a->steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      a->threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--samples") && i + 1 < argc)
      a->samples = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--data") && i + 1 < argc)
      a->data = argv[++i];
    else if (!strcmp(argv[i], "--repo") && i + 1 < argc)
      a->repo = argv[++i];
    else
      return fprintf(stderr, "usage: %s [--steps N] [--threads N] [--samples N] [--data TOKENS.jsonl] [--repo DIR]\n",
                     argv[0]),
             2;
  }
  return a->steps < 1 || a->threads < 1 || a->samples < 1 ? 2 : 0;
}

static void print_row(const char *name, const run_stats *r) {
  printf("%-22s %6d %9.2f %10.0f %9.1f%% %8.1f\n", name, r->steps, r->steps / r->step_s, (double)r->tokens / r->step_s,
         100.0 * r->wait_s / r->step_s, r->wall_s);
}

static df_status bench(const bench_args *a, const char *root, df_error *err) {
  char tokens[4200], cap[4200], cfg[4200], target[4200], hs[4300], td[4300];
  if (a->data)
    snprintf(tokens, sizeof tokens, "%s", a->data);
  else {
    snprintf(tokens, sizeof tokens, "%s/train.jsonl", root);
    DF_TRY(make_tokens(a, tokens, err));
  }
  snprintf(cap, sizeof cap, "%s/capture", root);
  snprintf(cfg, sizeof cfg, "%s/configs/tiny-target-dflash.json", a->repo);
  snprintf(target, sizeof target, "%s/recipes/tiny-target", a->repo);
  omp_set_num_threads(a->threads); // as `draftforge capture --threads N`
  df_capture_options co = {.target_dir = target,
                           .data_path = tokens,
                           .draft_config_path = cfg,
                           .out_dir = cap,
                           .max_length = 256,
                           .samples_per_shard = 1000,
                           .dtype = DF_BF16,
                           .last_hidden = -1};
  df_capture_report rep;
  double t0 = bench_now();
  DF_TRY(df_capture_run(&co, &rep, err));
  const double cap_s = bench_now() - t0;
  snprintf(hs, sizeof hs, "data.hidden_states_path=%s", cap);
  snprintf(td, sizeof td, "data.train_data_path=%s", tokens);
  run_stats off, on, ovl;
  DF_TRY(train(a, root, "offline", hs, false, &off, err));
  DF_TRY(train(a, root, "online", td, false, &on, err));
  DF_TRY(train(a, root, "online_overlap", td, true, &ovl, err));
  printf("capture: %lld samples, %lld tokens in %.2f s (%.0f tokens/s), bf16 shards\n\n", (long long)rep.written,
         (long long)rep.tokens, cap_s, (double)rep.tokens / cap_s);
  printf("%-22s %6s %9s %10s %10s %8s\n", "training", "steps", "steps/s", "tokens/s", "data wait", "wall s");
  print_row("offline (bf16 shards)", &off);
  print_row("online", &on);
  print_row("online, overlapped", &ovl);
  printf("\nonline / offline steps/s: %.2f (overlapped: %.2f); the target's forward: %.2f s for %lld tokens (%.0f "
         "tokens/s) taking turns with the step, %.2f s (%.0f tokens/s) overlapped on the reader thread\n",
         (on.steps / on.step_s) / (off.steps / off.step_s), (ovl.steps / ovl.step_s) / (off.steps / off.step_s),
         on.target_s, (long long)on.target_tokens, (double)on.target_tokens / on.target_s, ovl.target_s,
         (double)ovl.target_tokens / ovl.target_s);
  printf("offline including the capture: %.2f steps/s over these %d steps\n", off.steps / (off.step_s + cap_s),
         off.steps);
  return DF_OK;
}

int main(int argc, char **argv) {
  bench_args a;
  if (parse_args(argc, argv, &a)) return 2;
  char root[] = "/tmp/df_bench_online_XXXXXX";
  if (!mkdtemp(root)) return perror("mkdtemp"), 1;
  printf("bench_online: recipes/demo-dflash.yaml on recipes/tiny-target, %d optimizer steps (batch 8), %d threads, "
         "prefetch on for the shards; step time includes the wait for data\n\n",
         a.steps, a.threads);
  df_error err = {0};
  df_status st = bench(&a, root, &err);
  nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (st != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  return 0;
}
