// CUDA MoE training statistics (the CPU twins: moe/router.c centering, moe/aux_loss.c, moe/balance.c, the EMA in
// moe/layer.c): per-sample router-input centering forward and backward, the fixed (eval) centering, the running
// mean's EMA update, the noaux_tc bias update, the switch aux loss with its score-gradient row, and the load
// statistics. Every reduction runs in double over a fixed partition and order; the state updates run on the
// device, so a training step needs no host round trip for them.
#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kRowChunk = 1024;

// Block per 32 columns, (32, 8) threads: per sample, column means of its rps rows; u = x − mean (fwd) or
// dx (=/+=) du − mean (bwd). batch_mean: the mean of the per-sample means.
template <bool kBwd>
__global__ void center_kernel(const float *x, int64_t T, int64_t H, int64_t rps, float *out, float *batch_mean,
                              bool acc) {
  __shared__ double part[8][32];
  __shared__ float mean[32];
  const int64_t c = blockIdx.x * 32 + threadIdx.x, B = T / rps;
  double total = 0.0;
  for (int64_t b = 0; b < B; b++) {
    const float *xb = x + b * rps * H;
    double s = 0.0;
    if (c < H)
      for (int64_t r = threadIdx.y; r < rps; r += 8) s += xb[r * H + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0) {
      double t = 0.0;
      for (int i = 0; i < 8; i++) t += part[i][threadIdx.x];
      mean[threadIdx.x] = (float)(t / (double)rps);
      total += t / (double)rps;
    }
    __syncthreads();
    if (c < H) {
      float *ob = out + b * rps * H;
      for (int64_t r = threadIdx.y; r < rps; r += 8) {
        const float v = xb[r * H + c] - mean[threadIdx.x];
        ob[r * H + c] = kBwd && acc ? ob[r * H + c] + v : v;
      }
    }
    __syncthreads(); // part and mean are rewritten for the next sample
  }
  if (!kBwd && batch_mean && threadIdx.y == 0 && c < H) batch_mean[c] = (float)(total / (double)B);
}

__global__ void center_fixed_kernel(const float *x, const float *mu, int64_t T, int64_t H, float *u) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    u[i] = x[i] - mu[i % H];
}

// One block: every thread reads *steps before thread 0 increments it.
__global__ void center_ema_kernel(int64_t H, const float *stash, float *mu, float *steps, double rho) {
  const bool first = *steps == 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x)
    mu[c] = first ? stash[c] : (float)(rho * (double)mu[c] + (1.0 - rho) * (double)stash[c]);
  __syncthreads();
  if (threadIdx.x == 0) *steps += 1.0f;
}

__global__ void noaux_kernel(int64_t E, const int32_t *counts, float *bias, float rate) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) s += (double)(float)counts[e];
  s = df_block_sum(s, red);
  const double mean = s / (double)E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const double gap = mean - (double)(float)counts[e];
    const float sgn = gap > 0 ? 1.0f : (gap < 0 ? -1.0f : 0.0f);
    bias[e] += rate * sgn;
  }
}

// partial[p, e] = Σ over rows of chunk p of scores[t, e] (double). Block (32, 8) per 32 columns and one chunk.
__global__ void colsum_kernel(const float *scores, int64_t T, int64_t E, double *partial) {
  __shared__ double part[8][32];
  const int64_t e = blockIdx.x * 32 + threadIdx.x, p = blockIdx.y;
  const int64_t t0 = p * kRowChunk, t1 = t0 + kRowChunk < T ? t0 + kRowChunk : T;
  double s = 0.0;
  if (e < E)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += 8) s += scores[t * E + e];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < E) {
    double q = 0.0;
    for (int i = 0; i < 8; i++) q += part[i][threadIdx.x];
    partial[p * E + e] = q;
  }
}

__global__ void switch_loss_kernel(const double *partial, int64_t P, int64_t T, int64_t E, const int32_t *counts,
                                   double coeff, double *loss) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    double col = 0.0;
    for (int64_t p = 0; p < P; p++) col += partial[p * E + e];
    s += ((double)counts[e] / (double)T) * (col / (double)T);
  }
  s = df_block_sum(s, red);
  if (threadIdx.x == 0) *loss = coeff * (double)E * s;
}

__global__ void switch_grad_kernel(double c, int64_t E, const int32_t *counts, float *row) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < E; e += (int64_t)gridDim.x * blockDim.x)
    row[e] = (float)(c * counts[e]);
}

__global__ void load_stats_kernel(const int32_t *counts, int64_t E, int64_t T, int64_t k, double *out) {
  if (threadIdx.x != 0) return;
  if (E <= 0 || T <= 0 || k <= 0) {
    out[0] = out[1] = out[2] = 0.0;
    return;
  }
  int32_t mx = counts[0], mn = counts[0];
  int64_t unused = 0;
  for (int64_t e = 0; e < E; e++) {
    mx = counts[e] > mx ? counts[e] : mx;
    mn = counts[e] < mn ? counts[e] : mn;
    unused += counts[e] == 0;
  }
  const double uniform = (double)T * (double)k / (double)E;
  out[0] = mx / uniform, out[1] = mn / uniform, out[2] = (double)unused / (double)E;
}

