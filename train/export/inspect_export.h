// `draftforge inspect EXPORT` (train/export/inspect_export.c, inspect_export_tensors.c): a draft directory read the way
// SGLang 0.5.23 reads it — the class its architectures name, every config key the DFlash / DSpark loaders and
// workers look up (with where the value comes from: dflash_config, the top level, or a default), the tensors
// its loader expects, and the launch command. Problems (SGLang would refuse the directory, or load it and
// serve something else) and notes (fine in the default mode, not in every mode) are flagged.
#ifndef DF_TRAIN_EXPORT_INSPECT_EXPORT_H
#define DF_TRAIN_EXPORT_INSPECT_EXPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_SERVE_DENSE_DFLASH, DF_SERVE_DENSE_DSPARK, DF_SERVE_MOE_DFLASH, DF_SERVE_MOE_DSPARK } df_serve_class;

// What the key reads resolved to; the tensor check builds its expectations from it.
typedef struct {
  df_serve_class cls;
  int64_t H, I, n, nh, nkv, hd, V, K; // K = the number of target layers the fc reads
  bool attention_bias;
  int64_t markov_rank; // the top-level value the Markov head is built from
  int markov_type;     // 0 vanilla, 1 gated, 2 rnn
  bool conf_with_markov;
  int64_t E, k, moe_I, shared, shared_I; // MoE
  bool router_bias;
  bool domino;                // dflash_config.projector_type "domino": the GRU head's tensors are expected
  int64_t domino_E, domino_G; // its emb_dim and gru_hidden_dim
} df_serve_shape;

typedef struct {
  FILE *out;
  int problems, notes;
} df_serve_log;

// A line of the report: level "ok", "NOTE" or "PROBLEM" (the last two are counted).
void df_serve_line(df_serve_log *log, const char *level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Whether dir looks like a serving directory: config.json whose architectures[0] is a DFlash-family class
// (DFlashDraftModel, Qwen3DSparkModel, DSparkDraftModel, LingDSparkModel, DFlashMoEDraftModel, Qwen3MoeDSparkModel)
// or EAGLE-3's LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM.
bool df_inspect_is_draft_dir(const char *dir);

// The whole report for dir into out; *problems receives the number of PROBLEM lines. Fails only when dir
// cannot be read (no config.json, bad JSON, unreadable safetensors).
df_status df_inspect_export(const char *dir, FILE *out, int *problems, df_error *err);

// The EAGLE-3 report (inspect_eagle3.c): SGLang's LlamaForCausalLMEagle3 and vLLM's Eagle3LlamaForCausalLM reading
// the directory whose config.json is root.
df_status df_inspect_eagle3_export(const char *dir, const json_t *root, FILE *out, int *problems, df_error *err);

// The tensor part (inspect_export_tensors.c): every tensor the class expects against model.safetensors.
df_status df_inspect_export_tensors(const char *dir, const df_serve_shape *s, df_serve_log *log, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
