// The run recipe (SpecForge's YAML schema, docs: shared/reference/dflash-dspark.md §6.1): parsed with libyaml,
// checked key by key against one schema table (train/recipe_schema.c), resolved once into an immutable struct.
#ifndef DF_TRAIN_RECIPE_H
#define DF_TRAIN_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "strategies/dflash.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_STRATEGY_DFLASH = 0 } df_strategy;

// What a recipe resolves to. Paths are absolute or relative to the working directory: a relative path in the
// file is resolved against the recipe's own directory. Optional values absent from the file are NULL / flagged.
typedef struct df_recipe {
  const char *path; // the recipe file ("<memory>" name for df_recipe_parse)
  const char *run_id;
  const char *output_dir;
  struct {
    const char *target_model_path;
    const char *draft_model_config;    // NULL: not given
    const char *draft_checkpoint_path; // NULL: no warm start
    const char *embedding_key;
    const char *lm_head_key;
    bool has_mask_token_id; // model.mask_token_id given (it overrides the draft config's)
    int64_t mask_token_id;
  } model;
  struct {
    const char *hidden_states_path;
    int64_t max_length;
  } data;
  struct {
    df_strategy strategy;
    int64_t batch_size;
    int64_t num_anchors;
    double loss_decay_gamma;        // 0: no decay (SpecForge's None)
    int64_t objective_chunk_blocks; // 0: one pass
    df_dflash_loss_type loss_type;
    double dpace_alpha;
    uint64_t seed;
  } training;
} df_recipe;

typedef struct {
  // When set, problems whose full text does not fit a df_error (the valid-key list of a section) are also
  // written here in full.
  FILE *log;
} df_recipe_options;

// Reads and resolves a recipe file. On failure *out is NULL and err names the key (section.key), the file,
// line and column. opt may be NULL.
df_status df_recipe_load(const char *path, const df_recipe_options *opt, const df_recipe **out, df_error *err);
// The same on len bytes of YAML; name labels messages, base_dir resolves relative paths (NULL: the cwd).
df_status df_recipe_parse(const char *text, size_t len, const char *name, const char *base_dir,
                          const df_recipe_options *opt, const df_recipe **out, df_error *err);
void df_recipe_free(const df_recipe *r);

// Every key of the schema with its type, default, range and whether draftforge implements it (the table
// train/recipe_schema.c holds), for `draftforge step --help` and the docs.
void df_recipe_print_schema(FILE *fp);

#ifdef __cplusplus
}
#endif

#endif
