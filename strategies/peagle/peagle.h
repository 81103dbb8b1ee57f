// The P-EAGLE strategy's run (strategies/peagle/*.c; docs/peagle.md): its settings on top of the EAGLE family's run
// (strategies/eagle3/eagle3.h: the vocabulary mapping, the teacher, the upload and scratch buffers), COD sampling, the
// micro-step and parallel drafting. Internal to the folder.
#ifndef DF_STRATEGIES_PEAGLE_PEAGLE_H
#define DF_STRATEGIES_PEAGLE_PEAGLE_H

#include "base/rng.h"
#include "modeling/peagle_model.h"
#include "strategies/eagle3/eagle3.h"

#ifdef __cplusplus
extern "C" {
#endif

// The stats vector: EAGLE-3's layout (the shared sums, one DF_EAGLE3_STEP_STATS block per depth) plus a block for each
// sample's whole sums (the loss) and a sink slot the per-depth sums add their loss and accuracy to.
#define DF_PEAGLE_SINK(T)  DF_EAGLE3_STATS((T) + 1)
#define DF_PEAGLE_STATS(T) (DF_PEAGLE_SINK(T) + 1)

typedef struct {
  eagle3_run e; // the family's run (e.m is NULL; e.T is num_depths); must stay first
  df_peagle_model *m;
  int64_t T;               // training.num_depths
  double ratio, ratio_min; // training.down_sample_ratio, down_sample_ratio_min
  int32_t mask_id;         // the mask token of the depth > 0 rows
  int64_t *last_rows;      // (T) rows per depth the last micro-step sampled, over its samples (step.json)
  uint64_t base;           // this optimizer step's draw of the anchor stream (COD's per-sample streams start there)
  int64_t base_step;       // the step (df_micro_args.step) it was drawn for; -1: none yet
  // parallel drafting
  df_peagle_cache *cache;
  int64_t cache_cap, cached;
  int32_t *sd_ids, *sd_dids;
  float *sd_logits, *sd_dlogits;
} peagle_run;

// COD sampling of one sample (cod.c; SpecForge's generate_cod_sample_indices with draftforge's RNG): the rows
// (anchor, depth d) for d = 1 .. T − 1 of a sample of length L in a row of S positions. lm [S] is the loss mask (the
// eligible targets), anchors [(T − 1)·S] receives depth 1's anchors, then depth 2's, ... (each ascending), counts [T]
// the rows per depth (counts[0] = S: depth 0 is every position; 0 for the depths past the first empty one). full
// takes every eligible row (eval: no sampling, rng unused). work: 3·S ints of scratch. Returns the rows of depth > 0.
int64_t df_peagle_cod(const uint8_t *lm, int64_t S, int64_t L, int64_t T, double ratio, double ratio_min, bool full,
                      df_rng *rng, int32_t *anchors, int64_t *counts, int32_t *work);

df_status df_peagle_micro(df_strategy_run *r, const df_micro_args *args, df_micro_info *info, df_error *err);
df_status df_peagle_draft(df_strategy_run *r, const df_draft_round *in, int32_t *props, df_error *err);
void df_peagle_draft_reset(df_strategy_run *r);
void df_peagle_spec_free(peagle_run *r);

#ifdef __cplusplus
}
#endif

#endif
