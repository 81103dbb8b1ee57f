// CUDA Markov-head ops of DSpark (twin of kernels/cpu/markov.c): the gated head's gate and the rnn head's cell,
// forward and backward. Elementwise, one thread per element, fp32 arithmetic over f32 or bf16 storage; σ goes
// through a double exp as on the CPU, tanh is CUDA's tanhf (a few ulps from libm's), so results agree with the
// CPU to fp32 rounding, not bit for bit.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

enum { MARKOV_THREADS = 256 };

__device__ __forceinline__ float markov_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

template <typename T> __global__ void markov_gate_fwd_kernel(const T *pre, const T *e, T *gate, T *u, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = markov_sigmoid(df_ld(pre + i)), ev = df_ld(e + i); // read before gate (may alias pre) is written
  df_st(gate + i, s);
  df_st(u + i, s * ev);
}

template <typename T>
__global__ void markov_gate_bwd_kernel(const T *gate, const T *e, const T *du, T *de, T *dpre, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = df_ld(gate + i), ev = df_ld(e + i), d = df_ld(du + i);
  df_st(de + i, df_ld(de + i) + d * g);
  df_st(dpre + i, d * ev * g * (1.0f - g));
}

// One thread per (block b, column j) of slot k.
template <typename T>
__global__ void markov_rnn_fwd_kernel(const T *y, const T *s_prev, T *s, T *u, int64_t nb, int64_t r, int64_t bs,
                                      int64_t k) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * r) return;
  const int64_t b = i / r, j = i % r;
  const T *yr = y + b * 3 * r;
  const float g = markov_sigmoid(df_ld(yr + j)), tc = tanhf(df_ld(yr + r + j));
  const float prev = s_prev ? df_ld(s_prev + i) : 0.0f;
  df_st(s + i, g * prev + (1.0f - g) * tc);
  df_st(u + (b * bs + k) * r + j, tanhf(df_ld(yr + 2 * r + j)));
}

template <typename T>
__global__ void markov_rnn_bwd_kernel(const T *y, const T *s_prev, const T *du, T *ds, T *dy, int64_t nb, int64_t r,
                                      int64_t bs, int64_t k) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * r) return;
  const int64_t b = i / r, j = i % r;
  const T *yr = y + b * 3 * r;
  T *dyr = dy + b * 3 * r;
  const float g = markov_sigmoid(df_ld(yr + j)), tc = tanhf(df_ld(yr + r + j)), to = tanhf(df_ld(yr + 2 * r + j));
  const float prev = s_prev ? df_ld(s_prev + i) : 0.0f, dsk = df_ld(ds + i);
  df_st(dyr + j, dsk * (prev - tc) * g * (1.0f - g));
  df_st(dyr + r + j, dsk * (1.0f - g) * (1.0f - tc * tc));
  df_st(dyr + 2 * r + j, du ? df_ld(du + (b * bs + k) * r + j) * (1.0f - to * to) : 0.0f);
  df_st(ds + i, dsk * g);
}

extern "C" df_status df_cu_markov_gate_fwd(df_cu_stream st, df_dtype dt, const void *pre, const void *e, void *gate,
                                           void *u, int64_t n, df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "markov_gate_forward",
                  markov_gate_fwd_kernel<T><<<df_cu_blocks(n, MARKOV_THREADS), MARKOV_THREADS, 0, st>>>(
                      (const T *)pre, (const T *)e, (T *)gate, (T *)u, n));
  DF_CU_CHECK_LAUNCH(err, "markov_gate_fwd_kernel");
  return DF_OK;
}

extern "C" df_status df_cu_markov_gate_bwd(df_cu_stream st, df_dtype dt, const void *gate, const void *e,
                                           const void *du, void *de, void *dpre, int64_t n, df_error *err) {
  if (n <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "markov_gate_backward",
                  markov_gate_bwd_kernel<T><<<df_cu_blocks(n, MARKOV_THREADS), MARKOV_THREADS, 0, st>>>(
                      (const T *)gate, (const T *)e, (const T *)du, (T *)de, (T *)dpre, n));
  DF_CU_CHECK_LAUNCH(err, "markov_gate_bwd_kernel");
  return DF_OK;
}

