// One DFlash optimizer step through the code a training run executes — the draft model's forward and backward, the
// strategy's chunked objective (df_step_micro), the gradient norm with clipping and the fused AdamW over the flat
// buffer, as train/trainer/trainer.c queues them — on a CUDA (or CPU) context, in bf16 mixed precision and in fp32
// storage, on synthetic data built in memory. Where bench_gpu_step composes the same step from the CUDA launchers
// (a ceiling for the kernels), this measures the path a user's `draftforge train` takes.
//
// Reports per precision: median ms per optimizer step (one micro-batch, after one untimed warm-up step), block tokens
// per second, the tracked device peak (kernels/ops.h df_ctx_mem_stats: what `draftforge train --plan` predicts), and
// MFU. FLOPs are model FLOPs without recompute: every trainable GEMM 2·M·N·K forward and twice that backward (the fc
// projector has no dgrad: its input is data), the frozen LM head forward + dgrad, attention AFTER block sparsity (4·hd
// FLOPs per visible (query, key) pair per head forward, 8·hd backward). The anchors are sampled, so the visible pairs
// are counted for evenly spaced anchors (the sampled ones' mean position is the same in expectation). MFU is taken
// against 989.4 TFLOP/s, the H100/H200 SXM dense bf16 peak, for both precisions (fp32 storage still multiplies in
// TF32/bf16-class tensor cores only where cuBLASLt picks them; the fp32 row shows what that choice costs).
//
//   bench_device_step [--shape qwen3-8b|tiny] [--device cuda|cpu] [--dtype bf16|fp32|both] [--steps N] [--batch B]
//
// --shape tiny runs anywhere (the CUDA execution mode included) and checks the program, not the speed.
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "train/step/resources.h"
#include "train/step/step.h"

enum { BS = 16, MAX_STEPS = 64 };
#define PEAK_BF16_TFLOPS 989.4

typedef struct {
  const char *name;
  int H, layers, heads, kv_heads, head_dim, inter, K, V, S, anchors, target_layers;
} shape;

static const shape SHAPES[] = {
    // configs/qwen3-8b-dflash.json at SpecForge's offline recipe shape (S 3072, 512 anchors × 16)
    {"qwen3-8b", 4096, 5, 32, 8, 128, 12288, 5, 151936, 3072, 512, 36},
    {"tiny", 128, 2, 4, 2, 32, 384, 3, 2048, 256, 16, 8},
};

typedef struct {
  const shape *sh;
  int B;
  df_ctx *ctx;
  const df_draft_config *cfg;
  df_draft_model *model;
  df_run_resources res; // the frozen pieces, placed on the context as a run places them
  float *embed, *head;  // their host copies (what res.frozen points at on the CPU)
  df_batch batch;
  df_dflash_sampler sampler;
  df_strategy_run *run;
  int64_t n;
  float *m, *v;
  uint8_t *mask;
  double *norm; // {norm, coef, ok} on the device
} bench_state;

static void config_json(const shape *sh, char *buf, size_t n) {
  char ids[64] = "", layer_types[256] = "";
  for (int i = 0; i < sh->K; i++) {
    const size_t o = strlen(ids);
    snprintf(ids + o, sizeof ids - o, "%s%d", i ? ", " : "", 1 + i * (sh->target_layers - 2) / sh->K);
  }
  for (int i = 0; i < sh->layers; i++) {
    const size_t o = strlen(layer_types);
    snprintf(layer_types + o, sizeof layer_types - o, "%s\"full_attention\"", i ? ", " : "");
  }
  snprintf(buf, n,
           "{\"architectures\": [\"DFlashDraftModel\"], \"model_type\": \"qwen3\", \"block_size\": %d,"
           " \"dflash_config\": {\"mask_token_id\": %d, \"target_layer_ids\": [%s]},"
           " \"num_target_layers\": %d, \"num_hidden_layers\": %d, \"layer_types\": [%s],"
           " \"use_sliding_window\": false, \"sliding_window\": null, \"hidden_size\": %d,"
           " \"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
           " \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, \"rope_scaling\": null,"
           " \"max_position_embeddings\": 40960, \"vocab_size\": %d, \"attention_bias\": false,"
           " \"tie_word_embeddings\": false, \"initializer_range\": 0.02}",
           BS, sh->V - 1, ids, sh->target_layers, sh->layers, layer_types, sh->H, sh->inter, sh->heads, sh->kv_heads,
           sh->head_dim, sh->V);
}

