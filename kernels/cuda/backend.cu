// The CUDA backend table: context lifetime (device, stream, cuBLAS / cuBLASLt handles, workspace and the GEMM
// descriptor cache), device and pinned host memory, stream-ordered copies, events, sync, the storage dtypes it
// takes, and the op slots the files of kernels/cuda/ fill (kernels/backend.h lists the file of each op).
#include <mutex>
#include <stdlib.h>

#include "kernels/cuda/backend.h"

extern "C" df_status df_cuda_fail(df_error *err, cudaError_t e, const char *what) {
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, what, "check the driver and CUDA_VISIBLE_DEVICES", "%s: %s", what,
                 cudaGetErrorString(e));
}

extern "C" df_status df_cuda_blas_fail(df_error *err, cublasStatus_t s, const char *what) {
  return DF_FAIL(err, DF_ERR_INVALID, what, NULL, "%s failed with cuBLAS status %d", what, (int)s);
}

static int cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

enum { LT_WORKSPACE_BYTES = 32 << 20 }; // what cuBLASLt's heuristics want for large bf16 GEMMs on Hopper

static void cuda_destroy(df_ctx *ctx) {
  df_cuda_state *cs = df_cuda_of(ctx);
  if (!cs) return;
  df_cu_gemm_ctx_destroy(cs->gemm);
  df_buffer_free(ctx, cs->lt_workspace); // accounted: kernels/context.c
  if (cs->blaslt) cublasLtDestroy(cs->blaslt);
  if (cs->blas) cublasDestroy(cs->blas);
  if (cs->stream) cudaStreamDestroy(cs->stream);
  free(cs);
  ctx->state = NULL;
}

static df_status cuda_init(df_ctx *ctx, const df_ctx_options *opt, df_error *err) {
  const int n = cuda_device_count();
  if (opt->cuda_device < 0 || opt->cuda_device >= n)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "device", "use the CPU backend (--device cpu) on a machine without a GPU",
                   "CUDA device %d requested but %d device(s) are visible", opt->cuda_device, n);
  df_cuda_state *cs = (df_cuda_state *)calloc(1, sizeof *cs);
  if (!cs) return DF_FAIL(err, DF_ERR_NOMEM, NULL, NULL, "cannot allocate the CUDA backend state");
  ctx->state = cs;
  cs->device = opt->cuda_device;
  cudaError_t e = cudaSetDevice(cs->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cuda_destroy(ctx);
    return df_cuda_fail(err, e, "cudaSetDevice/cudaStreamCreate");
  }
  // Through the context's accounting (a measuring context counts the same bytes: state_device_bytes).
  df_status ws = df_buffer_alloc_as(ctx, DF_MEM_WORKSPACE, LT_WORKSPACE_BYTES, &cs->lt_workspace, err);
  if (ws != DF_OK) {
    cuda_destroy(ctx);
    return ws;
  }
  cs->lt_workspace_bytes = LT_WORKSPACE_BYTES;
  cublasStatus_t s = cublasCreate(&cs->blas);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(cs->blas, cs->stream);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtCreate(&cs->blaslt);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cuda_destroy(ctx);
    return df_cuda_blas_fail(err, s, "cublasCreate");
  }
  df_status st = df_cu_gemm_ctx_create(cs->blaslt, cs->blas, cs->lt_workspace, cs->lt_workspace_bytes, &cs->gemm, err);
  if (st != DF_OK) cuda_destroy(ctx);
  return st;
}

// fp32 storage for every op; bf16 storage for the ops whose kernels read and write it (the losses over raw logit
// pairs, the block metrics, the unfused optimizer ops and the target's KV-cache attention stay fp32: their
// callers never hold bf16 there).
static bool cuda_supports(const df_ctx *ctx, df_op op, df_dtype storage) {
  (void)ctx;
  if (storage == DF_F32) return true;
  if (storage != DF_BF16) return false;
  switch (op) {
  case DF_OP_CAUSAL_ATTN_FORWARD:
  case DF_OP_SOFTMAX_L1_FORWARD:
  case DF_OP_SOFTMAX_L1_BACKWARD:
  case DF_OP_BCE_LOGITS_FORWARD:
  case DF_OP_BCE_LOGITS_BACKWARD:
  case DF_OP_DPACE_WEIGHTS:
  case DF_OP_BLOCK_METRICS:
  case DF_OP_DSPARK_BLOCK_METRICS:
  case DF_OP_ADAMW_STEP:
  case DF_OP_GLOBAL_NORM:
  case DF_OP_CLIP_BY_NORM:
  case DF_OP_TTT_ATTN_FORWARD: // EAGLE-3's ops keep fp32 storage (the compact teacher's lse pass takes bf16)
  case DF_OP_TTT_ATTN_BACKWARD:
  case DF_OP_EAGLE3_TEACHER:
  case DF_OP_EAGLE3_LOSS_FORWARD:
  case DF_OP_EAGLE3_LOSS_BACKWARD:
  case DF_OP_EAGLE3_STEP_SUMS:
  case DF_OP_EAGLE3_ACCEPT: return false;
  default: return true;
  }
}

