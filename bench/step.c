// One DFlash micro-step (anchors, block embedding, draft forward, chunked objective, backward) on the CPU at two
// shapes, on synthetic data built in memory, against PyTorch eager float32 doing the same math
// (bench/torch_step.py, run as a child in this process's environment and thread count). The two are timed in
// alternating rounds and the medians compared; CPU seconds per step are printed beside wall seconds because the
// machine may be shared.
//
//   bench_step [--shape small|large|all] [--threads N] [--reps N] [--rounds N] [--repo DIR]
//              [--python PATH] [--attn eager|sdpa] [--no-reference]
#define _GNU_SOURCE // fdopen, kill
#include "train/step/step.h"

#include <cblas.h>
#include <omp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_util.h"
#if __has_include("kernels/cpu/gemm.h") // absent before the CPU GEMM (a "before" build of this file)
#include "kernels/cpu/gemm.h"
#define DF_BENCH_GEMM df_cpu_sgemm_describe()
#else
#define DF_BENCH_GEMM "OpenBLAS sgemm"
#endif

enum { BS = 16, B = 1, MAX_SAMPLES = 256 };

// Keep in step with SHAPES in bench/torch_step.py.
typedef struct {
  const char *name;
  int H, layers, heads, kv_heads, head_dim, inter, K, V, S, anchors;
} step_shape;

static const step_shape SHAPES[] = {
    {"small", 512, 2, 8, 2, 64, 1536, 3, 16000, 512, 32},
    {"large", 1024, 2, 8, 2, 128, 3072, 3, 32000, 1024, 64},
};
enum { NSHAPES = sizeof SHAPES / sizeof SHAPES[0] };

typedef struct {
  int threads, reps, rounds;
  const char *repo, *python, *attn, *shape;
  bool reference;
} bench_args;

typedef struct {
  const step_shape *sh;
  df_ctx *ctx;
  const df_draft_config *cfg;
  df_draft_model *model;
  float *embed, *head;
  df_batch batch;
  df_dflash_sampler sampler;
  df_strategy_run *run; // the DFlash strategy on this model
} step_state;

static df_status run_once(step_state *s, df_error *err) {
  df_step_result m;
  df_status st = df_step_micro(s->run, &s->batch, &s->sampler, &m, err);
  if (st == DF_OK) df_step_result_free(&m);
  return st;
}

static void config_json(const step_shape *sh, char *buf, size_t n) {
  snprintf(buf, n,
           "{\"architectures\": [\"DFlashDraftModel\"], \"model_type\": \"qwen3\", \"block_size\": %d,"
           " \"dflash_config\": {\"mask_token_id\": %d, \"target_layer_ids\": [1, 2, 3]},"
           " \"num_target_layers\": 8, \"num_hidden_layers\": %d, \"layer_types\": [\"full_attention\", "
           "\"full_attention\"], \"use_sliding_window\": false, \"sliding_window\": null, \"hidden_size\": %d,"
           " \"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
           " \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, \"rope_scaling\": null,"
           " \"max_position_embeddings\": 40960, \"vocab_size\": %d, \"attention_bias\": false,"
           " \"tie_word_embeddings\": false, \"initializer_range\": 0.02}",
           BS, sh->V - 1, sh->layers, sh->H, sh->inter, sh->heads, sh->kv_heads, sh->head_dim, sh->V);
}

// Random ids, every token supervised, random target features.
static void make_batch(const step_shape *sh, df_batch *b) {
  const int S = sh->S;
  b->B = B, b->S = S, b->width = (int64_t)sh->K * sh->H;
  b->index = calloc(B, sizeof *b->index);
  b->length = calloc(B, sizeof *b->length);
  b->input_ids = malloc(sizeof(int32_t) * B * S);
  b->loss_mask = malloc((size_t)B * S);
  b->hidden = bench_alloc((int64_t)B * S * b->width);
  float *u = bench_alloc(B * S);
  bench_fill(u, B * S, 3, 0.0f, (float)(sh->V - 1));
  for (int i = 0; i < B * S; i++) b->input_ids[i] = (int32_t)u[i], b->loss_mask[i] = 1;
  for (int i = 0; i < B; i++) b->length[i] = S;
  free(u);
  bench_fill(b->hidden, (int64_t)B * S * b->width, 4, -1.0f, 1.0f);
}

