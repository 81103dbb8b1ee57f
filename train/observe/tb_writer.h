// TensorBoard event files (`tracking.report_to: tensorboard`): <output_dir>/tensorboard/events.out.tfevents.*,
// records of Event protos (train/observe/proto/tb_event.proto, encoded with protobuf-c) in TFRecord framing with
// masked CRC-32C. The trainer mirrors every metrics.jsonl line here (train/observe/metrics_log.h), on rank 0 only.
#ifndef DF_TRAIN_OBSERVE_TB_WRITER_H
#define DF_TRAIN_OBSERVE_TB_WRITER_H

#include <jansson.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_tb_writer df_tb_writer;

// Creates dir (and its parents) and a new event file in it, whose first record is the file version. A resumed
// run passes the step it resumes from (0: a fresh run): a SessionLog START at resume_step + 1 then tells
// TensorBoard to drop what an earlier file logged past the checkpoint, as metrics.jsonl does.
df_status df_tb_open(const char *dir, int64_t resume_step, df_tb_writer **out, df_error *err);
// Flushes and closes (NULL is a no-op).
void df_tb_close(df_tb_writer *w);
const char *df_tb_path(const df_tb_writer *w);

df_status df_tb_scalar(df_tb_writer *w, const char *tag, int64_t step, double value, df_error *err);
// A histogram with one bucket per index i, holding weights[i] (the MoE expert load: bucket e = expert e).
df_status df_tb_index_histogram(df_tb_writer *w, const char *tag, int64_t step, const double *weights, int64_t n,
                                df_error *err);
// Text for TensorBoard's Text tab (rendered as Markdown: pass code blocks indented by four spaces).
df_status df_tb_text(df_tb_writer *w, const char *tag, int64_t step, const char *text, df_error *err);

// One metrics.jsonl line as one event at its "step": every number (and boolean, as 0/1) becomes a scalar
// under its key; a list of numbers (per-position accuracy) becomes "<key>/<index>" scalars (nulls skipped);
// "moe/expert_load" {layer: [share per expert]} becomes, per layer, a histogram "moe/expert_load/layer_<L>"
// and the scalars "moe/layer_<L>/load_max_ratio" and ".../load_min_ratio" (max and min share times E).
// Strings, nulls and the step itself are not written.
df_status df_tb_metrics_line(df_tb_writer *w, const json_t *line, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