static df_status cuda_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  (void)ctx;
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
  return e == cudaSuccess ? DF_OK : df_cuda_fail(err, e, "cudaMalloc");
}

static void cuda_free(df_ctx *ctx, void *p) {
  (void)ctx;
  cudaFree(p);
}

static df_status cuda_host_alloc(df_ctx *ctx, size_t bytes, void **out, df_error *err) {
  (void)ctx;
  cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
  return e == cudaSuccess ? DF_OK : df_cuda_fail(err, e, "cudaMallocHost");
}

static void cuda_host_free(df_ctx *ctx, void *p) {
  (void)ctx;
  cudaFreeHost(p);
}

static df_status cuda_copy(df_ctx *ctx, void *dst, df_device dst_dev, const void *src, df_device src_dev, size_t bytes,
                           bool async, df_error *err) {
  const cudaMemcpyKind kind = src_dev == DF_DEV_CPU
                                  ? (dst_dev == DF_DEV_CPU ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                              : dst_dev == DF_DEV_CPU ? cudaMemcpyDeviceToHost
                                                      : cudaMemcpyDeviceToDevice;
  cudaStream_t st = df_cuda_stream(ctx);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, st);
  if (e == cudaSuccess && !async) e = cudaStreamSynchronize(st);
  return e == cudaSuccess ? DF_OK : df_cuda_fail(err, e, "cudaMemcpyAsync");
}

static df_status cuda_event_create(df_ctx *ctx, void **event, df_error *err) {
  (void)ctx;
  cudaEvent_t ev;
  DF_CUDA_TRY(err, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  *event = (void *)ev;
  return DF_OK;
}

static df_status cuda_event_record(df_ctx *ctx, void *event, df_error *err) {
  DF_CUDA_TRY(err, cudaEventRecord((cudaEvent_t)event, df_cuda_stream(ctx)));
  return DF_OK;
}

static df_status cuda_event_wait(df_ctx *ctx, void *event, df_error *err) {
  (void)ctx;
  DF_CUDA_TRY(err, cudaEventSynchronize((cudaEvent_t)event));
  return DF_OK;
}

static void cuda_event_destroy(df_ctx *ctx, void *event) {
  (void)ctx;
  if (event) cudaEventDestroy((cudaEvent_t)event);
}

static df_status cuda_sync(df_ctx *ctx, df_error *err) {
  cudaError_t e = cudaStreamSynchronize(df_cuda_stream(ctx));
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? DF_OK : df_cuda_fail(err, e, "cudaStreamSynchronize");
}

static df_backend cuda_table;

static void cuda_build(void) {
  cuda_table.name = "cuda";
  cuda_table.device = DF_DEV_CUDA;
  cuda_table.host_addressable = false;
  cuda_table.device_count = cuda_device_count;
  cuda_table.init = cuda_init;
  cuda_table.destroy = cuda_destroy;
  cuda_table.supports_op = cuda_supports;
  cuda_table.alloc = cuda_alloc;
  cuda_table.free = cuda_free;
  cuda_table.host_alloc = cuda_host_alloc;
  cuda_table.host_free = cuda_host_free;
  cuda_table.copy = cuda_copy;
  cuda_table.event_create = cuda_event_create;
  cuda_table.event_record = cuda_event_record;
  cuda_table.event_wait = cuda_event_wait;
  cuda_table.event_destroy = cuda_event_destroy;
  cuda_table.sync = cuda_sync;
  cuda_table.state_device_bytes = LT_WORKSPACE_BYTES;
  df_cuda_register_linear(&cuda_table);
  df_cuda_register_elementwise(&cuda_table);
  df_cuda_register_rmsnorm(&cuda_table);
  df_cuda_register_rope(&cuda_table);
  df_cuda_register_swiglu(&cuda_table);
  df_cuda_register_embedding(&cuda_table);
  df_cuda_register_gather(&cuda_table);
  df_cuda_register_attention(&cuda_table);
  df_cuda_register_lmhead_ce(&cuda_table);
  df_cuda_register_dspark_loss(&cuda_table);
  df_cuda_register_lmhead_dspark(&cuda_table);
  df_cuda_register_metrics(&cuda_table);
  df_cuda_register_optim(&cuda_table);
  df_cuda_register_adamw_fused(&cuda_table);
  df_cuda_register_moe(&cuda_table);
  df_cuda_register_moe_grouped(&cuda_table);
  df_cuda_register_markov(&cuda_table);
  df_cuda_register_causal_attn(&cuda_table);
  df_cuda_register_gru(&cuda_table);
  df_cuda_register_lmhead_domino(&cuda_table);
  df_cuda_register_domino_metrics(&cuda_table);
  df_cuda_register_ttt_attn(&cuda_table);
  df_cuda_register_eagle3_loss(&cuda_table);
}

extern "C" const df_backend *df_cuda_backend(void) {
  static std::once_flag once;
  std::call_once(once, cuda_build);
  return &cuda_table;
}