// Random ids, every token supervised, random target features in [-1, 1) (timing on zeros flatters GEMMs).
static df_status make_batch(const shape *sh, int B, df_batch *b, df_error *err) {
  const int64_t S = sh->S, width = (int64_t)sh->K * sh->H;
  DF_TRY(df_batch_alloc(b, B, S, width, 0, err));
  float *u = bench_alloc(B * S);
  bench_fill(u, B * S, 3, 0.0f, (float)(sh->V - 1));
  for (int64_t i = 0; i < B * S; i++) b->input_ids[i] = (int32_t)u[i], b->loss_mask[i] = 1;
  for (int i = 0; i < B; i++) b->index[i] = i, b->length[i] = S;
  free(u);
  bench_fill(b->hidden, B * S * width, 4, -1.0f, 1.0f);
  return DF_OK;
}

// The trainer's element mask (df_params_optim_mask), uploaded once.
static df_status upload_mask(bench_state *s, df_error *err) {
  uint8_t *mask = malloc((size_t)s->n);
  if (!mask) return DF_FAIL(err, DF_ERR_NOMEM, "mask", NULL, "out of memory");
  df_params_optim_mask(df_draft_model_params(s->model), mask);
  df_status st = df_copy(s->ctx, s->mask, df_ctx_device(s->ctx), mask, DF_DEV_CPU, (size_t)s->n, err);
  free(mask);
  return st;
}

static df_status setup(bench_state *s, const shape *sh, int B, df_device dev, df_dtype dt, df_error *err) {
  char json[4096];
  config_json(sh, json, sizeof json);
  s->sh = sh, s->B = B;
  const df_ctx_options co = {.device = dev};
  DF_TRY(df_ctx_create(&co, &s->ctx, err));
  DF_TRY(df_draft_config_from_json(json, strlen(json), "bench-draft", &s->cfg, err));
  DF_TRY(df_draft_model_create_as(s->cfg, s->ctx, dt, &s->model, err));
  DF_TRY(df_draft_model_init(s->model, 42, err));
  const int64_t vh = (int64_t)sh->V * sh->H;
  s->embed = bench_alloc(vh), s->head = bench_alloc(vh);
  bench_fill(s->embed, vh, 1, -0.035f, 0.035f); // ≈ N(0, 0.02) in scale
  bench_fill(s->head, vh, 2, -0.035f, 0.035f);
  s->res.frozen = (df_frozen){s->embed, s->head, sh->V, sh->H, DF_F32};
  DF_TRY(df_run_resources_place_as(&s->res, s->ctx, dt, err));
  DF_TRY(make_batch(sh, B, &s->batch, err));
  df_dflash_sampler_init(&s->sampler, 42);
  const df_step_settings set = {
      .num_anchors = sh->anchors, .loss_decay_gamma = 7.0, .mask_token_id = sh->V - 1, .chunk_blocks = 128};
  DF_TRY(df_step_open(s->ctx, s->model, s->cfg, &s->res.frozen, &set, false, &s->run, err));
  s->n = df_params_numel(df_draft_model_params(s->model));
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_OPTIMIZER, sizeof(float) * (size_t)s->n, (void **)&s->m, err));
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_OPTIMIZER, sizeof(float) * (size_t)s->n, (void **)&s->v, err));
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_OPTIMIZER, (size_t)s->n, (void **)&s->mask, err));
  DF_TRY(df_buffer_alloc_as(s->ctx, DF_MEM_STATS, sizeof(double) * DF_NORM_STATS, (void **)&s->norm, err));
  df_tensor m = df_f32_on(dev, s->m, s->n), v = df_f32_on(dev, s->v, s->n);
  DF_TRY(df_fill(s->ctx, &m, 0.0, err));
  DF_TRY(df_fill(s->ctx, &v, 0.0, err));
  return upload_mask(s, err);
}

