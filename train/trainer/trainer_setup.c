// Building a training run: recipe (with --set overrides), configs, frozen target pieces, model, data feed, the
// horizon and schedule, the optimizer buffers, the contract; then a fresh start or a resume from a checkpoint.
#include <stdlib.h>
#include <string.h>

#include "base/fsutil.h"
#include "base/path.h"
#include "train/recipe/device.h"
#include "train/run/run_dir.h"
#include "train/trainer/trainer_internal.h"

// ---- resources ---------------------------------------------------------------------------------------------------

// The training source (train/data/online_data.h): captured shards of data.hidden_states_path, or online data of
// data.train_data_path; and, when the run evaluates, the eval source (data.eval_hidden_states_path or
// data.eval_data_path), opened here so a bad eval set fails before the first step. Online sources share one target.
static df_data_source_options train_source_options(df_trainer *t, bool need_last, const df_ctx_options *target_ctx) {
  const df_recipe *rc = t->recipe;
  const bool online = rc->data.train_data_path != NULL;
  return (df_data_source_options){.rc = rc,
                                  .path = online ? rc->data.train_data_path : rc->data.hidden_states_path,
                                  .key = online ? "data.train_data_path" : "data.hidden_states_path",
                                  .allow_hidden_states = !online,
                                  .allow_online = online,
                                  .cfg = t->draft,
                                  .need_last_hidden = need_last,
                                  .threads = t->opt->threads,
                                  .overlap = t->opt->online_overlap,
                                  .target_ctx = target_ctx,
                                  .log = t->log,
                                  .target = &t->online,
                                  .synthetic = t->plan ? 2 * t->plan->batch : 0}; // two batches: both upload slots
}

static df_ctx_options target_ctx_of(const df_trainer *t) {
  // An online target runs on the run's device (the exact context options when a test gave them).
  return t->opt->ctx_options ? *t->opt->ctx_options
                             : (df_ctx_options){.device = df_ctx_device(t->ctx), .num_threads = t->opt->threads};
}

static df_status open_sources(df_trainer *t, bool need_last, df_batch_source **train_src, df_error *err) {
  const df_recipe *rc = t->recipe;
  const df_ctx_options target_ctx = target_ctx_of(t);
  df_data_source_options so = train_source_options(t, need_last, &target_ctx);
  DF_TRY(df_data_source_open(&so, train_src, err));
  if (rc->training.eval_interval <= 0) return DF_OK;
  const bool online_eval = rc->data.eval_data_path != NULL;
  so.path = online_eval ? rc->data.eval_data_path : rc->data.eval_hidden_states_path;
  so.key = online_eval ? "data.eval_data_path" : "data.eval_hidden_states_path";
  so.allow_hidden_states = !online_eval, so.allow_online = online_eval;
  so.need_last_hidden = false; // eval checks what its objective reads (train/eval/evaluate.c)
  df_status st = df_data_source_open(&so, &t->eval_src, err);
  if (st != DF_OK) df_batch_source_close(*train_src), *train_src = NULL;
  return st;
}

static df_status load_resources(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  DF_TRY(t->plan ? df_run_resources_load_shapes(rc, &t->res, err) : df_run_resources_load(rc, &t->res, err));
  t->draft = t->res.draft;
  if (t->opt->ctx_options) // a caller-chosen backend (tests: the fake device)
    DF_TRY(df_ctx_create(t->opt->ctx_options, &t->ctx, err));
  else if (t->dp.comm && df_comm_device_buffers(t->dp.comm) && df_comm_device(t->dp.comm) >= 0)
    DF_TRY(df_device_open_on(DF_DEVICE_CUDA, df_comm_device(t->dp.comm), NULL, t->opt->threads, t->log, &t->ctx,
                             err)); // a GPU rank: its communicator's device
  else
    DF_TRY(df_device_open(t->opt->has_device ? t->opt->device : rc->training.device,
                          df_device_cpu_only_reason(t->draft), t->opt->threads, t->log, &t->ctx, err));
  t->storage = df_run_storage(rc, t->ctx, &t->storage_why);
  DF_TRY(df_run_resources_place_as(&t->res, t->ctx, t->storage, err));
  DF_TRY(df_draft_model_create_as(t->draft, t->ctx, t->storage, &t->model, err));
  t->table = df_draft_model_params(t->model);
  t->ffn = df_draft_model_ffn_set(t->model);
  t->values = df_recipe_strategy_values(rc);
  t->settings = df_step_settings_of(rc, t->res.mask_token_id, &t->values);
  DF_TRY(df_step_open(t->ctx, t->model, t->draft, &t->res.frozen, &t->settings, false, &t->strategy, err));
  // e.g. DSpark's L1 and confidence terms read the teacher from the target's final hidden state
  const bool need_last = t->strategy->table->needs_last_hidden(t->strategy);
  df_batch_source *train_src = NULL;
  DF_TRY(open_sources(t, need_last, &train_src, err));
  df_feed_options fo = {.path = train_src->label,
                        .source = train_src,
                        .batch_size = t->plan ? t->plan->batch : rc->training.batch_size,
                        .max_length = rc->data.max_length,
                        .seed = rc->training.seed,
                        .rank = t->dp.rank,
                        .world_size = t->dp.world,
                        .prefetch = !t->opt->no_prefetch,
                        .cfg = t->draft,
                        .need_last_hidden = need_last};
  return df_feed_open(&fo, &t->feed, err);
}

