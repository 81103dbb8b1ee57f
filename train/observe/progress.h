// The training progress line on a terminal: one line redrawn in place ("\r ... ESC[K") as steps go by, with
// every other message of the run (eval, checkpoint, notes) printed above it. When the output is not a terminal
// the trainer prints plain lines at each log step instead and never uses this module.
#ifndef DF_TRAIN_OBSERVE_PROGRESS_H
#define DF_TRAIN_OBSERVE_PROGRESS_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_progress_term df_progress_term;

// Whether fp is an interactive terminal worth redrawing on (a tty, and TERM is not "dumb").
bool df_progress_is_terminal(FILE *fp);

// A progress display on tty. width: the columns a line may use (0: ask the terminal, else 100).
df_status df_progress_term_open(FILE *tty, int width, df_progress_term **out, df_error *err);
// The stream for every other message: writing a whole line to it clears the progress line, prints the
// message, and draws the progress line again below it. Line buffered; owned by p.
FILE *df_progress_term_log(df_progress_term *p);
// Shows line (cut to the width) in place. Redraws at most ten times a second unless force is set.
void df_progress_term_update(df_progress_term *p, const char *line, bool force);
// Leaves the last progress line on screen (ends it with a newline) and closes the log stream. NULL: no-op.
void df_progress_term_close(df_progress_term *p);

#ifdef __cplusplus
}
#endif

#endif
