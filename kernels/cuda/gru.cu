// CUDA GRU of Domino's prefix_gru (twin of kernels/cpu/gru.c): per step one cuBLASLt GEMM over the nb sequences
// (gh = s_{t−1}·W_hhᵀ into fp32 scratch) and one elementwise kernel (a thread per (sequence, unit); σ through a double
// exp and CUDA's tanhf, fp32 arithmetic over f32 or bf16 storage). The backward walks the steps in reverse: a kernel
// writes dgi and the hidden-side gradient dgh (storage dtype, the GEMMs' operand) and sets the carry to dh ⊙ z, then
// carry += dgh·W_hh and dW_hh += dghᵀ·s_{t−1} (β = 1, a fixed order: deterministic). Agrees with the CPU to fp32
// rounding, not bit for bit.
#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float gru_sigmoid(float x) { return (float)(1.0 / (1.0 + exp(-(double)x))); }

// Step t of every sequence: gh [nb, 3G] fp32 (NULL at t = 0: s_{−1} = 0).
template <typename T>
__global__ void gru_fwd_step(const T *gi, const float *gh, T *s, T *gates, int64_t nb, int64_t G, int64_t S,
                             int64_t t) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * G) return;
  const int64_t b = i / G, j = i % G, row = b * S + t;
  const T *x = gi + row * 3 * G;
  const float hr = gh ? gh[b * 3 * G + j] : 0.0f, hz = gh ? gh[b * 3 * G + G + j] : 0.0f,
              hn = gh ? gh[b * 3 * G + 2 * G + j] : 0.0f;
  const float r = gru_sigmoid(df_ld(x + j) + hr), z = gru_sigmoid(df_ld(x + G + j) + hz);
  const float n = tanhf(df_ld(x + 2 * G + j) + r * hn), prev = t ? df_ld(s + (row - 1) * G + j) : 0.0f;
  df_st(s + row * G + j, (1.0f - z) * n + z * prev);
  if (gates) {
    T *g = gates + row * 4 * G;
    df_st(g + j, r), df_st(g + G + j, z), df_st(g + 2 * G + j, n), df_st(g + 3 * G + j, hn);
  }
}

// Zeroes `width` columns of the rows t >= steps of every sequence.
template <typename T> __global__ void gru_zero_tail(T *x, int64_t nb, int64_t S, int64_t steps, int64_t width) {
  const int64_t tail = S - steps, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * tail * width) return;
  const int64_t c = i % width, rr = i / width, b = rr / tail, t = steps + rr % tail;
  df_st(x + (b * S + t) * width + c, 0.0f);
}

template <typename T>
__global__ void gru_bwd_step(const T *s, const T *gates, const T *ds, float *carry, T *dgi, T *dgh, int64_t nb,
                             int64_t G, int64_t S, int64_t t) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb * G) return;
  const int64_t b = i / G, j = i % G, row = b * S + t;
  const T *g = gates + row * 4 * G;
  const float r = df_ld(g + j), z = df_ld(g + G + j), n = df_ld(g + 2 * G + j), hn = df_ld(g + 3 * G + j);
  const float p = t ? df_ld(s + (row - 1) * G + j) : 0.0f, dh = df_ld(ds + row * G + j) + carry[i];
  const float dpn = dh * (1.0f - z) * (1.0f - n * n);
  const float dpz = dh * (p - n) * z * (1.0f - z);
  const float dpr = dpn * hn * r * (1.0f - r);
  T *dx = dgi + row * 3 * G, *dhh = dgh + b * 3 * G;
  df_st(dx + j, dpr), df_st(dx + G + j, dpz), df_st(dx + 2 * G + j, dpn);
  df_st(dhh + j, dpr), df_st(dhh + G + j, dpz), df_st(dhh + 2 * G + j, dpn * r);
  carry[i] = dh * z;
}

df_cu_gemm_args gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, const void *B,
                     int64_t ldb, df_dtype ab, void *D, int64_t ldd, df_dtype cd, float beta) {
  df_cu_gemm_args g = {};
  g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
  g.ab_dt = ab, g.D = D, g.ldd = ldd, g.cd_dt = cd, g.alpha = 1.0f, g.beta = beta;
  return g;
}

size_t esize(df_dtype dt) { return dt == DF_BF16 ? 2 : 4; }

} // namespace

