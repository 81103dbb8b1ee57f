// A training strategy (DFlash, DSpark, ...) as one table of functions, like the backend table: what one micro-step
// means for it (batch build, forward, objective, backward), its metrics, its recipe keys, what its drafts serve as.
// The trainer, step, eval, spec-decode and export ask the table (strategies/registry.c lists them) and never the
// strategy's name; a new strategy is one folder under strategies/ and one registry row.
#ifndef DF_STRATEGIES_STRATEGY_H
#define DF_STRATEGIES_STRATEGY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/collective.h"
#include "base/error.h"
#include "base/rng.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/draft_model.h"
#include "strategies/batch.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- what a strategy is given ------------------------------------------------------------------------------------

// The frozen target pieces a draft reads: embedding and LM head, [vocab, hidden] on the run's device, in dtype (f32,
// or bf16 when the draft stores bf16: df_run_resources_place_as).
typedef struct {
  const void *embed, *lm_head;
  int64_t vocab, hidden;
  df_dtype dtype; // DF_F32 (0) unless placed as bf16
} df_frozen;

// The values of a strategy's own recipe keys (df_strategy.keys), looked up by name ("dspark_ce_loss_alpha"): the
// recipe implements it, so strategies never see the recipe. A key the lookup does not answer takes the strategy's
// (SpecForge's) default; a NULL df_strategy_values means every key does.
typedef struct {
  const void *self;
  bool (*number)(const void *self, const char *key, double *out);
  bool (*text)(const void *self, const char *key, const char **out);
} df_strategy_values;

// Fixed values, for tests and tools: n (key, value) pairs; text NULL for a number.
typedef struct {
  const char *key;
  double number;
  const char *text;
} df_strategy_value;
typedef struct {
  const df_strategy_value *v;
  int n;
} df_strategy_value_list;
df_strategy_values df_strategy_values_of_list(const df_strategy_value_list *l);
// A number / text key of values (NULL: none), else def.
double df_strategy_number(const df_strategy_values *v, const char *key, double def);
const char *df_strategy_text(const df_strategy_values *v, const char *key, const char *def);

// What a strategy's run is opened with. Borrowed: everything must outlive the run.
typedef struct {
  df_ctx *ctx;
  df_draft_model *model;
  const df_draft_config *cfg;
  df_frozen frozen;
  int64_t mask_token_id;
  int64_t num_anchors;              // training.num_anchors: blocks per sample (block strategies)
  double loss_decay_gamma;          // training.loss_decay_gamma (0: off)
  int64_t chunk_blocks;             // training.objective_chunk_blocks (0: one pass)
  const df_strategy_values *values; // the strategy's own keys (NULL: defaults)
  bool eval;                        // an eval run: the eval objective, no backward
} df_strategy_env;

// One micro-step.
typedef struct {
  const df_batch *batch;
  df_rng *anchor_rng; // training: the run's anchor stream (a checkpoint saves it)
  // Data parallel: the batch is this rank's share of a global batch whose longest sample and largest anchor-candidate
  // count (both reduced with MAX) are global_S / global_cmax; the anchors replay the global batch's stream. world 1:
  // the batch is the whole batch.
  int world, rank;
  int64_t global_S, global_cmax;
  const df_collective *dp_sum; // the ranks' SUM (the FFN term's global loss weight); NULL: one rank
  uint64_t eval_seed;          // eval: sample i's anchors come from eval_seed + its dataset index
  // 0: the gradient is d(loss_num / loss_den); > 0: d(grad_scale · loss_num) (the trainer's accumulation).
  double grad_scale;
  bool accumulate;   // add into the model's grads instead of zeroing them first
  df_tensor *stats;  // f64 [stats_len] on the device the micro-step's sums are added to
  double *ffn_stats; // f64 on the device where training forwards add the FFN kind's statistics (NULL: none)
  // Where the run's schedule stands, for an objective that follows it (Domino's lambda_base): optimizer steps
  // completed before this micro-step, and the run's step horizon (training.total_steps, else max_steps, else what the
  // data gives; 0: none).
  int64_t step, horizon;
} df_micro_args;

