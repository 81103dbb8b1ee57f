// Held-out evaluation (train/eval/evaluate.h): file-order batches, the draft forward and its objective (DFlash's, or
// DSpark's for a DSpark draft) without a backward, and counts summed over the whole set before any ratio is taken.
#include "train/eval/evaluate.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fsutil.h"
#include "train/step/stage.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

df_eval_options df_eval_options_from_recipe(const df_recipe *rc, int64_t mask_token_id) {
  return (df_eval_options){.batch_size = rc->training.batch_size,
                           .max_length = rc->data.max_length,
                           .num_anchors = rc->training.num_anchors,
                           .loss_decay_gamma = rc->training.loss_decay_gamma,
                           .mask_token_id = mask_token_id,
                           .chunk_blocks = rc->training.objective_chunk_blocks,
                           .seed = rc->training.seed,
                           .dspark = {.set = true,
                                      .ce_alpha = rc->training.dspark_ce_loss_alpha,
                                      .l1_alpha = rc->training.dspark_l1_loss_alpha,
                                      .conf_alpha = rc->training.dspark_confidence_head_alpha}};
}

void df_eval_report_free(df_eval_report *r) {
  if (!r) return;
  free(r->pos_acc_num), free(r->pos_acc_den);
  r->pos_acc_num = r->pos_acc_den = NULL;
}

// Candidates of one sample: p <= len−2 with loss_mask[p] and loss_mask[p+1] (strategies/dflash.h).
static int64_t count_candidates(const uint8_t *mask, int64_t len) {
  int64_t c = 0;
  for (int64_t p = 0; p + 1 < len; p++) c += mask[p] && mask[p + 1];
  return c;
}

// Anchors drawn per sample from df_dflash_sampler_init(seed + sample index), so a sample's blocks depend
// neither on the batch it lands in nor on the padding: the report is the same for every batch size. Rows are
// padded to the batch's largest block count with keep = 0 blocks. out->N = 0 when no sample has a candidate.
static df_status eval_anchors(const df_batch *bt, const df_eval_options *o, df_dflash_anchors *out, int64_t *skipped,
                              df_error *err) {
  memset(out, 0, sizeof *out);
  out->B = bt->B;
  if (!(out->candidates = calloc((size_t)bt->B, sizeof *out->candidates)))
    return DF_FAIL(err, DF_ERR_NOMEM, "eval anchors", NULL, "out of memory");
  for (int64_t i = 0; i < bt->B; i++) {
    out->candidates[i] = count_candidates(bt->loss_mask + i * bt->S, bt->length[i]);
    int64_t n = out->candidates[i] < o->num_anchors ? out->candidates[i] : o->num_anchors;
    if (n > out->N) out->N = n;
    *skipped += out->candidates[i] == 0;
  }
  if (out->N == 0) return DF_OK;
  out->anchors = calloc((size_t)(bt->B * out->N), sizeof *out->anchors);
  out->keep = calloc((size_t)(bt->B * out->N), 1);
  if (!out->anchors || !out->keep) return DF_FAIL(err, DF_ERR_NOMEM, "eval anchors", NULL, "out of memory");
  for (int64_t i = 0; i < bt->B; i++) {
    if (!out->candidates[i]) continue;
    df_dflash_sampler s;
    df_dflash_sampler_init(&s, o->seed + (uint64_t)bt->index[i]);
    df_dflash_anchors one;
    DF_TRY(df_dflash_sample_anchors(&s, bt->loss_mask + i * bt->S, 1, bt->length[i], o->num_anchors, &one, err));
    memcpy(out->anchors + i * out->N, one.anchors, (size_t)one.N * sizeof *one.anchors);
    memcpy(out->keep + i * out->N, one.keep, (size_t)one.N);
    df_dflash_anchors_free(&one);
  }
  return DF_OK;
}

static df_status eval_check(const df_draft_config *cfg, const df_step_frozen *fz, const df_eval_options *o,
                            df_error *err) {
  if (o->batch_size < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.batch_size", "use a batch size >= 1", "eval batch size %lld",
                   (long long)o->batch_size);
  if (o->num_anchors < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "training.num_anchors", "use at least one anchor per sample",
                   "eval num_anchors %lld", (long long)o->num_anchors);
  if (o->mask_token_id < 0 || o->mask_token_id >= fz->vocab)
    return DF_FAIL(err, DF_ERR_INVALID, "model.mask_token_id", "the mask token must be a row of the target embedding",
                   "mask_token_id %lld outside the vocabulary of %lld", (long long)o->mask_token_id,
                   (long long)fz->vocab);
  if (fz->hidden != cfg->hidden_size)
    return DF_FAIL(err, DF_ERR_INVALID, "hidden_size", "the target pieces must come from the draft's target",
                   "target hidden size %lld, draft %lld", (long long)fz->hidden, (long long)cfg->hidden_size);
  return DF_OK;
}

