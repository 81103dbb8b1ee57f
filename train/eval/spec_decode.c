// Speculative decoding (train/eval/spec_decode.h): per round the draft's strategy proposes tokens after the last
// committed one (strategies/strategy.h draft: a block strategy runs one block [last token, MASK × (bs−1)] over the
// context features of positions < start, as it trains, and reads its proposals from it — DFlash's slots 1..bs−1,
// DSpark's every slot with the Markov bias of the previous token, as SGLang's DSpark worker decodes it; EAGLE-3 drafts
// autoregressively with its own KV cache). The target then verifies [last token, proposals]. Everything the target
// and the draft compute stays on the context's device: the context features never leave it; the strategy uploads
// what it builds and reads back the logits it needs.
#include "train/eval/spec_decode.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "strategies/strategy.h"
#include "train/data/capture.h"
#include "train/data/token_jsonl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  df_target *t;
  df_draft_model *m;
  const df_draft_config *cfg;
  const df_spec_options *o;
  df_ctx *ctx;
  df_device dev;
  df_target_cache *cache;
  int64_t cap, H, V, K, nprop;
  int32_t eos[DF_TARGET_MAX_EOS];
  int n_eos;
  df_strategy_run *strategy; // the draft's strategy, opened for eval: its drafting rounds
  df_strategy_values values; // its keys (num_steps), read while it drafts
  df_strategy_value_list list;
  df_strategy_value steps;
  int32_t *seq, *greedy, *verify, *targ; // host
  float *feats, *vfeats;                 // the context's device: committed and verified features
} sd_run;

static void sd_free_device(sd_run *r) {
  df_buffer_free(r->ctx, r->feats), df_buffer_free(r->ctx, r->vfeats);
  r->feats = r->vfeats = NULL;
}

static void sd_free(sd_run *r) {
  df_target_cache_free(r->cache);
  free(r->seq), free(r->greedy), free(r->verify), free(r->targ);
  sd_free_device(r);
  df_strategy_close(r->strategy);
}

void df_spec_report_free(df_spec_report *r) {
  free(r->reached), free(r->accepted);
  r->reached = r->accepted = NULL;
}

static bool is_eos(const sd_run *r, int32_t tok) {
  for (int i = 0; i < r->n_eos; i++)
    if (r->eos[i] == tok) return true;
  return false;
}

// The draft's proposals after seq[start] (the strategy's drafting round over the committed features).
static df_status propose(sd_run *r, int64_t start, int32_t *props, df_error *err) {
  const df_draft_round in = {.feats = r->feats,
                             .cap = r->cap,
                             .seq = r->seq,
                             .start = start,
                             .embed = df_target_embed(r->t),
                             .lm_head = df_target_lm_head(r->t)};
  return r->strategy->table->draft(r->strategy, &in, props, err);
}

// Speculative decoding of one prompt into r->seq[P ..]; *n receives the generated count (<= max_new).
static df_status decode_one(sd_run *r, const int32_t *prompt, int64_t P, int64_t *n, df_spec_report *rep,
                            df_error *err) {
  const int64_t max_new = r->o->max_new_tokens, W = r->K * r->H;
  const int *lids = r->cfg->dflash.target_layer_ids;
  memcpy(r->seq, prompt, sizeof *prompt * (size_t)P);
  DF_TRY(df_target_cache_truncate(r->cache, 0, err));
  df_target_outputs pre = {
      .num_capture = (int)r->K, .capture_ids = lids, .captured = r->feats, .logits_from = P - 1, .argmax = &r->seq[P]};
  DF_TRY(df_target_forward(r->t, r->cache, prompt, P, &pre, err));
  rep->target_forwards++;
  if (r->strategy->table->draft_reset) r->strategy->table->draft_reset(r->strategy);
  *n = 1;
  int32_t *props = r->verify + 1;
  while (*n < max_new && !is_eos(r, r->seq[P + *n - 1])) {
    const int64_t start = P + *n - 1;
    DF_TRY(propose(r, start, props, err));
    r->verify[0] = r->seq[start];
    df_target_outputs v = {
        .num_capture = (int)r->K, .capture_ids = lids, .captured = r->vfeats, .logits_from = 0, .argmax = r->targ};
    DF_TRY(df_target_forward(r->t, r->cache, r->verify, r->nprop + 1, &v, err));
    rep->target_forwards++, rep->verifications++;
    int64_t a = 0;
    while (a < r->nprop && props[a] == r->targ[a]) a++;
    for (int64_t k = 0; k < r->nprop && k <= a; k++) {
      rep->reached[k]++;
      rep->accepted[k] += k < a;
    }
    for (int64_t k = 0; k < a; k++) r->seq[start + 1 + k] = props[k];
    r->seq[start + 1 + a] = r->targ[a];
    DF_TRY(
        df_copy(r->ctx, r->feats + start * W, r->dev, r->vfeats, r->dev, sizeof(float) * (size_t)((a + 1) * W), err));
    DF_TRY(df_target_cache_truncate(r->cache, start + a + 1, err));
    rep->committed += a + 1;
    int64_t added = a + 1;
    for (int64_t k = 0; k < added; k++)
      if (is_eos(r, r->seq[start + 1 + k])) added = k + 1; // stop after the end-of-sequence token
    *n += added;
  }
  if (*n > max_new) *n = max_new;
  return DF_OK;
}

