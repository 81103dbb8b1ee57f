// State every CUDA op file shares (private to kernels/cuda/): the context's device, stream and cuBLAS /
// cuBLASLt handles with the cuBLASLt workspace, plus the error helpers and the checked-launch macro. Each op
// file kernels/cuda/<family>.cu includes this, defines its ops and a df_cuda_register_<family> that fills its
// slots of the table; kernels/cuda/backend.cu lists the register functions.
#ifndef DF_KERNELS_CUDA_BACKEND_H
#define DF_KERNELS_CUDA_BACKEND_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/check.h"
#include "kernels/cuda/launch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int device;
  cudaStream_t stream; // every op and copy of the context is queued here, in order
  cublasHandle_t blas; // bound to stream
  cublasLtHandle_t blaslt;
  void *lt_workspace; // cuBLASLt's workspace on the device
  size_t lt_workspace_bytes;
  df_cu_gemm_ctx *gemm; // cuBLASLt descriptors and heuristics cached per shape (kernels/cuda/gemm.cu)
} df_cuda_state;

static inline df_cuda_state *df_cuda_of(const df_ctx *ctx) { return (df_cuda_state *)ctx->state; }
static inline cudaStream_t df_cuda_stream(const df_ctx *ctx) { return df_cuda_of(ctx)->stream; }

// An error naming the failed call and the CUDA / cuBLAS status.
df_status df_cuda_fail(df_error *err, cudaError_t e, const char *what);
df_status df_cuda_blas_fail(df_error *err, cublasStatus_t s, const char *what);

// Grid size for n elements at `threads` per block.
static inline unsigned df_cuda_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// After every kernel launch: a launch error (bad configuration, no device) fails the op, naming the kernel.
#define DF_CUDA_CHECK_LAUNCH(err, kernel)                                                                              \
  do {                                                                                                                 \
    cudaError_t df_cuda_e_ = cudaGetLastError();                                                                       \
    if (df_cuda_e_ != cudaSuccess) return df_cuda_fail((err), df_cuda_e_, (kernel));                                   \
  } while (0)

// A runtime call that must succeed.
#define DF_CUDA_TRY(err, call)                                                                                         \
  do {                                                                                                                 \
    cudaError_t df_cuda_e_ = (call);                                                                                   \
    if (df_cuda_e_ != cudaSuccess) return df_cuda_fail((err), df_cuda_e_, #call);                                      \
  } while (0)

static inline df_cu_stream df_cuda_cu_stream(const df_ctx *ctx) { return (df_cu_stream)df_cuda_of(ctx)->stream; }
static inline df_cu_gemm_ctx *df_cuda_gemm(const df_ctx *ctx) { return df_cuda_of(ctx)->gemm; }

// One registration function per op file (kernels/cuda/<family>.cu).
void df_cuda_register_linear(df_backend *be);
void df_cuda_register_elementwise(df_backend *be);
void df_cuda_register_rmsnorm(df_backend *be);
void df_cuda_register_rope(df_backend *be);
void df_cuda_register_swiglu(df_backend *be);
void df_cuda_register_embedding(df_backend *be);
void df_cuda_register_gather(df_backend *be);
void df_cuda_register_attention(df_backend *be);
void df_cuda_register_lmhead_ce(df_backend *be);
void df_cuda_register_dspark_loss(df_backend *be);
void df_cuda_register_lmhead_dspark(df_backend *be);
void df_cuda_register_metrics(df_backend *be);
void df_cuda_register_optim(df_backend *be);
void df_cuda_register_adamw_fused(df_backend *be);
void df_cuda_register_moe(df_backend *be);
void df_cuda_register_moe_grouped(df_backend *be);
void df_cuda_register_markov(df_backend *be);
void df_cuda_register_causal_attn(df_backend *be);
void df_cuda_register_gru(df_backend *be);
void df_cuda_register_lmhead_domino(df_backend *be);
void df_cuda_register_domino_metrics(df_backend *be);
void df_cuda_register_ttt_attn(df_backend *be);
void df_cuda_register_eagle3_loss(df_backend *be);

#ifdef __cplusplus
}
#endif

#endif
