// The training loop: per optimizer step, accumulation_steps micro-batches add their numerator gradients, the
// boundary divides by the window's Σ loss weight, clips, and steps AdamW; then log, eval, checkpoint, signals.
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/path.h"
#include "train/eval/evaluate.h"
#include "train/observe/progress.h"
#include "train/trainer/trainer_internal.h"

// The one process-wide variable: set by the SIGINT/SIGTERM handler, read at optimizer-step boundaries.
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
  if (g_stop_signal) { // a second signal: stop now, the default way
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop_signal = sig;
}

typedef struct {
  bool installed;
  struct sigaction old_int, old_term;
} signal_guard;

static void signals_install(signal_guard *g) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  g_stop_signal = 0;
  g->installed = sigaction(SIGINT, &sa, &g->old_int) == 0 && sigaction(SIGTERM, &sa, &g->old_term) == 0;
}

static void signals_restore(signal_guard *g) {
  if (!g->installed) return;
  sigaction(SIGINT, &g->old_int, NULL);
  sigaction(SIGTERM, &g->old_term, NULL);
  g->installed = false;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- one accumulation window -------------------------------------------------------------------------------------

// Sums over the window's micro-batches; ratios are taken only at the end (ratio metrics sum first). The host knows
// loss_den, the token count and the FFN kind's part of loss_num as the window runs; the device sums (the strategy's
// loss_num, accuracy, τ, per-position counts; the FFN kind's statistics) arrive with the one read at the optimizer
// boundary.
typedef struct {
  double loss_num, loss_den, acc_num, acc_den, accept_len_sum;
  double host_loss_num; // the part of loss_num not in the strategy's sums: Σ ffn_loss·loss_den
  int64_t num_blocks, tokens, epoch;
  df_strategy_metrics m; // the strategy's metrics of the window (per-position counts)
  double data_wait_s;
  bool numeric_fail; // a micro-step reported NaN/Inf itself (DF_ERR_NUMERIC): the step is skipped
  int ffn_micro;     // training forwards whose FFN statistics went into the device sums
  int64_t last_N;    // anchors per sample of the window's last micro-batch
  json_t *extra;     // the strategy's and the FFN kind's own keys of the step line (owned)
} window;

typedef struct {
  bool skipped;
  const char *skip_reason;
  char skip_detail[1200]; // which samples of the window hold NaN/Inf (or that none does)
  json_t *skip_samples;   // their global numbers (owned; NULL unless skipped)
  double loss, acc, lr, grad_norm, clip_coef;
  double step_time_s;
} step_result;

static void window_reset(window *w) {
  w->loss_num = w->loss_den = w->acc_num = w->acc_den = w->accept_len_sum = w->data_wait_s = 0;
  w->host_loss_num = 0;
  w->num_blocks = w->tokens = 0;
  w->numeric_fail = false;
  w->ffn_micro = 0;
  df_strategy_metrics_free(&w->m);
  json_decref(w->extra);
  w->extra = NULL;
}

// The host-known part of one micro-batch.
static void window_add(window *w, const df_micro_info *info, const df_batch *b) {
  w->loss_den += info->loss_den;
  w->host_loss_num += info->ffn_loss * info->loss_den;
  for (int64_t i = 0; i < b->B; i++) w->tokens += b->length[i];
}

// The device sums, once read back: the strategy's metrics, and the FFN kind's part of loss_num and its metrics.
static df_status window_finish(const df_trainer *t, window *w, const double *st, df_error *err) {
  const df_strategy *s = t->strategy->table;
  w->host_loss_num += df_ffn_set_stats_loss_num(&t->ffn, st + t->stats.nobj);
  DF_TRY(s->metrics(t->strategy, st, w->loss_den, &w->m, err));
  w->loss_num = w->m.loss_num + w->host_loss_num;
  w->acc_num = w->m.acc_num, w->acc_den = w->m.acc_den;
  w->accept_len_sum = w->m.accept_sum, w->num_blocks = w->m.num_blocks;
  if (!(w->extra = json_object())) return DF_FAIL(err, DF_ERR_NOMEM, "metrics", NULL, "out of memory");
  s->report(t->strategy, st, w->loss_den, DF_REPORT_TRAIN, w->extra);
  df_ffn_set_stats_json(&t->ffn, st + t->stats.nobj, w->ffn_micro, w->extra);
  return DF_OK;
}

// Test hooks see host memory: on a device that is not host-addressable the buffer is staged down and back up
// (only when a hook is installed, so a normal step moves nothing).
typedef struct {
  float *p;
  bool staged;
} host_view;

static df_status view_down(df_trainer *t, float *dev, int64_t n, host_view *v, df_error *err) {
  v->staged = !df_ctx_host_addressable(t->ctx);
  v->p = v->staged ? malloc(sizeof(float) * (size_t)n) : dev;
  if (!v->p) return DF_FAIL(err, DF_ERR_NOMEM, "hooks", NULL, "out of memory");
  if (!v->staged) return DF_OK;
  return df_copy(t->ctx, v->p, DF_DEV_CPU, dev, df_ctx_device(t->ctx), sizeof(float) * (size_t)n, err);
}

static df_status view_up(df_trainer *t, float *dev, int64_t n, host_view *v, bool write_back, df_error *err) {
  df_status st = DF_OK;
  if (v->staged && write_back)
    st = df_copy(t->ctx, dev, df_ctx_device(t->ctx), v->p, DF_DEV_CPU, sizeof(float) * (size_t)n, err);
  if (v->staged) free(v->p);
  return st;
}

static df_status after_micro_hook(df_trainer *t, int64_t step, int64_t k, df_error *err) {
  const df_train_hooks *hooks = t->opt->hooks;
  if (!hooks || !hooks->after_micro) return DF_OK;
  const int64_t n = df_params_numel(t->table);
  float *g = df_draft_model_grads(t->model);
  host_view v;
  DF_TRY(view_down(t, g, n, &v, err));
  hooks->after_micro(hooks->ctx, step, k, v.p, n);
  return view_up(t, g, n, &v, true, err);
}

// Zeroes the gradient and the window's device sums, then adds d(loss_num) and the sums of every micro-batch of
// step `step`.
static df_status run_window(df_trainer *t, int64_t step, window *w, df_error *err) {
  df_draft_model_zero_grads(t->model);
  df_draft_model_set_training(t->model, true); // the FFN kind's stashes, deferred updates and loss term
  window_reset(w);
  df_tensor all = df_f64_on(df_ctx_device(t->ctx), t->stats.buf, t->stats.n + DF_NORM_STATS);
  DF_TRY(df_fill(t->ctx, &all, 0.0, err)); // the window's sums, and {norm, coef, ok} = 0 until the norm runs
  const bool ffn_stats = t->stats.n > t->stats.nobj;
  df_micro_args a = {.anchor_rng = &t->sampler.rng,
                     .world = t->dp.world,
                     .rank = t->dp.rank,
                     .dp_sum = t->dp.world > 1 ? &t->dp.coll : NULL,
                     .grad_scale = 1.0,
                     .accumulate = true,
                     .stats = &t->stats.obj,
                     .ffn_stats = ffn_stats ? (double *)t->stats.buf + t->stats.nobj : NULL,
                     .step = step - 1, // optimizer steps completed before this window (Domino's lambda_base)
                     .horizon = t->sched.horizon};
  for (int64_t k = 0; k < t->recipe->training.accumulation_steps; k++) {
    const df_batch *b;
    double wait = 0;
    DF_TRY(df_feed_next(t->feed, &b, &wait, err));
    w->data_wait_s += wait;
    if (t->dp.world > 1) DF_TRY(df_trainer_dp_global_batch(t, b, err)); // this rank's share of the global batch
    a.batch = b, a.global_S = t->dp.global_S, a.global_cmax = t->dp.global_cmax;
    df_trainer_note_batch(t, b->index, b->B, k == 0);      // a skipped step names its samples
    if (df_ffn_set_active(&t->ffn)) t->state_dirty = true; // the kind's training forwards update its buffers
    df_micro_info info;
    df_error micro_err = {0};
    // The last micro-step's backward starts the gradient reduction of the layers it has finished (GPU ranks; a
    // test hook reading the gradient after the micro-step turns it off).
    const bool last = k == t->recipe->training.accumulation_steps - 1;
    if (t->dp.world > 1) DF_TRY(df_trainer_dp_overlap(t, last && !(t->opt->hooks && t->opt->hooks->after_micro)));
    df_status st = t->strategy->table->micro(t->strategy, &a, &info, &micro_err);
    if (st == DF_ERR_NUMERIC) { // finish the window (the data stays aligned), then skip the step
      w->numeric_fail = true;
      continue;
    }
    if (st != DF_OK) return *err = micro_err, st;
    window_add(w, &info, b);
    w->last_N = info.N;
    w->ffn_micro += ffn_stats;                         // its statistics went into the device sums
    if (t->log && step == t->start_step + 1 && k == 0) // the arena is sized by the first batch's shape
      fprintf(t->log, "  activations %.1f MiB for a batch of %lld x %lld (grows with longer batches)\n",
              (double)df_draft_model_activation_bytes(t->model) / (1 << 20), (long long)b->B, (long long)b->S);
    DF_TRY(after_micro_hook(t, step, k, err));
  }
  int64_t e, c;
  df_feed_position(t->feed, &e, &c);
  w->epoch = c == 0 ? e - 1 : e; // the epoch of the window's last batch
  // The FFN kind's last deferred updates (MoE centering mean, noaux_tc bias) are applied here, at the boundary,
  // rather than at the start of the next training forward. The next training forward sees the same state either
  // way; eval and checkpoints see every training forward's update, and no stash is left pending at a checkpoint, so
  // state.h5's buffers are all a bit-exact resume needs.
  return df_ffn_set_apply_pending(&t->ffn, err);
}

// before_update sees the gradient as the update reads it: × 1/Σ loss_den, then × the clip coefficient (fp32
// products in that order, as adamw_fused forms them). Test-only: it costs a read of the norm block and the grads.
static df_status before_update_hook(df_trainer *t, int64_t step, float scale, step_result *r, df_error *err) {
  const df_train_hooks *hooks = t->opt->hooks;
  if (!hooks || !hooks->before_update) return DF_OK;
  double ns[DF_NORM_STATS];
  DF_TRY(df_copy(t->ctx, ns, DF_DEV_CPU, t->stats.norm.data, df_ctx_device(t->ctx), sizeof ns, err));
  if (ns[DF_NORM_OK] == 0.0) return DF_OK; // the step is skipped: no update to show
  const int64_t n = df_params_numel(t->table);
  host_view v;
  DF_TRY(view_down(t, df_draft_model_grads(t->model), n, &v, err));
  float *g = malloc(sizeof(float) * (size_t)n);
  if (!g) return view_up(t, NULL, n, &v, false, err), DF_FAIL(err, DF_ERR_NOMEM, "hooks", NULL, "out of memory");
  const float cf = (float)ns[DF_NORM_COEF];
  for (int64_t i = 0; i < n; i++) g[i] = ns[DF_NORM_COEF] < 1.0 ? v.p[i] * scale * cf : v.p[i] * scale;
  (void)r;
  hooks->before_update(hooks->ctx, step, g, n, ns[DF_NORM_VALUE], ns[DF_NORM_COEF]);
  free(g);
  return view_up(t, NULL, n, &v, false, err);
}

static df_status after_update_hook(df_trainer *t, int64_t step, df_error *err) {
  const df_train_hooks *hooks = t->opt->hooks;
  if (!hooks || !hooks->after_update) return DF_OK;
  const int64_t n = df_params_numel(t->table);
  float *w = df_draft_model_weights(t->model);
  host_view v;
  DF_TRY(view_down(t, w, n, &v, err));
  hooks->after_update(hooks->ctx, step, v.p, n);
  DF_TRY(view_up(t, w, n, &v, true, err));
  return df_draft_model_sync_params(t->model, err); // the hook may have written the masters
}

// The boundary, queued without a host round trip: the norm of grad/Σ loss_den with the clip coefficient and the
// go/no-go flag (a non-finite norm or window sum skips) on the device, one fused AdamW over the flat buffer that
// reads them, then the ONE device→host read of the step: the window's sums and {norm, coef, ok}. A skipped step
// leaves the parameters and moments untouched.
static df_status optimizer_step(df_trainer *t, int64_t step, window *w, step_result *r, df_error *err) {
  r->lr = df_lr_at(&t->sched, step);
  r->grad_norm = NAN, r->clip_coef = NAN;
  t->stop = g_stop_signal != 0;
  if (t->dp.world > 1) { // the job's window: every rank then takes the same decisions from the same sums
    double sc[5] = {w->loss_den, w->host_loss_num, (double)w->tokens, w->numeric_fail, t->stop};
    // the gradient too, unless ZeRO-1 on CPU ranks reduce-scatters it below
    DF_TRY(df_trainer_dp_reduce(t, sc, 5, df_trainer_dp_grads_in_buckets(t), err));
    w->loss_den = sc[0], w->host_loss_num = sc[1], w->tokens = (int64_t)sc[2];
    w->numeric_fail = sc[3] > 0, t->stop = sc[4] > 0;
  }
  // Known on the host before anything is queued: a micro-step that failed numerically, an empty window.
  const bool host_skip = w->numeric_fail || !(w->loss_den > 0) || !isfinite(w->host_loss_num);
  const float scale = w->loss_den > 0 ? (float)(1.0 / w->loss_den) : 0.0f;
  const df_grad_norm_desc nd = {.grad_scale = scale, .max_norm = t->optim.max_grad_norm};
  df_adamw_fused_desc ad = {.hp = t->optim.hp, .grad_scale = scale};
  ad.hp.lr = (float)r->lr, ad.hp.step = t->prog.adam_step + 1;
  if (!host_skip && t->optim.zero) { // ZeRO-1: the same update, each rank computing its shard of it
    // (a memory plan has no communicator: its shard's device part only)
    DF_TRY(t->dp.comm ? df_trainer_dp_zero_step(t, &ad, &nd, err) : df_trainer_dp_zero_shard_ops(t, &ad, &nd, err));
  } else if (!host_skip) {
    df_tensor g = df_f32_on(df_ctx_device(t->ctx), df_draft_model_grads(t->model), df_params_numel(t->table));
    df_tensor mk = df_u8_on(df_ctx_device(t->ctx), t->optim.mask, df_params_numel(t->table));
    DF_TRY(df_grad_norm_clip(t->ctx, &nd, &g, &mk, &t->stats.win, &t->stats.norm, err));
    DF_TRY(before_update_hook(t, step, scale, r, err));
    const df_device dev = df_ctx_device(t->ctx);
    const int64_t n = df_params_numel(t->table);
    df_tensor p = df_f32_on(dev, df_draft_model_weights(t->model), n), m = df_f32_on(dev, t->optim.exp_avg, n);
    df_tensor v = df_f32_on(dev, t->optim.exp_avg_sq, n);
    t->state_dirty = true;                               // from the update until the progress record follows
    void *p16 = df_draft_model_compute_params(t->model); // bf16 storage: the forward's copy, rounded from the update
    df_tensor pc = df_view_on(df_draft_model_storage(t->model), dev, p16, n);
    DF_TRY(df_adamw_fused(t->ctx, &ad, &p, &g, &m, &v, &mk, &t->stats.norm, p16 ? &pc : NULL, err));
  }
  const size_t bytes = sizeof(double) * (size_t)(t->stats.n + DF_NORM_STATS);
  DF_TRY(df_copy(t->ctx, t->stats.host, DF_DEV_CPU, t->stats.buf, df_ctx_device(t->ctx), bytes, err));
  DF_TRY(window_finish(t, w, t->stats.host, err));
  const double *ns = t->stats.host + t->stats.n;
  r->loss = w->loss_den > 0 ? w->loss_num / w->loss_den : NAN;
  r->acc = w->acc_den > 0 ? w->acc_num / w->acc_den : 0.0;
  if (w->numeric_fail) {
    r->skipped = true, r->skip_reason = "a micro-step reported a non-finite value";
  } else if (!isfinite(r->loss)) {
    r->skipped = true, r->skip_reason = w->loss_den > 0 ? "non-finite loss" : "no supervised token in the window";
  } else if (ns[DF_NORM_OK] == 0.0) {
    r->skipped = true, r->skip_reason = "non-finite gradient norm";
    r->grad_norm = ns[DF_NORM_VALUE];
  } else {
    r->grad_norm = ns[DF_NORM_VALUE], r->clip_coef = ns[DF_NORM_COEF];
    t->prog.adam_step++;
    DF_TRY(after_update_hook(t, step, err));
  }
  return DF_OK;
}

// ---- logging ---------------------------------------------------------------------------------------------------

static json_t *per_position(const double *num, const double *den, int64_t bs) {
  json_t *a = json_array();
  for (int64_t k = 0; k < bs; k++) json_array_append_new(a, den[k] > 0 ? json_real(num[k] / den[k]) : json_null());
  return a;
}

static json_t *step_line(int64_t step, const window *w, const step_result *r, double elapsed) {
  json_t *o = json_object();
  json_object_set_new(o, "step", json_integer(step));
  json_object_set_new(o, "epoch", json_integer(w->epoch));
  json_object_set_new(o, "loss", df_metrics_real(r->loss));
  json_object_set_new(o, "acc", json_real(r->acc));
  json_object_set_new(o, "lr", json_real(r->lr));
  json_object_set_new(o, "grad_norm", df_metrics_real(r->grad_norm));
  json_object_set_new(o, "clip_coef", df_metrics_real(r->clip_coef));
  json_object_set_new(o, "skipped", json_boolean(r->skipped));
  if (r->skipped) json_object_set_new(o, "skip_reason", json_string(r->skip_reason));
  if (r->skipped && r->skip_detail[0]) json_object_set_new(o, "skip_detail", json_string(r->skip_detail));
  if (r->skipped && r->skip_samples) json_object_set(o, "skip_samples", r->skip_samples);
  json_object_set_new(o, "loss_den", json_real(w->loss_den));
  json_object_set_new(o, "tokens", json_integer(w->tokens));
  json_object_set_new(o, "num_blocks", json_integer(w->num_blocks));
  json_object_set_new(o, "accept_len", json_real(w->num_blocks ? w->accept_len_sum / (double)w->num_blocks : 0.0));
  json_object_set_new(o, "per_position_acc", per_position(w->m.pos_num, w->m.pos_den, w->m.positions));
  // the strategy's own keys, and the FFN kind's metrics (MoE: moe/load_max_ratio, moe/load_min_ratio,
  // moe/experts_unused_frac, moe/aux_loss, moe/bias_abs_max for noaux_tc, moe/expert_load), averaged over the
  // window's micro-batches
  if (w->extra) json_object_update(o, w->extra);
  // timing (df_metrics_is_timing_key): differs between identical runs
  json_object_set_new(o, "tokens_per_s", json_real(r->step_time_s > 0 ? (double)w->tokens / r->step_time_s : 0.0));
  json_object_set_new(o, "step_time_s", json_real(r->step_time_s));
  json_object_set_new(o, "data_wait_s", json_real(w->data_wait_s));
  json_object_set_new(o, "elapsed_s", json_real(elapsed));
  return o;
}

static df_status log_step(df_trainer *t, int64_t step, const window *w, const step_result *r, double elapsed,
                          df_error *err) {
  if (t->dp.rank != 0) return DF_OK; // rank 0 writes the job's (reduced) lines
  bool line = step % t->recipe->training.log_interval == 0 || r->skipped;
  if (line) {
    json_t *o = step_line(step, w, r, elapsed);
    df_status st = df_metrics_append(&t->rundir.metrics, o, err);
    json_decref(o);
    DF_TRY(st);
  }
  struct df_progress_term *term = t->opt->progress; // a terminal: redrawn every step
  if (!t->log || !(line || term || step == t->stop_step || t->stop)) return DF_OK;
  int64_t done = step - t->start_step;
  df_progress p = {.step = step,
                   .stop = t->stop_step,
                   .epoch = w->epoch,
                   .loss = r->loss,
                   .acc = r->acc,
                   .tau = w->num_blocks ? w->accept_len_sum / (double)w->num_blocks : NAN,
                   .lr = r->lr,
                   .grad_norm = r->grad_norm,
                   .tokens_per_s = r->step_time_s > 0 ? (double)w->tokens / r->step_time_s : NAN,
                   .eta_s = done > 0 ? elapsed / (double)done * (double)(t->stop_step - step) : NAN,
                   .skipped = r->skipped};
  char buf[512];
  df_progress_format(&p, buf, sizeof buf);
  if (term) {
    df_progress_term_update(term, buf, line || step == t->stop_step);
    if (r->skipped && r->skip_detail[0]) fprintf(t->log, "skipped step %lld: %s\n", (long long)step, r->skip_detail);
    return DF_OK;
  }
  fprintf(t->log, "%s\n", buf);
  if (r->skipped && r->skip_detail[0]) fprintf(t->log, "  skipped step %lld: %s\n", (long long)step, r->skip_detail);
  fflush(t->log);
  return DF_OK;
}

// ---- eval and checkpoints ------------------------------------------------------------------------------------------

// Eval samples with NaN/Inf hidden states: named in the eval line and the log (such an eval never counts as best).
static void eval_nonfinite(const df_trainer *t, json_t *o, const df_eval_report *rep, int64_t step) {
  const df_hs_scan_report *nf = &rep->nonfinite;
  if (!nf->bad_samples) return;
  json_t *bad = json_array();
  for (int i = 0; i < nf->nreported; i++) json_array_append_new(bad, json_integer(nf->bad[i].sample));
  json_object_set_new(o, "eval/nonfinite_samples", bad);
  if (!t->log) return;
  char first[900];
  df_hs_bad_value_text(&nf->bad[0], first, sizeof first);
  fprintf(t->log, "warning: eval @ step %lld: %lld eval sample(s) hold NaN/Inf hidden states, first %s\n",
          (long long)step, (long long)nf->bad_samples, first);
}

// The evaluation of the eval source at `step`.
static df_status evaluate(df_trainer *t, int64_t step, df_eval_report *rep, df_error *err) {
  df_eval_options eo = df_eval_options_from_recipe(t->recipe, t->settings.mask_token_id, &t->values);
  eo.step = step, eo.horizon = t->sched.horizon; // SpecForge's evaluator uses the live step's schedule
  return df_evaluate_source(t->ctx, t->model, t->draft, &t->res.frozen, t->eval_src, &eo, rep, err);
}

// Held-out eval (train/eval/evaluate.h): an eval line in metrics.jsonl; *improved when τ beats the best so far.
static df_status run_eval(df_trainer *t, int64_t step, int64_t epoch, bool *improved, df_error *err) {
  df_eval_report rep;
  double t0 = now_s();
  DF_TRY(evaluate(t, step, &rep, err));
  json_t *o = json_object();
  json_object_set_new(o, "step", json_integer(step));
  json_object_set_new(o, "epoch", json_integer(epoch));
  json_object_set_new(o, "eval/loss", df_metrics_real(rep.loss));
  json_object_set_new(o, "eval/acc", df_metrics_real(rep.acc));
  json_object_set_new(o, "eval/tau", df_metrics_real(rep.accept_len));
  json_object_set_new(o, "eval/per_position_acc", per_position(rep.pos_acc_num, rep.pos_acc_den, rep.block_size));
  json_object_set_new(o, "eval/samples", json_integer(rep.num_samples));
  if (rep.line) json_object_update(o, rep.line); // the strategy's own eval/ keys
  eval_nonfinite(t, o, &rep, step);
  json_object_set_new(o, "eval_time_s", json_real(now_s() - t0));
  df_status st = df_metrics_append(&t->rundir.metrics, o, err);
  json_decref(o);
  double tau = rep.accept_len;
  if (t->log)
    fprintf(t->log, "eval @ step %lld: loss %.4f | acc %.4f | tau %.4f%s%s\n", (long long)step, rep.loss, rep.acc, tau,
            rep.summary[0] ? " | " : "", rep.summary);
  df_eval_report_free(&rep);
  *improved = st == DF_OK && isfinite(tau) && isfinite(rep.loss) && !rep.nonfinite.bad_samples &&
              (!t->prog.has_best || tau > t->prog.best_eval_tau);
  if (*improved) t->prog.has_best = true, t->prog.best_eval_tau = tau, t->prog.best_step = step;
  return st;
}

// Never a NaN checkpoint: every trainable weight and moment must be finite; the error names the tensor. bufs are
// host copies (params, exp_avg, exp_avg_sq).
static df_status check_finite(const df_trainer *t, const float *const bufs[3], df_error *err) {
  static const char *const what[3] = {"weight", "AdamW exp_avg", "AdamW exp_avg_sq"};
  for (int i = 0; i < df_params_count(t->table); i++) {
    const df_param *e = df_params_at(t->table, i);
    for (int b = 0; e->trainable && b < 3; b++)
      for (int64_t j = e->offset; j < e->offset + e->numel; j++)
        if (!isfinite(bufs[b][j]))
          return DF_FAIL(err, DF_ERR_NUMERIC, e->name,
                         "lower training.learning_rate or training.max_grad_norm and resume from the last checkpoint",
                         "refusing to checkpoint step %lld: %s[%lld] (%s) is not finite", (long long)t->prog.step,
                         e->name, (long long)(j - e->offset), what[b]);
  }
  return DF_OK;
}

// The state a checkpoint writes, on the host: the device buffers themselves when they are host memory, else one
// staged copy of each (a checkpoint is the one place the trainer reads the whole state back).
static df_status state_to_host(df_trainer *t, float *bufs[3], float **staged, df_error *err) {
  float *dev[3] = {df_draft_model_weights(t->model), t->optim.exp_avg, t->optim.exp_avg_sq};
  *staged = NULL;
  if (df_ctx_host_addressable(t->ctx)) {
    for (int i = 0; i < 3; i++) bufs[i] = dev[i];
    return DF_OK;
  }
  const int64_t n = df_params_numel(t->table);
  if (!(*staged = malloc(3 * sizeof(float) * (size_t)n)))
    return DF_FAIL(err, DF_ERR_NOMEM, "checkpoint", NULL, "out of memory for %lld parameters", (long long)n);
  for (int i = 0; i < 3; i++) {
    bufs[i] = *staged + i * n;
    DF_TRY(df_copy(t->ctx, bufs[i], DF_DEV_CPU, dev[i], df_ctx_device(t->ctx), sizeof(float) * (size_t)n, err));
  }
  return DF_OK;
}

// ZeRO-1: the weights (replicated: rank 0's own copy) and the moments gathered from every rank's shard, on rank 0's
// host; the other ranks only take part in the gather.
static df_status zero_state(df_trainer *t, float *bufs[3], float **staged, df_error *err) {
  const int64_t n = df_params_numel(t->table);
  *staged = NULL;
  if (t->dp.rank != 0) return df_trainer_dp_gather_moments(t, NULL, NULL, err);
  if (!(*staged = malloc(3 * sizeof(float) * (size_t)n)))
    return DF_FAIL(err, DF_ERR_NOMEM, "checkpoint", NULL, "out of memory for %lld moments", (long long)(2 * n));
  bufs[0] = *staged, bufs[1] = *staged + n, bufs[2] = *staged + 2 * n;
  DF_TRY(df_copy(t->ctx, bufs[0], DF_DEV_CPU, df_draft_model_weights(t->model), df_ctx_device(t->ctx),
                 sizeof(float) * (size_t)n, err));
  return df_trainer_dp_gather_moments(t, bufs[1], bufs[2], err);
}

// ZeRO-1: collective (every rank's moment shard is gathered), then rank 0 writes.
df_status df_trainer_save(df_trainer *t, df_error *err) {
  float *bufs[3], *staged;
  df_status st = t->optim.zero ? zero_state(t, bufs, &staged, err) : state_to_host(t, bufs, &staged, err);
  if (st == DF_OK && t->dp.rank != 0) return free(staged), DF_OK;
  if (st == DF_OK) st = check_finite(t, (const float *const *)bufs, err); // t->prog is current after every step
  df_ckpt_state s = {.table = t->table,
                     .params = bufs[0],
                     .exp_avg = bufs[1],
                     .exp_avg_sq = bufs[2],
                     .contract = &t->contract,
                     .progress = &t->prog,
                     .draft_config = t->res.resolved_config,
                     .recipe_yaml = t->rundir.recipe_yaml,
                     .ffn = &t->ffn};
  if (st == DF_OK)
    st = df_ckpt_write(t->recipe->output_dir, &s, t->recipe->training.max_checkpoints, t->rundir.last_ckpt,
                       sizeof t->rundir.last_ckpt, err);
  free(staged);
  if (st != DF_OK) return st;
  t->rundir.last_saved_step = t->prog.step, t->rundir.last_save_s = now_s();
  if (t->log) {
    char shown[4096];
    df_path_shown(t->rundir.last_ckpt, shown, sizeof shown);
    fprintf(t->log, "checkpoint: %s\n", shown);
  }
  return DF_OK;
}

// ---- the loop --------------------------------------------------------------------------------------------------

// A run that fails after training started keeps its work: a checkpoint of the last complete step, as a signal
// would write — unless the state is mid-update, a numeric stop (its state is what went wrong), or the step is
// saved already, or a data-parallel job (its ranks are no longer in step). A failure to save is added to the original
// error's message.
static void save_after_error(df_trainer *t, df_train_summary *sum, df_error *err) {
  if (t->dp.world > 1 || err->status == DF_ERR_NUMERIC || t->state_dirty || t->prog.step <= t->rundir.last_saved_step ||
      t->prog.step == t->start_step)
    return;
  df_error save_err = {0};
  if (df_trainer_save(t, &save_err) == DF_OK) {
    sum->saved_after_error = true;
    return;
  }
  size_t n = strlen(err->msg);
  snprintf(err->msg + n, sizeof err->msg - n, " (and the checkpoint after it failed too: %s)", save_err.msg);
}

// Eval and checkpoints are rank 0's (the other ranks hold the same weights and wait at the next collective). A
// checkpoint is written whole into a temporary directory and renamed: a rank that dies meanwhile never leaves a
// `latest` pointing at a partial one.
static df_status after_step(df_trainer *t, int64_t step, const window *w, df_error *err) {
  const df_recipe *rc = t->recipe;
  bool improved = false;
  if (t->dp.rank != 0 && !t->optim.zero) return DF_OK;
  if (t->dp.rank == 0 && rc->training.eval_interval > 0 && step % rc->training.eval_interval == 0)
    DF_TRY(run_eval(t, step, w->epoch, &improved, err));
  double minutes = rc->training.save_interval_minutes; // wall-clock saving (a draftforge extension)
  bool due = minutes > 0 && now_s() - t->rundir.last_save_s >= 60.0 * minutes;
  bool save = (rc->training.save_interval > 0 && step % rc->training.save_interval == 0) || improved ||
              step == t->stop_step || t->stop || due;
  if (t->optim.zero) { // rank 0's decision (its eval may have improved): the save gathers every rank's moments
    int32_t f = save;
    DF_TRY(df_comm_broadcast_host(t->dp.comm, &f, 1, DF_COMM_I32, 0, err));
    save = f != 0;
  }
  if (save) DF_TRY(df_trainer_save(t, err));
  if (t->dp.rank == 0 && improved)
    DF_TRY(df_ckpt_mark_best(rc->output_dir, step, "eval/tau", t->prog.best_eval_tau, err));
  return DF_OK;
}

static df_status one_step(df_trainer *t, window *w, step_result *r, double t_start, df_error *err) {
  int64_t step = t->prog.step + 1;
  double t0 = now_s();
  memset(r, 0, sizeof *r);
  df_ctx_reset_transfer_stats(t->ctx);
  DF_TRY(run_window(t, step, w, err));
  DF_TRY(optimizer_step(t, step, w, r, err));
  if (r->skipped) df_trainer_explain_skip(t, r->skip_detail, sizeof r->skip_detail, &r->skip_samples);
  const df_train_hooks *hooks = t->opt->hooks;
  if (hooks && hooks->after_step) hooks->after_step(hooks->ctx, step, df_ctx_transfer_stats(t->ctx));
  df_ckpt_progress *p = &t->prog;
  p->step = step;
  p->tokens_seen += w->tokens;
  p->last_lr = r->lr;
  p->consecutive_skips = r->skipped ? p->consecutive_skips + 1 : 0;
  p->skipped_steps += r->skipped;
  df_feed_position(t->feed, &p->epoch, &p->cursor);
  p->anchor_rng = t->sampler.rng;
  t->state_dirty = false; // the state and its progress record describe step `step` again
  r->step_time_s = now_s() - t0;
  DF_TRY(log_step(t, step, w, r, now_s() - t_start, err));
  if (r->skipped && p->consecutive_skips >= t->recipe->training.max_consecutive_skips)
    return DF_FAIL(err, DF_ERR_NUMERIC, "training.max_consecutive_skips",
                   "lower training.learning_rate or training.max_grad_norm, check the data for NaN/Inf, and resume "
                   "from the last checkpoint",
                   "stopping: %lld optimizer steps in a row were skipped (last: step %lld, %s)",
                   (long long)p->consecutive_skips, (long long)step, r->skip_reason);
  return after_step(t, step, w, err);
}

df_status df_trainer_plan_step(df_trainer *t, bool eval, int64_t *N, df_error *err) {
  window w = {0};
  step_result r = {0};
  const int64_t step = t->prog.step + 1;
  df_status st = run_window(t, step, &w, err);
  if (st == DF_OK) st = optimizer_step(t, step, &w, &r, err);
  if (st == DF_OK) t->prog.step = step;
  *N = w.last_N;
  window_reset(&w);
  json_decref(r.skip_samples);
  df_eval_report rep;
  if (st == DF_OK && eval && t->eval_src && (st = evaluate(t, step, &rep, err)) == DF_OK) df_eval_report_free(&rep);
  return st;
}

static df_status train_loop(df_trainer *t, df_train_summary *sum, df_error *err) {
  window w = {0};
  if (t->prog.step >= t->stop_step && t->log)
    fprintf(t->log, "nothing to do: the run is at step %lld and stops at %lld (raise training.max_steps)\n",
            (long long)t->prog.step, (long long)t->stop_step);
  double t_start = now_s();
  t->rundir.last_save_s = t_start;
  df_status st = DF_OK;
  while (st == DF_OK && t->prog.step < t->stop_step) {
    step_result r;
    st = one_step(t, &w, &r, t_start, err);
    json_decref(r.skip_samples);
    if (st == DF_OK && !r.skipped) sum->last_loss = r.loss;
    if (st == DF_OK && t->stop) {
      sum->stopped_by_signal = true;
      break;
    }
  }
  window_reset(&w);
  if (st != DF_OK) save_after_error(t, sum, err);
  return st;
}

df_status df_train(const df_train_options *opt, df_train_summary *sum, df_error *err) {
  memset(sum, 0, sizeof *sum);
  sum->last_loss = NAN;
  df_trainer t;
  signal_guard sg = {0};
  g_stop_signal = 0;
  df_status st = df_trainer_setup(&t, opt, err);
  if (st == DF_OK) {
    sum->start_step = t.start_step, sum->stop_step = t.stop_step, sum->horizon = t.sched.horizon;
    snprintf(sum->output_dir, sizeof sum->output_dir, "%s", t.recipe->output_dir);
    if (opt->handle_signals) signals_install(&sg);
    st = train_loop(&t, sum, err);
    signals_restore(&sg);
  }
  sum->bad_arguments = t.rundir.plan.bad_arguments;
  sum->last_step = t.prog.step;
  sum->skipped_steps = t.prog.skipped_steps;
  if (t.online) {
    df_online_stats os = df_online_target_stats(t.online);
    sum->online_samples = os.samples, sum->online_tokens = os.tokens, sum->online_target_s = os.forward_s;
    if (t.log)
      fprintf(t.log, "online: the target prefilled %lld samples (%lld tokens) in %.1f s\n", (long long)os.samples,
              (long long)os.tokens, os.forward_s);
  }
  snprintf(sum->last_checkpoint, sizeof sum->last_checkpoint, "%s", t.rundir.last_ckpt);
  sum->mem = df_trainer_mem_stats(&t);
  df_trainer_teardown(&t);
  return st;
}
