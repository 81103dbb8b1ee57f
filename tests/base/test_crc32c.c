// CRC-32C against the check value of the CRC catalogue and the iSCSI test vectors of RFC 3720 (B.4), and the
// TFRecord mask.
#include <criterion/criterion.h>
#include <string.h>

#include "base/crc32c.h"

Test(crc32c, check_value) { cr_expect_eq(df_crc32c(0, "123456789", 9), 0xE3069283u); }

Test(crc32c, rfc3720_vectors) {
  unsigned char b[32];
  memset(b, 0, sizeof b);
  cr_expect_eq(df_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, sizeof b);
  cr_expect_eq(df_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  cr_expect_eq(df_crc32c(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  cr_expect_eq(df_crc32c(0, b, 32), 0x113FDB5Cu);
}

Test(crc32c, continues_across_calls) {
  const char *s = "123456789";
  cr_expect_eq(df_crc32c(df_crc32c(0, s, 4), s + 4, 5), 0xE3069283u);
  cr_expect_eq(df_crc32c(0, s, 0), 0u);
}

// TensorFlow's masked_crc32c("123456789"), the value TensorBoard's reader compares the stored one with.
Test(crc32c, tfrecord_mask) { cr_expect_eq(df_crc32c_mask(df_crc32c(0, "123456789", 9)), 0xC78AB0E5u); }
