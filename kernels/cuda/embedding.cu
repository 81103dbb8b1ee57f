// CUDA embedding gather and its deterministic scatter-add backward. The backward sorts the (id, token) pairs
// stably by id with CUB's radix sort (ships with the toolkit), then one thread block per distinct id adds that
// id's dout rows in token order into dtable: no atomics, the same bits on every run, the CPU's per-id order.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

template <typename S, typename D>
__global__ void gather_kernel(const S *table, const int32_t *ids, D *out, int64_t T, int64_t V, int64_t H) {
  const int64_t n = T * H;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / H, c = i % H;
    const int32_t id = ids[t];
    df_st(out + i, id >= 0 && id < V ? df_ld(table + (int64_t)id * H + c) : 0.0f);
  }
}

__global__ void iota_kernel(int32_t *v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    v[i] = (int32_t)i;
}

// Block p starts work only where a run of equal ids begins; its threads own columns and add the run's rows in
// sorted (= token) order.
template <typename G, typename D>
__global__ void segment_add_kernel(const int32_t *keys, const int32_t *tokens, const G *dout, D *dtable, int64_t T,
                                   int64_t V, int64_t H) {
  const int64_t p = blockIdx.x;
  if (p >= T || (p > 0 && keys[p] == keys[p - 1])) return;
  const int32_t id = keys[p];
  if (id < 0 || id >= V) return;
  int64_t q1 = p + 1;
  while (q1 < T && keys[q1] == id) q1++;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
    float acc = df_ld(dtable + (int64_t)id * H + c);
    for (int64_t q = p; q < q1; q++) acc += df_ld(dout + (int64_t)tokens[q] * H + c);
    df_st(dtable + (int64_t)id * H + c, acc);
  }
}

int key_bits(int64_t V) {
  int b = 1;
  while (b < 31 && ((int64_t)1 << b) < V) b++;
  return b;
}

size_t cub_temp_bytes(int64_t T, int64_t V) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(NULL, bytes, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
                                  (int32_t *)NULL, (int)T, 0, key_bits(V));
  return bytes;
}

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

} // namespace

extern "C" df_status df_cu_embedding_fwd(df_cu_stream s, const void *table, df_dtype tab_dt, const int32_t *ids,
                                         void *out, df_dtype out_dt, int64_t T, int64_t V, int64_t H, df_error *err) {
  const int64_t n = T * H;
  if (n <= 0) return DF_OK;
  unsigned blocks = df_cu_blocks(n, 256);
  if (blocks > 65535u * 8u) blocks = 65535u * 8u;
  DF_CU_SWITCH_DT(tab_dt, S, err, "embedding.table",
                  DF_CU_SWITCH_DT(out_dt, D, err, "embedding.out",
                                  gather_kernel<S, D>
                                  <<<blocks, 256, 0, s>>>((const S *)table, ids, (D *)out, T, V, H)));
  DF_CU_CHECK_LAUNCH(err, "embedding_fwd");
  return DF_OK;
}

extern "C" size_t df_cu_embedding_bwd_workspace(int64_t T, int64_t V) {
  if (T <= 0) return 0;
  return 3 * round256(sizeof(int32_t) * (size_t)T) + round256(cub_temp_bytes(T, V));
}

extern "C" df_status df_cu_embedding_bwd(df_cu_stream s, const void *dout, df_dtype dout_dt, const int32_t *ids,
                                         void *dtable, df_dtype dt_dt, int64_t T, int64_t V, int64_t H, void *workspace,
                                         df_error *err) {
  if (T <= 0 || H <= 0) return DF_OK;
  if (T > 2147483647) return DF_FAIL(err, DF_ERR_UNSUPPORTED, "embedding_bwd", NULL, "T = %lld > 2^31", (long long)T);
  char *w = (char *)workspace;
  const size_t tb = round256(sizeof(int32_t) * (size_t)T);
  int32_t *keys_out = (int32_t *)w, *tok_in = (int32_t *)(w + tb), *tok_out = (int32_t *)(w + 2 * tb);
  void *temp = w + 3 * tb;
  size_t temp_bytes = cub_temp_bytes(T, V);
  iota_kernel<<<df_cu_blocks(T, 256), 256, 0, s>>>(tok_in, T);
  DF_CU_CHECK_LAUNCH(err, "embedding_bwd.iota");
  cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, tok_in, tok_out, (int)T, 0,
                                                  key_bits(V), (cudaStream_t)s);
  if (e != cudaSuccess)
    return DF_FAIL(err, DF_ERR_INVALID, "embedding_bwd", NULL, "cub radix sort failed: %s", cudaGetErrorString(e));
  DF_CU_SWITCH_DT(dout_dt, G, err, "embedding.dout",
                  DF_CU_SWITCH_DT(dt_dt, D, err, "embedding.dtable",
                                  segment_add_kernel<G, D><<<(unsigned)T, 128, 0, s>>>(
                                      keys_out, tok_out, (const G *)dout, (D *)dtable, T, V, H)));
  DF_CU_CHECK_LAUNCH(err, "embedding_bwd.segment_add");
  return DF_OK;
}

// ---- the backend table's slots ---------------------------------------------------------------------------------

static df_status cuda_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                                        df_error *err) {
  return df_cu_embedding_fwd(df_cuda_cu_stream(ctx), table->data, table->dtype, (const int32_t *)ids->data, out->data,
                             out->dtype, df_numel(ids), table->shape[0], table->shape[1], err);
}

static df_status cuda_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                         df_error *err) {
  const int64_t T = df_numel(ids), V = dtable->shape[0], H = dtable->shape[1];
  void *ws = NULL;
  DF_TRY(df_ctx_workspace(ctx, 0, df_cu_embedding_bwd_workspace(T, V), &ws, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  return df_cu_embedding_bwd(df_cuda_cu_stream(ctx), dout->data, dout->dtype, (const int32_t *)ids->data, dtable->data,
                             dtable->dtype, T, V, H, ws, err);
}

extern "C" void df_cuda_register_embedding(df_backend *be) {
  be->embedding_forward = cuda_embedding_forward;
  be->embedding_backward = cuda_embedding_backward;
  be->measures[DF_OP_EMBEDDING_BACKWARD] = true;
}
