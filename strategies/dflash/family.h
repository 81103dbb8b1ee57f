// What the block strategies (DFlash, DSpark: drafts that fill blocks of MASK slots after sampled anchors) share: one
// micro-step — anchors, the stage (one upload), the draft backbone's forward, the strategy's objective, the FFN
// kind's loss term, the backward. A block strategy supplies
// its rows (labels, weights) and its objective; strategies/<name>/strategy.c builds its table on this.
#ifndef DF_STRATEGIES_DFLASH_FAMILY_H
#define DF_STRATEGIES_DFLASH_FAMILY_H

#include "strategies/dflash/stage.h"
#include "strategies/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_block_run df_block_run;

// A block strategy's part of the micro-step.
typedef struct {
  df_stage_rows rows; // its per-row arrays in the upload
  // The objective on the staged rows: sums added into stats, and with dhidden (NULL in eval) d(loss)/d(hidden)
  // written into it — d(loss_num / loss_den) when grad_scale is 0, else d(grad_scale · loss_num).
  df_status (*objective)(void *self, df_block_run *b, const df_staged *st, const df_tensor *hidden, double grad_scale,
                         df_tensor *dhidden, df_tensor *stats, df_error *err);
  void *self;
} df_block_hooks;

struct df_block_run {
  df_strategy_run base;
  df_strategy_env env;
  df_block_hooks hooks;
  df_stage *stage;
  int64_t stats_len;
  // speculative decoding (df_block_draft): the block's ids, positions and embedding, grown with the context
  int32_t *ids, *ints, *dids, *dints;
  float *block_embed;
  uint8_t *dkeep;
  int64_t ints_cap;
};

// Opens the shared part: the stage (last_hidden: it uploads the teacher rows); stats_len is the strategy's.
df_status df_block_open(df_block_run *b, const df_strategy *table, const df_strategy_env *env, const df_block_hooks *h,
                        bool last_hidden, int64_t stats_len, df_error *err);
void df_block_close(df_block_run *b);
// df_strategy.micro for a block strategy (args->stats is required: the sums go there).
df_status df_block_micro(df_block_run *b, const df_micro_args *args, df_micro_info *info, df_error *err);
// The frozen LM head as a tensor on the run's device.
df_tensor df_block_head(const df_block_run *b);
// df_strategy.draft for a block strategy: block = [last token, MASK × (bs−1)] at positions start .. start+bs−1 over the
// context features of positions < start (the training mask: keys j < anchor), the backbone forward, then the
// strategy's propose. The base of a df_block_run.
df_status df_block_draft(df_strategy_run *r, const df_draft_round *in, int32_t *props, df_error *err);
// The first index of a row's largest logit (torch.argmax's tie rule): a greedy proposal.
int32_t df_block_argmax(const float *z, int64_t V);

#ifdef __cplusplus
}
#endif

#endif
