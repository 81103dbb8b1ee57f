// CUDA MoE dispatch (the CPU twins: df_moe_slots_plan in moe/experts.c, the shared expert in moe/shared_expert.c):
// the exclusive scan of the expert counts, the stable sort of the T·k slots by expert (CUB's LSD radix sort, stable
// by construction: the CPU's counting-sort order), the inverse map, the combine-weight row scaling before the down
// projection, and the deterministic weighted gather-combine: each token adds its k expert rows in increasing sorted
// position, the order the CPU's scatter-add uses, with no atomics. Also the row kernels of the shared expert's gate.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cu_common.cuh"

namespace {

constexpr int kMaxK = 32;

__global__ void scan_counts(const int32_t *counts, int64_t E, int32_t *offsets) {
  if (threadIdx.x != 0) return;
  int32_t acc = 0;
  for (int64_t e = 0; e < E; e++) offsets[e] = acc, acc += counts[e];
  offsets[E] = acc;
}

__global__ void iota_kernel(int32_t *v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    v[i] = (int32_t)i;
}

__global__ void finish_plan(const int32_t *slot, int64_t Tk, int64_t k, int32_t *token, int32_t *pos_of_slot) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < Tk; p += (int64_t)gridDim.x * blockDim.x) {
    const int32_t sl = slot[p];
    token[p] = (int32_t)(sl / k);
    pos_of_slot[sl] = (int32_t)p;
  }
}

int key_bits(int64_t E) {
  int b = 1;
  while (b < 31 && ((int64_t)1 << b) < E) b++;
  return b;
}

size_t cub_bytes(int64_t Tk, int64_t E) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(NULL, bytes, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
                                  (int32_t *)NULL, (int)Tk, 0, key_bits(E));
  return bytes;
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

template <typename T>
__global__ void scale_rows_kernel(T *h, int64_t Tk, int64_t I, const float *w, const int32_t *slot) {
  const int64_t n = Tk * I;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(h + i, df_ld(h + i) * w[slot[i / I]]);
}

// Block per token: the k sorted positions in increasing order, then column sums in that order.
template <typename S, typename Y>
__global__ void combine_kernel(const S *ys, const int32_t *pos_of_slot, int64_t k, int64_t H, Y *y, bool acc) {
  __shared__ int32_t pos[kMaxK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int64_t j = 0; j < k; j++) {
      int32_t p = pos_of_slot[t * k + j];
      int64_t q = j;
      while (q > 0 && pos[q - 1] > p) pos[q] = pos[q - 1], q--;
      pos[q] = p;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float s = acc ? df_ld(y + t * H + c) : 0.0f;
    for (int64_t j = 0; j < k; j++) s += df_ld(ys + (int64_t)pos[j] * H + c);
    df_st(y + t * H + c, s);
  }
}

// Warp per sorted row: dweights[slot] = dh·act (double), then dh *= w[slot].
template <typename G, typename A>
__global__ void dweights_kernel(G *dh, const A *act, int64_t Tk, int64_t I, const float *w, const int32_t *slot,
                                float *dweights) {
  const int64_t p = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (p >= Tk) return;
  double dot = 0.0;
  for (int64_t i = lane; i < I; i += 32) dot += (double)df_ld(dh + p * I + i) * (double)df_ld(act + p * I + i);
  dot = df_warp_sum(dot);
  const int32_t sl = slot[p];
  if (lane == 0) dweights[sl] = (float)dot;
  const float c = w[sl];
  for (int64_t i = lane; i < I; i += 32) df_st(dh + p * I + i, df_ld(dh + p * I + i) * c);
}

template <typename T> __global__ void sigmoid_scale_kernel(float *z, T *a, int64_t S) {
  __shared__ float zt;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) zt = z[t] = (float)(1.0 / (1.0 + exp(-(double)z[t])));
  __syncthreads();
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) df_st(a + t * S + i, df_ld(a + t * S + i) * zt);
}

template <typename T> __global__ void rows_scale_kernel(const float *z, T *a, int64_t S, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    df_st(a + i, df_ld(a + i) * z[i / S]);
}

template <typename G, typename A>
__global__ void gate_bwd_kernel(const float *z, G *da, const A *act, int64_t S, float *dzeta) {
  __shared__ double red[32];
  const int64_t t = blockIdx.x;
  double dot = 0.0;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
    dot += (double)df_ld(da + t * S + i) * (double)df_ld(act + t * S + i);
  dot = df_block_sum(dot, red);
  const double zt = z[t];
  if (threadIdx.x == 0) dzeta[t] = (float)(zt * (1.0 - zt) * dot);
  const float zf = z[t];
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) df_st(da + t * S + i, df_ld(da + t * S + i) * zf);
}

unsigned grid_for(int64_t n) {
  unsigned b = df_cu_blocks(n, 256);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

} // namespace

extern "C" size_t df_cu_moe_plan_workspace(int64_t Tk, int64_t E) {
  return 2 * round256(sizeof(int32_t) * (size_t)(Tk > 0 ? Tk : 1)) + round256(cub_bytes(Tk > 0 ? Tk : 1, E));
}

