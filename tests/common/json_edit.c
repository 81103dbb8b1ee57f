#include "tests/common/json_edit.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

json_t *df_test_config_doc(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/configs/%s", DF_SOURCE_DIR, name);
  json_error_t jerr;
  json_t *d = json_load_file(path, 0, &jerr);
  cr_assert_not_null(d, "%s: %s", path, jerr.text);
  return d;
}

json_t *df_test_json(const char *text) {
  json_error_t jerr;
  json_t *v = json_loads(text, JSON_DECODE_ANY, &jerr);
  cr_assert_not_null(v, "bad test JSON %s: %s", text, jerr.text);
  return v;
}

void df_test_json_set(json_t *d, const char *path, json_t *value) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  char *dot = strchr(buf, '.');
  if (dot) {
    *dot = 0;
    json_t *inner = json_object_get(d, buf);
    if (!json_is_object(inner)) {
      inner = json_object();
      json_object_set_new(d, buf, inner);
    }
    df_test_json_set(inner, dot + 1, value);
    return;
  }
  if (value)
    json_object_set_new(d, buf, value);
  else
    json_object_del(d, buf);
}