static void teardown(bench_state *s) {
  if (s->run) df_strategy_close(s->run);
  if (s->ctx) df_buffer_free(s->ctx, s->m), df_buffer_free(s->ctx, s->v), df_buffer_free(s->ctx, s->mask);
  if (s->ctx) df_buffer_free(s->ctx, s->norm);
  df_batch_free(&s->batch);
  df_draft_model_free(s->model);
  df_run_resources_free(&s->res); // the placed copies (the host ones are ours)
  free(s->embed), free(s->head);
  df_draft_config_free(s->cfg);
  df_ctx_destroy(s->ctx);
  memset(s, 0, sizeof *s);
}

// One optimizer step of one micro-batch, as the trainer queues it, ending in its one device→host read.
static df_status step(bench_state *s, int64_t t, double *loss, df_error *err) {
  df_step_result r;
  DF_TRY(df_step_micro(s->run, &s->batch, &s->sampler, &r, err)); // d(loss_num / loss_den): grad_scale 1 below
  *loss = r.loss;
  df_step_result_free(&r);
  const df_device dev = df_ctx_device(s->ctx);
  df_tensor g = df_f32_on(dev, df_draft_model_grads(s->model), s->n), mk = df_u8_on(dev, s->mask, s->n);
  df_tensor ns = df_f64_on(dev, s->norm, DF_NORM_STATS);
  const df_grad_norm_desc nd = {.grad_scale = 1.0f, .max_norm = 1.0};
  DF_TRY(df_grad_norm_clip(s->ctx, &nd, &g, &mk, NULL, &ns, err));
  df_adamw_fused_desc ad = {
      .hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f, .step = t},
      .grad_scale = 1.0f};
  df_tensor p = df_f32_on(dev, df_draft_model_weights(s->model), s->n), m = df_f32_on(dev, s->m, s->n);
  df_tensor v = df_f32_on(dev, s->v, s->n);
  void *p16 = df_draft_model_compute_params(s->model);
  df_tensor pc = df_view_on(df_draft_model_storage(s->model), dev, p16, s->n);
  DF_TRY(df_adamw_fused(s->ctx, &ad, &p, &g, &m, &v, &mk, &ns, p16 ? &pc : NULL, err));
  double host[DF_NORM_STATS];
  return df_copy(s->ctx, host, DF_DEV_CPU, s->norm, dev, sizeof host, err);
}

// Model FLOPs of one step (see the header).
static double step_flops(const shape *sh, int B, double *attn_out) {
  const double H = sh->H, QD = (double)sh->heads * sh->head_dim, KVD = (double)sh->kv_heads * sh->head_dim;
  const double Q = (double)B * sh->anchors * BS, KVn = (double)B * sh->S + Q, I = sh->inter;
  const double layer = 2 * Q * H * QD + 2 * 2 * KVn * H * KVD + 2 * Q * QD * H + 2 * Q * H * 2.0 * I + 2 * Q * I * H;
  const double gemm =
      3 * sh->layers * layer + 2 * (2 * (double)B * sh->S * sh->K * H * H) + 2 * (2 * Q * H * (double)sh->V);
  double pairs = 0; // visible (query, key) pairs of one head and sample
  for (int64_t n = 0; n < sh->anchors; n++) pairs += BS * (double)(1 + n * (sh->S - 1) / sh->anchors) + BS * (double)BS;
  const double attn = B * sh->layers * sh->heads * pairs * (4.0 * sh->head_dim + 8.0 * sh->head_dim);
  *attn_out = attn;
  return gemm + attn;
}

static int cmp(const void *a, const void *b) { return bench_cmp_double(a, b); }

