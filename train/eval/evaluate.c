// Held-out evaluation (train/eval/evaluate.h): file-order batches through the draft's strategy opened for eval (the
// forward and its eval objective, no backward), and counts summed over the whole set before any ratio is taken.
#include "train/eval/evaluate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fsutil.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

df_eval_options df_eval_options_from_recipe(const df_recipe *rc, int64_t mask_token_id,
                                            const df_strategy_values *values) {
  return (df_eval_options){.batch_size = rc->training.batch_size,
                           .max_length = rc->data.max_length,
                           .seed = rc->training.seed,
                           .set = df_step_settings_of(rc, mask_token_id, values)};
}

void df_eval_report_free(df_eval_report *r) {
  if (!r) return;
  free(r->pos_acc_num), free(r->pos_acc_den);
  json_decref(r->report), json_decref(r->line);
  r->pos_acc_num = r->pos_acc_den = NULL;
  r->report = r->line = NULL;
}

static df_status eval_check(const df_draft_config *cfg, const df_frozen *fz, const df_eval_options *o, df_error *err) {
  if (o->batch_size < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.batch_size", "use a batch size >= 1", "eval batch size %lld",
                   (long long)o->batch_size);
  if (o->set.num_anchors < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.num_anchors", "use at least one anchor per sample",
                   "eval num_anchors %lld", (long long)o->set.num_anchors);
  const df_strategy *s = df_strategy_of(cfg);
  if ((!s || s->blocks) && (o->set.mask_token_id < 0 || o->set.mask_token_id >= fz->vocab))
    return DF_FAIL(err, DF_ERR_INVALID, "model.mask_token_id", "the mask token must be a row of the target embedding",
                   "mask_token_id %lld outside the vocabulary of %lld", (long long)o->set.mask_token_id,
                   (long long)fz->vocab);
  if (fz->hidden != cfg->hidden_size)
    return DF_FAIL(err, DF_ERR_INVALID, "hidden_size", "the target pieces must come from the draft's target",
                   "target hidden size %lld, draft %lld", (long long)fz->hidden, (long long)cfg->hidden_size);
  return DF_OK;
}

// The strategy's eval run and the one stats vector of an evaluation: every batch adds its sums on the device, read
// back once.
typedef struct {
  df_strategy_run *run;
  void *buf;
  df_tensor stats;
  double loss_den; // Σ over batches, known on the host
} eval_state;

static df_status eval_state_open(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *fz,
                                 const df_eval_options *o, eval_state *ev, df_error *err) {
  memset(ev, 0, sizeof *ev);
  DF_TRY(df_step_open(ctx, m, cfg, fz, &o->set, true, &ev->run, err));
  const int64_t ns = ev->run->table->stats_len(ev->run);
  DF_TRY(df_buffer_alloc_as(ctx, DF_MEM_STATS, sizeof(double) * (size_t)ns, &ev->buf, err));
  ev->stats = df_f64_on(df_ctx_device(ctx), ev->buf, ns);
  return df_fill(ctx, &ev->stats, 0.0, err);
}

static void eval_state_close(df_ctx *ctx, eval_state *ev) {
  df_strategy_close(ev->run);
  if (ev->buf) df_buffer_free(ctx, ev->buf);
}

// Forward-only on one batch with the strategy's eval objective, its sums added to ev->stats.
static df_status eval_batch(const df_batch *bt, const df_eval_options *o, eval_state *ev, int64_t *skipped,
                            df_error *err) {
  const df_micro_args a = {
      .batch = bt, .world = 1, .eval_seed = o->seed, .stats = &ev->stats, .step = o->step, .horizon = o->horizon};
  df_micro_info info;
  DF_TRY(ev->run->table->micro(ev->run, &a, &info, err));
  ev->loss_den += info.loss_den;
  *skipped += info.skipped;
  return DF_OK;
}

static void eval_finish(df_eval_report *r) {
  r->loss = r->loss_den > 0 ? r->loss_num / r->loss_den : NAN;
  r->acc = r->acc_den > 0 ? r->acc_num / r->acc_den : NAN;
  r->accept_len = r->num_blocks > 0 ? r->accept_len_sum / (double)r->num_blocks : NAN;
}