// The stage and the one stats vector of an evaluation: every batch adds its sums on the device, read back once.
typedef struct {
  df_stage *stage;
  void *buf;
  df_tensor stats; // DF_DSPARK_STATS(bs) f64: the kind's sums (train/step/stage.h)
  double loss_den; // Σ over batches, known on the host
} eval_state;

// The DFlash eval objective is the plain CE whatever the training loss_type; DSpark's is its own, forward only.
static df_dflash_loss_options dflash_loss(const df_eval_options *o) {
  return (df_dflash_loss_options){.type = DF_LOSS_DFLASH, .chunk_blocks = o->chunk_blocks};
}

// The loss weights and chunking of the DSpark objective; grad_scale 0 (no backward runs anyway).
static df_dspark_loss_options dspark_loss(const df_eval_options *o) {
  df_dspark_loss_options lo = {.ce_alpha = 0.1, .l1_alpha = 0.9, .conf_alpha = 1.0}; // SpecForge's defaults
  if (o->dspark.set)
    lo.ce_alpha = o->dspark.ce_alpha, lo.l1_alpha = o->dspark.l1_alpha, lo.conf_alpha = o->dspark.conf_alpha;
  lo.chunk_blocks = o->chunk_blocks;
  return lo;
}

static df_status eval_state_open(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                                 const df_eval_options *o, eval_state *ev, df_error *err) {
  memset(ev, 0, sizeof *ev);
  df_dspark_loss_options lo = dspark_loss(o);
  df_dspark_terms t = df_dspark_objective_terms(&lo, df_draft_model_dspark_heads(m));
  df_stage_spec spec = {.kind = cfg->kind,
                        .block_size = cfg->block_size,
                        .vocab = fz->vocab,
                        .hidden = fz->hidden,
                        .mask_token_id = o->mask_token_id,
                        .loss_decay_gamma = o->loss_decay_gamma,
                        .loss_type = DF_LOSS_DFLASH,
                        .teacher = cfg->kind == DF_DRAFT_DSPARK && t.teacher,
                        .markov_rank = t.rank};
  DF_TRY(df_stage_create(ctx, &spec, &ev->stage, err));
  const int64_t ns = DF_DSPARK_STATS(cfg->block_size);
  DF_TRY(df_buffer_alloc(ctx, sizeof(double) * (size_t)ns, &ev->buf, err));
  ev->stats = df_f64_on(df_ctx_device(ctx), ev->buf, ns);
  return df_fill(ctx, &ev->stats, 0.0, err);
}

static void eval_state_close(df_ctx *ctx, eval_state *ev) {
  df_stage_free(ev->stage);
  df_buffer_free(ctx, ev->buf);
}

// Forward-only on one batch with the draft's objective, its sums added to ev->stats. Nothing to add when no sample
// of the batch has an anchor candidate.
static df_status eval_batch(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                            const df_batch *bt, const df_eval_options *o, eval_state *ev, int64_t *skipped,
                            df_error *err) {
  df_dflash_anchors a;
  df_status st = eval_anchors(bt, o, &a, skipped, err);
  df_staged sg;
  df_tensor hidden;
  if (st == DF_OK && a.N > 0) st = df_stage_prepare(ev->stage, bt, &a, &sg, err);
  if (st == DF_OK && a.N > 0) st = df_stage_forward(ctx, m, fz->embed, fz->vocab, &sg, &hidden, err);
  if (st == DF_OK && a.N > 0) {
    df_tensor head = df_f32_on(df_ctx_device(ctx), fz->lm_head, fz->vocab, fz->hidden);
    if (cfg->kind == DF_DRAFT_DSPARK) {
      df_dspark_loss_options lo = dspark_loss(o);
      st = df_dspark_objective_rows(ctx, &lo, df_draft_model_dspark_heads(m), &hidden, &head,
                                    sg.last_hidden.data ? &sg.last_hidden : NULL, &sg.dspark, &sg.dspark_w, NULL,
                                    &ev->stats, err);
    } else {
      df_dflash_loss_options lo = dflash_loss(o);
      st = df_dflash_objective_rows(ctx, &lo, &hidden, &head, &sg.dflash, &sg.dflash_w, NULL, &ev->stats, err);
    }
    ev->loss_den += sg.loss_den;
  }
  df_dflash_anchors_free(&a);
  return st;
}

