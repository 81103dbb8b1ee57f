// mkdir -p and atomic whole-file writes (see fsutil.h).
#define _GNU_SOURCE
#include "base/fsutil.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json_write.h"

df_status df_mkdirs(const char *path, const char *hint, df_error *err) {
  char p[4096];
  snprintf(p, sizeof p, "%s", path);
  for (char *c = p + 1; *c; c++) {
    if (*c != '/') continue;
    *c = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST) break;
    *c = '/';
  }
  if (mkdir(p, 0777) == 0 || errno == EEXIST) return DF_OK;
  return DF_FAIL(err, DF_ERR_IO, path, hint, "cannot create %s: %s", path, strerror(errno));
}

df_status df_write_file_atomic(const char *path, const char *data, size_t len, const char *hint, df_error *err) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%.4000s.tmp.%ld", path, (long)getpid());
  FILE *fp = fopen(tmp, "w");
  bool ok = fp && fwrite(data, 1, len, fp) == len;
  ok = fp && fflush(fp) == 0 && fsync(fileno(fp)) == 0 && ok;
  if (fp) ok = fclose(fp) == 0 && ok;
  if (ok && rename(tmp, path) == 0) return DF_OK;
  int e = errno;
  remove(tmp);
  return DF_FAIL(err, DF_ERR_IO, path, hint, "cannot write %s: %s", path, strerror(e));
}

df_status df_write_json_atomic(const char *path, const json_t *o, size_t flags, const char *hint, df_error *err) {
  char *text = o ? df_json_dumps(o, flags) : NULL;
  size_t n = text ? strlen(text) : 0;
  char *buf = text ? realloc(text, n + 2) : NULL;
  if (!buf) {
    free(text);
    return DF_FAIL(err, DF_ERR_NOMEM, path, NULL, "out of memory");
  }
  buf[n] = '\n', buf[n + 1] = 0;
  df_status st = df_write_file_atomic(path, buf, n + 1, hint, err);
  free(buf);
  return st;
}