static df_status cuda_gru_forward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *gi, const df_tensor *w_hh,
                                  df_tensor *s, df_tensor *gates, df_error *err) {
  const int64_t G = w_hh->shape[1], S = desc->stride, T = desc->steps, nb = df_numel(s) / (S * G);
  const df_dtype dt = w_hh->dtype;
  if (nb <= 0) return DF_OK;
  float *gh = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(float) * (size_t)(nb * 3 * G), (void **)&gh, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const cudaStream_t st = df_cuda_stream(ctx);
  const size_t es = esize(dt);
  for (int64_t t = 0; t < T; t++) {
    if (t > 0) {
      const df_cu_gemm_args q = gemm(false, true, nb, 3 * G, G, (const char *)s->data + (size_t)(t - 1) * G * es, S * G,
                                     w_hh->data, G, dt, gh, 3 * G, DF_F32, 0.0f);
      DF_TRY(df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &q, err));
    }
    DF_CU_SWITCH_DT(
        dt, E, err, "gru_forward",
        gru_fwd_step<E><<<df_cu_blocks(nb * G, kThreads), kThreads, 0, st>>>(
            (const E *)gi->data, t ? gh : NULL, (E *)s->data, gates ? (E *)gates->data : NULL, nb, G, S, t));
    DF_CU_CHECK_LAUNCH(err, "gru_fwd_step");
  }
  if (T < S) {
    DF_CU_SWITCH_DT(dt, E, err, "gru_forward",
                    gru_zero_tail<E>
                    <<<df_cu_blocks(nb * (S - T) * G, kThreads), kThreads, 0, st>>>((E *)s->data, nb, S, T, G));
    DF_CU_CHECK_LAUNCH(err, "gru_zero_tail");
    if (gates) {
      DF_CU_SWITCH_DT(dt, E, err, "gru_forward",
                      gru_zero_tail<E><<<df_cu_blocks(nb * (S - T) * 4 * G, kThreads), kThreads, 0, st>>>(
                          (E *)gates->data, nb, S, T, 4 * G));
      DF_CU_CHECK_LAUNCH(err, "gru_zero_tail");
    }
  }
  return DF_OK;
}

static df_status cuda_gru_backward(df_ctx *ctx, const df_gru_desc *desc, const df_tensor *w_hh, const df_tensor *s,
                                   const df_tensor *gates, const df_tensor *ds, df_tensor *dgi, df_tensor *dw_hh,
                                   df_error *err) {
  const int64_t G = w_hh->shape[1], S = desc->stride, T = desc->steps, nb = df_numel(s) / (S * G);
  const df_dtype dt = w_hh->dtype;
  if (nb <= 0) return DF_OK;
  const size_t es = esize(dt), cbytes = ((sizeof(float) * (size_t)(nb * G)) + 255) / 256 * 256;
  char *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, cbytes + es * (size_t)(nb * 3 * G), (void **)&ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  float *carry = (float *)ws;
  void *dgh = ws + cbytes;
  const cudaStream_t st = df_cuda_stream(ctx);
  DF_CU_TRY(err, cudaMemsetAsync(carry, 0, sizeof(float) * (size_t)(nb * G), st), "cudaMemsetAsync");
  for (int64_t t = T - 1; t >= 0; t--) {
    DF_CU_SWITCH_DT(dt, E, err, "gru_backward",
                    gru_bwd_step<E><<<df_cu_blocks(nb * G, kThreads), kThreads, 0, st>>>(
                        (const E *)s->data, (const E *)gates->data, (const E *)ds->data, carry, (E *)dgi->data,
                        (E *)dgh, nb, G, S, t));
    DF_CU_CHECK_LAUNCH(err, "gru_bwd_step");
    if (t == 0) break; // s_{−1} = 0: no W_hh term
    df_cu_gemm_args q = gemm(false, false, nb, G, 3 * G, dgh, 3 * G, w_hh->data, G, dt, carry, G, DF_F32, 1.0f);
    DF_TRY(df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &q, err));
    q = gemm(true, false, 3 * G, G, nb, dgh, 3 * G, (const char *)s->data + (size_t)(t - 1) * G * es, S * G, dt,
             dw_hh->data, G, dw_hh->dtype, 1.0f);
    DF_TRY(df_cu_gemm(df_cuda_gemm(ctx), df_cuda_cu_stream(ctx), &q, err));
  }
  if (T < S) {
    DF_CU_SWITCH_DT(dt, E, err, "gru_backward",
                    gru_zero_tail<E><<<df_cu_blocks(nb * (S - T) * 3 * G, kThreads), kThreads, 0, st>>>(
                        (E *)dgi->data, nb, S, T, 3 * G));
    DF_CU_CHECK_LAUNCH(err, "gru_zero_tail");
  }
  return DF_OK;
}

extern "C" void df_cuda_register_gru(df_backend *be) {
  be->gru_forward = cuda_gru_forward;
  be->gru_backward = cuda_gru_backward;
  be->measures[DF_OP_GRU_FORWARD] = be->measures[DF_OP_GRU_BACKWARD] = true;
}