static df_status setup(step_state *s, const step_shape *sh, int threads, df_error *err) {
  char json[2048];
  config_json(sh, json, sizeof json);
  s->sh = sh;
  df_ctx_options co = {.device = DF_DEV_CPU, .num_threads = threads};
  DF_TRY(df_ctx_create(&co, &s->ctx, err));
  DF_TRY(df_draft_config_from_json(json, strlen(json), "bench-draft", &s->cfg, err));
  DF_TRY(df_draft_model_create(s->cfg, s->ctx, &s->model, err));
  DF_TRY(df_draft_model_init(s->model, 42, err));
  const int64_t vh = (int64_t)sh->V * sh->H;
  s->embed = bench_alloc(vh), s->head = bench_alloc(vh);
  bench_fill(s->embed, vh, 1, -0.035f, 0.035f); // ≈ N(0, 0.02) in scale
  bench_fill(s->head, vh, 2, -0.035f, 0.035f);
  make_batch(sh, &s->batch);
  df_dflash_sampler_init(&s->sampler, 42);
  const df_frozen fz = {s->embed, s->head, sh->V, sh->H, DF_F32};
  const df_step_settings set = {
      .num_anchors = sh->anchors, .loss_decay_gamma = 7.0, .mask_token_id = sh->V - 1, .chunk_blocks = 128};
  return df_step_open(s->ctx, s->model, s->cfg, &fz, &set, false, &s->run, err);
}

static void teardown(step_state *s) {
  df_strategy_close(s->run);
  df_batch_free(&s->batch);
  free(s->embed), free(s->head);
  df_draft_model_free(s->model);
  df_draft_config_free(s->cfg);
  df_ctx_destroy(s->ctx);
}

// ---- the PyTorch side: a child that times N steps per request -------------------------------------------------

typedef struct {
  pid_t pid;
  FILE *to, *from;
  char banner[256]; // its `ready ...` line
} torch_child;

static bool child_start(const bench_args *a, const step_shape *sh, torch_child *c, char *why, size_t n) {
  char script[1024], threads[16];
  snprintf(script, sizeof script, "%s/bench/torch_step.py", a->repo);
  snprintf(threads, sizeof threads, "%d", a->threads);
  if (access(a->python, X_OK) != 0) return snprintf(why, n, "%s not found (pass --python)", a->python), false;
  if (access(script, R_OK) != 0) return snprintf(why, n, "%.400s not found (pass --repo)", script), false;
  int in[2], out[2];
  if (pipe(in) || pipe(out)) return snprintf(why, n, "pipe failed"), false;
  c->pid = fork();
  if (c->pid < 0) return snprintf(why, n, "fork failed"), false;
  if (c->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); // never outlive the bench
    dup2(in[0], 0), dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execl(a->python, a->python, script, "--shape", sh->name, "--threads", threads, "--attn", a->attn, "--serve",
          (char *)NULL);
    _exit(127);
  }
  close(in[0]), close(out[1]);
  c->to = fdopen(in[1], "w"), c->from = fdopen(out[0], "r");
  if (c->to && c->from && fgets(c->banner, sizeof c->banner, c->from) && !strncmp(c->banner, "ready", 5)) {
    c->banner[strcspn(c->banner, "\n")] = 0;
    return true;
  }
  snprintf(why, n, "%.100s %.300s did not start (run it with --shape %s to see why)", a->python, script, sh->name);
  return false;
}

