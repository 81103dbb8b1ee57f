// The data a recipe names, turned into a batch source (train/data/batch_source.h): captured hidden states (one .h5
// shard or a directory of them) are read as they are; a token JSONL or a conversations JSONL (ShareGPT
// `conversations` / OpenAI `messages`, prepared once by tools/run/prepare_data.py into data.cache_dir) runs the target
// online (train/data/online_source.h). The kind is read from the file itself, as SpecForge does (a first record with
// input_ids and loss_mask is pre-tokenized).
#ifndef DF_TRAIN_DATA_ONLINE_DATA_H
#define DF_TRAIN_DATA_ONLINE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base/error.h"
#include "modeling/draft_config.h"
#include "train/data/batch_source.h"
#include "train/data/online_source.h"
#include "train/recipe/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_DATA_HIDDEN_STATES = 0, DF_DATA_TOKENS, DF_DATA_CONVERSATIONS } df_data_kind;

// A directory or an HDF5 file: hidden states; else the first non-blank line decides (an object with input_ids:
// tokens; with conversations or messages: conversations). Anything else is an error naming the file and line.
df_status df_data_kind_of(const char *path, df_data_kind *out, df_error *err);

// Conversations → token JSONL with the recipe's target tokenizer and data.{chat_template, max_length, cache_dir,
// train_only_last_turn}: runs tools/run/prepare_data.py (an interpreter with transformers: $DRAFTFORGE_PYTHON,
// python3, or the .venv-tools scripts/setup.sh makes), which reuses <cache_dir>/prepared/<key>.jsonl while its
// inputs are unchanged. out receives the token file's path; the tool's report goes to log (may be NULL).
df_status df_data_prepare(const df_recipe *rc, const char *conversations, const char *key, char *out, size_t n,
                          FILE *log, df_error *err);

typedef struct {
  const df_recipe *rc;
  const char *path;                 // the data
  const char *key;                  // the recipe key or option that named it, for messages ("data.train_data_path")
  bool allow_hidden_states;         // which kinds the key may name
  bool allow_online;                //
  const df_draft_config *cfg;       // the draft the data is for
  bool need_last_hidden;            // DSpark's teacher
  int threads;                      // the online target's CPU threads (0: OpenMP's)
  const df_ctx_options *target_ctx; // the online target's context (the run's device); NULL: the CPU
  bool overlap;                     // online batches may be prefilled on the feed's reader thread
  FILE *log;                        // what preparation and the scan report (may be NULL)
  // The run's online target, shared by its sources: opened here on first online use (the caller frees it with
  // df_online_target_free after closing the sources); NULL pointer: online data is refused.
  df_online_target **target;
  // A memory plan (train/trainer/mem_plan.h): > 0 replaces the data by that many synthetic samples of
  // data.max_length tokens, nothing read — zero features for captured data (df_synthetic_source_open); for online
  // data the target, its weights not read, prefills them (df_online_source_open_synthetic). Which kind the key names
  // decides (allow_online without allow_hidden_states: online).
  int64_t synthetic;
} df_data_source_options;

df_status df_data_source_open(const df_data_source_options *o, df_batch_source **out, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
