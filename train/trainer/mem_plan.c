// The memory plan (train/trainer/mem_plan.h): a trainer built by df_trainer_setup_plan on a measuring context, two
// optimizer steps of the largest micro-batch through the run's own step (the second fills the stage's other upload
// slot, as a run's second micro-batch does), an evaluation when the run evaluates, then the context's accounting.
#include "train/trainer/mem_plan.h"

#include <string.h>

#include "train/trainer/trainer_internal.h"

df_ctx_options df_mem_plan_default_ctx(const char **note) {
  if (df_cuda_built()) {
    if (note) *note = NULL;
    return (df_ctx_options){.device = DF_DEV_CUDA};
  }
  if (note)
    *note = "this build has no CUDA backend: planned for the CPU kernels' workspace (rebuild with nvcc on PATH "
            "to plan for the GPU)";
  return (df_ctx_options){.device = DF_DEV_CPU};
}

static void fill(const df_trainer *t, int64_t N, df_mem_plan *out) {
  memset(out, 0, sizeof *out);
  out->mem = df_trainer_mem_stats(t);
  out->batch = t->plan->batch, out->S = t->recipe->data.max_length, out->N = N, out->bs = t->draft->block_size;
  out->params = df_params_numel(t->table);
  out->world = t->plan->world, out->zero = t->optim.zero;
  out->online = t->online != NULL, out->eval = t->eval_src != NULL;
  snprintf(out->backend, sizeof out->backend, "%s", df_ctx_backend_name(t->ctx));
  out->bf16 = t->storage == DF_BF16;
}

// deployment.trainer: nnodes × nproc_per_node ranks.
static int world_of(const df_mem_plan_options *o, df_error *err, df_status *st) {
  *st = DF_OK;
  if (o->world_size > 0) return o->world_size;
  const df_recipe_options ro = {
      .overrides = o->overrides, .n_overrides = o->n_overrides, .inputs_may_be_missing = true};
  const df_recipe *rc = NULL;
  if ((*st = df_recipe_load(o->recipe_path, &ro, &rc, err)) != DF_OK) return 0;
  const int64_t w = rc->deployment.trainer.nnodes * rc->deployment.trainer.nproc_per_node;
  df_recipe_free(rc);
  return w > 0 ? (int)w : 1;
}

df_status df_mem_plan_run(const df_mem_plan_options *o, df_mem_plan *out, df_error *err) {
  memset(out, 0, sizeof *out);
  df_status st;
  const int world = world_of(o, err, &st);
  DF_TRY(st);
  df_ctx_options co = o->ctx;
  co.measure = true;
  const df_train_options to = {.recipe_path = o->recipe_path,
                               .overrides = o->overrides,
                               .n_overrides = o->n_overrides,
                               .threads = co.num_threads,
                               .no_prefetch = true,
                               .ctx_options = &co};
  df_trainer_plan plan = {.batch = o->batch_size, .world = world};
  if (plan.batch <= 0) { // the recipe's
    const df_recipe_options ro = {
        .overrides = o->overrides, .n_overrides = o->n_overrides, .inputs_may_be_missing = true};
    const df_recipe *rc = NULL;
    DF_TRY(df_recipe_load(o->recipe_path, &ro, &rc, err));
    plan.batch = rc->training.batch_size;
    df_recipe_free(rc);
  }
  df_trainer t;
  int64_t N = 0;
  st = df_trainer_setup_plan(&t, &to, &plan, err);
  for (int step = 0; st == DF_OK && step < 2; step++) st = df_trainer_plan_step(&t, step == 1, &N, err);
  if (st == DF_OK) fill(&t, N, out);
  df_trainer_teardown(&t);
  return st;
}

// The search's state: lo fits, hi does not (0: none known yet).
typedef struct {
  df_mem_plan_options q;
  int64_t bytes, lo, hi;
  df_mem_plan *at_lo, *at_hi;
} search;

static df_status probe(search *s, int64_t b, df_error *err) {
  df_mem_plan p;
  s->q.batch_size = b;
  DF_TRY(df_mem_plan_run(&s->q, &p, err));
  if (p.mem.device.peak <= s->bytes)
    s->lo = b, *s->at_lo = p;
  else
    s->hi = b, *s->at_hi = p;
  return DF_OK;
}

// A plan costs about its batch (the upload is staged in real host memory), so the search starts where the plans of
// batches 1 and 2 say the peak crosses (it grows about linearly: a sample's activations and upload), walks out from
// there in doubling steps until the boundary is bracketed, then bisects.
df_status df_mem_plan_fit(const df_mem_plan_options *o, int64_t device_bytes, int64_t max_batch, int64_t *best,
                          df_mem_plan *at_best, df_mem_plan *over, df_error *err) {
  *best = 0;
  memset(at_best, 0, sizeof *at_best), memset(over, 0, sizeof *over);
  search s = {.q = *o, .bytes = device_bytes, .at_lo = at_best, .at_hi = over};
  DF_TRY(probe(&s, 1, err));
  const int64_t peak1 = at_best->mem.device.peak;
  if (!s.hi && max_batch >= 2) DF_TRY(probe(&s, 2, err));
  if (!s.hi && max_batch > 2) {
    const int64_t per_sample = at_best->mem.device.peak - peak1;
    const int64_t guess = per_sample > 0 ? 2 + (device_bytes - at_best->mem.device.peak) / per_sample : max_batch;
    DF_TRY(probe(&s, guess < 3 ? 3 : guess > max_batch ? max_batch : guess, err));
  }
  for (int64_t step = 1; !s.hi && s.lo < max_batch; step *= 2) // up until one does not fit
    DF_TRY(probe(&s, s.lo + step < max_batch ? s.lo + step : max_batch, err));
  for (int64_t step = 1; s.hi - s.lo > 1; step *= 2) { // down until one fits
    const int64_t was = s.lo;
    DF_TRY(probe(&s, s.hi - step > s.lo ? s.hi - step : s.lo + 1, err));
    if (s.lo != was) break;
  }
  while (s.hi && s.hi - s.lo > 1) DF_TRY(probe(&s, s.lo + (s.hi - s.lo) / 2, err));
  *best = s.lo;
  return DF_OK;
}

