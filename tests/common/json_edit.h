// Test helpers for building config documents: load a shipped config, parse a JSON literal, and set or
// delete a key at a dotted path. Each fails the current test on bad input.
#ifndef DF_TESTS_JSON_EDIT_H
#define DF_TESTS_JSON_EDIT_H

#include <jansson.h>

// configs/<name> from the source tree.
json_t *df_test_config_doc(const char *name);
// Any JSON value (objects, arrays, scalars).
json_t *df_test_json(const char *text);
// Sets (value != NULL, stolen) or deletes the key at a dotted path such as "dflash_config.mask_token_id";
// missing intermediate objects are created.
void df_test_json_set(json_t *d, const char *path, json_t *value);

#endif
