// Byte-level tokenizer (modeling/target/byte_tokenizer.h).
#include "modeling/target/byte_tokenizer.h"

#include <string.h>

static const char *const SPECIALS[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"};
enum { NSPECIAL = 4 };

const char *df_byte_tok_special(int32_t id) { return id >= 256 && id < 256 + NSPECIAL ? SPECIALS[id - 256] : NULL; }

size_t df_byte_tok_encode(const char *text, size_t n, int32_t *out) {
  size_t k = 0;
  for (size_t i = 0; i < n;) {
    int hit = -1;
    if (text[i] == '<')
      for (int s = 0; s < NSPECIAL && hit < 0; s++) {
        size_t len = strlen(SPECIALS[s]);
        if (len <= n - i && !memcmp(text + i, SPECIALS[s], len)) hit = s;
      }
    if (hit >= 0) {
      out[k++] = 256 + hit;
      i += strlen(SPECIALS[hit]);
    } else {
      out[k++] = (unsigned char)text[i++];
    }
  }
  return k;
}

size_t df_byte_tok_decode(const int32_t *ids, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    char one[2] = {(char)ids[i], 0};
    const char *piece = ids[i] >= 0 && ids[i] < 256 ? one : df_byte_tok_special(ids[i]);
    size_t m = piece ? (ids[i] < 256 ? 1 : strlen(piece)) : 0;
    for (size_t j = 0; j < m; j++, len++)
      if (len + 1 < cap) buf[len] = piece[j];
  }
  if (cap) buf[len < cap ? len : cap - 1] = 0;
  return len;
}