df_status check_rps(int64_t T, int64_t rps, df_error *err) {
  if (rps <= 0 || T % rps)
    return DF_FAIL(err, DF_ERR_INVALID, "rows_per_sample", "sample centering needs whole samples of rows",
                   "%lld rows do not split into samples of %lld rows", (long long)T, (long long)rps);
  return DF_OK;
}

} // namespace

extern "C" df_status df_cu_moe_center_sample_fwd(df_cu_stream s, const float *x, int64_t T, int64_t H, int64_t rps,
                                                 float *u, float *batch_mean, df_error *err) {
  DF_TRY(check_rps(T, rps, err));
  if (T <= 0 || H <= 0) return DF_OK;
  center_kernel<false><<<(unsigned)((H + 31) / 32), dim3(32, 8), 0, s>>>(x, T, H, rps, u, batch_mean, false);
  DF_CU_CHECK_LAUNCH(err, "moe_center_sample_fwd");
  return DF_OK;
}

extern "C" df_status df_cu_moe_center_sample_bwd(df_cu_stream s, const float *du, int64_t T, int64_t H, int64_t rps,
                                                 float *dx, bool accumulate, df_error *err) {
  DF_TRY(check_rps(T, rps, err));
  if (T <= 0 || H <= 0) return DF_OK;
  center_kernel<true><<<(unsigned)((H + 31) / 32), dim3(32, 8), 0, s>>>(du, T, H, rps, dx, NULL, accumulate);
  DF_CU_CHECK_LAUNCH(err, "moe_center_sample_bwd");
  return DF_OK;
}

extern "C" df_status df_cu_moe_center_fixed(df_cu_stream s, const float *x, const float *mu, int64_t T, int64_t H,
                                            float *u, df_error *err) {
  if (T * H <= 0) return DF_OK;
  const unsigned b = df_cu_blocks(T * H, 256), grid = b > 65535u * 8u ? 65535u * 8u : b;
  center_fixed_kernel<<<grid, 256, 0, s>>>(x, mu, T, H, u);
  DF_CU_CHECK_LAUNCH(err, "moe_center_fixed");
  return DF_OK;
}

extern "C" df_status df_cu_moe_center_ema(df_cu_stream s, int64_t H, const float *stash, float *mu, float *steps,
                                          double rho, df_error *err) {
  center_ema_kernel<<<1, 1024, 0, s>>>(H, stash, mu, steps, rho);
  DF_CU_CHECK_LAUNCH(err, "moe_center_ema");
  return DF_OK;
}

extern "C" df_status df_cu_moe_noaux_update(df_cu_stream s, int64_t E, const int32_t *counts, float *bias, float rate,
                                            df_error *err) {
  if (E <= 0) return DF_OK;
  noaux_kernel<<<1, 1024, 0, s>>>(E, counts, bias, rate);
  DF_CU_CHECK_LAUNCH(err, "moe_noaux_update");
  return DF_OK;
}

extern "C" size_t df_cu_moe_aux_workspace(int64_t T, int64_t E) {
  const int64_t P = (T + kRowChunk - 1) / kRowChunk;
  return sizeof(double) * (size_t)(P * E > 0 ? P * E : 1);
}

extern "C" df_status df_cu_moe_switch_loss(df_cu_stream s, double coeff, int64_t T, int64_t E, const float *scores,
                                           const int32_t *counts, void *workspace, double *d_loss, df_error *err) {
  if (T <= 0) {
    DF_CU_TRY(err, cudaMemsetAsync(d_loss, 0, sizeof(double), (cudaStream_t)s), "moe_switch_loss");
    return DF_OK;
  }
  const int64_t P = (T + kRowChunk - 1) / kRowChunk;
  colsum_kernel<<<dim3((unsigned)((E + 31) / 32), (unsigned)P), dim3(32, 8), 0, s>>>(scores, T, E, (double *)workspace);
  DF_CU_CHECK_LAUNCH(err, "moe_switch_loss.colsum");
  switch_loss_kernel<<<1, 512, 0, s>>>((const double *)workspace, P, T, E, counts, coeff, d_loss);
  DF_CU_CHECK_LAUNCH(err, "moe_switch_loss");
  return DF_OK;
}

extern "C" df_status df_cu_moe_switch_grad_row(df_cu_stream s, double coeff, int64_t T, int64_t E,
                                               const int32_t *counts, double upstream, float *row, df_error *err) {
  const double c = T > 0 ? upstream * coeff * (double)E / ((double)T * (double)T) : 0.0;
  switch_grad_kernel<<<df_cu_blocks(E, 256), 256, 0, s>>>(c, E, counts, row);
  DF_CU_CHECK_LAUNCH(err, "moe_switch_grad_row");
  return DF_OK;
}

extern "C" df_status df_cu_moe_load_stats(df_cu_stream s, const int32_t *counts, int64_t E, int64_t T, int64_t k,
                                          double *d_out, df_error *err) {
  load_stats_kernel<<<1, 32, 0, s>>>(counts, E, T, k, d_out);
  DF_CU_CHECK_LAUNCH(err, "moe_load_stats");
  return DF_OK;
}