// ---- schedule, optimizer buffers, contract -----------------------------------------------------------------------

static df_status plan_schedule(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  df_train_plan plan = {.total_steps = rc->training.total_steps,
                        .max_steps = rc->training.max_steps,
                        .num_epochs = rc->training.num_epochs,
                        .batches_per_epoch = df_feed_batches_per_epoch(t->feed),
                        .accumulation_steps = rc->training.accumulation_steps};
  int64_t horizon;
  DF_TRY(df_train_horizon(&plan, &horizon, &t->stop_step, err));
  return df_lr_schedule_init(&t->sched, rc->training.lr_scheduler, rc->training.learning_rate,
                             rc->training.warmup_ratio, horizon, err);
}

// The element mask, built on the host and uploaded once. A memory plan skips it: nothing is uploaded there, and the
// host copy would cost a byte per parameter for nothing (20 GB for a 20B-parameter draft).
static df_status upload_mask(df_trainer *t, df_error *err) {
  const int64_t numel = df_params_numel(t->table);
  uint8_t *mask = malloc((size_t)numel); // padding and buffers stay 0: AdamW never touches them
  if (!mask) return DF_FAIL(err, DF_ERR_NOMEM, "optimizer", NULL, "out of memory for the parameter mask");
  df_params_optim_mask(t->table, mask);
  df_status st = df_copy(t->ctx, t->optim.mask, df_ctx_device(t->ctx), mask, DF_DEV_CPU, (size_t)numel, err);
  free(mask);
  return st;
}

// The AdamW moments (zero), the element mask and the stats block on the device; the stage for the micro-batches.
// ZeRO-1: the moments of this rank's shard only, and the stage they travel through at a checkpoint or resume.
static df_status alloc_optimizer(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  const int64_t numel = df_params_numel(t->table);
  const df_device dev = df_ctx_device(t->ctx);
  df_trainer_dp_zero_plan(t);
  const int64_t nm = t->optim.zero ? (t->optim.shard_len > 0 ? t->optim.shard_len : 1) : numel;
  DF_TRY(df_trainer_dp_alloc(t, err));
  DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_OPTIMIZER, sizeof(float) * (size_t)nm, (void **)&t->optim.exp_avg, err));
  DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_OPTIMIZER, sizeof(float) * (size_t)nm, (void **)&t->optim.exp_avg_sq, err));
  DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_OPTIMIZER, (size_t)numel, (void **)&t->optim.mask, err));
  df_tensor m = df_f32_on(dev, t->optim.exp_avg, nm), v = df_f32_on(dev, t->optim.exp_avg_sq, nm);
  DF_TRY(df_fill(t->ctx, &m, 0.0, err));
  DF_TRY(df_fill(t->ctx, &v, 0.0, err));
  if (!df_ctx_measuring(t->ctx)) DF_TRY(upload_mask(t, err));
  t->stats.nobj = t->strategy->table->stats_len(t->strategy);
  t->stats.n = t->stats.nobj + df_ffn_set_stats_elems(&t->ffn);
  const size_t sbytes = sizeof(double) * (size_t)(t->stats.n + DF_NORM_STATS);
  DF_TRY(df_buffer_alloc_as(t->ctx, DF_MEM_STATS, sbytes, &t->stats.buf, err));
  DF_TRY(df_host_alloc(t->ctx, sbytes, (void **)&t->stats.host, err));
  t->stats.win = df_f64_on(dev, t->stats.buf, t->stats.n);
  t->stats.obj = df_f64_on(dev, t->stats.buf, t->stats.nobj);
  t->stats.norm = df_f64_on(dev, (double *)t->stats.buf + t->stats.n, DF_NORM_STATS);
  t->optim.hp = (df_adamw_hparams){.beta1 = (float)rc->training.adam_beta1,
                                   .beta2 = (float)rc->training.adam_beta2,
                                   .eps = (float)rc->training.adam_eps,
                                   .weight_decay = (float)rc->training.weight_decay};
  t->optim.max_grad_norm = rc->training.max_grad_norm;
  return DF_OK;
}