extern "C" df_status df_cu_markov_rnn_fwd(df_cu_stream st, df_dtype dt, const void *y, const void *s_prev, void *s,
                                          void *u, int64_t nb, int64_t r, int64_t bs, int64_t slot, df_error *err) {
  if (nb * r <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "markov_rnn_forward",
                  markov_rnn_fwd_kernel<T><<<df_cu_blocks(nb * r, MARKOV_THREADS), MARKOV_THREADS, 0, st>>>(
                      (const T *)y, (const T *)s_prev, (T *)s, (T *)u, nb, r, bs, slot));
  DF_CU_CHECK_LAUNCH(err, "markov_rnn_fwd_kernel");
  return DF_OK;
}

extern "C" df_status df_cu_markov_rnn_bwd(df_cu_stream st, df_dtype dt, const void *y, const void *s_prev,
                                          const void *du, void *ds, void *dy, int64_t nb, int64_t r, int64_t bs,
                                          int64_t slot, df_error *err) {
  if (nb * r <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "markov_rnn_backward",
                  markov_rnn_bwd_kernel<T><<<df_cu_blocks(nb * r, MARKOV_THREADS), MARKOV_THREADS, 0, st>>>(
                      (const T *)y, (const T *)s_prev, (const T *)du, (T *)ds, (T *)dy, nb, r, bs, slot));
  DF_CU_CHECK_LAUNCH(err, "markov_rnn_bwd_kernel");
  return DF_OK;
}

// ---- the backend table's Markov slots --------------------------------------------------------------------------

static df_status cuda_markov_gate_forward(df_ctx *ctx, const df_tensor *pre, const df_tensor *e, df_tensor *gate,
                                          df_tensor *u, df_error *err) {
  return df_cu_markov_gate_fwd(df_cuda_cu_stream(ctx), e->dtype, pre->data, e->data, gate->data, u->data, df_numel(e),
                               err);
}

static df_status cuda_markov_gate_backward(df_ctx *ctx, const df_tensor *gate, const df_tensor *e, const df_tensor *du,
                                           df_tensor *de, df_tensor *dpre, df_error *err) {
  return df_cu_markov_gate_bwd(df_cuda_cu_stream(ctx), e->dtype, gate->data, e->data, du->data, de->data, dpre->data,
                               df_numel(e), err);
}

static df_status cuda_markov_rnn_forward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                         const df_tensor *s_prev, df_tensor *s, df_tensor *u, df_error *err) {
  return df_cu_markov_rnn_fwd(df_cuda_cu_stream(ctx), y->dtype, y->data, s_prev ? s_prev->data : NULL, s->data, u->data,
                              y->shape[0], y->shape[1] / 3, desc->block_size, desc->slot, err);
}

static df_status cuda_markov_rnn_backward(df_ctx *ctx, const df_markov_rnn_desc *desc, const df_tensor *y,
                                          const df_tensor *s_prev, const df_tensor *du, df_tensor *ds, df_tensor *dy,
                                          df_error *err) {
  return df_cu_markov_rnn_bwd(df_cuda_cu_stream(ctx), y->dtype, y->data, s_prev ? s_prev->data : NULL,
                              du ? du->data : NULL, ds->data, dy->data, y->shape[0], y->shape[1] / 3, desc->block_size,
                              desc->slot, err);
}

extern "C" void df_cuda_register_markov(df_backend *be) {
  be->markov_gate_forward = cuda_markov_gate_forward;
  be->markov_gate_backward = cuda_markov_gate_backward;
  be->markov_rnn_forward = cuda_markov_rnn_forward;
  be->markov_rnn_backward = cuda_markov_rnn_backward;
}
