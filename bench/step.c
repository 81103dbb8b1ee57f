// One DFlash micro-step (anchors, block embedding, draft forward, chunked objective, backward) on the CPU at a
// mid-size shape, on synthetic data built in memory; beside it, when available, the PyTorch reference's time
// for the same shape (tools/reference/dflash_step.py --bench on a case from make_dflash_bench_case.py).
//
//   bench_step [--threads N] [--reps N] [--repo DIR] [--no-reference]
#define _GNU_SOURCE // nftw
#include "train/step.h"

#include <ftw.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"

// The shape of tools/reference/make_dflash_bench_case.py (keep the two in step).
enum { H = 1024, LAYERS = 2, HEADS = 8, KV_HEADS = 2, HEAD_DIM = 128, INTER = 3072, K = 3, V = 32000, BS = 16 };
enum { B = 1, S = 1024, ANCHORS = 64 };

static const char *CONFIG_JSON =
    "{\"architectures\": [\"DFlashDraftModel\"], \"model_type\": \"qwen3\", \"block_size\": 16,"
    " \"dflash_config\": {\"mask_token_id\": 31999, \"target_layer_ids\": [1, 2, 3]},"
    " \"num_target_layers\": 8, \"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\", \"full_attention\"],"
    " \"use_sliding_window\": false, \"sliding_window\": null, \"hidden_size\": 1024, \"intermediate_size\": 3072,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, \"rope_scaling\": null, \"max_position_embeddings\": 40960,"
    " \"vocab_size\": 32000, \"attention_bias\": false, \"tie_word_embeddings\": false, \"initializer_range\": 0.02}";

typedef struct {
  int threads, reps;
  const char *repo;
  bool reference;
} bench_args;

typedef struct {
  df_ctx *ctx;
  const df_draft_config *cfg;
  df_dflash_model *model;
  float *embed, *head;
  df_batch batch;
  df_dflash_sampler sampler;
  df_step_options opt;
} step_state;

static df_status run_once(void *p, df_error *err) {
  step_state *s = p;
  df_step_frozen fz = {s->embed, s->head, V, H};
  df_dflash_metrics m;
  df_status st = df_step_micro(s->ctx, s->model, s->cfg, &fz, &s->batch, &s->sampler, &s->opt, NULL, &m, err);
  if (st == DF_OK) df_dflash_metrics_free(&m);
  return st;
}

// Random ids, every token supervised, random target features: the same shape the reference case has.
static void make_batch(df_batch *b) {
  b->B = B, b->S = S, b->width = (int64_t)K * H;
  b->index = calloc(B, sizeof *b->index);
  b->length = calloc(B, sizeof *b->length);
  b->input_ids = malloc(sizeof(int32_t) * B * S);
  b->loss_mask = malloc((size_t)B * S);
  b->hidden = bench_alloc((int64_t)B * S * K * H);
  float *u = bench_alloc(B * S);
  bench_fill(u, B * S, 3, 0.0f, (float)(V - 1));
  for (int i = 0; i < B * S; i++) b->input_ids[i] = (int32_t)u[i], b->loss_mask[i] = 1;
  for (int i = 0; i < B; i++) b->length[i] = S;
  free(u);
  bench_fill(b->hidden, (int64_t)B * S * K * H, 4, -1.0f, 1.0f);
}

static df_status setup(step_state *s, int threads, df_error *err) {
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = threads};
  DF_TRY(df_ctx_create(&co, &s->ctx, err));
  DF_TRY(df_draft_config_from_json(CONFIG_JSON, strlen(CONFIG_JSON), "bench-draft", &s->cfg, err));
  DF_TRY(df_dflash_model_create(s->cfg, s->ctx, &s->model, err));
  DF_TRY(df_dflash_model_init(s->model, 42, err));
  s->embed = bench_alloc((int64_t)V * H), s->head = bench_alloc((int64_t)V * H);
  bench_fill(s->embed, (int64_t)V * H, 1, -0.035f, 0.035f); // ≈ N(0, 0.02) in scale
  bench_fill(s->head, (int64_t)V * H, 2, -0.035f, 0.035f);
  make_batch(&s->batch);
  df_dflash_sampler_init(&s->sampler, 42);
  s->opt = (df_step_options){.num_anchors = ANCHORS,
                             .loss_decay_gamma = 7.0,
                             .mask_token_id = V - 1,
                             .loss = {.type = DF_LOSS_DFLASH, .dpace_alpha = 0.5, .chunk_blocks = 128}};
  return DF_OK;
}

static void teardown(step_state *s) {
  df_batch_free(&s->batch);
  free(s->embed), free(s->head);
  df_dflash_model_free(s->model);
  df_draft_config_free(s->cfg);
  df_ctx_destroy(s->ctx);
}

// ---- the reference ---------------------------------------------------------------------------------------------

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

