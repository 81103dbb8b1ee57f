// The CPU backend table: host memory, synchronous copies and events, and the ops of kernels/cpu/*.c (each
// file sets its own slots). fp32 only: it is the oracle every other backend is tested against.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/context.h"

// One registration function per file of kernels/cpu/ (defined at the end of that file).
void df_cpu_register_linear(df_backend *be);
void df_cpu_register_rmsnorm(df_backend *be);
void df_cpu_register_rope(df_backend *be);
void df_cpu_register_swiglu(df_backend *be);
void df_cpu_register_embedding(df_backend *be);
void df_cpu_register_attention(df_backend *be);
void df_cpu_register_lmhead_ce(df_backend *be);
void df_cpu_register_dspark_loss(df_backend *be);
void df_cpu_register_lmhead_dspark(df_backend *be);
void df_cpu_register_optim(df_backend *be);
void df_cpu_register_elementwise(df_backend *be);
void df_cpu_register_gather(df_backend *be);
void df_cpu_register_metrics(df_backend *be);
void df_cpu_register_adamw_fused(df_backend *be);
void df_cpu_register_moe_router(df_backend *be);
void df_cpu_register_moe_dispatch(df_backend *be);
void df_cpu_register_moe_aux(df_backend *be);
void df_cpu_register_moe_experts(df_backend *be);
void df_cpu_register_causal_attn(df_backend *be);
void df_cpu_register_markov(df_backend *be);
void df_cpu_register_gru(df_backend *be);
void df_cpu_register_lmhead_domino(df_backend *be);
void df_cpu_register_domino_metrics(df_backend *be);
void df_cpu_register_ttt_attn(df_backend *be);
void df_cpu_register_eagle3_loss(df_backend *be);

static df_status cpu_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  (void)ctx;
  size_t rounded = (bytes + 63) / 64 * 64;
  *out = aligned_alloc(64, rounded ? rounded : 64);
  if (!*out)
    return DF_FAIL(err, DF_ERR_NOMEM, NULL, "reduce the batch or sequence length", "cannot allocate %zu bytes", bytes);
  return DF_OK;
}

static void cpu_free(df_ctx *ctx, void *p) {
  (void)ctx;
  free(p);
}

static df_status cpu_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                          bool async, df_error *err) {
  (void)ctx, (void)dst_dev, (void)src_dev, (void)async, (void)err;
  memmove(dst, src, bytes);
  return DF_OK;
}

// Ops run to completion before they return, so an event has nothing to wait for.
static df_status cpu_event_create(df_ctx *ctx, void **event, df_error *err) {
  (void)ctx, (void)err;
  *event = NULL;
  return DF_OK;
}

static df_status cpu_event_noop(df_ctx *ctx, void *event, df_error *err) {
  (void)ctx, (void)event, (void)err;
  return DF_OK;
}

static void cpu_event_destroy(df_ctx *ctx, void *event) { (void)ctx, (void)event; }

static df_status cpu_sync(df_ctx *ctx, df_error *err) {
  (void)ctx, (void)err;
  return DF_OK;
}

// fp32 compute only; bf16 buffers can be filled and cast (to read and write what a GPU run stores).
static bool cpu_supports(const df_ctx *ctx, df_op op, df_dtype storage) {
  (void)ctx;
  return storage == DF_F32 || (storage == DF_BF16 && (op == DF_OP_FILL || op == DF_OP_CAST));
}

static df_backend cpu_table;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_build(void) {
  cpu_table = (df_backend){.name = "cpu",
                           .device = DF_DEV_CPU,
                           .host_addressable = true,
                           .supports_op = cpu_supports,
                           .alloc = cpu_alloc,
                           .free = cpu_free,
                           .host_alloc = cpu_alloc,
                           .host_free = cpu_free,
                           .copy = cpu_copy,
                           .event_create = cpu_event_create,
                           .event_record = cpu_event_noop,
                           .event_wait = cpu_event_noop,
                           .event_destroy = cpu_event_destroy,
                           .sync = cpu_sync};
  df_cpu_register_linear(&cpu_table);
  df_cpu_register_rmsnorm(&cpu_table);
  df_cpu_register_rope(&cpu_table);
  df_cpu_register_swiglu(&cpu_table);
  df_cpu_register_embedding(&cpu_table);
  df_cpu_register_attention(&cpu_table);
  df_cpu_register_lmhead_ce(&cpu_table);
  df_cpu_register_dspark_loss(&cpu_table);
  df_cpu_register_lmhead_dspark(&cpu_table);
  df_cpu_register_optim(&cpu_table);
  df_cpu_register_elementwise(&cpu_table);
  df_cpu_register_gather(&cpu_table);
  df_cpu_register_metrics(&cpu_table);
  df_cpu_register_adamw_fused(&cpu_table);
  df_cpu_register_moe_router(&cpu_table);
  df_cpu_register_moe_dispatch(&cpu_table);
  df_cpu_register_moe_aux(&cpu_table);
  df_cpu_register_moe_experts(&cpu_table);
  df_cpu_register_causal_attn(&cpu_table);
  df_cpu_register_ttt_attn(&cpu_table);
  df_cpu_register_eagle3_loss(&cpu_table);
  df_cpu_register_markov(&cpu_table);
  df_cpu_register_gru(&cpu_table);
  df_cpu_register_lmhead_domino(&cpu_table);
  df_cpu_register_domino_metrics(&cpu_table);
}

const df_backend *df_cpu_backend(void) {
  pthread_once(&cpu_once, cpu_build);
  return &cpu_table;
}
