// The EAGLE-3 strategy's run (strategies/eagle3/*.c; docs/eagle3-step.md): its settings, the micro-batch's staging and
// device scratch, the vocabulary mapping on the device, and the speculative-decoding state. Internal to the folder.
#ifndef DF_STRATEGIES_EAGLE3_EAGLE3_H
#define DF_STRATEGIES_EAGLE3_EAGLE3_H

#include "kernels/eagle3.h"
#include "modeling/eagle3_model.h"
#include "strategies/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_EAGLE3_PLOSS_DECAY 0.8 // Eagle3TrainStrategy's ploss_decay (no recipe key sets it)

// The stats vector: the shared sums, then one DF_EAGLE3_STEP_STATS block per TTT step (kernels/eagle3.h).
enum { E3_LOSS_NUM = 0, E3_ACC_NUM, E3_ACC_DEN, E3_ACCEPT_SUM, E3_BLOCKS, E3_STEPS };
#define DF_EAGLE3_STATS(T) (E3_STEPS + (T)*DF_EAGLE3_STEP_STATS)

typedef struct {
  df_strategy_run base;
  df_strategy_env env;
  df_eagle3_model *m;
  int64_t T; // training.ttt_length
  df_lk_loss lk;
  double kl_scale, kl_decay;
  int64_t chunk_rows; // rows of draft logits per lm_head chunk
  int64_t V, D, H, W; // target vocabulary, draft vocabulary, hidden, feature width 3·Ht
  // the mapping on the device: t2d [V] u8, d2t [D] i32, and the target head's rows of the draft vocabulary [D, H]
  bool have_vocab;
  uint8_t *dt2d;
  int32_t *dd2t;
  float *head_d;
  // the micro-batch: one page-locked upload and its device copy (the same memory on a host-addressable device)
  void *host, *dev;
  size_t cap;
  void *scratch; // device scratch laid out per (B, S)
  size_t scratch_cap;
  // speculative decoding
  df_eagle3_cache *cache;
  int64_t cache_cap, cached; // positions 0 .. cached − 1 hold the target's features' keys
  int32_t *sd_ids, *sd_dids;
  float *sd_logits, *sd_dlogits, *sd_h;
} eagle3_run;

// One micro-step (strategies/eagle3/micro.c).
df_status df_eagle3_micro(df_strategy_run *r, const df_micro_args *args, df_micro_info *info, df_error *err);

// ---- what P-EAGLE (strategies/peagle/) shares: its run starts with an eagle3_run (m NULL) --------------------------
// The teacher's device buffers for R rows: target_p [R, D] over the draft vocabulary, the full-vocabulary lse and
// argmax, ratio, the position mask; in bf16 storage last16 [R, H] and tp16 [R, D] round the final states and the
// draft-vocabulary logits (NULL in fp32).
typedef struct {
  float *tp, *lse_v, *ratio, *pm;
  int32_t *arg;
  void *last16, *tp16;
} df_eagle3_teacher_buf;
// The teacher rows of R positions from the target's final states last [R, H] (fp32) and loss mask lm [R] (fp32).
df_status df_eagle3_teacher_pass(eagle3_run *r, const float *last, const float *lm, int64_t R,
                                 const df_eagle3_teacher_buf *t, df_error *err);
// The draft's logits (fp32, zbuf [c, D]) of rows r0 .. r0 + c − 1 of out (storage dtype) through w; *x views those
// rows. bf16 storage writes them through z16buf first, as PyTorch's bf16 lm_head does.
df_status df_eagle3_chunk_logits(eagle3_run *r, const float *out, int64_t r0, int64_t c, float *zbuf, void *z16buf,
                                 const df_tensor *w, df_tensor *x, df_error *err);
// The micro-batch's page-locked upload (and its device copy) and the device scratch, grown to at least these bytes.
df_status df_eagle3_grow(eagle3_run *r, size_t upload, size_t work, df_error *err);
// The draft's vocabulary buffers as host arrays (either model).
df_status df_eagle3_run_vocab_read(eagle3_run *r, int64_t *d2t, uint8_t *t2d, df_error *err);
df_status df_eagle3_run_vocab_write(eagle3_run *r, const int64_t *d2t, const uint8_t *t2d, df_error *err);
// The shared metrics of a stats vector in this layout with T step (or depth) blocks.
df_status df_eagle3_metrics_of(const double *st, int64_t T, df_strategy_metrics *out, df_error *err);
// The table's close of the run's shared parts (P-EAGLE's close calls it too).
void df_eagle3_run_release(eagle3_run *r);
// The device copy of the vocabulary mapping, from the model's buffers (read once, and again after prepare).
df_status df_eagle3_sync_vocab(eagle3_run *r, df_error *err);
// Speculative decoding (strategies/eagle3/spec.c).
df_status df_eagle3_draft(df_strategy_run *r, const df_draft_round *in, int32_t *props, df_error *err);
void df_eagle3_draft_reset(df_strategy_run *r);
void df_eagle3_spec_free(eagle3_run *r);
// The vocabulary mapping of a fresh run (strategies/eagle3/prepare.c).
df_status df_eagle3_prepare(df_strategy_run *r, const df_strategy_data *data, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