// The report from the stats read back once at the end: the shared metrics, and the strategy's own keys.
static df_status eval_collect(df_ctx *ctx, const eval_state *ev, df_eval_report *r, df_error *err) {
  const df_strategy *t = ev->run->table;
  const int64_t ns = df_numel(&ev->stats);
  double *st = malloc(sizeof(double) * (size_t)ns);
  if (!st) return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  df_status rc = df_copy(ctx, st, DF_DEV_CPU, ev->stats.data, df_ctx_device(ctx), sizeof(double) * (size_t)ns, err);
  df_strategy_metrics m = {0};
  if (rc == DF_OK) rc = t->metrics(ev->run, st, ev->loss_den, &m, err);
  if (rc == DF_OK) {
    r->loss_den = ev->loss_den, r->loss_num = m.loss_num;
    r->acc_num = m.acc_num, r->acc_den = m.acc_den;
    r->num_blocks = m.num_blocks, r->accept_len_sum = m.accept_sum;
    r->block_size = m.positions, r->first_position = t->first_position(ev->run);
    r->pos_acc_num = m.pos_num, r->pos_acc_den = m.pos_den; // moved
    m.pos_num = m.pos_den = NULL;
    r->report = json_object(), r->line = json_object();
    if (!r->report || !r->line) rc = DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  }
  if (rc == DF_OK) {
    t->report(ev->run, st, ev->loss_den, DF_REPORT_EVAL, r->report);
    t->report(ev->run, st, ev->loss_den, DF_REPORT_EVAL_LINE, r->line);
    FILE *mem = fmemopen(r->summary, sizeof r->summary, "w");
    if (mem) t->print(ev->run, st, ev->loss_den, mem), fclose(mem);
  }
  df_strategy_metrics_free(&m);
  free(st);
  return rc;
}

// ---- the loop ----------------------------------------------------------------------------------------------------

// The batch's samples whose rows hold NaN/Inf (padding rows are zero), added to rep.
static void note_nonfinite(const df_hs_dataset *ds, const df_batch *bt, df_hs_scan_report *rep) {
  for (int64_t i = 0; i < bt->B; i++) {
    const float *h = bt->hidden + i * bt->S * bt->width;
    const float *last = bt->last_hidden ? bt->last_hidden + i * bt->S * bt->hidden_size : NULL;
    df_hs_bad_value bad = {0};
    rep->scanned++;
    if (!df_hs_find_nonfinite(h, bt->length[i], bt->width, last, bt->hidden_size, &bad)) continue;
    df_hs_bad_value_locate(ds, bt->index[i], &bad);
    df_hs_scan_add(rep, &bad);
  }
}

static df_status eval_loop(df_ctx *ctx, eval_state *ev, df_batch_source *src, const df_eval_options *o,
                           df_eval_report *r, df_error *err) {
  int64_t n = src->num_samples;
  if (o->max_samples > 0 && o->max_samples < n) n = o->max_samples;
  const bool teacher = ev->run->table->needs_last_hidden(ev->run); // read target_last_hidden_states too
  int64_t *index = malloc((size_t)o->batch_size * sizeof *index);
  if (!index) return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  df_status st = DF_OK;
  // The stage packs each batch into its own page-locked slot, so the batch's memory can go as soon as it is staged.
  for (int64_t first = 0; first < n && st == DF_OK; first += o->batch_size) {
    int64_t B = n - first < o->batch_size ? n - first : o->batch_size;
    for (int64_t i = 0; i < B; i++) index[i] = first + i;
    df_batch bt;
    st = df_batch_source_read(src, index, B, o->max_length, teacher, &bt, err);
    if (st != DF_OK) break;
    note_nonfinite(df_batch_source_dataset(src), &bt, &r->nonfinite);
    r->num_samples += B, r->num_batches++;
    st = eval_batch(&bt, o, ev, &r->skipped_samples, err);
    df_batch_free(&bt);
  }
  if (st == DF_OK) st = eval_collect(ctx, ev, r, err);
  free(index);
  return st;
}

df_status df_evaluate_source(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                             df_batch_source *src, const df_eval_options *opt, df_eval_report *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(eval_check(cfg, frozen, opt, err));
  double t0 = now_s();
  eval_state ev;
  df_status st = eval_state_open(ctx, m, cfg, frozen, opt, &ev, err);
  if (st == DF_OK) out->strategy = ev.run->table->name;
  if (st == DF_OK && ev.run->table->needs_last_hidden(ev.run) && !src->has_last_hidden)
    st = DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                 "capture the eval data with target_last_hidden_states (DSpark needs the target's final hidden states)",
                 "the eval data %s has no target_last_hidden_states, which this draft's objective reads", src->label);
  // MoE: eval forwards route with the running centering mean, apply and stash nothing and have no aux loss
  // (the loss is the objective alone); the model is handed back in training mode.
  df_draft_model_set_training(m, false);
  if (st == DF_OK) st = eval_loop(ctx, &ev, src, opt, out, err);
  df_draft_model_set_training(m, true);
  eval_state_close(ctx, &ev);
  if (st == DF_OK && out->num_blocks == 0 && !df_ctx_measuring(ctx)) // a memory plan reads back zeros
    st = DF_FAIL(err, DF_ERR_INVALID, src->label, "evaluate on data with supervised tokens (loss_mask = 1)",
                 "no sample of the eval data has two adjacent supervised tokens: nothing to evaluate");
  if (st != DF_OK) {
    df_eval_report_free(out);
    return st;
  }
  eval_finish(out);
  out->seconds = now_s() - t0;
  return DF_OK;
}

