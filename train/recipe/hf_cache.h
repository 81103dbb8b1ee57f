// The local Hugging Face hub cache, read the way huggingface_hub (and so transformers) reads it offline: a hub
// id such as "Qwen/Qwen3-8B" is <cache>/models--Qwen--Qwen3-8B/snapshots/<the commit refs/main names>.
#ifndef DF_TRAIN_RECIPE_HF_CACHE_H
#define DF_TRAIN_RECIPE_HF_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// os.path.expanduser: "~" and "~/x" from $HOME (else the password database), "~user/x" from that user's entry;
// anything else is copied.
void df_expand_user(const char *p, char *out, size_t n);

// The cache root: cache_dir when given (SpecForge's model.cache_dir, passed to from_pretrained), else
// $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub; a leading ~ is expanded as huggingface_hub does.
void df_hf_cache_root(const char *cache_dir, char *out, size_t n);

// Whether s is a hub model id as huggingface_hub validates them: "name" or "namespace/name", each part of
// letters, digits, '-', '_' and '.', at most 96 characters, no "--" or "..", not starting or ending with '-'
// or '.'.
bool df_hf_is_repo_id(const char *s);

// repo_dir receives <root>/models--<id with / as -->. When refs/main names a commit whose snapshot directory
// exists, snapshot receives it and the result is true (no network is ever used).
bool df_hf_cache_snapshot(const char *root, const char *repo_id, char *repo_dir, size_t repo_n, char *snapshot,
                          size_t snap_n);

#ifdef __cplusplus
}
#endif

#endif
