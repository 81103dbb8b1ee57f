// docs/recipe-reference.md is generated from the schema table: the committed page must equal what
// `draftforge schema --markdown` prints now (regenerate it after adding or changing a schema row).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/recipe/recipe.h"

static char *read_all(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *buf = calloc((size_t)n + 1, 1);
  if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) buf[0] = '\0';
  fclose(fp);
  return buf;
}

Test(recipe_doc, committed_page_is_generated) {
  char *gen = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&gen, &len);
  df_recipe_print_reference(mem);
  fclose(mem);
  char *page = read_all(DF_SOURCE_DIR "/docs/recipe-reference.md");
  cr_assert(page, "docs/recipe-reference.md is missing");
  int line = 1;
  const char *a = page, *b = gen;
  while (*a && *a == *b) line += *a++ == '\n', b++;
  cr_expect(*a == '\0' && *b == '\0',
            "docs/recipe-reference.md differs from the schema table at line %d; regenerate it:\n"
            "  build/draftforge schema --markdown > docs/recipe-reference.md",
            line);
  free(page), free(gen);
}

Test(recipe_doc, lists_every_key_once_with_its_status) {
  char *gen = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&gen, &len);
  df_recipe_print_reference(mem);
  fclose(mem);
  cr_expect(strstr(gen, "| `training.learning_rate` | number | `1e-4` | used | same key | > 0 |") != NULL);
  cr_expect(strstr(gen, "| `training.adam_eps` | number | `1e-8` | used | — |") != NULL); // an extension
  cr_expect(strstr(gen, "| `model.target_backend` | choice | `sglang` | inert | same key |") != NULL);
  cr_expect(strstr(gen, "| `training.tp_size` | integer | `1` | unsupported | same key |") != NULL);
  cr_expect(strstr(gen, "| `training.strategy` | choice | `eagle3` | used | same key | `eagle3`, `dflash`, `dspark`, "
                        "`domino`, `peagle` |") != NULL);
  cr_expect(strstr(gen, "&lt;output_dir>/tensorboard") != NULL);
  int rows = 0;
  for (const char *p = gen; (p = strstr(p, "\n| `")); p++) rows++;
  int sections = 0; // the top-level rows naming sections have no row of their own
  for (const char *p = gen; (p = strstr(p, "\n## ")); p++) sections++;
  // top level, model, data, training, tracking, profiling, runtime, deployment, .trainer, .disaggregated,
  // .disaggregated.managed_local, its .mooncake and its capture_servers[] items
  cr_expect_eq(sections, 13);
  cr_expect(rows > 100, "%d rows", rows);
  free(gen);
}