// Asks for `reps` timed steps; appends wall and CPU seconds. False when the child failed.
static bool child_round(torch_child *c, int reps, double *wall, double *cpu, int *count) {
  fprintf(c->to, "%d\n", reps);
  fflush(c->to);
  char line[8192];
  if (!fgets(line, sizeof line, c->from) || strncmp(line, "times ", 6)) return false;
  char *p = line + 6;
  for (int i = 0; i < reps && *count < MAX_SAMPLES; i++) {
    char *end;
    double w = strtod(p, &end);
    if (end == p || *end != ':') return false;
    double u = strtod(end + 1, &p);
    wall[*count] = w, cpu[*count] = u, (*count)++;
  }
  return true;
}

static void child_stop(torch_child *c) {
  if (c->to) fprintf(c->to, "0\n"), fclose(c->to);
  if (c->from) fclose(c->from);
  if (c->pid > 0) {
    int status;
    if (waitpid(c->pid, &status, WNOHANG) == 0) { // give it a moment to leave, then end it
      usleep(200000);
      if (waitpid(c->pid, &status, WNOHANG) == 0) kill(c->pid, SIGTERM), waitpid(c->pid, &status, 0);
    }
  }
  *c = (torch_child){0};
}

// ---- timing ------------------------------------------------------------------------------------------------------

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *x, int n) {
  if (n == 0) return -1;
  qsort(x, (size_t)n, sizeof *x, bench_cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

typedef struct {
  double df_wall, df_cpu, pt_wall, pt_cpu; // medians, seconds per step; pt < 0 when not run
  int df_n, pt_n;
  int64_t act_bytes;
  char banner[256], why[512];
} shape_result;

// One shape: a warm-up each, then `rounds` rounds of `reps` draftforge steps followed by `reps` PyTorch steps.
static df_status bench_shape(const bench_args *a, const step_shape *sh, shape_result *r, df_error *err) {
  *r = (shape_result){.pt_wall = -1, .pt_cpu = -1};
  snprintf(r->why, sizeof r->why, "--no-reference");
  step_state s = {0};
  torch_child c = {0};
  double dw[MAX_SAMPLES], dc[MAX_SAMPLES], pw[MAX_SAMPLES], pc[MAX_SAMPLES];
  df_status st = setup(&s, sh, a->threads, err);
  bool torch = st == DF_OK && a->reference && child_start(a, sh, &c, r->why, sizeof r->why);
  if (torch) snprintf(r->banner, sizeof r->banner, "%s", c.banner + 6);
  if (st == DF_OK) st = run_once(&s, err); // warm-up: first-touch of the arena and scratch
  for (int round = 0; st == DF_OK && round < a->rounds; round++) {
    for (int i = 0; st == DF_OK && i < a->reps && r->df_n < MAX_SAMPLES; i++) {
      double w0 = bench_now(), c0 = cpu_now();
      st = run_once(&s, err);
      dw[r->df_n] = bench_now() - w0, dc[r->df_n++] = cpu_now() - c0;
    }
    if (st == DF_OK && torch && !child_round(&c, a->reps, pw, pc, &r->pt_n)) {
      snprintf(r->why, sizeof r->why, "the PyTorch child stopped answering");
      torch = false, r->pt_n = 0;
    }
  }
  r->act_bytes = df_draft_model_activation_bytes(s.model);
  child_stop(&c);
  teardown(&s);
  r->df_wall = median(dw, r->df_n), r->df_cpu = median(dc, r->df_n);
  if (r->pt_n > 0) r->pt_wall = median(pw, r->pt_n), r->pt_cpu = median(pc, r->pt_n);
  return st;
}

// ---- main --------------------------------------------------------------------------------------------------------

static int usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--shape small|large|all] [--threads N] [--reps N] [--rounds N] [--repo DIR] [--python PATH]"
          " [--attn eager|sdpa] [--no-reference]\n",
          prog);
  return 2;
}