static void fill_contract(df_trainer *t) {
  const df_recipe *rc = t->recipe;
  df_ckpt_contract *c = &t->contract;
  memset(c, 0, sizeof *c);
  snprintf(c->strategy, sizeof c->strategy, "%s", t->strategy->table->name);
  df_ckpt_config_hash(t->draft->json, c->draft_config_hash);
  snprintf(c->lr_scheduler, sizeof c->lr_scheduler, "%s",
           rc->training.lr_scheduler == DF_LR_COSINE ? "cosine" : "constant");
  snprintf(c->precision, sizeof c->precision, "%s", t->storage == DF_BF16 ? "bfloat16" : "float32");
  c->data_size = df_feed_num_samples(t->feed);
  c->batch_size = t->dp.world * rc->training.batch_size, c->accumulation_steps = rc->training.accumulation_steps;
  c->world_size = t->dp.world;
  c->block_size = t->draft->block_size, c->num_anchors = rc->training.num_anchors;
  c->max_length = rc->data.max_length, c->mask_token_id = t->settings.mask_token_id;
  c->seed = (int64_t)rc->training.seed, c->horizon = t->sched.horizon;
  c->loss_decay_gamma = rc->training.loss_decay_gamma;
  c->learning_rate = rc->training.learning_rate, c->warmup_ratio = rc->training.warmup_ratio;
  c->max_grad_norm = rc->training.max_grad_norm, c->weight_decay = rc->training.weight_decay;
  c->adam_beta1 = rc->training.adam_beta1, c->adam_beta2 = rc->training.adam_beta2, c->adam_eps = rc->training.adam_eps;
  // the strategy's own keys, each recorded by name (a key the recipe cannot answer is recorded as absent: "")
  const char *const *keys = t->strategy->table->keys;
  for (int i = 0; keys[i] && c->nkeys < DF_CKPT_MAX_STRATEGY_KEYS; i++) {
    df_ckpt_value *v = &c->keys[c->nkeys++];
    snprintf(v->key, sizeof v->key, "%s", keys[i]);
    const char *text = df_strategy_text(&t->values, keys[i], NULL);
    v->is_text = text != NULL || !t->values.number(t->values.self, keys[i], &v->number);
    if (v->is_text) snprintf(v->text, sizeof v->text, "%s", text ? text : "");
  }
}

// ---- outputs -------------------------------------------------------------------------------------------------

static df_status write_resolved(df_trainer *t, df_error *err) {
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (!mem) return DF_FAIL(err, DF_ERR_NOMEM, "recipe", NULL, "out of memory");
  df_status st = df_recipe_write_resolved(t->recipe, mem, err);
  fclose(mem);
  if (st != DF_OK) return free(text), st;
  t->rundir.recipe_yaml = text;
  char path[4200];
  snprintf(path, sizeof path, "%.4000s/recipe.resolved.yaml", t->recipe->output_dir);
  return df_write_file_atomic(path, text, len, "check the output directory", err);
}

// ---- fresh start or resume ---------------------------------------------------------------------------------

// The strategy's reading of the training data before the first step (EAGLE-3: the vocabulary mapping), through a
// source of its own: the feed's may be prefetching on its thread already.
static df_status prepare_strategy(df_trainer *t, df_error *err) {
  if (!t->strategy->table->prepare) return DF_OK;
  const df_ctx_options target_ctx = target_ctx_of(t);
  df_data_source_options so = train_source_options(t, false, &target_ctx);
  so.log = NULL;
  df_batch_source *src = NULL;
  DF_TRY(df_data_source_open(&so, &src, err));
  df_status st = df_batch_source_prepare_strategy(src, t->recipe->data.max_length, t->strategy,
                                                  t->recipe->model.vocab_mapping_path, t->dp.rank == 0, t->log, err);
  df_batch_source_close(src);
  return st;
}