// ---- the table ---------------------------------------------------------------------------------------------------

const char *df_mem_bytes_text(int64_t bytes, char *buf, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
  if (u == 0)
    snprintf(buf, n, "%lld B", (long long)bytes);
  else
    snprintf(buf, n, "%.2f %s", v, units[u]);
  return buf;
}

// What each category holds, for the table's readers.
static const char *const WHAT[DF_MEM_TAGS] = {
    [DF_MEM_OTHER] = "RoPE tables, small buffers",
    [DF_MEM_WEIGHTS] = "draft parameters the forward reads (fp32: also the masters)",
    [DF_MEM_GRADS] = "parameter gradients, fp32",
    [DF_MEM_MASTERS] = "fp32 masters of bf16 weights (0 for fp32 storage)",
    [DF_MEM_OPTIMIZER] = "AdamW exp_avg, exp_avg_sq (fp32) + element mask (1 B)",
    [DF_MEM_ACTIVATIONS] = "the model's arena: what the backward keeps + scratch",
    [DF_MEM_STAGE] = "2 upload slots (batch features, ids) + step scratch",
    [DF_MEM_WORKSPACE] = "op workspace: LM-head chunk logits, attention, norms",
    [DF_MEM_STATS] = "metric sums + {norm, coef, ok}, f64",
    [DF_MEM_FFN_STATE] = "the FFN kind's state (MoE statistics, stashes)",
    [DF_MEM_FROZEN] = "target embed_tokens + lm_head, draft's dtype (EAGLE family: + vocab rows)",
    [DF_MEM_TARGET_WEIGHTS] = "online target's weights, fp32",
    [DF_MEM_KV_CACHE] = "online target's KV cache (data.max_length)",
    [DF_MEM_TARGET_ACTIVATIONS] = "online target's prefill scratch + output rows"};

static void print_header(const df_mem_plan *p, FILE *fp) {
  fprintf(fp, "memory plan: %s backend, micro-batch %lld x %lld tokens, ", p->backend, (long long)p->batch,
          (long long)p->S);
  if (p->bs > 0)
    fprintf(fp, "%lld anchors x %lld (%lld block rows)", (long long)p->N, (long long)p->bs,
            (long long)(p->batch * p->N * p->bs));
  else // an EAGLE-family draft: N is the training-time-test length (EAGLE-3) or the depths (P-EAGLE)
    fprintf(fp, "%lld training-time-test steps (P-EAGLE: depths)", (long long)p->N);
  fprintf(fp, ", %d rank%s%s\n", p->world, p->world > 1 ? "s" : "",
          p->world > 1 ? (p->zero ? " (ZeRO-1: rank 0's moment shard)" : " (replicated AdamW)") : "");
  fprintf(fp, "  draft %lld parameters, %s; %s%s\n", (long long)p->params,
          p->bf16 ? "bf16 storage with fp32 masters" : "fp32 storage",
          p->online ? "online target (weights, KV cache, prefill) on the same device" : "offline data",
          p->eval ? "; one evaluation included" : "");
}

void df_mem_plan_print(const df_mem_plan *p, FILE *fp) {
  char a[32], b[32];
  print_header(p, fp);
  fprintf(fp, "  %-19s %12s %12s  %s\n", "category", "at peak", "own peak", "what");
  for (int i = 1; i <= DF_MEM_TAGS; i++) {
    const int tag = i % DF_MEM_TAGS; // "other" last
    const df_mem_count *c = &p->mem.tag[tag];
    if (!c->peak && tag != DF_MEM_MASTERS) continue;
    fprintf(fp, "  %-19s %12s %12s  %s\n", df_mem_tag_name((df_mem_tag)tag),
            df_mem_bytes_text(p->mem.at_peak[tag], a, sizeof a), df_mem_bytes_text(c->peak, b, sizeof b), WHAT[tag]);
  }
  fprintf(fp, "  %-19s %12s %12s  (%lld bytes)\n", "device peak", df_mem_bytes_text(p->mem.device.peak, a, sizeof a),
          "", (long long)p->mem.device.peak);
  fprintf(fp, "  %-19s %12s %12s  page-locked staging of the uploads and the stats read (host memory)\n", "pinned host",
          df_mem_bytes_text(p->mem.host.peak, a, sizeof a), "");
}