static int parse_args(int argc, char **argv, bench_args *a) {
  *a = (bench_args){.threads = 2,
                    .reps = 3,
                    .rounds = 3,
                    .repo = ".",
                    .python = "/usr/bin/python3",
                    .attn = "eager",
                    .shape = "all",
                    .reference = true};
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "--no-reference")) {
      a->reference = false;
      continue;
    }
    if (!v) return usage(argv[0]);
    i++;
    if (!strcmp(o, "--threads"))
      a->threads = atoi(v);
    else if (!strcmp(o, "--reps"))
      a->reps = atoi(v);
    else if (!strcmp(o, "--rounds"))
      a->rounds = atoi(v);
    else if (!strcmp(o, "--repo"))
      a->repo = v;
    else if (!strcmp(o, "--python"))
      a->python = v;
    else if (!strcmp(o, "--attn"))
      a->attn = v;
    else if (!strcmp(o, "--shape"))
      a->shape = v;
    else
      return usage(argv[0]);
  }
  if (a->threads < 1 || a->reps < 1 || a->rounds < 1) return fprintf(stderr, "--threads, --reps, --rounds >= 1\n"), 2;
  if (strcmp(a->attn, "eager") && strcmp(a->attn, "sdpa")) return usage(argv[0]);
  bool known = !strcmp(a->shape, "all");
  for (int i = 0; i < NSHAPES; i++) known |= !strcmp(a->shape, SHAPES[i].name);
  return known ? 0 : usage(argv[0]);
}

static void print_header(const bench_args *a) {
  const char *core = getenv("OPENBLAS_CORETYPE");
  printf("DFlash micro-step, CPU fp32 (anchors + block embedding + forward + chunked CE + backward), B=%d, block %d\n",
         B, BS);
  printf("threads=%d; OpenBLAS %s, kernel %s (OPENBLAS_CORETYPE=%s); %d rounds x %d reps, medians\n", a->threads,
         openblas_get_config(), openblas_get_corename(), core ? core : "unset", a->rounds, a->reps);
  printf("GEMM: %s\n", DF_BENCH_GEMM);
  printf("PyTorch: %s bench/torch_step.py --attn %s\n\n", a->python, a->attn);
  printf("| shape | H / I / heads x hd / V / S / anchors | draftforge ms | PyTorch ms | speed-up | draftforge cpu-ms "
         "| PyTorch cpu-ms | activations MiB |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
}

static void print_row(const step_shape *sh, const shape_result *r) {
  printf("| %s | %d / %d / %d(%d) x %d / %d / %d / %d | %.1f |", sh->name, sh->H, sh->inter, sh->heads, sh->kv_heads,
         sh->head_dim, sh->V, sh->S, sh->anchors, 1e3 * r->df_wall);
  if (r->pt_wall > 0)
    printf(" %.1f | %.2fx | %.1f | %.1f |", 1e3 * r->pt_wall, r->pt_wall / r->df_wall, 1e3 * r->df_cpu,
           1e3 * r->pt_cpu);
  else
    printf(" n/a | n/a | %.1f | n/a |", 1e3 * r->df_cpu);
  printf(" %.1f |\n", (double)r->act_bytes / 1048576.0);
}

int main(int argc, char **argv) {
  bench_args a;
  if (parse_args(argc, argv, &a)) return 2;
  omp_set_num_threads(a.threads); // OpenBLAS calls outside the kernels' own regions use it too
  shape_result res[NSHAPES];
  int done[NSHAPES], nd = 0;
  for (int i = 0; i < NSHAPES; i++) {
    if (strcmp(a.shape, "all") && strcmp(a.shape, SHAPES[i].name)) continue;
    df_error err = {0};
    if (bench_shape(&a, &SHAPES[i], &res[i], &err) != DF_OK) {
      df_error_print(&err);
      return 1;
    }
    done[nd++] = i;
  }
  print_header(&a);
  for (int j = 0; j < nd; j++) print_row(&SHAPES[done[j]], &res[done[j]]);
  for (int j = 0; j < nd; j++) {
    const shape_result *r = &res[done[j]];
    if (r->pt_n > 0)
      printf("\n%s: PyTorch %s; %d + %d timed steps", SHAPES[done[j]].name, r->banner, r->df_n, r->pt_n);
    else
      printf("\n%s: reference unavailable (%s)", SHAPES[done[j]].name, r->why);
  }
  printf("\n");
  return 0;
}