// Only rank 0 looks at output_dir and opens metrics.jsonl: a refusal there ends the job on every rank.
static df_status fresh_start(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  int64_t *steps = NULL;
  int n = 0;
  if (t->dp.rank == 0) DF_TRY(df_ckpt_list(rc->output_dir, &steps, &n, err));
  free(steps);
  char shown[4096];
  df_path_shown(rc->output_dir, shown, sizeof shown);
  if (n > 0)
    return DF_FAIL(err, DF_ERR_INVALID, "output_dir",
                   "continue it with --resume <output_dir>, or choose another output_dir (--set output_dir=...)",
                   "%s already holds %d checkpoint(s) of an earlier run", shown, n);
  if (rc->model.draft_checkpoint_path) {
    df_path_shown(rc->model.draft_checkpoint_path, shown, sizeof shown);
    if (t->log) fprintf(t->log, "warm start: weights from %s\n", shown);
    // The FFN kind's buffers (MoE centering) are optional in a warm start (a serving export has none); absent ones
    // start from the init values.
    if (df_ffn_set_active(&t->ffn)) DF_TRY(df_draft_model_init(t->model, rc->training.seed, err));
    DF_TRY(df_draft_model_load_ex(t->model, rc->model.draft_checkpoint_path, true, err));
  } else {
    DF_TRY(df_draft_model_init(t->model, rc->training.seed, err));
    const df_target_pieces *tp = &t->res.pieces;
    if (rc->model.load_target_embedding) // P-EAGLE's own embedding starts as the target's
      DF_TRY(df_draft_model_init_from_target(t->model, tp->embed, tp->vocab, tp->hidden, err));
  }
  DF_TRY(prepare_strategy(t, err)); // after the weights: EAGLE-3's data-derived mapping replaces a warm start's
  df_dflash_sampler_init(&t->sampler, rc->training.seed);
  memset(&t->prog, 0, sizeof t->prog);
  t->prog.last_lr = 0.0;
  return t->dp.rank == 0 ? df_metrics_open(&t->rundir.metrics, rc->output_dir, 0, err) : DF_OK;
}

// state.h5 into the masters and moments (rank 0): read in place on a host-addressable device, else through host
// staging. ZeRO-1: the full moments go to zero_full (host), which df_trainer_dp_share_state hands out.
static df_status read_state(df_trainer *t, const char *dir, df_ckpt_contract *have, df_error *err) {
  float *w = df_draft_model_weights(t->model);
  const int64_t n = df_params_numel(t->table);
  const bool zero = t->optim.zero;
  if (df_ctx_host_addressable(t->ctx))
    return df_ckpt_read(dir, t->table, w, zero ? t->optim.zero_full : t->optim.exp_avg,
                        zero ? t->optim.zero_full + n : t->optim.exp_avg_sq, have, &t->prog, err);
  const size_t bytes = sizeof(float) * (size_t)n;
  float *host = malloc(zero ? bytes : 3 * bytes);
  if (!host) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory for %lld parameters", (long long)n);
  const df_device dev = df_ctx_device(t->ctx);
  float *m = zero ? t->optim.zero_full : host + n, *v = zero ? t->optim.zero_full + n : host + 2 * n;
  df_status st = df_ckpt_read(dir, t->table, host, m, v, have, &t->prog, err);
  if (st == DF_OK) st = df_copy(t->ctx, w, dev, host, DF_DEV_CPU, bytes, err);
  if (st == DF_OK && !zero) st = df_copy(t->ctx, t->optim.exp_avg, dev, m, DF_DEV_CPU, bytes, err);
  if (st == DF_OK && !zero) st = df_copy(t->ctx, t->optim.exp_avg_sq, dev, v, DF_DEV_CPU, bytes, err);
  free(host);
  return st;
}

