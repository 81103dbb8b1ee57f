#include "base/error.h"

#include <stdio.h>
#include <string.h>

df_status df_fail(df_error *err, df_status st, const char *src_file, int src_line, const char *where, const char *hint,
                  const char *fmt, ...) {
  if (!err) return st;
  err->status = st;
  err->src_file = src_file;
  err->src_line = src_line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  snprintf(err->where, sizeof err->where, "%s", where ? where : "");
  snprintf(err->hint, sizeof err->hint, "%s", hint ? hint : "");
  return st;
}

const char *df_status_name(df_status st) {
  switch (st) {
  case DF_OK: return "ok";
  case DF_ERR_INVALID: return "invalid";
  case DF_ERR_IO: return "io";
  case DF_ERR_FORMAT: return "format";
  case DF_ERR_NOMEM: return "out of memory";
  case DF_ERR_UNSUPPORTED: return "unsupported";
  case DF_ERR_NOT_IMPLEMENTED: return "not implemented";
  case DF_ERR_NUMERIC: return "numeric";
  }
  return "unknown";
}

const char *df_status_hint(df_status st) {
  switch (st) {
  case DF_OK: return "";
  case DF_ERR_INVALID: return "check the value named above (draftforge <command> --help lists the options)";
  case DF_ERR_IO: return "check that the path exists, is readable, and that the disk has room";
  case DF_ERR_FORMAT: return "the file is damaged or not in the expected format; re-create it";
  case DF_ERR_NOMEM: return "free memory, or lower training.batch_size / data.max_length";
  case DF_ERR_UNSUPPORTED: return "this build or backend cannot do it; see docs/ for what is supported";
  case DF_ERR_NOT_IMPLEMENTED: return "not implemented yet";
  case DF_ERR_NUMERIC:
    return "lower training.learning_rate, and check the data for NaN/Inf (draftforge inspect --full)";
  }
  return "run with --verbose for the source location";
}

void df_error_print_verbose(const df_error *err, bool with_location) {
  if (!err || err->status == DF_OK) return;
  fprintf(stderr, "error (%s): %s", df_status_name(err->status), err->msg);
  if (err->where[0] && !strstr(err->msg, err->where)) fprintf(stderr, " [%s]", err->where);
  fputc('\n', stderr);
  if (with_location && err->src_file) fprintf(stderr, "  (raised at %s:%d)\n", err->src_file, err->src_line);
  fprintf(stderr, "  HINT: %s\n", err->hint[0] ? err->hint : df_status_hint(err->status));
}

void df_error_print(const df_error *err) {
#ifdef NDEBUG
  df_error_print_verbose(err, false);
#else
  df_error_print_verbose(err, true);
#endif
}

void df_error_clear(df_error *err) {
  if (err) memset(err, 0, sizeof *err);
}
