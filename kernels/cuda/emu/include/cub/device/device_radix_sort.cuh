// CUB's device radix sort in the CUDA emulator: SortPairs with CUB's signature and its temporary-storage convention
// (a NULL d_temp_storage only asks for temp_storage_bytes), queued on the stream; the stable LSD order over the key
// bits [begin_bit, end_bit), signed keys ordered as CUB orders them (kernels/cuda/emu/cub.cpp).
#ifndef DF_EMU_CUB_DEVICE_RADIX_SORT_CUH
#define DF_EMU_CUB_DEVICE_RADIX_SORT_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <type_traits>

cudaError_t df_emu_radix_sort_pairs(void *temp, size_t *temp_bytes, const void *keys_in, void *keys_out,
                                    size_t key_size, bool key_signed, const void *vals_in, void *vals_out,
                                    size_t val_size, int64_t n, int begin_bit, int end_bit, cudaStream_t stream);

namespace cub {

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const KeyT *d_keys_in,
                               KeyT *d_keys_out, const ValueT *d_values_in, ValueT *d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral<KeyT>::value, "the emulated radix sort takes integer keys");
    return df_emu_radix_sort_pairs(d_temp_storage, &temp_storage_bytes, d_keys_in, d_keys_out, sizeof(KeyT),
                                   std::is_signed<KeyT>::value, d_values_in, d_values_out, sizeof(ValueT),
                                   (int64_t)num_items, begin_bit, end_bit, stream);
  }
};

} // namespace cub

#endif
