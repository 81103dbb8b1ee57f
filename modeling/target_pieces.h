// The target model's frozen pieces the draft borrows: token embedding and LM head, loaded from an HF target
// directory into read-only fp32 buffers that are shared by reference and never saved with the draft.
#ifndef DF_MODELING_TARGET_PIECES_H
#define DF_MODELING_TARGET_PIECES_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_TARGET_EMBED_KEY   "model.embed_tokens.weight"
#define DF_TARGET_LM_HEAD_KEY "lm_head.weight"

typedef struct {
  const char *embed_key;   // NULL: DF_TARGET_EMBED_KEY
  const char *lm_head_key; // NULL: DF_TARGET_LM_HEAD_KEY
  bool tied;               // the target config's tie_word_embeddings
  int64_t expect_vocab;    // when > 0, V must equal it (vocab_size from the target config)
  int64_t expect_hidden;   // when > 0, H must equal it (hidden_size)
} df_target_pieces_options;

typedef struct {
  const float *embed;   // (V, H)
  const float *lm_head; // (V, H); the same pointer as embed when tied
  int64_t vocab, hidden;
  bool tied;
  float *owned_[2]; // what df_target_pieces_free releases
} df_target_pieces;

// dir: an HF model directory (model.safetensors or the sharded index), or a file/index path. A tied target
// needs no lm_head tensor (one that is present is ignored, as transformers ties it to the embedding); an
// untied one without it is an error naming the key. Both tensors must be 2-D with the same [V, H].
df_status df_target_pieces_load(const char *dir, const df_target_pieces_options *opt, df_target_pieces *out,
                                df_error *err);
void df_target_pieces_free(df_target_pieces *tp);

// Read-only CPU views: do not write through them.
df_tensor df_target_embed_view(const df_target_pieces *tp);
df_tensor df_target_lm_head_view(const df_target_pieces *tp);

#ifdef __cplusplus
}
#endif

#endif