// Rank 0 reads and checks the checkpoint and hands its state to the other ranks (no shared filesystem needed);
// a checkpoint it refuses ends the job on every rank.
static df_status resume(df_trainer *t, const char *dir, df_error *err) {
  const df_recipe *rc = t->recipe;
  const int64_t numel = df_params_numel(t->table);
  if (t->optim.zero && t->dp.rank == 0 && !(t->optim.zero_full = malloc(2 * sizeof(float) * (size_t)numel)))
    return DF_FAIL(err, DF_ERR_NOMEM, "resume", NULL, "out of memory for %lld moments", (long long)(2 * numel));
  if (t->dp.rank == 0) {
    df_ckpt_contract have;
    DF_TRY(read_state(t, dir, &have, err));
    DF_TRY(df_ckpt_check_contract(&t->contract, &have, dir, err));
  }
  if (t->dp.world > 1) DF_TRY(df_trainer_dp_share_state(t, err));
  free(t->optim.zero_full);
  t->optim.zero_full = NULL;
  DF_TRY(df_draft_model_sync_params(t->model, err)); // the restored masters into the forward's bf16 copy
  DF_TRY(df_feed_seek(t->feed, t->prog.epoch, t->prog.cursor, err));
  t->sampler.rng = t->prog.anchor_rng;
  snprintf(t->rundir.last_ckpt, sizeof t->rundir.last_ckpt, "%s",
           dir); // the run's newest checkpoint until it writes one
  t->rundir.last_saved_step = t->prog.step;
  if (t->log) {
    char shown[4096];
    df_path_shown(dir, shown, sizeof shown);
    fprintf(t->log, "resuming from %s: step %lld, epoch %lld, batch %lld\n", shown, (long long)t->prog.step,
            (long long)t->prog.epoch, (long long)t->prog.cursor);
    if (rc->model.draft_checkpoint_path)
      fprintf(t->log, "note: model.draft_checkpoint_path is not read on resume (the checkpoint has the weights)\n");
  }
  return t->dp.rank == 0 ? df_metrics_open(&t->rundir.metrics, rc->output_dir, t->prog.step, err) : DF_OK;
}

static void print_plan(const df_trainer *t) {
  if (!t->log) return;
  const df_recipe *rc = t->recipe;
  char from[4096], to[4096];
  df_path_shown(rc->path, from, sizeof from);
  df_path_shown(rc->output_dir, to, sizeof to);
  fprintf(t->log,
          "draftforge train: %s -> %s\n  draft %lld parameters (%d tensors); data %lld samples, %lld batches/epoch of "
          "%lld, accumulation %lld\n  schedule %s, lr %g, warmup %lld of %lld steps; stop at step %lld\n",
          from, to, (long long)df_params_param_numel(t->table), df_params_count(t->table),
          (long long)df_feed_num_samples(t->feed), (long long)df_feed_batches_per_epoch(t->feed),
          (long long)(t->dp.world * rc->training.batch_size), (long long)rc->training.accumulation_steps,
          rc->training.lr_scheduler == DF_LR_COSINE ? "cosine" : "constant", rc->training.learning_rate,
          (long long)t->sched.warmup, (long long)t->sched.horizon, (long long)t->stop_step);
  fprintf(t->log, "  device %s (%d CPU threads)\n", df_ctx_backend_name(t->ctx), df_ctx_num_threads(t->ctx));
  fprintf(t->log, "  precision %s (%s)\n",
          t->storage == DF_BF16 ? "bf16: bf16 weights and activations, fp32 masters, weight gradients and AdamW moments"
                                : "fp32",
          t->storage_why);
  if (t->dp.world > 1)
    fprintf(t->log, "  data parallel: %d ranks x batch %lld = global batch %lld; %s\n", t->dp.world,
            (long long)rc->training.batch_size, (long long)(t->dp.world * rc->training.batch_size),
            t->optim.zero ? "ZeRO-1 (AdamW moments and update sharded, training.fsdp_sharding)"
                          : "replicated AdamW (training.fsdp_sharding: NO_SHARD)");
}