static double ratio_or_nan(bool ran, double num, double den) { return ran && den > 0 ? num / den : NAN; }

static void eval_finish(df_eval_report *r) {
  r->loss = r->loss_den > 0 ? r->loss_num / r->loss_den : NAN;
  r->acc = r->acc_den > 0 ? r->acc_num / r->acc_den : NAN;
  r->accept_len = r->num_blocks > 0 ? r->accept_len_sum / (double)r->num_blocks : NAN;
  bool ds = r->dspark, t = ds && r->has_teacher, c = ds && r->has_confidence;
  r->ce_loss = ratio_or_nan(ds, r->ce_num, r->loss_den);
  r->l1_loss = ratio_or_nan(t, r->l1_num, r->loss_den);
  r->confidence_loss = ratio_or_nan(c, r->conf_num, r->loss_den);
  r->confidence_abs_error = ratio_or_nan(c, r->conf_err_num, r->loss_den);
  r->teacher_agreement = ratio_or_nan(t, r->teacher_agree_num, r->acc_den);
  r->tau_probabilistic = ratio_or_nan(t, r->tau_num, r->tau_den);
}

// Whether the objective reads the teacher (target_last_hidden_states): the L1 term or an active confidence head,
// as df_dspark_objective decides.
static bool dspark_needs_teacher(df_draft_model *m, const df_eval_options *o) {
  df_dspark_loss_options lo = dspark_loss(o);
  return df_dspark_objective_terms(&lo, df_draft_model_dspark_heads(m)).teacher;
}