// The draft's strategy opened for eval on the target's pieces (SpecForge's defaults for its keys).
static df_status setup(sd_run *r, df_error *err) {
  const df_target_spec *s = df_target_get_spec(r->t);
  r->H = s->hidden, r->V = s->vocab, r->K = r->cfg->dflash.num_target_layer_ids;
  r->ctx = df_target_ctx(r->t), r->dev = df_ctx_device(r->ctx);
  const df_strategy *st = df_strategy_of(r->cfg);
  if (!st)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, r->cfg->source, NULL, "no strategy trains this draft (%s)",
                   df_draft_kind_name(r->cfg->kind));
  const df_tensor emb = df_target_embed(r->t), head = df_target_lm_head(r->t);
  r->steps = (df_strategy_value){.key = "num_steps", .number = (double)r->o->num_steps};
  r->list = (df_strategy_value_list){.v = &r->steps, .n = r->o->num_steps > 0};
  r->values = df_strategy_values_of_list(&r->list); // kept in the run: the strategy reads it while drafting
  const df_strategy_env env = {.ctx = r->ctx,
                               .model = r->m,
                               .cfg = r->cfg,
                               .frozen = {.embed = emb.data, .lm_head = head.data, .vocab = r->V, .hidden = r->H},
                               .mask_token_id = r->o->mask_token_id,
                               .num_anchors = 1,
                               .values = &r->values,
                               .eval = true};
  DF_TRY(df_strategy_open(st, &env, &r->strategy, err));
  r->nprop = st->proposals(r->strategy);
  if (!st->draft)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, r->cfg->source, NULL, "the %s strategy does not draft", st->name);
  return DF_OK;
}

static bool grow(void **p, size_t bytes) {
  void *q = realloc(*p, bytes);
  if (q) *p = q;
  return q != NULL;
}

// Buffers and a KV cache for a prompt of P tokens (grown, never shrunk).
static df_status alloc_for(sd_run *r, int64_t P, df_error *err) {
  const int64_t need = P + r->o->max_new_tokens + r->nprop + 2, W = r->K * r->H, np = r->nprop;
  if (need <= r->cap) return DF_OK;
  df_target_cache_free(r->cache);
  r->cache = NULL, r->cap = 0;
  sd_free_device(r);
  DF_TRY(df_target_cache_create(r->t, need, &r->cache, err));
  const size_t f = sizeof(float), i4 = sizeof(int32_t);
  bool ok = grow((void **)&r->seq, i4 * need) && grow((void **)&r->greedy, i4 * need) &&
            grow((void **)&r->verify, i4 * (np + 1)) && grow((void **)&r->targ, i4 * (np + 1));
  if (!ok) return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", "lower --max-new-tokens", "out of memory");
  DF_TRY(df_buffer_alloc(r->ctx, f * need * W, (void **)&r->feats, err));
  DF_TRY(df_buffer_alloc(r->ctx, f * (np + 1) * W, (void **)&r->vfeats, err));
  r->cap = need;
  return DF_OK;
}

// prompt (P) + gen (n) as a token JSONL line, loss_mask 1 on gen.
static void write_sequence(FILE *fp, const int32_t *prompt, int64_t P, const int32_t *gen, int64_t n) {
  fputs("{\"input_ids\": [", fp);
  for (int64_t i = 0; i < P + n; i++) fprintf(fp, "%s%d", i ? ", " : "", i < P ? prompt[i] : gen[i - P]);
  fputs("], \"loss_mask\": [", fp);
  for (int64_t i = 0; i < P + n; i++) fprintf(fp, "%s%d", i ? ", " : "", i >= P);
  fputs("]}\n", fp);
}

