// The target forward on the CPU against transformers on the same threads in the same run: prefill tokens/s
// (one forward of --prefill tokens) and greedy decode tokens/s (--decode single-token steps on the KV cache), best
// of 3 runs each,
// for the bundled tiny target and a random Qwen3-0.6B-shaped checkpoint (made once by tools/bench_target_hf.py).
//   build/bench_target [--python /work/venv/bin/python] [--threads 2] [--prefill 128] [--decode 16] [--skip-0.6b]
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "modeling/target/target_model.h"

typedef struct {
  const char *python, *repo;
  int threads, prefill, decode;
  bool skip_big;
} args;

typedef struct {
  double prefill, decode; // tokens/s
} rates;

enum { REPS = 3 };

static df_status run_ours(const char *dir, const args *a, rates *r, df_error *err) {
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = a->threads};
  df_ctx *ctx = NULL;
  DF_TRY(df_ctx_create(&co, &ctx, err));
  df_target *t = NULL;
  df_target_cache *c = NULL;
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)a->prefill), next = 0;
  df_status st = df_target_load(dir, ctx, &t, err);
  if (st == DF_OK) st = df_target_cache_create(t, a->prefill + a->decode + 8, &c, err);
  if (st == DF_OK) {
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < a->prefill; i++)
      s ^= s << 13, s ^= s >> 7, s ^= s << 17, ids[i] = (int32_t)(s % (uint64_t)df_target_get_spec(t)->vocab);
    df_target_outputs o = {.logits_from = 7, .argmax = &next};
    st = df_target_forward(t, c, ids, 8, &o, err); // warm-up
  }
  // Best of REPS runs of each phase (a shared machine preempts single runs).
  double best_pre = 1e30, best_dec = 1e30;
  for (int rep = 0; rep < REPS && st == DF_OK; rep++) {
    st = df_target_cache_truncate(c, 0, err);
    double t0 = bench_now();
    df_target_outputs o = {.logits_from = a->prefill - 1, .argmax = &next};
    if (st == DF_OK) st = df_target_forward(t, c, ids, a->prefill, &o, err);
    double t1 = bench_now();
    for (int i = 0; i < a->decode && st == DF_OK; i++) {
      int32_t in = next;
      df_target_outputs d = {.logits_from = 0, .argmax = &next};
      st = df_target_forward(t, c, &in, 1, &d, err);
    }
    double t2 = bench_now();
    best_pre = t1 - t0 < best_pre ? t1 - t0 : best_pre;
    best_dec = t2 - t1 < best_dec ? t2 - t1 : best_dec;
  }
  r->prefill = a->prefill / best_pre;
  r->decode = a->decode / best_dec;
  free(ids);
  df_target_cache_free(c);
  df_target_free(t);
  df_ctx_destroy(ctx);
  return st;
}

static bool run_hf(const char *dir, const args *a, rates *r) {
  char cmd[4096], line[1024];
  snprintf(cmd, sizeof cmd,
           "%s %s/tools/bench_target_hf.py --model %s --threads %d --prefill %d --decode %d 2>/dev/null", a->python,
           a->repo, dir, a->threads, a->prefill, a->decode);
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  bool ok = false;
  while (fgets(line, sizeof line, p))
    if (sscanf(line, "{\"prefill_tok_s\": %lf, \"decode_tok_s\": %lf", &r->prefill, &r->decode) == 2) ok = true;
  pclose(p);
  return ok;
}

static void row(const char *name, const char *dir, const args *a) {
  rates ours = {0}, hf = {0};
  df_error err = {0};
  if (run_ours(dir, a, &ours, &err) != DF_OK) {
    df_error_print(&err);
    return;
  }
  bool have_hf = a->python && run_hf(dir, a, &hf);
  printf("%-14s %10.1f %10.1f %8s | %10.2f %10.2f %8s\n", name, ours.prefill, have_hf ? hf.prefill : 0.0,
         have_hf ? "" : "n/a", ours.decode, have_hf ? hf.decode : 0.0, have_hf ? "" : "n/a");
  if (have_hf)
    printf("%-14s %10s %10s %7.2fx | %10s %10s %7.2fx\n", "", "", "", ours.prefill / hf.prefill, "", "",
           ours.decode / hf.decode);
}

int main(int argc, char **argv) {
  args a = {.repo = DF_SOURCE_DIR_BENCH, .threads = 2, .prefill = 128, .decode = 16};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--python") && i + 1 < argc)
      a.python = argv[++i];
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      a.threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
      a.prefill = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
      a.decode = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--skip-0.6b"))
      a.skip_big = true;
    else
      return fprintf(stderr,
                     "usage: bench_target [--python PY] [--threads N] [--prefill N] [--decode N] [--skip-0.6b]\n"),
             2;
  }
  omp_set_num_threads(a.threads);
  printf("bench_target: fp32 CPU, %d threads, prefill %d tokens, decode %d tokens (transformers via %s)\n", a.threads,
         a.prefill, a.decode, a.python ? a.python : "(no --python: not run)");
  printf("%-14s %10s %10s %8s | %10s %10s %8s\n", "model", "prefill", "hf", "", "decode", "hf", "");
  printf("%-14s %10s %10s %8s | %10s %10s %8s\n", "", "tok/s", "tok/s", "ratio", "tok/s", "tok/s", "ratio");
  char tiny[4096];
  snprintf(tiny, sizeof tiny, "%s/recipes/tiny-target", a.repo);
  row("tiny-target", tiny, &a);
  if (!a.skip_big && a.python) {
    const char *big = "/tmp/draftforge-bench-qwen3-0.6b";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s/tools/bench_target_hf.py --make-qwen3-0.6b %s >/dev/null 2>&1", a.python, a.repo,
             big);
    if (system(cmd) == 0)
      row("qwen3-0.6b", big, &a);
    else
      fprintf(stderr, "bench_target: could not make the Qwen3-0.6B-shaped checkpoint with %s\n", a.python);
  }
  return 0;
}
