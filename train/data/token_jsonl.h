// Token JSONL (tools/run/prepare_data.py's output, docs/data-format.md): one sample a line,
// {"input_ids": [int, ...], "loss_mask": [0|1, ...]} with equal lengths. Read line by line; errors name the
// file and line. The input of `draftforge capture`, the spec-decoding eval and online training (which reads a
// sample again by the offset of its line).
#ifndef DF_TRAIN_DATA_TOKEN_JSONL_H
#define DF_TRAIN_DATA_TOKEN_JSONL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef struct {
  FILE *fp;
  char *path;
  int64_t line;   // 1-based number of the line last read
  int64_t offset; // its byte offset in the file
  int64_t vocab;  // ids must be < vocab (0: unchecked)
  char *buf;      // the current line
  size_t buf_cap;
  int32_t *ids; // the current sample (len)
  uint8_t *mask;
  int64_t len, cap;
} df_token_jsonl;

df_status df_token_jsonl_open(const char *path, int64_t vocab, df_token_jsonl *r, df_error *err);
// Reads the next sample into r->ids / r->mask / r->len; *done is set at the end of the file. Blank lines are
// skipped (they still count for line numbers).
df_status df_token_jsonl_next(df_token_jsonl *r, bool *done, df_error *err);
// Reads the sample whose line starts at byte offset (a value of r->offset seen before); line is its number, for
// messages.
df_status df_token_jsonl_read_at(df_token_jsonl *r, int64_t offset, int64_t line, df_error *err);
void df_token_jsonl_close(df_token_jsonl *r);
// Number of samples (non-blank lines) in path.
df_status df_token_jsonl_count(const char *path, int64_t *n, df_error *err);

#endif
