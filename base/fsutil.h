// Small file-system helpers shared by the train/ writers: mkdir -p and an atomic whole-file write (temporary
// sibling, fsynced, then renamed over the target). The containing directory is not fsynced; callers that need
// that durability (checkpoint directories) do it themselves.
#ifndef DF_BASE_FSUTIL_H
#define DF_BASE_FSUTIL_H

#include <jansson.h>
#include <stddef.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// mkdir -p path (mode 0777 before umask); an existing directory is fine. hint goes into the error.
df_status df_mkdirs(const char *path, const char *hint, df_error *err);

// Writes len bytes to path through <path>.tmp.<pid> (fflush + fsync, then renamed over path); the temporary
// is removed on failure. hint goes into the error.
df_status df_write_file_atomic(const char *path, const char *data, size_t len, const char *hint, df_error *err);

// As df_write_file_atomic, with json_dumps(o, flags) followed by a newline as the contents (o NULL: out of memory).
df_status df_write_json_atomic(const char *path, const json_t *o, size_t flags, const char *hint, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
