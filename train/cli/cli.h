// The subcommands' command lines: one table of options per subcommand (name, value, default, help) that drives
// both the parser and `--help`. Adding an option is one line in the command's table plus reading it.
// Exit codes of every subcommand: 0 success, 1 failure, 2 bad usage or bad arguments.
#ifndef DF_TRAIN_CLI_CLI_H
#define DF_TRAIN_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DF_EXIT_OK = 0, DF_EXIT_FAILURE = 1, DF_EXIT_USAGE = 2 };

typedef enum {
  DF_CLI_FLAG,   // --name
  DF_CLI_VALUE,  // --name VALUE or --name=VALUE (the last one given wins)
  DF_CLI_REPEAT, // --name VALUE, any number of times, in order
} df_cli_kind;

typedef struct {
  const char *name;    // "--out"
  const char *metavar; // "DIR"; NULL for a flag
  df_cli_kind kind;
  const char *def; // the default as --help shows it: "bfloat16", "required", "off", ...
  const char *help;
} df_cli_opt;

#define DF_CLI_END                                                                                                     \
  { NULL, NULL, DF_CLI_FLAG, NULL, NULL }

typedef struct {
  const char *name;       // "export"
  const char *positional; // the synopsis of the positional arguments: "CHECKPOINT"
  int min_pos, max_pos;
  const char *about;      // what the command does (lines of at most ~110 characters)
  const df_cli_opt *opts; // ends with DF_CLI_END; -h/--help and --verbose are added to every command
} df_cli_spec;

enum { DF_CLI_MAX_OPTS = 32, DF_CLI_MAX_POS = 16 };

typedef struct {
  const df_cli_spec *spec;
  int npos;
  const char *pos[DF_CLI_MAX_POS];
  const char *val[DF_CLI_MAX_OPTS]; // VALUE: the last value, FLAG: "1"; NULL when not given
  int nrep[DF_CLI_MAX_OPTS];
  const char **rep[DF_CLI_MAX_OPTS]; // REPEAT: every value (NULL-terminated), freed by df_cli_free
  bool verbose;                      // --verbose: errors show their source location
} df_cli_args;

// Parses argv (the arguments after the command's name). Returns 0 to run; 1 after printing --help on stdout
// (exit 0); 2 after printing a usage error with a HINT on stderr (exit 2).
int df_cli_parse(const df_cli_spec *spec, int argc, char **argv, df_cli_args *a);
void df_cli_free(df_cli_args *a);
void df_cli_print_help(const df_cli_spec *spec, FILE *fp);

// The value of a VALUE option (NULL when absent), whether a FLAG or VALUE option was given, a REPEAT list.
const char *df_cli_get(const df_cli_args *a, const char *name);
bool df_cli_has(const df_cli_args *a, const char *name);
const char *const *df_cli_list(const df_cli_args *a, const char *name, int *n);

// An integer option in [lo, hi] (def when absent). A bad value prints a usage error; returns false.
bool df_cli_int(const df_cli_args *a, const char *name, long long lo, long long hi, long long def, long long *out);
// A size in bytes (0 when absent): a positive number with an optional unit, SI (KB, MB, GB, TB: powers of 1000) or
// binary (KiB, MiB, GiB, TiB), case-insensitive, or none / B for bytes ("141GB", "80GiB", "81920MiB"). A bad value
// prints a usage error; returns false.
bool df_cli_bytes(const df_cli_args *a, const char *name, int64_t *out);
// One of choices (NULL-terminated; *out its index, def when absent). A bad value prints a usage error.
bool df_cli_choice(const df_cli_args *a, const char *name, const char *const *choices, int def, int *out);

// Prints "draftforge <cmd>: <message>" and a HINT naming --help to stderr; returns DF_EXIT_USAGE.
int df_cli_usage_error(const df_cli_spec *spec, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
