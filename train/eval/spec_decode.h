// Real greedy speculative decoding with a DFlash, DSpark or EAGLE-3 draft (docs/target.md): per prompt the target
// prefills; the draft proposes tokens from the target's context features (a block, or an EAGLE-3 chain); the target
// verifies them in one forward; the accepted prefix plus the target's bonus token is committed and the context
// features extend. The output is compared with plain greedy decoding of the target.
#ifndef DF_TRAIN_EVAL_SPEC_DECODE_H
#define DF_TRAIN_EVAL_SPEC_DECODE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "modeling/draft_config.h"
#include "modeling/draft_model.h"
#include "modeling/target/target_model.h"

typedef struct {
  int64_t max_new_tokens; // per prompt (default 64)
  int64_t max_samples;    // 0: every line of the data
  int64_t mask_token_id;  // the draft's MASK id (>= 0; block drafts)
  int64_t num_steps;      // chain drafts (EAGLE-3): tokens drafted per round (0: the draft's default)
  const int32_t *eos;     // the target's end-of-sequence ids (df_target_eos_ids): decoding stops after one
  int n_eos;
  const char *sequences_out; // when set, a token JSONL of prompt + greedy output (loss_mask 1 on the output)
  FILE *log;                 // one line per prompt (NULL: quiet)
} df_spec_options;

typedef struct {
  int64_t prompts;
  int64_t verifications;    // target forwards that verified a block
  int64_t target_forwards;  // verifications + one prefill per prompt
  int64_t generated_tokens; // Σ tokens generated (the prefill's first token included)
  int64_t committed;        // Σ over verifications of accepted + 1
  int64_t proposals;        // tokens the draft proposes per round: bs − 1 (DFlash), bs (DSpark), num_steps (EAGLE-3)
  int64_t *reached, *accepted; // (proposals) slot k reached / accepted, k = 1..proposals at index k − 1
  double tau;                  // committed / verifications
  bool identical_to_greedy;
  int64_t mismatched_prompts;
  int64_t first_mismatch_prompt, first_mismatch_pos; // −1 when identical
  double spec_seconds, greedy_seconds;
} df_spec_report;

// Runs over the token JSONL at data_path: the prompt of each line is its tokens before the first supervised
// one (tools/prepare_data.py marks the assistant turn). t and m must share the context; cfg is m's config.
df_status df_spec_decode_run(df_target *t, df_draft_model *m, const df_draft_config *cfg, const char *data_path,
                             const df_spec_options *o, df_spec_report *rep, df_error *err);
void df_spec_report_free(df_spec_report *r);

#endif
