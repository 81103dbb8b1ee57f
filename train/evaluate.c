// Held-out evaluation (train/evaluate.h): file-order batches, the DFlash forward and objective without a
// backward, and counts summed over the whole set before any ratio is taken.
#include "train/evaluate.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

// Forward-only on one batch: anchors, block rows and their embeddings, the draft, and the DFlash objective.
// met is zeroed (nothing to add) when no sample of the batch has an anchor candidate.
static df_status eval_batch(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                            const df_batch *bt, const df_eval_options *o, df_dflash_metrics *met, int64_t *skipped,
                            df_error *err) {
  memset(met, 0, sizeof *met);
  df_dflash_anchors a = {0};
  df_dflash_blocks blk = {0};
  float *embed = NULL;
  const float *hidden = NULL;
  df_status st = eval_anchors(bt, o, &a, skipped, err);
  if (st != DF_OK || a.N == 0) {
    df_dflash_anchors_free(&a);
    return st;
  }
  st = df_dflash_build_blocks(bt->input_ids, bt->loss_mask, bt->S, &a, cfg->block_size, o->mask_token_id,
                              o->loss_decay_gamma, &blk, err);
  int64_t R = bt->B * a.N * cfg->block_size, H = fz->hidden;
  if (st == DF_OK && !(embed = malloc((size_t)(R * H) * sizeof *embed)))
    st = DF_FAIL(err, DF_ERR_NOMEM, "eval block rows", "lower training.num_anchors or training.batch_size",
                 "out of memory for %lld block rows of width %lld", (long long)R, (long long)H);
  if (st == DF_OK) {
    df_tensor table = df_f32((float *)fz->embed, fz->vocab, H), ids = df_i32(blk.input_ids, R);
    df_tensor out = df_f32(embed, R, H);
    st = df_embedding_forward(ctx, &table, &ids, &out, err);
  }
  if (st == DF_OK) {
    df_dflash_batch mb = {bt->B, bt->S, a.N, bt->hidden, embed, a.anchors, a.keep};
    st = df_dflash_model_forward(m, &mb, &hidden, err);
  }
  if (st == DF_OK) {
    df_tensor h = df_f32((float *)hidden, R, H), head = df_f32((float *)fz->lm_head, fz->vocab, H);
    df_dflash_loss_options lo = {.type = DF_LOSS_DFLASH, .chunk_blocks = o->chunk_blocks};
    st = df_dflash_objective(ctx, &lo, &h, &head, &blk, &a, NULL, met, err);
  }
  free(embed);
  df_dflash_blocks_free(&blk);
  df_dflash_anchors_free(&a);
  return st;
}

static void eval_add(df_eval_report *r, const df_dflash_metrics *m) {
  r->loss_num += m->loss_num, r->loss_den += m->loss_den;
  r->acc_num += m->acc_num, r->acc_den += m->acc_den;
  r->num_blocks += m->num_blocks;
  r->accept_len_sum += m->accept_len_sum;
  for (int64_t k = 0; k < r->block_size && m->pos_acc_num; k++)
    r->pos_acc_num[k] += m->pos_acc_num[k], r->pos_acc_den[k] += m->pos_acc_den[k];
}

static void eval_finish(df_eval_report *r) {
  r->loss = r->loss_den > 0 ? r->loss_num / r->loss_den : NAN;
  r->acc = r->acc_den > 0 ? r->acc_num / r->acc_den : NAN;
  r->accept_len = r->num_blocks > 0 ? r->accept_len_sum / (double)r->num_blocks : NAN;
}

static df_status eval_loop(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *fz,
                           df_hs_dataset *ds, const df_eval_options *o, df_eval_report *r, df_error *err) {
  int64_t n = df_hs_get_info(ds)->num_samples;
  if (o->max_samples > 0 && o->max_samples < n) n = o->max_samples;
  int64_t *index = malloc((size_t)o->batch_size * sizeof *index);
  if (!index) return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  df_status st = DF_OK;
  for (int64_t first = 0; first < n && st == DF_OK; first += o->batch_size) {
    int64_t B = n - first < o->batch_size ? n - first : o->batch_size;
    for (int64_t i = 0; i < B; i++) index[i] = first + i;
    df_batch bt;
    st = df_batch_read(ds, index, B, o->max_length, &bt, err);
    if (st != DF_OK) break;
    r->num_samples += B, r->num_batches++;
    df_dflash_metrics met;
    st = eval_batch(ctx, m, cfg, fz, &bt, o, &met, &r->skipped_samples, err);
    if (st == DF_OK) eval_add(r, &met);
    df_dflash_metrics_free(&met);
    df_batch_free(&bt);
  }
  free(index);
  return st;
}

