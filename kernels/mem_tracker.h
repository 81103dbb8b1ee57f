// The memory accounting behind every context (private to kernels/context.c): the live buffers by address with their
// bytes and tags, the counts of kernels/ops.h's df_mem_stats, and — in measure mode — the PROT_NONE address ranges
// the measuring context's buffers come from.
#ifndef DF_KERNELS_MEM_TRACKER_H
#define DF_KERNELS_MEM_TRACKER_H

#include "kernels/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_mem_tracker df_mem_tracker;

df_mem_tracker *df_mem_tracker_new(void);
// Frees the table and unmaps the measure ranges (their buffers need no other freeing).
void df_mem_tracker_free(df_mem_tracker *m);
df_mem_tag df_mem_tracker_tag(const df_mem_tracker *m);
df_mem_tag df_mem_tracker_set_tag(df_mem_tracker *m, df_mem_tag tag);
df_mem_stats df_mem_tracker_stats(const df_mem_tracker *m);

// A buffer of `bytes` on ctx's device (host: page-locked host memory), accounted under tag (host memory under the
// host count): from the backend, or on a measuring context from a measure range (device) or the C heap (host).
df_status df_mem_alloc(df_ctx *ctx, df_mem_tag tag, size_t bytes, bool host, void **out, df_error *err);
// Frees what df_mem_alloc returned (host or device, as it was allocated) and takes it off the counts.
void df_mem_free(df_ctx *ctx, void *p);
// Whether p lies in one of m's measure ranges (a measuring context's device memory).
bool df_mem_is_measured(const df_mem_tracker *m, const void *p);

#ifdef __cplusplus
}
#endif

#endif
