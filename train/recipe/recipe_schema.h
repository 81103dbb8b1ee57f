// The recipe schema table (internal to train/recipe*.c): one row per (section, key) of SpecForge's run config
// with its type, default, range or choices, and how far draftforge implements it.
#ifndef DF_TRAIN_RECIPE_RECIPE_SCHEMA_H
#define DF_TRAIN_RECIPE_RECIPE_SCHEMA_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DF_RT_STRING,       // a string (plain or quoted); a plain scalar that reads as a number or bool is rejected
  DF_RT_PATH,         // a file or directory, resolved against the current directory as SpecForge does
  DF_RT_INT,          // an integer (a float with no fraction is accepted, as pydantic does)
  DF_RT_FLOAT,        // a number
  DF_RT_BOOL,         // true/false (and YAML 1.1's yes/no/on/off, as PyYAML reads them)
  DF_RT_ENUM,         // one of `choices`
  DF_RT_INT_LIST,     // a sequence of integers
  DF_RT_STRING_LIST,  // a sequence of strings
  DF_RT_SECTION,      // a nested mapping whose keys are the rows with section "<parent>.<key>" (or "<key>")
  DF_RT_MAPPING_LIST, // a sequence of mappings whose keys are the rows with section "<parent>.<key>[]"; only
                      // inside sections draftforge refuses, so the items are listed, not validated
} df_recipe_type;

typedef enum {
  DF_RS_DEFAULT_ONLY = 0, // not implemented yet: accepted only at its default (null when the default is unset)
  DF_RS_USED,             // draftforge reads it
  DF_RS_INERT,            // validated, accepted with any valid value: it cannot change what draftforge computes
} df_recipe_support;

typedef struct {
  const char *section; // "" top level, "model", "deployment.trainer", ...
  const char *key;
  df_recipe_type type;
  bool nullable; // Optional[...] in SpecForge: null is a valid value
  bool required;
  const char *def;      // the default as YAML text; NULL = unset (null)
  bool has_lo, lo_open; // numeric lower bound (open: gt, closed: ge)
  double lo;
  bool has_hi, hi_open;
  double hi;
  const char *const *choices;   // DF_RT_ENUM: every value SpecForge accepts (NULL-terminated)
  const char *const *supported; // DF_RT_ENUM: the subset draftforge implements; NULL = all of them
  df_recipe_support support;
  const char *note; // why it is inert or not implemented; shown in errors and the schema print
  bool input;       // DF_RT_PATH read by the run: a relative value must exist (named with the directory it was
                    // resolved against)
  bool hub;         // ... or, like transformers' from_pretrained, may be a Hugging Face hub id found in the cache
  const char *hint; // what to do instead when a value is refused (NULL: "remove it or set its default")
} df_recipe_key;

// The table, in SpecForge's order; df_recipe_schema_count() rows.
const df_recipe_key *df_recipe_schema(void);
int df_recipe_schema_count(void);
// The row for section.key; -1 when there is none.
int df_recipe_schema_find(const char *section, const char *key);
// Whether `section` names a mapping of the schema ("" for the top level).
bool df_recipe_schema_is_section(const char *section);

#ifdef __cplusplus
}
#endif

#endif
