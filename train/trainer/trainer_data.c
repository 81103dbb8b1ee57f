// The trainer's data checks (train/trainer/trainer_internal.h): every data path validated at start-up with a NaN/Inf
// scan, and the samples behind a skipped step named.
#include <stdlib.h>
#include <string.h>

#include "train/data/hs_scan.h"
#include "train/trainer/trainer_internal.h"

// Opens path (validating every shard), checks it was captured for the draft, and scans it for NaN/Inf.
static df_status check_one(const df_trainer *t, const char *path, const char *key, df_hs_scan_report *rep,
                           df_error *err) {
  df_hs_dataset *ds = NULL;
  df_status st = df_hs_open(path, &ds, err);
  if (st != DF_OK) {
    // name the recipe key first: the data is found missing now, not at the first eval
    char msg[sizeof err->msg];
    memcpy(msg, err->msg, sizeof msg);
    snprintf(err->msg, sizeof err->msg, "%s: %.470s", key, msg);
    snprintf(err->where, sizeof err->where, "%s", key);
    return st;
  }
  const df_draft_config *c = t->draft;
  st = df_hs_check_target(ds, c->dflash.num_target_layer_ids, c->dflash.target_layer_ids, c->hidden_size, err);
  memset(rep, 0, sizeof *rep);
  df_data_scan mode = t->opt->data_scan;
  if (st == DF_OK && mode != DF_DATA_SCAN_NONE)
    st = df_hs_scan(ds, mode == DF_DATA_SCAN_FULL ? DF_HS_SCAN_FULL : DF_HS_SCAN_SAMPLED, rep, err);
  if (st == DF_OK && rep->bad_samples) st = df_hs_scan_fail(rep, key, err);
  df_hs_close(ds);
  return st;
}

df_status df_trainer_check_data(df_trainer *t, df_error *err) {
  const df_recipe *rc = t->recipe;
  df_hs_scan_report tr, ev = {0};
  if (!rc->data.hidden_states_path) { // online data: the target computes the features; its sources open at start-up
    if (t->log) fprintf(t->log, "data check: online data, read and checked by the target's source at start-up\n");
    return DF_OK;
  }
  DF_TRY(check_one(t, rc->data.hidden_states_path, "data.hidden_states_path", &tr, err));
  const char *eval = rc->data.eval_hidden_states_path;
  if (eval) DF_TRY(check_one(t, eval, "data.eval_hidden_states_path", &ev, err));
  if (!t->log) return DF_OK;
  if (t->opt->data_scan == DF_DATA_SCAN_NONE) {
    fprintf(t->log, "data check: shards valid; NaN/Inf scan off (--data-scan none)\n");
    return DF_OK;
  }
  char a[128], b[128] = "";
  df_hs_scan_summary(&tr, a, sizeof a);
  if (eval) df_hs_scan_summary(&ev, b, sizeof b);
  bool full = t->opt->data_scan == DF_DATA_SCAN_FULL;
  fprintf(t->log, "data check: shards valid, no NaN/Inf hidden states (%s scan: train %s%s%s%s)\n",
          full ? "full" : "sampled", a, eval ? ", eval " : "", b, full ? "" : "; --data-scan full reads every sample");
  return DF_OK;
}

void df_trainer_note_batch(df_trainer *t, const int64_t *index, int64_t B, bool reset) {
  if (reset) t->n_win_samples = 0;
  if (t->n_win_samples + B > t->cap_win_samples) {
    int64_t cap = 2 * (t->n_win_samples + B);
    int64_t *g = realloc(t->win_samples, (size_t)cap * sizeof *g);
    if (!g) return; // the names are a courtesy: without memory the skip is reported without them
    t->win_samples = g, t->cap_win_samples = cap;
  }
  memcpy(t->win_samples + t->n_win_samples, index, (size_t)B * sizeof *index);
  t->n_win_samples += B;
}

void df_trainer_explain_skip(df_trainer *t, char *detail, size_t n, json_t **samples) {
  *samples = json_array();
  detail[0] = 0;
  df_hs_dataset *ds = NULL;
  df_hs_scan_report rep;
  df_error e = {0};
  if (!t->recipe->data.hidden_states_path) {
    snprintf(detail, n, "the window's %lld samples are online features (no captured data to re-read)",
             (long long)t->n_win_samples);
    return;
  }
  if (df_hs_open(t->recipe->data.hidden_states_path, &ds, &e) != DF_OK ||
      df_hs_scan_samples(ds, t->win_samples, t->n_win_samples, &rep, &e) != DF_OK) {
    snprintf(detail, n, "the window's samples could not be re-read: %s", e.msg);
    df_hs_close(ds);
    return;
  }
  df_hs_close(ds);
  if (!rep.bad_samples) {
    snprintf(detail, n,
             "the window's %lld samples hold finite hidden states: the non-finite value comes from the "
             "model (lower training.learning_rate or training.max_grad_norm)",
             (long long)t->n_win_samples);
    return;
  }
  char first[900];
  df_hs_bad_value_text(&rep.bad[0], first, sizeof first);
  snprintf(detail, n, "%lld sample(s) of the window hold NaN/Inf hidden states: %s%s", (long long)rep.bad_samples,
           first, rep.bad_samples > 1 ? " (and more: see skip_samples in metrics.jsonl)" : "");
  for (int i = 0; i < rep.nreported; i++) json_array_append_new(*samples, json_integer(rep.bad[i].sample));
}