df_status df_evaluate(df_ctx *ctx, df_dflash_model *m, const df_draft_config *cfg, const df_step_frozen *frozen,
                      const char *data_path, const df_eval_options *opt, df_eval_report *out, df_error *err) {
  memset(out, 0, sizeof *out);
  DF_TRY(eval_check(cfg, frozen, opt, err));
  double t0 = now_s();
  out->block_size = cfg->block_size;
  out->pos_acc_num = calloc((size_t)cfg->block_size, sizeof(double));
  out->pos_acc_den = calloc((size_t)cfg->block_size, sizeof(double));
  if (!out->pos_acc_num || !out->pos_acc_den) {
    df_eval_report_free(out);
    return DF_FAIL(err, DF_ERR_NOMEM, "eval", NULL, "out of memory");
  }
  df_hs_dataset *ds = NULL;
  df_status st = df_hs_open(data_path, &ds, err);
  if (st == DF_OK)
    st = df_hs_check_target(ds, cfg->dflash.num_target_layer_ids, cfg->dflash.target_layer_ids, cfg->hidden_size, err);
  // MoE: eval forwards route with the running centering mean, apply and stash nothing and have no aux loss
  // (the loss is the objective alone); the model is handed back in training mode.
  df_dflash_model_set_training(m, false);
  if (st == DF_OK) st = eval_loop(ctx, m, cfg, frozen, ds, opt, out, err);
  df_dflash_model_set_training(m, true);
  df_hs_close(ds);
  if (st == DF_OK && out->num_blocks == 0)
    st = DF_FAIL(err, DF_ERR_INVALID, data_path, "evaluate on data with supervised tokens (loss_mask = 1)",
                 "no sample of the eval data has two adjacent supervised tokens: nothing to evaluate");
  if (st != DF_OK) {
    df_eval_report_free(out);
    return st;
  }
  eval_finish(out);
  out->seconds = now_s() - t0;
  return DF_OK;
}

// ---- output ----------------------------------------------------------------------------------------------

void df_eval_report_print(const df_eval_report *r, FILE *fp) {
  fprintf(fp, "eval: %lld samples, %lld blocks of %lld (%.2f s)\n", (long long)r->num_samples, (long long)r->num_blocks,
          (long long)r->block_size, r->seconds);
  fprintf(fp, "  loss %.6f   acc %.4f (%.0f/%.0f)   accept_len τ %.4f\n", r->loss, r->acc, r->acc_num, r->acc_den,
          r->accept_len);
  fprintf(fp, "  per-position acc:");
  for (int64_t k = 1; k < r->block_size; k++)
    fprintf(fp, " %.3f", r->pos_acc_den[k] > 0 ? r->pos_acc_num[k] / r->pos_acc_den[k] : NAN);
  fprintf(fp, "\n");
  if (r->skipped_samples)
    fprintf(fp, "  (%lld samples without two adjacent supervised tokens have no block)\n",
            (long long)r->skipped_samples);
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
  return o;
}

df_status df_eval_report_write_json(const df_eval_report *r, const char *checkpoint, const char *data, const char *path,
                                    df_error *err) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  json_t *o = report_json(r, checkpoint, data);
  FILE *fp = fopen(tmp, "w");
  bool ok = fp && json_dumpf(o, fp, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) == 0 && fputc('\n', fp) != EOF;
  ok = fp && fflush(fp) == 0 && fsync(fileno(fp)) == 0 && ok;
  if (fp) ok = fclose(fp) == 0 && ok;
  json_decref(o);
  if (ok && rename(tmp, path) == 0) return DF_OK;
  int e = errno;
  remove(tmp);
  return DF_FAIL(err, DF_ERR_IO, path, "check that the directory exists and is writable (or pass --out FILE)",
                 "cannot write the eval report: %s", strerror(e));
}