// The report's sums from the stats read back once at the end.
static df_status eval_collect(df_ctx *ctx, df_draft_model *m, const df_eval_options *o, const eval_state *ev,
                              df_eval_report *r, df_error *err) {
  const int64_t ns = df_numel(&ev->stats), bs = r->block_size;
  double *st = malloc(sizeof(double) * (size_t)ns);
  if (!st) return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  df_status rc = df_copy(ctx, st, DF_DEV_CPU, ev->stats.data, df_ctx_device(ctx), sizeof(double) * (size_t)ns, err);
  r->loss_den = ev->loss_den;
  if (rc == DF_OK && !r->dspark) {
    r->loss_num = st[DF_BSTAT_LOSS_NUM], r->acc_num = st[DF_BSTAT_ACC_NUM], r->acc_den = st[DF_BSTAT_ACC_DEN];
    r->accept_len_sum = st[DF_BSTAT_ACCEPT_SUM], r->num_blocks = (int64_t)st[DF_BSTAT_BLOCKS];
    memcpy(r->pos_acc_num, st + DF_BSTAT_POS, sizeof(double) * (size_t)bs);
    memcpy(r->pos_acc_den, st + DF_BSTAT_POS + bs, sizeof(double) * (size_t)bs);
  }
  if (rc == DF_OK && r->dspark) {
    df_dspark_loss_options lo = dspark_loss(o);
    df_dspark_metrics m2;
    rc = df_dspark_metrics_from_stats(st, bs, ev->loss_den, &lo,
                                      df_dspark_objective_terms(&lo, df_draft_model_dspark_heads(m)), &m2, err);
    if (rc == DF_OK) {
      r->loss_num = m2.loss_num;
      r->acc_num = m2.acc_num, r->acc_den = m2.eval_den;
      r->num_blocks = m2.num_blocks, r->accept_len_sum = m2.greedy_accept_sum;
      r->ce_num = m2.ce_num, r->l1_num = m2.l1_num, r->conf_num = m2.conf_num, r->conf_err_num = m2.conf_err_num;
      r->teacher_agree_num = m2.teacher_agree_num, r->tau_num = m2.tau_num, r->tau_den = m2.tau_den;
      r->has_teacher = m2.has_teacher, r->has_confidence = m2.has_confidence;
      memcpy(r->pos_acc_num, m2.pos_acc_num, sizeof(double) * (size_t)bs);
      memcpy(r->pos_acc_den, m2.pos_den, sizeof(double) * (size_t)bs);
      df_dspark_metrics_free(&m2);
    }
  }
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

static df_status eval_loop(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                           df_batch_source *src, const df_eval_options *o, df_eval_report *r, df_error *err) {
  int64_t n = src->num_samples;
  if (o->max_samples > 0 && o->max_samples < n) n = o->max_samples;
  bool teacher = r->dspark && dspark_needs_teacher(m, o); // DSpark: read target_last_hidden_states too
  int64_t *index = malloc((size_t)o->batch_size * sizeof *index);
  if (!index) return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  eval_state ev;
  df_status st = eval_state_open(ctx, m, cfg, fz, o, &ev, err);
  // The stage packs each batch into its own page-locked slot, so the batch's memory can go as soon as it is staged.
  for (int64_t first = 0; first < n && st == DF_OK; first += o->batch_size) {
    int64_t B = n - first < o->batch_size ? n - first : o->batch_size;
    for (int64_t i = 0; i < B; i++) index[i] = first + i;
    df_batch bt;
    st = df_batch_source_read(src, index, B, o->max_length, teacher, &bt, err);
    if (st != DF_OK) break;
    note_nonfinite(df_batch_source_dataset(src), &bt, &r->nonfinite);
    r->num_samples += B, r->num_batches++;
    st = eval_batch(ctx, m, cfg, fz, &bt, o, &ev, &r->skipped_samples, err);
    df_batch_free(&bt);
  }
  if (st == DF_OK) st = eval_collect(ctx, m, o, &ev, r, err);
  eval_state_close(ctx, &ev);
  free(index);
  return st;
}

df_status df_evaluate_source(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                             df_batch_source *src, const df_eval_options *opt, df_eval_report *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(eval_check(cfg, frozen, opt, err));
  double t0 = now_s();
  out->block_size = cfg->block_size;
  out->dspark = cfg->kind == DF_DRAFT_DSPARK;
  out->pos_acc_num = calloc((size_t)cfg->block_size, sizeof(double));
  out->pos_acc_den = calloc((size_t)cfg->block_size, sizeof(double));
  if (!out->pos_acc_num || !out->pos_acc_den) {
    df_eval_report_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  }
  df_status st = DF_OK;
  if (out->dspark && dspark_needs_teacher(m, opt) && !src->has_last_hidden)
    st = DF_FAIL(err, DF_ERR_INVALID, "target_last_hidden_states",
                 "capture the eval data with target_last_hidden_states (DSpark needs the target's final hidden states)",
                 "the eval data %s has no target_last_hidden_states, which this draft's objective reads", src->label);
  // MoE: eval forwards route with the running centering mean, apply and stash nothing and have no aux loss
  // (the loss is the objective alone); the model is handed back in training mode.
  df_draft_model_set_training(m, false);
  if (st == DF_OK) st = eval_loop(ctx, m, cfg, frozen, src, opt, out, err);
  df_draft_model_set_training(m, true);
  if (st == DF_OK && out->num_blocks == 0)
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

df_status df_evaluate(df_ctx *ctx, df_draft_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
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
  if (r->dspark)
    fprintf(fp, "  dspark: ce_loss %.6f   l1_loss %.6f   confidence_loss %.6f   tau_probabilistic %.4f\n", r->ce_loss,
            r->l1_loss, r->confidence_loss, r->tau_probabilistic);
  fprintf(fp, "  per-position acc:");
  // DFlash slot 0 is the anchor token (never supervised); a DSpark slot 0 predicts the token after it.
  for (int64_t k = r->dspark ? 0 : 1; k < r->block_size; k++)
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

// DSpark: SpecForge's ratio metrics (null when the term did not run) and the numerators behind them.
static void dspark_json(json_t *o, const df_eval_report *r) {
  json_object_set_new(o, "strategy", json_string("dspark"));
  const char *keys[] = {
      "ce_loss", "l1_loss", "confidence_loss", "confidence_abs_error",     "teacher_agreement",     "tau_probabilistic",
      "ce_num",  "l1_num",  "confidence_num",  "confidence_abs_error_num", "teacher_agreement_num", "tau_num",
      "tau_den"};
  const double vals[] = {
      r->ce_loss, r->l1_loss, r->confidence_loss, r->confidence_abs_error, r->teacher_agreement, r->tau_probabilistic,
      r->ce_num,  r->l1_num,  r->conf_num,        r->conf_err_num,         r->teacher_agree_num, r->tau_num,
      r->tau_den};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) json_object_set_new(o, keys[i], num_or_null(vals[i]));
}

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
  if (r->dspark) dspark_json(o, r);
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
