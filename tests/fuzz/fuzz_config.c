// libFuzzer target: arbitrary bytes into the draft- and target-config JSON entry points; a config that
// parses is printed (to /dev/null) and freed. Any crash, leak or sanitizer report is a bug.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "modeling/draft_config.h"
#include "modeling/target_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  df_error err = {0};
  const df_draft_config *draft = NULL;
  const df_target_config *target = NULL;
  FILE *null = fopen("/dev/null", "w");
  if (df_draft_config_from_json((const char *)data, size, "fuzz.json", &draft, &err) == DF_OK) {
    if (null) df_draft_config_print(draft, null);
  }
  if (df_target_config_from_json((const char *)data, size, "fuzz.json", &target, &err) == DF_OK) {
    if (null) df_target_config_print(target, null);
    if (draft) df_draft_config_check_target(draft, target, &err);
  }
  if (null) fclose(null);
  df_draft_config_free(draft);
  df_target_config_free(target);
  return 0;
}