df_status df_evaluate(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_frozen *frozen,
                      const char *data_path, const df_eval_options *opt, df_eval_report *out, df_error *err) {
  memset(out, 0, sizeof *out);
  df_batch_source *src = NULL;
  DF_TRY(df_hs_source_open(data_path, cfg, false, &src, err));
  df_status st = df_evaluate_source(ctx, m, cfg, frozen, src, opt, out, err);
  df_batch_source_close(src);
  return st;
}

// ---- output ----------------------------------------------------------------------------------------------

void df_eval_report_print(const df_eval_report *r, FILE *fp) {
  fprintf(fp, "eval: %lld samples, %lld blocks of %lld (%.2f s)\n", (long long)r->num_samples, (long long)r->num_blocks,
          (long long)r->block_size, r->seconds);
  fprintf(fp, "  loss %.6f   acc %.4f (%.0f/%.0f)   accept_len τ %.4f\n", r->loss, r->acc, r->acc_num, r->acc_den,
          r->accept_len);
  if (r->summary[0]) fprintf(fp, "  %s: %s\n", r->strategy, r->summary);
  fprintf(fp, "  per-position acc:");
  // DFlash slot 0 is the anchor token (never supervised); a DSpark slot 0 predicts the token after it.
  for (int64_t k = r->first_position; k < r->block_size; k++)
    fprintf(fp, " %.3f", r->pos_acc_den[k] > 0 ? r->pos_acc_num[k] / r->pos_acc_den[k] : NAN);
  fprintf(fp, "\n");
  if (r->skipped_samples)
    fprintf(fp, "  (%lld samples without two adjacent supervised tokens have no block)\n",
            (long long)r->skipped_samples);
  for (int i = 0; i < r->nonfinite.nreported; i++) {
    char t[900];
    df_hs_bad_value_text(&r->nonfinite.bad[i], t, sizeof t);
    fprintf(fp, "  warning: %s\n", t);
  }
  if (r->nonfinite.bad_samples > r->nonfinite.nreported)
    fprintf(fp, "  warning: and %lld more samples with NaN/Inf hidden states\n",
            (long long)(r->nonfinite.bad_samples - r->nonfinite.nreported));
}

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static json_t *report_json(const df_eval_report *r, const char *checkpoint, const char *data) {
  json_t *o = json_object(), *pos = json_array();
  for (int64_t k = 0; k < r->block_size; k++)
    json_array_append_new(pos, r->pos_acc_den[k] > 0 ? json_real(r->pos_acc_num[k] / r->pos_acc_den[k]) : json_null());
  if (checkpoint) json_object_set_new(o, "checkpoint", json_string(checkpoint));
  if (data) json_object_set_new(o, "data", json_string(data));
  json_object_set_new(o, "loss", num_or_null(r->loss));
  json_object_set_new(o, "acc", num_or_null(r->acc));
  json_object_set_new(o, "accept_len", num_or_null(r->accept_len));
  json_object_set_new(o, "per_position_acc", pos);
  json_object_set_new(o, "loss_num", json_real(r->loss_num));
  json_object_set_new(o, "loss_den", json_real(r->loss_den));
  json_object_set_new(o, "acc_num", json_real(r->acc_num));
  json_object_set_new(o, "acc_den", json_real(r->acc_den));
  json_object_set_new(o, "num_samples", json_integer(r->num_samples));
  json_object_set_new(o, "num_batches", json_integer(r->num_batches));
  json_object_set_new(o, "skipped_samples", json_integer(r->skipped_samples));
  json_object_set_new(o, "num_blocks", json_integer(r->num_blocks));
  json_object_set_new(o, "block_size", json_integer(r->block_size));
  json_object_set_new(o, "seconds", json_real(r->seconds));
  if (r->report) json_object_update(o, r->report);
  if (r->nonfinite.bad_samples) {
    json_t *bad = json_array();
    for (int i = 0; i < r->nonfinite.nreported; i++)
      json_array_append_new(bad, json_integer(r->nonfinite.bad[i].sample));
    json_object_set_new(o, "nonfinite_samples", bad);
  }
  return o;
}

df_status df_eval_report_write_json(const df_eval_report *r, const char *checkpoint, const char *data, const char *path,
                                    df_error *err) {
  json_t *o = report_json(r, checkpoint, data);
  df_status st = df_write_json_atomic(path, o, JSON_INDENT(2),
                                      "check that the directory exists and is writable (or pass --out FILE)", err);
  json_decref(o);
  return st;
}