static df_status one_prompt(sd_run *r, const df_token_jsonl *in, df_spec_report *rep, FILE *seq_out, df_error *err) {
  const int64_t P = df_capture_prompt_len(in->mask, in->len);
  if (P < 1 || P >= in->len) {
    if (r->o->log) fprintf(r->o->log, "spec-decode: line %lld has no prompt; skipped\n", (long long)in->line);
    return DF_OK;
  }
  DF_TRY(alloc_for(r, P, err));
  int64_t n = 0, ng = 0;
  double t0 = now_s();
  DF_TRY(decode_one(r, in->ids, P, &n, rep, err));
  double t1 = now_s();
  DF_TRY(df_target_generate_greedy(r->t, r->cache, in->ids, P, r->o->max_new_tokens, r->eos, r->n_eos, r->greedy, &ng,
                                   err));
  rep->greedy_seconds += now_s() - t1;
  rep->spec_seconds += t1 - t0;
  rep->generated_tokens += n;
  int64_t bad = n == ng ? -1 : (n < ng ? n : ng);
  for (int64_t i = 0; i < n && i < ng && bad < 0; i++)
    if (r->seq[P + i] != r->greedy[i]) bad = i;
  if (bad >= 0) {
    rep->identical_to_greedy = false;
    if (rep->mismatched_prompts++ == 0) rep->first_mismatch_prompt = rep->prompts, rep->first_mismatch_pos = bad;
  }
  if (seq_out) write_sequence(seq_out, in->ids, P, r->greedy, ng);
  if (r->o->log)
    fprintf(r->o->log, "spec-decode: prompt %lld (%lld tokens): %lld generated, %s greedy\n", (long long)rep->prompts,
            (long long)P, (long long)n, bad < 0 ? "identical to" : "DIFFERS from");
  rep->prompts++;
  return DF_OK;
}

df_status df_spec_decode_run(df_target *t, df_draft_model *m, const df_draft_config *cfg, const char *data_path,
                             const df_spec_options *o, df_spec_report *rep, df_error *err) {
  memset(rep, 0, sizeof *rep);
  rep->identical_to_greedy = true;
  rep->first_mismatch_prompt = rep->first_mismatch_pos = -1;
  const df_strategy *strat = df_strategy_of(cfg);
  if ((strat && strat->blocks && o->mask_token_id < 0) || o->max_new_tokens < 1)
    return DF_FAIL(err, DF_ERR_INVALID, "mask_token_id", "set dflash_config.mask_token_id; --max-new-tokens >= 1",
                   "bad spec-decode options (mask %lld, max_new_tokens %lld)", (long long)o->mask_token_id,
                   (long long)o->max_new_tokens);
  sd_run r = {.t = t, .m = m, .cfg = cfg, .o = o};
  DF_TRY(setup(&r, err));
  rep->proposals = r.nprop;
  rep->reached = calloc((size_t)r.nprop, sizeof(int64_t)), rep->accepted = calloc((size_t)r.nprop, sizeof(int64_t));
  if (!rep->reached || !rep->accepted) return DF_FAIL(err, DF_ERR_NOMEM, "spec decode", NULL, "out of memory");
  df_draft_model_set_training(m, false);
  df_token_jsonl in;
  r.n_eos = o->n_eos < DF_TARGET_MAX_EOS ? o->n_eos : DF_TARGET_MAX_EOS;
  if (r.n_eos > 0) memcpy(r.eos, o->eos, sizeof(int32_t) * (size_t)r.n_eos);
  DF_TRY(df_token_jsonl_open(data_path, r.V, &in, err));
  FILE *seq_out = o->sequences_out ? fopen(o->sequences_out, "w") : NULL;
  df_status st = o->sequences_out && !seq_out
                     ? DF_FAIL(err, DF_ERR_IO, o->sequences_out, NULL, "cannot write %s", o->sequences_out)
                     : DF_OK;
  while (st == DF_OK && (o->max_samples <= 0 || rep->prompts < o->max_samples)) {
    bool done = false;
    st = df_token_jsonl_next(&in, &done, err);
    if (st != DF_OK || done) break;
    st = one_prompt(&r, &in, rep, seq_out, err);
  }
  if (seq_out && fclose(seq_out) != 0 && st == DF_OK)
    st = DF_FAIL(err, DF_ERR_IO, o->sequences_out, NULL, "cannot write %s", o->sequences_out);
  df_token_jsonl_close(&in);
  sd_free(&r);
  rep->tau = rep->verifications ? (double)rep->committed / (double)rep->verifications : 0.0;
  return st;
}