// What the host knows of a micro-step without reading the device.
typedef struct {
  int64_t N;            // blocks per sample (block strategies)
  double loss_den;      // the objective's denominator
  int64_t num_blocks;   // kept blocks (or predicted positions)
  int64_t skipped;      // eval: samples with nothing to predict
  int64_t upload_bytes; // bytes of the micro-batch's one upload
  double ffn_loss; // the FFN kind's term (MoE aux loss) when no ffn_stats took it (in loss_num as ffn_loss·loss_den)
} df_micro_info;

// The metrics every strategy reports, from its stats vector read back (ratios are left to the reader, so sums
// add across micro-steps and ranks first).
typedef struct {
  double loss_num;         // the objective's numerator: loss = loss_num / loss_den
  double acc_num, acc_den; // correct / supervised predictions
  double accept_sum;       // Σ over blocks of the greedy acceptance length: τ = accept_sum / num_blocks
  int64_t num_blocks;
  int64_t positions;         // per-position accuracy (block slot, or TTT step): pos_num[k] / pos_den[k]
  double *pos_num, *pos_den; // (positions), owned (df_strategy_metrics_free)
} df_strategy_metrics;
void df_strategy_metrics_free(df_strategy_metrics *m);

// Where a strategy's own report keys go: a training step line, an eval line ("eval/" keys), the eval report of
// `draftforge eval`, or `draftforge step`'s step.json.
typedef enum { DF_REPORT_TRAIN, DF_REPORT_EVAL_LINE, DF_REPORT_EVAL, DF_REPORT_STEP } df_report_kind;

// A strategy's state for one run (its options, stage, scratch). Every strategy's run struct starts with this header.
typedef struct df_strategy_run {
  const struct df_strategy *table;
  df_ctx *ctx; // where it runs
} df_strategy_run;

// A block proposal for speculative decoding (eval --spec-decode): the draft's final hidden states of one block
// [bs, H] on the device, its anchor token, and the LM head [V, H] to read them with.
typedef struct {
  const float *hidden;
  int32_t anchor_token;
  df_tensor lm_head;
} df_propose_in;

// The training data as a strategy may read it once before the first step of a fresh run (EAGLE-3's vocabulary
// mapping): the samples in dataset order, each one's tokens and loss mask truncated to data.max_length.
typedef struct {
  void *self;
  int64_t count;
  // Sample i (0 <= i < count): *ids, *mask point at len entries, valid until the next call.
  df_status (*sample)(void *self, int64_t i, const int32_t **ids, const uint8_t **mask, int64_t *len, df_error *err);
  const char *vocab_mapping_path; // model.vocab_mapping_path (NULL: none)
  bool write_files;               // this process writes shared files (rank 0)
  FILE *log;                      // one line on what was prepared (NULL: quiet)
} df_strategy_data;

// One round of speculative decoding (eval --spec-decode) as a strategy drafts it: the committed tokens seq[0 ..
// start] (seq[start] is the last one, which the target has not read yet) and the target's captured features of
// positions 0 .. start − 1 in feats (rows of K·H on the device; row start and later may be used as scratch).
// The strategy proposes the tokens after seq[start].
typedef struct {
  float *feats;       // (cap, K·H) on the device
  int64_t cap;        // rows feats holds (>= start + proposals + 1)
  const int32_t *seq; // (start + 1) host
  int64_t start;
  df_tensor embed, lm_head; // the target's, on the device
} df_draft_round;

// ---- the table -------------------------------------------------------------------------------------------------

