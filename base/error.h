// Status codes and the error record every fallible function fills.
// An error carries the message, the offending key/tensor/file ("where") and a hint for the user.
#ifndef DF_BASE_ERROR_H
#define DF_BASE_ERROR_H

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DF_OK = 0,
  DF_ERR_INVALID,         // bad argument, shape or value
  DF_ERR_IO,              // file or system call failed
  DF_ERR_FORMAT,          // a file or document is malformed
  DF_ERR_NOMEM,           // allocation failed
  DF_ERR_UNSUPPORTED,     // valid request this build or backend cannot serve
  DF_ERR_NOT_IMPLEMENTED, // planned, not written yet
  DF_ERR_NUMERIC,         // NaN/Inf or other numerical failure
} df_status;

typedef struct {
  df_status status;
  char msg[512];   // what went wrong
  char where[256]; // key, tensor name or path involved ("" if none)
  char hint[256];  // what the user can do ("" if none)
  const char *src_file;
  int src_line;
} df_error;

// Fills err (if not NULL) and returns st. where and hint may be NULL.
df_status df_fail(df_error *err, df_status st, const char *src_file, int src_line, const char *where, const char *hint,
                  const char *fmt, ...) __attribute__((format(printf, 7, 8)));

#define DF_FAIL(err, st, where, hint, ...) df_fail((err), (st), __FILE__, __LINE__, (where), (hint), __VA_ARGS__)

// Propagates a non-OK status from an expression.
#define DF_TRY(expr)                                                                                                   \
  do {                                                                                                                 \
    df_status df_try_st_ = (expr);                                                                                     \
    if (df_try_st_ != DF_OK) return df_try_st_;                                                                        \
  } while (0)

const char *df_status_name(df_status st);

// Writes "error (<status>): <msg> [<where>]\n  HINT: <hint>\n" to stderr. Every error ends with a HINT line: one
// that carries none gets its status's general advice. The source location ("(raised at train/x.c:N)") is added in
// builds without NDEBUG (Debug, sanitizer) only; df_error_print_verbose chooses.
void df_error_print(const df_error *err);
void df_error_print_verbose(const df_error *err, bool with_location);
// The general advice for a status, used when an error has no hint of its own.
const char *df_status_hint(df_status st);

void df_error_clear(df_error *err);

#ifdef __cplusplus
}
#endif

#endif
