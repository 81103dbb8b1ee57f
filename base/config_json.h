// Typed reads of HF-style config JSON (jansson) whose errors name the file, the key path and a hint.
// Shared by the config parsers: modeling/draft_config*.c, modeling/target_config.c, modeling/target/target_spec.c
// and moe/config.c.
#ifndef DF_BASE_CONFIG_JSON_H
#define DF_BASE_CONFIG_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where a parse is and where its first error goes.
typedef struct {
  const char *source; // the file path, or the caller's name for an in-memory document
  df_error *err;
} df_cj;

enum { DF_CJ_PATH = 192 };          // longest key path we format ("dflash_config.target_layer_ids[12]")
enum { DF_CJ_MAX_FILE = 16 << 20 }; // a config.json above 16 MiB is not a config

// "prefix.key", or "key" when prefix is empty or NULL. Returns buf.
const char *df_cj_path(char buf[DF_CJ_PATH], const char *prefix, const char *key);
// "prefix[i]". Returns buf.
const char *df_cj_index(char buf[DF_CJ_PATH], const char *prefix, size_t i);

// Fills c->err with "<source>: <path>: <message>", where = path; returns st.
df_status df_cj_fail_at(const df_cj *c, df_status st, const char *src_file, int src_line, const char *path,
                        const char *hint, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
#define DF_CJ_FAIL(c, st, path, hint, ...) df_cj_fail_at((c), (st), __FILE__, __LINE__, (path), (hint), __VA_ARGS__)

// Parses a whole document that must be a JSON object. Duplicate keys are rejected; syntax errors give
// DF_ERR_FORMAT with the line and column; an unreadable file gives DF_ERR_IO.
df_status df_cj_load_file(const char *path, json_t **out, df_error *err);
df_status df_cj_load_buffer(const char *text, size_t len, const char *name, json_t **out, df_error *err);

// The document and source name a parsed config owns (its strings borrow from them).
typedef struct {
  json_t *root;
  char *source;
} df_cj_doc;

// One config kind for df_cj_finish: its owner (the public struct first, a df_cj_doc at doc_offset), the parse
// that fills the public fields (source included, from the doc), and the kind's free, which must accept a
// half-built owner.
typedef struct {
  size_t size, doc_offset;
  df_status (*build)(const df_cj *c, json_t *root, void *owner);
  void (*free)(void *owner);
} df_cj_kind;

// The tail every config loader shares: takes ownership of root (NULL when loading failed with st), allocates the
// owner, keeps root and a copy of source in its doc, builds, and frees everything when that fails. *out: the owner.
df_status df_cj_finish(const df_cj_kind *k, json_t *root, df_status st, const char *source, void **out, df_error *err);

// The value of key, or NULL when it is absent or JSON null (null means "not set" for optional keys).
json_t *df_cj_get(const json_t *obj, const char *key);
// v's JSON type with its article ("an integer"), for messages.
const char *df_cj_type_name(const json_t *v);

// Typed reads of a present value (v != NULL); path names it in errors.
df_status df_cj_int(const df_cj *c, const json_t *v, const char *path, int64_t lo, int64_t hi, int64_t *out);
// A number (integer or real) in (lo, hi] when lo_open, else [lo, hi].
df_status df_cj_real(const df_cj *c, const json_t *v, const char *path, double lo, bool lo_open, double hi,
                     double *out);
df_status df_cj_bool(const df_cj *c, const json_t *v, const char *path, bool *out);
df_status df_cj_string(const df_cj *c, const json_t *v, const char *path, const char **out);
// One of names[0..n), compared case-insensitively (SpecForge lower-cases these); *out is the index.
df_status df_cj_enum(const df_cj *c, const json_t *v, const char *path, const char *const *names, int n, int *out);

// Keyed reads from obj; the key path is prefix.key. A required key that is absent or null is an error;
// an optional one takes def.
df_status df_cj_req_int(const df_cj *c, const json_t *obj, const char *prefix, const char *key, int64_t lo, int64_t hi,
                        int64_t *out);
df_status df_cj_opt_int(const df_cj *c, const json_t *obj, const char *prefix, const char *key, int64_t def, int64_t lo,
                        int64_t hi, int64_t *out);
df_status df_cj_opt_real(const df_cj *c, const json_t *obj, const char *prefix, const char *key, double def, double lo,
                         bool lo_open, double hi, double *out);
df_status df_cj_opt_bool(const df_cj *c, const json_t *obj, const char *prefix, const char *key, bool def, bool *out);
// *out borrows the document's string (or def).
df_status df_cj_opt_string(const df_cj *c, const json_t *obj, const char *prefix, const char *key, const char *def,
                           const char **out);

#ifdef __cplusplus
}
#endif

#endif