typedef struct df_strategy {
  const char *name;      // training.strategy
  const char *projector; // dflash_config.projector_type of the drafts it trains
  const char *summary;   // one line for --help and docs
  // Its own recipe keys (training.<key>, NULL-terminated): read through df_strategy_values, recorded in the
  // checkpoint contract (a resume must not change them).
  const char *const *keys;
  // Whether cfg is a draft this strategy trains.
  bool (*trains)(const df_draft_config *cfg);
  // Its drafts may read the target's final hidden states (DSpark's teacher): capture stores them by default and a
  // batch reads them when the data has them.
  bool reads_last_hidden;

  df_status (*open)(const df_strategy_env *env, df_strategy_run **out, df_error *err);
  void (*close)(df_strategy_run *r);
  // The batches must carry the target's final hidden states (target_last_hidden_states).
  bool (*needs_last_hidden)(const df_strategy_run *r);
  // f64 elements of the stats vector a micro-step adds its sums to.
  int64_t (*stats_len)(const df_strategy_run *r);
  // One micro-step: batch build and upload, forward, objective (sums into args->stats) and, unless the run is an
  // eval run, the backward into the model's grads.
  df_status (*micro)(df_strategy_run *r, const df_micro_args *args, df_micro_info *info, df_error *err);
  // The shared metrics of a stats vector read back (loss_den: the host's Σ); and the strategy's own keys of a
  // report into o (the eval line prefixes "eval/").
  df_status (*metrics)(const df_strategy_run *r, const double *stats, double loss_den, df_strategy_metrics *out,
                       df_error *err);
  void (*report)(const df_strategy_run *r, const double *stats, double loss_den, df_report_kind kind, json_t *o);
  // One line of the strategy's own metrics for logs (may write nothing).
  void (*print)(const df_strategy_run *r, const double *stats, double loss_den, FILE *fp);
  // The positions accuracy is reported for (per-position arrays), and the first one that is supervised.
  int64_t (*first_position)(const df_strategy_run *r);

  // Speculative decoding: proposals per round, and the proposals of one block (block strategies).
  int64_t (*proposals)(const df_strategy_run *r);
  df_status (*propose)(df_strategy_run *r, const df_propose_in *in, int32_t *props, df_error *err);
  // One drafting round (block strategies: the block forward, then propose; EAGLE-3: autoregressive drafting with
  // the draft's own KV cache), and the start of a new sequence (drop what was cached; NULL: nothing cached).
  df_status (*draft)(df_strategy_run *r, const df_draft_round *in, int32_t *props, df_error *err);
  void (*draft_reset)(df_strategy_run *r);
  // A fresh run's last word on the weights, after their init or warm start and before the first step (EAGLE-3:
  // the vocabulary mapping from the data, replacing a warm start's). NULL: nothing to do.
  df_status (*prepare)(df_strategy_run *r, const df_strategy_data *data, df_error *err);
  // Its drafts fill blocks of MASK slots after an anchor: they carry dflash_config, a block size and a mask token.
  bool blocks;

  // Export: config.json normalised the way SpecForge exports these drafts (architectures, head keys), and the
  // serving class of these drafts with an FFN kind (an MoE draft: SGLang's MoE class).
  df_status (*export_normalize)(json_t *cfg, const char *where, df_error *err);
  const char *serving_class_ffn;
  // Parameter names (substrings, NULL-terminated; NULL: none) a bf16 export keeps in fp32, as SGLang loads them.
  const char *const *keep_f32;
  // What an export reports: the draft carries a confidence head (SGLang's ragged verify needs it).
  bool (*has_confidence_head)(const df_draft_config *cfg);
} df_strategy;

// ---- the registry (strategies/registry.c) ---------------------------------------------------------------------

// Every strategy, NULL-terminated, and their names (the recipe's supported training.strategy values).
extern const df_strategy *const df_strategies[];
extern const char *const df_strategy_names[];
// By training.strategy; NULL when none.
const df_strategy *df_strategy_find(const char *name);
// The strategy that trains cfg; NULL when none (the draft config parser admits no such draft).
const df_strategy *df_strategy_of(const df_draft_config *cfg);
// Whether cfg's strategy reads the target's final hidden states (false when no strategy trains cfg).
bool df_strategy_reads_last_hidden(const df_draft_config *cfg);
// By dflash_config.projector_type; NULL when none.
const df_strategy *df_strategy_for_projector(const char *projector);

// Opens s on env; a strategy's open fills *out (df_strategy_close frees it).
df_status df_strategy_open(const df_strategy *s, const df_strategy_env *env, df_strategy_run **out, df_error *err);
void df_strategy_close(df_strategy_run *r);

#ifdef __cplusplus
}
#endif

#endif