// Runs cmd and returns the value printed after `key=`; a negative value when it failed or printed none.
static double run_for_value(const char *cmd, const char *key) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char line[512];
  double v = -1;
  size_t klen = strlen(key);
  while (fgets(line, sizeof line, p))
    if (!strncmp(line, key, klen) && line[klen] == '=') v = atof(line + klen + 1);
  return pclose(p) == 0 ? v : -1;
}

static bool have_reference(const char *repo, char *why, size_t n) {
  char p[1024];
  snprintf(p, sizeof p, "%s/tools/reference/dflash_step.py", repo);
  if (access("/usr/bin/python3", X_OK) != 0) return snprintf(why, n, "/usr/bin/python3 not found"), false;
  if (access(p, R_OK) != 0) return snprintf(why, n, "%.400s not found (pass --repo)", p), false;
  snprintf(p, sizeof p, "%s/tools/reference/make_dflash_bench_case.py", repo);
  if (access(p, R_OK) != 0) return snprintf(why, n, "%.400s not found", p), false;
  return true;
}

// Writes the synthetic case under /tmp, times the reference on it, removes it. Negative: unavailable.
static double reference_seconds(const bench_args *a, char *why, size_t n) {
  if (!have_reference(a->repo, why, n)) return -1;
  char dir[] = "/tmp/df_bench_step_XXXXXX", cmd[2048];
  if (!mkdtemp(dir)) return snprintf(why, n, "mkdtemp failed"), -1;
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 '%s/tools/reference/make_dflash_bench_case.py' '%s' --seq %d --anchors %d --batch %d "
           ">/dev/null && /usr/bin/python3 '%s/tools/reference/dflash_step.py' '%s/recipe.yaml' --bench "
           "--threads %d --reps %d",
           a->repo, dir, S, ANCHORS, B, a->repo, dir, a->threads, a->reps);
  double v = run_for_value(cmd, "reference_step_seconds");
  nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (v < 0) snprintf(why, n, "the reference bench failed (run: %.200s)", cmd);
  return v;
}

// ---- main --------------------------------------------------------------------------------------------------------

static int parse_args(int argc, char **argv, bench_args *a) {
  *a = (bench_args){.threads = 2, .reps = 3, .repo = ".", .reference = true};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      a->threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      a->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repo") && i + 1 < argc)
      a->repo = argv[++i];
    else if (!strcmp(argv[i], "--no-reference"))
      a->reference = false;
    else
      return fprintf(stderr, "usage: %s [--threads N] [--reps N] [--repo DIR] [--no-reference]\n", argv[0]), 2;
  }
  if (a->threads < 1 || a->reps < 1) return fprintf(stderr, "--threads and --reps must be >= 1\n"), 2;
  return 0;
}

static void print_table(const bench_args *a, const bench_timing *t, int64_t act_bytes, double ref, const char *why) {
  printf("DFlash micro-step, CPU fp32 (anchors + block embedding + forward + chunked CE + backward)\n");
  printf("shape: H=%d, %d layers, %d/%d heads of %d, I=%d, K=%d, V=%d, B=%d, S=%d, %d anchors x %d; threads=%d; "
         "activations %.1f MiB\n\n",
         H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, K, V, B, S, ANCHORS, BS, a->threads,
         (double)act_bytes / 1048576.0);
  printf("| implementation          | median s | best s   | reps | block tokens/s | vs reference |\n");
  printf("|-------------------------|----------|----------|------|----------------|--------------|\n");
  double toks = (double)B * ANCHORS * BS / t->median_s;
  if (ref > 0)
    printf("| draftforge step         | %8.4f | %8.4f | %4d | %14.0f | %11.2fx |\n", t->median_s, t->best_s, t->reps,
           toks, ref / t->median_s);
  else
    printf("| draftforge step         | %8.4f | %8.4f | %4d | %14.0f |          n/a |\n", t->median_s, t->best_s,
           t->reps, toks);
  if (ref > 0)
    printf("| PyTorch reference (fp32)| %8.4f |        - | %4d | %14.0f |        1.00x |\n", ref, a->reps,
           (double)B * ANCHORS * BS / ref);
  else
    printf("\nreference: unavailable (%s)\n", why);
}

int main(int argc, char **argv) {
  bench_args a;
  if (parse_args(argc, argv, &a)) return 2;
  omp_set_num_threads(a.threads); // OpenBLAS calls outside the kernels' own regions use it too
  step_state s = {0};
  df_error err = {0};
  if (setup(&s, a.threads, &err) != DF_OK) {
    df_error_print(&err);
    teardown(&s);
    return 1;
  }
  bench_plan plan = {.warmup = 1, .min_reps = a.reps, .max_reps = a.reps, .budget_s = 0};
  bench_timing t = bench_time(run_once, &s, &plan, &err);
  int64_t act = df_dflash_model_activation_bytes(s.model);
  teardown(&s);
  if (t.st != DF_OK) {
    df_error_print(&err);
    return 1;
  }
  char why[512] = "--no-reference";
  double ref = a.reference ? reference_seconds(&a, why, sizeof why) : -1;
  print_table(&a, &t, act, ref, why);
  return 0;
}