static df_status bench_one(const shape *sh, int B, df_device dev, df_dtype dt, int steps, df_error *err) {
  bench_state s;
  memset(&s, 0, sizeof s);
  df_status st = setup(&s, sh, B, dev, dt, err);
  double ms[MAX_STEPS], loss0 = NAN, loss = NAN;
  for (int it = -1; st == DF_OK && it < steps; it++) { // it = −1: warm-up (module load, GEMM heuristics, arena)
    const double t0 = bench_now();
    st = step(&s, it + 2, &loss, err);
    if (it >= 0) ms[it] = 1e3 * (bench_now() - t0);
    if (it == -1) loss0 = loss;
  }
  if (st != DF_OK) {
    teardown(&s);
    return st;
  }
  const df_mem_stats mem = df_ctx_mem_stats(s.ctx);
  teardown(&s);
  qsort(ms, (size_t)steps, sizeof *ms, cmp);
  const double med = ms[steps / 2], Q = (double)B * sh->anchors * BS;
  double attn = 0;
  const double flops = step_flops(sh, B, &attn), mfu = 100 * flops / (med / 1e3) / (PEAK_BF16_TFLOPS * 1e12);
  printf("| %s | %.2f | %.0f | %.2f | %.2f GiB | %.1f%% | %.4f → %.4f |\n",
         dt == DF_BF16 ? "bf16 + fp32 masters" : "fp32", med, Q / (med / 1e3), flops / 1e12,
         (double)mem.device.peak / (double)(1u << 30), mfu, loss0, loss);
  printf("DEVICE_STEP_SUMMARY shape=%s dtype=%s batch=%d ms=%.2f tokens_per_s=%.0f peak_gib=%.2f mfu=%.1f\n", sh->name,
         dt == DF_BF16 ? "bf16" : "fp32", B, med, Q / (med / 1e3), (double)mem.device.peak / (double)(1u << 30), mfu);
  return DF_OK;
}

static int usage(const char *prog) {
  fprintf(stderr,
          "usage: %s [--shape qwen3-8b|tiny] [--device cuda|cpu] [--dtype bf16|fp32|both] [--steps N] [--batch B]\n",
          prog);
  return 2;
}

int main(int argc, char **argv) {
  const char *shape_name = "qwen3-8b", *device = "cuda", *dtype = "both";
  int steps = 3, B = 1;
  for (int i = 1; i < argc; i++) {
    if (i + 1 >= argc) return usage(argv[0]);
    if (!strcmp(argv[i], "--shape"))
      shape_name = argv[++i];
    else if (!strcmp(argv[i], "--device"))
      device = argv[++i];
    else if (!strcmp(argv[i], "--dtype"))
      dtype = argv[++i];
    else if (!strcmp(argv[i], "--steps"))
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch"))
      B = atoi(argv[++i]);
    else
      return usage(argv[0]);
  }
  const shape *sh = NULL;
  for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
    if (!strcmp(SHAPES[i].name, shape_name)) sh = &SHAPES[i];
  const bool cuda = !strcmp(device, "cuda");
  if (!sh || (!cuda && strcmp(device, "cpu")) || steps < 1 || steps > MAX_STEPS || B < 1) return usage(argv[0]);
  if (cuda && !df_cuda_available()) {
    printf("bench_device_step: no CUDA device visible (or no CUDA backend in this build); nothing measured\n");
    return 0;
  }
  const bool bf16 = strcmp(dtype, "fp32") != 0, fp32 = strcmp(dtype, "bf16") != 0;
  if (!cuda && bf16 && strcmp(dtype, "both")) {
    fprintf(stderr, "bench_device_step: the CPU backend computes in fp32 (--dtype fp32)\n");
    return 2;
  }
  printf("bench_device_step: DFlash %s draft (%d layers, H %d, I %d, %d/%d heads x %d, V %d, %d target layers), "
         "batch %d x S %d, %d anchors x %d, on %s; median of %d optimizer steps after one warm-up\n",
         sh->name, sh->layers, sh->H, sh->inter, sh->heads, sh->kv_heads, sh->head_dim, sh->V, sh->K, B, sh->S,
         sh->anchors, BS, device, steps);
  printf("| precision | ms/step | block tokens/s | model TFLOP/step | device peak (tracked) | MFU vs %.1f TFLOP/s | "
         "loss first → last |\n|---|---|---|---|---|---|---|\n",
         PEAK_BF16_TFLOPS);
  const df_dtype order[2] = {DF_BF16, DF_F32};
  const bool want[2] = {bf16 && cuda, fp32};
  int rc = 0;
  for (int i = 0; i < 2; i++) {
    if (!want[i]) continue;
    df_error err = {0};
    if (bench_one(sh, B, cuda ? DF_DEV_CUDA : DF_DEV_CPU, order[i], steps, &err) != DF_OK) {
      df_error_print(&err);
      rc = 1;
    }
  }
  return rc;
}
