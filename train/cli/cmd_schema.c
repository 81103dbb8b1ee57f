// `draftforge schema [--markdown]`: every recipe key of the schema table (train/recipe/recipe_schema.c), as a plain
// table or as docs/recipe-reference.md.
#include <stdio.h>

#include "train/cli/cli.h"
#include "train/cli/commands.h"
#include "train/recipe/recipe.h"

static const df_cli_opt SCHEMA_OPTS[] = {
    {"--markdown", NULL, DF_CLI_FLAG, "off: one line per key",
     "print docs/recipe-reference.md: a Markdown table per section with SpecForge's key"},
    DF_CLI_END};

static const df_cli_spec SCHEMA_CLI = {
    "schema",
    NULL,
    0,
    0,
    "Prints every recipe key draftforge knows: its type, default, range or choices, and whether draftforge uses\n"
    "it (used), accepts it without effect (inert), or accepts only its default (unsupported, with the reason).",
    SCHEMA_OPTS};

int df_cmd_schema(int argc, char **argv) {
  df_cli_args a;
  int rc = df_cli_parse(&SCHEMA_CLI, argc, argv, &a);
  if (rc) return df_cli_free(&a), rc == 1 ? DF_EXIT_OK : rc;
  if (df_cli_has(&a, "--markdown"))
    df_recipe_print_reference(stdout);
  else
    df_recipe_print_schema(stdout);
  df_cli_free(&a);
  return DF_EXIT_OK;
}
