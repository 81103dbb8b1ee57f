// cub::DeviceRadixSort::SortPairs of the CUDA emulator: CUB's temporary-storage query (a NULL d_temp_storage sets
// temp_storage_bytes and does nothing else), its argument rules, and its result: the pairs stably sorted by the key
// bits [begin_bit, end_bit), signed keys with the sign bit flipped as CUB's radix order has them. The sort is queued
// on the stream; the temporary storage is left holding garbage (NaN bytes), as CUB leaves it.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <string.h>
#include <vector>

#include "kernels/cuda/emu/internal.h"

using namespace df_emu;

namespace {

size_t temp_need(int64_t n, size_t ks, size_t vs) { return ((size_t)n * (ks + vs) + 255) / 256 * 256 + 1024; }

// A device buffer of `bytes` at p (NULL only for n = 0).
void check_buffer(const char *what, const void *p, size_t bytes) {
  const allocation *a = NULL;
  const ptr_kind k = classify(p, &a);
  if (k != PTR_DEVICE)
    fatal("pass device buffers (cudaMalloc) to cub::DeviceRadixSort::SortPairs",
          "cub::DeviceRadixSort::SortPairs: %s %p is not device memory", what, p);
  if ((uintptr_t)p + bytes > a->base + a->size) {
    char d[600];
    describe_allocation(a, d, sizeof d);
    fatal("size the buffers (and the temporary storage) as the query said",
          "cub::DeviceRadixSort::SortPairs: %s needs %zu bytes at %p, past the end of the %s", what, bytes, p, d);
  }
}

bool overlap(const void *a, const void *b, size_t n) {
  return (uintptr_t)a < (uintptr_t)b + n && (uintptr_t)b < (uintptr_t)a + n;
}

uint64_t load_key(const void *keys, int64_t i, size_t ks) {
  uint64_t u = 0;
  memcpy(&u, (const char *)keys + i * ks, ks);
  return u;
}

} // namespace

cudaError_t df_emu_radix_sort_pairs(void *temp, size_t *temp_bytes, const void *keys_in, void *keys_out, size_t ks,
                                    bool key_signed, const void *vals_in, void *vals_out, size_t vs, int64_t n,
                                    int begin_bit, int end_bit, cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> g(lock());
  if (!temp_bytes) return cudaErrorInvalidValue;
  const size_t need = temp_need(n > 0 ? n : 0, ks, vs);
  if (!temp) { // the size query
    *temp_bytes = need;
    return cudaSuccess;
  }
  if (*temp_bytes < need) {
    warn("cub::DeviceRadixSort::SortPairs: temp_storage_bytes %zu is less than the %zu bytes the query gave",
         *temp_bytes, need);
    return cudaErrorInvalidValue;
  }
  if (begin_bit < 0 || end_bit > (int)(8 * ks) || begin_bit >= end_bit) {
    warn("cub::DeviceRadixSort::SortPairs: bits [%d, %d) of %zu-byte keys", begin_bit, end_bit, ks);
    return cudaErrorInvalidValue;
  }
  if (n <= 0) return cudaSuccess;
  check_buffer("the temporary storage", temp, need);
  check_buffer("d_keys_in", keys_in, n * ks), check_buffer("d_keys_out", keys_out, n * ks);
  check_buffer("d_values_in", vals_in, n * vs), check_buffer("d_values_out", vals_out, n * vs);
  if (overlap(keys_in, keys_out, n * ks) || overlap(vals_in, vals_out, n * vs))
    fatal("SortPairs does not sort in place: give it separate output buffers",
          "cub::DeviceRadixSort::SortPairs: an input and its output overlap");
  const int bits = end_bit - begin_bit;
  const uint64_t mask = bits >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
  const uint64_t flip = key_signed ? (uint64_t)1 << (8 * ks - 1) : 0;
  enqueue(s, "cub::DeviceRadixSort::SortPairs", [=] {
    std::vector<std::pair<uint64_t, int64_t>> order((size_t)n);
    for (int64_t i = 0; i < n; i++) order[i] = {((load_key(keys_in, i, ks) ^ flip) >> begin_bit) & mask, i};
    std::sort(order.begin(), order.end()); // (digit, index): the stable order an LSD radix sort gives
    for (int64_t i = 0; i < n; i++) {
      memcpy((char *)keys_out + i * ks, (const char *)keys_in + order[i].second * ks, ks);
      memcpy((char *)vals_out + i * vs, (const char *)vals_in + order[i].second * vs, vs);
    }
    memset(temp, 0xFF, need);
  });
  return cudaSuccess;
}
