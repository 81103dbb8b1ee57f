// Greedy generation with the target and its KV cache, and the end-of-sequence ids of an HF directory.
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "modeling/target/target_model.h"

static void add_eos(const json_t *v, int32_t *ids, int *n) {
  if (json_is_integer(v)) {
    json_int_t x = json_integer_value(v);
    for (int i = 0; i < *n; i++)
      if (ids[i] == x) return;
    if (*n < DF_TARGET_MAX_EOS && x >= 0 && x <= INT32_MAX) ids[(*n)++] = (int32_t)x;
  } else if (json_is_array(v)) {
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) add_eos(e, ids, n);
  }
}

df_status df_target_eos_ids(const char *dir, int32_t *ids, int *n, df_error *err) {
  *n = 0;
  static const char *const files[] = {"config.json", "generation_config.json"};
  for (size_t f = 0; f < 2; f++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, files[f]);
    FILE *fp = fopen(path, "r");
    if (!fp) {
      if (f == 0) return DF_FAIL(err, DF_ERR_IO, path, "pass an HF model directory", "cannot open %s", path);
      continue;
    }
    json_error_t je;
    json_t *o = json_loadf(fp, 0, &je);
    fclose(fp);
    if (!o) return DF_FAIL(err, DF_ERR_FORMAT, path, NULL, "%s:%d: %s", path, je.line, je.text);
    add_eos(json_object_get(o, "eos_token_id"), ids, n);
    const json_t *tc = json_object_get(o, "text_config");
    if (tc) add_eos(json_object_get(tc, "eos_token_id"), ids, n);
    json_decref(o);
  }
  return DF_OK;
}

static bool is_eos(int32_t tok, const int32_t *eos, int n) {
  for (int i = 0; i < n; i++)
    if (eos[i] == tok) return true;
  return false;
}

df_status df_target_generate_greedy(df_target *t, df_target_cache *c, const int32_t *prompt, int64_t P, int64_t max_new,
                                    const int32_t *eos, int n_eos, int32_t *out, int64_t *n_out, df_error *err) {
  *n_out = 0;
  if (P < 1) return DF_FAIL(err, DF_ERR_INVALID, "prompt", "generation needs a prompt of >= 1 token", "empty prompt");
  DF_TRY(df_target_cache_truncate(c, 0, err));
  if (max_new < 1) return DF_OK;
  int32_t next;
  df_target_outputs o = {.logits_from = P - 1, .argmax = &next};
  DF_TRY(df_target_forward(t, c, prompt, P, &o, err));
  for (;;) {
    out[(*n_out)++] = next;
    if (*n_out >= max_new || is_eos(next, eos, n_eos)) return DF_OK;
    const int32_t in = next;
    df_target_outputs d = {.logits_from = 0, .argmax = &next};
    DF_TRY(df_target_forward(t, c, &in, 1, &d, err));
  }
}
