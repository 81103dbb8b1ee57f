// JSON text as draftforge writes it: jansson's layout (indent, compact, sorted keys, string escapes) with every
// real number in the shortest form that reads back to the same double, spelled as Python's repr spells it
// (1e-06, 0.1, 123456.0, 1e+16), so config.json, metrics.jsonl and eval.json read like SpecForge's files.
#ifndef DF_BASE_JSON_WRITE_H
#define DF_BASE_JSON_WRITE_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DF_JSON_REAL_MAX = 32 }; // longest text df_json_format_real writes, with its NUL

// The shortest decimal that strtod reads back as x, in Python repr's layout: positional for 1e-4 <= |x| < 1e16
// (always with a '.'), else d.ddde±XX. Non-finite x gives "NaN" / "Infinity" / "-Infinity" (not JSON; jansson
// never holds them). Returns the length.
int df_json_format_real(double x, char buf[DF_JSON_REAL_MAX]);

// json_dumps with the same flags (JSON_INDENT(n), JSON_COMPACT, JSON_SORT_KEYS, JSON_ENSURE_ASCII,
// JSON_ESCAPE_SLASH, JSON_ENCODE_ANY), reals written by df_json_format_real (JSON_REAL_PRECISION is ignored).
// Returns a malloc'd string, or NULL when j is NULL (or not an array/object without JSON_ENCODE_ANY) or out of
// memory.
char *df_json_dumps(const json_t *j, size_t flags);

// As json_dumpf: df_json_dumps written to fp. Returns 0 on success, -1 on failure.
int df_json_dumpf(const json_t *j, FILE *fp, size_t flags);

#ifdef __cplusplus
}
#endif

#endif