extern "C" df_status df_cu_moe_plan(df_cu_stream s, int64_t T, int64_t k, int64_t E, const int32_t *indices,
                                    const int32_t *counts, int32_t *offsets, int32_t *slot, int32_t *token,
                                    int32_t *pos_of_slot, void *workspace, df_error *err) {
  const int64_t Tk = T * k;
  if (Tk > 2147483647) return DF_FAIL(err, DF_ERR_UNSUPPORTED, "moe_plan", NULL, "T·k = %lld > 2^31", (long long)Tk);
  scan_counts<<<1, 32, 0, s>>>(counts, E, offsets);
  DF_CU_CHECK_LAUNCH(err, "moe_plan.scan");
  if (Tk <= 0) return DF_OK;
  char *w = (char *)workspace;
  const size_t tb = round256(sizeof(int32_t) * (size_t)Tk);
  int32_t *keys_out = (int32_t *)w, *slots_in = (int32_t *)(w + tb);
  size_t temp = cub_bytes(Tk, E);
  iota_kernel<<<grid_for(Tk), 256, 0, s>>>(slots_in, Tk);
  DF_CU_CHECK_LAUNCH(err, "moe_plan.iota");
  cudaError_t e = cub::DeviceRadixSort::SortPairs(w + 2 * tb, temp, indices, keys_out, slots_in, slot, (int)Tk, 0,
                                                  key_bits(E), (cudaStream_t)s);
  if (e != cudaSuccess)
    return DF_FAIL(err, DF_ERR_INVALID, "moe_plan", NULL, "cub radix sort failed: %s", cudaGetErrorString(e));
  finish_plan<<<grid_for(Tk), 256, 0, s>>>(slot, Tk, k, token, pos_of_slot);
  DF_CU_CHECK_LAUNCH(err, "moe_plan.finish");
  return DF_OK;
}

extern "C" df_status df_cu_moe_scale_rows(df_cu_stream s, void *h, df_dtype dt, int64_t Tk, int64_t I, const float *w,
                                          const int32_t *slot, df_error *err) {
  if (Tk * I <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, T, err, "moe_scale_rows",
                  scale_rows_kernel<T><<<grid_for(Tk * I), 256, 0, s>>>((T *)h, Tk, I, w, slot));
  DF_CU_CHECK_LAUNCH(err, "moe_scale_rows");
  return DF_OK;
}

extern "C" df_status df_cu_moe_combine(df_cu_stream s, const void *ys, df_dtype ys_dt, const int32_t *pos_of_slot,
                                       int64_t T, int64_t k, int64_t H, void *y, df_dtype y_dt, bool accumulate,
                                       df_error *err) {
  if (k > kMaxK) return DF_FAIL(err, DF_ERR_UNSUPPORTED, "moe_combine", NULL, "k = %lld > %d", (long long)k, kMaxK);
  if (T <= 0) return DF_OK;
  DF_CU_SWITCH_DT(ys_dt, S, err, "moe_combine.ys",
                  DF_CU_SWITCH_DT(y_dt, Y, err, "moe_combine.y",
                                  combine_kernel<S, Y>
                                  <<<(unsigned)T, 256, 0, s>>>((const S *)ys, pos_of_slot, k, H, (Y *)y, accumulate)));
  DF_CU_CHECK_LAUNCH(err, "moe_combine");
  return DF_OK;
}

extern "C" df_status df_cu_moe_dweights(df_cu_stream s, void *dh, df_dtype dh_dt, const void *act, df_dtype act_dt,
                                        int64_t Tk, int64_t I, const float *w, const int32_t *slot, float *dweights,
                                        df_error *err) {
  if (Tk <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dh_dt, G, err, "moe_dweights.dh",
                  DF_CU_SWITCH_DT(act_dt, A, err, "moe_dweights.act",
                                  dweights_kernel<G, A><<<df_cu_blocks(Tk, 8), 256, 0, s>>>((G *)dh, (const A *)act, Tk,
                                                                                            I, w, slot, dweights)));
  DF_CU_CHECK_LAUNCH(err, "moe_dweights");
  return DF_OK;
}

extern "C" df_status df_cu_rows_sigmoid_scale(df_cu_stream s, float *z, void *a, df_dtype dt, int64_t T, int64_t S,
                                              df_error *err) {
  if (T <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, A, err, "rows_sigmoid_scale", sigmoid_scale_kernel<A><<<(unsigned)T, 256, 0, s>>>(z, (A *)a, S));
  DF_CU_CHECK_LAUNCH(err, "rows_sigmoid_scale");
  return DF_OK;
}

extern "C" df_status df_cu_rows_scale(df_cu_stream s, const float *z, void *a, df_dtype dt, int64_t T, int64_t S,
                                      df_error *err) {
  if (T * S <= 0) return DF_OK;
  DF_CU_SWITCH_DT(dt, A, err, "rows_scale", rows_scale_kernel<A><<<grid_for(T * S), 256, 0, s>>>(z, (A *)a, S, T * S));
  DF_CU_CHECK_LAUNCH(err, "rows_scale");
  return DF_OK;
}

extern "C" df_status df_cu_rows_gate_bwd(df_cu_stream s, const float *z, void *da, df_dtype da_dt, const void *act,
                                         df_dtype act_dt, int64_t T, int64_t S, float *dzeta, df_error *err) {
  if (T <= 0) return DF_OK;
  DF_CU_SWITCH_DT(da_dt, G, err, "rows_gate_bwd.da",
                  DF_CU_SWITCH_DT(act_dt, A, err, "rows_gate_bwd.act",
                                  gate_bwd_kernel<G, A>
                                  <<<(unsigned)T, 256, 0, s>>>(z, (G *)da, (const A *)act, S, dzeta)));
  DF_CU_CHECK_LAUNCH(err, "rows_gate_bwd");
  return DF_OK;
}
