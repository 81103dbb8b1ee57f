// The draftforge subcommands: each takes the arguments after its name and returns the process exit code
// (0 success, 1 failure, 2 bad usage or arguments); each parses its options from a table (train/cli/cli.h) that
// also makes its --help.
#ifndef DF_TRAIN_CLI_COMMANDS_H
#define DF_TRAIN_CLI_COMMANDS_H

int df_cmd_inspect(int argc, char **argv);
// `draftforge train [RECIPE.yaml] [--set section.key=value ...] [--resume PATH|auto] ...` (train/cli/cmd_train.c).
int df_cmd_train(int argc, char **argv);
int df_cmd_export(int argc, char **argv);  // train/cli/cmd_export.c
int df_cmd_eval(int argc, char **argv);    // train/cli/cmd_eval.c
int df_cmd_schema(int argc, char **argv);  // train/cli/cmd_schema.c: `draftforge schema [--markdown]`
int df_cmd_plot(int argc, char **argv);    // train/cli/cmd_plot.c: `draftforge plot RUN_DIR [--out DIR]`
int df_cmd_capture(int argc, char **argv); // train/cli/cmd_capture.c
// `draftforge eval --spec-decode ...` (train/cli/cmd_eval_spec.c); df_cmd_eval hands over when it sees the flag.
int df_cmd_eval_spec(int argc, char **argv);

#endif
