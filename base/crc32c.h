// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): TensorBoard's record framing checksum.
#ifndef DF_BASE_CRC32C_H
#define DF_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Continues crc (0 to start) over n bytes; df_crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t df_crc32c(uint32_t crc, const void *data, size_t n);
// TFRecord's masked form: rotate right by 15, add 0xa282ead8 (so a CRC of data holding CRCs stays useful).
uint32_t df_crc32c_mask(uint32_t crc);

#ifdef __cplusplus
}
#endif

#endif
