// libFuzzer target for the safetensors reader: arbitrary bytes go through df_st_open_memory; whatever parses
// must satisfy the reader's promises (tiling, lookup by name) and convert every tensor to fp32.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/safetensors.h"

// Aborts so libFuzzer records the input: a parsed file broke an invariant the reader promises.
static void require(int ok) {
  if (!ok) __builtin_trap();
}

static void check_parsed(const df_st_file *f) {
  df_error err;
  uint64_t covered = 0;
  for (int i = 0; i < df_st_count(f); i++) {
    const df_st_tensor *t = df_st_at(f, i);
    require(t->begin == covered && t->end >= t->begin);
    require((uint64_t)t->numel * df_st_dtype_size(t->dtype) == t->end - t->begin);
    require(df_st_find(f, t->name) == t);
    covered = t->end;
    float *buf = malloc(sizeof(float) * (size_t)(t->numel + 1));
    require(buf != NULL);
    require(df_st_read_f32(f, t, buf, t->numel, &err) == DF_OK);
    free(buf);
    char shape[128];
    df_st_shape_str(t, shape, sizeof shape);
  }
  require(covered == df_st_data_size(f));
  for (int i = 0; i < df_st_metadata_count(f); i++) {
    const char *k, *v;
    df_st_metadata_at(f, i, &k, &v);
    require(k && v && df_st_metadata_get(f, k) != NULL);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  df_st_file *f = NULL;
  df_error err;
  if (df_st_open_memory(data, size, "fuzz.safetensors", &f, &err) != DF_OK) {
    require(f == NULL && err.msg[0] && strstr(err.where, "fuzz.safetensors") == err.where);
    return 0;
  }
  check_parsed(f);
  df_st_close(f);
  return 0;
}