df_status df_trainer_setup(df_trainer *t, const df_train_options *opt, df_error *err) {
  memset(t, 0, sizeof *t);
  t->opt = opt, t->log = opt->log;
  t->dp.comm = opt->comm, t->dp.rank = opt->comm ? df_comm_rank(opt->comm) : 0;
  t->dp.world = opt->comm ? df_comm_size(opt->comm) : 1;
  if (t->dp.rank != 0) t->log = NULL; // rank 0 speaks for the job
  t->rundir.last_saved_step = -1;
  df_run_plan_options po = {.recipe_path = opt->recipe_path,
                            .overrides = opt->overrides,
                            .n_overrides = opt->n_overrides,
                            .resume = opt->resume,
                            .overwrite = opt->overwrite,
                            .log = t->log};
  DF_TRY(df_run_plan_make(&po, &t->recipe, &t->rundir.plan, err)); // fresh or resume, and the recipe it runs with
  // Every rank has decided from the directory as it was before rank 0 (the only writer) touches it.
  if (t->dp.world > 1) DF_TRY(df_comm_barrier(t->dp.comm, err));
  if (!df_recipe_is_default(t->recipe, "training", "global_step")) // draftforge step's key; a run counts its own
    return DF_FAIL(err, DF_ERR_INVALID, "training.global_step",
                   "remove it: draftforge train counts its own steps (resume a run with --resume to continue it)",
                   "training.global_step is for draftforge step (one micro-step at a given schedule position)");
  DF_TRY(df_trainer_observe_prepare(t, err));
  DF_TRY(load_resources(t, err));
  DF_TRY(df_trainer_dp_check(t, err));
  DF_TRY(df_trainer_check_data(t, err)); // every data path now, not at the first eval
  DF_TRY(plan_schedule(t, err));
  DF_TRY(alloc_optimizer(t, err));
  fill_contract(t);
  if (t->dp.rank == 0) {
    DF_TRY(df_mkdirs(t->recipe->output_dir, "check output_dir and its permissions", err));
    DF_TRY(df_run_plan_apply(&t->rundir.plan, t->recipe, t->log, err)); // --overwrite
    char ckdir[4200];
    snprintf(ckdir, sizeof ckdir, "%.4000s/" DF_CKPT_DIR, t->recipe->output_dir);
    df_ckpt_remove_stale(ckdir, t->log);
  }
  DF_TRY(t->rundir.plan.resume ? resume(t, t->rundir.plan.from.ckpt, err) : fresh_start(t, err));
  if (t->dp.rank == 0) DF_TRY(write_resolved(t, err));
  if (t->dp.rank == 0) DF_TRY(df_trainer_observe_open(t, err));
  t->start_step = t->prog.step;
  print_plan(t);
  return DF_OK;
}

df_status df_trainer_setup_plan(df_trainer *t, const df_train_options *opt, const df_trainer_plan *plan,
                                df_error *err) {
  memset(t, 0, sizeof *t);
  t->opt = opt, t->log = opt->log, t->plan = plan;
  t->dp.world = 1;
  if (!opt->ctx_options || !opt->ctx_options->measure)
    return DF_FAIL(err, DF_ERR_INVALID, "memory plan", "plan on a measuring context (df_ctx_options.measure)",
                   "a memory plan would allocate real memory");
  const df_recipe_options ro = {
      .overrides = opt->overrides, .n_overrides = opt->n_overrides, .inputs_may_be_missing = true};
  DF_TRY(df_recipe_load(opt->recipe_path, &ro, &t->recipe, err)); // data.max_length > 0: the longest sample
  DF_TRY(load_resources(t, err));
  DF_TRY(plan_schedule(t, err));
  t->dp.world = plan->world; // rank 0's share of the optimizer (ZeRO-1 shards the moments); the steps are one rank's
  df_status st = alloc_optimizer(t, err);
  t->dp.world = 1;
  return st;
}

df_mem_stats df_trainer_mem_stats(const df_trainer *t) {
  df_mem_stats m = t->ctx ? df_ctx_mem_stats(t->ctx) : (df_mem_stats){0};
  if (t->online) {
    const df_mem_stats tm = df_ctx_mem_stats(df_online_target_ctx(t->online));
    df_mem_stats_add(&m, &tm);
  }
  return m;
}

void df_trainer_teardown(df_trainer *t) {
  free(t->win_samples);
  df_metrics_close(&t->rundir.metrics);
  df_trainer_observe_close(t); // after the close: the tracker forwards metrics.jsonl to its end
  df_feed_close(t->feed);
  df_batch_source_close(t->eval_src);
  df_online_target_free(t->online); // after every source on it
  df_strategy_close(t->strategy);
  if (t->ctx) {
    df_trainer_dp_free(t);
    df_buffer_free(t->ctx, t->optim.exp_avg), df_buffer_free(t->ctx, t->optim.exp_avg_sq),
        df_buffer_free(t->ctx, t->optim.mask);
    df_buffer_free(t->ctx, t->stats.buf), df_host_free(t->ctx, t->stats.host);
  }
  free(t->optim.zero_full);
  df_draft_model_free(t->model);
  df_run_resources_free(&t->res);
  df_ctx_destroy(t->ctx);
  df_recipe_free(t->recipe);
  free(t->rundir.recipe_yaml);
  memset(t, 0, sizeof *t);
}
