// The bundled tiny target's byte-level tokenizer, the C twin of tools/byte_tokenizer.py: ids 0..255 are UTF-8
// bytes, then four special tokens; the special strings are matched literally anywhere in the text.
#ifndef DF_MODELING_TARGET_BYTE_TOKENIZER_H
#define DF_MODELING_TARGET_BYTE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define DF_BYTE_TOK_EOS      256 // <|endoftext|>
#define DF_BYTE_TOK_IM_START 257 // <|im_start|>
#define DF_BYTE_TOK_IM_END   258 // <|im_end|>
#define DF_BYTE_TOK_MASK     259 // <|mask|>
#define DF_BYTE_TOK_VOCAB    264 // the model's vocabulary (specials padded to a multiple of 8)

// The special token string of id, or NULL when id is not one.
const char *df_byte_tok_special(int32_t id);
// Encodes n bytes of text into out (room for n ids always suffices); returns the number of ids.
size_t df_byte_tok_encode(const char *text, size_t n, int32_t *out);
// Decodes ids into buf (NUL-terminated, truncated to cap); ids past the specials decode to nothing. Returns
// the length the whole text needs (as snprintf does).
size_t df_byte_tok_decode(const int32_t *ids, size_t n, char *buf, size_t cap);

#endif
