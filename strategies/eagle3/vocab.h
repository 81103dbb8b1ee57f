// EAGLE-3's draft vocabulary (d2t / t2d) exactly as SpecForge derives it from the training data (docs/eagle3-step.md
// §2; the Python twin is tools/reference/eagle3_vocab.py): supervised-token counts in first-appearance order, the
// draft_vocab_size most frequent (ties to the earlier-inserted token), padded from set(range(D)) − counted in CPython's
// set iteration order when fewer tokens were seen, then sorted ascending. Host code only.
#ifndef DF_STRATEGIES_EAGLE3_VOCAB_H
#define DF_STRATEGIES_EAGLE3_VOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// SpecForge's Counter over supervised tokens: count[t], and the tokens in insertion order.
typedef struct {
  int64_t vocab;
  int64_t *count; // (vocab)
  int64_t *order; // (n) tokens in the order they were first counted
  int64_t n;
  int64_t *mark;   // (vocab) scratch: counts in the sample being counted
  int64_t *sample; // (vocab) scratch: their list
} df_eagle3_counter;

df_status df_eagle3_counter_init(df_eagle3_counter *c, int64_t vocab, df_error *err);
void df_eagle3_counter_free(df_eagle3_counter *c);
// One sample (count_effective_feature_tokens): its supervised tokens (mask != 0) counted with unique(), ascending.
// A token outside [0, vocab) is an error naming the sample.
df_status df_eagle3_counter_add(df_eagle3_counter *c, const int32_t *ids, const uint8_t *mask, int64_t len,
                                int64_t sample, df_error *err);

// The iteration order of CPython 3.11's `set(range(D)) - set(counted)` (setobject.c's probing, resizing and the
// copy-and-discard path of set_difference), emulated without sets; counted holds n distinct tokens (any values). out
// holds D entries; returns how many it wrote (-1: out of memory).
int64_t df_eagle3_missing_fill_order(const int64_t *counted, int64_t n, int64_t D, int64_t *out);

// process_token_dict_to_mappings: d2t [D] (draft id i is target id i + d2t[i]), t2d [vocab] (0/1), and the padding
// tokens added (padding [D], *npad; either may be NULL). Fails when a chosen token is outside the vocabulary.
df_status df_eagle3_vocab_from_counts(const df_eagle3_counter *c, int64_t D, int64_t *d2t, uint8_t *t2d,
                                      int64_t *padding, int64_t *npad, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
