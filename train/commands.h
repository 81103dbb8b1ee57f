// The draftforge subcommands: each takes the arguments after its name and returns the process exit code.
#ifndef DF_TRAIN_COMMANDS_H
#define DF_TRAIN_COMMANDS_H

int df_cmd_inspect(int argc, char **argv);

#endif
